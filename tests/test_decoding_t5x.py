"""Beam search against T5X's: `t5x.decoding.beam_search` (t5x is not on PyPI) re-derived in numpy
below, step for step, and driven by the model's logits over each full prefix (no cache), so it
shares nothing with t5lite's decoding. 64 random rows per setting, encoder-decoder and
decoder-only (prompts of 1 to 8 tokens, so T5X's `initial_index` enters the brevity penalty), alpha
0 and 0.6, with an EOS that ends beams from the first steps: the same best beam, row for row."""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5lite import models
from t5lite.infer import decoding

V, BEAMS, LENGTH, ROWS, PROMPT = 32, 4, 7, 64, 8
T5X_NEG_INF = np.float32(-1.0e7)   # t5x.decoding.NEG_INF
# The cached and the recomputed logits differ by float noise (~1e-6); every decision the reference
# takes must win by more than this, or the comparison would be testing the noise.
MARGIN = 1e-5


def _brevity_penalty(alpha, length):
    return ((5.0 + np.asarray(length, np.float32)) / 6.0) ** np.float32(alpha)


def _top_k(x, k):
    """`jax.lax.top_k` in numpy: the k largest, largest first, exact ties to the lower index; and the
    margin of the k-th over the (k+1)-th."""
    order = np.argsort(-x, axis=1, kind="stable")
    ordered = np.take_along_axis(x, order, axis=1)
    return order[:, :k], ordered[:, k - 1] - ordered[:, k]


def _t5x_beam_search(next_log_probs, batch, eos, alpha, initial_index):
    """T5X's beam search (t5x/decoding.py `beam_search`, `beam_init`, `brevity_penalty`) for `batch`
    rows of BEAMS beams and LENGTH new tokens, float32 as T5X.

    next_log_probs(live [batch, BEAMS, LENGTH], i) -> [batch, BEAMS, V]: log-probs of the token
    after each live beam's first i tokens. `initial_index` [batch]: where a decoder-only row's loop
    starts (its prompt length; 0 for an encoder-decoder), which counts in the brevity penalty.
    Returns (best tokens [batch, LENGTH] with 0 after EOS, their scores [batch], the smallest margin
    [batch] of any decision that shaped the result)."""
    rows = np.arange(batch)[:, None]
    live_logp = np.tile(np.array([0.0] + [T5X_NEG_INF] * (BEAMS - 1), np.float32), (batch, 1))
    live = np.zeros((batch, BEAMS, LENGTH), np.int64)
    finished, finished_scores = np.zeros_like(live), np.full((batch, BEAMS), T5X_NEG_INF)
    finished_flags = np.zeros((batch, BEAMS), bool)
    margins = []
    for i in range(LENGTH):    # cur_index = initial_index + i
        # A whole batch stops once no live beam can beat the worst finished one (beam_search_loop_cond_fn).
        best_live = live_logp[:, -1:] / _brevity_penalty(alpha, initial_index[:, None] + LENGTH + 1)
        worst_finished = np.where(finished_flags, finished_scores.min(axis=1, keepdims=True), T5X_NEG_INF)
        if np.all(worst_finished > best_live):
            break
        flat = (next_log_probs(live, i) + live_logp[..., None]).astype(np.float32).reshape(batch, -1)
        # The 2k best continuations of all beams.
        index, margin = _top_k(flat, 2 * BEAMS)
        margins.append(margin)
        top_logp = np.take_along_axis(flat, index, axis=1)
        topk_seq = live[rows, index // V]
        topk_seq[:, :, i] = index % V
        newly_finished = topk_seq[:, :, i] == eos
        # Live: the k best that did not end, kept worst first (top_k, then flip).
        new_logp = top_logp + newly_finished * T5X_NEG_INF
        keep, margin = _top_k(new_logp, BEAMS)
        margins.append(margin)
        keep = keep[:, ::-1]
        live, live_logp = topk_seq[rows, keep], new_logp[rows, keep]
        # Finished: every one of the 2k that ended competes with the finished ones.
        new_scores = (top_logp / _brevity_penalty(alpha, initial_index[:, None] + i + 1)
                      + (~newly_finished) * T5X_NEG_INF).astype(np.float32)
        scores = np.concatenate([finished_scores, new_scores], axis=1)
        keep, margin = _top_k(scores, BEAMS)
        sorted_scores = np.sort(scores, axis=1)
        margins.append(np.where(sorted_scores[:, -BEAMS - 1] > T5X_NEG_INF / 2, margin, np.inf))  # fillers: no matter
        keep = keep[:, ::-1]
        finished = np.concatenate([finished, topk_seq], axis=1)[rows, keep]
        finished_flags = np.concatenate([finished_flags, newly_finished], axis=1)[rows, keep]
        finished_scores = scores[rows, keep]
    # Finished sequences if a row has any, else its live ones; best last.
    any_finished = finished_flags.any(axis=1)
    sequences = np.where(any_finished[:, None, None], finished, live)
    scores = np.where(any_finished[:, None], finished_scores, live_logp)
    margins.append(np.where(scores[:, -2] > T5X_NEG_INF / 2, scores[:, -1] - scores[:, -2], np.inf))
    return sequences[:, -1], scores[:, -1], np.min(margins, axis=0)


@functools.partial(jax.jit, static_argnames="module")
def _next_log_probs(module, params, encoder_tokens, decoder_tokens, positions):
    """[rows, V]: log-probs at `positions` of the full model run over `decoder_tokens` (no cache)."""
    if encoder_tokens is None:
        logits = module.apply({"params": params}, decoder_input_tokens=decoder_tokens)
    else:
        logits = module.apply({"params": params}, encoder_input_tokens=encoder_tokens,
                              decoder_input_tokens=decoder_tokens)
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32))
    return jnp.take_along_axis(log_probs, positions[:, None, None], axis=1)[:, 0]


