"""Building blocks: embeddings, attention, MLP, norms and position biases.

Every parameter is created with logical axis names (`embed`, `mlp`, `heads`, `kv`, `vocab`,
`relpos_buckets`) so that `t5lite.train.partitioning` can map it onto a device mesh by rules.
Parameters are float32; computation runs in `config.dtype`.
"""
from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from t5lite.models.config import ModelConfig

NEG_INF = -1e10
_ACTIVATIONS = {"relu": nn.relu, "gelu": nn.gelu, "gelu_exact": lambda x: nn.gelu(x, approximate=False),
                "silu": nn.silu, "linear": lambda x: x}


def dtype_of(config: ModelConfig):
    return jnp.dtype(config.dtype)


def param_with_axes(module: nn.Module, name: str, init, shape, axes):
    """A float32 parameter annotated with logical axis names."""
    return module.param(name, nn.with_logical_partitioning(init, axes), shape, jnp.float32)


def normal(stddev: float):
    return nn.initializers.normal(stddev=stddev)


class RMSNorm(nn.Module):
    """T5's LayerNorm: scale only, no mean subtraction, no bias; computed in float32."""
    epsilon: float = 1e-6
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        scale = param_with_axes(self, "scale", nn.initializers.ones, (x.shape[-1],), ("embed",))
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.epsilon)
        return (y * scale).astype(self.dtype)


class Embed(nn.Module):
    """Token embedding; `attend` reuses the table as the output projection (tied logits)."""
    num_embeddings: int
    features: int
    dtype: jnp.dtype = jnp.float32

    def setup(self):
        self.embedding = param_with_axes(self, "embedding", normal(1.0), (self.num_embeddings, self.features),
                                         ("vocab", "embed"))

    def __call__(self, ids):
        return jnp.take(self.embedding, ids, axis=0).astype(self.dtype)

    def attend(self, x):
        return jnp.einsum("...d,vd->...v", x, self.embedding.astype(self.dtype))


def relative_position_bucket(relative_position, bidirectional: bool, num_buckets: int, max_distance: int):
    """T5's bucketing: exact buckets for small offsets, logarithmic ones up to `max_distance`."""
    ret = 0
    n = -relative_position
    if bidirectional:
        num_buckets //= 2
        ret += (n < 0).astype(jnp.int32) * num_buckets
        n = jnp.abs(n)
    else:
        n = jnp.maximum(n, 0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    val_if_large = max_exact + (
        jnp.log(jnp.maximum(n, 1).astype(jnp.float32) / max_exact) / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)).astype(jnp.int32)
    val_if_large = jnp.minimum(val_if_large, num_buckets - 1)
    return ret + jnp.where(is_small, n, val_if_large)


class RelativePositionBias(nn.Module):
    """Learned scalar bias per (bucket, head), shared by all layers of a stack (as in T5)."""
    num_buckets: int
    max_distance: int
    num_heads: int
    bidirectional: bool

    @nn.compact
    def __call__(self, q_positions, k_positions):
        """Positions [batch, q] and [batch, k] -> bias [batch, heads, q, k]."""
        table = param_with_axes(self, "rel_embedding", normal(1.0), (self.num_buckets, self.num_heads),
                                ("relpos_buckets", "heads"))
        rel = k_positions[:, None, :] - q_positions[:, :, None]
        buckets = relative_position_bucket(rel, self.bidirectional, self.num_buckets, self.max_distance)
        return jnp.transpose(jnp.take(table, buckets, axis=0), (0, 3, 1, 2))


class MultiHeadAttention(nn.Module):
    """Attention with T5's conventions: no biases, no 1/sqrt(d) scaling (folded into the q init)."""
    config: ModelConfig
    deterministic: bool = True

    @nn.compact
    def __call__(self, inputs_q, inputs_kv, bias):
        """`bias` [batch or 1, heads or 1, q, k] holds the mask (NEG_INF) plus any position bias."""
        cfg = self.config
        dtype = dtype_of(cfg)
        d, h, hd = cfg.d_model, cfg.num_heads, cfg.head_dim

        def proj(name, x, stddev):
            kernel = param_with_axes(self, name, normal(stddev), (d, h, hd), ("embed", "heads", "kv"))
            return jnp.einsum("bld,dhk->blhk", x, kernel.astype(dtype))

        q = proj("query", inputs_q, (d * hd) ** -0.5)
        k = proj("key", inputs_kv, d ** -0.5)
        v = proj("value", inputs_kv, d ** -0.5)
        q = nn.with_logical_constraint(q, ("batch", "length", "heads", "kv"))
        logits = jnp.einsum("bqhk,bthk->bhqt", q, k).astype(jnp.float32) + bias
        weights = jax.nn.softmax(logits, axis=-1).astype(dtype)
        weights = nn.Dropout(cfg.dropout_rate)(weights, deterministic=self.deterministic)
        out = jnp.einsum("bhqt,bthk->bqhk", weights, v)
        out_kernel = param_with_axes(self, "out", normal((h * hd) ** -0.5), (h, hd, d), ("heads", "kv", "embed"))
        out = jnp.einsum("bqhk,hkd->bqd", out, out_kernel.astype(dtype))
        return nn.with_logical_constraint(out, ("batch", "length", "embed"))


class MlpBlock(nn.Module):
    """Position-wise MLP; several activations mean a gated unit (their product), as in T5 v1.1."""
    config: ModelConfig
    deterministic: bool = True

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        dtype = dtype_of(cfg)
        hidden = None
        for i, act in enumerate(cfg.mlp_activations):
            name = "wi" if len(cfg.mlp_activations) == 1 else f"wi_{i}"
            kernel = param_with_axes(self, name, normal(cfg.d_model ** -0.5), (cfg.d_model, cfg.d_ff),
                                     ("embed", "mlp"))
            h = _ACTIVATIONS[act](jnp.einsum("bld,df->blf", x, kernel.astype(dtype)))
            hidden = h if hidden is None else hidden * h
        hidden = nn.with_logical_constraint(hidden, ("batch", "length", "mlp"))
        hidden = nn.Dropout(cfg.dropout_rate)(hidden, deterministic=self.deterministic)
        wo = param_with_axes(self, "wo", normal(cfg.d_ff ** -0.5), (cfg.d_ff, cfg.d_model), ("mlp", "embed"))
        return jnp.einsum("blf,fd->bld", hidden, wo.astype(dtype))


def attention_bias(q_mask, k_mask, causal: bool = False, q_segments=None, k_segments=None):
    """Additive mask [batch, 1, q, k]: 0 where a query may attend, NEG_INF elsewhere.

    Padding (mask 0) never attends or is attended; with segment ids, attention stays inside
    a packed example; `causal` forbids looking ahead.
    """
    allowed = q_mask[:, :, None].astype(bool) & k_mask[:, None, :].astype(bool)
    if q_segments is not None and k_segments is not None:
        allowed &= q_segments[:, :, None] == k_segments[:, None, :]
    if causal:
        q_len, k_len = q_mask.shape[1], k_mask.shape[1]
        allowed &= jnp.tril(jnp.ones((q_len, k_len), bool))[None]
    return jnp.where(allowed, 0.0, NEG_INF)[:, None, :, :].astype(jnp.float32)
