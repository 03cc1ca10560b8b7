"""Transformer stacks and the three model families.

- `Encoder` (BERT, RoBERTa, ALBERT, ELECTRA): `__call__` -> MLM logits [b, l, vocab] (ELECTRA's
  discriminator: replaced-token logits [b, l]; `encoder_head="none"`: hidden states);
  `pretraining_logits` -> every pre-training head (MLM, NSP/SOP, SpanBERT's SBO) from one pass.
- `Decoder` (GPT-2; prefix LM with `decoder_causal_attention`): `__call__` -> LM logits.
- `EncoderDecoder` (T5 v1.0 / v1.1 / mT5, BART): `__call__` -> LM logits.
Every model's `encode` returns the final hidden states (of the decoder for decoder-only models).

One `Stack` serves every family: embeddings (+ absolute positions, token types, norm,
factorised projection), masks, the relative position scheme, the layers and a final norm.
Layers are a Python loop (`layers_0`, `layers_1`, ...) or one `nn.scan` over a stacked
`layers` axis (same param tree up to that axis; see `scan_params` / `unscan_params`);
ALBERT's shared layer is one `layers` entry either way. Any of them can be rematerialised.

Incremental decoding (decoder-only and encoder-decoder): `init_cache` allocates the "cache"
collection, then each call with `decode=True` feeds the next token(s) and returns their logits;
see `init_cache` below for the API.
"""
from __future__ import annotations

from collections.abc import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from t5lite.errors import ConfigError
from t5lite.models import bottleneck
from t5lite.models import heads as H
from t5lite.models import layers as L
from t5lite.models import windowed_attention as W
from t5lite.models import vision
from t5lite.models.config import ModelConfig

_REMAT_POLICIES = {"full": None, "minimal": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}


class TransformerLayer(nn.Module):
    """Self-attention, optional cross-attention and an MLP, each a residual sublayer whose norm
    comes before it (pre-norm: T5, GPT-2) or after the residual add (post-norm: BERT, BART)."""
    config: ModelConfig
    deterministic: bool = True
    decode: bool = False
    cross: bool = False

    @nn.compact
    def __call__(self, x, inputs: L.AttentionInputs):
        cfg = self.config
        dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))

        def residual(name, sublayer, x):   # with a bottleneck adapter if the params hold one (t5lite.models.bottleneck)
            norm = L.make_norm(cfg, f"{name}_norm")
            if cfg.norm_position == "pre":
                h = dropout(sublayer(norm(x)), deterministic=self.deterministic)
                return bottleneck.residual_add(self, name, x, h, None, L.dtype_of(cfg))
            h = dropout(sublayer(x), deterministic=self.deterministic)
            return bottleneck.residual_add(self, name, x, h, norm, L.dtype_of(cfg))

        attention = lambda name, is_self: L.MultiHeadAttention(cfg, self.deterministic, self.decode, is_self,
                                                               name=name)
        x = residual("self_attention", lambda y: attention("self_attention", True)(
            y, y, inputs.bias, inputs.positions, inputs.relative, inputs.cache_index, inputs.rel_embeddings), x)
        if self.cross:
            x = residual("cross_attention", lambda y: attention("cross_attention", False)(
                y, inputs.encoded, inputs.cross_bias), x)
        x = residual("mlp", L.MlpBlock(cfg, self.deterministic, name="mlp"), x)
        return nn.with_logical_constraint(x, ("batch", "length", "embed")), None


