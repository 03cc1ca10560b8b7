"""Decoding: the cached loop agrees with recomputing the whole decoder, and the decoders agree
with each other where they must (one beam / zero temperature / top-k 1 = greedy)."""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5lite import models
from t5lite.infer import decoding

LENGTH = 7


def _model(preset="t5_tiny", **changes):
    small = dict(d_model=32, num_heads=2, head_dim=16, d_ff=64, vocab_size=48)
    if preset == "t5_tiny":
        small.update(num_encoder_layers=1, num_decoder_layers=2)
    config = models.get_config(preset, **{**small, **changes})
    module = models.build(config)
    features = {"decoder_input_tokens": jnp.zeros((1, 4), jnp.int32)}
    if config.arch == "encoder_decoder":
        features["encoder_input_tokens"] = jnp.ones((1, 4), jnp.int32)
    params = nn.unbox(jax.jit(module.init)(jax.random.key(1), **features))["params"]
    return module, jax.tree.map(lambda x: x * 3.0, params)   # sharper logits: fewer near-ties


@pytest.fixture(scope="module")
def t5():
    module, params = _model()
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, 48, size=(3, 9)).astype(np.int32)
    tokens[1, 6:] = 0   # a padded row
    return module, params, {"encoder_input_tokens": jnp.asarray(tokens)}


@functools.partial(jax.jit, static_argnames="module")
def _log_probs(module, params, inputs, decoder_input_tokens):
    """[batch, length, vocab] log-probs by running the full decoder (no cache)."""
    if "encoder_input_tokens" in inputs:
        logits = module.apply({"params": params}, encoder_input_tokens=inputs["encoder_input_tokens"],
                              decoder_input_tokens=decoder_input_tokens)
    else:
        logits = module.apply({"params": params}, decoder_input_tokens=decoder_input_tokens)
    return jax.nn.log_softmax(logits.astype(jnp.float32))


def _greedy_by_recomputing(module, params, inputs, eos_id, prompt=None):
    """Argmax of the full-sequence logits, one position at a time for the whole batch (one
    compiled shape); rows keep their own prompt lengths, and tokens after EOS are 0."""
    if prompt is None:
        prompt = np.zeros((inputs["encoder_input_tokens"].shape[0], 0), np.int32)
    batch = prompt.shape[0]
    lengths = (prompt != 0).sum(axis=1)
    seq = np.zeros((batch, prompt.shape[1] + LENGTH), np.int32)    # BOS 0, prompt, generated
    seq[:, 1:1 + prompt.shape[1]] = prompt
    out = np.zeros((batch, LENGTH), np.int32)
    done = np.zeros(batch, bool)
    for step in range(LENGTH):
        positions = lengths + step               # where each row's next token is predicted
        log_probs = np.asarray(_log_probs(module, params, inputs, jnp.asarray(seq)))
        token = np.where(done, 0, log_probs[np.arange(batch), positions].argmax(-1))
        out[:, step] = token
        if step + 1 < LENGTH:
            seq[np.arange(batch), positions + 1] = token
        done |= token == eos_id
    return out


def _an_eos_that_occurs(module, params, inputs):
    """A token greedy decoding emits early, used as EOS so sequences really end mid-way."""
    free = np.asarray(decoding.greedy(module, params, inputs, max_decode_length=LENGTH, eos_id=-1).tokens)
    return int(free[0, 2])


def test_greedy_with_cache_equals_recomputing_the_decoder(t5):
    module, params, inputs = t5
    eos = _an_eos_that_occurs(module, params, inputs)
    out = decoding.greedy(module, params, inputs, max_decode_length=LENGTH, eos_id=eos)
    expected = _greedy_by_recomputing(module, params, inputs, eos)
    np.testing.assert_array_equal(np.asarray(out.tokens), expected)
    assert (expected == eos).any(), "the test should exercise sequences that end"
    for row in np.asarray(out.tokens):           # nothing but padding after EOS
        if eos in row:
            assert not row[list(row).index(eos) + 1:].any()
    np.testing.assert_allclose(np.asarray(out.scores), _sequence_log_probs(module, params, inputs, expected, eos),
                               rtol=1e-4)


def _sequence_log_probs(module, params, inputs, tokens, eos_id):
    """Sum of log p(token) over each row's tokens up to and including EOS; and their count."""
    decoder_inputs = np.zeros_like(tokens)
    decoder_inputs[:, 1:] = tokens[:, :-1]
    lp = np.asarray(_log_probs(module, params, inputs, jnp.asarray(decoder_inputs)))
    picked = np.take_along_axis(lp, tokens[..., None], axis=-1)[..., 0]
    sums = []
    for row, toks in zip(picked, tokens):
        n = list(toks).index(eos_id) + 1 if eos_id in toks else len(toks)
        sums.append(row[:n].sum())
    return np.array(sums)


def test_beam_search_with_one_beam_equals_greedy(t5):
    module, params, inputs = t5
    eos = _an_eos_that_occurs(module, params, inputs)
    greedy = decoding.greedy(module, params, inputs, max_decode_length=LENGTH, eos_id=eos)
    # Without a length penalty a single beam cannot prefer a longer hypothesis over greedy's.
    beam = decoding.beam_search(module, params, inputs, max_decode_length=LENGTH, num_beams=1, alpha=0.0,
                                eos_id=eos)
    np.testing.assert_array_equal(np.asarray(beam.tokens[:, 0]), np.asarray(greedy.tokens))
    np.testing.assert_allclose(np.asarray(beam.scores[:, 0]), np.asarray(greedy.scores), rtol=1e-5)


