"""Transformer stacks and the encoder-decoder model (T5 v1.0 / v1.1).

Layers are either a Python loop (`layers_0`, `layers_1`, ...) or one `nn.scan` over a stacked
`layers` axis (faster compiles on deep models); both can be rematerialised. The model takes
T5X feature names and returns float32 logits.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from t5lite.models import layers as L
from t5lite.models.config import ModelConfig

_REMAT_POLICIES = {"full": None, "minimal": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}


class EncoderLayer(nn.Module):
    config: ModelConfig
    deterministic: bool = True

    @nn.compact
    def __call__(self, x, bias):
        cfg = self.config
        dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
        y = L.RMSNorm(cfg.layer_norm_epsilon, L.dtype_of(cfg), name="pre_attention_layer_norm")(x)
        y = L.MultiHeadAttention(cfg, self.deterministic, name="attention")(y, y, bias)
        x = x + dropout(y, deterministic=self.deterministic)
        y = L.RMSNorm(cfg.layer_norm_epsilon, L.dtype_of(cfg), name="pre_mlp_layer_norm")(x)
        y = L.MlpBlock(cfg, self.deterministic, name="mlp")(y)
        x = x + dropout(y, deterministic=self.deterministic)
        return nn.with_logical_constraint(x, ("batch", "length", "embed")), None


class DecoderLayer(nn.Module):
    config: ModelConfig
    deterministic: bool = True

    @nn.compact
    def __call__(self, x, bias, encoded, cross_bias):
        cfg = self.config
        dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
        y = L.RMSNorm(cfg.layer_norm_epsilon, L.dtype_of(cfg), name="pre_self_attention_layer_norm")(x)
        y = L.MultiHeadAttention(cfg, self.deterministic, name="self_attention")(y, y, bias)
        x = x + dropout(y, deterministic=self.deterministic)
        y = L.RMSNorm(cfg.layer_norm_epsilon, L.dtype_of(cfg), name="pre_cross_attention_layer_norm")(x)
        y = L.MultiHeadAttention(cfg, self.deterministic, name="encoder_decoder_attention")(y, encoded, cross_bias)
        x = x + dropout(y, deterministic=self.deterministic)
        y = L.RMSNorm(cfg.layer_norm_epsilon, L.dtype_of(cfg), name="pre_mlp_layer_norm")(x)
        y = L.MlpBlock(cfg, self.deterministic, name="mlp")(y)
        x = x + dropout(y, deterministic=self.deterministic)
        return nn.with_logical_constraint(x, ("batch", "length", "embed")), None


def run_layers(parent: nn.Module, layer_cls, config: ModelConfig, num_layers: int, deterministic: bool, x, *args):
    """Applies `num_layers` layers, looped or scanned and optionally rematerialised, per the config."""
    if config.remat_policy != "none":
        layer_cls = nn.remat(layer_cls, policy=_REMAT_POLICIES[config.remat_policy],
                             prevent_cse=not config.scan_layers)
    if config.scan_layers:
        stack = nn.scan(layer_cls, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
                        in_axes=(nn.broadcast,) * len(args), length=num_layers,
                        metadata_params={nn.PARTITION_NAME: "layers"})
        x, _ = stack(config, deterministic, name="layers")(x, *args)
        return x
    for i in range(num_layers):
        x, _ = layer_cls(config, deterministic, name=f"layers_{i}")(x, *args)
    return x


def _positions(tokens, positions):
    if positions is not None:
        return positions
    return jnp.broadcast_to(jnp.arange(tokens.shape[1])[None], tokens.shape)


def _relpos(config: ModelConfig, bidirectional: bool, name: str):
    return L.RelativePositionBias(config.relative_attention_num_buckets, config.relative_attention_max_distance,
                                  config.num_heads, bidirectional, name=name)


class Encoder(nn.Module):
    config: ModelConfig
    embedder: nn.Module

    @nn.compact
    def __call__(self, tokens, segment_ids=None, positions=None, deterministic=True):
        cfg = self.config
        positions = _positions(tokens, positions)
        bias = L.attention_bias(tokens > 0, tokens > 0, q_segments=segment_ids, k_segments=segment_ids)
        bias = bias + _relpos(cfg, True, "relpos_bias")(positions, positions)
        x = nn.Dropout(cfg.dropout_rate)(self.embedder(tokens), deterministic=deterministic)
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
        x = run_layers(self, EncoderLayer, cfg, cfg.num_encoder_layers, deterministic, x, bias)
        x = L.RMSNorm(cfg.layer_norm_epsilon, L.dtype_of(cfg), name="encoder_norm")(x)
        return nn.Dropout(cfg.dropout_rate)(x, deterministic=deterministic)


class Decoder(nn.Module):
    config: ModelConfig
    embedder: nn.Module

    @nn.compact
    def __call__(self, encoded, encoder_tokens, tokens, encoder_segment_ids=None, segment_ids=None,
                 positions=None, deterministic=True):
        cfg = self.config
        positions = _positions(tokens, positions)
        # Decoder inputs start with 0 (the shifted-in BOS), so the target mask is "not padding
        # in the row", taken from the segment ids when packed and from all positions otherwise.
        dec_mask = segment_ids > 0 if segment_ids is not None else jnp.ones_like(tokens, bool)
        bias = L.attention_bias(dec_mask, dec_mask, causal=True, q_segments=segment_ids, k_segments=segment_ids)
        bias = bias + _relpos(cfg, False, "relpos_bias")(positions, positions)
        cross_bias = L.attention_bias(dec_mask, encoder_tokens > 0, q_segments=segment_ids,
                                      k_segments=encoder_segment_ids)
        x = nn.Dropout(cfg.dropout_rate)(self.embedder(tokens), deterministic=deterministic)
        x = run_layers(self, DecoderLayer, cfg, cfg.num_decoder_layers, deterministic, x, bias, encoded, cross_bias)
        x = L.RMSNorm(cfg.layer_norm_epsilon, L.dtype_of(cfg), name="decoder_norm")(x)
        x = nn.Dropout(cfg.dropout_rate)(x, deterministic=deterministic)
        if cfg.tie_embeddings:
            logits = self.embedder.attend(x * cfg.d_model ** -0.5)
        else:
            kernel = L.param_with_axes(self, "logits_dense", L.normal(cfg.d_model ** -0.5),
                                       (cfg.d_model, cfg.vocab_size), ("embed", "vocab"))
            logits = jnp.einsum("bld,dv->blv", x, kernel.astype(x.dtype))
        return nn.with_logical_constraint(logits.astype(jnp.float32), ("batch", "length", "vocab"))


class EncoderDecoder(nn.Module):
    """T5: `apply(variables, **features)` -> logits; `method="encode"` -> encoder states."""
    config: ModelConfig

    def setup(self):
        cfg = self.config
        self.token_embedder = L.Embed(cfg.vocab_size, cfg.d_model, L.dtype_of(cfg))
        self.encoder = Encoder(cfg, self.token_embedder)
        self.decoder = Decoder(cfg, self.token_embedder)

    def encode(self, encoder_input_tokens, encoder_segment_ids=None, encoder_positions=None,
               enable_dropout=False, **unused_features):
        return self.encoder(encoder_input_tokens, encoder_segment_ids, encoder_positions,
                            deterministic=not enable_dropout)

    def decode(self, encoded, encoder_input_tokens, decoder_input_tokens, encoder_segment_ids=None,
               decoder_segment_ids=None, decoder_positions=None, enable_dropout=False, **unused_features):
        return self.decoder(encoded, encoder_input_tokens, decoder_input_tokens, encoder_segment_ids,
                            decoder_segment_ids, decoder_positions, deterministic=not enable_dropout)

    def __call__(self, encoder_input_tokens, decoder_input_tokens, encoder_segment_ids=None,
                 decoder_segment_ids=None, encoder_positions=None, decoder_positions=None,
                 enable_dropout=False, **unused_features):
        encoded = self.encode(encoder_input_tokens, encoder_segment_ids, encoder_positions, enable_dropout)
        return self.decode(encoded, encoder_input_tokens, decoder_input_tokens, encoder_segment_ids,
                           decoder_segment_ids, decoder_positions, enable_dropout)