def run_layers(config: ModelConfig, num_layers: int, x, inputs: L.AttentionInputs, **layer_options):
    """Applies `num_layers` layers: looped or scanned, shared (ALBERT) or not, optionally remat'd."""
    layer_cls = TransformerLayer
    if config.remat_policy != "none":
        layer_cls = nn.remat(layer_cls, policy=_REMAT_POLICIES[config.remat_policy],
                             prevent_cse=not config.scan_layers)
    if config.share_layers and layer_options.get("decode"):
        raise NotImplementedError("a KV cache with share_layers=True would share one cache across layers")
    if config.scan_layers:
        if config.share_layers:
            variables = dict(variable_broadcast="params", variable_axes={"cache": 0})
        else:
            variables = dict(variable_axes={"params": 0, "cache": 0}, metadata_params={nn.PARTITION_NAME: "layers"})
        stack = nn.scan(layer_cls, **variables, split_rngs={"params": not config.share_layers, "dropout": True},
                        in_axes=(nn.broadcast,), length=num_layers)
        x, _ = stack(config, name="layers", **layer_options)(x, _for_layer(inputs, 0))
        return x
    if config.share_layers:
        layer = layer_cls(config, name="layers", **layer_options)
        for i in range(num_layers):
            x, _ = layer(x, _for_layer(inputs, i))
        return x
    for i in range(num_layers):
        x, _ = layer_cls(config, name=f"layers_{i}", **layer_options)(x, _for_layer(inputs, i))
    return x


def _for_layer(inputs: L.AttentionInputs, i: int) -> L.AttentionInputs:
    """Layer i's inputs: its own window's biases where a windowed stack holds one per layer."""
    if isinstance(inputs.bias, tuple) and inputs.bias and isinstance(inputs.bias[0], W.WindowBiases):
        return inputs._replace(bias=inputs.bias[i])
    return inputs


