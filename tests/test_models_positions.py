"""Position encodings, each by its defining property: RoPE and the relative schemes (T5 buckets,
Shaw embeddings) make attention depend only on offsets, so a model using them is unchanged when
every position shifts; Shaw clips offsets beyond k and T5 buckets saturate at max_distance;
sinusoidal dot products depend only on the offset; learned tables are read at position + offset."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5lite import models

from conftest import assert_close, random_variables
from t5lite.models import layers as L


def encoder_states(position_encoding, positions, **overrides):
    """BERT-tiny encoder outputs for fixed tokens at the given positions."""
    cfg = models.get_config("bert_tiny", position_encoding=position_encoding, type_vocab_size=0,
                            max_position_embeddings=512, **overrides)
    module = models.build(cfg)
    variables = random_variables(module)
    ids = jnp.asarray(np.random.RandomState(1).randint(3, 900, (1, len(positions))))
    encode = jax.jit(functools.partial(module.apply, method="encode"))
    return np.asarray(encode(variables, encoder_input_tokens=ids, encoder_positions=jnp.asarray([positions])))


POSITIONS = [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize("scheme", ["rotary", "t5_relative", "shaw_relative", "disentangled"])
def test_relative_schemes_depend_only_on_offsets(scheme):
    base = encoder_states(scheme, POSITIONS)
    shifted = encoder_states(scheme, [p + 37 for p in POSITIONS])
    assert_close(shifted, base)
    assert np.abs(encoder_states(scheme, [0, 2, 4, 6, 8, 10]) - base).max() > 1e-3   # offsets do matter


@pytest.mark.parametrize("scheme", ["learned", "sinusoidal"])
def test_absolute_schemes_see_absolute_positions(scheme):
    base = encoder_states(scheme, POSITIONS)
    assert np.abs(encoder_states(scheme, [p + 37 for p in POSITIONS]) - base).max() > 1e-3


def test_rotary_scores_depend_only_on_offset():
    rng = np.random.RandomState(0)
    q, k = (jnp.asarray(rng.normal(size=(1, 1, 2, 16)), jnp.float32) for _ in range(2))
    score = lambda pq, pk: jnp.einsum("bqhd,bkhd->h", L.rotary(q, jnp.array([[pq]])), L.rotary(k, jnp.array([[pk]])))
    assert_close(score(5, 2), score(105, 102))
    assert_close(score(0, 0), jnp.einsum("bqhd,bkhd->h", q, k))
    assert np.abs(score(5, 2) - score(5, 3)).max() > 1e-3


def test_shaw_clips_offsets_beyond_k():
    # With k=2, offsets 10 and 100 both clip to k: spreading far-apart positions changes nothing ...
    far = encoder_states("shaw_relative", [0, 10, 20, 30], shaw_max_distance=2)
    farther = encoder_states("shaw_relative", [0, 100, 200, 300], shaw_max_distance=2)
    assert_close(far, farther)
    # ... while offsets within k are distinguished.
    near = encoder_states("shaw_relative", [0, 1, 2, 3], shaw_max_distance=2)
    assert np.abs(near - far).max() > 1e-3


def test_t5_buckets_exact_then_logarithmic_then_saturated():
    bucket = lambda rel, bidirectional=True: int(L.relative_position_bucket(jnp.asarray(rel), bidirectional, 32, 128))
    assert [bucket(-r) for r in range(8)] == list(range(8))            # exact for small offsets
    assert bucket(5) == 16 + 5                                          # the other direction, other half
    assert bucket(-200) == bucket(-1000) == 15 and bucket(300) == 31   # saturated beyond max_distance
    assert bucket(5, bidirectional=False) == 0                          # causal: the future is one bucket
    bias = L.RelativePositionBias(models.get_config("t5_tiny"), True)
    params = {"params": {"rel_embedding": jnp.asarray(np.random.RandomState(0).normal(size=(32, 4)), jnp.float32)}}
    rel = lambda q, k: jnp.asarray(k)[None, None, :] - jnp.asarray(q)[None, :, None]
    out = bias.apply(params, rel([2, 40], [5, 43]))
    np.testing.assert_allclose(out[0, :, 0, 0], out[0, :, 1, 1])      # same offset, same bias


def test_deberta_log_buckets():
    bucket = lambda rel: int(L.log_bucket(jnp.asarray(rel), 256, 512))
    assert [bucket(r) for r in (-127, -3, 0, 5, 128)] == [-127, -3, 0, 5, 128]     # exact within buckets / 2
    assert 128 < bucket(200) < bucket(400) <= bucket(511) == 255 and bucket(-300) == -bucket(300)


def test_sinusoidal_dot_products_depend_only_on_offset():
    pe = L.sinusoidal(jnp.arange(300), 64)
    dots = lambda k: np.asarray(jnp.sum(pe[:-k] * pe[k:], axis=-1))
    for k in (1, 7, 50):
        assert_close(dots(k), dots(k)[0])
    assert abs(dots(1)[0] - dots(7)[0]) > 1e-2


def test_learned_positions_read_at_offset():
    cfg = models.get_config("roberta_tiny")
    emb = L.AbsolutePositionEmbedding(cfg)
    params = emb.init(jax.random.PRNGKey(0), jnp.zeros((1, 3), jnp.int32))
    table = params["params"]["table"]["embedding"].value
    assert table.shape == (cfg.max_position_embeddings + 2, cfg.d_model)
    np.testing.assert_array_equal(emb.apply(params, jnp.asarray([[0, 5]]))[0], table[jnp.asarray([2, 7])])


def test_sequences_longer_than_a_learned_position_table_are_refused():
    """Past its last row a learned table would be read out of range (NaN at step 1 in training):
    the model refuses, naming the limit and the fix."""
    import jax
    import jax.numpy as jnp
    import pytest
    from t5lite import models
    cfg = models.get_config("bert_tiny", max_position_embeddings=16)
    module = models.build(cfg)
    params = jax.eval_shape(lambda: module.init(jax.random.key(0), encoder_input_tokens=jnp.ones((1, 16), jnp.int32)))
    with pytest.raises(ValueError, match="max_position_embeddings=16"):
        jax.eval_shape(lambda p: module.apply(p, encoder_input_tokens=jnp.ones((1, 17), jnp.int32)), params)


def test_a_model_with_one_token_type_reads_a_pairs_second_segment_as_type_0():
    """RoBERTa has one token type: a BERT-style pair (second segment marked 1) reads as all zeros, as
    RoBERTa's tokenizer marks it, instead of past the one-row table (NaN); BERT keeps its two types."""
    ids = jnp.asarray(np.random.RandomState(1).randint(3, 900, (1, 6)))
    pair = jnp.asarray([[0, 0, 0, 1, 1, 1]])
    for preset, differs in (("roberta_tiny", False), ("bert_tiny", True)):
        module = models.build(models.get_config(preset))
        variables = random_variables(module)
        encode = jax.jit(functools.partial(module.apply, method="encode"))
        as_pair = np.asarray(encode(variables, encoder_input_tokens=ids, token_type_ids=pair))
        as_one = np.asarray(encode(variables, encoder_input_tokens=ids, token_type_ids=jnp.zeros_like(pair)))
        assert np.isfinite(as_pair).all()
        assert bool(np.abs(as_pair - as_one).max() > 1e-3) is differs
