"""Autoregressive decoding with a KV cache: temperature sampling (greedy as T -> 0), token for
token what Hugging Face `generate` produces on the same weights, and beam search by T5X's rules
(`rules="t5x"`, the default) or Hugging Face's (`rules="hf"`), beam for beam either one's.

Every decode is one jitted function. Start, EOS and pad ids come from the model config
(`decoder_start_token_id`, `eos_token_id`, `pad_token_id`). An encoder-decoder's encoder and
cross-attention keys/values run once per input and are shared by its samples or beams; its
decoder starts from the start token. A decoder-only model's prompts are prefilled once per input
in one pass (bidirectionally for a `prefix_lm`) and the cache is repeated per sample or beam;
each row writes its next token at its own cache slot, right after its own prompt. A
`jax.lax.while_loop` feeds one token per step and stops once every row has produced EOS or
`max_decode_length` tokens; tokens after EOS are the pad id and add nothing to the score.

Inputs are a dict: `encoder_input_tokens` [batch, length] for an encoder-decoder, or
`decoder_prompt_tokens` [batch, length] (left-aligned) with optional `decoder_prompt_lengths`
[batch] (else the tokens that are not the pad id) for a decoder-only model. The prompt is fed as
given (GPT-2 has no start token); an empty prompt starts from the start token (GPT-2's BOS).
Results hold the continuation only.

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
from t5lite.errors import ConfigError
from t5lite.models import vision
from t5lite.models.config import ModelConfig

# Finite, so dead beams and masked logits never turn arithmetic into nan.
NEG_INF = -1.0e10
GREEDY_TEMPERATURE = 1e-4   # at or below this, sampling is argmax (T5X's convention)


class DecodeResult(NamedTuple):
    tokens: jax.Array   # [batch, n, max_decode_length] ([batch, length] from `greedy`), best first
    scores: jax.Array   # [batch, n]: log-probability; for beam search divided by the brevity penalty


class _Model(NamedTuple):
    """A model seen as a decoding step over a cache, for `rows` sequences."""
    step: Callable[[Any, jax.Array], tuple[jax.Array, Any]]   # (cache, tokens [rows, 1]) -> logits [rows, vocab]
    logits: jax.Array        # [rows, vocab]: the distribution of the first generated token
    cache: Any               # holding the start token or the prompt
    batch_axes: Any          # per cache leaf: the axis holding the rows, or -1
    config: ModelConfig
    prompt_lengths: jax.Array   # [inputs]: a decoder-only model's prompt tokens as given; 0 for an encoder-decoder
    seen: jax.Array          # [rows, vocab]: the tokens already in each row (its prompt, or the start token)


def given_prompt_lengths(config: ModelConfig, inputs: Mapping[str, jax.Array]) -> jax.Array:
    """[batch] tokens of each decoder-only prompt as given (0 for an empty one):
    `decoder_prompt_lengths`, or else the tokens that are not the pad id (id 0 can be a real token)."""
    lengths = inputs.get("decoder_prompt_lengths")
    if lengths is not None:
        return jnp.asarray(lengths, jnp.int32)
    return (jnp.asarray(inputs["decoder_prompt_tokens"]) != config.pad_token_id).sum(axis=1).astype(jnp.int32)


def decoder_prompt(config: ModelConfig, inputs: Mapping[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
    """A decoder-only model's (prompt [batch, >= 1], lengths [batch]): lengths as
    `given_prompt_lengths`, except that an empty row becomes the start token alone."""
    prompt = jnp.asarray(inputs["decoder_prompt_tokens"], jnp.int32)
    if prompt.shape[1] == 0:
        prompt = jnp.full((prompt.shape[0], 1), config.pad_token_id, jnp.int32)
    lengths = given_prompt_lengths(config, inputs)
    empty = lengths == 0
    prompt = prompt.at[:, 0].set(jnp.where(empty, config.decoder_start_token_id, prompt[:, 0]))
    return prompt, jnp.where(empty, 1, lengths).astype(jnp.int32)


def tokens_seen(tokens: jax.Array, lengths: jax.Array, vocab: int) -> jax.Array:
    """[rows, vocab] True at each token among a row's first `lengths` tokens."""
    in_row = jnp.arange(tokens.shape[1])[None] < lengths[:, None]
    return jnp.zeros((tokens.shape[0], vocab), bool).at[jnp.arange(tokens.shape[0])[:, None], tokens].max(in_row)


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