class Stack(nn.Module):
    """One encoder or decoder stack; `causal` stacks are decoders, `cross` ones attend to an encoder.
    Called with `as_encoder=True`, a decoder stack runs as an encoder (bidirectional, no
    cross-attention) on its own params: the shared encoder-decoder."""
    config: ModelConfig
    token_embedder: L.Embed
    num_layers: int
    causal: bool = False
    cross: bool = False

    def _embed(self, tokens, positions, token_types, deterministic, prompt=None, n_prefix=0, images=None):
        cfg = self.config
        x = self.token_embedder(tokens) if images is None else vision.PatchEmbedding(cfg, name="patch_embedder")(images)
        if prompt is not None:   # the soft prompt stands in for its placeholder tokens' embeddings
            x = x.at[:, :prompt.shape[0]].set(prompt.astype(x.dtype))
        if cfg.scale_embeddings:
            x = x * cfg.d_model ** 0.5
        if cfg.position_encoding == "learned" and n_prefix + tokens.shape[-1] > cfg.max_position_embeddings:
            # A learned table would clamp the positions past its end (NaN or garbage): refuse.
            after = f" after a prefix of {n_prefix}" if n_prefix else ""
            raise ConfigError(f"sequences of {tokens.shape[-1]} tokens{after}, but the model's learned position "
                              f"table has max_position_embeddings={cfg.max_position_embeddings} rows; shorten the "
                              "feature lengths (TASK_FEATURE_LENGTHS, max_decode_length) or use a preset with more "
                              "positions")
        if cfg.position_encoding in ("learned", "sinusoidal"):
            x = x + L.AbsolutePositionEmbedding(cfg, name="position_embedder")(positions)
        if cfg.type_vocab_size:
            # One token type (RoBERTa): every token is type 0, as RoBERTa's tokenizer makes them; a pair's
            # second segment marked 1 by a BERT-style converter would read past the table (NaN).
            token_types = jnp.zeros_like(tokens) if token_types is None or cfg.type_vocab_size == 1 else token_types
            x = x + L.Embed(cfg.type_vocab_size, cfg.embed_dim, L.dtype_of(cfg), L.init_std(cfg, 1.0),
                            ("token_types", "embed"), L.quantized(cfg), name="token_type_embedder")(token_types)
        if cfg.embedding_norm:
            x = L.make_norm(cfg, "embedding_norm")(x)
        x = nn.Dropout(cfg.dropout_rate)(x, deterministic=deterministic)
        if cfg.embedding_size is not None:
            x = L.Dense((cfg.d_model,), ("factorized_embed", "embed"), 1, cfg.use_bias,
                        L.init_std(cfg, cfg.embed_dim ** -0.5), L.dtype_of(cfg), L.quantized(cfg),
                        name="embedding_projection")(x)
        return nn.with_logical_constraint(x, ("batch", "length", "embed"))

    def _decode_slots(self, tokens, causal_attention):
        """KV-cache bookkeeping: (query slots [b, n], key slots, key prefix flags), or None on
        the first (cache-creating) call. Each row has its own write index (`set_cache_index`),
        advanced by the number of new tokens."""
        initialized = self.has_variable("cache", "index")
        index = self.variable("cache", "index", lambda: jnp.zeros(tokens.shape[:1], jnp.int32))
        prefix = self.variable("cache", "prefix", lambda: jnp.zeros(tokens.shape, bool))
        if not initialized:
            return None
        start = index.value
        new_prefix = jnp.zeros(tokens.shape, bool) if causal_attention is None else causal_attention.astype(bool)
        prefix.value = L.write_rows(prefix.value, new_prefix, start)
        index.value = start + tokens.shape[1]
        return start[:, None] + jnp.arange(tokens.shape[1]), jnp.arange(prefix.value.shape[1]), prefix.value

    def _padding_mask(self, tokens, segment_ids, causal: bool):
        if not causal:
            return tokens != self.config.pad_token_id
        # Decoder inputs start with 0 (a shifted-in BOS): only segment ids mark a decoder's padding.
        return segment_ids > 0 if segment_ids is not None else jnp.ones_like(tokens, bool)

    @nn.compact
    def __call__(self, tokens, token_types=None, segment_ids=None, positions=None, causal_attention=None,
                 encoded=None, encoder_mask=None, encoder_segment_ids=None, deterministic=True, decode=False,
                 as_encoder=False, images=None, global_mask=None):
        """`images` (a ViT encoder's): the patches stand in for the embeddings of `tokens`
        (`vision.position_tokens`, one per patch and [CLS]). `global_mask` [b, n]: Longformer's global
        tokens (with `attention_window`)."""
        cfg = self.config
        causal, cross = self.causal and not as_encoder, self.cross and not as_encoder
        prompt = self.get_variable("params", "prompt") if self.has_variable("params", "prompt") else None
        if prompt is not None:
            if decode:
                raise ConfigError("prompt tuning on a decoder-only model does not decode with the KV cache; score "
                                  "with it, or prompt-tune an encoder-decoder (T5, BART) to generate")
            tokens, token_types, segment_ids, positions, causal_attention = _with_prompt_slots(
                cfg, prompt.shape[0], tokens, token_types, segment_ids, positions, causal_attention)
        slots = self._decode_slots(tokens, causal_attention) if decode else None
        rows_share_positions = slots is None and positions is None
        if slots is not None:
            # A decoding step: queries sit at each row's write index, keys are every cache slot
            # (unwritten ones are in the future, so the causal mask hides them). No packing.
            q_index, k_index, k_prefix = slots
            positions = jnp.broadcast_to(q_index, tokens.shape)
            k_positions = jnp.broadcast_to(k_index, (tokens.shape[0], k_index.shape[0]))
            q_mask, k_mask, segment_ids = jnp.ones_like(tokens, bool), k_positions >= 0, None
            cache_index = q_index[:, 0]
        else:
            q_index = k_index = cache_index = None
            k_prefix = causal_attention
            if positions is None:
                positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
            k_positions = positions
            q_mask = k_mask = self._padding_mask(tokens, segment_ids, causal)
        n_prefix = _prefix_length(self.variables.get("params", {}), "self_attention")
        if n_prefix:   # prefix tuning: the prefix sits at positions 0..n-1, before the tokens, seen by all
            positions, k_positions = positions + n_prefix, jnp.concatenate(
                [jnp.broadcast_to(jnp.arange(n_prefix), (tokens.shape[0], n_prefix)), k_positions + n_prefix], 1)

        x = self._embed(tokens, positions, token_types, deterministic, prompt, n_prefix, images)
        relpos = L.RelativePositionBias(cfg, not causal, name="relpos_bias") if cfg.position_encoding == "t5_relative" \
            else None
        windowed = cfg.attention_window is not None and not decode
        if windowed:   # Longformer: blocked biases, never [q, k]
            bias = _window_biases(cfg, self.num_layers, q_mask, segment_ids, positions, causal, causal_attention,
                                  global_mask, relpos, n_prefix)
        else:
            bias = L.attention_bias(q_mask, k_mask, causal, segment_ids, segment_ids,
                                    causal_attention, k_prefix, q_index, k_index)
            if cfg.attention_window is not None:   # a KV cache's few queries per step: a dense band is cheap
                bias = bias + _decode_band(cfg, tokens, q_index, k_index)
            bias = _open_to_prefix(bias, n_prefix)
            relative = k_positions[:, None, :] - positions[:, :, None]
        if relpos is not None and not windowed:
            # Rows that all count 0, 1, 2, ... share one [1, heads, q, k] bias: the bucket lookup
            # and its gradient (a scatter-add into the table) run once, not once per row.
            offsets = relative[:1] if rows_share_positions else relative
            position_bias = relpos(offsets)
            if rows_share_positions:
                position_bias = L.broadcast_rows(position_bias, tokens.shape[0])
            bias = (bias, position_bias)
        cross_bias = None
        if cross and decode:   # [b_enc, 1, 1, k]: shared by every query of every decode of an input
            cross_bias = L.attention_bias(jnp.ones((encoder_mask.shape[0], 1), bool), encoder_mask)
        elif cross:
            cross_bias = L.attention_bias(q_mask, encoder_mask, q_segments=segment_ids,
                                          k_segments=encoder_segment_ids)
        if cross:   # prefix tuning's Li and Liang placement: keys and values before the encoder's
            cross_bias = _open_to_prefix(cross_bias, _prefix_length(self.variables.get("params", {}),
                                                                    "cross_attention"))
        rel_embeddings = None
        if cfg.position_encoding == "disentangled":   # DeBERTa: one normalised table per stack
            shape = (2 * cfg.relative_attention_num_buckets, cfg.d_model)
            table = L.param_with_axes(self, "rel_embedding", L.normal(L.init_std(cfg, 1.0)), shape,
                                      ("relpos_buckets", "embed"))
            rel_embeddings = L.make_norm(cfg, "rel_embedding_norm")(table)
        inputs = L.AttentionInputs(bias, encoded, cross_bias, positions,
                                   relative if cfg.position_encoding in ("shaw_relative", "disentangled") else None,
                                   cache_index, rel_embeddings)
        x = run_layers(cfg, self.num_layers, x, inputs, deterministic=deterministic, decode=decode, cross=cross)
        if cfg.final_norm:
            x = L.make_norm(cfg, "final_norm")(x)
        return nn.Dropout(cfg.dropout_rate)(x, deterministic=deterministic)