def _early_eos(first_log_probs, excluded):
    """The token most often ranked 3rd to 2k-th for the first generated token: an EOS that ends
    beams from the first steps without being every row's best."""
    rank = np.argsort(np.argsort(-first_log_probs, axis=1), axis=1)
    often = ((rank >= 2) & (rank < 2 * BEAMS)).sum(axis=0)
    often[list(excluded)] = -1
    return int(often.argmax())


def _case(arch, model_seed=1, data_seed=2):
    """(module with the early EOS, params, t5lite inputs, reference log-prob function, initial_index)."""
    shape = dict(d_model=32, num_heads=2, head_dim=16, d_ff=64, vocab_size=V, num_encoder_layers=1,
                 num_decoder_layers=2, arch=arch)
    module = models.build(models.get_config("t5_tiny", **shape))
    features = {"decoder_input_tokens": jnp.zeros((1, 4), jnp.int32)}
    if arch == "encoder_decoder":
        features["encoder_input_tokens"] = jnp.ones((1, 4), jnp.int32)
    params = nn.unbox(jax.jit(module.init)(jax.random.key(model_seed), **features))["params"]
    params = jax.tree.map(lambda x: x * 1.5, params)   # logits spread enough that no decision is a near-tie
    rng = np.random.default_rng(data_seed)
    cfg = module.config
    if arch == "encoder_decoder":
        tokens = rng.integers(2, V, (ROWS, 7)).astype(np.int32)
        tokens[rng.random(tokens.shape) < 0.2] = cfg.pad_token_id
        inputs = {"encoder_input_tokens": jnp.asarray(tokens)}
        encoder_tokens = jnp.asarray(np.repeat(tokens, BEAMS, axis=0))
        prompts, lengths = np.full((ROWS, 1), cfg.decoder_start_token_id), np.ones(ROWS, np.int64)
        initial_index = np.zeros(ROWS, np.int64)
    else:
        lengths = rng.integers(1, PROMPT + 1, ROWS)
        prompts = rng.integers(1, V, (ROWS, PROMPT)).astype(np.int32)
        prompts[np.arange(PROMPT)[None] >= lengths[:, None]] = cfg.pad_token_id
        inputs = {"decoder_prompt_tokens": jnp.asarray(prompts), "decoder_prompt_lengths": jnp.asarray(lengths)}
        encoder_tokens, initial_index = None, lengths

    def next_log_probs(live, i):
        """Each beam's prompt (or the start token), then its first i tokens, recomputed in full."""
        sequences = np.zeros((ROWS, BEAMS, prompts.shape[1] + LENGTH), np.int32)
        for r, (prompt, n) in enumerate(zip(prompts, lengths)):
            sequences[r, :, :n] = prompt[:n]
            sequences[r, :, n:n + i] = live[r, :, :i]
        positions = np.repeat(lengths - 1 + i, BEAMS)
        out = _next_log_probs(module, params, encoder_tokens, jnp.asarray(sequences.reshape(ROWS * BEAMS, -1)),
                              jnp.asarray(positions))
        return np.asarray(out).reshape(ROWS, BEAMS, V)

    eos = _early_eos(next_log_probs(np.zeros((ROWS, BEAMS, LENGTH), np.int64), 0)[:, 0],
                     {cfg.pad_token_id, cfg.decoder_start_token_id})
    return models.build(cfg.replace(eos_token_id=eos)), params, inputs, next_log_probs, initial_index


