"""Adafactor as T5X runs it: second moments factored by each parameter's logical axes.

optax's Adafactor factors the two largest dimensions of every array, so a `(embed, heads, kv)`
attention kernel of shape (512, 8, 64) is not factored, and a scanned stack `(layers, embed,
mlp)` shares one parameter scale and one update clip across all its layers. T5X instead maps
each logical axis to a role (`LOGICAL_FACTOR_RULES`): ROW and COLUMN axes are averaged into the
row and column statistics, BATCH axes (`layers`) keep separate statistics, parameter scale and
update clipping per slice, NONE axes are not factored. As in T5X, a parameter of rank <= 2
without a BATCH axis uses the classic rule instead (its two dimensions, if the smaller has at
least `min_dim_size_to_factor` entries). T5X's other options (momentum, weight decay, global-norm
clipping, a capped parameter scale, skipping NaN updates, `step_offset`, `factored=False`) keep
T5X's names, defaults and update rule. The paper: https://arxiv.org/abs/1804.04235.
"""
from __future__ import annotations

from typing import Any, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

from t5lite.errors import ConfigError

ROW, COLUMN, BATCH, NONE = "row", "column", "batch", "none"

# T5X's `standard_logical_factor_rules`, plus the axis names only t5lite uses (last line).
LOGICAL_FACTOR_RULES: Mapping[str, str] = {
    "vocab": COLUMN, "embed": ROW, "mlp": COLUMN, "heads": COLUMN, "kv": COLUMN, "joined_kv": COLUMN,
    "relpos_buckets": NONE, "layers": BATCH, "stack": BATCH, "q_wi_fused": COLUMN, "o_wo_fused": COLUMN,
    "multiquery_heads": COLUMN, "kv_fused": COLUMN, "layer_norm_scale": NONE,
    "mlp_activations": COLUMN, "abspos_buckets": NONE, "token_types": NONE, "classes": COLUMN, "factorized_embed": ROW,
    "lora_rank": COLUMN, "lora_group": COLUMN, "prompt_tokens": COLUMN, "adapter": COLUMN,
}


class AdafactorState(NamedTuple):
    """Per-parameter statistics; the ones a parameter does not use are scalar zeros.

    Factored statistics keep the parameter's rank (reduced dimensions have size 1), so their
    sharding is the parameter's on the dimensions they keep."""
    count: jax.Array
    v_row: optax.Updates   # mean squared gradient over the COLUMN dims
    v_col: optax.Updates   # mean squared gradient over the ROW dims
    v: optax.Updates       # the full second moment of unfactored parameters


class AdafactorMomentumState(NamedTuple):
    """The state with `beta1`: the statistics and the momentum of the updates. A class of its
    own, so that the state (and checkpoints) of runs without momentum stay as they were."""
    count: jax.Array
    v_row: optax.Updates
    v_col: optax.Updates
    v: optax.Updates
    m: optax.Updates       # in `dtype_momentum`


class _Factoring(NamedTuple):
    averaging_dims: tuple[int, ...]                      # every dim but the BATCH ones
    factored: tuple[tuple[int, ...], tuple[int, ...]] | None  # (row dims, column dims)


# T5X's names for the roles (`factor_name_to_factordim`).
_ROLE_ALIASES = {"col": COLUMN, "unfactorized": NONE}


def _factoring(shape, axis_names, rules: Mapping[str, str], min_dim_size_to_factor: int, name: str) -> _Factoring:
    """T5X's rule for one parameter (`set_param_axes` and `_parse_rule` there)."""
    if len(axis_names) != len(shape):
        raise ValueError(f"Adafactor: parameter {name} of shape {tuple(shape)} has logical axes {tuple(axis_names)}; "
                         "every dimension needs a name (t5lite.models.layers.param_with_axes)")
    unknown = [a for a in axis_names if a not in rules]
    if unknown:
        raise ValueError(f"Adafactor: parameter {name} has logical axes {unknown} without a factoring rule; "
                         f"add them to `adafactor.factor_rules` as one of {ROW!r}, {COLUMN!r}, {BATCH!r}, {NONE!r}")
    roles = [rules[a] for a in axis_names]
    if ROW in roles and COLUMN in roles and NONE in roles:
        raise ValueError(f"Adafactor: parameter {name} {tuple(axis_names)} mixes ROW, COLUMN and NONE axes "
                         f"({roles}); T5X refuses such a partial factoring")
    if ROW not in roles or COLUMN not in roles:
        roles = [NONE if r in (ROW, COLUMN) else r for r in roles]
    batch = tuple(i for i, r in enumerate(roles) if r == BATCH)
    averaging = tuple(i for i in range(len(shape)) if i not in batch)
    if len(shape) <= 2 and not batch:   # the classic rule: the two largest dims
        if len(shape) < 2:
            return _Factoring(averaging, None)
        small, large = np.argsort(shape, kind="stable")
        if shape[small] < min_dim_size_to_factor:
            return _Factoring(averaging, None)
        return _Factoring(averaging, ((int(small),), (int(large),)))
    rows = tuple(i for i, r in enumerate(roles) if r == ROW)
    cols = tuple(i for i, r in enumerate(roles) if r == COLUMN)
    return _Factoring(averaging, (rows, cols) if rows else None)