def _window_biases(cfg: ModelConfig, num_layers: int, mask, segment_ids, positions, causal: bool, prefix,
                   global_mask, relpos, n_prefix: int):
    """Each layer's Longformer biases (t5lite.models.windowed_attention) for a stack's rows."""
    if n_prefix:
        raise ConfigError("prefix tuning adds keys outside the sequence, which attention_window's band does not "
                          "hold; prompt-tune instead, or drop attention_window")
    return W.stack_biases(cfg.attention_window, cfg.attention_dilation, num_layers,
                          W.make_slots(mask, segment_ids, positions, prefix), causal, global_mask,
                          cfg.max_global_tokens, relpos)


def _decode_band(cfg: ModelConfig, tokens, q_index, k_index):
    """[b, 1, q, k]: the band of a decoding step's queries (one window for every layer)."""
    windows, dilations = ({*W.per_layer(value, 1)} for value in (cfg.attention_window, cfg.attention_dilation))
    if len(windows) > 1 or len(dilations) > 1:
        raise ConfigError("decoding with the KV cache needs one attention_window and attention_dilation for every "
                          "layer; score instead, or give each one int")
    q_index = jnp.arange(tokens.shape[1]) if q_index is None else q_index
    k_index = q_index if k_index is None else k_index
    return W.band_bias(jnp.atleast_2d(q_index), jnp.atleast_2d(k_index), *windows, *dilations)


