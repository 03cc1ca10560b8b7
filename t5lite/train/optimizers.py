"""Optimizers and learning-rate schedules, built on optax, with T5X's defaults; ULMFiT's slanted
triangular schedule, discriminative (layer-wise) learning rates and gradual unfreezing around any
of them, for recurrent models and Transformers alike."""
from __future__ import annotations

import functools
import re
from typing import Any, Callable, Mapping

import gin
import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec as P

from t5lite.errors import ConfigError
from t5lite.train import adafactor as adafactor_lib

# What `adafactor` and `adamw` return: a function of the params' logical axis names (a tree of
# PartitionSpec, `TrainTask.param_specs`) building the optax transformation, since factoring and
# the weight-decay mask depend on them. TrainTask also takes a plain optax transformation.
OptimizerFactory = Callable[[Any], optax.GradientTransformation]


@gin.configurable
def rsqrt_decay(base_learning_rate: float = 1.0, warmup_steps: int = 10_000) -> optax.Schedule:
    """T5's schedule: base / sqrt(max(step, warmup)) — constant 0.01 for the first 10k steps."""
    def schedule(step):
        return base_learning_rate / jnp.sqrt(jnp.maximum(step, warmup_steps).astype(jnp.float32))
    return schedule


@gin.configurable
def constant(learning_rate: float = 1e-3) -> optax.Schedule:
    """T5's fine-tuning schedule."""
    return optax.constant_schedule(learning_rate)


@gin.configurable
def warmup_cosine(peak_learning_rate: float = 3e-4, warmup_steps: int = 1000, decay_steps: int = 100_000,
                  end_fraction: float = 0.1) -> optax.Schedule:
    return optax.warmup_cosine_decay_schedule(0.0, peak_learning_rate, warmup_steps, max(decay_steps, warmup_steps + 1),
                                              peak_learning_rate * end_fraction)


@gin.configurable
def slanted_triangular(max_learning_rate: float = 0.01, total_steps: int = gin.REQUIRED, cut_frac: float = 0.1,
                       ratio: float = 32.0) -> optax.Schedule:
    """ULMFiT's STLR (Howard and Ruder, 2018, eq. 3): a linear rise over the first `cut_frac` of
    `total_steps` from max / ratio to max, then a linear fall back to max / ratio.
    cut = floor(T cut_frac); p = t / cut for t < cut, else 1 - (t - cut) / (cut (1 / cut_frac - 1));
    lr = max (1 + p (ratio - 1)) / ratio."""
    cut = max(int(total_steps * cut_frac), 1)

    def schedule(step):
        t = jnp.asarray(step, jnp.float32)
        p = jnp.where(t < cut, t / cut, 1.0 - (t - cut) / (cut * (1.0 / cut_frac - 1.0)))
        return max_learning_rate * (1.0 + p * (ratio - 1.0)) / ratio
    return schedule


@gin.configurable
def linear_decay(learning_rate: float = 0.025, decay_steps: int = gin.REQUIRED,
                 end_fraction: float = 1e-4) -> optax.Schedule:
    """word2vec.c's rate: learning_rate x (1 - step / decay_steps), never below learning_rate x
    end_fraction (word2vec.c: alpha = starting_alpha * (1 - word_count_actual / (iter * train_words
    + 1)), floored at starting_alpha * 0.0001). The fraction done counts steps where word2vec.c
    counts words read: the same when every batch holds as many words."""
    def schedule(step):
        done = jnp.asarray(step, jnp.float32) / max(decay_steps, 1)
        return learning_rate * jnp.maximum(1.0 - done, end_fraction)
    return schedule


# A parameter path element that names layer k: Transformer stacks (`layers_3`), AWD-LSTM's
# (`lstm_3`) and ELMo's (`forward_1`, `backward_1`) LSTMs.
_LAYER = re.compile(r"^(?:layers|lstm|forward|backward)_(\d+)$")


def _path_keys(path) -> list[str]:
    return [str(getattr(k, "key", getattr(k, "name", k))) for k in path]


