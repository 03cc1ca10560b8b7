"""ELECTRA pre-training: a small generator trained with masked LM and a discriminator trained on
replaced-token detection (RTD) over every token, jointly, in one module and one train state.

`Electra` holds both encoders as `{"generator": ..., "discriminator": ...}` params, so a checkpoint
holds both. As in the paper with a smaller generator, the embeddings are shared: token, position
and token-type tables and the embedding LayerNorm live in the discriminator's params only and the
generator reads them (`flax.linen.map_variables`); each network keeps its own projection from the
embedding width to its hidden size. `discriminator_params` takes the discriminator out as a
standalone `electra_*` encoder (`models.build(config)`; `t5lite convert --to_hf` exports it).

`ElectraObjective` (gin: `train.objective = @ElectraObjective()`): the generator predicts the
masked tokens; replacements are sampled from its softmax at the masked positions (integers: no
gradient flows back through the sample); a position counts as replaced only where the sample
differs from the original; loss = MLM + `disc_weight` (50) x RTD binary cross entropy. With
`train.eval_every` (or `t5lite eval`) a split is scored by the generator's MLM loss and accuracy and the
discriminator's RTD loss and accuracy (and the replaced share), without dropout.
"""
from __future__ import annotations

from typing import Any, Mapping

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp

from t5lite import models
from t5lite.errors import ConfigError
from t5lite.models import flops
from t5lite.models.config import ModelConfig
from t5lite.objectives import losses
from t5lite.objectives.base import LossConfig, Objective, dropout, target_segment_ids, token_metrics
from t5lite.objectives.encoder import ReadsTrainingPositions
from t5lite.objectives.heldout import LossEvaluator

# Param paths (inside an Encoder) the generator takes from the discriminator.
SHARED_EMBEDDINGS = (("token_embedder",), ("encoder", "position_embedder"), ("encoder", "token_type_embedder"),
                     ("encoder", "embedding_norm"))
# The key of the generator's samples in a held-out evaluation: the same replacements each time.
EVAL_SAMPLE_KEY = 0
# Fields the generator takes from the discriminator so that the shared tables fit both.
_SHARED_FIELDS = ("vocab_size", "max_position_embeddings", "position_offset", "type_vocab_size", "pad_token_id",
                  "layer_norm_epsilon", "dtype")


def generator_config(generator: ModelConfig, discriminator: ModelConfig) -> ModelConfig:
    """The generator preset with the discriminator's vocabulary, positions and token types."""
    if generator.arch != "encoder" or generator.encoder_head != "mlm":
        raise ConfigError(f"the ELECTRA generator must be an encoder with encoder_head='mlm' "
                         f"(ElectraObjective.generator, e.g. 'electra_small_generator'), got arch={generator.arch!r}, "
                         f"encoder_head={generator.encoder_head!r}")
    if discriminator.arch != "encoder" or discriminator.encoder_head != "discriminator":
        raise ConfigError(f"the ELECTRA discriminator must be an encoder with encoder_head='discriminator' "
                         f"(model_config.preset, e.g. 'electra_small'), got arch={discriminator.arch!r}, "
                         f"encoder_head={discriminator.encoder_head!r}")
    if generator.embed_dim != discriminator.embed_dim:
        raise ConfigError(f"the generator and discriminator share the token embedding, so their embedding widths "
                         f"must agree: generator {generator.embed_dim}, discriminator {discriminator.embed_dim}; "
                         f"set ElectraObjective.generator_overrides = {{'embedding_size': {discriminator.embed_dim}}}")
    return generator.replace(**{f: getattr(discriminator, f) for f in _SHARED_FIELDS})


def _split_shared(params):
    """(params without the shared embeddings, the shared embeddings) of one Encoder's params. The
    paths are at most two deep, so copying one level leaves `params` itself untouched."""
    own = {k: dict(v) if isinstance(v, Mapping) else v for k, v in params.items()}
    shared = {}
    for *parents, leaf in SHARED_EMBEDDINGS:
        source, target = own, shared
        for key in parents:
            source, target = source.get(key, {}), target.setdefault(key, {})
        if leaf in source:
            target[leaf] = source.pop(leaf)
    return own, shared


def _merge(a, b):
    """Nested dicts a and b together (b's keys are disjoint from a's at the leaves)."""
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if k in out and isinstance(v, Mapping) else v
    return out


