"""Longformer's attention (Beltagy et al., 2020): each query sees the keys within `window / 2` slots
either side (every `dilation`-th slot), and a few global tokens see, and are seen by, every token.

Blockwise, so memory grows as n x window, not n^2: the sequence is cut into blocks of
B = dilation x window / 2 queries; a block's band lies inside its own block and its two neighbours
(3B keys), to which each block adds the row's global keys. Padding, packed segments, causality, the
band and T5's relative-position bias are folded once per stack into additive biases of that blocked
shape (`stack_biases`); each layer then runs one dense attention over the blocks (`banded_attention`)
and one over whole rows for the global queries, which Longformer projects with their own
query/key/value weights (`global_rows`, `with_global_rows`). A global token's key is read by the
other queries only through the global columns, never twice.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from t5lite.errors import DataError

NEG_INF = -1e10


class WindowBiases(NamedTuple):
    """One window's additive biases (0 where a query may attend, NEG_INF elsewhere, plus position biases)."""
    local: jax.Array         # [b, blocks, 1 or heads, B, 3B + G]: a block's queries to its 3 blocks, then the global keys
    from_global: jax.Array   # [b, 1 or heads, G, n]: each global query to every key
    global_index: jax.Array  # [b, G]: slots of each row's global tokens (n, out of range, where a row has fewer)


class Slots(NamedTuple):
    """What the masks need to know of each slot of a row, [b, n] each."""
    index: jax.Array
    mask: jax.Array       # not padding
    segment: jax.Array    # packed example (0 everywhere when unpacked)
    position: jax.Array   # the position encodings' position (restarts per packed example)
    prefix: jax.Array     # a prefix LM's bidirectional prompt


def make_slots(mask, segment_ids=None, positions=None, prefix=None) -> Slots:
    """A stack's rows as Slots: `mask` [b, n] (not padding) and optional packing, positions and prefix flags."""
    index = jnp.broadcast_to(jnp.arange(mask.shape[1]), mask.shape)
    zeros = jnp.zeros(mask.shape, jnp.int32)
    return Slots(index, mask.astype(bool), zeros if segment_ids is None else segment_ids,
                 index if positions is None else positions, zeros.astype(bool) if prefix is None else prefix.astype(bool))


def per_layer(value, num_layers: int) -> tuple[int, ...]:
    """A config's window or dilation (one int, or one per layer) as one per layer."""
    return tuple(value) if isinstance(value, (tuple, list)) else (value,) * num_layers


def block_size(window: int, dilation: int) -> int:
    return dilation * window // 2


def dense_attention(q, k, v, bias, impl: str = "einsum", dropout: Callable | None = None):
    """softmax(q.k + bias) v for q [r, q, h, d], k and v [r, k, h, d], bias [r, 1 or h, q, k]; q is
    already scaled. XLA's fused attention (`jax.nn.dot_product_attention`) unless `impl` is "einsum"
    or the weights take dropout."""
    if impl != "einsum" and dropout is None:
        return jax.nn.dot_product_attention(q, k, v, bias=bias.astype(q.dtype), scale=1.0,
                                            implementation="cudnn" if impl == "cudnn" else None)
    weights = jax.nn.softmax(jnp.einsum("rqhd,rkhd->rhqk", q, k).astype(jnp.float32) + bias, axis=-1)
    if dropout is not None:
        weights = dropout(weights)
    return jnp.einsum("rhqk,rkhd->rqhd", weights.astype(v.dtype), v)


# ----------------------------------------------------------------------------- biases, once per stack

def stack_biases(window, dilation, num_layers: int, slots: Slots, causal: bool, global_mask, max_global: int,
                 position_bias: Callable | None = None) -> tuple[WindowBiases, ...]:
    """Each layer's WindowBiases (layers with the same window and dilation share one).

    `global_mask` [b, n] (or None) marks global tokens; a row's first `max_global` of them are
    global, later ones attend as local tokens. `position_bias` maps key - query offsets
    [b, q, k] to a bias [b, heads, q, k] (T5's relative buckets)."""
    num_global = max_global if global_mask is not None else 0
    global_index, is_global = _global_slots(global_mask, num_global, slots.mask)
    built = {}
    for wd in zip(per_layer(window, num_layers), per_layer(dilation, num_layers)):
        if wd not in built:
            built[wd] = _window_biases(*wd, slots, causal, global_index, is_global, position_bias)
    return tuple(built[wd] for wd in zip(per_layer(window, num_layers), per_layer(dilation, num_layers)))


