"""Knowledge distillation: a student trained on a frozen teacher's outputs as well as on its own task.

`DistillationObjective` (gin: `train.objective = @DistillationObjective()`) wraps the objective the
student would train alone (`DistillationObjective.objective`: token cross entropy for LM and span
corruption, `@MlmObjective()`, `@ClassificationObjective()`, ...): that objective's loss is the
hard loss, and its forward pass, run once for the student and once (without dropout, no gradient)
for the teacher, gives the logits and hidden states the soft losses compare. Any family and any
task head works, since the objective's own code makes both passes.

    loss = alpha_hard * (the objective's loss)
         + alpha_ce * KL(softmax(t / T) || softmax(s / T)) * T^2      (Hinton et al.; per position)
         + alpha_mse * sum((s - t)^2) / positions                    (DistilBERT's logit MSE)
         + alpha_cos * (1 - cos(h_s, h_t)) over the final hidden states (DistilBERT)
         + alpha_hidden * TinyBERT's hidden MSE (embeddings and layers, through a learned projection)
         + alpha_attention * TinyBERT's attention-score MSE

The KL, MSE and cosine terms are means over the distilled positions: the target tokens
(`positions='targets'`), every non-padding input token (`'inputs'`, DistilBERT's default), or a
head's examples (classification, tagging, spans). The teacher is any t5lite run (a Hugging Face
model imported with `t5lite convert --from_hf` is one): its own `model_config.json` says its size,
its params are an input of the train step, never trained, never in the optimizer state or the
student's checkpoint. With `student_layers`, the student starts from those layers of
`train.initial_checkpoint_path` (DistilBERT: [0, 2, 4, 7, 9, 11] of 12; every other layer of a
6-layer MiniLM: [0, 2, 4]); with `teacher_path=None` the objective trains the student alone from
that initialisation (the baseline a distillation run is compared with).
"""
from __future__ import annotations

import logging
import re
from typing import Any, Mapping, Sequence

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp

from t5lite.errors import ConfigError
from t5lite.infer import checkpoint_reader, predict
from t5lite.models import flops
from t5lite.models.config import ModelConfig
from t5lite.models.layers import init_std
from t5lite.models.transformer import Stack, TransformerLayer, scan_params, unscan_params
from t5lite.objectives.base import LossConfig, Objective, target_keys

log = logging.getLogger("t5lite")

POSITIONS = ("targets", "inputs")
PROJECTION = "distill_projection"   # the TinyBERT projection's entry in the student's params


# --- The losses, as pure functions of logits and hidden states -------------------------------

def kd_per_position(student_logits, teacher_logits, temperature: float):
    """KL(softmax(t / T) || softmax(s / T)) * T^2 of each position ([..., classes] -> [...])."""
    s = jax.nn.log_softmax(student_logits.astype(jnp.float32) / temperature, axis=-1)
    t = jax.nn.log_softmax(teacher_logits.astype(jnp.float32) / temperature, axis=-1)
    return jnp.sum(jnp.exp(t) * (t - s), axis=-1) * temperature ** 2


def mse_per_position(student_logits, teacher_logits):
    """Summed squared logit difference of each position (DistilBERT's MSE, divided by positions later)."""
    return jnp.sum(jnp.square(student_logits.astype(jnp.float32) - teacher_logits.astype(jnp.float32)), axis=-1)


def cosine_distance(student_hidden, teacher_hidden):
    """1 - cos(h_s, h_t) per position (torch's CosineEmbeddingLoss with target 1; eps 1e-8 as torch)."""
    s, t = student_hidden.astype(jnp.float32), teacher_hidden.astype(jnp.float32)
    dot = jnp.sum(s * t, -1)
    norms = jnp.sqrt(jnp.maximum(jnp.sum(s * s, -1) * jnp.sum(t * t, -1), 1e-8 ** 2))
    return 1.0 - dot / norms


