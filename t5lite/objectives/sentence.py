"""Sentence-BERT training: a bi-encoder (t5lite.models.sentence.BiEncoder, any encoder or T5's)
embeds each text column of the batch (`text0_input_tokens`, `text1_...`, from the
`sentence_texts` converter) and a sentence-transformers loss (t5lite.objectives.sentence_losses)
compares them:

    loss         columns                                  label
    mnrl         anchor, positive, hard negatives...      -
    contrastive  text, text                               1 similar / 0 not
    triplet      anchor, positive, negative               -
    softmax      premise, hypothesis                      class id (num_labels classes)
    cosent       text, text                               similarity score
    cosine       text, text                               similarity in [0, 1]

MNRL's negatives are the batch's other positives and every hard negative (the converter keeps a
text from appearing twice in a batch). With `train.num_microbatches` > 1 each microbatch is its
own negative pool, and CoSENT ranks the pairs within it; `mini_batch_size` instead keeps the whole
batch's pool at the memory of a chunk (GradCache, as CachedMultipleNegativesRankingLoss).

The trained params are the encoder's own (plus `classifier` for softmax), so a run starts from
any t5lite or converted Hugging Face checkpoint and `t5lite embed` / `t5lite eval` read it back.
Evaluation: t5lite.infer.embedding.SentenceEvaluator (STS Spearman, retrieval recall/MRR/nDCG).
"""
from __future__ import annotations

from typing import Any, Mapping

import gin
import jax
import jax.numpy as jnp

from t5lite.data import registry
from t5lite.errors import ConfigError
from t5lite.infer import checkpoint_reader
from t5lite.infer.embedding import SentenceEvaluator
from t5lite.models import flops
from t5lite.models.sentence import BiEncoder
from t5lite.objectives import sentence_losses as S
from t5lite.objectives.base import LossConfig, Objective

LOSSES = {"mnrl": 2, "contrastive": 2, "triplet": 3, "softmax": 2, "cosent": 2, "cosine": 2}   # -> columns needed
DEFAULT_MARGINS = {"contrastive": 0.5, "triplet": 5.0}


def text_columns(batch: Mapping[str, Any]) -> list[str]:
    names, i = [], 0
    while f"text{i}_input_tokens" in batch:
        names.append(f"text{i}_input_tokens")
        i += 1
    return names