def _with_prompt_slots(cfg: ModelConfig, n: int, tokens, token_types, segment_ids, positions, causal_attention):
    """The stack's inputs with `n` soft-prompt slots in front (prompt tuning, `t5lite.models.peft`):
    non-padding placeholder tokens (their embeddings are replaced by the prompt), token type 0,
    the first token's segment and prefix flag, positions 0..n-1 with the tokens' shifted by n."""
    def front(x, fill):
        if x is None:
            return None
        return jnp.concatenate([jnp.broadcast_to(fill, x.shape[:1] + (n,)).astype(x.dtype), x], 1)
    placeholder = (cfg.pad_token_id + 1) % cfg.vocab_size
    return (front(tokens, placeholder), front(token_types, 0), front(segment_ids, segment_ids[:, :1] if
            segment_ids is not None else 0), None if positions is None else front(positions + n, jnp.arange(n)),
            front(causal_attention, causal_attention[:, :1] if causal_attention is not None else 0))


def _prefix_length(params, sublayer: str) -> int:
    """The virtual tokens of a stack's prefix-tuning keys in `sublayer` (`prefix_key` [.., n, heads, head_dim]), or 0."""
    for layer in params.values():
        prefix = layer.get(sublayer, {}).get("prefix_key") if isinstance(layer, Mapping) else None
        if prefix is not None:
            return prefix.shape[-3]
    return 0


def _open_to_prefix(bias, n: int):
    """An attention bias [.., k] with `n` zero columns in front: every query sees the prefix keys."""
    if not n:
        return bias
    return jnp.concatenate([jnp.zeros(bias.shape[:3] + (n,), bias.dtype), bias], -1)


def without_prompt(x, tokens):
    """A stack's output for the input tokens only (a soft prompt's slots, if any, dropped)."""
    return x[:, x.shape[1] - tokens.shape[1]:]


def make_token_embedder(cfg: ModelConfig) -> L.Embed:
    return L.Embed(cfg.vocab_size, cfg.embed_dim, L.dtype_of(cfg), L.init_std(cfg, 1.0), quantized=L.quantized(cfg),
                   zero_row=cfg.pad_token_id if cfg.zero_pad_embedding else None, name="token_embedder")