def tinybert_attention_loss(student_scores: Sequence, teacher_scores: Sequence):
    """TinyBERT's attention loss: student layer i against teacher layer i*k + k - 1 (k = teacher /
    student layers), MSE over every entry of the pre-softmax scores, entries <= -100 (masked) set
    to 0, summed over the student's layers."""
    k = _layers_per_block(len(teacher_scores), len(student_scores))
    total = 0.0
    for i, s in enumerate(student_scores):
        t = teacher_scores[i * k + k - 1]
        s, t = (jnp.where(x <= -100, 0.0, x.astype(jnp.float32)) for x in (s, t))
        total = total + jnp.mean(jnp.square(s - t))
    return total


def tinybert_hidden_loss(student_hidden: Sequence, teacher_hidden: Sequence, projection=None):
    """TinyBERT's hidden-state loss: the student's embedding output and layer outputs (j = 0..M),
    each through `projection` ([d_student, d_teacher], None: the identity), against the teacher's
    j*k; MSE over every entry, summed."""
    k = _layers_per_block(len(teacher_hidden) - 1, len(student_hidden) - 1)
    total = 0.0
    for j, s in enumerate(student_hidden):
        s = s.astype(jnp.float32)
        if projection is not None:
            s = s @ projection["kernel"] + projection["bias"]
        total = total + jnp.mean(jnp.square(s - teacher_hidden[j * k].astype(jnp.float32)))
    return total


def _layers_per_block(teacher_layers: int, student_layers: int) -> int:
    if student_layers < 1 or teacher_layers % student_layers:
        raise ConfigError(f"TinyBERT's layer mapping needs the teacher's {teacher_layers} layers to be a multiple of "
                          f"the student's {student_layers}; choose a student depth that divides it")
    return teacher_layers // student_layers


# --- Student initialisation from teacher layers ----------------------------------------------

_LAYER = re.compile(r"layers_(\d+)$")


def select_layers(source, layers: Sequence[int] | Mapping[str, Sequence[int]]):
    """`source` params with each stack's layers replaced by the chosen ones: student layer i is
    source layer `layers[i]` (a list for every stack, or {"encoder": [...], "decoder": [...]});
    everything else (embeddings, norms, heads) is kept. Scanned params are unstacked and restacked."""
    scanned = _has_stacked_layers(source)
    tree = unscan_params(source) if scanned else source

    def walk(node, stack):
        if not isinstance(node, Mapping):
            return node
        chosen = _layers_for(layers, stack) if any(_LAYER.match(k) for k in node) else None
        out = {}
        for key, value in node.items():
            if chosen is not None and _LAYER.match(key):
                continue
            out[key] = walk(value, key if key in ("encoder", "decoder") else stack)
        if chosen is not None:
            available = sorted(int(_LAYER.match(k).group(1)) for k in node if _LAYER.match(k))
            missing = [i for i in chosen if i not in available]
            if missing:
                raise ConfigError(f"DistillationObjective.student_layers={list(chosen)}: the source {stack or 'stack'} "
                                  f"has layers {available[0]}..{available[-1]}, not {missing}")
            out.update({f"layers_{i}": node[f"layers_{j}"] for i, j in enumerate(chosen)})
        return out
    picked = walk(tree, None)
    return scan_params(picked) if scanned else picked


def _layers_for(layers, stack):
    if isinstance(layers, Mapping):
        if stack not in layers:
            raise ConfigError(f"DistillationObjective.student_layers has no entry for the {stack!r} stack "
                              f"(it names {sorted(layers)})")
        return list(layers[stack])
    return list(layers)


def _has_stacked_layers(tree) -> bool:
    return isinstance(tree, Mapping) and any(
        (k == "layers" and isinstance(v, Mapping) and "mlp_norm" in v and jnp.ndim(v["mlp_norm"].get("scale", 0)) == 2)
        or _has_stacked_layers(v) for k, v in tree.items())


# --- Running a model through an objective, keeping what the losses compare -------------------

def _capture(module: nn.Module, method_name: str) -> bool:
    """Layer outputs, embedding outputs and stack outputs (flax's captured intermediates)."""
    return ((isinstance(module, TransformerLayer) and method_name == "__call__")
            or (isinstance(module, Stack) and method_name in ("__call__", "_embed")))