GLOBAL_MASK = "encoder_global_attention_mask"   # the feature marking an encoder input's global tokens


def check_global_tokens(batch, limit: int) -> None:
    """Refuses a host batch with a row marking more global tokens than the model attends to
    globally (`max_global_tokens`): the later ones would silently attend locally."""
    mask = batch.get(GLOBAL_MASK)
    most = 0 if mask is None else int(np.max(np.count_nonzero(np.asarray(mask), axis=1), initial=0))
    if most > limit:
        raise DataError(f"a row marks {most} global tokens (encoder_global_attention_mask), more than the model's "
                        f"max_global_tokens={limit}; raise it (--gin.model_config.overrides=\"{{'max_global_tokens': "
                        f"{most}}}\"), mark fewer (global_tokens.which='first'), or pack fewer examples a row "
                        "(--gin.train.pack=False)")


def _global_slots(global_mask, num_global: int, mask):
    """([b, G] slots of each row's first G global tokens, n where it has fewer; [b, n] which slots those are)."""
    b, n = mask.shape
    if not num_global:
        return jnp.zeros((b, 0), jnp.int32), jnp.zeros((b, n), bool)
    marked = global_mask.astype(bool)
    is_global = marked & (jnp.cumsum(marked, axis=1) <= num_global)
    index = jax.vmap(lambda m: jnp.nonzero(m, size=num_global, fill_value=n)[0])(is_global)
    return index.astype(jnp.int32), is_global


def _take(slots: Slots, index) -> Slots:
    """Each field at slots `index` [b, ...] (out-of-range slots read as padding)."""
    flat = index.reshape(index.shape[0], -1)
    inside = (flat >= 0) & (flat < slots.index.shape[1])
    read = lambda a: jnp.take_along_axis(a, jnp.clip(flat, 0, a.shape[1] - 1), axis=1).reshape(index.shape)
    fields = {name: read(value) for name, value in slots._asdict().items()}
    fields["index"] = index
    fields["mask"] = fields["mask"] & inside.reshape(index.shape)
    return Slots(**fields)


def _allowed(q: Slots, k: Slots, causal: bool):
    """Whether each query may attend each key: a key that is not padding, in the same packed
    example, and (causal stacks) not after the query unless both are in the prefix."""
    allowed = k.mask & (q.segment == k.segment)
    if causal:
        allowed &= (k.index <= q.index) | (q.prefix & k.prefix)
    return allowed


def _bias(allowed, q: Slots, k: Slots, position_bias):
    """[b, 1 or heads, *q, k] additive bias: the mask, plus position biases of the offsets."""
    bias = jnp.where(allowed, 0.0, NEG_INF).astype(jnp.float32)[:, None]
    if position_bias is None:
        return bias
    offsets = k.position - q.position
    b, *queries, keys = offsets.shape
    flat = position_bias(offsets.reshape(b, math.prod(queries), keys))
    return bias + flat.reshape((b, flat.shape[1], *queries, keys)).astype(jnp.float32)