class Electra(nn.Module):
    """The generator and the discriminator, with shared embeddings. Methods take the features of
    `EncoderFeatureConverter`: `generate` -> MLM logits [b, l, vocab] of the generator,
    `discriminate` -> replaced-token logits [b, l], `__call__` -> both (on the same tokens)."""
    generator_config: ModelConfig
    discriminator_config: ModelConfig

    def setup(self):
        self.discriminator = models.Encoder(self.discriminator_config)
        # map_variables' functions see {"params": the generator's params}: stored without the shared
        # tables, seen with the discriminator's.
        shared_generator = nn.map_variables(models.Encoder, "params", trans_in_fn=self._with_shared_embeddings,
                                            trans_out_fn=lambda v: {"params": _split_shared(v.get("params", {}))[0]},
                                            init=True, mutable=True)
        self.generator = shared_generator(self.generator_config)

    def _with_shared_embeddings(self, variables):
        shared = _split_shared(self.discriminator.variables.get("params", {}))[1]
        return {"params": _merge(variables.get("params", {}), shared)}

    def generate(self, encoder_input_tokens, **features):
        return self.generator(encoder_input_tokens, **features)

    def discriminate(self, encoder_input_tokens, **features):
        return self.discriminator(encoder_input_tokens, **features)

    def __call__(self, encoder_input_tokens, **features):
        discriminator_logits = self.discriminate(encoder_input_tokens, **features)   # creates the shared tables
        return self.generate(encoder_input_tokens, **features), discriminator_logits


def discriminator_params(params):
    """The discriminator of `Electra` params, a standalone encoder's params (its config is the run's)."""
    return params["discriminator"]


def generator_params(params):
    """The generator of `Electra` params with the shared embeddings put back: standalone params for
    `models.build(generator_config(...))`."""
    return _merge(params["generator"], _split_shared(params["discriminator"])[1])


def joint_params(generator, discriminator):
    """`Electra` params from standalone generator and discriminator params (e.g. both imported from
    Hugging Face): the generator's own copies of the shared embeddings are dropped."""
    return {"generator": _split_shared(generator)[0], "discriminator": discriminator}


def sample_replacements(logits, rng, pad_id: int):
    """One token per position drawn from softmax(logits) (the generator's distribution), never the
    pad id (a sampled pad would turn a real token into padding for the discriminator's mask)."""
    logits = jax.lax.stop_gradient(logits)
    logits = logits.at[..., pad_id].set(-jnp.inf)
    return jax.random.categorical(rng, logits).astype(jnp.int32)


def roc_auc_counts(scores, labels, weights):
    """(Mann-Whitney U, positives x negatives) over the weighted tokens: their ratio is the ROC AUC
    (the probability that a positive outscores a negative, ties counting half), by sorting."""
    scores, labels, valid = scores.ravel(), labels.ravel().astype(bool), weights.ravel() > 0
    positive, negative = valid & labels, valid & ~labels
    negative_scores = jnp.sort(jnp.where(negative, scores, jnp.inf))
    below = jnp.searchsorted(negative_scores, scores, side="left")
    at_or_below = jnp.searchsorted(negative_scores, scores, side="right")
    u = jnp.sum(jnp.where(positive, below + 0.5 * (at_or_below - below), 0.0))
    return u, jnp.sum(positive).astype(jnp.float32) * jnp.sum(negative).astype(jnp.float32)