class _Recorded:
    """Stands in for a module inside an objective's loss: `apply` runs the real module, keeps its
    result and (`hidden`, `scores`) its hidden states and attention scores, and (`frozen`) runs it
    without dropout. Other attributes are the module's."""

    def __init__(self, module, frozen: bool, hidden: bool, scores: bool):
        self._module, self._frozen, self._hidden, self._scores, self.calls = module, frozen, hidden, scores, []

    def __getattr__(self, name):
        return getattr(self._module, name)

    def apply(self, variables, *args, **kwargs):
        if self._frozen:
            kwargs = {**kwargs, "enable_dropout": False}
            kwargs.pop("rngs", None)
        mutable = (["intermediates"] if self._hidden else []) + (["attention_scores"] if self._scores else [])
        if not mutable:
            result = self._module.apply(variables, *args, **kwargs)
            self.calls.append((result, {}))
            return result
        result, state = self._module.apply(variables, *args, capture_intermediates=self._hidden and _capture,
                                           mutable=mutable, **kwargs)
        self.calls.append((result, state))
        return result


def _stack_outputs(state) -> dict[str, dict[str, Any]]:
    """Per stack ("encoder", "decoder"): its embedding output, layer outputs in order, final output
    and attention scores (self-attention), from one apply's captured state."""
    stacks = {}

    def walk(node, scores):
        for key, value in node.items():
            if not isinstance(value, Mapping):
                continue
            if key in ("encoder", "decoder") and "_embed" in value:
                names = sorted((k for k in value if _LAYER.match(k)), key=lambda k: int(_LAYER.match(k).group(1)))
                layer_scores = [scores.get(key, {}).get(n, {}).get("self_attention", {}).get("scores", (None,))[-1]
                                for n in names]
                stacks[key] = {"embedding": value["_embed"][-1], "layers": [value[n]["__call__"][-1][0] for n in names],
                               "final": value["__call__"][-1], "scores": layer_scores}
            else:
                walk(value, scores.get(key, {}) if isinstance(scores, Mapping) else {})
    walk(state.get("intermediates", {}), state.get("attention_scores", {}))
    return stacks


def _logits(result):
    """The outputs the soft losses compare: [positions..., classes] arrays (several for span heads)."""
    if isinstance(result, Mapping):
        return (result["mlm"],) if "mlm" in result else tuple(result.values())
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def kd_weights(batch: Mapping[str, Any], positions: str, pad_id: int):
    """Which positions of the objective's outputs are distilled (flattened to [positions])."""
    if "label_weights" in batch:                      # packed classification: the filled label slots
        return batch["label_weights"].reshape(-1).astype(jnp.float32)
    if "tag_ids" in batch:
        return (batch["tag_ids"] >= 0).reshape(-1).astype(jnp.float32)
    for key in ("label", "start_position"):           # one output row per example
        if key in batch:
            return jnp.ones(batch[key].shape[:1], jnp.float32)
    if positions == "targets":
        return batch[target_keys(batch)[1]].reshape(-1).astype(jnp.float32)
    prefix = "encoder" if "encoder_target_tokens" in batch or "decoder_target_tokens" not in batch else "decoder"
    segments = batch.get(f"{prefix}_segment_ids")
    real = segments > 0 if segments is not None else batch[f"{prefix}_target_tokens" if prefix == "decoder"
                                                           else "encoder_input_tokens"] != pad_id
    return real.reshape(-1).astype(jnp.float32)


def _hidden_mask(batch, stack: str, pad_id: int):
    """The non-padding positions of a stack's inputs [b, l] (DistilBERT's attention mask)."""
    segments = batch.get(f"{stack}_segment_ids")
    if segments is not None:
        return segments > 0
    if stack == "decoder":
        return batch.get("decoder_target_tokens", batch["decoder_input_tokens"]) != pad_id
    return batch["encoder_input_tokens"] != pad_id


