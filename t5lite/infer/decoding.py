"""Autoregressive decoding with a KV cache: temperature sampling (greedy as T -> 0) and beam search.

Every decode is one jitted function. The encoder of an encoder-decoder runs once and its output
is repeated per sample or beam; a `jax.lax.while_loop` then feeds one token per step through
the cached decoder and stops as soon as every sequence has produced EOS. Tokens after EOS are 0.

Inputs are a dict: `encoder_input_tokens` [batch, length] for an encoder-decoder, or
`decoder_prompt_tokens` [batch, length] (left-aligned, 0-padded, may be all 0) for a
decoder-only model, whose prompt is fed through the cache one token per step (forced, unscored)
because the cache's write index is shared by the whole batch. Results hold the continuation only.

    out = greedy(module, params, {"encoder_input_tokens": x}, max_decode_length=32)
    out.tokens  # [batch, 32]
    out = beam_search(module, params, inputs, max_decode_length=32)   # tokens [batch, 4, 32], best first
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp

from t5lite import models

PAD_ID, EOS_ID = 0, 1
# Finite, so dead beams and masked logits never turn arithmetic into nan.
NEG_INF = -1.0e10
GREEDY_TEMPERATURE = 1e-4   # at or below this, sampling is argmax (T5X's convention)


class DecodeResult(NamedTuple):
    tokens: jax.Array   # [batch, n, max_decode_length] ([batch, length] from `greedy`), best first
    scores: jax.Array   # [batch, n]: log-probability; for beam search divided by the brevity penalty


class _Model(NamedTuple):
    """A model seen as a decoding step over a cache, for `rows` sequences of `length` tokens."""
    step: Callable[[Any, jax.Array], tuple[jax.Array, Any]]   # (cache, tokens [rows, 1]) -> logits [rows, vocab]
    cache: Any
    batch_axes: Any          # per cache leaf: the axis holding the rows, or -1
    prompt: jax.Array        # [rows, prompt_length] forced first tokens (width 0 for encoder-decoders)
    prompt_lengths: jax.Array  # [rows]
    length: int              # prompt_length + max_decode_length


def _batch_axes(make_cache: Callable[[int], Any]) -> Any:
    """Which axis of each cache leaf is the batch: the one that grows with it (shapes only).

    Found from shapes rather than leaf names so any cache layout (scanned layers put a layers
    axis first) reorders correctly under beam search.
    """
    one, two = (jax.eval_shape(functools.partial(make_cache, rows)) for rows in (1, 2))

    def axis(a, b):
        diff = [i for i, (x, y) in enumerate(zip(a.shape, b.shape)) if x != y]
        return diff[0] if diff else -1
    return jax.tree.map(axis, one, two)


def _prepare(module, params, inputs: Mapping[str, jax.Array], copies: int, max_decode_length: int) -> _Model:
    """Encodes once (encoder-decoder), repeats every row `copies` times and allocates the cache."""
    if "encoder_input_tokens" in inputs:
        return _prepare_encoder_decoder(module, params, inputs["encoder_input_tokens"], copies, max_decode_length)
    if "decoder_prompt_tokens" in inputs:
        return _prepare_decoder(module, params, inputs["decoder_prompt_tokens"], copies, max_decode_length)
    raise ValueError(f"decoding needs `encoder_input_tokens` (encoder-decoder) or `decoder_prompt_tokens` "
                     f"(decoder-only); got {sorted(inputs)}")


def _prepare_encoder_decoder(module, params, tokens, copies: int, max_decode_length: int) -> _Model:
    encoded = module.apply({"params": params}, encoder_input_tokens=tokens, method="encode")
    encoded, tokens = jnp.repeat(encoded, copies, axis=0), jnp.repeat(tokens, copies, axis=0)

    def make_cache(rows):
        return models.init_cache(module, params, max_decode_length, encoded=encoded[:rows],
                                 encoder_input_tokens=tokens[:rows])

    def step(cache, token):
        logits, state = module.apply({"params": params, "cache": cache}, encoded, tokens, token, method="decode",
                                     decode=True, mutable=["cache"])
        return logits[:, -1].astype(jnp.float32), state["cache"]

    rows = tokens.shape[0]
    return _Model(step, make_cache(rows), _batch_axes(make_cache), jnp.zeros((rows, 0), jnp.int32),
                  jnp.zeros(rows, jnp.int32), max_decode_length)


def _prepare_decoder(module, params, prompt, copies: int, max_decode_length: int) -> _Model:
    prompt = jnp.repeat(prompt.astype(jnp.int32), copies, axis=0)
    length = prompt.shape[1] + max_decode_length

    def make_cache(rows):
        return models.init_cache(module, params, length, batch_size=rows)

    def step(cache, token):
        logits, state = module.apply({"params": params, "cache": cache}, decoder_input_tokens=token, decode=True,
                                     mutable=["cache"])
        return logits[:, -1].astype(jnp.float32), state["cache"]

    return _Model(step, make_cache(prompt.shape[0]), _batch_axes(make_cache), prompt,
                  (prompt != PAD_ID).sum(axis=1).astype(jnp.int32), length)


def _initial_sequences(model: _Model) -> jax.Array:
    """[rows, 1 + length]: the BOS 0 the decoder starts from, then the prompt, then zeros."""
    seq = jnp.zeros((model.prompt.shape[0], model.length + 1), jnp.int32)
    return seq.at[:, 1:1 + model.prompt.shape[1]].set(model.prompt)


def _continuations(seq: jax.Array, prompt_lengths: jax.Array, max_decode_length: int) -> jax.Array:
    """The `max_decode_length` tokens after each row's prompt (seq without its BOS column)."""
    columns = 1 + prompt_lengths[:, None] + jnp.arange(max_decode_length)[None]
    return jnp.take_along_axis(seq, columns, axis=1)


