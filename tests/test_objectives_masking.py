"""BERT's masked LM and SpanBERT's span masking: property tests on random inputs (hypothesis)."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from objectives_helpers import PieceVocabulary, assert_binomial, features
from t5lite.data.corruption import masking as M

VOCAB = PieceVocabulary()
FEATURES = features(VOCAB)
SPECIAL = M.special_ids(VOCAB)
seeds = st.integers(0, 2**31 - 1)


def sequence(seed, length):
    """[CLS] random regular tokens [SEP]."""
    body = np.random.default_rng(seed).integers(3, 190, size=length)
    return np.concatenate([[SPECIAL["cls"]], body, [SPECIAL["sep"]]]).astype(np.int32)


def words_of(tokens, vocabulary=VOCAB):
    """Reference word segmentation from the pieces: a word starts at a "▁" piece (or a non-"##" one)."""
    pieces = [vocabulary.id_to_piece(int(t)) for t in tokens]
    starts = [not p.startswith("##") if vocabulary.wordpiece else p.startswith("▁") for p in pieces]
    special = ~np.isin(tokens, np.arange(3, 190))
    starts = np.array(starts) | special | np.concatenate([[True], special[:-1]])   # specials stand alone
    return np.cumsum(starts)


@settings(max_examples=40, deadline=None)
@given(seed=seeds, length=st.integers(1, 200), whole_word=st.booleans())
def test_bert_mlm_chooses_15_percent_of_whole_words_never_specials(seed, length, whole_word):
    tokens = sequence(seed, length)
    (ex,) = M.bert_mlm([{"inputs": tokens}], FEATURES, seed, whole_word=whole_word)
    chosen = ex["targets_loss_weights"].astype(bool)
    assert ex["targets"].tolist() == tokens.tolist()
    assert not chosen[[0, -1]].any()
    assert (ex["inputs"][~chosen] == tokens[~chosen]).all()
    target = max(1, round(len(tokens) * 0.15))   # BERT counts [CLS] and [SEP] in
    words = words_of(tokens) if whole_word else np.arange(len(tokens))
    body_words = words[1:-1]
    longest = np.bincount(body_words - body_words.min()).max()
    assert target - longest < chosen.sum() <= target
    if whole_word:   # every word is chosen whole or not at all
        for w in np.unique(body_words):
            assert len(set(chosen[1:-1][body_words == w])) == 1


def test_bert_mlm_is_80_10_10_on_the_chosen_tokens():
    tokens = sequence(0, 50000)
    (ex,) = M.bert_mlm([{"inputs": tokens}], FEATURES, 3, whole_word=False)
    chosen = ex["targets_loss_weights"].astype(bool)
    n = int(chosen.sum())
    masked = ex["inputs"][chosen] == SPECIAL["mask"]
    unchanged = ex["inputs"][chosen] == tokens[chosen]
    assert_binomial(int(masked.sum()), n, 0.8)
    assert_binomial(int(unchanged.sum()), n, 0.1 + 0.1 / 187)   # a random token can equal the original
    random = ex["inputs"][chosen][~masked & ~unchanged]
    assert np.isin(random, np.arange(3, 190)).all()


def test_whole_words_follow_wordpiece_continuations():
    vocabulary = PieceVocabulary(wordpiece=True)
    tokens = sequence(1, 300)
    (ex,) = M.bert_mlm([{"inputs": tokens}], features(vocabulary), 0)
    chosen = ex["targets_loss_weights"].astype(bool)[1:-1]
    words = words_of(tokens, vocabulary)[1:-1]
    assert all(len(set(chosen[words == w])) == 1 for w in np.unique(words))
    assert M.word_starts(np.array([3, 4]), vocabulary).tolist() == [True, False]   # "w3", "##x4"


def test_static_masks_are_fixed_across_epochs_dynamic_ones_are_not():
    docs = [{"inputs": sequence(k, 100)} for k in range(3)]
    static = lambda seed: [ex["inputs"] for ex in M.bert_mlm(docs, FEATURES, seed, static_seed=0, num_static_copies=4)]
    dynamic = lambda seed: [ex["inputs"] for ex in M.bert_mlm(docs, FEATURES, seed)]
    a, b = static(1), static(2)   # the loader gives each epoch its own seed
    assert len(a) == 12 and all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(a[0], a[1])   # the copies of one example differ
    assert not all(np.array_equal(x, y) for x, y in zip(dynamic(1), dynamic(2)))
    assert all(np.array_equal(x, y) for x, y in zip(dynamic(1), dynamic(1)))
    with pytest.raises(ValueError, match="static_seed"):
        next(M.bert_mlm(docs, FEATURES, 0, num_static_copies=10))


def test_span_length_distribution_is_spanberts():
    probs = M.span_length_distribution(0.2, 10)
    assert probs.sum() == pytest.approx(1.0)
    assert (np.arange(1, 11) * probs).sum() == pytest.approx(3.8, abs=0.05)   # SpanBERT paper, section 3.1
    assert np.allclose(probs[1:] / probs[:-1], 0.8)


@settings(max_examples=40, deadline=None)
@given(seed=seeds, length=st.integers(3, 300))
def test_spanbert_spans_start_at_words_and_fill_the_budget(seed, length):
    """Properties of SpanBERT's scheme (draw for draw: tests/test_reference_corruption.py)."""
    tokens = sequence(seed, length)
    (ex,) = M.spanbert_mlm([{"inputs": tokens}], FEATURES, seed)
    chosen = ex["targets_loss_weights"].astype(bool)
    words = words_of(tokens)
    assert not chosen[[0, -1]].any()
    assert chosen.sum() == math.ceil(length * 0.15)     # sequence() adds [CLS] and [SEP] around length tokens
    assert (ex["inputs"][~chosen] == tokens[~chosen]).all() and ex["targets"].tolist() == tokens.tolist()
    starts, ends = ex["span_starts"], ex["span_ends"]
    covered = np.zeros(len(tokens), bool)
    for s, e in zip(starts, ends):
        assert 0 < s <= e < len(tokens) - 1
        assert chosen[s:e + 1].all() and not chosen[s - 1] and not chosen[e + 1]   # merged spans
        assert s == 1 or words[s - 1] != words[s]                                  # from a word start
        is_mask = ex["inputs"][s:e + 1] == SPECIAL["mask"]
        assert is_mask.all() or not is_mask.any()   # one treatment per span
        covered[s:e + 1] = True
        span, inner = np.arange(s, e + 1), s > 1 and e < len(tokens) - 2
        with_target = span[:15] if inner else span[:0]        # boundary targets: inner spans, first 15 tokens
        assert (ex["span_left_boundary"][with_target] == s - 1).all()
        assert (ex["span_right_boundary"][with_target] == e + 1).all()
        assert ex["span_relative_position"][span].tolist() == [*range(1, len(with_target) + 1),
                                                                *[0] * (len(span) - len(with_target))]
    assert (covered == chosen).all()
    assert (ex["span_relative_position"][~chosen] == 0).all()


