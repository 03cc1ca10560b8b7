"""BART noising, NSP/SOP pairs and FULL-/DOC-SENTENCES: property tests on random inputs (hypothesis)."""
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from objectives_helpers import PieceVocabulary, assert_binomial, features
from t5lite.data.corruption import bart_noise as B
from t5lite.data.corruption import sentence_pairs as S
from t5lite.data.corruption.masking import special_ids

VOCAB = PieceVocabulary()
FEATURES = features(VOCAB)
MASK = special_ids(VOCAB)["mask"]
seeds = st.integers(0, 2**31 - 1)


def tokens_of(seed, length):
    return np.random.default_rng(seed).integers(3, 190, size=length).astype(np.int32)


def is_subsequence(small, big):
    it = iter(big)
    return all(any(x == y for y in it) for x in small)


@settings(max_examples=50, deadline=None)
@given(seed=seeds, length=st.integers(0, 300), ratio=st.sampled_from([0.1, 0.3, 0.5]))
def test_text_infilling_masks_the_ratio_with_one_mask_per_span(seed, length, ratio):
    tokens = tokens_of(seed, length)
    rng = np.random.default_rng(seed)
    lengths = B.poisson_span_lengths(int(round(ratio * length)), 3.0, np.random.default_rng(seed))
    out = B.text_infilling(tokens, ratio, MASK, rng)
    kept = out[out != MASK]
    assert len(kept) == length - int(round(ratio * length))
    assert is_subsequence(kept.tolist(), tokens.tolist())
    assert (out == MASK).sum() == len(lengths)   # same draws: one mask per span, empty spans included


def test_poisson_span_lengths_have_mean_3_and_sum_exactly():
    rng = np.random.default_rng(0)
    lengths = np.concatenate([B.poisson_span_lengths(300, 3.0, rng)[:-1] for _ in range(200)])
    assert abs(lengths.mean() - 3.0) < 5 * np.sqrt(3.0 / len(lengths))
    assert_binomial(int((lengths == 0).sum()), len(lengths), np.exp(-3.0))
    assert B.poisson_span_lengths(77, 3.0, rng).sum() == 77


@settings(max_examples=50, deadline=None)
@given(seed=seeds, length=st.integers(0, 200), ratio=st.sampled_from([0.15, 0.3]))
def test_token_masking_and_deletion_counts(seed, length, ratio):
    tokens = tokens_of(seed, length)
    masked = B.token_masking(tokens, ratio, MASK, np.random.default_rng(seed))
    assert (masked == MASK).sum() == round(ratio * length) and (masked[masked != MASK] == tokens[masked != MASK]).all()
    deleted = B.token_deletion(tokens, ratio, np.random.default_rng(seed))
    assert len(deleted) == length - round(ratio * length) and is_subsequence(deleted.tolist(), tokens.tolist())


@settings(max_examples=50, deadline=None)
@given(seed=seeds, length=st.integers(0, 200))
def test_sentence_permutation_shuffles_whole_sentences(seed, length):
    tokens = np.append(tokens_of(seed, length), 7)   # ends a sentence, as BART's documents do
    ends = B.sentence_ends(tokens, VOCAB)
    assert ends.tolist() == [t % 7 == 0 for t in tokens]   # pieces ending in "."
    split = lambda seq: sorted(tuple(s) for s in np.split(seq, np.flatnonzero(B.sentence_ends(seq, VOCAB)) + 1) if len(s))
    out = B.sentence_permutation(tokens, ends, 1.0, np.random.default_rng(seed))
    assert split(out) == split(tokens)
    assert B.sentence_permutation(tokens, ends, 0.0, np.random.default_rng(seed)).tolist() == tokens.tolist()


@settings(max_examples=50, deadline=None)
@given(seed=seeds, length=st.integers(2, 100))
def test_document_rotation_is_a_nontrivial_rotation(seed, length):
    tokens = np.arange(length, dtype=np.int32) + 3
    out = B.document_rotation(tokens, np.random.default_rng(seed))
    offset = int(np.flatnonzero(out == tokens[0])[0])
    assert offset != 0 and out.tolist() == np.roll(tokens, offset).tolist()


@settings(max_examples=30, deadline=None)
@given(seed=seeds, lengths=st.lists(st.integers(1, 150), min_size=1, max_size=5))
def test_bart_uniform_layout_keeps_the_original_as_targets_and_infills_30_percent(seed, lengths):
    docs = [{"targets": tokens_of(seed + k, n)} for k, n in enumerate(lengths)]
    for doc, ex in zip(docs, B.bart_denoise(docs, FEATURES, seed, layout="uniform")):
        assert ex["targets"].tolist() == doc["targets"].tolist()
        kept = ex["inputs"][ex["inputs"] != MASK]
        assert len(kept) == len(doc["targets"]) - round(0.3 * len(doc["targets"]))
        assert not Counter(kept.tolist()) - Counter(doc["targets"].tolist())   # only original tokens, reordered