class Encoder(nn.Module):
    """BERT family: `apply(vars, encoder_input_tokens=..., token_type_ids=...)` -> MLM logits. A ViT
    (`config.image_size`) reads `encoder_input_images` [batch, H, W, C] instead of tokens."""
    config: ModelConfig

    def setup(self):
        cfg = self.config
        self.token_embedder = make_token_embedder(cfg)
        self.encoder = Stack(cfg, self.token_embedder, cfg.num_encoder_layers)
        if cfg.pooler:
            self.pooler = H.Pooler(cfg)
        if cfg.sentence_head:
            self.sentence_head = H.SequenceClassificationHead(cfg, num_labels=2)
        if cfg.encoder_head == "mlm":
            self.mlm_head = H.MlmHead(cfg, self.token_embedder)
            if cfg.span_boundary_head:
                self.span_boundary_head = H.SpanBoundaryHead(cfg)
        elif cfg.encoder_head == "discriminator":
            self.discriminator_head = H.DiscriminatorHead(cfg)

    def encode(self, encoder_input_tokens=None, token_type_ids=None, encoder_segment_ids=None, encoder_positions=None,
               enable_dropout=False, encoder_input_images=None, encoder_global_attention_mask=None,
               **unused_features):
        tokens, images = vision.encoder_inputs(self.config, encoder_input_tokens, encoder_input_images)
        return without_prompt(self.encoder(tokens, token_type_ids, encoder_segment_ids, encoder_positions,
                                            deterministic=not enable_dropout, images=images,
                                            global_mask=encoder_global_attention_mask), tokens)

    def pool(self, encoder_input_tokens=None, **features):
        """BERT's pooled [CLS] vector [batch, d_model] (configs with `pooler=True`)."""
        return self.pooler(self.encode(encoder_input_tokens, **features))

    def sentence_logits(self, encoder_input_tokens, enable_dropout=False, **features):
        """NSP (BERT) or SOP (ALBERT) logits [batch, 2] (configs with `sentence_head=True`); the
        head's dropout is on in training, as BERT's classifier dropout is."""
        pooled = self.pool(encoder_input_tokens, enable_dropout=enable_dropout, **features)
        return self.sentence_head(pooled, deterministic=not enable_dropout)

    def pretraining_logits(self, encoder_input_tokens, token_type_ids=None, encoder_segment_ids=None,
                           encoder_positions=None, span_left_boundary=None, span_right_boundary=None,
                           span_relative_position=None, enable_dropout=False, **unused_features):
        """Every pre-training head from one forward pass (an MLM encoder): "mlm" logits [b, l, vocab];
        with `sentence_head`, "sentence" NSP/SOP logits [b, 2]; with `span_boundary_head` and the span
        features, "span_boundary" logits [b, l, vocab] (each token predicted from its span's boundaries)."""
        if self.config.encoder_head != "mlm":
            raise ValueError(f"pretraining_logits needs an MLM encoder; this one has encoder_head="
                             f"{self.config.encoder_head!r}")
        x = self.encode(encoder_input_tokens, token_type_ids, encoder_segment_ids, encoder_positions, enable_dropout)
        logits = {"mlm": self.mlm_head(x)}
        if self.config.sentence_head:
            logits["sentence"] = self.sentence_head(self.pooler(x), deterministic=not enable_dropout)
        if self.config.span_boundary_head and span_relative_position is not None:
            logits["span_boundary"] = self.span_boundary_head(x, span_left_boundary, span_right_boundary,
                                                              span_relative_position, self.token_embedder)
        return logits

    def __call__(self, encoder_input_tokens=None, token_type_ids=None, encoder_segment_ids=None, encoder_positions=None,
                 enable_dropout=False, encoder_input_images=None, encoder_global_attention_mask=None,
                 **unused_features):
        x = self.encode(encoder_input_tokens, token_type_ids, encoder_segment_ids, encoder_positions, enable_dropout,
                        encoder_input_images, encoder_global_attention_mask)
        if self.config.pooler and self.is_initializing():   # create every param in one init
            pooled = self.pooler(x)
            if self.config.sentence_head:
                self.sentence_head(pooled)
        if self.config.span_boundary_head and self.is_initializing():
            positions = jnp.ones_like(encoder_input_tokens)
            self.span_boundary_head(x, positions, positions, positions, self.token_embedder)
        if self.config.encoder_head == "mlm":
            return self.mlm_head(x)
        if self.config.encoder_head == "discriminator":
            return self.discriminator_head(x)
        return x.astype(jnp.float32)


class Decoder(nn.Module):
    """GPT family: `apply(vars, decoder_input_tokens=...)` -> LM logits. A prefix LM
    (`config.prefix_lm`) passes `decoder_causal_attention` (1 over the prefix), which the prefix
    attends to bidirectionally; a causal LM ignores it, so that training (the `prefix_lm`
    converter always marks the prefix) attends as decoding and scoring do."""
    config: ModelConfig

    def setup(self):
        cfg = self.config
        self.token_embedder = make_token_embedder(cfg)
        self.decoder = Stack(cfg, self.token_embedder, cfg.num_decoder_layers, causal=True)
        self.lm_head = H.LmHead(cfg, self.token_embedder)

    def encode(self, decoder_input_tokens, decoder_segment_ids=None, decoder_positions=None,
               decoder_causal_attention=None, enable_dropout=False, decode=False, **unused_features):
        if not self.config.prefix_lm:
            decoder_causal_attention = None
        return without_prompt(self.decoder(decoder_input_tokens, None, decoder_segment_ids, decoder_positions,
                                            decoder_causal_attention, deterministic=not enable_dropout,
                                            decode=decode), decoder_input_tokens)

    def __call__(self, decoder_input_tokens, decoder_segment_ids=None, decoder_positions=None,
                 decoder_causal_attention=None, enable_dropout=False, decode=False, **unused_features):
        return self.lm_head(self.encode(decoder_input_tokens, decoder_segment_ids, decoder_positions,
                                        decoder_causal_attention, enable_dropout, decode))

    def init_cache(self, batch_size: int, max_decode_length: int):
        self.encode(jnp.zeros((batch_size, max_decode_length), jnp.int32), decode=True)


