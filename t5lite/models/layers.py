"""Building blocks: dense layers, norms, embeddings, position encodings, masks, attention (with a KV
cache) and the MLP.

Every parameter is created with logical axis names (`embed`, `mlp`, `heads`, `kv`, `vocab`,
`relpos_buckets`, `abspos_buckets`, `token_types`, `factorized_embed`) so that
`t5lite.train.partitioning` can map it onto a device mesh by rules. Parameters are float32;
computation runs in `config.dtype`.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from t5lite.models import windowed_attention as W
from t5lite.models.config import ModelConfig

NEG_INF = -1e10
# A variable collection: given `{HEAD_GATES: {<attention path>: {"heads": [heads]}}}` (or one gate
# per example and token, [rows, length, heads]), attention multiplies each head's output by its gate
# (t5lite.train.pruning.head_importance).
HEAD_GATES = "head_gates"
ACTIVATIONS = {"relu": nn.relu, "gelu": nn.gelu, "gelu_exact": lambda x: nn.gelu(x, approximate=False),
               "silu": nn.silu, "tanh": jnp.tanh, "linear": lambda x: x}


def dtype_of(config: ModelConfig):
    return jnp.dtype(config.dtype)


def param_with_axes(module: nn.Module, name: str, init, shape, axes):
    """A float32 parameter annotated with logical axis names."""
    return module.param(name, nn.with_logical_partitioning(init, axes), shape, jnp.float32)


def normal(stddev: float, truncated: bool = False):
    """N(0, stddev); `truncated`: flax's variance_scaling "truncated_normal" of that stddev (cut at
    2 sigma of the untruncated normal, which is widened so that the cut one has `stddev`)."""
    if truncated:
        return nn.initializers.truncated_normal(stddev / .87962566103423978)
    return nn.initializers.normal(stddev=stddev)


def quantized(config: ModelConfig) -> bool:
    """Whether the model's dense kernels and embedding tables are int8 (t5lite.models.quantization)."""
    return config.weight_quantization == "int8"


def int8_param(module: nn.Module, name: str, shape, axes, scale_shape):
    """An int8 weight and its float32 `<name>_scale` (per kept axis; reduced axes have size 1
    and no logical name): a weight-only quantised layer's parameters."""
    q = module.param(name, nn.with_logical_partitioning(nn.initializers.zeros, axes), shape, jnp.int8)
    scale_axes = tuple(a if n != 1 else None for a, n in zip(axes, scale_shape))
    return q, param_with_axes(module, name + "_scale", nn.initializers.ones, scale_shape, scale_axes)


def init_std(config: ModelConfig, fan_in_std: float) -> float:
    """The config's fixed init stddev (BERT-style 0.02) or else T5's fan-in scaled one."""
    return config.init_std if config.init_std is not None else fan_in_std


def residual_init_std(config: ModelConfig, fan_in_std: float) -> float:
    """`init_std` of a kernel writing into the residual stream, / sqrt(2 x layers) under
    `scale_residual_init` (GPT-2)."""
    std = init_std(config, fan_in_std)
    layers = config.num_encoder_layers + config.num_decoder_layers
    return std / (2 * layers) ** 0.5 if config.scale_residual_init else std


def truncated_init(config: ModelConfig) -> bool:
    """Whether fan-in scaled MLP and output kernels are truncated normals (T5X's DenseGeneral
    default, `variance_scaling(1.0, 'fan_in', 'truncated_normal')`); Hugging Face's are not."""
    return config.init_std is None


class Dense(nn.Module):
    """`x[..., *in] @ kernel[*in, *features] (+ bias[*features])` over the last `in_ndim` axes of x.

    `axes` names every kernel dimension, inputs first (e.g. ("embed", "heads", "kv") for a query).
    `quantized`: an int8 kernel with one scale per output feature, `(x @ q) * scale`.
    """
    features: tuple[int, ...]
    axes: tuple[str, ...]
    in_ndim: int = 1
    use_bias: bool = False
    stddev: float = 0.02
    dtype: jnp.dtype = jnp.float32
    quantized: bool = False
    truncated: bool = False

    @nn.compact
    def __call__(self, x):
        in_shape = x.shape[x.ndim - self.in_ndim:]
        shape = (*in_shape, *self.features)
        if self.quantized:
            kernel, scale = int8_param(self, "kernel", shape, self.axes, (1,) * self.in_ndim + tuple(self.features))
            y = jnp.tensordot(x.astype(self.dtype), kernel.astype(self.dtype), axes=self.in_ndim)
            y = y * scale.reshape(self.features).astype(self.dtype)
        else:
            kernel = param_with_axes(self, "kernel", normal(self.stddev, self.truncated), shape, self.axes)
            y = jnp.tensordot(x.astype(self.dtype), kernel.astype(self.dtype), axes=self.in_ndim)
        if self.use_bias:
            bias = param_with_axes(self, "bias", nn.initializers.zeros, self.features,
                                   self.axes[len(self.axes) - len(self.features):])
            y = y + bias.astype(self.dtype)
        return y


