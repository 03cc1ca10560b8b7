"""Output heads: the pre-training heads the models own (LM, MLM, ELECTRA discriminator, pooler)
and task heads for fine-tuning (classification / regression, span extraction, token tagging,
NSP / SOP, SpanBERT's span boundary objective).

Task heads read a backbone's final hidden states; `t5lite.models.with_head.WithHead` puts a
backbone and one head together as a single module.
"""
from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from t5lite.errors import ConfigError
from t5lite.models import layers as L
from t5lite.models.config import ModelConfig


def _dense(config: ModelConfig, features: int, axes, name: str, fan_in_std: float | None = None,
           task_head: bool = False):
    """A head's dense layer; int8 in a quantised model except in a task head (`task_head`), whose
    classifier stays float32, as torchao and Qwix users keep the last layer: it is a tiny share of
    the weights, and its rounding error lands on the logits undamped."""
    fan_in_std = config.d_model ** -0.5 if fan_in_std is None else fan_in_std
    return L.Dense((features,), axes, 1, config.use_bias, L.init_std(config, fan_in_std), L.dtype_of(config),
                   L.quantized(config) and not task_head, name=name)


class LmHead(nn.Module):
    """Next-token logits: the tied embedding (times d_model**-0.5 for T5 v1.0) or an untied
    `logits_dense`, plus BART's `logits_bias`. Always float32."""
    config: ModelConfig
    embedder: L.Embed

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        if cfg.tie_embeddings:
            logits = self.embedder.attend(x * cfg.d_model ** -0.5 if cfg.scale_tied_logits else x)
        else:
            logits = L.Dense((cfg.vocab_size,), ("embed", "vocab"), stddev=L.init_std(cfg, cfg.d_model ** -0.5),
                             dtype=L.dtype_of(cfg), quantized=L.quantized(cfg), truncated=L.truncated_init(cfg),
                             name="logits_dense")(x)
        logits = logits.astype(jnp.float32)
        if cfg.logits_bias:
            logits = logits + L.param_with_axes(self, "logits_bias", nn.initializers.zeros, (cfg.vocab_size,),
                                                ("vocab",))
        return nn.with_logical_constraint(logits, ("batch", "length", "vocab"))


class MlmHead(nn.Module):
    """BERT's masked-LM head: dense (H -> E) + activation + LayerNorm, then the tied embedding
    (E -> V) plus a bias."""
    config: ModelConfig
    embedder: L.Embed

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        x = _dense(cfg, cfg.embed_dim, ("embed", "mlp"), "dense")(x)
        x = L.ACTIVATIONS[cfg.mlp_activations[0]](x)
        x = L.make_norm(cfg.replace(norm="layer"), "norm", axis_name="mlp")(x)
        logits = self.embedder.attend(x).astype(jnp.float32)
        logits = logits + L.param_with_axes(self, "bias", nn.initializers.zeros, (cfg.vocab_size,), ("vocab",))
        return nn.with_logical_constraint(logits, ("batch", "length", "vocab"))


class DiscriminatorHead(nn.Module):
    """ELECTRA: per-token "was this token replaced?" logit [batch, length]."""
    config: ModelConfig

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        x = L.ACTIVATIONS[cfg.mlp_activations[0]](_dense(cfg, cfg.d_model, ("embed", "mlp"), "dense")(x))
        return _dense(cfg, 1, ("mlp", "classes"), "prediction")(x)[..., 0].astype(jnp.float32)


class Pooler(nn.Module):
    """BERT's pooler: dense + tanh on the first ([CLS]) token (DeBERTa's: dense + GELU,
    `pooler_activation`)."""
    config: ModelConfig

    @nn.compact
    def __call__(self, x):
        dense = _dense(self.config, self.config.d_model, ("embed", "mlp"), "dense")
        return L.ACTIVATIONS[self.config.pooler_activation](dense(x[:, 0]))


POOLINGS = ("first", "cls", "last", "mean", "max")   # "cls" is "first", sentence-transformers' name


def pool(hidden, mask, how: str):
    """[batch, length, d] -> [batch, d]: the "first" token ([CLS]), the "last" non-padding one, the
    "mean" or the elementwise "max" over the non-padding ones. As sentence-transformers' Pooling:
    the mean divides by the token count clamped at 1e-9, the max ignores padding (a row with no
    token pools to zeros)."""
    if how in ("first", "cls"):
        return hidden[:, 0]
    if how == "last":
        last = jnp.maximum(jnp.sum(mask.astype(jnp.int32), axis=1) - 1, 0)
        return jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0]
    if how == "mean":
        m = mask.astype(hidden.dtype)[..., None]
        return jnp.sum(hidden * m, axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1e-9)
    if how == "max":
        m = mask.astype(bool)[..., None]
        return jnp.where(jnp.any(m, axis=1), jnp.max(jnp.where(m, hidden, -jnp.inf), axis=1), 0)
    raise ConfigError(f"pooling={how!r}: expected one of {POOLINGS}")