@gin.configurable
class SentenceObjective(Objective):
    """`loss` over the pooled embeddings (`pooling`: 'mean', 'cls', 'max'), L2-normalised first
    with `normalize` (a sentence-transformers model with a Normalize module, as all-MiniLM-L6-v2:
    only the Euclidean triplet loss and the softmax classifier see the difference); `scale` is
    MNRL's and CoSENT's (20), `margin` contrastive's (0.5) and triplet's (5) when None,
    `num_labels` the softmax classifier's. `mini_batch_size` embeds each column in chunks of that
    many rows whose activations are recomputed in the backward pass (GradCache, as
    sentence-transformers' Cached* losses): memory of one chunk, the loss and its negatives those
    of the whole batch."""
    produces_text = False
    loss_label = "loss per example"

    def __init__(self, loss: str = "mnrl", pooling: str = "mean", scale: float = 20.0, margin: float | None = None,
                 num_labels: int = 3, normalize: bool = False, mini_batch_size: int | None = None):
        if loss not in LOSSES:
            raise ConfigError(f"SentenceObjective.loss={loss!r}: expected one of {sorted(LOSSES)}")
        if loss == "softmax" and num_labels < 2:
            raise ConfigError(f"SentenceObjective.num_labels={num_labels}: the softmax loss needs 2 or more classes")
        self.loss, self.pooling, self.scale, self.num_labels = loss, pooling, scale, num_labels
        self.normalize, self.mini_batch_size = normalize, mini_batch_size
        if mini_batch_size is not None and mini_batch_size < 1:
            raise ConfigError(f"SentenceObjective.mini_batch_size={mini_batch_size}: use a positive number or None")
        self.margin = DEFAULT_MARGINS.get(loss) if margin is None else margin

    def __repr__(self):
        return (f"SentenceObjective(loss={self.loss!r}, pooling={self.pooling!r}, scale={self.scale}, "
                f"margin={self.margin}, num_labels={self.num_labels}, normalize={self.normalize}, "
                f"mini_batch_size={self.mini_batch_size})")

    def build_model(self, config):
        return BiEncoder(config, self.pooling, self.num_labels if self.loss == "softmax" else 0)

    def init_features(self, feature_lengths: Mapping[str, int]) -> dict[str, Any]:
        return {"text0_input_tokens": jnp.ones((1, feature_lengths["text0_input_tokens"]), jnp.int32)}

    def normalizers(self, batch, loss: LossConfig) -> dict[str, Any]:
        """The loss is a mean over the examples of `batch` (a microbatch or the whole batch)."""
        return {"examples": jnp.asarray(batch["text0_input_tokens"].shape[0], jnp.float32)}

    def loss_and_metrics(self, module, params, batch, rng, normalizers, loss):
        columns = text_columns(batch)
        if len(columns) < LOSSES[self.loss] or (self.loss != "mnrl" and len(columns) > LOSSES[self.loss]):
            more = " or more" if self.loss == "mnrl" else ""
            raise ConfigError(f"SentenceObjective.loss={self.loss!r} takes {LOSSES[self.loss]}{more} texts per "
                              f"example, the batch has {len(columns)}: give TASK_FEATURE_LENGTHS one 'text<i>' "
                              "length per text of the task")
        e = [self.embed(module, params, batch[name], jax.random.fold_in(rng, i)) for i, name in enumerate(columns)]
        if self.normalize:
            e = [S.unit(x) for x in e]
        labels = batch["label"][:, 0]
        n = jnp.asarray(labels.shape[0], jnp.float32)
        if self.loss == "cosent":
            value = S.cosent(e[0], e[1], labels, self.scale)
            return value * n / normalizers["examples"], {"loss": (value * n, n), "examples": n}
        if self.loss == "mnrl":
            per_example = S.multiple_negatives_ranking(*e, scale=self.scale)
        elif self.loss == "contrastive":
            per_example = S.contrastive(e[0], e[1], labels, self.margin)
        elif self.loss == "triplet":
            per_example = S.triplet(*e, margin=self.margin)
        elif self.loss == "softmax":
            logits = module.apply({"params": params}, e[0], e[1], method="classify")
            per_example = S.softmax(logits, labels)
        else:
            per_example = S.cosine_similarity(e[0], e[1], labels)
        total = jnp.sum(per_example)
        return total / normalizers["examples"], {"loss": (total, n), "examples": n}

    def embed(self, module, params, tokens, rng):
        """[rows, d] training embeddings (dropout on) of one text column, in `mini_batch_size` chunks."""
        apply = lambda p, t, r: module.apply({"params": p}, t, enable_dropout=True, method="embed",
                                             rngs={"dropout": r})
        rows, size = tokens.shape[0], self.mini_batch_size
        if not size or rows <= size:
            return apply(params, tokens, rng)
        if rows % size:
            raise ConfigError(f"SentenceObjective.mini_batch_size={size} does not divide the {rows} rows of a "
                              "(micro)batch; pick a divisor")
        chunk = jax.checkpoint(apply)

        def step(_, xs):
            tokens_i, i = xs
            return None, chunk(params, tokens_i, jax.random.fold_in(rng, i))
        _, out = jax.lax.scan(step, None, (tokens.reshape(rows // size, size, -1), jnp.arange(rows // size)))
        return out.reshape(rows, -1)

    def train_flops_per_example(self, config, feature_lengths):
        return flops.bi_encoder_train_flops_per_example(config, [n for k, n in feature_lengths.items()
                                                               if k.endswith("_input_tokens")])

    def initial_params(self, path: str, abstract_params) -> dict[str, Any]:
        """The checkpoint's encoder params; a softmax classifier (None) starts fresh."""
        encoder = {k: v for k, v in abstract_params.items() if k != "classifier"}
        restored = checkpoint_reader.restore_params(path, encoder)
        return {**restored, "classifier": None} if "classifier" in abstract_params else restored

    def evaluators(self, task, split, task_feature_lengths, **kwargs):
        tasks = task.tasks if isinstance(task, registry.Mixture) else [task]
        return {t.name: SentenceEvaluator(t, split, task_feature_lengths, **kwargs) for t in tasks if split in t.splits}
