"""Log-likelihoods of given targets, for every family: eval loss and rank classification.

An encoder-decoder scores targets after its config's `decoder_start_token_id`; a decoder-only
model scores them as the continuation of a prompt (`decoding.decoder_prompt`), in one forward
pass, with a prefix LM's prompt attended bidirectionally. Targets are right-padded with the
config's pad id; their lengths are `decoder_target_lengths` if given, else the non-pad tokens.

Rank classification (T5's "score" mode) asks which of a fixed set of answers (a task's label
strings) the model finds most likely, instead of hoping free decoding spells one of them.

    scores = token_log_likelihoods(module, params, {"encoder_input_tokens": x}, targets)   # [b, len]
    best = rank_candidates(module, params, {"decoder_prompt_tokens": p}, candidates).argmax(-1)
"""
from __future__ import annotations

import functools
from typing import Mapping

import jax
import jax.numpy as jnp

from t5lite.infer.decoding import decoder_prompt, encode
from t5lite.models import vision


def _target_lengths(config, targets, lengths=None) -> jax.Array:
    return (targets != config.pad_token_id).sum(axis=1) if lengths is None else jnp.asarray(lengths, jnp.int32)


def _pick(logits, targets, lengths) -> jax.Array:
    """[rows, length] log p(target token) from logits [rows, length, vocab]; 0 past each row's end."""
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32))
    picked = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    return jnp.where(jnp.arange(targets.shape[1])[None] < lengths[:, None], picked, 0.0)


def _encoder_decoder_log_probs(module, params, encoded, encoder_input_tokens, targets, lengths) -> jax.Array:
    start = jnp.full((targets.shape[0], 1), module.config.decoder_start_token_id, targets.dtype)
    decoder_inputs = jnp.concatenate([start, targets[:, :-1]], axis=1)
    logits = module.apply({"params": params}, encoded, encoder_input_tokens, decoder_inputs, method="decode")
    return _pick(logits, targets, lengths)


def _decoder_only_log_probs(module, params, prompt, prompt_lengths, targets, lengths) -> jax.Array:
    """Each row's prompt, then its targets right after it, in one causal (or prefix-LM) pass;
    the logits at prompt_length - 1 + j predict target j."""
    rows, width = prompt.shape
    columns = prompt_lengths[:, None] + jnp.arange(targets.shape[1])[None]
    seq = jnp.concatenate([prompt, jnp.zeros_like(targets)], axis=1)
    seq = jax.vmap(lambda s, c, t: s.at[c].set(t))(seq, columns, targets)
    in_prompt = jnp.arange(seq.shape[1])[None] < prompt_lengths[:, None]
    logits = module.apply({"params": params}, decoder_input_tokens=seq,
                          decoder_causal_attention=in_prompt if module.config.prefix_lm else None)
    logits = jnp.take_along_axis(logits, (columns - 1)[..., None], axis=1)
    return _pick(logits, targets, lengths)


def _log_probs(module, params, inputs, targets, lengths, copies: int = 1) -> jax.Array:
    """Per-token log-probs of `targets` [rows, length], each input repeated `copies` times in a row."""
    repeat = lambda x: jnp.repeat(x, copies, axis=0)
    if "encoder_input_tokens" in inputs or vision.IMAGES in inputs:
        encoded, tokens = encode(module, params, inputs)   # once per input
        return _encoder_decoder_log_probs(module, params, repeat(encoded), repeat(tokens), targets, lengths)
    if "decoder_prompt_tokens" in inputs:
        prompt, prompt_lengths = decoder_prompt(module.config, inputs)
        return _decoder_only_log_probs(module, params, repeat(prompt), repeat(prompt_lengths), targets, lengths)
    raise ValueError(f"scoring needs `encoder_input_tokens` (encoder-decoder) or `decoder_prompt_tokens` "
                     f"(decoder-only); got {sorted(inputs)}")


@functools.partial(jax.jit, static_argnames="module")
def token_log_likelihoods(module, params, inputs: Mapping[str, jax.Array], targets,
                          decoder_target_lengths=None) -> jax.Array:
    """[batch, length] log-probability of each target token given the inputs and the targets
    before it; 0 after each row's end."""
    targets = jnp.asarray(targets, jnp.int32)
    lengths = _target_lengths(module.config, targets, decoder_target_lengths)
    return _log_probs(module, params, inputs, targets, lengths)


def target_log_likelihood(module, params, inputs: Mapping[str, jax.Array], targets,
                          decoder_target_lengths=None) -> jax.Array:
    """[batch] summed log-probability of each row's (pad-padded, EOS-terminated) targets."""
    return token_log_likelihoods(module, params, inputs, targets, decoder_target_lengths).sum(axis=-1)


@functools.partial(jax.jit, static_argnames="module")
def rank_candidates(module, params, inputs: Mapping[str, jax.Array], candidates) -> jax.Array:
    """[batch, num_candidates] log-likelihood of every candidate target (pad-padded rows) for
    every input. An encoder runs once per input; its output is repeated per candidate."""
    candidates = jnp.asarray(candidates, jnp.int32)
    count = candidates.shape[0]
    batch = next(iter(inputs.values())).shape[0]
    targets = jnp.tile(candidates, (batch, 1))
    lengths = _target_lengths(module.config, targets)
    return _log_probs(module, params, inputs, targets, lengths, copies=count).sum(axis=-1).reshape(batch, count)
