"""Pruning: magnitude masks (open_lth's rule, global or per layer, one round or several), masks
kept through training, lottery-ticket rewinding, and attention-head importance and pruning
(Michel et al. 2019, "Are Sixteen Heads Really Better than One?").

A round removes `fraction` of the weights that remain (open_lth `sparse_global`): with n
remaining, k = ceil(fraction * n), threshold = sort(|w|)[k], keep |w| > threshold (so ties at
the threshold go too). The first round starts from a mask of all ones (open_lth's
`Mask.ones_like`), so a weight that is exactly zero counts among the n and is pruned by magnitude
like any other. Only dense kernels are pruned (open_lth prunes layer weights, not biases, norms
or embeddings). A pruned weight is an exact zero in the checkpoint, so a pruned run is a plain
run every command loads, and its mask is its non-zero pattern: iterative pruning is one
`t5lite train` per round, each from the last (`train.initial_checkpoint_path`), with
`train.pruning = @MagnitudePruning()`, and a round started from a pruned run (one that wrote
`sparsity.json`) continues from that run's mask, as open_lth's next level loads the last one's;
`rewind_checkpoint` (an early step of the dense run) gives the kept weights their values of that
step (Frankle et al.'s rewinding). A task head (`WithHead`'s "head") is never pruned.

`train.pruning = @HeadPruning()` removes whole attention heads instead, the least important by
Michel et al.'s score over all layers, with the same masks kept through training.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np
from flax.traverse_util import flatten_dict, unflatten_dict

from t5lite import finite
from t5lite.errors import ConfigError
from t5lite.models.layers import HEAD_GATES
from t5lite.run_layout import RunDir

SCOPES = ("global", "layer")


def prunable(path: tuple[str, ...]) -> bool:
    """Dense kernels are pruned; embeddings, biases, norms and position tables are not, nor a
    task head (`WithHead`'s "head": a few weights per label, as pruned BERTs keep their
    classifier dense, and as quantisation keeps it float)."""
    return path[-1] == "kernel" and path[0] != "head"


def nonzero_masks(params) -> dict:
    """The mask of a pruned run's params: True where a prunable weight is non-zero, a scalar
    True for every other leaf (so masks have the params' structure)."""
    return unflatten_dict({p: (np.asarray(w) != 0) if prunable(p) else np.array(True)
                           for p, w in flatten_dict(jax.device_get(params)).items()})


def ones_masks(params) -> dict:
    """Nothing pruned yet: `nonzero_masks`' structure, all True (open_lth's `Mask.ones_like`)."""
    return unflatten_dict({p: np.ones(np.shape(w), bool) if prunable(p) else np.array(True)
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


def magnitude_masks(params, fraction: float = 0.2, rounds: int = 1, scope: str = "global",
                    current_mask: dict | None = None) -> dict:
    """Masks after `rounds` open_lth rounds on `params`, starting from `current_mask` (None: all
    ones, as open_lth's `sparse_global.prune`); `scope` 'global' ranks all prunable weights
    together, 'layer' each kernel alone."""
    if scope not in SCOPES:
        raise ConfigError(f"pruning scope {scope!r}: expected one of {SCOPES}")
    if not 0 < fraction < 1 or rounds < 1:
        raise ConfigError(f"pruning fraction={fraction}, rounds={rounds}: expected 0 < fraction < 1 and rounds >= 1")
    flat = flatten_dict(jax.device_get(params))
    masks = flatten_dict(ones_masks(params) if current_mask is None else jax.device_get(current_mask))
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
    with RunDir(model_dir).sparsity.open("w", encoding="utf-8") as f:
        finite.dump(finite.null_non_finite(report), f, indent=1)


def write_head_pruning(model_dir: str, record: list[dict]) -> None:
    """`HeadPruning`'s rounds: each one's head importance and the heads pruned after it."""
    with RunDir(model_dir).head_pruning.open("w", encoding="utf-8") as f:
        finite.dump(finite.null_non_finite({"rounds": record}), f, indent=1)   # a diverged score: null


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

    def masks(self, params, scoring=None, current_mask: dict | None = None) -> dict:
        """The masks of `params` from `current_mask` (None: all ones; `scoring`, which head
        pruning scores heads with, is unused)."""
        return magnitude_masks(params, self.fraction, self.rounds, self.scope, current_mask)


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


GRANULARITIES = ("token", "batch")


def head_importance(loss_fn: Callable[[dict, Any], jax.Array], params, batches: Iterable,
                    granularity: str = "token") -> dict:
    """Michel et al.'s importance of each head, summed over `batches`: |d loss / d xi|, xi a gate
    on the head's output; `loss_fn(variables, batch)` applies the model to `variables`
    ({"params": ..., HEAD_GATES: ...}). `granularity` 'token' (the default) takes |.| per example
    and token, as Michel et al.'s code does (pmichel31415/pytorch-pretrained-BERT, branch paul,
    examples/classifier_eval.py, calculate_head_importance: |ctx . d loss / d ctx| per example,
    head and token, summed), so examples pulling a head opposite ways add up; 'batch' takes |.|
    of each batch's gradient, as Hugging Face's run_bertology.py does with its head_mask.
    Michel et al. then divide by the number of tokens (for BERT's last layer, of examples): a
    constant per layer, which `normalized_by_layer` cancels, so it is left out here.
    Returns {attention path: [heads]}."""
    if granularity not in GRANULARITIES:
        raise ConfigError(f"head importance granularity {granularity!r}: expected one of {GRANULARITIES}")
    paths = attention_paths(params)
    if any(np.ndim(_at(params, p + ("out", "kernel"))) != 3 for p in paths):
        raise ConfigError("head pruning needs the layers unstacked: set model_config.scan_layers = False")
    per_head = head_gates(params)
    grad = jax.jit(jax.grad(lambda g, p, batch: loss_fn({"params": p, HEAD_GATES: g}, batch)))
    total = {p: np.zeros(np.shape(v)) for p, v in flatten_dict(per_head).items()}
    for batch in batches:
        gates = per_head if granularity == "batch" else _token_gates(loss_fn, params, per_head, batch)
        for path, g in flatten_dict(jax.device_get(grad(gates, params, batch))).items():
            total[path] += np.abs(np.asarray(g, np.float64)).reshape(-1, g.shape[-1]).sum(0)
    return {p[:-1]: v for p, v in total.items()}


def _token_gates(loss_fn, params, per_head, batch) -> dict:
    """Ones of each attention module's output shape [rows, length, heads] on `batch` (read off a
    shape-only pass), so the gradient is one per example, token and head."""
    shapes = {}

    def record(call, args, kwargs, context):
        module = context.module
        if module.name == "out" and isinstance(module.parent, nn.Module) and \
                module.parent.has_variable(HEAD_GATES, "heads"):
            shapes[tuple(module.parent.path) + ("heads",)] = args[0].shape[:-1]
        return call(*args, **kwargs)
    with nn.intercept_methods(record):
        jax.eval_shape(lambda g, p, b: loss_fn({"params": p, HEAD_GATES: g}, b), per_head, params, batch)
    return unflatten_dict({p: jnp.ones(shapes[p], jnp.float32) for p in flatten_dict(per_head)})


class WithVariables:
    """`module` applied with `variables` (the head gates) beside its params and without dropout,
    as Michel et al. score heads with the model in eval mode. Other attributes are the module's."""

    def __init__(self, module, variables: dict):
        self.module, self.variables = module, variables

    def __getattr__(self, name):
        return getattr(self.module, name)

    def apply(self, variables, *args, **kwargs):
        if kwargs.get("enable_dropout"):
            kwargs = {**kwargs, "enable_dropout": False,
                      "rngs": {k: v for k, v in (kwargs.get("rngs") or {}).items() if k != "dropout"}}
        return self.module.apply({**variables, **self.variables}, *args, **kwargs)


def _at(tree, path):
    for key in path:
        tree = tree[key]
    return tree


def normalized_by_layer(importance: dict) -> dict:
    """Each attention module's scores divided by their l2 norm (Michel et al.'s code and
    Hugging Face's run_bertology.py do this before ranking heads across layers)."""
    return {p: v / (np.linalg.norm(v) + 1e-20) for p, v in importance.items()}


def pruned_heads(params) -> dict:
    """Heads already pruned (all their output weights zero): {attention path: [head indices]}."""
    heads = {}
    for p in attention_paths(params):
        out = np.asarray(_at(params, p + ("out", "kernel")))
        zero = ~out.reshape(out.shape[0], -1).any(axis=1)
        if zero.any():
            heads[p] = np.flatnonzero(zero).tolist()
    return heads


def least_important_heads(importance: dict, count: int, skip: dict | None = None) -> dict:
    """The `count` heads of lowest importance over all layers, `skip` ({path: [heads]}, pruned
    already) left out: {attention path: [head indices]}."""
    skip = skip or {}
    ranked = sorted((float(v), p, h) for p, values in importance.items() for h, v in enumerate(values)
                    if h not in skip.get(p, ()))
    chosen: dict = {}
    for _, path, head in ranked[:count]:
        chosen.setdefault(path, []).append(head)
    return chosen


def head_masks(params, heads: dict, current_mask: dict | None = None) -> dict:
    """`current_mask` (None: all ones) with the query, key, value (kernels and biases) and output
    weights of `heads` ({attention path: [indices]}) masked: `prune_heads`' zeros, kept through
    training."""
    flat = flatten_dict(ones_masks(params) if current_mask is None else jax.device_get(current_mask))
    shapes = {p: np.shape(w) for p, w in flatten_dict(params).items()}
    for path, indices in heads.items():
        idx = np.asarray(indices)
        for name in ("query", "key", "value", "out"):
            for leaf in ("kernel", "bias"):
                key = path + (name, leaf)
                if key not in flat or (name == "out" and leaf == "bias"):
                    continue
                mask = np.broadcast_to(flat[key], shapes[key]).copy()
                if name == "out":
                    mask[idx] = False
                else:
                    mask[..., idx, :] = False
                flat[key] = mask
    return unflatten_dict(flat)


@gin.configurable
class HeadPruning:
    """`train.pruning = @HeadPruning()`: Michel et al.'s structured pruning at the start of a run.
    Each of `rounds` rounds scores every attention head on `batches` batches of the run's training
    data (`head_importance` with the run's loss, without dropout; |.| per example and token unless
    `granularity` is 'batch'; scores normalised per layer unless `normalize_by_layer` is False),
    removes the int(`fraction` x remaining) least important heads over all layers (at
    least one), and the next round scores the pruned model. Pruned heads' query, key, value and
    output weights are zeros, masked after every update, so their outputs stay zero; a resumed
    run keeps its own pattern. `MODEL_DIR/head_pruning.json` records each round's scores and heads."""

    rewind_checkpoint = None

    def __init__(self, fraction: float = 0.1, rounds: int = 1, batches: int = 8, normalize_by_layer: bool = True,
                 granularity: str = "token"):
        if not 0 < fraction < 1 or rounds < 1 or batches < 1 or granularity not in GRANULARITIES:
            raise ConfigError(f"HeadPruning(fraction={fraction}, rounds={rounds}, batches={batches}, "
                              f"granularity={granularity!r}): expected 0 < fraction < 1, rounds >= 1, batches >= 1 "
                              f"and granularity one of {GRANULARITIES}")
        self.fraction, self.rounds, self.batches, self.normalize_by_layer = fraction, rounds, batches, normalize_by_layer
        self.granularity = granularity
        self.record: list[dict] = []

    def __repr__(self):
        return (f"HeadPruning(fraction={self.fraction}, rounds={self.rounds}, batches={self.batches}, "
                f"normalize_by_layer={self.normalize_by_layer}, granularity={self.granularity!r})")

    def masks(self, params, scoring: tuple[Callable[[dict, Any], jax.Array], list] | None = None,
              current_mask: dict | None = None) -> dict:
        """Masks after the rounds, from `current_mask` (None: all ones); `scoring` is
        (loss_fn, batches) as `head_importance` takes them."""
        if scoring is None:
            raise ConfigError("HeadPruning scores heads on the training data: use it as train.pruning")
        loss_fn, batches = scoring
        masks, self.record = current_mask, []
        for _ in range(self.rounds):
            current = params if masks is None else apply_masks(params, masks)
            importance = head_importance(loss_fn, current, batches, self.granularity)
            ranked = normalized_by_layer(importance) if self.normalize_by_layer else importance
            done = pruned_heads(current)
            remaining = sum(len(v) for v in importance.values()) - sum(len(v) for v in done.values())
            heads = least_important_heads(ranked, max(1, int(self.fraction * remaining)), skip=done)
            for path, indices in done.items():
                heads.setdefault(path, []).extend(indices)
            masks = head_masks(params, heads, current_mask)
            self.record.append({"importance": {"/".join(p): v.tolist() for p, v in importance.items()},
                                "pruned": {"/".join(p): sorted(v) for p, v in heads.items()}})
        return masks


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