@pytest.fixture(scope="module", params=["encoder_decoder", "decoder"])
def case(request):
    return _case(request.param)


def _expected(case, alpha):
    module, _, _, next_log_probs, initial_index = case
    eos = module.config.eos_token_id
    tokens, scores, margins = _t5x_beam_search(next_log_probs, ROWS, eos, alpha, initial_index)
    assert margins.min() > MARGIN, f"near-tied decisions in rows {np.flatnonzero(margins <= MARGIN)}"
    ends = [list(row).index(eos) + 1 if eos in row else 0 for row in tokens]
    assert sum(0 < n <= 3 for n in ends) >= 10, f"the case needs best beams that end within 3 tokens: {ends}"
    assert 0 < ends.count(0) < ROWS // 2, f"the case needs some rows where no beam ends: {ends}"
    return tokens, scores


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_search_is_t5x_beam_search(case, alpha):
    """The best beam and its score of every row are T5X's (the default rules)."""
    module, params, inputs, _, _ = case
    tokens, scores = _expected(case, alpha)
    out = decoding.beam_search(module, params, inputs, max_decode_length=LENGTH, num_beams=BEAMS, alpha=alpha)
    np.testing.assert_array_equal(np.asarray(out.tokens[:, 0]), tokens)
    np.testing.assert_allclose(np.asarray(out.scores[:, 0]), scores, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["encoder_decoder", "decoder"])
@pytest.mark.parametrize("seed", [3, 5, 7])
def test_beam_search_is_t5x_beam_search_on_more_models(arch, seed):
    """Three more random models and input sets per family, 64 rows each, alpha 0 and 0.6."""
    case = _case(arch, seed, seed)
    for alpha in (0.0, 0.6):
        test_beam_search_is_t5x_beam_search(case, alpha)


def test_hf_rules_are_not_t5x_rules(case):
    """On these rows Hugging Face's rules pick another best beam in many rows: the comparison above
    tells the two apart."""
    module, params, inputs, _, _ = case
    tokens, _ = _expected(case, 0.6)
    out = decoding.beam_search(module, params, inputs, max_decode_length=LENGTH, num_beams=BEAMS, alpha=0.6,
                               rules="hf")
    assert (np.asarray(out.tokens[:, 0]) != tokens).any(axis=1).sum() >= ROWS // 5


@pytest.mark.parametrize("eos", [3, 20])
def test_exact_ties_are_broken_as_t5x_breaks_them(case, eos):
    """With every parameter 0 all tokens are equally likely, so every choice is an exact tie and only
    T5X's order decides: `top_k` takes the lower index, and beams are kept worst first. EOS 3 ends
    beams at once; EOS 20 never makes the 2k best, so the order of the live beams picks the answer."""
    module, params, inputs, _, initial_index = case
    module = models.build(module.config.replace(eos_token_id=eos))
    zero = jax.tree.map(jnp.zeros_like, params)
    out = decoding.beam_search(module, zero, inputs, max_decode_length=LENGTH, num_beams=BEAMS, alpha=0.6)
    uniform = lambda live, i: np.full((ROWS, BEAMS, V), -np.log(np.float32(V)), np.float32)
    tokens, scores, _ = _t5x_beam_search(uniform, ROWS, eos, 0.6, initial_index)
    np.testing.assert_array_equal(np.asarray(out.tokens[:, 0]), tokens)
    np.testing.assert_allclose(np.asarray(out.scores[:, 0]), scores, rtol=1e-4)