def pool_segments(hidden, segment_ids, how: str, num_segments: int):
    """Packed rows: [batch, length, d] -> [batch, num_segments, d], slot k pooling segment k + 1
    as `pool` pools a row ("first": its first token, "last": its last, "mean"); slots with no
    segment get zeros. Gathers and masked sums, no matmul, so values equal the unpacked pooling."""
    member = segment_ids[:, None, :] == jnp.arange(1, num_segments + 1)[None, :, None]   # [b, s, l]
    if how == "mean":
        m = member.astype(hidden.dtype)
        total = jnp.sum(m[..., None] * hidden[:, None], axis=2)
        return total / jnp.maximum(jnp.sum(m, axis=2), 1.0)[..., None]
    if how not in ("first", "last"):
        raise ConfigError(f"pooling={how!r}: packed rows pool 'first', 'last' or 'mean'")
    index = jnp.argmax(member, axis=2) if how == "first" else member.shape[2] - 1 - jnp.argmax(member[..., ::-1], axis=2)
    present = jnp.any(member, axis=2)[..., None]
    return jnp.where(present, jnp.take_along_axis(hidden, index[..., None], axis=1), 0)


def segment_logits(logits, segment_ids, num_segments: int):
    """Packed rows: [batch, length] per-token logits -> [batch, num_segments, length], slot k
    keeping segment k + 1's and NEG_INF elsewhere, so a softmax over a slot is its example's own."""
    member = segment_ids[:, None, :] == jnp.arange(1, num_segments + 1)[None, :, None]
    return jnp.where(member, logits[:, None, :], L.NEG_INF)


def _dropout_classifier(head: nn.Module, x, num_classes: int, deterministic: bool):
    """Dropout then a dense `classifier` over the last axis, float32 logits (inside a compact head)."""
    x = nn.Dropout(head.config.dropout_rate)(x, deterministic=deterministic)
    return _dense(head.config, num_classes, ("embed", "classes"), "classifier", task_head=True)(x).astype(jnp.float32)


class SequenceClassificationHead(nn.Module):
    """Dropout + dense on a pooled vector [batch, d] -> [batch, num_labels]; num_labels=1 is
    regression (STS-B); num_labels=2 on BERT's pooler is NSP, on ALBERT's is SOP."""
    config: ModelConfig
    num_labels: int

    @nn.compact
    def __call__(self, pooled, deterministic: bool = True):
        return _dropout_classifier(self, pooled, self.num_labels, deterministic)


class TokenTaggingHead(nn.Module):
    """Per-token labels (NER, POS): [batch, length, d] -> [batch, length, num_tags]."""
    config: ModelConfig
    num_tags: int

    @nn.compact
    def __call__(self, hidden, deterministic: bool = True):
        return _dropout_classifier(self, hidden, self.num_tags, deterministic)


class SpanExtractionHead(nn.Module):
    """SQuAD: start and end logits [batch, length] each; padding gets NEG_INF."""
    config: ModelConfig

    @nn.compact
    def __call__(self, hidden, mask):
        logits = _dense(self.config, 2, ("embed", "classes"), "span", task_head=True)(hidden).astype(jnp.float32)
        logits = jnp.where(mask[..., None].astype(bool), logits, L.NEG_INF)
        return logits[..., 0], logits[..., 1]


class SpanBoundaryHead(nn.Module):
    """SpanBERT's span boundary objective, as its `BertPairTargetPredictionHead`
    (facebookresearch/SpanBERT, pretraining/fairseq/models/pair_bert.py): each token x_i of a masked
    span (s..e) predicted from the states just outside the span and its position in it,
    y_i = f(x_{s-1}, x_{e+1}, p_{i-s+1}), with a 2-layer GELU + LayerNorm MLP, the tied output
    embedding and an output bias of its own.

    `left`, `right` [batch, n] are the boundary token indices s - 1 and e + 1 of each target's span,
    `relative` [batch, n] its 1-based position i - s + 1; returns logits [batch, n, vocab]. The
    position table has `max_pair_targets` rows, SpanBERT's published `--max-pair-targets 15`: a span
    of up to 10 words often has more than 10 word pieces, and its first 15 are predicted. Positions
    past it (and 0, off the spans) are clipped into the table: give them no loss. One difference:
    p is d_model wide, where SpanBERT's is 200 wide at every model size, so that the head's input
    (3 x d_model) shards along the model's own axes at any width.
    """
    config: ModelConfig
    max_pair_targets: int = 15

    @nn.compact
    def __call__(self, hidden, left, right, relative, embedder: L.Embed):
        cfg = self.config
        gather = lambda idx: jnp.take_along_axis(hidden, idx[..., None], axis=1)   # [b, n, d]
        rel = L.Embed(self.max_pair_targets, cfg.d_model, L.dtype_of(cfg), L.init_std(cfg, 1.0),
                      ("abspos_buckets", "embed"), L.quantized(cfg),
                      name="position")(jnp.clip(relative - 1, 0, self.max_pair_targets - 1))
        x = jnp.concatenate([gather(left), gather(right), rel.astype(hidden.dtype)], axis=-1)
        layer_norm = cfg.replace(norm="layer")
        for i in range(2):
            x = _dense(cfg, cfg.d_model, ("mlp", "embed"), f"dense_{i}", (x.shape[-1]) ** -0.5)(x)
            x = L.make_norm(layer_norm, f"norm_{i}")(nn.gelu(x, approximate=False))
        if cfg.embedding_size is not None:
            x = _dense(cfg, cfg.embed_dim, ("embed", "mlp"), "to_embedding")(x)
        logits = embedder.attend(x).astype(jnp.float32)
        return logits + L.param_with_axes(self, "bias", nn.initializers.zeros, (cfg.vocab_size,), ("vocab",))