class Norm(nn.Module):
    """RMSNorm (T5: scale only) or LayerNorm (mean, scale and bias); computed in float32."""
    kind: str = "rms"
    epsilon: float = 1e-6
    dtype: jnp.dtype = jnp.float32
    axis_name: str = "embed"

    @nn.compact
    def __call__(self, x):
        features = (x.shape[-1],)
        x = x.astype(jnp.float32)
        if self.kind == "layer":
            x = x - jnp.mean(x, axis=-1, keepdims=True)
        y = x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + self.epsilon)
        y = y * param_with_axes(self, "scale", nn.initializers.ones, features, (self.axis_name,))
        if self.kind == "layer":
            y = y + param_with_axes(self, "bias", nn.initializers.zeros, features, (self.axis_name,))
        return y.astype(self.dtype)


def make_norm(config: ModelConfig, name: str, axis_name: str = "embed") -> Norm:
    return Norm(config.norm, config.layer_norm_epsilon, dtype_of(config), axis_name, name=name)


def _with_zero_row(init, row: int | None):
    """`init` with `row` of the table set to zero (none when `row` is None)."""
    if row is None:
        return init
    return lambda key, shape, dtype=jnp.float32: init(key, shape, dtype).at[row].set(0)


class Embed(nn.Module):
    """An embedding table; `attend` reuses it as an output projection (tied logits).

    `quantized`: an int8 table with one scale per row (per output channel of `attend`)."""
    num_embeddings: int
    features: int
    dtype: jnp.dtype = jnp.float32
    stddev: float = 1.0
    axes: tuple[str, str] = ("vocab", "embed")
    quantized: bool = False
    zero_row: int | None = None   # a row that starts at zero (Hugging Face's padding_idx)

    def setup(self):
        shape = (self.num_embeddings, self.features)
        if self.quantized:
            self.embedding, self.scale = int8_param(self, "embedding", shape, self.axes, (self.num_embeddings, 1))
        else:
            self.embedding = param_with_axes(self, "embedding", _with_zero_row(normal(self.stddev), self.zero_row),
                                             shape, self.axes)

    def __call__(self, ids):
        rows = jnp.take(self.embedding, ids, axis=0).astype(self.dtype)
        return rows * jnp.take(self.scale, ids, axis=0).astype(self.dtype) if self.quantized else rows

    def attend(self, x):
        logits = jnp.einsum("...d,vd->...v", x, self.embedding.astype(self.dtype))
        return logits * self.scale[:, 0].astype(self.dtype) if self.quantized else logits


# ----------------------------------------------------------------------------- positions

