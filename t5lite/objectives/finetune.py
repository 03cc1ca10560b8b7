"""Fine-tuning encoders the way BERT does: a task head on the backbone, trained with the head's loss.

- `ClassificationObjective`: cross entropy on `label` from `SequenceClassificationHead` over BERT's
  pooler ("pooler") or the [CLS] state ("first"); `num_labels=1` is regression with mean squared
  error (STS-B), as Hugging Face's `BertForSequenceClassification` does.
- `SpanExtractionObjective`: (start CE + end CE) / 2 from `SpanExtractionHead`, as
  `BertForQuestionAnswering`.
- `TaggingObjective`: token cross entropy from `TokenTaggingHead` averaged over the labelled
  positions (`tag_ids` >= 0: each word's first subword), as `BertForTokenClassification`.
- `GptClassificationObjective`: GPT-1's fine-tuning of a decoder-only model, cross entropy (or
  squared error, one label) of a classifier on the last real token plus `lm_weight` times the LM
  loss on the same inputs (mean over their predicted tokens), as `GPT2ForSequenceClassification`'s
  loss plus `lm_weight` times `GPT2LMHeadModel`'s. Use with the `decoder_classification` converters
  and the `gpt_glue_*` tasks.

All train `WithHead(config, head)` (params `{"backbone", "head"}`): `initial_params` grafts a
pre-trained checkpoint (a t5lite run, or a Hugging Face model imported with `t5lite convert`) into
`params["backbone"]` and leaves the head to its fresh init. Evaluation is t5lite.infer.classify.
Use with the `encoder_classification` / `encoder_span` / `encoder_tagging` converters and the
`bert_*` / tagging (`uner_en_ewt`, `ud_en_ewt_upos`) tasks.
"""
from __future__ import annotations

from typing import Any, Mapping

import gin
import jax
import jax.numpy as jnp
import optax

from t5lite.data.finetune_converters import global_tokens
from t5lite.errors import ConfigError
from t5lite.infer import checkpoint_reader, classify
from t5lite.models import heads as H
from t5lite.models.config import ModelConfig
from t5lite.models.with_head import DecoderClassifier, WithHead
from t5lite.objectives.base import LossConfig, Objective

MODEL_INPUTS = ("encoder_input_tokens", "token_type_ids")
PACKED_INPUTS = ("encoder_segment_ids", "encoder_positions")   # a packed batch's
GLOBAL_INPUTS = ("encoder_global_attention_mask",)   # a windowed encoder's global tokens (global_tokens)
DECODER_INPUTS = ("decoder_input_tokens", "decoder_segment_ids", "decoder_positions")   # each order's