def _check_positions(config: ModelConfig, length: int, what: str):
    """A learned position table silently clamps positions past its end: refuse instead."""
    config = config.decoder_config() if config.arch == "encoder_decoder" else config
    if config.position_encoding == "learned" and length > config.max_position_embeddings:
        raise ConfigError(f"{what} = {length} decoder positions, but the model has max_position_embeddings="
                          f"{config.max_position_embeddings}; shorten the prompt or max_decode_length")


def _prepare(module, params, inputs: Mapping[str, jax.Array], copies: int, max_decode_length: int) -> _Model:
    """Encodes once (encoder-decoder) or prefills the prompts (decoder-only), every row repeated
    `copies` times, and returns the first distribution with the cache."""
    if "encoder_input_tokens" in inputs or vision.IMAGES in inputs:
        _check_positions(module.config, max_decode_length, "max_decode_length")
        return _prepare_encoder_decoder(module, params, inputs, copies, max_decode_length)
    if "decoder_prompt_tokens" in inputs:
        width = max(inputs["decoder_prompt_tokens"].shape[1], 1)
        _check_positions(module.config, width + max_decode_length - 1,
                         f"prompt width {width} + max_decode_length {max_decode_length} - 1")
        return _prepare_decoder(module, params, inputs, copies, max_decode_length)
    raise ValueError(f"decoding needs `encoder_input_tokens` or `{vision.IMAGES}` (encoder-decoder) or "
                     f"`decoder_prompt_tokens` (decoder-only); got {sorted(inputs)}")


