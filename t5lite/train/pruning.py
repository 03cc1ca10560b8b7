"""Pruning: magnitude masks (open_lth's rule, global or per layer, one round or several), masks
kept through training, lottery-ticket rewinding, and attention-head importance and pruning
(Michel et al. 2019, "Are Sixteen Heads Really Better than One?").

A round removes `fraction` of the weights that remain (open_lth `sparse_global`): with n
remaining, k = ceil(fraction * n), threshold = sort(|w|)[k], keep |w| > threshold (so ties at
the threshold go too). Only dense kernels are pruned (open_lth prunes layer weights, not biases,
norms or embeddings). A pruned weight is an exact zero in the checkpoint, so a pruned run is a
plain run every command loads, and its mask is its non-zero pattern: iterative pruning is one
`t5lite train` per round, each from the last (`train.initial_checkpoint_path`), with
`train.pruning = @MagnitudePruning()`; `rewind_checkpoint` (an early step of the dense run)
gives the kept weights their values of that step (Frankle et al.'s rewinding).
"""
from __future__ import annotations

import json
import math
import os
from typing import Any, Callable, Iterable

import gin
import jax
import jax.numpy as jnp
import numpy as np
from flax.traverse_util import flatten_dict, unflatten_dict

from t5lite.errors import ConfigError
from t5lite.models.layers import HEAD_GATES

SCOPES = ("global", "layer")
SPARSITY_FILE = "sparsity.json"


def prunable(path: tuple[str, ...]) -> bool:
    """Dense kernels are pruned; embeddings, biases, norms and position tables are not, nor a
    task head (`WithHead`'s "head": a few weights per label, as pruned BERTs keep their
    classifier dense, and as quantisation keeps it float)."""
    return path[-1] == "kernel" and path[0] != "head"


def nonzero_masks(params) -> dict:
    """The mask of a (pruned) params tree: True where a prunable weight is non-zero, a scalar
    True for every other leaf (so masks have the params' structure)."""
    return unflatten_dict({p: (np.asarray(w) != 0) if prunable(p) else np.array(True)
                           for p, w in flatten_dict(jax.device_get(params)).items()})


def _prune_round(weights: dict, masks: dict, fraction: float) -> dict:
    """One open_lth round over the arrays of `weights` together (their kept entries)."""
    kept = np.concatenate([np.abs(w[masks[p]]) for p, w in weights.items()])
    if kept.size == 0:
        return masks
    k = math.ceil(fraction * kept.size)
    if k >= kept.size:
        return {p: np.zeros_like(m) for p, m in masks.items()}
    threshold = np.sort(kept)[k]
    return {p: masks[p] & (np.abs(w) > threshold) for p, w in weights.items()}


def magnitude_masks(params, fraction: float = 0.2, rounds: int = 1, scope: str = "global") -> dict:
    """Masks after `rounds` open_lth rounds on `params`, starting from its non-zero pattern;
    `scope` 'global' ranks all prunable weights together, 'layer' each kernel alone."""
    if scope not in SCOPES:
        raise ConfigError(f"pruning scope {scope!r}: expected one of {SCOPES}")
    if not 0 < fraction < 1 or rounds < 1:
        raise ConfigError(f"pruning fraction={fraction}, rounds={rounds}: expected 0 < fraction < 1 and rounds >= 1")
    flat = flatten_dict(jax.device_get(params))
    masks = flatten_dict(nonzero_masks(params))
    weights = {p: np.asarray(w) for p, w in flat.items() if prunable(p)}
    if not weights:
        raise ConfigError("the model has no dense kernels to prune")
    groups = [weights] if scope == "global" else [{p: w} for p, w in weights.items()]
    for _ in range(rounds):
        for group in groups:
            masks.update(_prune_round(group, {p: masks[p] for p in group}, fraction))
    return unflatten_dict(masks)


def apply_masks(params, masks):
    """Pruned weights set to exact zeros (masks: `nonzero_masks`' structure)."""
    return jax.tree.map(lambda w, m: jnp.where(m, w, jnp.zeros_like(w)), params, masks)