def adafactor(learning_rate: optax.ScalarOrSchedule, param_specs: Any, *, decay_rate: float = 0.8,
              step_offset: int = 0, clipping_threshold: float | None = 1.0, multiply_by_parameter_scale: bool = True,
              max_parameter_scale: float | None = None, epsilon1: float = 1e-30, epsilon2: float = 1e-3,
              factored: bool = True, min_dim_size_to_factor: int = 128, factor_rules: Mapping[str, str] | None = None,
              beta1: float | None = None, dtype_momentum: Any = jnp.float32, weight_decay_rate: float | None = None,
              weight_decay_rate_lr_exponent: float | None = None, global_norm_clip_threshold: float | None = None,
              skip_nan_updates: bool = False) -> optax.GradientTransformation:
    """T5X's Adafactor (`t5x.adafactor.Adafactor`, option for option) for params whose logical
    axis names are `param_specs` (a tree of PartitionSpec like the params, as
    `flax.linen.get_partition_spec` returns). `factor_rules` adds to or overrides
    `LOGICAL_FACTOR_RULES`; `factored=False` keeps full second moments and takes the parameter
    scale and update clip over whole arrays (as T5X, layers of a scanned stack together).

    Step t = count - step_offset + 1: g *= min(1, global_norm_clip_threshold / |g|);
    v = beta2_t * v + (1 - beta2_t) * (g**2 + epsilon1) with beta2_t = 1 - t**-decay_rate,
    factored v ~ v_row * v_col / mean(v_row); y = g / sqrt(v), clipped to RMS <= clipping_threshold;
    u = lr * min(max(RMS(param), epsilon2), max_parameter_scale) * y, the RMS and clip per BATCH
    slice; with beta1, u = m = beta1 * m + (1 - beta1) * u; param <- (1 - wd) * param - u with
    wd = weight_decay_rate * lr**weight_decay_rate_lr_exponent. `skip_nan_updates` keeps every
    parameter and statistic element that would become NaN at its old value (the count still
    advances).
    """
    if not isinstance(multiply_by_parameter_scale, bool):
        raise ConfigError(f"adafactor.multiply_by_parameter_scale={multiply_by_parameter_scale!r}: t5lite takes "
                          "True or False (T5X's per-parameter HParamMap is not supported)")
    rules = {**LOGICAL_FACTOR_RULES, **{k: _ROLE_ALIASES.get(v, v) for k, v in (factor_rules or {}).items()}}
    dtype_momentum = jnp.dtype(dtype_momentum)
    names = {jax.tree_util.keystr(path): tuple(spec)
             for path, spec in jax.tree_util.tree_leaves_with_path(param_specs, is_leaf=lambda x: isinstance(x, P))}

    def factoring(path, shape):
        if not factored:   # T5X's factored=False: no rule at all, so no BATCH dims either
            return _Factoring(tuple(range(len(shape))), None)
        key = jax.tree_util.keystr(path)
        if key not in names:
            raise ValueError(f"Adafactor: no logical axis names for parameter {key}; "
                             "were `param_specs` taken from the same model?")
        spec = names[key] + (None,) * (len(shape) - len(names[key]))
        return _factoring(shape, spec, rules, min_dim_size_to_factor, key)

    def init(params):
        def init_one(path, p):
            f = factoring(path, p.shape)
            zero = jnp.zeros((), jnp.float32)
            if f.factored is None:
                return zero, zero, jnp.zeros(p.shape, jnp.float32)
            rows, cols = f.factored
            return (jnp.zeros(_keep(p.shape, cols), jnp.float32), jnp.zeros(_keep(p.shape, rows), jnp.float32), zero)
        v_row, v_col, v = _unzip(jax.tree_util.tree_map_with_path(init_one, params), params, 3)
        count = jnp.zeros((), jnp.int32)
        if beta1 is None:
            return AdafactorState(count, v_row, v_col, v)
        return AdafactorMomentumState(count, v_row, v_col, v, jax.tree.map(lambda p: jnp.zeros(p.shape, dtype_momentum),
                                                                           params))

    def update(grads, state, params=None):
        if params is None:
            raise ValueError("t5lite's Adafactor needs `params` in update() (for the parameter scale)")
        if global_norm_clip_threshold:
            norm = optax.tree.norm(grads)
            clip = global_norm_clip_threshold * jnp.minimum(1.0 / global_norm_clip_threshold, 1.0 / norm)
            grads = jax.tree.map(lambda g: g * clip, grads)
        t = (state.count - step_offset + 1).astype(jnp.float32)
        beta2 = 1.0 - t ** -decay_rate
        lr = learning_rate(state.count) if callable(learning_rate) else learning_rate
        weight_decay = weight_decay_rate
        if weight_decay_rate_lr_exponent:
            weight_decay = (weight_decay_rate or 1.0) * lr ** weight_decay_rate_lr_exponent

        def update_one(path, g, v_row, v_col, v, m, p):
            f = factoring(path, g.shape)
            old = (v_row, v_col, v, m)
            g = g.astype(jnp.float32)
            g2 = g * g + epsilon1
            if f.factored is None:
                v = beta2 * v + (1.0 - beta2) * g2
                y = g * jax.lax.rsqrt(v)
            else:
                rows, cols = f.factored
                v_row = beta2 * v_row + (1.0 - beta2) * jnp.mean(g2, axis=cols, keepdims=True)
                v_col = beta2 * v_col + (1.0 - beta2) * jnp.mean(g2, axis=rows, keepdims=True)
                row_factor = jax.lax.rsqrt(v_row / jnp.mean(v_row, axis=rows, keepdims=True))
                y = g * row_factor * jax.lax.rsqrt(v_col)
            if clipping_threshold is not None:
                y = y / jnp.maximum(1.0, _rms(y, f.averaging_dims) / clipping_threshold)
            scale = lr
            if multiply_by_parameter_scale:
                param_scale = jnp.maximum(_rms(p.astype(jnp.float32), f.averaging_dims), epsilon2)
                if max_parameter_scale is not None:
                    param_scale = jnp.minimum(param_scale, max_parameter_scale)
                scale = scale * param_scale
            subtrahend = scale * y
            if beta1 is not None:
                subtrahend = beta1 * m.astype(jnp.float32) + (1.0 - beta1) * subtrahend
                m = subtrahend.astype(dtype_momentum)
            u = -subtrahend if weight_decay is None else -subtrahend - weight_decay * p.astype(jnp.float32)
            new = (v_row, v_col, v, m)
            if skip_nan_updates:
                new = tuple(jnp.where(jnp.isnan(n), o, n) for n, o in zip(new, old))
                u = jnp.where(jnp.isnan(p + u), 0.0, u)
            return (u.astype(p.dtype),) + new

        ms = grads if beta1 is None else state.m   # a placeholder tree when there is no momentum
        out = jax.tree_util.tree_map_with_path(update_one, grads, state.v_row, state.v_col, state.v, ms, params)
        updates, *stats, m = _unzip(out, grads, 5)
        if beta1 is None:
            return updates, AdafactorState(state.count + 1, *stats)
        return updates, AdafactorMomentumState(state.count + 1, *stats, m)

    return optax.GradientTransformation(init, update)


def _keep(shape, reduced) -> tuple[int, ...]:
    return tuple(1 if i in reduced else n for i, n in enumerate(shape))


def _rms(x, axes):
    return jnp.sqrt(jnp.mean(x * x, axis=axes, keepdims=True))


def _unzip(tree, like, n):
    """Splits a tree (structured like `like`) of n-tuples into n trees."""
    treedef = jax.tree.structure(like)
    leaves = treedef.flatten_up_to(tree)
    return tuple(treedef.unflatten([t[i] for t in leaves]) for i in range(n))