# ----------------------------------------------------------------------------- sampling

def filter_logits(logits: jax.Array, top_k=0, top_p=0.0) -> jax.Array:
    """Masks all but the `top_k` largest logits and all but the smallest set of most likely tokens
    whose probability reaches `top_p` (a token is kept while the mass before it is below p).
    0 turns either filter off; both may be traced values, so changing them does not recompile."""
    vocab = logits.shape[-1]
    ordered = jnp.sort(logits, axis=-1)[..., ::-1]
    probs = jax.nn.softmax(ordered, axis=-1)
    keep_p = jnp.sum(jnp.cumsum(probs, axis=-1) - probs < top_p, axis=-1, keepdims=True)
    keep = jnp.minimum(jnp.where(top_k > 0, top_k, vocab), jnp.where(top_p > 0, keep_p, vocab))
    cutoff = jnp.take_along_axis(ordered, jnp.broadcast_to(keep - 1, logits.shape[:-1] + (1,)), axis=-1)
    return jnp.where(logits < cutoff, NEG_INF, logits)


def _choose(logits, rng, temperature, top_k, top_p) -> jax.Array:
    def sample():
        return jax.random.categorical(rng, filter_logits(logits / temperature, top_k, top_p), axis=-1)
    argmax = lambda: jnp.argmax(logits, axis=-1)
    return jax.lax.cond(temperature <= GREEDY_TEMPERATURE, argmax, sample).astype(jnp.int32)


def _sample_loop(model: _Model, rng, temperature, top_k, top_p, eos_id) -> tuple[jax.Array, jax.Array]:
    """(sequences [rows, 1 + length], log-probabilities [rows]); the score uses the model's own
    (untempered, unfiltered) distribution, so samples from different settings compare."""
    rows = model.prompt.shape[0]

    def cond(state):
        i, _, _, done, _, _ = state
        return (i < model.length) & ~jnp.all(done)

    def body(state):
        i, seq, cache, done, logp, rng = state
        logits, cache = model.step(cache, jax.lax.dynamic_slice_in_dim(seq, i, 1, axis=1))
        rng, key = jax.random.split(rng)
        forced = i < model.prompt_lengths
        token = jnp.where(forced, seq[:, i + 1], _choose(logits, key, temperature, top_k, top_p))
        token = jnp.where(done, PAD_ID, token)
        token_logp = jnp.take_along_axis(jax.nn.log_softmax(logits), token[:, None], axis=-1)[:, 0]
        logp = logp + jnp.where(forced | done, 0.0, token_logp)
        done = done | (~forced & (token == eos_id))
        return i + 1, seq.at[:, i + 1].set(token), cache, done, logp, rng

    state = (jnp.zeros((), jnp.int32), _initial_sequences(model), model.cache, jnp.zeros(rows, bool),
             jnp.zeros(rows, jnp.float32), rng)
    _, seq, _, _, logp, _ = jax.lax.while_loop(cond, body, state)
    return seq, logp