class EncoderDecoder(nn.Module):
    """T5 and BART: `apply(variables, **features)` -> logits; `method="encode"` -> encoder states."""
    config: ModelConfig

    def setup(self):
        cfg = self.config
        self.token_embedder = make_token_embedder(cfg)
        if not cfg.share_encoder_decoder:   # shared: the decoder's params serve both (no "encoder")
            self.encoder = Stack(cfg, self.token_embedder, cfg.num_encoder_layers)
        self.decoder = Stack(cfg.decoder_config(), self.token_embedder, cfg.num_decoder_layers, causal=True,
                             cross=True)
        self.lm_head = H.LmHead(cfg.decoder_config(), self.token_embedder)

    def encode(self, encoder_input_tokens=None, encoder_segment_ids=None, encoder_positions=None,
               enable_dropout=False, encoder_global_attention_mask=None, encoder_input_images=None,
               **unused_features):
        """The encoder's states; an image model (`config.image_size`) encodes `encoder_input_images`,
        and its decoder then attends to every position (`vision.position_tokens` as the mask's tokens)."""
        tokens, images = vision.encoder_inputs(self.config, encoder_input_tokens, encoder_input_images)
        stack = self.decoder if self.config.share_encoder_decoder else self.encoder
        return stack(tokens, None, encoder_segment_ids, encoder_positions,
                     deterministic=not enable_dropout, as_encoder=self.config.share_encoder_decoder,
                     images=images, global_mask=encoder_global_attention_mask)

    def decode(self, encoded, encoder_input_tokens, decoder_input_tokens, encoder_segment_ids=None,
               decoder_segment_ids=None, decoder_positions=None, enable_dropout=False, decode=False,
               **unused_features):
        encoder_mask = encoder_input_tokens != self.config.pad_token_id
        prompt = self.variables.get("params", {}).get("encoder", {}).get("prompt")
        if prompt is not None:   # the encoder's soft-prompt slots (prompt tuning): always attended
            n = prompt.shape[0]
            encoder_mask = jnp.concatenate([jnp.ones(encoder_mask.shape[:1] + (n,), bool), encoder_mask], 1)
            if encoder_segment_ids is not None:
                encoder_segment_ids = jnp.concatenate([jnp.repeat(encoder_segment_ids[:, :1], n, 1),
                                                       encoder_segment_ids], 1)
        x = self.decoder(decoder_input_tokens, None, decoder_segment_ids, decoder_positions, None, encoded,
                         encoder_mask, encoder_segment_ids,
                         deterministic=not enable_dropout, decode=decode)
        return self.lm_head(x)

    def __call__(self, encoder_input_tokens=None, decoder_input_tokens=None, encoder_segment_ids=None,
                 decoder_segment_ids=None, encoder_positions=None, decoder_positions=None,
                 enable_dropout=False, encoder_global_attention_mask=None, encoder_input_images=None,
                 **unused_features):
        encoded = self.encode(encoder_input_tokens, encoder_segment_ids, encoder_positions, enable_dropout,
                              encoder_global_attention_mask, encoder_input_images)
        tokens, _ = vision.encoder_inputs(self.config, encoder_input_tokens, encoder_input_images)
        return self.decode(encoded, tokens, decoder_input_tokens, encoder_segment_ids,
                           decoder_segment_ids, decoder_positions, enable_dropout)

    def init_cache(self, encoded, encoder_input_tokens, max_decode_length: int, batch_size: int | None = None):
        dummy = jnp.zeros((batch_size or encoded.shape[0], max_decode_length), jnp.int32)
        self.decode(encoded, encoder_input_tokens, dummy, decode=True)