class HeadObjective(Objective):
    """What the task-head objectives share: the model inputs, per-example normalising, the graft."""
    labels: tuple[str, ...] = ()      # the label features of the batch
    pooling: str | None = None        # what the head reads (see WithHead)
    model_inputs = MODEL_INPUTS + PACKED_INPUTS + GLOBAL_INPUTS   # the batch features the model reads
    produces_text = False
    loss_label = "loss per example"

    def head(self, config: ModelConfig):
        raise NotImplementedError

    def build_model(self, config: ModelConfig):
        if global_tokens() and config.attention_window is None:
            raise ConfigError(f"global_tokens.which={global_tokens()!r} marks Longformer's global tokens, but the model "
                              "attends to every token (attention_window=None): set model_config overrides "
                              "attention_window, or global_tokens.which=None")
        if self.pooling == "pooler" and not config.pooler:
            raise ConfigError(f"{type(self).__name__}.pooling = 'pooler', but the model has no pooler "
                              "(model_config.pooler = False: RoBERTa, ELECTRA and DeBERTa pre-train none); set "
                              f"{type(self).__name__}.pooling = 'first' to classify its first token's state")
        return WithHead(config, self.head(config), self.pooling)

    def init_features(self, feature_lengths: Mapping[str, int]) -> dict[str, Any]:
        return {k: jnp.ones((1, feature_lengths[k]), jnp.int32) for k in MODEL_INPUTS}

    def normalizers(self, batch, loss: LossConfig) -> dict[str, Any]:
        """The loss is a mean over the examples of `batch` (a microbatch or the whole batch; packed,
        the filled label slots)."""
        if "label_weights" in batch:
            return {"examples": jnp.sum(batch["label_weights"]).astype(jnp.float32)}
        return {"examples": jnp.asarray(batch[self.labels[0]].shape[0], jnp.float32)}

    def apply(self, module, params, batch, rng=None):
        """The head's outputs; packed, [batch, label slots, ...] (one per segment)."""
        inputs = {k: batch[k] for k in self.model_inputs if k in batch}
        if "encoder_segment_ids" in batch and "label_weights" in batch:
            inputs["num_segments"] = batch["label_weights"].shape[1]
        if rng is None:
            return module.apply({"params": params}, **inputs)
        return module.apply({"params": params}, **inputs, enable_dropout=True, rngs={"dropout": rng})

    def initial_params(self, path: str, abstract_params) -> dict[str, Any]:
        """The checkpoint's (backbone) params as `params["backbone"]`; None: the head is new. A
        task-head run (a fine-tuned, pruned or quantised one) as checkpoint gives its backbone, and
        its head too where the head's shapes are this task's (training on, e.g. pruning rounds). An
        ELECTRA run gives its discriminator, the encoder ELECTRA fine-tunes (its shared embeddings
        included), and leaves the generator behind."""
        stored = checkpoint_reader.stored_param_names(path)
        fresh = {name: None for name in abstract_params}   # the head (and a BiLSTM) keep their init
        if "discriminator" in stored:
            backbone = checkpoint_reader.restore_params(path, {"discriminator": abstract_params["backbone"]})
            return {**fresh, "backbone": backbone["discriminator"]}
        if "backbone" not in stored:
            return {**fresh, "backbone": checkpoint_reader.restore_params(path, abstract_params["backbone"])}
        shapes = jax.tree.map(lambda m: tuple(m.shape), checkpoint_reader.stored_params(path))
        kept = ["backbone", *(name for name in abstract_params if name != "backbone" and name in shapes and
                              shapes[name] == jax.tree.map(lambda a: a.shape, abstract_params[name]))]
        return {**fresh, **checkpoint_reader.restore_params(path, {k: abstract_params[k] for k in kept})}


@gin.configurable
class ClassificationObjective(HeadObjective):
    labels = ("label",)

    def __init__(self, num_labels: int = 2, pooling: str = "pooler"):
        if num_labels < 1:
            raise ConfigError(f"ClassificationObjective.num_labels={num_labels}: use 1 (regression) or more classes")
        self.num_labels, self.pooling = num_labels, pooling

    def __repr__(self):
        return f"ClassificationObjective(num_labels={self.num_labels}, pooling={self.pooling!r})"

    def head(self, config):
        return H.SequenceClassificationHead(config, self.num_labels)

    def per_example_loss(self, logits, labels):
        if self.num_labels == 1:
            return (logits[:, 0] - labels.astype(jnp.float32)) ** 2
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels.astype(jnp.int32))

    def loss_and_metrics(self, module, params, batch, rng, normalizers, loss):
        total, metrics = self.classifier_terms(self.apply(module, params, batch, rng), batch)
        return total / normalizers["examples"], metrics

    def classifier_terms(self, logits, batch):
        """The summed per-example loss and the metrics of `logits` against `label` (packed: one
        per filled label slot)."""
        logits = logits.reshape(-1, self.num_labels)   # one row per label slot
        labels = batch["label"].reshape(-1)
        weights = batch["label_weights"].reshape(-1).astype(jnp.float32) if "label_weights" in batch else 1.0
        per_example = self.per_example_loss(logits, labels) * weights
        n = jnp.sum(jnp.broadcast_to(weights, labels.shape))
        metrics = {"loss": (jnp.sum(per_example), n), "examples": n}
        if self.num_labels > 1:
            metrics["accuracy"] = (jnp.sum((jnp.argmax(logits, -1) == labels) * weights), n)
        return jnp.sum(per_example), metrics

    def evaluators(self, task, split, task_feature_lengths, **kwargs):
        return {task.name: classify.ClassificationEvaluator(task, split, task_feature_lengths, **kwargs)}