def encode(module, params, inputs: Mapping[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
    """An encoder-decoder's (encoder states, the tokens its decoder masks them by) for `inputs`:
    `encoder_input_tokens`, or an image model's `encoder_input_images` (every position attended)."""
    images = inputs.get(vision.IMAGES)
    tokens = inputs["encoder_input_tokens"] if images is None else vision.position_tokens(module.config, images)
    extra = {} if images is None else {vision.IMAGES: images}
    return module.apply({"params": params}, encoder_input_tokens=tokens, **extra, method="encode"), tokens


def _prepare_encoder_decoder(module, params, inputs, copies: int, max_decode_length: int) -> _Model:
    """The encoder and its cross-attention keys/values run once per input; its `copies` decodes
    read them in place (never repeated, never reordered by beam search)."""
    cfg = module.config
    encoded, tokens = encode(module, params, inputs)

    def make_cache(rows, inputs=1):   # the start token, then max_decode_length tokens fed back
        return models.init_cache(module, params, max_decode_length + 1, encoded=encoded[:inputs],
                                 encoder_input_tokens=tokens[:inputs], batch_size=rows)

    def step(cache, token):
        logits, state = module.apply({"params": params, "cache": cache}, encoded, tokens, token, method="decode",
                                     decode=True, mutable=["cache"])
        return logits[:, -1].astype(jnp.float32), state["cache"]

    rows = tokens.shape[0] * copies
    start = jnp.full((rows, 1), cfg.decoder_start_token_id, jnp.int32)
    logits, cache = step(make_cache(rows, tokens.shape[0]), start)
    return _Model(step, logits, cache, _batch_axes(make_cache), cfg, jnp.zeros(tokens.shape[0], jnp.int32),
                  tokens_seen(start, jnp.ones(rows, jnp.int32), logits.shape[-1]))


def _prepare_decoder(module, params, inputs, copies: int, max_decode_length: int) -> _Model:
    """Prefills each prompt once, then repeats its cache `copies` times."""
    cfg = module.config
    prompt, lengths = decoder_prompt(cfg, inputs)

    def make_cache(rows):
        return models.init_cache(module, params, prompt.shape[1] + max_decode_length, batch_size=rows)

    def step(cache, token):
        logits, state = module.apply({"params": params, "cache": cache}, decoder_input_tokens=token, decode=True,
                                     mutable=["cache"])
        return logits[:, -1].astype(jnp.float32), state["cache"]

    # One pass over every prompt; padding after a row's prompt is written too, but lies in that
    # row's future (hidden by the causal mask) and is overwritten as the row generates.
    in_prompt = jnp.arange(prompt.shape[1])[None] < lengths[:, None]
    hidden, state = module.apply({"params": params, "cache": make_cache(prompt.shape[0])}, decoder_input_tokens=prompt,
                                 decoder_causal_attention=in_prompt if cfg.prefix_lm else None, decode=True,
                                 mutable=["cache"], method="encode")
    last = jnp.take_along_axis(hidden, (lengths - 1)[:, None, None], axis=1)
    logits = module.apply({"params": params}, last, method=lambda m, x: m.lm_head(x))[:, 0]
    batch_axes = _batch_axes(make_cache)
    cache = models.set_cache_index(state["cache"], lengths)
    cache = jax.tree.map(lambda x, axis: x if axis < 0 else jnp.repeat(x, copies, axis=axis), cache, batch_axes)
    seen = jnp.repeat(tokens_seen(prompt, lengths, logits.shape[-1]), copies, axis=0)
    return _Model(step, jnp.repeat(logits, copies, axis=0).astype(jnp.float32), cache, batch_axes, cfg,
                  given_prompt_lengths(cfg, inputs), seen)


# ----------------------------------------------------------------------------- sampling

def filter_logits(logits: jax.Array, top_k=0, top_p=0.0) -> jax.Array:
    """Hugging Face's order: keeps the `top_k` largest logits (ties included), then, of those,
    the smallest set of most likely tokens whose renormalised probability reaches `top_p` (a
    token goes when the mass of the tokens below it, itself included, is at most 1 - p).
    0 turns either filter off; both may be traced values, so changing them does not recompile."""
    vocab = logits.shape[-1]
    ordered = jnp.sort(logits, axis=-1)                            # ascending
    k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)
    kth_largest = jnp.take_along_axis(ordered, jnp.broadcast_to(vocab - k, logits.shape[:-1] + (1,)), axis=-1)
    logits = jnp.where(logits < kth_largest, NEG_INF, logits)
    ordered = jnp.where(ordered < kth_largest, NEG_INF, ordered)
    below = jnp.cumsum(jax.nn.softmax(ordered, axis=-1), axis=-1)
    dropped = jnp.minimum(jnp.sum(below <= 1.0 - top_p, axis=-1, keepdims=True), vocab - 1)   # keep >= 1
    cutoff = jnp.where(top_p > 0, jnp.take_along_axis(ordered, dropped, axis=-1), NEG_INF)
    return jnp.where(logits < cutoff, NEG_INF, logits)


def penalize_repetition(logits: jax.Array, seen: jax.Array, penalty) -> jax.Array:
    """CTRL's repetition penalty (Keskar et al. 2019, section 4.1; salesforce/ctrl generation.py) as
    Hugging Face's `RepetitionPenaltyLogitsProcessor` applies it: the logit of every token already
    in the row (prompt, start token, generated) is divided by `penalty` when positive and
    multiplied by it when negative, so a repeat always gets less likely (CTRL divides both, which
    makes a negative one likelier). CTRL uses 1.2; 1 leaves the logits as they are."""
    return jnp.where(seen, jnp.where(logits < 0, logits * penalty, logits / penalty), logits)


def _choose(logits, rng, temperature, top_k, top_p) -> jax.Array:
    def sample():
        return jax.random.categorical(rng, filter_logits(logits / temperature, top_k, top_p), axis=-1)
    argmax = lambda: jnp.argmax(logits, axis=-1)
    return jax.lax.cond(temperature <= GREEDY_TEMPERATURE, argmax, sample).astype(jnp.int32)


def _sample_loop(model: _Model, rng, temperature, top_k, top_p, repetition_penalty, max_decode_length: int):
    """(tokens [rows, max_decode_length], log-probabilities [rows]); the score uses the model's
    own (untempered, unfiltered, unpenalized) distribution, so samples from different settings compare."""
    cfg = model.config
    rows = model.logits.shape[0]

    def cond(state):
        i, _, _, _, done, _, _, _ = state
        return (i < max_decode_length) & ~jnp.all(done)

    def body(state):
        i, tokens, cache, logits, done, logp, seen, rng = state
        rng, key = jax.random.split(rng)
        chosen = _choose(penalize_repetition(logits, seen, repetition_penalty), key, temperature, top_k, top_p)
        token = jnp.where(done, cfg.pad_token_id, chosen)
        token_logp = jnp.take_along_axis(jax.nn.log_softmax(logits), token[:, None], axis=-1)[:, 0]
        logp = logp + jnp.where(done, 0.0, token_logp)
        done = done | (token == cfg.eos_token_id)
        seen = seen.at[jnp.arange(rows), token].set(True)
        logits, cache = model.step(cache, token[:, None])
        return i + 1, tokens.at[:, i].set(token), cache, logits, done, logp, seen, rng

    state = (jnp.zeros((), jnp.int32), jnp.full((rows, max_decode_length), cfg.pad_token_id, jnp.int32),
             model.cache, model.logits, jnp.zeros(rows, bool), jnp.zeros(rows, jnp.float32), model.seen, rng)
    _, tokens, _, _, _, logp, _, _ = jax.lax.while_loop(cond, body, state)
    return tokens, logp


def temperature_sample(module, params, inputs: Mapping[str, jax.Array], rng, *, max_decode_length: int,
                       temperature=1.0, top_k=0, top_p=0.0, repetition_penalty=1.0,
                       num_decodes: int = 1) -> DecodeResult:
    """`num_decodes` samples per input, ranked by log-probability (argmax at temperature <= 1e-4).

    Logits are penalized for repetition (`penalize_repetition`; 1.0 is off), divided by the
    temperature, then filtered by top-k and top-p (`filter_logits`), as Hugging Face's processors
    and warpers do. Only the module and the shapes are static: other temperatures, filters or
    penalties reuse the compiled function."""
    if not jnp.issubdtype(jnp.asarray(rng).dtype, jax.dtypes.prng_key):
        rng = jax.random.wrap_key_data(rng)
    return _temperature_sample(module, params, inputs, rng, jnp.float32(temperature), jnp.int32(top_k),
                               jnp.float32(top_p), jnp.float32(repetition_penalty),
                               max_decode_length=max_decode_length, num_decodes=num_decodes)


@functools.partial(jax.jit, static_argnames=("module", "max_decode_length", "num_decodes"))
def _temperature_sample(module, params, inputs, rng, temperature, top_k, top_p, repetition_penalty, *,
                        max_decode_length, num_decodes) -> DecodeResult:
    model = _prepare(module, params, inputs, num_decodes, max_decode_length)
    tokens, logp = _sample_loop(model, rng, temperature, top_k, top_p, repetition_penalty, max_decode_length)
    tokens = tokens.reshape(-1, num_decodes, max_decode_length)
    logp = logp.reshape(-1, num_decodes)
    order = jnp.argsort(-logp, axis=1)
    return DecodeResult(jnp.take_along_axis(tokens, order[..., None], axis=1), jnp.take_along_axis(logp, order, axis=1))


def greedy(module, params, inputs: Mapping[str, jax.Array], *, max_decode_length: int,
           repetition_penalty=1.0) -> DecodeResult:
    """Argmax decoding: tokens [batch, max_decode_length], scores [batch] (sum of log-probs);
    with CTRL's `repetition_penalty` (1.2 in the paper), its "greedy sampling with a penalty"."""
    out = temperature_sample(module, params, inputs, jax.random.key(0), max_decode_length=max_decode_length,
                             temperature=0.0, repetition_penalty=repetition_penalty)
    return DecodeResult(out.tokens[:, 0], out.scores[:, 0])


# ----------------------------------------------------------------------------- beam search

BEAM_RULES = ("t5x", "hf")


def brevity_penalty(length, alpha: float = 0.6):
    """T5X's length normalisation ((5 + length) / 6) ** alpha; beam scores are log-prob / penalty.

    Hugging Face divides by length ** length_penalty instead; the two agree only without a
    penalty (alpha = 0, length_penalty = 0: summed log-probabilities)."""
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


def _top(scores, n: int, *trees, ascending: bool = False):
    """The `n` best entries along axis 1 of `scores` and of every tree (same leading shape), best
    first, or with `ascending` worst first: T5X keeps its beams in that order, and since `top_k`
    breaks exact ties by position, the order decides ties as T5X does."""
    best, index = jax.lax.top_k(scores, n)
    if ascending:
        best, index = best[:, ::-1], index[:, ::-1]
    return best, *(_gather_beams(t, index) for t in trees)


class _Beams(NamedTuple):
    i: jax.Array             # tokens generated so far
    alive: jax.Array         # [batch, beams, max_decode_length]
    alive_logp: jax.Array    # [batch, beams]
    finished: jax.Array      # [batch, beams, max_decode_length]
    finished_scores: jax.Array  # [batch, beams], penalised; NEG_INF where empty
    finished_flags: jax.Array   # [batch, beams]
    cache: Any
    logits: jax.Array        # [batch * beams, vocab]: next-token logits of the alive beams


def _penalty_offset(model: _Model, t5x: bool):
    """[batch, 1] added to the generated length in the brevity penalty: T5X counts a decoder-only
    model's prompt (its loop starts at `initial_index`, the prompt's length)."""
    return model.prompt_lengths[:, None] if t5x else jnp.zeros((model.prompt_lengths.shape[0], 1), jnp.int32)


def _beam_step(model: _Model, state: _Beams, beams: int, alpha, t5x: bool) -> _Beams:
    """Extends every alive beam by every token; of the best 2 * `beams` candidates, the best
    `beams` that did not end are the new alive beams, and those that ended with EOS join the
    finished set: all of them under T5X's rules, only those ranked within the top `beams` under
    Hugging Face's. Then runs the model on the new alive beams."""
    batch, i = state.alive.shape[0], state.i
    logp = jax.nn.log_softmax(state.logits).reshape(batch, beams, -1)
    vocab = logp.shape[-1]
    candidates = (state.alive_logp[..., None] + logp).reshape(batch, -1)

    top_logp, top_index = jax.lax.top_k(candidates, 2 * beams)
    source, token = top_index // vocab, (top_index % vocab).astype(jnp.int32)
    extended = _gather_beams(state.alive, source).at[:, :, i].set(token)
    ended = token == model.config.eos_token_id

    alive_logp, alive, alive_source = _top(jnp.where(ended, NEG_INF, top_logp), beams, extended, source,
                                           ascending=t5x)
    admitted = ended if t5x else ended & (jnp.arange(2 * beams) < beams)
    penalty = brevity_penalty(_penalty_offset(model, t5x) + i + 1, alpha)
    scores = jnp.concatenate([jnp.where(state.finished_flags, state.finished_scores, NEG_INF),
                              jnp.where(admitted, top_logp / penalty, NEG_INF)], axis=1)
    finished_scores, finished, flags = _top(scores, beams, jnp.concatenate([state.finished, extended], axis=1),
                                            jnp.concatenate([state.finished_flags, admitted], axis=1), ascending=t5x)
    cache = _gather_beams(state.cache, alive_source, model.batch_axes)
    logits, cache = model.step(cache, alive[:, :, i].reshape(-1, 1))
    return _Beams(i + 1, alive, alive_logp, finished, finished_scores, flags, cache, logits)


def _beam_search_done(state: _Beams, alpha, max_length: jax.Array) -> jax.Array:
    """True when every row has `beams` finished hypotheses that no alive beam can still beat
    (an alive beam's log-prob only falls, and the penalty is largest at the row's full
    penalised length `max_length` [batch, 1])."""
    best_possible = state.alive_logp.max(axis=1) / brevity_penalty(max_length[:, 0], alpha)
    worst_finished = jnp.where(state.finished_flags, state.finished_scores, NEG_INF).min(axis=1)
    return jnp.all(state.finished_flags.all(axis=1) & (best_possible <= worst_finished))


def _t5x_result(state: _Beams, beams: int) -> tuple[jax.Array, jax.Array]:
    """T5X's answer: the finished hypotheses, best first, by penalised score; only when a row has
    none does T5X return its alive beams instead, by raw log-probability. Slots that finished
    hypotheses leave empty hold the alive beams the same way (T5X leaves filler there)."""
    finished, finished_scores = state.finished[:, ::-1], state.finished_scores[:, ::-1]   # stored worst first
    alive, alive_logp = state.alive[:, ::-1], state.alive_logp[:, ::-1]
    slot = jnp.arange(beams)[None]
    count = state.finished_flags.sum(axis=1, keepdims=True)
    pick = jnp.where(slot < count, slot, beams + slot - count)
    scores = jnp.take_along_axis(jnp.concatenate([finished_scores, alive_logp], axis=1), pick, axis=1)
    return _gather_beams(jnp.concatenate([finished, alive], axis=1), pick), scores


def _hf_result(state: _Beams, beams: int, alpha) -> tuple[jax.Array, jax.Array]:
    """Hugging Face's answer: hypotheses cut off at the full length, scored at that length, rank
    together with the finished ones (after an early stop none of them can beat a finished one)."""
    alive_scores = state.alive_logp / brevity_penalty(state.i, alpha)
    scores = jnp.concatenate([jnp.where(state.finished_flags, state.finished_scores, NEG_INF), alive_scores], axis=1)
    scores, sequences = _top(scores, beams, jnp.concatenate([state.finished, state.alive], axis=1))
    return sequences, scores


def beam_search(module, params, inputs: Mapping[str, jax.Array], *, max_decode_length: int, num_beams: int = 4,
                alpha=0.6, rules: str = "t5x") -> DecodeResult:
    """Beam search with T5X's brevity penalty: tokens [batch, num_beams, max_decode_length], best
    first; a finished hypothesis scores its summed log-probability over ((5 + len) / 6) ** alpha,
    len counting EOS.

    `rules` picks whose search it is, beam for beam:
    - "t5x" (`t5x.decoding.beam_search`): every EOS among a step's 2 * num_beams best candidates
      is a finished hypothesis; finished hypotheses come first, and a row returns beams that did
      not finish (scored by raw log-probability) only where fewer finished; a decoder-only
      model's len counts its prompt as given (T5X's `initial_index`). Exact ties go as in T5X:
      `top_k` takes the lower index, and beams are kept worst first. T5X's decoder-only rows
      share one total length (a longer prompt leaves fewer new tokens); here every row gets
      max_decode_length new tokens, the same for prompts of one length.
    - "hf" (Hugging Face `generate`): only EOS candidates ranked within the top num_beams finish;
      hypotheses cut off at max_decode_length rank together with finished ones, scored at that
      length; len counts generated tokens only. HF penalises by len ** length_penalty instead,
      so only with alpha = 0 (HF's length_penalty = 0) are these HF's beams and scores.
    """
    if rules not in BEAM_RULES:
        raise ValueError(f"beam search rules must be one of {BEAM_RULES}; got {rules!r}")
    return _beam_search(module, params, inputs, jnp.float32(alpha), max_decode_length=max_decode_length,
                        num_beams=num_beams, t5x=rules == "t5x")


@functools.partial(jax.jit, static_argnames=("module", "max_decode_length", "num_beams", "t5x"))
def _beam_search(module, params, inputs, alpha, *, max_decode_length, num_beams, t5x) -> DecodeResult:
    model = _prepare(module, params, inputs, num_beams, max_decode_length)
    batch = model.logits.shape[0] // num_beams
    empty = jnp.full((batch, num_beams, max_decode_length), model.config.pad_token_id, jnp.int32)
    first_beam_only = jnp.where(jnp.arange(num_beams) == 0, 0.0, NEG_INF)
    state = _Beams(jnp.zeros((), jnp.int32), empty, jnp.broadcast_to(first_beam_only, (batch, num_beams)), empty,
                   jnp.full((batch, num_beams), NEG_INF), jnp.zeros((batch, num_beams), bool), model.cache,
                   model.logits)
    max_length = _penalty_offset(model, t5x) + max_decode_length
    state = jax.lax.while_loop(
        lambda s: (s.i < max_decode_length) & ~_beam_search_done(s, alpha, max_length),
        lambda s: _beam_step(model, s, num_beams, alpha, t5x), state)
    return DecodeResult(*(_t5x_result(state, num_beams) if t5x else _hf_result(state, num_beams, alpha)))
