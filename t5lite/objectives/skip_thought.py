"""Skip-Thought (Kiros et al. 2015) over a batch of K consecutive sentences s_1..s_K (the
`consecutive_sentences` converter): the encoder (t5lite.models.skip_thought.SkipThought, a pooled
`BiEncoder`) turns s_i into one vector h_i, and two decoders generate s_{i-1} and s_{i+1} from h_i,
teacher-forced: each decoder reads its target sentence's `[CLS] ...` and predicts it shifted by one
(the words, then `[SEP]` as the end of the sentence). The loss is the token cross entropy summed over
both decoders' target tokens, divided by their number (padding excluded).

A sentence without a neighbour on a side in the batch (the first or last row) or whose neighbour
comes from another paragraph or row of the corpus (the converter's `paragraph` differs) contributes
no loss on that side.

The encoder's params are the run's top-level params, so `t5lite embed` reads the run as any encoder
run; an `initial_checkpoint_path` encoder starts it, the decoders start fresh.
"""
from __future__ import annotations

from typing import Any

import gin
import jax
import jax.numpy as jnp
import optax

from t5lite.errors import ConfigError
from t5lite.infer import checkpoint_reader
from t5lite.models import flops
from t5lite.models.skip_thought import SkipThought
from t5lite.objectives.sentence import SentenceObjective

SIDES = (("previous", -1), ("next", 1))


def neighbour_targets(tokens, paragraph, offset: int):
    """(decoder inputs [K, L-1], targets [K, L-1], weights [K, L-1]) of each row's neighbour at
    `offset` (-1 previous, +1 next) among the rows `tokens` [K, L] (`[CLS] sentence [SEP]`, padded):
    the neighbour's tokens without their last, and without their first. The weights are 0 on
    padding and on every token of a row whose neighbour is outside the batch or has another
    `paragraph` [K, 1]. Padding is id 0, as the converter pads."""
    k = tokens.shape[0]
    index = jnp.arange(k) + offset
    source = jnp.clip(index, 0, k - 1)
    has_neighbour = (index >= 0) & (index < k) & (paragraph[source, 0] == paragraph[:, 0])
    neighbour = tokens[source]
    targets = neighbour[:, 1:]
    weights = ((targets != 0) & has_neighbour[:, None]).astype(jnp.float32)
    return neighbour[:, :-1], targets, weights


@gin.configurable
class SkipThoughtObjective(SentenceObjective):
    """Skip-Thought over the batch's `text0_input_tokens` (consecutive sentences) and `paragraph`;
    the sentence vector pooled with `pooling` ('mean', 'cls', 'max'); decoders of `decoder_layers`
    layers (None: the encoder's number). A (micro)batch is one run of consecutive sentences."""
    loss_label = "cross entropy per target token"

    def __init__(self, pooling: str = "mean", decoder_layers: int | None = None):
        super().__init__(loss="mnrl", pooling=pooling)
        if decoder_layers is not None and decoder_layers < 1:
            raise ConfigError(f"SkipThoughtObjective.decoder_layers={decoder_layers}: use a positive number or None")
        self.decoder_layers = decoder_layers

    def __repr__(self):
        return f"SkipThoughtObjective(pooling={self.pooling!r}, decoder_layers={self.decoder_layers})"

    def build_model(self, config):
        return SkipThought(config, self.pooling, self.decoder_layers)

    def normalizers(self, batch, loss):
        """The loss is a mean over the real target tokens of both decoders, counted on `batch`."""
        tokens, paragraph = _features(batch)
        count = sum(jnp.sum(neighbour_targets(tokens, paragraph, offset)[2]) for _, offset in SIDES)
        return {"tokens": jnp.maximum(count, 1.0)}

    def loss_and_metrics(self, module, params, batch, rng, normalizers, loss):
        tokens, paragraph = _features(batch)
        vectors = module.apply({"params": params}, tokens, enable_dropout=True, method="embed",
                               rngs={"dropout": jax.random.fold_in(rng, 0)})
        total, count, metrics = 0.0, 0.0, {}
        for i, (side, offset) in enumerate(SIDES, 1):
            inputs, targets, weights = neighbour_targets(tokens, paragraph, offset)
            logits = module.apply({"params": params}, vectors, inputs, side, enable_dropout=True, method="decode",
                                  rngs={"dropout": jax.random.fold_in(rng, i)})
            side_loss = jnp.sum(optax.softmax_cross_entropy_with_integer_labels(logits, targets) * weights)
            side_count = jnp.sum(weights)
            metrics[f"{side}_loss"] = (side_loss, side_count)
            total, count = total + side_loss, count + side_count
        n = jnp.asarray(tokens.shape[0], jnp.float32)
        return total / normalizers["tokens"], {"loss": (total, count), **metrics, "target_tokens": count,
                                               "examples": n}

    def train_flops_per_example(self, config, feature_lengths):
        length = feature_lengths["text0_input_tokens"]
        layers = self.decoder_layers or config.num_encoder_layers
        return (flops.bi_encoder_train_flops_per_example(config, [length])
                + 2 * flops.conditioned_decoder_train_flops_per_example(config, layers, length - 1))

    def initial_params(self, path: str, abstract_params) -> dict[str, Any]:
        """The checkpoint's encoder; the decoders (None) start fresh."""
        decoders = ("previous_decoder", "next_decoder")
        encoder = checkpoint_reader.restore_params(
            path, {k: v for k, v in abstract_params.items() if k not in decoders})
        return {**encoder, **dict.fromkeys(decoders)}

    def evaluators(self, task, split, task_feature_lengths, **kwargs):
        """A `sentence_*` pair task (given a `text1` length, as `t5lite eval` on `sentence_stsb`) is
        scored as a bi-encoder's; the training corpus, one sentence per row, has nothing to score."""
        if "text1" not in task_feature_lengths:
            return {}
        return super().evaluators(task, split, task_feature_lengths, **kwargs)


def _features(batch):
    if "paragraph" not in batch:
        raise ConfigError("Skip-Thought reads consecutive sentences and their `paragraph`: set "
                          "train.feature_converter = 'consecutive_sentences'")
    return batch["text0_input_tokens"], batch["paragraph"]