@gin.configurable
class SpanExtractionObjective(HeadObjective):
    labels = ("start_position", "end_position")

    def __init__(self, n_best: int = 20, max_answer_length: int = 30):
        self.n_best, self.max_answer_length = n_best, max_answer_length

    def __repr__(self):
        return f"SpanExtractionObjective(n_best={self.n_best}, max_answer_length={self.max_answer_length})"

    def head(self, config):
        return H.SpanExtractionHead(config)

    def per_example_loss(self, start_logits, end_logits, starts, ends):
        ce = optax.softmax_cross_entropy_with_integer_labels
        return (ce(start_logits, starts) + ce(end_logits, ends)) / 2

    def loss_and_metrics(self, module, params, batch, rng, normalizers, loss):
        start_logits, end_logits = (x.reshape(-1, x.shape[-1]) for x in self.apply(module, params, batch, rng))
        starts, ends = batch["start_position"].reshape(-1), batch["end_position"].reshape(-1)   # one per label slot
        weights = batch["label_weights"].reshape(-1) > 0 if "label_weights" in batch else jnp.ones(starts.shape, bool)
        per_example = jnp.where(weights, self.per_example_loss(start_logits, end_logits, starts, ends), 0.0)
        n = jnp.sum(weights).astype(jnp.float32)
        hit = lambda logits, pos: jnp.sum((jnp.argmax(logits, -1) == pos) & weights).astype(jnp.float32)
        return jnp.sum(per_example) / normalizers["examples"], {
            "loss": (jnp.sum(per_example), n), "start_accuracy": (hit(start_logits, starts), n),
            "end_accuracy": (hit(end_logits, ends), n), "examples": n}

    def evaluators(self, task, split, task_feature_lengths, **kwargs):
        return {task.name: classify.SpanEvaluator(task, split, task_feature_lengths, n_best=self.n_best,
                                                  max_answer_length=self.max_answer_length, **kwargs)}


@gin.configurable
class TaggingObjective(HeadObjective):
    labels = ("tag_ids",)
    loss_label = "cross entropy per labelled token"

    def __init__(self, num_tags: int | None = None):
        if num_tags is None or num_tags < 2:
            raise ConfigError(f"TaggingObjective.num_tags={num_tags}: set it to the task's number of tags "
                              "(uner_en_ewt: 7, ud_en_ewt_upos: 17)")
        self.num_tags = num_tags

    def __repr__(self):
        return f"TaggingObjective(num_tags={self.num_tags})"

    def head(self, config):
        return H.TokenTaggingHead(config, self.num_tags)

    def normalizers(self, batch, loss: LossConfig) -> dict[str, Any]:
        """The loss is a mean over the labelled positions of `batch`."""
        return {"tags": jnp.maximum(jnp.sum(batch["tag_ids"] >= 0), 1).astype(jnp.float32)}

    def loss_and_metrics(self, module, params, batch, rng, normalizers, loss):
        logits = self.apply(module, params, batch, rng)
        tags = batch["tag_ids"]
        labelled = tags >= 0
        per_token = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.where(labelled, tags, 0))
        total = jnp.sum(jnp.where(labelled, per_token, 0.0))
        n = jnp.sum(labelled).astype(jnp.float32)
        correct = jnp.sum((jnp.argmax(logits, -1) == tags) & labelled).astype(jnp.float32)
        return total / normalizers["tags"], {"loss": (total, n), "accuracy": (correct, n), "tags": n}

    def evaluators(self, task, split, task_feature_lengths, **kwargs):
        return {task.name: classify.TaggingEvaluator(task, split, task_feature_lengths, **kwargs)}


