"""A backbone and one task head as a single module, params `{"backbone": ..., "head": ...}`, so a
checkpoint loaded with `t5lite.interop.hf.load` can be grafted in as `params["backbone"]`.

It builds the backbone, so it sits above transformer.py, which builds on heads.py.
"""
from __future__ import annotations

import flax.linen as nn

from t5lite.models import heads as H
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