def _window_biases(window: int, dilation: int, slots: Slots, causal: bool, global_index, is_global,
                   position_bias) -> WindowBiases:
    b, n = slots.index.shape
    size = block_size(window, dilation)
    blocks = -(-n // size)
    q_index = jnp.arange(blocks * size).reshape(blocks, size)
    k_index = (jnp.arange(blocks)[:, None] - 1) * size + jnp.arange(3 * size)        # [blocks, 3B]
    q = _take(slots, jnp.broadcast_to(q_index[:, :, None], (b, blocks, size, 1)))
    k = _take(slots, jnp.broadcast_to(k_index[:, None, :], (b, blocks, 1, 3 * size)))
    band = _in_band(k.index - q.index, window, dilation)
    k = k._replace(mask=k.mask & ~_take(slots._replace(mask=is_global), k.index).mask)
    local = _bias(band & _allowed(q, k, causal), q, k, position_bias)              # [b, 1|h, blocks, B, 3B]
    g = _take(slots, global_index[:, None, None, :])                                 # [b, 1, 1, G]
    to_global = _bias(_allowed(q, g, causal), q, g, position_bias)                  # [b, 1|h, blocks, B, G]
    heads = max(local.shape[1], to_global.shape[1])
    local = jnp.concatenate([jnp.broadcast_to(x, (b, heads) + x.shape[2:]) for x in (local, to_global)], -1)
    gq = _take(slots, global_index[:, :, None])                                      # [b, G, 1]
    everyone = _take(slots, jnp.broadcast_to(jnp.arange(n), (b, 1, n)))
    from_global = _bias(_allowed(gq, everyone, causal), gq, everyone, position_bias)
    return WindowBiases(local.transpose(0, 2, 1, 3, 4), from_global, global_index)


def band_bias(q_index, k_index, window: int, dilation: int):
    """[b, 1, q, k]: 0 inside the band, NEG_INF outside; for attention over a KV cache, whose few
    queries per step make a dense mask cheap."""
    band = _in_band(k_index[:, None, :] - q_index[:, :, None], window, dilation)
    return jnp.where(band, 0.0, NEG_INF)[:, None].astype(jnp.float32)


def _in_band(offset, window: int, dilation: int):
    """Whether a key `offset` slots from its query is in the window: at most window / 2 dilated steps away."""
    return (jnp.abs(offset) <= dilation * (window // 2)) & (offset % dilation == 0)


# ----------------------------------------------------------------------------- attention, per layer

def _key_windows(x, size: int):
    """x [b, blocks * B, ...] -> [b, blocks, 3B, ...]: each block's previous, own and next block."""
    b, length = x.shape[:2]
    padded = jnp.pad(x, [(0, 0), (size, size)] + [(0, 0)] * (x.ndim - 2))
    thirds = [padded[:, i * size:i * size + length].reshape((b, length // size, size) + x.shape[2:])
              for i in range(3)]
    return jnp.concatenate(thirds, axis=2)


def global_rows(x, global_index):
    """x [b, n, ...] at each row's global slots -> [b, G, ...] (rows past a row's count repeat its last slot)."""
    index = jnp.clip(global_index, 0, x.shape[1] - 1).reshape(global_index.shape + (1,) * (x.ndim - 2))
    return jnp.take_along_axis(x, index, axis=1)


def with_global_rows(x, rows, global_index):
    """x [b, n, ...] with each row's global slots replaced by `rows` [b, G, ...]."""
    return jax.vmap(lambda xi, ri, ii: xi.at[ii].set(ri.astype(xi.dtype), mode="drop"))(x, rows, global_index)


def banded_attention(q, k, v, biases: WindowBiases, attend: Callable = dense_attention):
    """Every query over its band and the global keys: q, k, v [b, n, h, d] -> [b, n, h, d].
    `attend(q, k, v, bias)` is a dense attention (`dense_attention`), run over blocks."""
    b, n, heads, dim = q.shape
    blocks, size = biases.local.shape[1], biases.local.shape[3]
    pad = lambda x: jnp.pad(x, [(0, 0), (0, blocks * size - n), (0, 0), (0, 0)])
    q, k, v = pad(q), pad(k), pad(v)

    def keys(x):
        own = _key_windows(x, size)
        shared = global_rows(x, biases.global_index)[:, None]
        shared = jnp.broadcast_to(shared, (b, blocks) + shared.shape[2:])
        return jnp.concatenate([own, shared], axis=2).reshape((b * blocks, -1, heads, dim))

    bias = biases.local.reshape((b * blocks,) + biases.local.shape[2:])
    out = attend(q.reshape(b * blocks, size, heads, dim), keys(k), keys(v), bias)
    return out.reshape(b, blocks * size, heads, dim)[:, :n]