@gin.configurable
class GptClassificationObjective(ClassificationObjective):
    """`num_labels` as ClassificationObjective's; `lm_weight`: the auxiliary LM loss's weight (GPT-1: 0.5;
    0 trains the classifier alone); `bilstm_hidden` > 0: a new BiLSTM of that many units per
    direction between the model and the classifier (BERT's "LTR + BiLSTM"; `DecoderClassifier`)."""

    def __init__(self, num_labels: int = 2, lm_weight: float = 0.5, bilstm_hidden: int = 0):
        super().__init__(num_labels, pooling="last")
        if lm_weight < 0:
            raise ConfigError(f"GptClassificationObjective.lm_weight={lm_weight}: use 0 (no LM loss) or more")
        if bilstm_hidden < 0:
            raise ConfigError(f"GptClassificationObjective.bilstm_hidden={bilstm_hidden}: use 0 (no BiLSTM) or more")
        self.lm_weight = lm_weight
        self.bilstm_hidden = bilstm_hidden

    def __repr__(self):
        return (f"GptClassificationObjective(num_labels={self.num_labels}, lm_weight={self.lm_weight}, "
                f"bilstm_hidden={self.bilstm_hidden})")

    def build_model(self, config: ModelConfig):
        if config.arch != "decoder":
            raise ConfigError(f"GptClassificationObjective fine-tunes a decoder-only model, not a {config.arch!r} one; "
                              "use ClassificationObjective for an encoder")
        return DecoderClassifier(config, self.num_labels, self.bilstm_hidden)

    def init_features(self, feature_lengths):
        return {k: jnp.ones((1, n), jnp.int32) for k, n in feature_lengths.items() if k.endswith(
            ("decoder_input_tokens", "decoder_segment_ids"))}

    def normalizers(self, batch, loss: LossConfig) -> dict[str, Any]:
        """Examples for the classifier (packed: the filled label slots); the predicted tokens of
        every order for the LM loss."""
        weights = [v for k, v in batch.items() if k.endswith("decoder_loss_weights")]
        return {**super().normalizers(batch, loss),
                "tokens": jnp.maximum(sum(jnp.sum(w) for w in weights), 1).astype(jnp.float32)}

    def apply(self, module, params, batch, rng=None, with_lm: bool = False):
        inputs = {k: v for k, v in batch.items() if k.endswith(DECODER_INPUTS)}
        if "label_weights" in batch:
            inputs["num_segments"] = batch["label_weights"].shape[1]
        if rng is None:
            return module.apply({"params": params}, **inputs, with_lm=with_lm)
        return module.apply({"params": params}, **inputs, with_lm=with_lm, enable_dropout=True, rngs={"dropout": rng})

    def loss_and_metrics(self, module, params, batch, rng, normalizers, loss):
        logits, lm_logits = self.apply(module, params, batch, rng, with_lm=True)
        classifier, metrics = self.classifier_terms(logits, batch)
        lm_total, lm_tokens = 0.0, 0.0
        for prefix, order_logits in zip(("", "swapped_"), lm_logits):
            weights = batch[prefix + "decoder_loss_weights"].astype(jnp.float32)
            ce = optax.softmax_cross_entropy_with_integer_labels(order_logits, batch[prefix + "decoder_target_tokens"])
            lm_total, lm_tokens = lm_total + jnp.sum(ce * weights), lm_tokens + jnp.sum(weights)
        objective = classifier / normalizers["examples"] + self.lm_weight * lm_total / normalizers["tokens"]
        return objective, {**metrics, "lm_loss": (lm_total, lm_tokens)}

    def evaluators(self, task, split, task_feature_lengths, **kwargs):
        return {task.name: classify.DecoderClassificationEvaluator(task, split, task_feature_lengths, **kwargs)}
