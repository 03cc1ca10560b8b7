"""Skip-Thought (Kiros et al. 2015): one encoder turns a sentence into a vector, and two decoders
with their own parameters generate the previous and the next sentence from that vector.

The encoder is a pooled `BiEncoder` sharing this module's scope, so its params sit at the top level
as a plain encoder run's and `t5lite embed` reads the run like any encoder run; the decoders'
params are under `previous_decoder` and `next_decoder`.

Each decoder is a causal Transformer stack of the encoder's config (its own token and position
embeddings, its own output layer) whose cross-attention reads the sentence vector as a memory of
length one. The paper's GRU decoders see the vector at every step; a softmax over one key is 1, so
cross-attention to it adds W_o W_v h to every position of every layer: the same conditioning at each
step and depth, with the Transformer layer t5lite already has (an encoder-decoder's), where adding
the vector to the decoder's inputs alone would condition only its first layer directly.
"""
from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from t5lite.models import heads as H
from t5lite.models import layers as L
from t5lite.models.config import ModelConfig
from t5lite.models.sentence import BiEncoder
from t5lite.models.transformer import Stack, make_token_embedder


class SentenceDecoder(nn.Module):
    """`(vectors [b, d], decoder_input_tokens [b, l])` -> next-token logits [b, l, vocab] (float32)."""
    config: ModelConfig
    num_layers: int

    def setup(self):
        self.token_embedder = make_token_embedder(self.config)
        self.decoder = Stack(self.config, self.token_embedder, self.num_layers, causal=True, cross=True)
        self.lm_head = H.LmHead(self.config, self.token_embedder)

    def __call__(self, vectors, decoder_input_tokens, enable_dropout: bool = False):
        memory = vectors[:, None, :].astype(L.dtype_of(self.config))
        x = self.decoder(decoder_input_tokens, encoded=memory, encoder_mask=jnp.ones(memory.shape[:2], bool),
                         deterministic=not enable_dropout)
        return self.lm_head(x)


class SkipThought(nn.Module):
    """`embed(tokens)` -> [b, d_model] sentence vectors (the encoder, pooled with `pooling`);
    `decode(vectors, decoder_input_tokens, side)` -> the `side` ('previous' or 'next') decoder's
    logits. The decoders have `decoder_layers` layers (None: as many as the encoder)."""
    config: ModelConfig
    pooling: str = "mean"
    decoder_layers: int | None = None

    def setup(self):
        self.f = BiEncoder(self.config, self.pooling)
        nn.share_scope(self, self.f)
        layers = self.decoder_layers or self.config.num_encoder_layers
        self.previous_decoder = SentenceDecoder(self.config, layers)
        self.next_decoder = SentenceDecoder(self.config, layers)

    def embed(self, tokens, enable_dropout: bool = False):
        return self.f.embed(tokens, enable_dropout)

    def decode(self, vectors, decoder_input_tokens, side: str, enable_dropout: bool = False):
        decoder = {"previous": self.previous_decoder, "next": self.next_decoder}[side]
        return decoder(vectors, decoder_input_tokens, enable_dropout)

    def __call__(self, encoder_input_tokens=None, enable_dropout: bool = False, **features):
        """Initialisation (and a plain call): the embeddings of `text0_input_tokens`, every decoder run."""
        tokens = features.get("text0_input_tokens", encoder_input_tokens)
        vectors = self.embed(tokens, enable_dropout)
        for side in ("previous", "next"):
            self.decode(vectors, tokens[:, :-1], side, enable_dropout)
        return vectors
