"""Encoder pre-training objectives: BERT's MLM + NSP, ALBERT's MLM + SOP, RoBERTa's MLM, SpanBERT's
MLM + SBO, each a gin-configurable `Objective` (`train.objective = @MlmNspObjective()`).

One forward pass (`Encoder.pretraining_logits`) feeds every head. As in BERT, each part is a mean
over its own targets and the parts add up: the MLM cross entropy over the masked tokens (T5X's
normalizing factor, by default the number of masked tokens in the global batch), plus the
NSP/SOP cross entropy over the sentence pairs, or plus SpanBERT's SBO cross entropy over the masked
tokens it predicts. The logged `loss` is that sum (what is minimised); `mlm_*`, `nsp_*` / `sop_*`
and `sbo_*` are the parts.
"""
from __future__ import annotations

from typing import Any, Mapping

import flax.linen as nn
import gin
import jax.numpy as jnp

from t5lite import models
from t5lite.data import converter_registry
from t5lite.errors import ConfigError
from t5lite.models.config import ModelConfig
from t5lite.models.heads import SpanBoundaryHead
from t5lite.objectives import losses
from t5lite.objectives.base import LossConfig, Objective, dropout, token_metrics
from t5lite.objectives.heldout import LossEvaluator


def _count(weights) -> jnp.ndarray:
    """A divisor for a global batch: the number of weighted targets, at least 1."""
    total = jnp.sum(weights).astype(jnp.float32)
    return jnp.where(total > 0, total, 1.0)


class ReadsTrainingPositions:
    """An encoder objective whose held-out evaluation reads the converter training reads: `converter`
    is the one training reads when it is not the class's (XLM's TLM and Fake-English train with
    'encoder_positions'), so that evaluation reads the same positions."""
    converter = "encoder"   # the feature converter its training and evaluation read

    def __init__(self, converter: str | None = None):
        if converter is not None:
            self.converter = converter

    def init_features(self, feature_lengths):
        """Refuses training batches whose positions evaluation would not read, or the reverse: the
        held-out loss would be of another model input than the one trained."""
        # Positions without packing's segment ids are the examples' own (packing numbers its own).
        trained = "encoder_positions" in feature_lengths and "encoder_segment_ids" not in feature_lengths
        if trained != ("encoder_positions" in converter_registry.get_feature_converter(self.converter).FEATURES):
            name = type(self).__name__
            raise ConfigError(
                f"train.feature_converter keeps the examples' own positions but {name} evaluates with the "
                f"{self.converter!r} converter, which drops them: set {name}.converter = 'encoder_positions'" if trained
                else f"{name} evaluates with the {self.converter!r} converter but training reads no example positions: "
                     "set train.feature_converter = 'encoder_positions'")
        return super().init_features(feature_lengths)


@gin.configurable
class MlmObjective(ReadsTrainingPositions, Objective):
    """Masked LM alone (RoBERTa; BERT without NSP): cross entropy on the masked tokens. Evaluated by
    its own loss and accuracy on the split (t5lite.objectives.heldout): an encoder generates no text."""
    heads: Mapping[str, Any] = {}   # config fields of the pre-training heads this objective trains
    produces_text = False
    loss_label = "cross entropy per masked token"

    def build_model(self, config: ModelConfig) -> nn.Module:
        """The encoder with this objective's heads added (NSP/SOP: pooler and sentence head; SBO)."""
        if config.arch != "encoder" or config.encoder_head != "mlm":
            raise ConfigError(f"{type(self).__name__} pre-trains an MLM encoder, but the model config has arch="
                              f"{config.arch!r}, encoder_head={config.encoder_head!r}; use a bert_*, roberta_*, albert_* "
                              "or *_generator preset")
        return models.build(config.replace(**self.heads))

    def loss_and_metrics(self, module, params, batch, rng, normalizers, loss: LossConfig):
        logits = module.apply({"params": params}, **batch, **dropout(rng), method="pretraining_logits")
        targets, weights = batch["encoder_target_tokens"], batch["encoder_loss_weights"]
        token_loss, z = losses.cross_entropy(logits["mlm"], targets, 1.0, loss.z_loss, loss.label_smoothing)
        objective = jnp.sum(token_loss * losses.objective_weights(loss.normalizing_factor, weights,
                                                                  batch.get("encoder_segment_ids")))
        objective = objective / normalizers["tokens"]
        metrics = token_metrics(token_loss, z, logits["mlm"], targets, weights, jnp.sum(weights).astype(jnp.float32),
                                prefix="mlm_")
        extra_objective, extra_metrics = self.extra_loss(logits, batch, normalizers)
        objective = objective + extra_objective
        return objective, {**metrics, **extra_metrics, "loss": objective}

    def extra_loss(self, logits, batch, normalizers) -> tuple[Any, dict[str, Any]]:
        """The objective's other part (0 for MLM alone) and its metrics."""
        return 0.0, {}

    def evaluators(self, task, split, task_feature_lengths, batch_size=32, data_dir=None, max_examples=None, **_):
        return {task.name: LossEvaluator(self, task, split, task_feature_lengths, batch_size, data_dir, max_examples)}