def layer_groups(param_specs: Any) -> tuple[Any, int]:
    """(a tree of group ids like the params, the number of groups): 0 for the embeddings (a path
    element containing `embed`, ELMo's `char_cnn`), k + 1 for layer k, and one top group after
    the last layer for the rest (final norm, pooler, LM or task head), as ULMFiT's layer groups."""
    def group(path, spec):
        keys = _path_keys(path)
        if "layers" in tuple(spec):
            raise ConfigError("discriminative learning rates need one parameter per layer; load the model with "
                              "scan_layers=False")
        for key in keys:
            match = _LAYER.match(key)
            if match:
                return int(match.group(1)) + 1
        return 0 if any("embed" in k or k == "char_cnn" for k in keys) else -1

    groups = jax.tree_util.tree_map_with_path(group, param_specs, is_leaf=lambda x: isinstance(x, P))
    top = max(jax.tree.leaves(groups)) + 1
    return jax.tree.map(lambda g: top if g < 0 else g, groups), top + 1


def scale_by_group(groups: Any, factors: Any) -> optax.GradientTransformation:
    """Multiplies each update by its group's factor (`factors[group]`)."""
    def update(updates, state, params=None):
        return jax.tree.map(lambda u, g: u * factors[g], updates, groups), state
    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def freeze_below(groups: Any, num_groups: int, every: float) -> optax.GradientTransformation:
    """Gradual unfreezing: zeroes the updates of every group but the top one for the first `every`
    steps, then lets one more group (top down) train every `every` steps (group g from step
    ceil((top - g) * every); `every` may be fractional, e.g. an epoch's steps)."""
    def init(params):
        return optax.ScaleByScheduleState(count=jnp.zeros([], jnp.int32))

    def update(updates, state, params=None):
        lowest = num_groups - 1 - jnp.floor(state.count / every).astype(jnp.int32)
        updates = jax.tree.map(lambda u, g: jnp.where(g >= lowest, u, jnp.zeros_like(u)), updates, groups)
        return updates, optax.ScaleByScheduleState(count=optax.safe_int32_increment(state.count))
    return optax.GradientTransformation(init, update)


def unfreeze_steps(unfreeze_every: int = 0, unfreeze_every_epochs: float = 0.0,
                   steps_per_epoch: int | None = None) -> float:
    """The steps between two unfreezings: `unfreeze_every` steps, or `unfreeze_every_epochs` epochs
    of `steps_per_epoch` steps (the optimizer never sees the data, so the run gives it:
    ceil(training examples / batch size)); 0 is no gradual unfreezing."""
    if unfreeze_every and unfreeze_every_epochs:
        raise ConfigError("set layerwise.unfreeze_every (steps) or layerwise.unfreeze_every_epochs, not both")
    if not unfreeze_every_epochs:
        return float(unfreeze_every)
    if not steps_per_epoch or steps_per_epoch < 1:
        raise ConfigError(f"layerwise.unfreeze_every_epochs={unfreeze_every_epochs} needs "
                          f"layerwise.steps_per_epoch (got {steps_per_epoch}): set it to ceil(training examples / "
                          "BATCH_SIZE), e.g. 2105 for SST-2's 67,349 sentences at 32")
    return unfreeze_every_epochs * steps_per_epoch


@gin.configurable
def layerwise(schedule: optax.Schedule = gin.REQUIRED, optimizer=gin.REQUIRED, decay: float = 2.6,
              unfreeze_every: int = 0, unfreeze_every_epochs: float = 0.0,
              steps_per_epoch: int | None = None) -> OptimizerFactory:
    """ULMFiT's discriminative fine-tuning around `optimizer` (`@adamw`, `@adafactor`): the top group's
    rate is the schedule's, each lower one's is divided by `decay` (2.6; layer-wise lr decay of
    Transformers is the same with decay 1 / 0.95 or so). With `unfreeze_every` > 0, gradual
    unfreezing: only the top group trains at first, one more every `unfreeze_every` steps; or, as
    ULMFiT, every `unfreeze_every_epochs` (1) epochs of `steps_per_epoch` steps. Frozen groups get
    zero gradients and updates. Groups: `layer_groups`."""
    inner = optimizer(schedule=schedule)
    every = unfreeze_steps(unfreeze_every, unfreeze_every_epochs, steps_per_epoch)

    def make(param_specs):
        groups, n = layer_groups(param_specs)
        tx = inner if isinstance(inner, optax.GradientTransformation) else inner(param_specs)
        chain = [tx, scale_by_group(groups, tuple(decay ** -(n - 1 - g) for g in range(n)))]
        if every:
            chain = [freeze_below(groups, n, every), *chain, freeze_below(groups, n, every)]
        return optax.chain(*chain)
    return make


