"""The train loop: a jitted, sharded step over a device mesh, with checkpoints and metrics.

`train()` is the gin entry point behind `t5lite train`. One step: build this host's batch,
assemble the global batch on the mesh, run the jitted update (gradient accumulation inside),
and every `log_every` steps fetch the averaged metrics. The step also says whether its loss,
gradient norm and new parameters are all finite; that flag is fetched only at checkpoint steps,
so a diverging run never saves a non-finite state (nor rotates out its last finite one).
"""
from __future__ import annotations

import functools
import itertools
import logging
import math
import os
import time
from typing import Any, Mapping

import flax
import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
from etils import epath
from jax.sharding import PartitionSpec as P
from tqdm.auto import tqdm

from t5lite import models
from t5lite.data import catalog, vocab as vocab_lib
from t5lite.data.loader import Loader, prefetch
from t5lite.errors import ConfigError, T5liteError, require_positive
from t5lite.infer import checkpoint_reader, evaluation, peft_checkpoint, predict
from t5lite.models import flops, peft as peft_lib, quantization as quantization_lib
from t5lite.models.config import ModelConfig
from t5lite.models.running_statistics import RUNNING_STATISTICS, with_running_statistics
from t5lite.train import checkpoints, cost, mfu, preemption, pruning as pruning_lib, run_dir, summaries
from t5lite.objectives import families  # noqa: F401  (gin knows every objective: train.objective = @...())
from t5lite.objectives.base import LossConfig, Objective, ratio_metrics
from t5lite.train.optimizers import OptimizerFactory
from t5lite.train.partitioning import Partitioner

log = logging.getLogger("t5lite")

# PEFT methods for `train.peft = @LoRA()` / `@BitFit()` (t5lite.models.peft).
gin.external_configurable(peft_lib.LoRA, "LoRA")
gin.external_configurable(peft_lib.BitFit, "BitFit")
gin.external_configurable(peft_lib.PromptTuning, "PromptTuning")
gin.external_configurable(peft_lib.PrefixTuning, "PrefixTuning")
gin.external_configurable(peft_lib.Adapters, "Adapters")


@flax.struct.dataclass
class TrainState:
    step: jax.Array
    params: Any
    opt_state: Any
    rng: jax.Array  # raw PRNG key data; the step's dropout key is fold_in(rng, step)