@gin.configurable
class ElectraObjective(ReadsTrainingPositions, Objective):
    """ELECTRA's joint loss. `generator`: the generator's preset (its vocabulary, positions and token
    types follow the discriminator, which is the run's model); `disc_weight`: the RTD weight (50
    in the paper); `converter`: as `MlmObjective`'s. The MLM part uses the run's z-loss, label
    smoothing and normalizing factor."""
    produces_text = False
    loss_label = "MLM per masked token + disc_weight x RTD per token"

    def __init__(self, generator: str | ModelConfig = "electra_small_generator", disc_weight: float = 50.0,
                 generator_overrides: Mapping[str, Any] | None = None, converter: str | None = None):
        super().__init__(converter)
        try:
            self.generator = models.get_config(generator) if isinstance(generator, str) else generator
            self.generator = self.generator.replace(**dict(generator_overrides or {}))
        except ConfigError as e:
            raise type(e)(f"ElectraObjective.generator={generator!r}: {e}") from None
        self.disc_weight = disc_weight
        self.pad_id = self.generator.pad_token_id

    def build_model(self, config: ModelConfig) -> nn.Module:
        self.pad_id = config.pad_token_id   # the discriminator's padding is what the RTD loss skips
        return Electra(generator_config(self.generator, config), config)

    def train_flops_per_example(self, config: ModelConfig, feature_lengths) -> float:
        """Both networks train: the generator's forward and backward as well as the discriminator's."""
        length = feature_lengths.get("encoder_input_tokens", 0)
        return sum(flops.train_flops_per_example(c, length) for c in (generator_config(self.generator, config), config))

    def normalizers(self, batch, loss: LossConfig):
        real = _real_tokens(batch, self.pad_id)
        return {**super().normalizers(batch, loss), "real_tokens": jnp.maximum(jnp.sum(real), 1).astype(jnp.float32)}

    def loss_and_metrics(self, module: nn.Module, params, batch, rng, normalizers, loss: LossConfig):
        """rng None (a held-out evaluation): no dropout, and the replacements drawn with a fixed key."""
        if rng is None:
            generator_rng, discriminator_rng, sample_rng = None, None, jax.random.key(EVAL_SAMPLE_KEY)
        else:
            generator_rng, sample_rng, discriminator_rng = jax.random.split(rng, 3)
        logits = module.apply({"params": params}, **batch, **dropout(generator_rng), method="generate")
        samples = sample_replacements(logits, sample_rng, module.discriminator_config.pad_token_id)
        return self.loss_from_samples(module, params, batch, logits, samples, discriminator_rng, normalizers, loss)

    def loss_from_samples(self, module: nn.Module, params, batch, generator_logits, samples, rng, normalizers,
                          loss: LossConfig):
        """The loss and metrics given the generator's logits and its sampled tokens (tests inject them);
        rng None: the discriminator without dropout."""
        targets, weights = batch["encoder_target_tokens"], batch["encoder_loss_weights"]
        token_loss, z = losses.cross_entropy(generator_logits, targets, 1.0, loss.z_loss, loss.label_smoothing)
        mlm = jnp.sum(token_loss * losses.objective_weights(loss.normalizing_factor, weights,
                                                            target_segment_ids(batch))) / normalizers["tokens"]
        masked = weights > 0
        corrupted = jnp.where(masked, samples, targets)
        replaced = (corrupted != targets).astype(jnp.float32)
        rtd_logits = module.apply({"params": params}, **{**batch, "encoder_input_tokens": corrupted}, **dropout(rng),
                                  method="discriminate")
        real = _real_tokens(batch, module.discriminator_config.pad_token_id).astype(jnp.float32)
        bce = _sigmoid_cross_entropy(rtd_logits, replaced) * real
        rtd = jnp.sum(bce) / normalizers["real_tokens"]
        objective = mlm + self.disc_weight * rtd
        n_real, n_masked = jnp.sum(real), jnp.sum(masked).astype(jnp.float32)
        metrics = {**token_metrics(token_loss, z, generator_logits, targets, weights, jnp.sum(weights).astype(
                       jnp.float32), prefix="mlm_"),
                   "rtd_loss": (jnp.sum(bce), n_real),
                   "rtd_accuracy": (jnp.sum(((rtd_logits > 0) == (replaced > 0)) * real), n_real),
                   "rtd_auc": roc_auc_counts(rtd_logits, replaced, real),
                   "replaced_fraction": (jnp.sum(replaced), n_masked),
                   "loss": objective}
        return objective, metrics

    def evaluators(self, task, split, task_feature_lengths, batch_size=32, data_dir=None, max_examples=None, **_):
        return {task.name: ElectraEvaluator(self, task, split, task_feature_lengths, batch_size, data_dir,
                                            max_examples)}


class ElectraEvaluator(LossEvaluator):
    """The objective's metrics over a split (t5lite.objectives.heldout), the ROC AUC left out: the
    ratio of its per-batch counts summed is not the split's AUC. FLOPs: both networks' forwards."""
    skipped = ("rtd_auc",)

    def vocab_size(self, module) -> int:
        return module.generator_config.vocab_size

    def forward_flops(self, module, length: int) -> float:
        return sum(flops.forward_flops_per_example(config, length)
                   for config in (module.generator_config, module.discriminator_config))


def _real_tokens(batch, pad_id: int):
    """Every non-padding token (the discriminator scores all of them)."""
    segment_ids = batch.get("encoder_segment_ids")
    return segment_ids > 0 if segment_ids is not None else batch["encoder_target_tokens"] != pad_id


def _sigmoid_cross_entropy(logits, labels):
    """-[y log sigmoid(x) + (1 - y) log sigmoid(-x)], stably."""
    return jnp.maximum(logits, 0) - logits * labels + jnp.log1p(jnp.exp(-jnp.abs(logits)))