@gin.configurable
def adafactor(schedule: optax.Schedule = gin.REQUIRED, decay_rate: float = 0.8, step_offset: int = 0,
              clipping_threshold: float | None = 1.0, min_dim_size_to_factor: int = 128,
              multiply_by_parameter_scale: bool = True, max_parameter_scale: float | None = None,
              epsilon1: float = 1e-30, epsilon2: float = 1e-3, factored: bool = True,
              factor_rules: Mapping[str, str] | None = None, beta1: float | None = None,
              dtype_momentum: str = "float32", weight_decay_rate: float | None = None,
              weight_decay_rate_lr_exponent: float | None = None, global_norm_clip_threshold: float | None = None,
              skip_nan_updates: bool = False, learning_rate=None, factor_map=None,
              logical_factor_rules=None) -> OptimizerFactory:
    """T5X's Adafactor (t5lite.train.adafactor) with T5X's options and defaults: second moments
    factored by logical axes and kept per layer of a scanned stack, parameter-scaled updates, RMS
    update clipping; momentum, weight decay and global-norm clipping when asked for.

    Three T5X bindings are refused by name rather than ignored: `learning_rate` (the rate is
    `optimizer_and_schedule.schedule`), `factor_map` and `logical_factor_rules` (t5lite always
    starts from T5X's standard rules; `factor_rules` adds or overrides logical axes)."""
    refused = {"learning_rate": (learning_rate, "set optimizer_and_schedule.schedule (e.g. @optimizers.constant())"),
               "factor_map": (factor_map, "map logical axis names with adafactor.factor_rules"),
               "logical_factor_rules": (logical_factor_rules, "t5lite starts from T5X's standard_logical_factor_rules; "
                                        "add or override axes with adafactor.factor_rules")}
    for name, (value, fix) in refused.items():
        if value is not None:
            raise ConfigError(f"adafactor.{name} is a T5X option t5lite does not take: {fix}")
    return functools.partial(
        adafactor_lib.adafactor, schedule, decay_rate=decay_rate, step_offset=step_offset,
        clipping_threshold=clipping_threshold, min_dim_size_to_factor=min_dim_size_to_factor,
        multiply_by_parameter_scale=multiply_by_parameter_scale, max_parameter_scale=max_parameter_scale,
        epsilon1=epsilon1, epsilon2=epsilon2, factored=factored, factor_rules=factor_rules, beta1=beta1,
        dtype_momentum=dtype_momentum, weight_decay_rate=weight_decay_rate,
        weight_decay_rate_lr_exponent=weight_decay_rate_lr_exponent,
        global_norm_clip_threshold=global_norm_clip_threshold, skip_nan_updates=skip_nan_updates)


def weight_decay_mask(param_specs: Any, decay_embeddings: bool = True) -> Any:
    """True for the parameters AdamW decays: kernels, and embeddings unless `decay_embeddings`
    is off; never biases or norm scales (BERT's and GPT-2's recipe)."""
    def decays(path, _):
        name = path[-1].key
        if name.endswith("bias") or name == "scale":
            return False
        return decay_embeddings or not name.endswith("embedding")
    return jax.tree_util.tree_map_with_path(decays, param_specs, is_leaf=lambda x: isinstance(x, P))


@gin.configurable
def adamw(schedule: optax.Schedule = gin.REQUIRED, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
          weight_decay: float = 0.01, decay_embeddings: bool = True,
          max_grad_norm: float | None = 1.0) -> OptimizerFactory:
    """AdamW with global-norm gradient clipping (the BERT/GPT recipe); weight decay skips biases
    and norm scales, and embeddings too with `decay_embeddings=False`."""
    def make(param_specs):
        chain = [optax.clip_by_global_norm(max_grad_norm)] if max_grad_norm else []
        chain.append(optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay,
                                 mask=weight_decay_mask(param_specs, decay_embeddings)))
        return optax.chain(*chain)
    return make


@gin.configurable
def sgd(schedule: optax.Schedule = gin.REQUIRED) -> optax.GradientTransformation:
    """Plain SGD, no momentum: params -= lr x gradient (word2vec.c's update)."""
    return optax.sgd(schedule)


@gin.configurable
def optimizer_and_schedule(optimizer=gin.REQUIRED, schedule=gin.REQUIRED):
    """Pairs an optimizer factory with a schedule so the trainer can log the learning rate."""
    return optimizer(schedule=schedule), schedule
