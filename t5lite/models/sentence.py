"""A Sentence-BERT bi-encoder: any model's encoder (BERT-style, or T5's), pooled into one vector
per text, and for NLI-style training a softmax classifier over (u, v, |u - v|).

The backbone shares this module's scope, so its params sit at the top level exactly as in the
plain model's checkpoint (the encoder's part of it): a bi-encoder starts from, and is read back
as, an ordinary t5lite run. The classifier, when there is one, adds `classifier`.
"""
from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from t5lite.errors import ConfigError
from t5lite.models import heads as H
from t5lite.models.config import ModelConfig
from t5lite.models.transformer import build_module

SENTENCE_POOLINGS = ("mean", "cls", "max")


def classifier_features(u, v):
    """The classifier's input: (u, v, |u - v|), Sentence-BERT's NLI setting."""
    return jnp.concatenate([u, v, jnp.abs(u - v)], axis=-1)


class BiEncoder(nn.Module):
    """`embed(tokens)` -> [batch, d_model] float32 pooled hidden states (padding excluded);
    `classify(u, v)` -> [batch, num_labels] logits (num_labels > 0)."""
    config: ModelConfig
    pooling: str = "mean"
    num_labels: int = 0

    def setup(self):
        if self.config.arch == "decoder":
            raise ConfigError("a bi-encoder needs an encoder: use an encoder or encoder-decoder preset, not "
                              f"{self.config.arch}-only")
        if self.pooling not in SENTENCE_POOLINGS:
            raise ConfigError(f"pooling={self.pooling!r}: expected one of {SENTENCE_POOLINGS}")
        self.backbone = build_module(self.config)
        nn.share_scope(self, self.backbone)
        if self.num_labels:
            self.classifier = H._dense(self.config, self.num_labels, ("embed", "classes"), "classifier",
                                       (3 * self.config.d_model) ** -0.5)

    def embed(self, tokens, enable_dropout: bool = False):
        hidden = self.backbone.encode(encoder_input_tokens=tokens, enable_dropout=enable_dropout)
        return H.pool(hidden.astype(jnp.float32), tokens != self.config.pad_token_id, self.pooling)

    def classify(self, u, v):
        return self.classifier(classifier_features(u, v)).astype(jnp.float32)

    def __call__(self, encoder_input_tokens=None, enable_dropout: bool = False, **features):
        """Initialisation (and a plain call): the first text column's embeddings."""
        tokens = features.get("text0_input_tokens", encoder_input_tokens)
        u = self.embed(tokens, enable_dropout)
        if self.num_labels:
            self.classify(u, u)
        return u


class TwoEncoders(nn.Module):
    """Quick-Thought's encoders f and g: two `BiEncoder`s of one config. f shares this module's
    scope (its params sit at the top level, as a plain encoder run's), so `t5lite embed` reads f
    from the run like any encoder; g's params are under `context`. `embed` is f, `embed_context` g."""
    config: ModelConfig
    pooling: str = "mean"

    def setup(self):
        self.f = BiEncoder(self.config, self.pooling)
        nn.share_scope(self, self.f)
        self.context = BiEncoder(self.config, self.pooling)

    def embed(self, tokens, enable_dropout: bool = False):
        return self.f.embed(tokens, enable_dropout)

    def embed_context(self, tokens, enable_dropout: bool = False):
        return self.context.embed(tokens, enable_dropout)

    def __call__(self, encoder_input_tokens=None, enable_dropout: bool = False, **features):
        tokens = features.get("text0_input_tokens", encoder_input_tokens)
        self.embed_context(tokens, enable_dropout)
        return self.embed(tokens, enable_dropout)