_MODELS = {"encoder": Encoder, "decoder": Decoder, "encoder_decoder": EncoderDecoder}


def build_module(config: ModelConfig) -> nn.Module:
    return _MODELS[config.arch](config)


def init_cache(module: nn.Module, params, max_decode_length: int, *, batch_size: int | None = None,
               encoded=None, encoder_input_tokens=None):
    """The "cache" collection for incremental decoding of `module` (a Decoder or EncoderDecoder).

    Decoder:        init_cache(model, params, max_len, batch_size=b)
    EncoderDecoder: init_cache(model, params, max_len, encoded=enc, encoder_input_tokens=tokens)
    (the encoder keys/values of every cross-attention layer are projected here, once. With
    `batch_size=n * len(enc)`, n decodes (samples, beams) per input, consecutive, share them.)

    Then, per step (or for a whole prompt at once), with tokens [b, n]:
        logits, state = model.apply({"params": params, "cache": cache}, ..., decode=True, mutable=["cache"])
        cache = state["cache"]
    where `...` is `decoder_input_tokens=tokens` (plus `decoder_causal_attention` for a prefix-LM
    prompt) for a Decoder, and `encoded, encoder_input_tokens, tokens, method="decode"` for an
    EncoderDecoder. The cache holds `index` [b] (each row's next write slot) per stack and
    `cached_key`/`cached_value` [b, heads, len, head_dim] per attention layer (stacked on a leading layers axis
    when scanned). After prefilling prompts of different lengths, `set_cache_index` moves each
    row's index back to the end of its own prompt.
    """
    if isinstance(module, EncoderDecoder):
        args = (encoded, encoder_input_tokens, max_decode_length, batch_size)
    else:
        args = (batch_size, max_decode_length)
    _, state = module.apply({"params": params}, *args, method="init_cache", mutable=["cache"])
    return state["cache"]


def set_cache_index(cache, index):
    """The cache with every stack's write index set to `index` [b]: each row's next token goes
    to its own slot (the end of its prompt), overwriting whatever padding was prefilled there."""
    def reset(path, leaf):
        return jnp.broadcast_to(index, leaf.shape).astype(leaf.dtype) if path[-1].key == "index" else leaf
    return jax.tree_util.tree_map_with_path(reset, cache)


def unscan_params(params):
    """(Unboxed) scanned params (`layers` with a leading layers axis) -> the looped layout (`layers_0`, ...)."""
    def walk(tree):
        if not isinstance(tree, dict):
            return tree
        out = {}
        for key, value in tree.items():
            if key == "layers" and isinstance(value, dict) and _stacked(value):
                n = jax.tree.leaves(value)[0].shape[0]
                for i in range(n):
                    out[f"layers_{i}"] = jax.tree.map(lambda a, i=i: a[i], value)
            else:
                out[key] = walk(value)
        return out
    return walk(params)


def scan_params(params):
    """The looped layout (`layers_0`, ...) -> scanned params (`layers` stacked on axis 0)."""
    def walk(tree):
        if not isinstance(tree, dict):
            return tree
        layer_keys = sorted((k for k in tree if k.startswith("layers_")), key=lambda k: int(k.split("_")[1]))
        out = {k: walk(v) for k, v in tree.items() if k not in layer_keys}
        if layer_keys:
            out["layers"] = jax.tree.map(lambda *xs: jnp.stack(xs), *[tree[k] for k in layer_keys])
        return out
    return walk(params)


def _stacked(layer_tree) -> bool:
    """Scanned layers carry a leading axis; ALBERT's shared `layers` do not (1-D norms tell)."""
    norm = layer_tree.get("mlp_norm", {}).get("scale")
    return norm is not None and jnp.ndim(norm) == 2