class _SentencePairObjective(MlmObjective):
    """MLM plus a 2-way classification of the pair from the pooled [CLS] (BERT's `sentence_head`)."""
    label: str = ""
    prefix: str = ""
    heads = {"pooler": True, "sentence_head": True}
    loss_label = "MLM per masked token + pair loss per pair"

    def normalizers(self, batch, loss):
        return {**super().normalizers(batch, loss), "pairs": jnp.float32(batch[self.label].shape[0])}

    def extra_loss(self, logits, batch, normalizers):
        labels = batch[self.label][:, 0]
        pair_loss, _ = losses.cross_entropy(logits["sentence"], labels, 1.0)
        pairs = jnp.float32(labels.shape[0])
        correct = jnp.sum(jnp.argmax(logits["sentence"], -1) == labels).astype(jnp.float32)
        return jnp.sum(pair_loss) / normalizers["pairs"], {f"{self.prefix}_loss": (jnp.sum(pair_loss), pairs),
                                                           f"{self.prefix}_accuracy": (correct, pairs)}


@gin.configurable
class MlmNspObjective(_SentencePairObjective):
    """BERT: MLM + next sentence prediction (`next_sentence_label` 1: B is from another document)."""
    label, prefix, converter = "next_sentence_label", "nsp", "encoder_nsp"


@gin.configurable
class MlmSopObjective(_SentencePairObjective):
    """ALBERT: MLM + sentence order prediction (`sentence_order_label` 1: A and B swapped); same head."""
    label, prefix, converter = "sentence_order_label", "sop", "encoder_sop"


@gin.configurable
class MlmSboObjective(MlmObjective):
    """SpanBERT: MLM + the span boundary objective on every masked token within the SBO head's
    `max_pair_targets` (15) first tokens of its span, each predicted from the span's boundary
    states, as SpanBERT's `span_bert_loss`. Its SBO term is the sum over those tokens divided by
    their number in the (global) batch, where SpanBERT divides by that number + 1 in each GPU's
    batch (its guard against an empty batch; t5lite's is a divisor of at least 1)."""
    heads = {"span_boundary_head": True}
    converter = "encoder_sbo"
    loss_label = "MLM per masked token + SBO per span token"

    @staticmethod
    def _weights(batch):
        relative = batch["span_relative_position"]
        return batch["encoder_loss_weights"] * (relative > 0) * (relative <= SpanBoundaryHead.max_pair_targets)

    def normalizers(self, batch, loss):
        return {**super().normalizers(batch, loss), "span_tokens": _count(self._weights(batch))}

    def extra_loss(self, logits, batch, normalizers):
        weights = self._weights(batch)
        targets = batch["encoder_target_tokens"]
        token_loss, _ = losses.cross_entropy(logits["span_boundary"], targets, weights)
        total = jnp.sum(weights).astype(jnp.float32)
        correct = losses.token_accuracy_count(logits["span_boundary"], targets, weights)
        return jnp.sum(token_loss) / normalizers["span_tokens"], {"sbo_loss": (jnp.sum(token_loss), total),
                                                                  "sbo_accuracy": (correct, total)}