def _check_beam_scores(module, params, inputs):
    eos = _an_eos_that_occurs(module, params, inputs)
    out = decoding.beam_search(module, params, inputs, max_decode_length=LENGTH, eos_id=eos)
    tokens, scores = np.asarray(out.tokens), np.asarray(out.scores)
    batch = tokens.shape[0]
    assert tokens.shape == (batch, 4, LENGTH)
    for b in range(batch):
        row_inputs = {k: jnp.repeat(v[b:b + 1], 4, axis=0) for k, v in inputs.items()}
        sums = _sequence_log_probs(module, params, row_inputs, tokens[b], eos)
        lengths = [list(t).index(eos) + 1 if eos in t else LENGTH for t in tokens[b]]
        expected = sums / ((5.0 + np.array(lengths)) / 6.0) ** 0.6
        np.testing.assert_allclose(scores[b], expected, rtol=1e-4, atol=1e-4)
        assert len({tuple(t) for t in tokens[b]}) == 4, "beams are distinct hypotheses"
        assert np.all(np.diff(scores[b][np.array(lengths) < LENGTH]) <= 1e-6), "finished beams come best first"


def test_beam_scores_are_penalised_sums_of_log_probs(t5):
    _check_beam_scores(*t5)


def test_beam_axes_of_a_scanned_cache_are_found():
    """Scanned layers stack the cache on a leading layers axis; beams must be gathered on axis 1."""
    module, params = _model(scan_layers=True)
    found = {}

    def prepare(params):    # traced only: the axes are Python ints known at trace time
        model = decoding._prepare(module, params, {"encoder_input_tokens": jnp.ones((2, 5), jnp.int32)}, 3, LENGTH)
        found["axes"] = model.batch_axes
        return model.cache

    cache = jax.eval_shape(prepare, params)
    axes = {jax.tree_util.keystr(k): a for k, a in jax.tree_util.tree_leaves_with_path(found["axes"])}
    shapes = {jax.tree_util.keystr(k): x.shape for k, x in jax.tree_util.tree_leaves_with_path(cache)}
    for name, axis in axes.items():
        if len(shapes[name]) == 5:       # [layers, batch, length, heads, head_dim]
            assert axis == 1 and shapes[name][1] == 6, name
    assert sorted(set(axes.values())) == [-1, 0, 1]


@pytest.mark.slow
def test_beam_search_over_a_scanned_cache():
    module, params = _model(scan_layers=True)
    _check_beam_scores(module, params, {"encoder_input_tokens": jnp.asarray(
        np.random.default_rng(1).integers(3, 48, (2, 6)), jnp.int32)})


def test_zero_temperature_and_top_k_one_are_greedy(t5):
    module, params, inputs = t5
    greedy = np.asarray(decoding.greedy(module, params, inputs, max_decode_length=LENGTH).tokens)
    cold = decoding.temperature_sample(module, params, inputs, jax.random.key(3), max_decode_length=LENGTH,
                                       temperature=1e-5)
    top1 = decoding.temperature_sample(module, params, inputs, jax.random.key(3), max_decode_length=LENGTH,
                                       temperature=1.0, top_k=1)
    np.testing.assert_array_equal(np.asarray(cold.tokens[:, 0]), greedy)
    np.testing.assert_array_equal(np.asarray(top1.tokens[:, 0]), greedy)


def test_sampling_is_a_function_of_the_rng_and_ranks_by_log_prob(t5):
    module, params, inputs = t5
    sample = lambda seed: decoding.temperature_sample(module, params, inputs, jax.random.key(seed),
                                                      max_decode_length=LENGTH, temperature=1.5, num_decodes=4)
    a, b, c = sample(7), sample(7), sample(8)
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    assert not np.array_equal(np.asarray(a.tokens), np.asarray(c.tokens))
    scores = np.asarray(a.scores)
    assert a.tokens.shape == (3, 4, LENGTH) and np.all(np.diff(scores, axis=1) <= 0)
    row_inputs = {k: jnp.repeat(v[:1], 4, axis=0) for k, v in inputs.items()}
    np.testing.assert_allclose(scores[0], _sequence_log_probs(module, params, row_inputs, np.asarray(a.tokens[0]),
                                                              decoding.EOS_ID), rtol=1e-4)


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.2]]))
    kept = lambda p: np.asarray(decoding.filter_logits(logits, top_p=p)[0] > decoding.NEG_INF / 2)
    assert kept(0.5).tolist() == [True, False, False]
    assert kept(0.6).tolist() == [True, True, False]
    assert kept(0.99).tolist() == [True, True, True]
    top2 = np.asarray(decoding.filter_logits(logits, top_k=2)[0] > decoding.NEG_INF / 2)
    assert top2.tolist() == [True, True, False]
    both = np.asarray(decoding.filter_logits(logits, top_k=2, top_p=0.5)[0] > decoding.NEG_INF / 2)
    assert both.tolist() == [True, False, False]   # both filters: the tokens that pass each


def test_decoder_only_prompts_of_different_lengths():
    module, params = _model("gpt2_tiny")
    prompt = np.array([[5, 9, 11, 0], [7, 0, 0, 0], [3, 4, 5, 6]], np.int32)
    inputs = {"decoder_prompt_tokens": jnp.asarray(prompt)}
    out = decoding.greedy(module, params, inputs, max_decode_length=LENGTH, eos_id=-1)
    expected = _greedy_by_recomputing(module, params, {}, -1, prompt=prompt)
    np.testing.assert_array_equal(np.asarray(out.tokens), expected)
    beam = decoding.beam_search(module, params, inputs, max_decode_length=LENGTH, num_beams=1, alpha=0.0, eos_id=-1)
    np.testing.assert_array_equal(np.asarray(beam.tokens[:, 0]), expected)
