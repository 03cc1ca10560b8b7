"""What a train step minimises: an `Objective` turns a model and a batch into a loss and metrics.

The trainer is the same for every family; what differs is the module trained (a backbone, a
backbone with a task head, two networks trained jointly) and the loss over its outputs. An
objective owns both, so pre-training BERT with NSP, ELECTRA or a GLUE classifier is a gin line
(`train.objective = @SomeObjective()`), not a trainer fork.

Metrics come back as sums so microbatches add up: a `(numerator, denominator)` pair is logged as
their ratio over the whole batch, a plain number as its sum.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import flax.linen as nn
import jax.numpy as jnp

from t5lite import models
from t5lite.errors import ConfigError
from t5lite.infer import checkpoint_reader, evaluation
from t5lite.models import flops
from t5lite.models.config import ModelConfig
from t5lite.objectives import losses


@dataclasses.dataclass(frozen=True)
class LossConfig:
    z_loss: float = 1e-4
    label_smoothing: float = 0.0
    normalizing_factor: float | str | None = "NUM_REAL_TARGET_TOKENS"   # see losses.normalizing_factor
    # Over what the divisors are counted under gradient accumulation: the whole batch (the update
    # then does not depend on the number of microbatches) or each microbatch (T5X).
    normalizing_scope: str = "global_batch"

    def __post_init__(self):
        losses.check_normalizing_factor(self.normalizing_factor)
        if self.normalizing_scope not in NORMALIZING_SCOPES:
            raise ConfigError(f"train.loss_normalizing_scope={self.normalizing_scope!r}: expected one of "
                              f"{NORMALIZING_SCOPES}")

    @property
    def per_microbatch(self) -> bool:
        return self.normalizing_scope == "microbatch"


NORMALIZING_SCOPES = ("microbatch", "global_batch")


def target_keys(batch: Mapping[str, Any]) -> tuple[str, str]:
    """The (targets, loss weights) features: the encoder's for MLM, the decoder's otherwise."""
    prefix = "encoder" if "encoder_target_tokens" in batch else "decoder"
    return f"{prefix}_target_tokens", f"{prefix}_loss_weights"


def target_segment_ids(batch: Mapping[str, Any]):
    """The packed segment ids of the targets' stack, or None for an unpacked batch."""
    return batch.get("encoder_segment_ids" if "encoder_target_tokens" in batch else "decoder_segment_ids")


def ratio_metrics(sums: Mapping[str, Any]) -> dict[str, Any]:
    """Logged values of summed metrics: `(num, den)` -> num / den (0 when den is 0); others as is."""
    def value(v):
        if isinstance(v, tuple):
            num, den = v
            return jnp.where(den > 0, num / jnp.where(den > 0, den, 1.0), 0.0)
        return v
    return {k: value(v) for k, v in sums.items()}