def test_spanbert_masks_15_percent_of_the_block_rounded_up():
    tokens = sequence(0, 5000)
    (ex,) = M.spanbert_mlm([{"inputs": tokens}], FEATURES, 0)
    assert ex["targets_loss_weights"].sum() == math.ceil(5000 * 0.15)


def test_whole_words_need_pieces_and_say_so():
    class IdsOnly:
        vocab_size, extra_ids, eos_id = 200, 10, 1
    with pytest.raises(ValueError, match="whole_word=False"):
        next(M.bert_mlm([{"inputs": sequence(0, 20)}], features(IdsOnly()), 0))
    (ex,) = M.bert_mlm([{"inputs": sequence(0, 20)}], features(IdsOnly()), 0, whole_word=False)
    assert ex["targets_loss_weights"].sum() == 3


def test_80_10_10_matches_hugging_faces_mlm_collator(tmp_path):
    """transformers' DataCollatorForLanguageModeling (BERT's recipe) on the same tokens: the same
    shares of [MASK], random and kept among the chosen positions, and no special token chosen."""
    pytest.importorskip("torch", reason="the Hugging Face reference needs torch")
    transformers = pytest.importorskip("transformers", reason="the Hugging Face reference needs transformers")
    import torch
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(195)]
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n")
    tokenizer = transformers.BertTokenizerFast(vocab_file=str(tmp_path / "vocab.txt"))
    torch.manual_seed(0)
    body = np.random.default_rng(0).integers(5, 200, size=(40, 500))
    ids = np.concatenate([np.full((40, 1), 2), body, np.full((40, 1), 3)], axis=1)
    collator = transformers.DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)
    out = collator([{"input_ids": torch.tensor(row)} for row in ids])
    theirs_chosen = (out["labels"] != -100).numpy()
    theirs = out["input_ids"].numpy()
    assert not theirs_chosen[:, [0, -1]].any()
    n = int(theirs_chosen.sum())
    hf_mask_share = (theirs[theirs_chosen] == 4).sum() / n
    hf_kept_share = (theirs[theirs_chosen] == ids[theirs_chosen]).sum() / n
    tokens = sequence(0, 20000)
    (ex,) = M.bert_mlm([{"inputs": tokens}], FEATURES, 0, whole_word=False)
    chosen = ex["targets_loss_weights"].astype(bool)
    ours_mask = int((ex["inputs"][chosen] == SPECIAL["mask"]).sum())
    ours_kept = int((ex["inputs"][chosen] == tokens[chosen]).sum())
    # both shares against each other: a two-proportion z-test at a 1e-6 level
    from scipy import stats
    for ours, share in ((ours_mask, hf_mask_share), (ours_kept, hf_kept_share)):
        table = [[ours, int(chosen.sum()) - ours], [round(share * n), n - round(share * n)]]
        assert stats.chi2_contingency(table).pvalue > 1e-6


def test_gin_sets_the_bert_options_of_the_mlm_tasks(clean_gin_state):
    import gin
    import itertools
    import t5lite.data.tasks  # noqa: F401  (registers the tasks)
    from t5lite.data import get_task
    gin.parse_config(["bert_mlm.max_predictions_per_seq = 2", "bert_mlm.random_from = 'vocabulary'"])
    examples = itertools.islice(get_task("embedded_docs_bert_mlm").get_dataset("train", {"inputs": 64}), 5)
    assert [int(ex["targets_loss_weights"].sum()) for ex in examples] == [2] * 5
    gin.parse_config("bert_mlm.random_from = 'all'")
    with pytest.raises(ValueError, match="random_from='all'"):
        next(get_task("embedded_docs_bert_mlm").get_dataset("train", {"inputs": 64}))
