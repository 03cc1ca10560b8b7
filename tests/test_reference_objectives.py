"""t5lite's objectives against t5's own (`t5.data.preprocessors`), run on the same inputs.

The inputs/targets functions that use no randomness must agree exactly on the same mask; for
the random ones TF's generator differs from numpy's, so the tests compare distributions and
structure. Needs the `reference` extra (t5, tensorflow).
"""
import collections

import numpy as np
import pytest
from scipy import stats

from objectives_helpers import PieceVocabulary, assert_binomial
from t5lite.data.corruption import denoise as D

t5 = pytest.importorskip("t5", reason="the t5 reference needs the `reference` extra")
tf = pytest.importorskip("tensorflow", reason="the t5 reference needs the `reference` extra")
from t5.data import preprocessors as T  # noqa: E402

VOCAB = PieceVocabulary(vocab_size=2000, extra_ids=100)


def tf_seeds(seed, rows=2):
    return tf.constant([[seed, k] for k in range(rows)], tf.int32)


def random_case(seed, length=80):
    rng = np.random.default_rng(seed)
    return (rng.integers(3, 1000, size=length).astype(np.int32),
            rng.random(length) < rng.choice([0.1, 0.15, 0.5, 0.9]))


@pytest.mark.parametrize("name", ["noise_token_to_sentinel", "noise_span_to_sentinel", "nonnoise_span_to_sentinel",
                                  "noise_span_to_unique_sentinel", "nonnoise_span_to_unique_sentinel",
                                  "drop_noise_tokens", "drop_nonnoise_tokens"])
def test_deterministic_inputs_and_targets_functions_equal_t5s(name):
    for seed in range(30):
        tokens, mask = random_case(seed, length=int(np.random.default_rng(seed).integers(1, 120)))
        theirs = getattr(T, name)(tf.constant(tokens), tf.constant(mask), VOCAB, seeds=tf_seeds(0)).numpy()
        ours = getattr(D, name)(tokens, mask, VOCAB, np.random.default_rng(seed))
        assert ours.tolist() == theirs.tolist(), name


def test_permute_noise_tokens_has_t5s_invariants():
    for seed in range(20):
        tokens, mask = random_case(seed)
        theirs = T.permute_noise_tokens(tf.constant(tokens), tf.constant(mask), VOCAB, seeds=tf_seeds(seed)).numpy()
        ours = D.permute_noise_tokens(tokens, mask, VOCAB, np.random.default_rng(seed))
        for out in (ours, theirs):
            assert out[~mask].tolist() == tokens[~mask].tolist()
            assert sorted(out[mask].tolist()) == sorted(tokens[mask].tolist())


def test_iid_noise_mask_density_as_t5s():
    theirs = sum(int(T.iid_noise_mask(1000, 0.15, seeds=tf_seeds(s)).numpy().sum()) for s in range(20))
    rng = np.random.default_rng(0)
    ours = sum(int(D.iid_noise_mask(1000, 0.15, rng).sum()) for _ in range(20))
    assert_binomial(theirs, 20000, 0.15)
    assert_binomial(ours, 20000, 0.15)


@pytest.mark.parametrize("density", [0.5, 0.25])
def test_random_prefix_split_point_has_t5s_distribution(density):
    length, draws = 11, 600
    theirs = [int(T.random_prefix_noise_mask(length, density, seeds=tf_seeds(s)).numpy().sum()) for s in range(draws)]
    rng = np.random.default_rng(0)
    ours = [int(D.random_prefix_noise_mask(length, density, rng).sum()) for _ in range(draws)]
    assert set(ours) == set(theirs)   # the same support
    table = np.array([[collections.Counter(x)[k] for k in sorted(set(ours))] for x in (ours, theirs)])
    assert stats.chi2_contingency(table).pvalue > 1e-4


def test_random_token_or_sentinel_as_t5s():
    tokens = np.random.default_rng(0).integers(3, 1000, size=20000).astype(np.int32)
    mask = np.random.default_rng(1).random(len(tokens)) < 0.15
    theirs = T.noise_token_to_random_token_or_sentinel(tf.constant(tokens), tf.constant(mask), VOCAB,
                                                       seeds=tf_seeds(3)).numpy()
    ours = D.noise_token_to_random_token_or_sentinel(tokens, mask, VOCAB, np.random.default_rng(2))
    for out in (ours, theirs):
        assert out[~mask].tolist() == tokens[~mask].tolist()
        replaced = out[mask]
        assert replaced.min() >= 3 and replaced.max() < VOCAB.vocab_size
        # random with p 0.1 (hitting the sentinel id 1 time in 1997), else the sentinel
        assert_binomial(int((replaced != VOCAB.vocab_size - 1).sum()), int(mask.sum()), 0.1 * (1 - 1 / 1997))


def test_prefix_lm_structure_as_t5s():
    """t5's prefix_lm and t5lite's prefix_lm task steps on the same documents: the same number of
    examples, inputs + targets = one piece of the document in both, split points with the same support."""
    import seqio
    from conftest import t5_and_our_features, tf_targets_dataset
    from t5lite.data import preprocessors as P
    t5_features, features = t5_and_our_features(seqio)
    rng = np.random.default_rng(0)
    docs = [rng.integers(3, 2000, size=int(n)).astype(np.int32) for n in rng.integers(2, 300, size=60)]
    sequence_length = {"inputs": 64, "targets": 64}
    with seqio.utils.map_seed_manager(7):
        theirs = list(T.prefix_lm(tf_targets_dataset(tf, docs), sequence_length, t5_features).as_numpy_iterator())
    stream = P.select_random_chunk(iter({"targets": d} for d in docs), seed=7)
    stream = D.split_tokens_to_length(stream, sequence_length, features)
    ours = list(D.t5_objective("prefix_lm")(stream, features, seed=7))
    assert len(ours) == len(theirs)
    pieces = [p for d in docs for p in np.array_split(d, range(63, len(d), 63)) if len(p)]
    for a, b, piece in zip(ours, theirs, pieces):
        for ex in (a, b):
            assert np.concatenate([ex["inputs"], ex["targets"]]).tolist() == piece.tolist()
            assert 1 <= len(ex["inputs"]) <= len(piece) - 1 or len(piece) == 1