def temperature_sample(module, params, inputs: Mapping[str, jax.Array], rng, *, max_decode_length: int,
                       temperature=1.0, top_k=0, top_p=0.0, num_decodes: int = 1, eos_id=EOS_ID) -> DecodeResult:
    """`num_decodes` samples per input, ranked by log-probability (argmax at temperature <= 1e-4).

    Only the module and the shapes are static: other temperatures, filters or EOS ids reuse the
    compiled function."""
    if not jnp.issubdtype(jnp.asarray(rng).dtype, jax.dtypes.prng_key):
        rng = jax.random.wrap_key_data(rng)
    return _temperature_sample(module, params, inputs, rng, jnp.float32(temperature), jnp.int32(top_k),
                               jnp.float32(top_p), jnp.int32(eos_id), max_decode_length=max_decode_length,
                               num_decodes=num_decodes)


@functools.partial(jax.jit, static_argnames=("module", "max_decode_length", "num_decodes"))
def _temperature_sample(module, params, inputs, rng, temperature, top_k, top_p, eos_id, *, max_decode_length,
                        num_decodes) -> DecodeResult:
    model = _prepare(module, params, inputs, num_decodes, max_decode_length)
    seq, logp = _sample_loop(model, rng, temperature, top_k, top_p, eos_id)
    tokens = _continuations(seq, model.prompt_lengths, max_decode_length)
    tokens = tokens.reshape(-1, num_decodes, max_decode_length)
    logp = logp.reshape(-1, num_decodes)
    order = jnp.argsort(-logp, axis=1)
    return DecodeResult(jnp.take_along_axis(tokens, order[..., None], axis=1), jnp.take_along_axis(logp, order, axis=1))


def greedy(module, params, inputs: Mapping[str, jax.Array], *, max_decode_length: int,
           eos_id: int = EOS_ID) -> DecodeResult:
    """Argmax decoding: tokens [batch, max_decode_length], scores [batch] (sum of log-probs)."""
    out = temperature_sample(module, params, inputs, jax.random.key(0), max_decode_length=max_decode_length,
                             temperature=0.0, eos_id=eos_id)
    return DecodeResult(out.tokens[:, 0], out.scores[:, 0])


# ----------------------------------------------------------------------------- beam search

def brevity_penalty(length, alpha: float = 0.6):
    """T5X's length normalisation ((5 + length) / 6) ** alpha; beam scores are log-prob / penalty."""
    return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def _gather_beams(tree, indices: jax.Array, batch_axes=None):
    """Picks beams: `indices` [batch, n] into each leaf's [batch, beams, ...] (or, given
    `batch_axes`, into the flattened batch * beams axis of each cache leaf)."""
    if batch_axes is None:
        return jax.tree.map(lambda x: jnp.take_along_axis(x, indices.reshape(indices.shape + (1,) * (x.ndim - 2)),
                                                          axis=1), tree)
    beams = indices.shape[1]
    flat = (indices + beams * jnp.arange(indices.shape[0])[:, None]).reshape(-1)
    return jax.tree.map(lambda x, axis: x if axis < 0 else jnp.take(x, flat, axis=axis), tree, batch_axes)


def _top(scores, n: int, *trees):
    """The `n` best entries along axis 1 of `scores` and of every tree (same leading shape)."""
    best, index = jax.lax.top_k(scores, n)
    return best, *(_gather_beams(t, index) for t in trees)


class _Beams(NamedTuple):
    i: jax.Array             # tokens fed so far
    alive: jax.Array         # [batch, beams, 1 + length]
    alive_logp: jax.Array    # [batch, beams]
    finished: jax.Array      # [batch, beams, 1 + length]
    finished_scores: jax.Array  # [batch, beams], penalised; NEG_INF where empty
    finished_flags: jax.Array   # [batch, beams]
    cache: Any