class WithProjection:
    """The student module plus TinyBERT's learned projection (d_student -> d_teacher) as an extra
    top-level params entry (`PROJECTION`); `apply` hands the model its own params, so evaluation and
    inference of the student read the checkpoint as usual. Other attributes are the model's.

    The projection starts as TinyBERT's `fit_dense` (an nn.Linear under `init_bert_weights`):
    kernel N(0, std) with the student's BERT-style init stddev (BERT's 0.02 for a family with a
    fan-in scaled init, such as T5), bias zero."""

    def __init__(self, module, teacher_width: int):
        self.module, self.teacher_width = module, teacher_width

    def __getattr__(self, name):
        return getattr(self.module, name)

    def init(self, rng, *args, **kwargs):
        variables = self.module.init(rng, *args, **kwargs)
        width, std = self.module.config.d_model, init_std(self.module.config, 0.02)
        kernel = jax.random.normal(jax.random.fold_in(rng, 7), (width, self.teacher_width)) * std
        projection = {"kernel": nn.LogicallyPartitioned(kernel, ("embed", "mlp")),
                      "bias": nn.LogicallyPartitioned(jnp.zeros((self.teacher_width,)), ("mlp",))}
        return {**variables, "params": {**variables["params"], PROJECTION: projection}}

    def apply(self, variables, *args, **kwargs):
        params = {k: v for k, v in variables["params"].items() if k != PROJECTION}
        return self.module.apply({**variables, "params": params}, *args, **kwargs)


