"""The jitted, sharded update of one run: `TrainState` and `TrainTask`.

`TrainTask` holds the model (built by the objective), the optimizer and every sharding; it makes
the initial state directly in its shardings and the jitted step. One step: the objective's loss and
gradients (accumulated over microbatches inside the program), the optimizer update, and a flag
saying whether the loss, gradient norm and new parameters are all finite; the loop fetches that
flag only at checkpoint steps, so a diverging run never saves a non-finite state.
"""
from __future__ import annotations

import functools
from typing import Any, Mapping

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

from t5lite.models import peft as peft_lib, quantization as quantization_lib
from t5lite.models.config import ModelConfig
from t5lite.models.running_statistics import RUNNING_STATISTICS, with_running_statistics
from t5lite.objectives.base import LossConfig, Objective, ratio_metrics
from t5lite.train import pruning as pruning_lib
from t5lite.train.optimizers import OptimizerFactory
from t5lite.train.partitioning import Partitioner


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
                   "grad_norm": optax.tree.norm(grads)}
        metrics[FINITE] = jnp.isfinite(metrics["loss"]) & jnp.isfinite(metrics["grad_norm"]) & _all_finite(params)
        return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

    def _microbatch(self, x, i):
        """Microbatch `i` of a [batch, ...] feature (M microbatches of B / M rows).

        With the 'microbatch' loss scope, T5X's (`accumulate_grads_microbatched`): the contiguous
        rows [i B/M, (i + 1) B/M). There each microbatch is normalised on its own, so which rows
        go together changes the update, and a batch gives T5X's gradient. Otherwise rows i, i + M,
        i + 2M, ...: the divisors are the whole batch's, so the grouping leaves a token loss's
        update as it is, and a strided microbatch is already spread over the data-parallel
        devices, so taking one moves no data (a contiguous slice lives on a subset of them and is
        resharded; tests/test_partitioning.py counts the collectives)."""
        m = self.num_microbatches
        if self.loss.per_microbatch:
            size = x.shape[0] // m
            rows = jax.lax.dynamic_slice_in_dim(x, i * size, size, axis=0)
        else:
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
