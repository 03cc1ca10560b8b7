"""word2vec's two tables: input vectors (word2vec.c's `syn0`, the word vectors kept at the end) and
output vectors (`syn1neg`, what a word is as a context or negative sample), both [vocab, embed].

Initialised as word2vec.c does: input rows uniform in [-0.5, 0.5) / dim, output rows zero. The
losses over them (skip-gram, CBOW with negative sampling) are t5lite.objectives.word2vec's."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from t5lite.models.layers import param_with_axes


def _word2vec_init(key, shape, dtype=jnp.float32):
    return (jax.random.uniform(key, shape, dtype) - 0.5) / shape[-1]


class Word2Vec(nn.Module):
    """`__call__(encoder_input_tokens)` -> the input vectors of the ids [..., embed];
    `tables()` -> (input, output) tables for the objective."""
    vocab_size: int
    dim: int

    def setup(self):
        self.input_embedding = param_with_axes(self, "input_embedding", _word2vec_init, (self.vocab_size, self.dim),
                                               ("vocab", "embed"))
        self.output_embedding = param_with_axes(self, "output_embedding", nn.initializers.zeros,
                                                (self.vocab_size, self.dim), ("vocab", "embed"))

    def __call__(self, encoder_input_tokens, **unused_features):
        return jnp.take(self.input_embedding, encoder_input_tokens, axis=0)

    def tables(self):
        return self.input_embedding, self.output_embedding
