"""ELMo's bidirectional language model (Peters et al., 2018): a character CNN with highway layers and
a projection gives each token a context-free vector; a forward and a backward stack of LSTMs with
projection read the sentence; every layer's output is one contextual representation.

The weights keep the original TensorFlow bilm's layout so its released files load unchanged:
LSTM kernels are [input + projection, 4 * hidden] with the gates in TF's order (input, new memory,
forget, output), a forget bias of 1 added at run time, the cell clipped before the output gate and
the projection clipped after it; the second and later layers add their input to their output (skip
connection). Highway layers compute carry * relu(x W_t + b_t) + (1 - carry) * x, carry =
sigmoid(x W_c + b_c), b_c initialised to -2 as in bilm-tf (bilm/training.py), so that at first the
layers mostly pass x through.

Parameters carry logical axis names (`char_vocab`, `conv_width`, `embed`, `mlp`, `highway`,
`lstm_in`, `lstm_gates`, `lstm_hidden`) like the rest of `t5lite.models`.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from t5lite.models.layers import ACTIVATIONS, param_with_axes
from t5lite.models.recurrent_config import BiLMConfig


# bilm-tf's initialisers (bilm/training.py): characters U(-1, 1); relu convolutions U(-0.05, 0.05)
# (Kim et al.), tanh ones N(0, 1 / (width * char dim)); highway and projection N(0, 1 / fan in),
# the highway carry bias -2;
# LSTM kernels Glorot uniform (TensorFlow's default); the softmax N(0, 1 / projection dim).
def _uniform(scale: float):
    return lambda key, shape, dtype=jnp.float32: jax.random.uniform(key, shape, dtype, -scale, scale)


def _fan_in_normal(fan_in: int):
    return nn.initializers.normal(fan_in ** -0.5)


_lstm_init = nn.initializers.glorot_uniform()


class CharCNN(nn.Module):
    """Char ids [batch, tokens, chars] -> token vectors [batch, tokens, projection_dim]."""
    config: BiLMConfig

    @nn.compact
    def __call__(self, char_ids):
        cfg = self.config
        table = param_with_axes(self, "char_embed", _uniform(1.0), (cfg.n_characters, cfg.char_embed_dim),
                                ("char_vocab", "embed"))
        # Id 0 is padding and embeds to zeros.
        x = jnp.where((char_ids > 0)[..., None], table[char_ids], 0.0)
        pooled = []
        for k, (width, n) in enumerate(cfg.filters):
            init = _uniform(0.05) if cfg.activation == "relu" else _fan_in_normal(width * cfg.char_embed_dim)
            w = param_with_axes(self, f"conv_{k}_kernel", init, (width, cfg.char_embed_dim, n),
                                ("conv_width", "embed", "mlp"))
            b = param_with_axes(self, f"conv_{k}_bias", nn.initializers.zeros, (n,), ("mlp",))
            windows = x.shape[-2] - width + 1
            conv = sum(jnp.einsum("btce,ef->btcf", x[..., i:i + windows, :], w[i]) for i in range(width))
            pooled.append(jnp.max(conv + b, axis=-2))
        h = ACTIVATIONS[cfg.activation](jnp.concatenate(pooled, -1))
        dim = h.shape[-1]
        for k in range(cfg.n_highway):
            def p(name, init, shape, axes, k=k):
                return param_with_axes(self, f"highway_{k}_{name}", init, shape, axes)
            carry = nn.sigmoid(h @ p("carry_kernel", _fan_in_normal(dim), (dim, dim), ("highway", "mlp"))
                               + p("carry_bias", nn.initializers.constant(-2.0), (dim,), ("mlp",)))
            transform = nn.relu(h @ p("transform_kernel", _fan_in_normal(dim), (dim, dim), ("highway", "mlp"))
                                + p("transform_bias", nn.initializers.zeros, (dim,), ("mlp",)))
            h = carry * transform + (1.0 - carry) * h
        w = param_with_axes(self, "proj_kernel", _fan_in_normal(dim), (dim, cfg.projection_dim), ("mlp", "embed"))
        b = param_with_axes(self, "proj_bias", nn.initializers.zeros, (cfg.projection_dim,), ("embed",))
        return h @ w + b


def lstm_step(params: dict, carry, x, *, cell_clip=None, proj_clip=None):
    """One step of an LSTM with projection (TF's LSTMCell): carry (c [B, hidden], h [B, proj])."""
    c, h = carry
    z = jnp.concatenate([x, h], -1) @ params["kernel"] + params["bias"]
    i, j, f, o = jnp.split(z, 4, axis=-1)
    c = nn.sigmoid(f + 1.0) * c + nn.sigmoid(i) * jnp.tanh(j)
    if cell_clip is not None:
        c = jnp.clip(c, -cell_clip, cell_clip)
    h = (nn.sigmoid(o) * jnp.tanh(c)) @ params["proj"]
    if proj_clip is not None:
        h = jnp.clip(h, -proj_clip, proj_clip)
    return c, h


def reverse_within_lengths(x, lengths):
    """Reverse each row's first `lengths[b]` steps (tf.reverse_sequence), x [B, T, ...]."""
    t = jnp.arange(x.shape[1])[None, :]
    idx = jnp.where(t < lengths[:, None], lengths[:, None] - 1 - t, t)
    return jnp.take_along_axis(x, idx.reshape(idx.shape + (1,) * (x.ndim - 2)), axis=1)


class LSTMLayer(nn.Module):
    """One LSTM with projection over [B, T, in]; steps past a row's length keep its state and
    output zeros, so the final state is the state after the last real token."""
    config: BiLMConfig
    input_dim: int

    @nn.compact
    def __call__(self, x, lengths, initial):
        cfg = self.config
        params = {
            "kernel": param_with_axes(self, "kernel", _lstm_init,
                                      (self.input_dim + cfg.projection_dim, 4 * cfg.lstm_dim),
                                      ("lstm_in", "lstm_gates")),
            "bias": param_with_axes(self, "bias", nn.initializers.zeros, (4 * cfg.lstm_dim,),
                                    ("lstm_gates",)),
            "proj": param_with_axes(self, "proj", _lstm_init, (cfg.lstm_dim, cfg.projection_dim),
                                    ("lstm_hidden", "embed")),
        }

        step = lambda carry, x_t: lstm_step(params, carry, x_t, cell_clip=cfg.cell_clip, proj_clip=cfg.proj_clip)
        return masked_scan(step, initial, x, lengths)


def masked_scan(step, initial, x, lengths):
    """Runs `step((c, h), x_t) -> (c, h)` over x [B, T, in]; steps past a row's length keep its
    state and output zeros. Returns (outputs h [B, T, out], final (c, h))."""
    def masked(carry, inputs):
        x_t, valid = inputs
        new = step(carry, x_t)
        carry = tuple(jnp.where(valid[:, None], n, o) for n, o in zip(new, carry))
        return carry, jnp.where(valid[:, None], new[1], 0.0)

    valid = jnp.arange(x.shape[1])[:, None] < lengths[None, :]
    final, out = jax.lax.scan(masked, initial, (jnp.swapaxes(x, 0, 1), valid))
    return jnp.swapaxes(out, 0, 1), final


class BiLM(nn.Module):
    """Char ids [B, T, chars] and lengths [B] (boundary tokens included) -> (layers
    [n_layers + 1, B, T, 2 * projection_dim], final states). Layer 0 is the token vector twice;
    layer k the forward and backward outputs of LSTM layer k. `initial_states` (as returned,
    [direction][layer] = (c, h)) continues from an earlier batch; None starts from zeros.
    `enable_dropout` drops each LSTM layer's input (bilm-tf's DropoutWrapper) at `dropout_rate`."""
    config: BiLMConfig

    @nn.compact
    def __call__(self, char_ids, lengths, initial_states=None, enable_dropout: bool = False):
        cfg = self.config
        tokens = CharCNN(cfg, name="char_cnn")(char_ids)
        batch = char_ids.shape[0]
        if initial_states is None:
            zeros = (jnp.zeros((batch, cfg.lstm_dim)), jnp.zeros((batch, cfg.projection_dim)))
            initial_states = [[zeros] * cfg.n_layers for _ in range(2)]
        outputs = [[tokens, tokens]] + [[] for _ in range(cfg.n_layers)]
        finals = []
        for d, direction in enumerate(("forward", "backward")):
            h = tokens if d == 0 else reverse_within_lengths(tokens, lengths)
            states = []
            for layer in range(cfg.n_layers):
                dropped = nn.Dropout(cfg.dropout_rate, deterministic=not enable_dropout)(h)
                out, state = LSTMLayer(cfg, cfg.projection_dim, name=f"{direction}_{layer}")(
                    dropped, lengths, initial_states[d][layer])
                if cfg.use_skip_connections and layer > 0:
                    out = out + h
                states.append(state)
                outputs[layer + 1].append(out if d == 0 else reverse_within_lengths(out, lengths))
                h = out
            finals.append(states)
        return jnp.stack([jnp.concatenate(pair, -1) for pair in outputs]), finals



def bilm_inputs(tokens, flat_chars):
    """(char ids [B, T, 50], lengths [B]) of the word-LM features."""
    lengths = jnp.sum(tokens != 0, axis=-1).astype(jnp.int32)
    return flat_chars.reshape(tokens.shape + (-1,)), lengths


class BiLMLanguageModel(nn.Module):
    """The biLM with its pre-training head: one word softmax shared by both directions (bilm-tf).
    The word-LM features (t5lite.data.word_converters, `word_lm_chars`): word ids [B, T] (0 after
    each sentence; they give the lengths) and char ids [B, T * 50] -> (forward logits, backward
    logits), each [B, T, vocab]: position t's forward logits predict token t + 1, its backward
    logits token t - 1. The biLM's params are `params["bilm"]` (what `t5lite.interop.elmo` reads
    and writes)."""
    config: BiLMConfig

    @nn.compact
    def __call__(self, encoder_input_tokens, encoder_input_chars, enable_dropout: bool = False,
                 logits: bool = True):
        """`logits=False` returns the (forward, backward) top states [B, T, projection] instead, for
        a sampled softmax over `params["softmax_kernel"]` and `["softmax_bias"]`."""
        cfg = self.config
        layers, _ = BiLM(cfg, name="bilm")(*bilm_inputs(encoder_input_tokens, encoder_input_chars),
                                           enable_dropout=enable_dropout)
        top = nn.Dropout(cfg.dropout_rate, deterministic=not enable_dropout)(layers[-1])
        kernel = param_with_axes(self, "softmax_kernel", _fan_in_normal(cfg.projection_dim), (cfg.projection_dim, cfg.vocab_size),
                                 ("embed", "vocab"))
        bias = param_with_axes(self, "softmax_bias", nn.initializers.zeros, (cfg.vocab_size,), ("vocab",))
        forward, backward = jnp.split(top, 2, axis=-1)
        if not logits:
            return forward, backward
        return forward @ kernel + bias, backward @ kernel + bias