@pytest.mark.parametrize("settings, named", [
    (dict(mask_length="word"), "mask_length"), (dict(layout="paper"), "layout"),
    (dict(replace_length=2), "replace_length"), (dict(mask_length="token", replace_length=-1), "replace_length"),
    (dict(layout="uniform", random_ratio=0.1), "layout='fairseq'"),
    (dict(layout="uniform", insert_ratio=0.1), "layout='fairseq'")])
def test_bart_denoise_refuses_settings_it_cannot_apply_in_one_line(settings, named):
    with pytest.raises(ValueError, match=named):
        next(B.bart_denoise([{"targets": tokens_of(0, 10)}], FEATURES, 0, **settings))


# ----------------------------------------------------------------------------- sentence pairs


def documents(seed, count, max_sentences=8):
    rng = np.random.default_rng(seed)
    return [{"sentences": [rng.integers(3, 190, size=rng.integers(1, 12)).astype(np.int32)
                           for _ in range(rng.integers(1, max_sentences))]} for _ in range(count)]


def contains(haystack, needle):
    h, n = haystack.tolist(), needle.tolist()
    return any(h[i:i + len(n)] == n for i in range(len(h) - len(n) + 1))


@pytest.mark.parametrize("objective", ["nsp", "sop"])
def test_pairs_have_bert_layout(objective):
    """Layout and label meaning; the draws themselves are BERT's (tests/test_reference_corruption.py)."""
    docs = documents(0, 300)
    ids = special_ids(VOCAB)
    key = "next_sentence_label" if objective == "nsp" else "sentence_order_label"
    examples = list(S.sentence_pairs(docs, {"inputs": 200}, FEATURES, 0, objective=objective, short_seq_prob=0))
    whole = [np.concatenate(d["sentences"]) for d in docs]
    random_next = []
    for ex in examples:
        tokens, types = ex["inputs"], ex["token_type_ids"]
        seps = np.flatnonzero(tokens == ids["sep"])
        assert tokens[0] == ids["cls"] and len(seps) == 2 and seps[1] == len(tokens) - 1 and len(tokens) <= 200
        assert types.tolist() == [0] * (seps[0] + 1) + [1] * (len(tokens) - seps[0] - 1)
        a, b = tokens[1:seps[0]], tokens[seps[0] + 1:-1]
        in_order = any(contains(w, np.concatenate([a, b])) for w in whole)
        if objective == "sop":   # documents fit whole, so pairs are untruncated and consecutive
            swapped = any(contains(w, np.concatenate([b, a])) for w in whole)
            one_sentence_chunk = any(np.array_equal(a, s) for d in docs for s in d["sentences"])  # random B (ALBERT)
            assert (swapped or one_sentence_chunk) if ex[key] else in_order
        elif not ex[key]:
            assert in_order
        else:   # B is a piece of some (random) document, which rarely continues A
            assert any(contains(w, b) for w in whole)
            random_next.append(in_order)
    if objective == "nsp":
        assert np.mean(random_next) < 0.25


def test_pairs_reject_a_too_short_length_and_unknown_objectives():
    with pytest.raises(ValueError, match="at least 5"):
        next(S.sentence_pairs(documents(0, 2), {"inputs": 4}, FEATURES, 0))
    with pytest.raises(ValueError, match="'nsp' or 'sop'"):
        next(S.sentence_pairs(documents(0, 2), {"inputs": 64}, FEATURES, 0, objective="mlm"))


@settings(max_examples=30, deadline=None)
@given(seed=seeds, count=st.integers(1, 20), length=st.integers(3, 64), cross=st.booleans())
def test_full_and_doc_sentences_keep_every_token_in_order(seed, count, length, cross):
    docs = documents(seed, count)
    ids = special_ids(VOCAB)
    examples = list(S.full_sentences(docs, {"inputs": length}, FEATURES, cross_documents=cross))
    bodies = [ex["inputs"][1:-1] for ex in examples]
    assert all(ex["inputs"][0] == ids["cls"] and ex["inputs"][-1] == ids["sep"] and len(ex["inputs"]) <= length
               for ex in examples)
    stream = np.concatenate(bodies)
    expected = np.concatenate([np.concatenate(d["sentences"]) for d in docs])
    assert stream[stream != ids["sep"]].tolist() == expected.tolist()
    if not cross:   # DOC-SENTENCES: no separator inside, and as many sequences start documents as there are documents
        assert not any((body == ids["sep"]).any() for body in bodies)
        assert len(examples) >= count
    else:   # FULL-SENTENCES: a separator marks each document boundary that falls inside a sequence
        assert len(examples) <= sum(len(np.concatenate(d["sentences"])) for d in docs)
