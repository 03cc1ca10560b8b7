"""Log-likelihoods of given targets under an encoder-decoder: eval loss and rank classification.

Rank classification (T5's "score" mode) asks which of a fixed set of answers (a task's label
strings) the model finds most likely, instead of hoping free decoding spells one of them.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def shift_right(targets: jax.Array) -> jax.Array:
    """Teacher-forcing decoder inputs: 0 (BOS) first, as the enc-dec feature converter makes them."""
    return jnp.pad(targets, ((0, 0), (1, 0)))[:, :-1]


def _target_log_probs(module, params, encoded, encoder_input_tokens, targets) -> jax.Array:
    """[rows, length] log p(target token), 0 on padding."""
    logits = module.apply({"params": params}, encoded, encoder_input_tokens, shift_right(targets), method="decode")
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32))
    picked = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    return jnp.where(targets != 0, picked, 0.0)


@functools.partial(jax.jit, static_argnames="module")
def target_log_likelihood(module, params, encoder_input_tokens, decoder_target_tokens) -> jax.Array:
    """[batch] summed log-probability of each row's (0-padded, EOS-terminated) targets."""
    encoded = module.apply({"params": params}, encoder_input_tokens=encoder_input_tokens, method="encode")
    return _target_log_probs(module, params, encoded, encoder_input_tokens, decoder_target_tokens).sum(axis=-1)


@functools.partial(jax.jit, static_argnames="module")
def rank_candidates(module, params, encoder_input_tokens, candidates) -> jax.Array:
    """[batch, num_candidates] log-likelihood of every candidate target for every input.

    The encoder runs once per input; its output is repeated per candidate for the decoder.
    """
    batch, count = encoder_input_tokens.shape[0], candidates.shape[0]
    encoded = module.apply({"params": params}, encoder_input_tokens=encoder_input_tokens, method="encode")
    repeat = lambda x: jnp.repeat(x, count, axis=0)
    targets = jnp.tile(candidates, (batch, 1))
    log_probs = _target_log_probs(module, params, repeat(encoded), repeat(encoder_input_tokens), targets)
    return log_probs.sum(axis=-1).reshape(batch, count)