def _beam_step(model: _Model, state: _Beams, beams: int, alpha: float, eos_id: int) -> _Beams:
    """Extends every alive beam by every token, keeps the best `beams` that did not end and adds
    the ones that ended with EOS within the top `beams` ranks to the finished set."""
    batch = state.alive.shape[0]
    i = state.i
    tokens_in = state.alive[:, :, i].reshape(-1, 1)
    logits, cache = model.step(state.cache, tokens_in)
    logp = jax.nn.log_softmax(logits).reshape(batch, beams, -1)
    vocab = logp.shape[-1]
    prompt_lengths = model.prompt_lengths.reshape(batch, beams)[:, :1]
    forced = i < prompt_lengths   # [batch, 1]: the whole row is still inside its prompt
    forced_logp = jnp.where(jnp.arange(vocab) == state.alive[:, :, i + 1, None], 0.0, NEG_INF)
    candidates = (state.alive_logp[..., None] + jnp.where(forced[..., None], forced_logp, logp)).reshape(batch, -1)

    top_logp, top_index = jax.lax.top_k(candidates, 2 * beams)
    source, token = top_index // vocab, (top_index % vocab).astype(jnp.int32)
    extended = _gather_beams(state.alive, source).at[:, :, i + 1].set(token)
    ended = (token == eos_id) & ~forced

    alive_logp, alive, alive_source = _top(jnp.where(ended, NEG_INF, top_logp), beams, extended, source)
    generated = i + 1 - prompt_lengths
    new_scores = top_logp / brevity_penalty(generated, alpha)
    admitted = ended & (jnp.arange(2 * beams) < beams)
    scores = jnp.concatenate([jnp.where(state.finished_flags, state.finished_scores, NEG_INF),
                              jnp.where(admitted, new_scores, NEG_INF)], axis=1)
    finished_scores, finished, flags = _top(scores, beams, jnp.concatenate([state.finished, extended], axis=1),
                                            jnp.concatenate([state.finished_flags, admitted], axis=1))
    return _Beams(i + 1, alive, alive_logp, finished, finished_scores, flags,
                  _gather_beams(cache, alive_source, model.batch_axes))


def _beam_search_done(model: _Model, state: _Beams, beams: int, alpha: float) -> jax.Array:
    """True when every row has `beams` finished hypotheses that no alive beam can still beat
    (an alive beam's log-prob only falls, and the penalty is largest at the full length)."""
    batch = state.alive.shape[0]
    prompt_lengths = model.prompt_lengths.reshape(batch, beams)[:, 0]
    best_possible = state.alive_logp.max(axis=1) / brevity_penalty(model.length - prompt_lengths, alpha)
    worst_finished = jnp.where(state.finished_flags, state.finished_scores, NEG_INF).min(axis=1)
    return jnp.all(state.finished_flags.all(axis=1) & (best_possible <= worst_finished))


def beam_search(module, params, inputs: Mapping[str, jax.Array], *, max_decode_length: int, num_beams: int = 4,
                alpha=0.6, eos_id=EOS_ID) -> DecodeResult:
    """Beam search: tokens [batch, num_beams, max_decode_length], best first; scores are summed
    log-probabilities over the brevity penalty ((5 + len) / 6) ** alpha, len counting EOS.

    Finished hypotheses rank before ones cut off at `max_decode_length` (scored at that length).
    """
    return _beam_search(module, params, inputs, jnp.float32(alpha), jnp.int32(eos_id),
                        max_decode_length=max_decode_length, num_beams=num_beams)


@functools.partial(jax.jit, static_argnames=("module", "max_decode_length", "num_beams"))
def _beam_search(module, params, inputs, alpha, eos_id, *, max_decode_length, num_beams) -> DecodeResult:
    model = _prepare(module, params, inputs, num_beams, max_decode_length)
    batch = model.prompt.shape[0] // num_beams
    start = _initial_sequences(model).reshape(batch, num_beams, -1)
    first_beam_only = jnp.where(jnp.arange(num_beams) == 0, 0.0, NEG_INF)
    state = _Beams(jnp.zeros((), jnp.int32), start, jnp.broadcast_to(first_beam_only, (batch, num_beams)),
                   jnp.zeros_like(start), jnp.full((batch, num_beams), NEG_INF), jnp.zeros((batch, num_beams), bool),
                   model.cache)
    state = jax.lax.while_loop(
        lambda s: (s.i < model.length) & ~_beam_search_done(model, s, num_beams, alpha),
        lambda s: _beam_step(model, s, num_beams, alpha, eos_id), state)

    prompt_lengths = model.prompt_lengths.reshape(batch, num_beams)
    alive_scores = state.alive_logp / brevity_penalty(state.i - prompt_lengths, alpha)
    sequences = jnp.concatenate([state.finished, state.alive], axis=1)
    scores = jnp.concatenate([state.finished_scores, alive_scores], axis=1)
    unfinished = jnp.concatenate([~state.finished_flags, jnp.ones_like(state.finished_flags)], axis=1)
    order = jnp.lexsort((-scores, unfinished.astype(jnp.int32)), axis=1)[:, :num_beams]
    sequences = _gather_beams(sequences, order).reshape(batch * num_beams, -1)
    tokens = _continuations(sequences, model.prompt_lengths, max_decode_length)
    return DecodeResult(tokens.reshape(batch, num_beams, max_decode_length), jnp.take_along_axis(scores, order, axis=1))
