"""T5's denoising table, prefix LM and causal LM: property tests on random inputs (hypothesis)."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from objectives_helpers import PieceVocabulary, assert_binomial, features
from t5lite.data.corruption import denoise as D

VOCAB = PieceVocabulary()
FEATURES = features(VOCAB)
seeds = st.integers(0, 2**31 - 1)


SENTINELS_FROM = 60  # test tokens stay below; sentinels count down from 199 and never reach it here


def tokens_of(seed, length):
    return np.random.default_rng(seed).integers(3, SENTINELS_FROM, size=length).astype(np.int32)


def spans_of(mask):
    """(start, end) of each True run."""
    edges = np.diff(np.concatenate([[0], mask.astype(int), [0]]))
    return list(zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)))


@settings(max_examples=30, deadline=None)
@given(seed=seeds, density=st.sampled_from([0.1, 0.15, 0.25, 0.5]))
def test_iid_noise_density_is_binomial(seed, density):
    mask = D.iid_noise_mask(4000, density, np.random.default_rng(seed))
    assert_binomial(int(mask.sum()), 4000, density)


@settings(max_examples=30, deadline=None)
@given(seed=seeds, length=st.integers(2, 300), density=st.sampled_from([0.15, 0.5]),
       mean=st.sampled_from([2, 3, 5, 10]))
def test_span_noise_has_exact_count_and_mean_span_length(seed, length, density, mean):
    mask = D.spans(mean)(length, density, rng=np.random.default_rng(seed))
    expected = min(max(int(round(length * density)), 1), length - 1)
    assert mask.sum() == expected
    num_spans = len(spans_of(mask))
    assert num_spans == min(max(1, int(round(expected / mean))), expected, length - expected)


@settings(max_examples=50, deadline=None)
@given(seed=seeds, length=st.integers(2, 200))
def test_prefix_mask_is_a_nonempty_proper_prefix(seed, length):
    mask = D.random_prefix_noise_mask(length, 0.5, np.random.default_rng(seed))
    k = int(mask.sum())
    assert 1 <= k <= length - 1 and mask[:k].all() and not mask[k:].any()


def test_prefix_split_point_is_uniform():
    rng = np.random.default_rng(0)
    ks = [int(D.random_prefix_noise_mask(11, 0.5, rng).sum()) for _ in range(5000)]
    counts = np.bincount(ks, minlength=11)[1:]
    assert counts.size == 10 and all(count > 0 for count in counts)
    from scipy import stats
    assert stats.chisquare(counts).pvalue > 1e-6
    with pytest.raises(ValueError, match="noise_density"):
        D.random_prefix_noise_mask(10, 0.6, rng)


@settings(max_examples=50, deadline=None)
@given(seed=seeds, length=st.integers(1, 120), density=st.floats(0.0, 1.0))
def test_sentinel_inputs_and_targets_keep_the_right_tokens(seed, length, density):
    tokens = tokens_of(seed, length)
    mask = D.iid_noise_mask(length, density, np.random.default_rng(seed + 1))
    inputs = D.noise_span_to_unique_sentinel(tokens, mask, VOCAB)
    targets = D.nonnoise_span_to_unique_sentinel(tokens, mask, VOCAB)
    assert [t for t in inputs if t < SENTINELS_FROM] == tokens[~mask].tolist()
    assert [t for t in targets if t < SENTINELS_FROM] == tokens[mask].tolist()
    assert inputs[inputs >= SENTINELS_FROM].tolist() == list(range(199, 199 - len(spans_of(mask)), -1))
    assert targets[targets >= SENTINELS_FROM].tolist() == list(range(199, 199 - len(spans_of(~mask)), -1))


@settings(max_examples=50, deadline=None)
@given(seed=seeds, length=st.integers(2, 120), mean=st.sampled_from([2, 3, 5, 10]))
def test_span_corruption_targets_fill_the_inputs_sentinels_back_to_the_original(seed, length, mean):
    tokens = tokens_of(seed, length)
    mask = D.spans(mean)(length, 0.15, rng=np.random.default_rng(seed + 1))
    inputs = D.noise_span_to_unique_sentinel(tokens, mask, VOCAB)
    targets = D.nonnoise_span_to_unique_sentinel(tokens, mask, VOCAB)
    # Span masks start with non-noise, so sentinel k of the inputs is followed in the targets by its span.
    fills, key = {}, None
    for t in targets:
        if t >= SENTINELS_FROM:
            key = int(t)
            fills[key] = []
        else:
            fills[key].append(int(t))
    rebuilt = [x for t in inputs for x in (fills[int(t)] if t >= SENTINELS_FROM else [int(t)])]
    assert rebuilt == tokens.tolist()


@settings(max_examples=50, deadline=None)
@given(seed=seeds, length=st.integers(1, 120), density=st.floats(0.0, 1.0))
def test_drop_functions_partition_the_tokens(seed, length, density):
    tokens = tokens_of(seed, length)
    mask = D.iid_noise_mask(length, density, np.random.default_rng(seed + 1))
    merged = np.empty_like(tokens)
    merged[~mask] = D.drop_noise_tokens(tokens, mask)
    merged[mask] = D.drop_nonnoise_tokens(tokens, mask)
    assert merged.tolist() == tokens.tolist()
    one_sentinel = D.noise_span_to_sentinel(tokens, mask, VOCAB)
    assert len(one_sentinel) == (~mask).sum() + len(spans_of(mask)) and set(one_sentinel[one_sentinel >= SENTINELS_FROM]) <= {199}


@settings(max_examples=50, deadline=None)
@given(seed=seeds, length=st.integers(1, 120), density=st.floats(0.0, 1.0))
def test_permute_noise_tokens_keeps_the_rest_in_place(seed, length, density):
    rng = np.random.default_rng(seed)
    tokens = tokens_of(seed, length)
    mask = D.iid_noise_mask(length, density, rng)
    out = D.permute_noise_tokens(tokens, mask, VOCAB, rng)
    assert out[~mask].tolist() == tokens[~mask].tolist()
    assert sorted(out[mask].tolist()) == sorted(tokens[mask].tolist())


def test_random_token_or_sentinel_is_90_10_and_leaves_the_rest():
    rng = np.random.default_rng(0)
    tokens = tokens_of(1, 20000)
    mask = D.iid_noise_mask(len(tokens), 0.15, rng)
    out = D.noise_token_to_random_token_or_sentinel(tokens, mask, VOCAB, rng)
    assert out[~mask].tolist() == tokens[~mask].tolist()
    sentinel = out[mask] == 199
    # a random draw hits the sentinel id with probability 1/197
    assert_binomial(int((~sentinel).sum()), int(mask.sum()), 0.1 * (1 - 1 / 197))
    assert out[mask].min() >= D.NUM_RESERVED_TOKENS and out.max() < VOCAB.vocab_size


@settings(max_examples=20, deadline=None)
@given(seed=seeds, name=st.sampled_from(sorted(D.OBJECTIVES)))
def test_every_objective_is_deterministic_in_its_seed(seed, name):
    docs = [{"targets": tokens_of(seed + k, 50)} for k in range(3)]
    fn = D.t5_objective(name)
    first, again = list(fn(docs, FEATURES, seed)), list(fn(docs, FEATURES, seed))
    assert all(np.array_equal(a["inputs"], b["inputs"]) and np.array_equal(a["targets"], b["targets"])
               for a, b in zip(first, again))
    if D.OBJECTIVES[name][3] is None:   # targets = the original sequence
        assert all(np.array_equal(ex["targets"], doc["targets"]) for ex, doc in zip(first, docs))


def test_objectives_differ_between_seeds_and_unknown_names_fail():
    docs = [{"targets": tokens_of(0, 200)}]
    a = next(D.t5_objective("iid_replace_spans_15")(docs, FEATURES, 1))
    b = next(D.t5_objective("iid_replace_spans_15")(docs, FEATURES, 2))
    assert not np.array_equal(a["inputs"], b["inputs"])
    with pytest.raises(KeyError, match="choose one of"):
        D.t5_objective("bert")


@settings(max_examples=30, deadline=None)
@given(seed=seeds, lengths=st.lists(st.integers(1, 40), min_size=1, max_size=12), length=st.integers(2, 50))
def test_causal_lm_stream_is_the_documents_each_ending_in_eos(seed, lengths, length):
    docs = [{"targets": tokens_of(seed + k, n)} for k, n in enumerate(lengths)]
    pieces = [ex["targets"] for ex in D.causal_lm(docs, {"targets": length}, FEATURES, seed)]
    expected = np.concatenate([np.append(d["targets"], 1) for d in docs])
    assert np.concatenate(pieces).tolist() == expected.tolist()
    assert all(len(p) == length for p in pieces[:-1]) and 0 < len(pieces[-1]) <= length


def test_split_tokens_to_length_leaves_room_for_eos():
    docs = [{"targets": tokens_of(0, 25)}]
    pieces = list(D.split_tokens_to_length(docs, {"inputs": 10}, FEATURES))
    assert [len(p["targets"]) for p in pieces] == [9, 9, 7]