class TrainTask:
    """The model, optimizer and shardings for one run; builds the state and the jitted step."""

    def __init__(self, model_config: ModelConfig, optimizer: optax.GradientTransformation | OptimizerFactory,
                 schedule, partitioner: Partitioner, model_feature_lengths: Mapping[str, int],
                 loss: LossConfig = LossConfig(), num_microbatches: int = 1, objective: Objective | None = None,
                 peft: peft_lib.Method | None = None, quantization: str | None = None):
        """`optimizer` is an optax transformation or a function of the params' logical axis names
        returning one (t5lite's `adafactor` and `adamw`); `objective` says which module is trained
        and on what loss (t5lite.objectives.base; token cross entropy by default).

        With `peft` (t5lite.models.peft), the train state's params (and optimizer state and
        checkpoint) are only the trained tree; the frozen base params are an input of the step
        (`init_base`), never updated and without optimizer state."""
        self.config, self.schedule = model_config, schedule
        self.partitioner, self.loss, self.num_microbatches = partitioner, loss, num_microbatches
        self.objective = objective or Objective()
        self.model = self.objective.build_model(model_config)
        if quantization is not None:
            self.model = quantization_lib.quantized_training_model(self.model, quantization)
        self.feature_lengths = dict(model_feature_lengths)
        with self.mesh_context():  # the key is made inside eval_shape: the mesh may be a TPU topology's
            abstract_vars = jax.eval_shape(lambda: self._init_variables(jax.random.key(0)))
        self.peft = peft
        self.base_specs = nn.get_partition_spec(abstract_vars)["params"]
        self.base_shardings = partitioner.param_shardings(abstract_vars)["params"]
        self.abstract_base = nn.unbox(abstract_vars)["params"]
        self.num_base_params = peft_lib.count(self.abstract_base)
        if peft is None:
            self.param_specs, abstract_params, param_shardings = self.base_specs, self.abstract_base, self.base_shardings
        else:
            specs = []
            abstract_params = jax.eval_shape(lambda p: self._init_trained(jax.random.key(0), p, specs.append),
                                             self.abstract_base)
            self.param_specs = specs[0]
            param_shardings = jax.tree.map(partitioner.sharding, self.param_specs, is_leaf=lambda x: isinstance(x, P))
        if not isinstance(optimizer, optax.GradientTransformation):
            optimizer = optimizer(self.param_specs)
        self.optimizer = optimizer
        abstract_opt = jax.eval_shape(optimizer.init, abstract_params)
        replicated = partitioner.sharding(None)
        self.state_shardings = TrainState(
            step=replicated, params=param_shardings,
            opt_state=partitioner.opt_state_shardings(optimizer, abstract_opt, abstract_params, self.param_specs),
            rng=replicated)
        self.abstract_state = jax.tree.map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
            TrainState(jax.ShapeDtypeStruct((), jnp.int32), abstract_params, abstract_opt,
                       jax.ShapeDtypeStruct((2,), jnp.uint32)),
            self.state_shardings)
        self.num_params = peft_lib.count(abstract_params)      # the trained ones
        self.opt_state_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(abstract_opt))

    def mesh_context(self):
        """Mesh and axis rules active while tracing, so activation sharding constraints resolve."""
        return self.partitioner.context()

    def _init_variables(self, rng):
        return self.model.init(rng, **self.objective.init_features(self.feature_lengths))

    def _init_trained(self, rng, base, keep_specs=lambda specs: None):
        trained, specs = self.peft.init(rng, base, self.base_specs, self.config)
        keep_specs(specs)
        return trained

    def _full_params(self, rng, params):
        """Fresh params, with the given ones (fine-tuning) in their places: a None subtree (a new
        head) keeps its init."""
        p = nn.unbox(self._init_variables(rng))["params"]
        if params is not None:
            p = jax.tree.map(lambda given, fresh: fresh if given is None else given, params, p,
                             is_leaf=lambda x: x is None)
        return p

    def init_base(self, seed: int, params) -> Any:
        """A PEFT run's frozen base: `params` (the base checkpoint's) plus any new head's init."""
        with self.mesh_context():
            return jax.jit(lambda rng, params: self._full_params(jax.random.split(rng)[0], params),
                           out_shardings=self.base_shardings)(jax.random.key(seed), params)

    def init_state(self, seed: int, params=None) -> TrainState:
        """A fresh state, created directly in its shardings (no host copy of the full model).

        Given `params` (fine-tuning; a PEFT run's frozen base), they are an argument of the jitted
        function, not constants baked into it, and only the optimizer state is new."""
        def create(rng, params):
            init_rng, dropout_rng = jax.random.split(rng)
            p = self._full_params(init_rng, params)
            if self.peft is not None:
                p = self._init_trained(jax.random.fold_in(init_rng, 1), p)
            return TrainState(jnp.zeros((), jnp.int32), p, self.optimizer.init(p),
                              jax.random.key_data(dropout_rng))
        with self.mesh_context():
            return jax.jit(create, out_shardings=self.state_shardings)(jax.random.key(seed), params)

    def model_params(self, params, frozen=None):
        """What `module.apply` takes: the state's params, or for PEFT the base combined with them."""
        return params if self.peft is None else self.peft.combine(frozen, params)

    def _loss(self, params, frozen, *args, teacher=None):
        extra = {} if teacher is None else {"frozen": teacher}
        if self.peft is None:
            return self.objective.loss_and_metrics(self.model, params, *args, **extra)
        params, context = self.peft.for_training(frozen, params)
        with context:
            return self.objective.loss_and_metrics(self.model, params, *args, **extra)

    def train_step(self, state: TrainState, batch: dict, frozen=None, teacher=None,
                   masks=None) -> tuple[TrainState, dict]:
        """One update; `frozen` is a PEFT run's base params, `teacher` the objective's frozen arrays
        (`Objective.load_frozen`); gradients flow to `state.params` only. `masks`
        (t5lite.train.pruning) keep pruned weights at zero after the update."""
        rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
        normalizers = self.objective.normalizers(batch, self.loss)
        grad_fn = functools.partial(jax.grad(self._loss, argnums=0, has_aux=True), teacher=teacher)
        if self.num_microbatches == 1:
            grads, sums = grad_fn(state.params, frozen, batch, rng, normalizers, self.loss)
        else:
            def accumulate(carry, i):
                microbatch = jax.tree.map(lambda x: self._microbatch(x, i), batch)
                n = self.objective.normalizers(microbatch, self.loss) if self.loss.per_microbatch else normalizers
                g, s = grad_fn(state.params, frozen, microbatch, jax.random.fold_in(rng, i), n, self.loss)
                return jax.tree.map(jnp.add, carry, (g, s)), None

            abstract_sums = jax.eval_shape(lambda p, b: grad_fn(p, frozen, b, rng, normalizers, self.loss)[1],
                                           state.params, jax.tree.map(lambda x: self._microbatch(x, 0), batch))
            zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), (state.params, abstract_sums))
            (grads, sums), _ = jax.lax.scan(accumulate, zeros, jnp.arange(self.num_microbatches))
        running = sums.pop(RUNNING_STATISTICS, None)     # BatchNorm's running averages, no gradient's
        updates, opt_state = self.optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        if running:
            params = with_running_statistics(params, jax.tree.map(lambda x: x / self.num_microbatches, running))
        if masks is not None:
            params = pruning_lib.apply_masks(params, masks)
        metrics = {**self.objective.derived_metrics(ratio_metrics(sums)), "learning_rate": self.schedule(state.step),
                   "grad_norm": optax.global_norm(grads)}
        metrics[FINITE] = jnp.isfinite(metrics["loss"]) & jnp.isfinite(metrics["grad_norm"]) & _all_finite(params)
        return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

    def _microbatch(self, x, i):
        """Microbatch `i` of a [batch, ...] feature: rows i, i + M, i + 2M, ... (M microbatches).

        Strided, so every data-parallel device already holds its share of every microbatch and
        taking one moves no data (a contiguous slice would live on a subset of the devices and
        be resharded; tests/test_partitioning.py counts the collectives)."""
        m = self.num_microbatches
        strided = x.reshape((x.shape[0] // m, m) + x.shape[1:])
        rows = jax.lax.dynamic_index_in_dim(strided, i, axis=1, keepdims=False)
        return jax.lax.with_sharding_constraint(rows, self.partitioner.batch_sharding(x.ndim))

    def jit_train_step(self, frozen=None, teacher=None, masks=None):
        """`step(state, batch) -> (state, metrics)`, jitted (`.lower(state, batch)` compiles it from
        shapes). A PEFT run's `frozen` base, an objective's `teacher` and a pruned run's `masks` are
        inputs of the program, not donated and never constants baked into it."""
        batch_sharding = {k: self.partitioner.batch_sharding() for k in self.feature_lengths}
        if self.peft is None and teacher is None and masks is None:
            return jax.jit(self.train_step, in_shardings=(self.state_shardings, batch_sharding),
                           out_shardings=(self.state_shardings, None), donate_argnums=(0,))
        extra_shardings = (None if self.peft is None else self.base_shardings,
                           None if teacher is None else jax.tree.map(lambda x: x.sharding, teacher),
                           None if masks is None else self.mask_shardings(masks))
        step = jax.jit(self.train_step, in_shardings=(self.state_shardings, batch_sharding, *extra_shardings),
                       out_shardings=(self.state_shardings, None), donate_argnums=(0,))
        run = lambda state, batch: step(state, batch, frozen, teacher, masks)
        run.lower = lambda state, batch: step.lower(state, batch, frozen, teacher, masks)
        return run

    def mask_shardings(self, masks):
        """A pruning mask is laid out as its parameter; a scalar (unpruned) one is replicated."""
        replicated = self.partitioner.sharding(None)
        return jax.tree.map(lambda m, s: s if np.ndim(m) else replicated, masks, self.state_shardings.params)

    def flops_per_step(self, global_batch_size: int) -> float:
        """Model FLOPs of one step (forward + backward, t5lite.train.mfu), for MFU."""
        lengths = (self.feature_lengths.get("encoder_input_tokens", 0), self.feature_lengths.get("decoder_input_tokens", 0))
        return global_batch_size * (self.objective.train_flops_per_example(self.config, self.feature_lengths)
                                    + self.objective.extra_flops_per_example(*lengths))


# The train step's flag (a metric, not logged): loss, gradient norm and the updated params are finite.
FINITE = "finite"


def _all_finite(tree) -> jax.Array:
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


class NonFiniteLossError(T5liteError, FloatingPointError):
    """The loss or gradients diverged; the message names the last finite checkpoint to resume from."""


@gin.configurable
def model_config(preset: str = gin.REQUIRED, overrides: Mapping[str, Any] | None = None,
                 dtype: str | None = None, scan_layers: bool | None = None, remat_policy: str | None = None,
                 dropout_rate: float | None = None, vocab_size: int | None = None,
                 pad_token_id: int | None = None, max_position_embeddings: int | None = None) -> ModelConfig:
    """A preset with the fields users change most often overridden from gin (`pad_token_id`: a
    RoBERTa preset, pad 1, trained on a T5-style vocabulary, pad 0), and any other field of the
    preset's config through `overrides` (`{'num_encoder_layers': 4}`; a misspelt field is a
    ConfigError naming the close ones)."""
    changes = dict(overrides or {})
    for key, value in dict(dtype=dtype, scan_layers=scan_layers, remat_policy=remat_policy,
                           dropout_rate=dropout_rate, vocab_size=vocab_size, pad_token_id=pad_token_id,
                           max_position_embeddings=max_position_embeddings).items():
        if value is not None:
            changes[key] = value
    return models.get_config(preset, **changes)


@gin.configurable(denylist=["progress"])
def train(model_dir: str = gin.REQUIRED, mixture_or_task_name: str = gin.REQUIRED,
          task_feature_lengths: Mapping[str, int] = gin.REQUIRED, batch_size: int = gin.REQUIRED,
          train_steps: int = gin.REQUIRED, model: ModelConfig = gin.REQUIRED, optimizer=gin.REQUIRED,
          feature_converter: str = "enc_dec", pack: bool = True, seed: int = 0, num_microbatches: int = 1,
          z_loss: float = 1e-4, label_smoothing: float = 0.0,
          loss_normalizing_factor: float | str | None = "NUM_REAL_TARGET_TOKENS",
          loss_normalizing_scope: str = "global_batch", log_every: int = 10,
          checkpoint_every: int = 100,
          keep_checkpoints: int = 3, async_checkpoints: bool = True, data_dir: str | None = None,
          initial_checkpoint_path: str | None = None, initial_checkpoint_restore: str = "params",
          vocabulary_path: str | None = None,
          peak_flops_per_device: float | None = None, partitioner: Partitioner | None = None,
          train_split: str = "train", eval_every: int = 0, eval_split: str = "validation",
          eval_batch_size: int | None = None,
          eval_max_examples: int | None = None, allow_config_change: bool = False, objective: Objective | None = None,
          data_block_size: int = 128, data_workers: int = 0, peft: peft_lib.Method | None = None,
          pruning: pruning_lib.MagnitudePruning | pruning_lib.HeadPruning | None = None, quantization: str | None = None,
          progress: bool = True) -> dict:
    """Trains (or resumes) a model in `model_dir`; returns the last logged metrics.

    The task's `train_split` is trained on (e.g. 'validation' where a dataset ships no train file).
    With `eval_every`, the task's `eval_split` is evaluated every that many steps and at the end
    (t5lite.infer.evaluation): `eval_`-prefixed metrics go to metrics.jsonl, the predictions to
    `eval/<task>.<split>/predictions.jsonl`.

    `loss_normalizing_factor` takes T5X's values: the summed token loss is divided by the number
    of real target tokens ('NUM_REAL_TARGET_TOKENS', t5lite's default: a per-token mean; T5X's
    default is None), by all target positions ('NUM_TOTAL_TARGET_TOKENS'), by a constant (T5X
    fine-tunes the original T5 checkpoints with 233472), not at all (None), or every (packed)
    sequence weighs the same ('AVERAGE_PER_SEQUENCE'). `loss_normalizing_scope` says over what
    the factor (and every other divisor of the objective) is counted when `num_microbatches` > 1:
    'global_batch' (the default) counts the whole batch, so the update does not depend on
    `num_microbatches`; 'microbatch' is T5X's (each microbatch's loss divided by its own count,
    gradients summed).
    The logged `loss` is always the per-real-token mean.

    `objective` (t5lite.objectives.base) is the module trained and its loss; the default is token
    cross entropy over the model's logits (span corruption, LM, MLM). An objective's frozen arrays
    (a distillation teacher, t5lite.objectives.distillation) are loaded once and passed to every step;
    its reference models (the teacher) are evaluated once at step 0 (`teacher_eval_*`).

    Cost (t5lite.train.cost): every log adds the cumulative FLOPs, device-hours and estimated
    energy, CO2e and cloud price (`cost_*`) to metrics.jsonl and rewrites `MODEL_DIR/cost.json`;
    the FLOPs are the training steps' and every evaluation's forward passes (periodic, final and
    a reference model's), each evaluation line carrying the totals after it; a resumed run
    continues those totals.

    The input pipeline (t5lite.data.loader) preprocesses `data_block_size` records at a time in
    `data_workers` grain worker processes (0: in the training process); the block size is part of
    the data order, so a resumed run must keep it.

    `initial_checkpoint_path` starts a new run from another run's checkpoint: its parameters with
    a fresh optimizer at step 0 (`initial_checkpoint_restore='params'`), or its whole train state
    (`'full'`: optimizer state, step and rng, as T5X fine-tunes; `train_steps` then counts the
    pre-training steps). The objective places the parameters: a task head's objective grafts them
    into `params["backbone"]` and keeps the new head's init (`Objective.initial_params`).

    `peft` (`@LoRA()`, `@BitFit()`; t5lite.models.peft) fine-tunes a frozen base, the
    `initial_checkpoint_path`: only the method's parameters (and a task head) train, get optimizer
    state and are checkpointed; `MODEL_DIR/peft.json` names the base (t5lite.infer.peft_checkpoint).

    `pruning` (`@MagnitudePruning()` or `@HeadPruning()`, t5lite.train.pruning) prunes the starting
    params (those of `initial_checkpoint_path`; head pruning scores heads on the run's training
    batches), optionally rewinds the kept weights to an early checkpoint, and
    keeps pruned weights at zero after every update; `MODEL_DIR/sparsity.json` has the sparsity
    of every kernel, metrics.jsonl the total `sparsity` on every line and each kernel's
    (`sparsity/<path>`) on the run's first.

    `quantization` ('int8' or 'int4') is quantisation-aware training through Qwix: the forward
    pass (`__call__`) sees every weight matmul's weights quantised per output channel, gradients
    pass straight through to the float params, which the checkpoints keep (`t5lite convert
    --quantize int8` then writes the int8 run).

    Run safety (docs/guides/troubleshooting.md): MODEL_DIR must be writable and not in use by
    another run (`run_dir`); SIGTERM / SIGINT stop after the current step with a checkpoint
    (`preemption`); resuming restores the newest readable checkpoint and refuses a changed model
    config unless `allow_config_change`. A step whose loss, gradient norm or parameters are not
    finite is never saved: the run stops (NonFiniteLossError) naming the last finite checkpoint. A
    full disk stops it with one CheckpointError; the last complete checkpoint is kept. The
    vocabulary is recorded in `vocabulary.json`; resuming or fine-tuning (`initial_checkpoint_path`)
    with another one is refused unless `allow_config_change` or the gin `vocabulary.allow_mismatch`.
    With no `vocabulary_path` (nor gin `vocabulary.path`), the tokenizer a run carries (`t5lite
    convert --from_hf`: `RUN/tokenizer`) of `initial_checkpoint_path` or of the resumed run is used,
    and a fine-tuned run keeps a copy in `MODEL_DIR/tokenizer`."""
    require_positive({"TRAIN_STEPS": train_steps, "BATCH_SIZE": batch_size, "train.log_every": log_every,
                      "train.checkpoint_every": checkpoint_every, "train.keep_checkpoints": keep_checkpoints,
                      "train.num_microbatches": num_microbatches,
                      **{f"TASK_FEATURE_LENGTHS[{k!r}]": v for k, v in task_feature_lengths.items()}})
    if getattr(model, "weight_quantization", "none") != "none":   # recurrent configs have no quantised form
        raise ConfigError(f"model weight_quantization={model.weight_quantization!r} is an inference model: train a "
                          "float model (a quantised INITIAL_CHECKPOINT_PATH is dequantised when read)")
    if initial_checkpoint_restore not in ("params", "full"):
        raise ConfigError(f"train.initial_checkpoint_restore={initial_checkpoint_restore!r}: expected 'params' or 'full'")
    if peft is not None and initial_checkpoint_restore != "params":
        raise ConfigError("train.peft trains new parameters on a frozen base: use "
                          "train.initial_checkpoint_restore='params'")
    if pruning is not None and (peft is not None or initial_checkpoint_restore != "params"):
        raise ConfigError("train.pruning prunes the params a run starts from: use it without train.peft and with "
                          "train.initial_checkpoint_restore='params'")
    if peft is not None and pack and not peft.packs:
        raise ConfigError(f"train.peft={type(peft).__name__}(...) puts a prompt before each example, which packed "
                          "examples cannot share: set train.pack = False")
    checkpoint_dir = os.path.join(model_dir, "checkpoints")
    for path in (model_dir, checkpoint_dir):  # before anything compiles
        run_dir.ensure_writable(path)
    with run_dir.RunLock(model_dir), preemption.StopSignals() as stop:
        meter = cost.CostMeter(model_dir)   # MODEL_DIR/cost.json: cumulative over restarts
        ckpt = checkpoints.Checkpointer(checkpoint_dir, checkpoint_every, keep_checkpoints, async_checkpoints)
        if (ckpt.latest_step() or 0) >= train_steps:
            ckpt.close()
            log.warning("%s is already at step %d (TRAIN_STEPS=%d): nothing to do; raise TRAIN_STEPS to train "
                        "further", model_dir, ckpt.latest_step() or 0, train_steps)
            return {}
        objective = objective or Objective()
        model = objective.complete_config(model)
        run_dir.check_model_config(model_dir, model, ckpt.latest_step() or 0, allow_config_change)
        resuming = ckpt.latest_step() is not None
        source = model_dir if resuming or not initial_checkpoint_path else predict.run_dir(
            checkpoint_reader.step_directory(initial_checkpoint_path))
        own = vocab_lib.use_run_vocabulary(vocabulary_path, source)
        partitioner = partitioner or Partitioner()
        partitioner.check_batch_size(batch_size, num_microbatches)
        task = catalog.get_task_or_mixture(mixture_or_task_name)
        vocabulary = task.output_features["targets"].vocabulary
        vocab_lib.check_trainable(vocabulary)
        allow_mismatch = True if allow_config_change else None  # None: the gin vocabulary.allow_mismatch
        vocab_lib.check_identity(model_dir if resuming else None, vocabulary,
                                 objective.embedding_rows(model), allow_mismatch)
        if initial_checkpoint_path and not resuming:
            vocab_lib.check_identity(source, vocabulary, allow_mismatch=allow_mismatch)
        if own is not None and source != model_dir:   # the fine-tuned run carries the tokenizer on
            vocab_lib.record_tokenizer(model_dir, os.path.join(source, vocab_lib.TOKENIZER_DIR))
        optimizer, schedule = optimizer
        shard_index, shard_count = partitioner.data_shard()  # hosts of one data-parallel replica read the same data
        make_loader = functools.partial(Loader, task, train_split, task_feature_lengths, batch_size, feature_converter,
                                        pack=pack, seed=seed, data_dir=data_dir, shard_index=shard_index,
                                        shard_count=shard_count, block_size=data_block_size, worker_count=data_workers)
        loader = make_loader()
        feature_lengths = loader.converter.model_feature_lengths(task_feature_lengths, pack=pack)
        trainer = TrainTask(model, optimizer, schedule, partitioner, feature_lengths,
                            LossConfig(z_loss, label_smoothing, loss_normalizing_factor, loss_normalizing_scope),
                            num_microbatches, objective, peft, quantization)
        frozen = None
        if peft is not None:
            frozen = _peft_base(trainer, peft, model_dir, initial_checkpoint_path, seed, resuming)
        teacher = trainer.objective.load_frozen(partitioner)
        if ckpt.latest_step() is not None:
            state, data_state, start = ckpt.restore_newest_readable(trainer.abstract_state)
            loader.restore(data_state)
            log.info("resumed from step %d in %s", start, ckpt.directory)
        elif initial_checkpoint_path and initial_checkpoint_restore == "full":
            state = checkpoint_reader.restore_state(initial_checkpoint_path, trainer.abstract_state)
            start = int(state.step)
            log.info("continuing the train state of %s from its step %d", initial_checkpoint_path, start)
        elif peft is not None:
            state, start = trainer.init_state(seed, frozen), 0
        else:
            init_params = None
            if initial_checkpoint_path:
                abstract_params = trainer.abstract_state.params
                init_params = trainer.objective.initial_params(initial_checkpoint_path, abstract_params)
                log.info("initialised the parameters from %s", initial_checkpoint_path)
            state, start = trainer.init_state(seed, init_params), 0
        masks = None
        if pruning is not None:
            gradients = _loss_gradients(trainer, teacher, state.rng, make_loader, getattr(pruning, "batches", 0))
            state, masks = _pruned(trainer, pruning, state, seed, fresh=ckpt.latest_step() is None,
                                   gradients=gradients)
            sparsity = pruning_lib.sparsity(state.params)   # fixed: pruned weights stay zero
            pruning_lib.write_sparsity(model_dir, sparsity)
            if getattr(pruning, "record", None):
                pruning_lib.write_head_pruning(model_dir, pruning.record)
        run_dir.record_config(model_dir, model, gin.config_str(), start, vocabulary)
        peak, peak_source = mfu.peak_flops_per_device(peak_flops_per_device)
        flops_per_step = trainer.flops_per_step(batch_size)
        tokens_per_step = batch_size * sum(v for k, v in feature_lengths.items() if k.endswith("_input_tokens"))
        log.info("model %s: %.1fM params; %.3g FLOPs/step; peak %.3g FLOP/s/device (%s); mesh %s",
                 type(trainer.model).__name__, trainer.num_base_params / 1e6, flops_per_step, peak, peak_source,
                 dict(partitioner.mesh.shape))
        total = trainer.num_base_params + (trainer.num_params if peft is not None else 0)
        log.info("trainable params: %d || all params: %d || trainable%%: %.4f; optimizer state %.3g MB",
                 trainer.num_params, total, 100 * trainer.num_params / total, trainer.opt_state_bytes / 1e6)
        evaluators = {}
        if eval_every:
            evaluators = trainer.objective.evaluators(task, eval_split, task_feature_lengths,
                                                      batch_size=eval_batch_size or batch_size, data_dir=data_dir,
                                                      max_examples=eval_max_examples)
        writer = summaries.MetricsWriter(model_dir, resume_step=start)
        if evaluators and not start:
            for name, (module, params) in trainer.objective.reference_models(teacher).items():
                _evaluate(evaluators, module, params, start, eval_split, model_dir, writer, meter, prefix=f"{name}_")
        step_fn = trainer.jit_train_step(frozen, teacher, masks)
        batches = prefetch(loader)
        pending, last = [], {}
        bar = tqdm(total=train_steps, initial=start, desc="train", unit="step",
                   disable=not progress or jax.process_index())
        tick, tick_step = time.perf_counter(), start
        real = [0, 0]   # non-pad tokens and examples since the last log, over all hosts
        host_scale = batch_size // loader.local_batch_size
        try:
            with trainer.mesh_context():
                for step in range(start + 1, train_steps + 1):
                    batch, data_state = next(batches)
                    real_tokens, examples = flops.real_counts(batch)
                    real[0] += real_tokens * host_scale
                    real[1] += examples * host_scale
                    state, metrics = step_fn(state, partitioner.shard_batch(batch))
                    finite = metrics.pop(FINITE)
                    pending.append(metrics)
                    if step % log_every == 0 or step == train_steps or step == start + 1:
                        last = _summarise(pending)
                        pending = []
                        now = time.perf_counter()
                        elapsed, steps_done = now - tick, step - tick_step
                        last.update(_throughput(steps_done, elapsed, real, batch_size, tokens_per_step,
                                                flops_per_step / (peak * jax.device_count())))
                        meter.add_flops(flops_per_step * steps_done)
                        totals = meter.totals()
                        last.update({f"cost_{k}": v for k, v in totals.items()})
                        meter.write(step, totals)
                        tick, tick_step, real = now, step, [0, 0]
                        if masks is not None:   # every kernel's on the run's first line, the total on all
                            last["sparsity"] = sparsity["total"]
                            if step == start + 1:
                                last.update({f"sparsity/{k}": v for k, v in sparsity["layers"].items()})
                        if not math.isfinite(last["loss"]):
                            raise _non_finite(step, last, ckpt)
                        writer.write(step, last)
                        accuracy = _headline_accuracy(last)
                        bar.set_postfix(loss=f"{last['loss']:.3f}",
                                        **({} if accuracy is None else {"acc": f"{accuracy:.3f}"}),
                                        tok_s=f"{last['real_tokens_per_sec']:.0f}/{last['tokens_per_sec']:.0f}",
                                        ex_s=f"{last['examples_per_sec']:.1f}")
                    if evaluators and (step % eval_every == 0 or step == train_steps):
                        last.update(_evaluate(evaluators, trainer.model, trainer.model_params(state.params, frozen),
                                              step, eval_split, model_dir, writer, meter))
                    stopping = stop.requested(step, ckpt)
                    if stopping or step == train_steps or ckpt.due(step):
                        if not bool(finite):  # the only host sync of a step that is not logged
                            raise _non_finite(step, _summarise([metrics]), ckpt)
                        ckpt.save(step, state, data_state, force=True)
                    bar.update(1)
                    if stopping:
                        break
        finally:
            batches.close()  # stops the prefetch thread
            bar.close()
            ckpt.close()  # waits until the last save is committed
            writer.close()
        if step == train_steps:
            trainer.objective.finish(model_dir, trainer.model_params(state.params, frozen))
        if stop.signal_name:
            log.warning("stopped by %s at step %d; its checkpoint is saved in %s; rerun the same command to resume",
                        stop.signal_name, step, ckpt.directory)
        if jax.process_index() == 0 and epath.Path(writer.path).exists():
            summaries.plot_loss_curve(writer.path, os.path.join(model_dir, "loss.png"))
        if last:
            log.info("cost so far (%s, %d x %s): %s", meter.path, meter.model.devices, meter.model.device_kind,
                     cost.summary(meter.totals()))
        return last




def _non_finite(step: int, metrics: dict, ckpt: checkpoints.Checkpointer) -> NonFiniteLossError:
    last = ckpt.latest_step()
    resume = (f"the last finite checkpoint is step {last} in {ckpt.directory}; rerun the same command to resume "
              "from it" if last is not None else "no checkpoint was saved before it")
    return NonFiniteLossError(f"loss {metrics['loss']:.4g}, gradient norm {metrics['grad_norm']:.4g} at step {step}: "
                              f"not finite, so not saved; {resume}. Lower the learning rate, enable z_loss, or check "
                              "the data")


def _loss_gradients(trainer: TrainTask, teacher, rng, make_loader, count: int):
    """`gradients(params)`: the training loss's gradients on the first `count` batches of a fresh
    `make_loader()` (the same batches at every call), with the run's dropout."""
    def loss(params, batch, key):
        normalizers = trainer.objective.normalizers(batch, trainer.loss)
        return trainer._loss(params, None, batch, key, normalizers, trainer.loss, teacher=teacher)[0]
    grad = jax.jit(jax.grad(loss))

    def gradients(params):
        with trainer.mesh_context():
            for i, batch in enumerate(itertools.islice(make_loader(), count)):
                key = jax.random.fold_in(jax.random.wrap_key_data(rng), i)
                yield jax.device_get(grad(params, trainer.partitioner.shard_batch(batch), key))
    return gradients


def _pruned(trainer: TrainTask, pruning, state: TrainState, seed: int, fresh: bool, gradients=None):
    """(state, masks): a fresh run's params pruned (and rewound), or a resumed run's own pattern;
    `gradients` (`_loss_gradients`) scores heads for head pruning."""
    if not fresh:
        masks = pruning_lib.nonzero_masks(state.params)
        return state, jax.device_put(masks, trainer.mask_shardings(masks))
    masks = pruning.masks(state.params, gradients)
    params = state.params
    if pruning.rewind_checkpoint:
        rewound = trainer.objective.initial_params(pruning.rewind_checkpoint, trainer.abstract_state.params)
        params = trainer.init_state(seed, rewound).params
        log.info("rewound the kept weights to %s", pruning.rewind_checkpoint)
    masks = jax.device_put(masks, trainer.mask_shardings(masks))
    params = jax.jit(pruning_lib.apply_masks, out_shardings=trainer.state_shardings.params)(params, masks)
    log.info("pruned to sparsity %.4f (%s)", pruning_lib.sparsity(params)["total"], pruning)
    return state.replace(params=params), masks


def _peft_base(trainer: TrainTask, method, model_dir: str, base_path: str | None, seed: int, resuming: bool):
    """A PEFT run's frozen base params, checked against (or recorded in) MODEL_DIR/peft.json."""
    if not base_path:
        peft_checkpoint.check_or_record(model_dir, method, base_path, None, resuming)   # refuses with the fix
    abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                            trainer.abstract_base, trainer.base_shardings)
    base = trainer.objective.initial_params(base_path, abstract)
    record = peft_checkpoint.check_or_record(model_dir, method, base_path, base, resuming)
    log.info("PEFT %s on the frozen base %s (fingerprint %s)", record["method"], base_path,
             record["base_fingerprint"])
    return trainer.init_base(seed, base)


def _evaluate(evaluators, module, params, step: int, split: str, model_dir: str, writer, meter: cost.CostMeter,
              prefix: str = "") -> dict[str, float]:
    """Evaluates `params`; metrics into metrics.jsonl as `eval_*` (a reference model such as a
    distillation teacher: `teacher_eval_*`), predictions beside. The evaluation's forward FLOPs
    (`EvalResult.flops`) are part of the run's cost: they go to `meter`, whose totals are rewritten
    to cost.json, added to the eval line (`cost_*`) and returned."""
    results = evaluation.evaluate_all(evaluators, module, params)
    scores = evaluation.flat_metrics(results)
    meter.add_flops(sum(result.flops for result in results.values()))
    totals = meter.totals()
    meter.write(step, totals)
    costs = {f"cost_{k}": v for k, v in totals.items()}
    writer.write(step, {**{f"{prefix}eval_{k}": v for k, v in scores.items()}, **costs})
    if jax.process_index() == 0:
        for name, result in results.items():
            evaluation.write_result(os.path.join(model_dir, "eval", f"{prefix}{name}.{split}"), result)
    log.info("%seval at step %d (%s): %s", prefix, step, split, " ".join(f"{k}={v:.4g}" for k, v in scores.items()))
    return costs


def _throughput(steps: int, seconds: float, real: list, batch_size: int, tokens_per_step: int,
                mfu_per_step: float) -> dict:
    """Speeds since the last log: padded (every row slot) and real (non-pad tokens, examples);
    `mfu` counts the real tokens' FLOPs only, `padded_mfu` every slot's."""
    padded_tokens = tokens_per_step * steps
    return {"steps_per_sec": steps / seconds, "tokens_per_sec": padded_tokens / seconds,
            "real_tokens_per_sec": real[0] / seconds, "rows_per_sec": batch_size * steps / seconds,
            "examples_per_sec": real[1] / seconds, "padded_mfu": mfu_per_step * steps / seconds,
            "mfu": mfu_per_step * steps / seconds * real[0] / max(padded_tokens, 1)}


def _headline_accuracy(metrics: dict) -> float | None:
    """The progress bar's accuracy: token accuracy, or the objective's main one (e.g. `mlm_accuracy`);
    None for an objective that measures none (word2vec, Quick-Thought), so the bar shows no `acc`."""
    value = metrics.get("accuracy", next((v for k, v in metrics.items() if k.endswith("accuracy")), None))
    return None if value is None or not math.isfinite(value) else value


def _summarise(pending: list[dict]) -> dict:
    """Means over the steps since the last log (one device-to-host transfer)."""
    fetched = jax.device_get(pending)
    return {k: float(np.mean([m[k] for m in fetched])) for k in fetched[0]}
