"""A backbone and one task head as a single module, params `{"backbone": ..., "head": ...}`, so a
checkpoint loaded with `t5lite.interop.hf.load` can be grafted in as `params["backbone"]`:
`WithHead` (encoders' heads) and `DecoderClassifier` (GPT-1's last-token classifier).

It builds the backbone, so it sits above transformer.py, which builds on heads.py.
"""
from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from t5lite.errors import ConfigError
from t5lite.models import heads as H
from t5lite.models import vision
from t5lite.models.awd_lstm import BiLSTM
from t5lite.models.config import ModelConfig
from t5lite.models.transformer import build_module, without_prompt


class WithHead(nn.Module):
    """A backbone (`build(config)`) plus a task head on its hidden states.

    `pooling` picks what the head sees: "pooler" (the backbone's BERT pooler), "first", "last"
    (the last non-padding token: GPT-style classification), "mean", or None (all positions:
    tagging and span heads). Span heads also get the padding mask; the classifier heads get
    `enable_dropout` (their dropout is on in training only).

    Packed rows (`encoder_segment_ids` given, with `num_segments` label slots per row): a pooling
    head reads each segment's own token (its [CLS] for "first" and "pooler") and returns
    [batch, num_segments, ...]; the span head returns [batch, num_segments, length] logits, each
    slot's outside its segment NEG_INF; the tagging head needs no slots.
    """
    config: ModelConfig
    head: nn.Module
    pooling: str | None = None

    def setup(self):
        self.backbone = build_module(self.config)

    def __call__(self, enable_dropout: bool = False, num_segments: int | None = None, **features):
        tokens = features.get("encoder_input_tokens", features.get("decoder_input_tokens"))
        tokens, _ = vision.encoder_inputs(self.config, tokens, features.get(vision.IMAGES))   # a ViT's: no padding
        mask = tokens != self.config.pad_token_id
        deterministic = not enable_dropout
        if num_segments is not None and self.pooling is not None:
            hidden = self.backbone.encode(enable_dropout=enable_dropout, **features)
            how = "first" if self.pooling == "pooler" else self.pooling
            pooled = H.pool_segments(hidden, features["encoder_segment_ids"], how, num_segments)
            if self.pooling == "pooler":   # BERT's pooler reads position 0 of a [rows, length, d] input
                pooled = self.backbone.pooler(pooled.reshape(-1, 1, pooled.shape[-1])).reshape(pooled.shape)
            return self.head(pooled, deterministic)
        if self.pooling == "pooler":
            return self.head(self.backbone.pool(enable_dropout=enable_dropout, **features), deterministic)
        hidden = without_prompt(self.backbone.encode(enable_dropout=enable_dropout, **features), tokens)
        if self.pooling is not None:
            return self.head(H.pool(hidden, mask, self.pooling), deterministic)
        if isinstance(self.head, H.SpanExtractionHead):
            logits = self.head(hidden, mask)
            if num_segments is None:
                return logits
            return tuple(H.segment_logits(x, features["encoder_segment_ids"], num_segments) for x in logits)
        return self.head(hidden, deterministic)


class DecoderClassifier(nn.Module):
    """GPT-1's fine-tuning model: a decoder-only backbone and a `SequenceClassificationHead` on the
    final state of each input's last real token (the extract token; `decoder_segment_ids` > 0 mark
    the real tokens, right padding; None: no padding). With the `swapped_` features (a similarity
    pair in its other order) the two orders' states are added before the head, as GPT-1 does. `with_lm` also returns
    the backbone's LM logits of each order (for the auxiliary LM loss). Params are
    `{"backbone", "head"}`, as `WithHead`'s.

    Packed rows (`decoder_positions` and `num_segments` label slots given): causal attention stays
    inside each segment, and the head reads each segment's last token: [batch, num_segments, labels].

    `bilstm_hidden` > 0 is BERT's "LTR + BiLSTM" ablation (Devlin et al., Table 5): a randomly
    initialised BiLSTM (params `bilstm`) over the final states, the head reading its forward half at
    the last real token and its backward half at the first, so the classifier sees both directions
    of context the left-to-right model lacks. Rows are then one example each (no packing)."""
    config: ModelConfig
    num_labels: int
    bilstm_hidden: int = 0

    def setup(self):
        self.backbone = build_module(self.config)
        self.head = H.SequenceClassificationHead(self.config, self.num_labels)
        self.bilstm = BiLSTM(self.bilstm_hidden) if self.bilstm_hidden else None

    def __call__(self, decoder_input_tokens, decoder_segment_ids=None, swapped_decoder_input_tokens=None,
                 swapped_decoder_segment_ids=None, decoder_positions=None, swapped_decoder_positions=None,
                 num_segments: int | None = None, enable_dropout: bool = False, with_lm: bool = False,
                 **unused_features):
        orders = [(decoder_input_tokens, decoder_segment_ids, decoder_positions)]
        if swapped_decoder_input_tokens is not None:
            orders.append((swapped_decoder_input_tokens, swapped_decoder_segment_ids, swapped_decoder_positions))
        pooled, hidden = 0.0, []
        for tokens, segments, positions in orders:
            segments = jnp.ones_like(tokens) if segments is None else segments   # no padding
            x = self.backbone.encode(tokens, segments, positions, enable_dropout=enable_dropout)
            if self.bilstm is not None:
                pooled = pooled + self._bilstm_pool(x, segments, num_segments)
            else:
                pooled = pooled + (H.pool(x, segments > 0, "last") if num_segments is None else
                                   H.pool_segments(x, segments, "last", num_segments))
            hidden.append(x)
        logits = self.head(pooled, not enable_dropout)
        if not with_lm:
            return logits
        return logits, [self.backbone.lm_head(x) for x in hidden]

    def _bilstm_pool(self, x, segments, num_segments):
        """[forward state at the last real token ; backward state at the first] of each row."""
        if num_segments is not None:
            raise ConfigError("GptClassificationObjective.bilstm_hidden reads one example per row: "
                              "set train.pack = False")
        lengths = jnp.sum(segments > 0, axis=-1).astype(jnp.int32)
        states = self.bilstm(x, lengths)
        last = H.pool(states, segments > 0, "last")
        return jnp.concatenate([last[:, :self.bilstm_hidden], states[:, 0, self.bilstm_hidden:]], -1)