def sparsity(params) -> dict:
    """{"total": zero fraction of all prunable weights, "layers": {"a/b/kernel": zero fraction}}."""
    layers, zeros, size = {}, 0, 0
    for path, w in flatten_dict(jax.device_get(params)).items():
        if prunable(path):
            w = np.asarray(w)
            layers["/".join(path)] = float(np.mean(w == 0))
            zeros, size = zeros + int(np.sum(w == 0)), size + w.size
    return {"total": zeros / max(size, 1), "layers": layers}


def write_sparsity(model_dir: str, report: dict) -> None:
    with open(os.path.join(model_dir, SPARSITY_FILE), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)


@gin.configurable
class MagnitudePruning:
    """`train.pruning = @MagnitudePruning()`: at the start of a run, prune `rounds` rounds of
    `fraction` of the remaining weights of the initial params (`scope` 'global' or 'layer'),
    optionally rewind the kept ones to `rewind_checkpoint`, and keep the pruned weights at zero
    after every update. A resumed run keeps its own non-zero pattern."""

    def __init__(self, fraction: float = 0.2, rounds: int = 1, scope: str = "global",
                 rewind_checkpoint: str | None = None):
        self.fraction, self.rounds, self.scope, self.rewind_checkpoint = fraction, rounds, scope, rewind_checkpoint

    def __repr__(self):
        return (f"MagnitudePruning(fraction={self.fraction}, rounds={self.rounds}, scope={self.scope!r}, "
                f"rewind_checkpoint={self.rewind_checkpoint!r})")

    def masks(self, params) -> dict:
        return magnitude_masks(params, self.fraction, self.rounds, self.scope)


# ----------------------------------------------------------------------------- heads

def attention_paths(params) -> list[tuple[str, ...]]:
    """Paths of the attention modules (those with query, key, value and out kernels)."""
    flat = flatten_dict(params)
    paths = {p[:-2] for p in flat if p[-2:] == ("query", "kernel")}
    return sorted(p for p in paths if all(p + (n, "kernel") in flat for n in ("key", "value", "out")))


def head_gates(params) -> dict:
    """Ones for every head of every attention module: the `HEAD_GATES` collection."""
    flat = flatten_dict(params)
    return unflatten_dict({p + ("heads",): jnp.ones(flat[p + ("query", "kernel")].shape[-2], jnp.float32)
                           for p in attention_paths(params)})


def head_importance(loss_fn: Callable[[dict, Any], jax.Array], params, batches: Iterable) -> dict:
    """Michel et al.'s importance of each head: sum over `batches` of |d loss / d gate_h|, the
    gate a mask on the head's output; `loss_fn(variables, batch)` applies the model to
    `variables` ({"params": ..., HEAD_GATES: ...}). Returns {attention path: [heads]}."""
    gates = head_gates(params)
    grad = jax.jit(jax.grad(lambda g, batch: loss_fn({"params": params, HEAD_GATES: g}, batch)))
    total = jax.tree.map(jnp.zeros_like, gates)
    for batch in batches:
        total = jax.tree.map(lambda t, g: t + jnp.abs(g), total, grad(gates, batch))
    return {p[:-1]: np.asarray(v) for p, v in flatten_dict(total).items()}


def least_important_heads(importance: dict, count: int) -> dict:
    """The `count` heads of lowest importance over all layers: {attention path: [head indices]}."""
    ranked = sorted((float(v), p, h) for p, values in importance.items() for h, v in enumerate(values))
    chosen: dict = {}
    for _, path, head in ranked[:count]:
        chosen.setdefault(path, []).append(head)
    return chosen


def prune_heads(params, heads: dict) -> dict:
    """Zeroes the query, key, value and output weights of `heads` ({attention path: [indices]}):
    the model then computes what it computes with those heads' gates at 0."""
    flat = {p: jnp.asarray(w) for p, w in flatten_dict(params).items()}
    for path, indices in heads.items():
        idx = np.asarray(indices)
        for name in ("query", "key", "value"):
            for leaf in ("kernel", "bias"):
                if path + (name, leaf) in flat:
                    flat[path + (name, leaf)] = flat[path + (name, leaf)].at[..., idx, :].set(0)
        flat[path + ("out", "kernel")] = flat[path + ("out", "kernel")].at[idx].set(0)
    return unflatten_dict(flat)