def sinusoidal(positions, features: int, base: float = 10000.0):
    """Vaswani et al.'s encoding [sin(p w_i) ..., cos(p w_i) ...], w_i = base^(-2i/features)."""
    freqs = base ** (-jnp.arange(features // 2, dtype=jnp.float32) * 2.0 / features)
    angles = positions[..., None].astype(jnp.float32) * freqs
    return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)


class AbsolutePositionEmbedding(nn.Module):
    """Learned (a table read at `position + position_offset`) or fixed sinusoidal encodings."""
    config: ModelConfig

    @nn.compact
    def __call__(self, positions):
        cfg = self.config
        if cfg.position_encoding == "sinusoidal":
            return sinusoidal(positions, cfg.embed_dim).astype(dtype_of(cfg))
        table = Embed(cfg.max_position_embeddings + cfg.position_offset, cfg.embed_dim, dtype_of(cfg),
                      init_std(cfg, 1.0), ("abspos_buckets", "embed"), quantized(cfg), name="table")
        return table(positions + cfg.position_offset)


def rotary(x, positions, base: float = 10000.0):
    """RoPE on x [batch, length, heads, head_dim]: rotates feature pairs (i, i + head_dim/2) by p w_i."""
    half = x.shape[-1] // 2
    freqs = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = positions[:, :, None, None].astype(jnp.float32) * freqs          # [b, l, 1, half]
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


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
    """T5: a learned scalar bias per (bucket, head), shared by all layers of a stack."""
    config: ModelConfig
    bidirectional: bool

    @nn.compact
    def __call__(self, relative_positions):
        """Offsets key - query [batch, q, k] -> bias [batch, heads, q, k]."""
        cfg = self.config
        init = (nn.initializers.variance_scaling(1.0, "fan_avg", "uniform") if cfg.init_std is None   # T5X's
                else normal(cfg.init_std))
        table = param_with_axes(self, "rel_embedding", init,
                                (cfg.relative_attention_num_buckets, cfg.num_heads), ("relpos_buckets", "heads"))
        buckets = relative_position_bucket(relative_positions, self.bidirectional,
                                           cfg.relative_attention_num_buckets, cfg.relative_attention_max_distance)
        return jnp.transpose(jnp.take(table, buckets, axis=0), (0, 3, 1, 2))


def log_bucket(relative_positions, num_buckets: int, max_distance: int):
    """DeBERTa's buckets: offsets within num_buckets/2 kept, larger ones log-spaced up to max_distance."""
    rel = relative_positions.astype(jnp.float32)
    mid = num_buckets // 2
    abs_pos = jnp.where(jnp.abs(rel) < mid, mid - 1.0, jnp.abs(rel))
    log_pos = jnp.ceil(jnp.log(abs_pos / mid) / math.log((max_distance - 1) / mid) * (mid - 1)) + mid
    return jnp.where(abs_pos <= mid, rel, log_pos * jnp.sign(rel)).astype(jnp.int32)


# ----------------------------------------------------------------------------- masks

def attention_bias(q_mask, k_mask, causal: bool = False, q_segments=None, k_segments=None,
                   q_prefix=None, k_prefix=None, q_index=None, k_index=None):
    """Additive mask [batch, 1, q, k]: 0 where a query may attend, NEG_INF elsewhere.

    Padding (mask 0) never attends or is attended; with segment ids, attention stays inside a
    packed example; `causal` forbids looking ahead, except between two prefix positions
    (`*_prefix`, a prefix LM's `decoder_causal_attention`). Causality compares the slots
    `q_index` / `k_index` ([len] or [batch, len]; default 0..len-1; a KV cache passes each
    row's own write slots).
    """
    allowed = q_mask[:, :, None].astype(bool) & k_mask[:, None, :].astype(bool)
    if q_segments is not None and k_segments is not None:
        allowed &= q_segments[:, :, None] == k_segments[:, None, :]
    if causal:
        q_index = jnp.broadcast_to(jnp.arange(q_mask.shape[1]) if q_index is None else q_index, q_mask.shape)
        k_index = jnp.broadcast_to(jnp.arange(k_mask.shape[1]) if k_index is None else k_index, k_mask.shape)
        visible = k_index[:, None, :] <= q_index[:, :, None]
        if q_prefix is not None:
            visible = visible | (q_prefix[:, :, None].astype(bool) & k_prefix[:, None, :].astype(bool))
        allowed &= visible
    return jnp.where(allowed, 0.0, NEG_INF)[:, None, :, :].astype(jnp.float32)


# ----------------------------------------------------------------------------- attention

def write_rows(cache, values, index, axis: int = 1):
    """`cache[b, ..., index[b]:index[b] + n] = values[b]` along the length `axis` for every row b:
    each row of a KV cache writes at its own slot, so prompts of different lengths decode side by side."""
    write = lambda c, v, i: jax.lax.dynamic_update_slice_in_dim(c, v.astype(c.dtype), i, axis=axis - 1)
    return jax.vmap(write)(cache, values, index)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def broadcast_rows(x, rows: int):
    """x [1, ...] repeated to [rows, ...]. Its gradient sums the rows with a tree of adds instead
    of one reduction over the major axis: XLA:CPU's YNNPACK reduction of [8, 8, 512, 512] over
    its first axis takes ~200 ms where the adds take ~5 ms (on TPU either is fine)."""
    return jnp.broadcast_to(x, (rows,) + x.shape[1:])


def _broadcast_rows_fwd(x, rows):
    return broadcast_rows(x, rows), None


def _broadcast_rows_bwd(rows, _, grad):
    while grad.shape[0] > 1:
        half = grad.shape[0] // 2
        grad = jnp.concatenate([grad[:half] + grad[half:2 * half], grad[2 * half:]])
    return (grad,)


broadcast_rows.defvjp(_broadcast_rows_fwd, _broadcast_rows_bwd)


class AttentionInputs(NamedTuple):
    """What a layer's attentions need besides the hidden states; built once per stack."""
    # [b, 1 or heads, q, k] additive mask, or a tuple of terms to add to the logits (the mask and
    # T5's position bias [1, heads, q, k]): their sum is never materialised at [b, heads, q, k].
    bias: jax.Array | tuple[jax.Array, ...]
    encoded: jax.Array | None = None      # encoder output, for cross-attention
    cross_bias: jax.Array | None = None
    positions: jax.Array | None = None    # [b, q] query positions (rotary)
    relative: jax.Array | None = None     # [b, q, k] key - query offsets (Shaw, DeBERTa)
    cache_index: jax.Array | None = None  # [b] KV cache write slot of each row while decoding
    rel_embeddings: jax.Array | None = None  # [2 * buckets, d] DeBERTa's relative position embeddings


class MultiHeadAttention(nn.Module):
    """Multi-head attention with optional biases, 1/sqrt(d) scaling, RoPE, Shaw relative
    embeddings, DeBERTa's disentangled attention and a KV cache.

    With `decode=True` the keys and values live in the "cache" collection. The first call (from
    `init_cache`, with a full-length input) creates it: zeros for self-attention, the projected
    encoder output for cross-attention, which later steps reuse without recomputing. Each later
    self-attention call writes its keys and values at each row's `cache_index` and attends over
    the cache. Keys and values are laid out [batch, heads, length, head_dim]: scores and weighted
    sums are batched matrix products that read them in place, for one query per step or a whole
    prompt ([batch, length, heads, head_dim] was transposed, a copy of the cache, every step;
    with [batch, heads, head_dim, length] XLA:CPU ran a prompt's weighted sum of values 5x
    slower, 1.2 s of gpt2_small's 3.9 s prefill). Cross-attention keys may have fewer rows than the queries (`rows // key rows`
    consecutive query rows per key row): the samples or beams of one input then read its encoder
    keys and values once, instead of one repeated copy per decode.

    With the "attention_scores" collection mutable, each call also sows its pre-softmax scores
    [b, h, q, k] (biases and masks added) there, for distillation losses that match them.
    """
    config: ModelConfig
    deterministic: bool = True
    decode: bool = False
    is_self_attention: bool = True

    def _dense(self, name, features, axes, in_ndim, fan_in_std, residual=False):
        cfg = self.config
        std = residual_init_std(cfg, fan_in_std) if residual else init_std(cfg, fan_in_std)
        return Dense(features, axes, in_ndim, cfg.use_bias, std, dtype_of(cfg), quantized(cfg), name=name)

    def _cached(self, k, v, cache_index):
        """Self-attention: writes k, v [b, heads, n, head_dim] at each row's `cache_index`, returns the
        whole cache. Cross-attention: stores the encoder's k, v on the first call. The first call
        returns k, v unchanged."""
        initialized = self.has_variable("cache", "cached_key")
        init = jnp.zeros_like if self.is_self_attention else (lambda a: a)
        cached_k = self.variable("cache", "cached_key", init, k)
        cached_v = self.variable("cache", "cached_value", init, v)
        if not initialized:
            return k, v
        if self.is_self_attention:
            cached_k.value = write_rows(cached_k.value, k, cache_index, axis=2)
            cached_v.value = write_rows(cached_v.value, v, cache_index, axis=2)
        return cached_k.value, cached_v.value

    def _disentangled_bias(self, q, k, relative, rel_embeddings, query_proj, key_proj, scale):
        """DeBERTa: content->position (q_i . P^K[d_ij]) + position->content (k_j . P^Q[d_ij]), with
        d_ij the log bucket of i - j and P^Q, P^K the shared query / key projections of the
        relative embeddings. Returns [b, heads, q, k] (already scaled)."""
        cfg = self.config
        span = cfg.relative_attention_num_buckets
        idx = log_bucket(-relative, span, cfg.relative_attention_max_distance)
        idx = jnp.clip(idx + span, 0, 2 * span - 1)[:, None]                        # [b, 1, q, k]
        pos_q, pos_k = query_proj(rel_embeddings), key_proj(rel_embeddings)        # [2 span, h, hd]
        c2p = jnp.take_along_axis(jnp.einsum("bqhd,rhd->bhqr", q, pos_k), idx, axis=-1)
        p2c = jnp.take_along_axis(jnp.einsum("bhkd,rhd->bhrk", k, pos_q), idx, axis=-2)
        return (c2p + p2c * scale).astype(jnp.float32)

    def _windowed(self, x, q, k, v, biases: W.WindowBiases, positions, scale, dropout):
        """Longformer's attention: every query over its band and the global keys, then the global
        tokens' own queries over every key, with Longformer's separate global projections (made
        whenever the window is set, so that a model takes global tokens with or without them at init)."""
        cfg = self.config
        drop = (lambda w: nn.Dropout(dropout)(w, deterministic=False)) if dropout else None
        attend = functools.partial(W.dense_attention, impl=cfg.attention_impl, dropout=drop)
        out = W.banded_attention(q, k, v, biases, attend)
        if not biases.global_index.shape[1] and not self.is_initializing():
            return out
        d, h, hd = cfg.d_model, cfg.num_heads, cfg.head_dim
        project = lambda name, std, rows: self._dense(name, (h, hd), ("embed", "heads", "kv"), 1, std)(rows)
        rope = (lambda y, p: rotary(y, p, cfg.rotary_base)) if cfg.position_encoding == "rotary" else (lambda y, p: y)
        index = biases.global_index
        q_global = rope(project("query_global", (d * hd) ** -0.5, W.global_rows(x, index)),
                        W.global_rows(positions, index)) * scale
        k_global = rope(project("key_global", d ** -0.5, x), positions)
        v_global = project("value_global", d ** -0.5, x)
        return W.with_global_rows(out, attend(q_global, k_global, v_global, biases.from_global), index)

    @nn.compact
    def __call__(self, inputs_q, inputs_kv, bias, positions=None, relative=None, cache_index=None,
                 rel_embeddings=None):
        cfg = self.config
        dtype = dtype_of(cfg)
        d, h, hd = cfg.d_model, cfg.num_heads, cfg.head_dim
        head_axes = ("embed", "heads", "kv")
        query_proj = self._dense("query", (h, hd), head_axes, 1, (d * hd) ** -0.5)
        q = nn.with_logical_constraint(query_proj(inputs_q), ("batch", "length", "heads", "kv"))
        rope = cfg.position_encoding == "rotary" and self.is_self_attention
        shaw = cfg.position_encoding == "shaw_relative" and self.is_self_attention
        disentangled = cfg.position_encoding == "disentangled" and self.is_self_attention
        key_proj = self._dense("key", (h, hd), head_axes, 1, d ** -0.5)
        if self.decode and not self.is_self_attention and self.has_variable("cache", "cached_key"):
            k, v = self.get_variable("cache", "cached_key"), self.get_variable("cache", "cached_value")
        else:
            k = key_proj(inputs_kv)
            v = self._dense("value", (h, hd), head_axes, 1, d ** -0.5)(inputs_kv)
            if rope:
                k = rotary(k, positions, cfg.rotary_base)
            k, v = (nn.with_logical_constraint(x.transpose(0, 2, 1, 3), ("batch", "heads", "length", "kv"))
                    for x in (k, v))
            if self.decode:
                k, v = self._cached(k, v, cache_index)
        if self.has_variable("params", "prefix_key"):   # prefix tuning: trained keys and values before the input's
            k, v = (jnp.concatenate([_prefix_rows(self.get_variable("params", name), x), x], axis=2)
                    for name, x in (("prefix_key", k), ("prefix_value", v)))
        if rope:
            q = rotary(q, positions, cfg.rotary_base)
        # DeBERTa scales by sqrt(3 head_dim): three score terms instead of one.
        scale = (hd * (3 if disentangled else 1)) ** -0.5 if cfg.scale_attention else 1.0
        q = q * scale
        rows = q.shape[0]
        q = q.reshape(k.shape[0], -1, h, hd)   # the decodes of one input as more queries of it
        biases = bias if isinstance(bias, tuple) else (bias,)
        if disentangled:
            biases += (self._disentangled_bias(q, k, relative, rel_embeddings, query_proj, key_proj, scale),)

        if (self.is_mutable_collection("attention_scores") and not self.is_initializing()   # TinyBERT distillation
                and not isinstance(bias, W.WindowBiases)):
            self.sow("attention_scores", "scores", sum(biases, jnp.einsum("bqhd,bhkd->bhqk", q, k).astype(jnp.float32)))
        dropout = cfg.dropout_rate if not self.deterministic else 0.0
        if isinstance(bias, W.WindowBiases):   # Longformer: a band of keys, plus global tokens
            out = self._windowed(inputs_q, q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), bias, positions,
                                 scale, dropout)
        elif cfg.attention_impl != "einsum" and not shaw and dropout == 0.0:
            out = jax.nn.dot_product_attention(q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3),
                                               bias=sum(biases).astype(dtype), scale=1.0,
                                               implementation="cudnn" if cfg.attention_impl == "cudnn" else None)
        else:
            logits = sum(biases, jnp.einsum("bqhd,bhkd->bhqk", q, k).astype(jnp.float32))
            if shaw:
                clip = cfg.shaw_max_distance
                buckets = jax.nn.one_hot(jnp.clip(relative, -clip, clip) + clip, 2 * clip + 1, dtype=dtype)
                table_std = init_std(cfg, hd ** -0.5)
                rel_k = param_with_axes(self, "relpos_key", normal(table_std), (2 * clip + 1, hd),
                                        ("relpos_buckets", "kv")).astype(dtype)
                rel_v = param_with_axes(self, "relpos_value", normal(table_std), (2 * clip + 1, hd),
                                        ("relpos_buckets", "kv")).astype(dtype)
                logits = logits + jnp.einsum("bqhd,rd,bqkr->bhqk", q, rel_k, buckets).astype(jnp.float32)
            # Softmax with its normalisation moved after the weighted sum: one divide per output
            # value [b, q, h, d] instead of one per weight [b, h, q, k]. Subtracting the row max
            # only keeps exp finite; softmax ignores the shift, so it needs no gradient.
            exp = jnp.exp(logits - jax.lax.stop_gradient(logits.max(-1, keepdims=True)))
            total = exp.sum(-1).transpose(0, 2, 1)[..., None]                          # [b, q, h, 1]
            # t5lite.analysis reads the probabilities; init (every collection mutable) stores none.
            if self.is_mutable_collection("attention") and not self.is_initializing():
                self.sow("attention", "weights", exp / exp.sum(-1, keepdims=True))
            weights = nn.Dropout(cfg.dropout_rate)(exp.astype(dtype), deterministic=self.deterministic)
            out = jnp.einsum("bhqk,bhkd->bqhd", weights, v)
            if shaw:
                out = out + jnp.einsum("bhqk,bqkr,rd->bqhd", weights, buckets, rel_v)
            out = (out / total).astype(dtype)
        out = out.reshape(rows, -1, h, hd)
        if self.has_variable(HEAD_GATES, "heads"):   # Michel et al.'s head mask: [heads] or [rows, length, heads]
            out = out * self.get_variable(HEAD_GATES, "heads").astype(dtype)[..., None]
        out = self._dense("out", (d,), ("heads", "kv", "embed"), 2, (h * hd) ** -0.5, residual=True)(out)
        return nn.with_logical_constraint(out, ("batch", "length", "embed"))


def _prefix_rows(prefix, like):
    """A prefix [n, heads, head_dim] as keys or values [rows, heads, n, head_dim] of `like`'s rows and dtype."""
    prefix = prefix.astype(like.dtype).transpose(1, 0, 2)
    return jnp.broadcast_to(prefix, (like.shape[0],) + prefix.shape)


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
            h = Dense((cfg.d_ff,), ("embed", "mlp"), 1, cfg.use_bias, init_std(cfg, cfg.d_model ** -0.5), dtype,
                      quantized(cfg), truncated_init(cfg), name=name)(x)
            h = ACTIVATIONS[act](h)
            hidden = h if hidden is None else hidden * h
        hidden = nn.with_logical_constraint(hidden, ("batch", "length", "mlp"))
        if cfg.mlp_dropout:
            hidden = nn.Dropout(cfg.dropout_rate)(hidden, deterministic=self.deterministic)
        return Dense((cfg.d_model,), ("mlp", "embed"), 1, cfg.use_bias, residual_init_std(cfg, cfg.d_ff ** -0.5),
                     dtype, quantized(cfg), truncated_init(cfg), name="wo")(hidden)