@gin.configurable
class DistillationObjective(Objective):
    """See the module docstring. `teacher_path`: the teacher run (or step directory); its model is
    its `model_config.json` unless `teacher_preset` names one. Presets: gin/objectives/distillation.gin
    (DistilBERT's argument defaults) and distilbert_readme.gin (its README's 5.0 / 2.0 / 1.0)."""
    loss_label = "weighted sum of the distillation losses"

    def __init__(self, objective: Objective | None = None, teacher_path: str | None = None,
                 teacher_preset: str | None = None, temperature: float = 2.0, alpha_ce: float = 0.5,
                 alpha_hard: float = 0.5, alpha_mse: float = 0.0, alpha_cos: float = 0.0, alpha_hidden: float = 0.0,
                 alpha_attention: float = 0.0, positions: str = "targets",
                 student_layers: Sequence[int] | Mapping[str, Sequence[int]] | None = None):
        if positions not in POSITIONS:
            raise ConfigError(f"DistillationObjective.positions={positions!r}: expected one of {POSITIONS}")
        if temperature <= 0:
            raise ConfigError(f"DistillationObjective.temperature={temperature}: must be > 0")
        if type(objective).__name__ == "ElectraObjective":
            raise ConfigError("DistillationObjective.objective: ELECTRA trains two networks; distil its discriminator "
                              "with its own fine-tuning objective instead")
        self.objective = objective or Objective()
        self.teacher_path, self.teacher_preset = teacher_path, teacher_preset
        self.temperature, self.positions, self.student_layers = temperature, positions, student_layers
        self.alphas = dict(ce=alpha_ce, hard=alpha_hard, mse=alpha_mse, cos=alpha_cos, hidden=alpha_hidden,
                           attention=alpha_attention)
        self.teacher_config: ModelConfig | None = None
        self.teacher_module = None

    def __repr__(self):
        return (f"DistillationObjective({self.objective!r}, teacher={self.teacher_path!r}, T={self.temperature}, "
                f"alphas={self.alphas})")

    @property
    def has_teacher(self) -> bool:
        return self.teacher_path is not None

    def _teacher(self) -> tuple[ModelConfig, Any]:
        if self.teacher_config is None:
            from t5lite import models
            self.teacher_config = (models.get_config(self.teacher_preset) if self.teacher_preset
                                   else predict.model_config_of(self.teacher_path, None))
            if self.teacher_config.scan_layers and (self.alphas["hidden"] or self.alphas["attention"]):
                self.teacher_config = self.teacher_config.replace(scan_layers=False)
            self.teacher_module = self.objective.build_model(self.teacher_config)
        return self.teacher_config, self.teacher_module

    # The student: the wrapped objective's module, features and evaluation.
    def build_model(self, config: ModelConfig):
        if (self.alphas["hidden"] or self.alphas["attention"]) and config.scan_layers:
            raise ConfigError("TinyBERT's losses read each layer: set model_config.scan_layers = False")
        if self.has_teacher:
            self._check_teacher_fits(config)
        module = self.objective.build_model(config)
        if self.has_teacher and self.alphas["hidden"]:
            module = WithProjection(module, self._teacher()[0].d_model)
        return module

    def _check_teacher_fits(self, student: ModelConfig) -> None:
        """Both models read the student's batch and their outputs are compared position by position, so
        they must be of one family (the batch's features) and read the same token ids: else the step
        fails on features the teacher lacks, or ids past the teacher's embedding table give NaN losses."""
        teacher = self._teacher()[0]
        differ = [f"{name} {getattr(teacher, name)!r} vs {getattr(student, name)!r}"
                  for name in ("arch", "vocab_size") if getattr(teacher, name) != getattr(student, name)]
        if differ:
            raise ConfigError(f"the distillation teacher {self.teacher_preset or self.teacher_path} does not fit the "
                              f"student model_config ({', '.join(differ)}, teacher vs student): both read the same "
                              "token ids and their outputs are compared, so they need the same arch and vocabulary; "
                              "give DistillationObjective.teacher_path a teacher of the student's family and "
                              "vocabulary, or a student of the teacher's")

    def init_features(self, feature_lengths):
        return self.objective.init_features(feature_lengths)

    def evaluators(self, task, split, task_feature_lengths, **kwargs):
        return self.objective.evaluators(task, split, task_feature_lengths, **kwargs)

    def normalizers(self, batch, loss: LossConfig):
        pad = self._teacher()[0].pad_token_id if self.has_teacher else 0
        n = jnp.sum(kd_weights(batch, self.positions, pad))
        return {**self.objective.normalizers(batch, loss), "kd_positions": jnp.maximum(n, 1.0)}

    def initial_params(self, path: str, abstract_params):
        """The student's params from `path`: as the wrapped objective reads them, or (with
        `student_layers`) the chosen layers of `path`'s model, read at its own size."""
        if self.student_layers is None:
            return self.objective.initial_params(path, _without_projection(abstract_params))
        source_config = predict.model_config_of(path, None)
        source_abstract = predict.abstract_params(source_config, module=self.objective.build_model(source_config))
        picked = select_layers(self.objective.initial_params(path, source_abstract), self.student_layers)
        log.info("student initialised from layers %s of %s", self.student_layers, path)
        expected = _without_projection(abstract_params)
        _check_shapes(picked, expected, path)
        return {**picked, PROJECTION: None} if PROJECTION in abstract_params else picked

    # The teacher: a frozen input of the train step.
    def frozen_abstract(self, partitioner) -> Any | None:
        """The teacher params' shapes and shardings (None without a teacher)."""
        if not self.has_teacher:
            return None
        config, module = self._teacher()
        return predict.abstract_params(config, partitioner, module)

    def load_frozen(self, partitioner) -> Any | None:
        """The teacher's params, read from `teacher_path` in the partitioner's layout."""
        if not self.has_teacher:
            return None
        abstract = self.frozen_abstract(partitioner)
        params = checkpoint_reader.restore_params(self.teacher_path, abstract)
        log.info("teacher %s: %s, %.1fM params (frozen)", self.teacher_path, self.teacher_config.arch,
                 sum(x.size for x in jax.tree.leaves(params)) / 1e6)
        return params

    def extra_flops_per_example(self, encoder_length: int, decoder_length: int) -> float:
        """The teacher's forward pass, per example (t5lite.models.flops)."""
        if not self.has_teacher:
            return 0.0
        return flops.forward_flops_per_example(self._teacher()[0], encoder_length, decoder_length)

    def reference_models(self, frozen) -> dict[str, tuple[Any, Any]]:
        """Models evaluated once at the start of a run, beside the student: the teacher."""
        return {"teacher": (self._teacher()[1], frozen)} if self.has_teacher else {}

    def loss_and_metrics(self, module, params, batch, rng, normalizers, loss: LossConfig, frozen=None):
        tinybert = bool(self.alphas["hidden"] or self.alphas["attention"])
        hidden, scores = bool(tinybert or self.alphas["cos"]), bool(self.alphas["attention"])
        student = _Recorded(module, frozen=False, hidden=hidden, scores=scores)
        hard, metrics = self.objective.loss_and_metrics(student, params, batch, rng, normalizers, loss)
        if not self.has_teacher:
            return hard, metrics
        if frozen is None:
            raise ConfigError("DistillationObjective needs the teacher's params as the step's frozen input")
        teacher = _Recorded(self._teacher()[1], frozen=True, hidden=hidden, scores=scores)
        self.objective.loss_and_metrics(teacher, frozen, batch, rng, normalizers, loss)
        (s_result, s_state), (t_result, t_state) = student.calls[-1], teacher.calls[-1]
        t_result, t_state = jax.lax.stop_gradient((t_result, t_state))
        weights = kd_weights(batch, self.positions, module.config.pad_token_id)
        parts = {"hard": hard}
        ce = mse = 0.0
        for s, t in zip(_logits(s_result), _logits(t_result)):
            s, t = s.reshape(weights.shape[0], -1), t.reshape(weights.shape[0], -1)
            ce = ce + jnp.sum(kd_per_position(s, t, self.temperature) * weights)
            if self.alphas["mse"]:
                mse = mse + jnp.sum(mse_per_position(s, t) * weights)
        parts["ce"] = ce / normalizers["kd_positions"]
        if self.alphas["mse"]:
            parts["mse"] = mse / normalizers["kd_positions"]
        s_stacks, t_stacks = _stack_outputs(s_state), _stack_outputs(t_state)
        if self.alphas["cos"]:
            stack = "encoder" if "encoder" in s_stacks else "decoder"
            mask = _hidden_mask(batch, stack, module.config.pad_token_id).astype(jnp.float32)
            distance = cosine_distance(s_stacks[stack]["final"], t_stacks[stack]["final"])
            parts["cos"] = jnp.sum(distance * mask) / jnp.maximum(jnp.sum(mask), 1.0)
        if tinybert:
            parts["hidden"] = parts["attention"] = 0.0
            for stack in s_stacks:
                s, t = s_stacks[stack], t_stacks[stack]
                if self.alphas["hidden"]:
                    parts["hidden"] += tinybert_hidden_loss([s["embedding"], *s["layers"]],
                                                            [t["embedding"], *t["layers"]], params.get(PROJECTION))
                if self.alphas["attention"]:
                    parts["attention"] += tinybert_attention_loss(s["scores"], t["scores"])
        total = sum(self.alphas[name] * value for name, value in parts.items())
        n = jnp.sum(weights)
        metrics = {**metrics, "hard_loss": hard, "loss": total,
                   "kd_loss": (parts["ce"] * normalizers["kd_positions"], normalizers["kd_positions"]),
                   **{f"{name}_loss": value for name, value in parts.items() if name not in ("hard", "ce")},
                   "kd_positions": n}
        if len(_logits(s_result)) == 1:
            s, t = (x.reshape(weights.shape[0], -1) for x in (_logits(s_result)[0], _logits(t_result)[0]))
            metrics["teacher_agreement"] = (jnp.sum((jnp.argmax(s, -1) == jnp.argmax(t, -1)) * weights), n)
        return total, metrics


def _without_projection(params):
    return {k: v for k, v in params.items() if k != PROJECTION} if isinstance(params, Mapping) else params


def _check_shapes(picked, expected, path: str) -> None:
    flat_picked = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(picked)}
    for key, want in jax.tree_util.tree_leaves_with_path(expected):
        name = jax.tree_util.keystr(key)
        got = flat_picked.get(name)
        if got is not None and tuple(got.shape) != tuple(want.shape):
            raise ConfigError(f"DistillationObjective.student_layers from {path}: parameter {name} has shape "
                              f"{tuple(got.shape)}, the student expects {tuple(want.shape)}; the student must keep "
                              "the source's width (only its depth may change)")