class Objective:
    """The interface, and the default: token cross entropy over the model's logits (LM, MLM,
    sequence-to-sequence), weighted by the targets' loss weights (T5X's loss)."""
    # Whether the model is scored on the text it generates (t5lite.infer.evaluation's `Evaluator`);
    # an objective with evaluators of its own (a task head, a loss on held-out data) sets False.
    produces_text = True
    # What the logged `loss` is a mean over: the axis label of loss.png (t5lite.train.summaries).
    loss_label = "cross entropy per target token"

    def complete_config(self, config: ModelConfig) -> ModelConfig:
        """The run's model config with what only the objective knows filled in (word2vec's
        vocabulary size); the run records and resumes with this one."""
        return config

    def build_model(self, config: ModelConfig) -> nn.Module:
        """The module trained; its params are the train state's params (and the checkpoint's)."""
        return models.build(config)

    def embedding_rows(self, config) -> int | None:
        """The rows of the model's token embedding that the task's vocabulary must fit in; None when
        the objective does not read the task's token ids (the word-level recurrent models)."""
        return config.vocab_size

    def init_features(self, feature_lengths: Mapping[str, int]) -> dict[str, Any]:
        """Dummy features to initialise the module with: ones of [1, length] per feature."""
        return {k: jnp.ones((1, n), jnp.int32) for k, n in feature_lengths.items()}

    def normalizers(self, batch: Mapping[str, Any], loss: LossConfig) -> dict[str, Any]:
        """The divisors of the objective's terms, counted on `batch`: each microbatch (T5X's
        `loss_fn`) or, with `loss.normalizing_scope='global_batch'`, the whole batch once before
        it is split, so that accumulated microbatches mean one big batch."""
        _, weights_key = target_keys(batch)
        return {"tokens": losses.normalizing_factor(loss.normalizing_factor, batch[weights_key],
                                                    target_segment_ids(batch))}

    def loss_and_metrics(self, module: nn.Module, params, batch: Mapping[str, Any], rng, normalizers,
                         loss: LossConfig) -> tuple[Any, dict[str, Any]]:
        """(the scalar to minimise for this (micro)batch, summed metrics)."""
        targets_key, weights_key = target_keys(batch)
        weights = batch[weights_key]
        logits = module.apply({"params": params}, **batch, **dropout(rng))
        token_loss, z = losses.cross_entropy(logits, batch[targets_key], 1.0, loss.z_loss, loss.label_smoothing)
        objective = jnp.sum(token_loss * losses.objective_weights(loss.normalizing_factor, weights,
                                                                  target_segment_ids(batch))) / normalizers["tokens"]
        total = jnp.sum(weights).astype(jnp.float32)
        return objective, token_metrics(token_loss, z, logits, batch[targets_key], weights, total)


    def derived_metrics(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """The logged metrics of a step, with any the objective derives from them (perplexity)."""
        return metrics

    def train_flops_per_example(self, config: ModelConfig, feature_lengths: Mapping[str, int]) -> float:
        """Forward + backward model FLOPs of one example (t5lite.models.flops), for MFU."""
        return flops.train_flops_per_example(config, feature_lengths.get("encoder_input_tokens", 0),
                                           feature_lengths.get("decoder_input_tokens", 0))

    def initial_params(self, path: str, abstract_params) -> Any:
        """The params a run starts from given `train.initial_checkpoint_path`; a subtree left None
        (a new task head) keeps its fresh init."""
        return checkpoint_reader.restore_params(path, abstract_params)

    def finish(self, model_dir: str, params) -> None:
        """Called once when a run reaches its last step, with the final params (e.g. to export them)."""

    def evaluators(self, task, split: str, task_feature_lengths: Mapping[str, int], **kwargs) -> dict[str, Any]:
        """Train-time evaluators by task name (each `.evaluate(module, params) -> EvalResult`)."""
        return evaluation.evaluators(task, split, task_feature_lengths, **kwargs)

    # An objective may read arrays it never trains (a distillation teacher): the trainer loads them
    # once, passes them to every step as `loss_and_metrics(..., frozen=...)`, never updates them and
    # keeps them out of the optimizer state and the checkpoint.
    def load_frozen(self, partitioner) -> Any | None:
        """The objective's frozen arrays, laid out by `partitioner`; None: it has none."""
        return None

    def extra_flops_per_example(self, encoder_length: int, decoder_length: int) -> float:
        """FLOPs per example beyond the trained model's forward and backward (a teacher's forward)."""
        return 0.0

    def reference_models(self, frozen) -> dict[str, tuple[Any, Any]]:
        """{name: (module, params)} evaluated once when a run starts, beside the trained model."""
        return {}


def dropout(rng) -> dict[str, Any]:
    """`Module.apply` keywords: dropout with `rng`; none when it is None (a held-out evaluation)."""
    return {"enable_dropout": rng is not None, "rngs": {} if rng is None else {"dropout": rng}}


def token_metrics(token_loss, z, logits, targets, weights, total, prefix: str = "") -> dict[str, Any]:
    """Per-real-token mean loss, z-loss and accuracy, and the number of target tokens."""
    return {f"{prefix}loss": (jnp.sum(token_loss * weights), total),
            f"{prefix}z_loss": (jnp.sum(z * weights), total),
            f"{prefix}accuracy": (losses.token_accuracy_count(logits, targets, weights), total),
            f"{prefix}target_tokens": total}
