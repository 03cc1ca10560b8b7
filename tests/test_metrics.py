"""t5lite.metrics against the libraries T5 itself calls (sklearn, scipy, sacrebleu, rouge_score)
on random data, plus hand-worked SQuAD / MultiRC / ReCoRD cases."""
import math
import warnings

import numpy as np
import pytest
import sacrebleu
import scipy.stats
import sklearn.metrics
from rouge_score import rouge_scorer, scoring

from t5lite import metrics

SEEDS = [0, 1, 2, 3, 4]
WORDS = ("the cat dog sat ran on a mat house tree , . quickly running runs big small red "
         "blue green of to and Berlin München").split()


def _random_sentence(rng, lo=3, hi=15):
    return " ".join(rng.choice(WORDS, size=int(rng.integers(lo, hi))))


def _noisy_copy(rng, sentence, p=0.3):
    """A prediction that shares some words with the reference, so scores are not trivial."""
    return " ".join(w if rng.random() > p else str(rng.choice(WORDS)) for w in sentence.split())


# ----------------------------------------------------------------------------- classification

@pytest.mark.parametrize("seed", SEEDS)
def test_accuracy_matches_sklearn(seed):
    rng = np.random.default_rng(seed)
    t, p = rng.integers(0, 3, 50), rng.integers(0, 3, 50)
    got = metrics.accuracy(t, p)
    assert got.keys() == {"accuracy"}
    assert got["accuracy"] == pytest.approx(100 * sklearn.metrics.accuracy_score(t, p))


def test_accuracy_on_strings():
    assert metrics.accuracy(["yes", "no", "no"], ["yes", "no", "yes"])["accuracy"] == pytest.approx(200 / 3)


@pytest.mark.parametrize("seed", SEEDS)
def test_f1_with_valid_predictions_matches_sklearn(seed):
    rng = np.random.default_rng(seed)
    t, p = rng.integers(0, 2, 60), rng.integers(0, 2, 60)
    assert metrics.f1_score_with_invalid(t, p)["f1"] == pytest.approx(100 * sklearn.metrics.f1_score(t, p))


@pytest.mark.parametrize("seed", SEEDS)
def test_f1_invalid_predictions_count_as_wrong_class(seed):
    rng = np.random.default_rng(seed)
    t = rng.integers(0, 2, 60)
    p = rng.integers(-1, 2, 60)  # about a third invalid
    flipped = np.where(p == -1, 1 - t, p)
    assert metrics.f1_score_with_invalid(t, p)["f1"] == pytest.approx(
        100 * sklearn.metrics.f1_score(t, flipped))


def test_f1_invalid_hand_worked():
    # Targets 1,1,0,0; predictions 1, invalid, invalid, 0.
    # Invalid on a positive -> false negative; invalid on a negative -> false positive.
    # TP=1, FN=1, FP=1 -> F1 = 2/(2+1+1) = 0.5.
    assert metrics.f1_score_with_invalid([1, 1, 0, 0], [1, -1, "garbage", 0])["f1"] == pytest.approx(50.0)
    # All invalid: every positive missed, every negative a false alarm -> 0.
    assert metrics.f1_score_with_invalid([1, 0], [-1, -1])["f1"] == 0.0
    # No positives anywhere -> 0 (sklearn's zero_division), not nan.
    assert metrics.f1_score_with_invalid([0, 0], [0, 0])["f1"] == 0.0


def test_f1_rejects_non_binary_targets():
    with pytest.raises(ValueError, match="f1_score_with_invalid"):
        metrics.f1_score_with_invalid([0, 2], [0, 1])


@pytest.mark.parametrize("seed", SEEDS)
def test_matthews_matches_sklearn(seed):
    rng = np.random.default_rng(seed)
    t = rng.integers(0, 2, 80)
    p = np.where(rng.random(80) < 0.7, t, rng.integers(-1, 2, 80))  # correlated, some -1
    assert metrics.matthews_corrcoef(t, p)["matthews_corrcoef"] == pytest.approx(
        100 * sklearn.metrics.matthews_corrcoef(t, p))


def test_matthews_constant_predictions_is_zero():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = sklearn.metrics.matthews_corrcoef([0, 1, 1], [1, 1, 1])
    assert metrics.matthews_corrcoef([0, 1, 1], [1, 1, 1])["matthews_corrcoef"] == expected == 0.0


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("num_classes", [2, 3, 5])
def test_mean_multiclass_f1_matches_sklearn_macro(seed, num_classes):
    rng = np.random.default_rng(seed)
    t = rng.integers(0, num_classes, 40)
    p = rng.integers(-1, num_classes, 40)  # -1 = invalid prediction
    fn = metrics.mean_multiclass_f1(num_classes)
    key = f"mean_{num_classes}class_f1"
    assert fn.__name__ == key
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = sklearn.metrics.f1_score(t, p, labels=range(num_classes), average="macro")
    assert fn(t, p)[key] == pytest.approx(100 * expected)


def test_mean_multiclass_f1_absent_class_counts_as_zero():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = sklearn.metrics.f1_score([0, 1], [0, 1], labels=range(3), average="macro")
    got = metrics.mean_multiclass_f1(3)([0, 1], [0, 1])["mean_3class_f1"]
    assert got == pytest.approx(100 * expected) == pytest.approx(200 / 3)


# ----------------------------------------------------------------------------- regression

@pytest.mark.parametrize("seed", SEEDS)
def test_correlations_match_scipy(seed):
    rng = np.random.default_rng(seed)
    t = np.round(rng.uniform(0, 5, 70) * 5) / 5  # STS-B style, many ties
    p = np.round((t + rng.normal(0, 1.0, 70)) * 5) / 5
    assert metrics.pearson_corrcoef(t, p)["pearson_corrcoef"] == pytest.approx(
        100 * scipy.stats.pearsonr(t, p)[0], abs=1e-9)
    assert metrics.spearman_corrcoef(t, p)["spearman_corrcoef"] == pytest.approx(
        100 * scipy.stats.spearmanr(t, p)[0], abs=1e-9)


def test_correlation_constant_input_is_nan():
    assert math.isnan(metrics.pearson_corrcoef([1.0, 2.0, 3.0], [0.1, 0.1, 0.1])["pearson_corrcoef"])
    assert math.isnan(metrics.spearman_corrcoef([2.0, 2.0], [1.0, 3.0])["spearman_corrcoef"])


def test_string_to_float():
    assert metrics.string_to_float("3.8") == 3.8
    assert metrics.string_to_float(b" 1.0 ") == 1.0
    assert metrics.string_to_float("three") == -1.0
    assert metrics.string_to_float("", default=0.0) == 0.0
    preds = [metrics.string_to_float(s) for s in ["1.0", "oops", "4.2"]]
    assert metrics.pearson_corrcoef([1.0, 2.0, 4.0], preds)["pearson_corrcoef"] == pytest.approx(
        100 * scipy.stats.pearsonr([1.0, 2.0, 4.0], [1.0, -1.0, 4.2])[0])


# ----------------------------------------------------------------------------- SQuAD / ReCoRD

@pytest.mark.parametrize("text, expected", [
    ("The Eiffel Tower", "eiffel tower"),
    ("  an   apple, a pear!  ", "apple pear"),
    ("Theater of the absurd.", "theater of absurd"),  # "the" inside a word survives
    ("the-end", "theend"),                              # punctuation removed before articles
    ("A", ""),
    ("", ""),
])
def test_normalize_squad(text, expected):
    assert metrics.normalize_squad(text) == expected


def test_squad_hand_worked():
    targets = [
        ["The Eiffel Tower", "Eiffel tower in Paris"],  # EM via the first answer
        ["Denver Broncos"],                             # partial overlap
        ["blue", "dark blue sky"],                      # max F1 over answers
        ["nothing"],                                    # empty prediction
    ]
    predictions = ["eiffel tower!", "the Broncos", "a dark blue", ""]
    # 1: EM 1, F1 1.
    # 2: "broncos" vs "denver broncos": P=1, R=1/2 -> F1 2/3.
    # 3: "dark blue" vs "blue": P=1/2 R=1 -> 2/3; vs "dark blue sky": P=1 R=2/3 -> 0.8. Max 0.8.
    # 4: no overlap -> 0.
    got = metrics.squad(targets, predictions)
    assert got.keys() == {"em", "f1"}
    assert got["em"] == pytest.approx(100 * 1 / 4)
    assert got["f1"] == pytest.approx(100 * (1 + 2 / 3 + 0.8 + 0) / 4)


def test_squad_empty_answers_follow_v1_1():
    # Normalising "The" gives "", so empty vs empty: exact match, but F1 is 0 (SQuAD v1.1 / T5).
    assert metrics.squad([["The"]], [""]) == {"em": 100.0, "f1": 0.0}
    with pytest.raises(ValueError, match="squad: example 0 has no gold answers"):
        metrics.squad([[]], ["x"])


def test_squad_repeated_tokens_use_multiset_overlap():
    # pred "x x y" vs gold "x y y": the multiset overlap is one x and one y = 2 of 3 tokens each.
    got = metrics.squad([["x y y"]], ["x x y"])
    assert got["f1"] == pytest.approx(100 * 2 / 3)


def test_record_deduplicates_groups_and_takes_max():
    targets = [
        {"group": 0, "value": ["Obama", "Barack Obama"]},
        {"group": 0, "value": ["Obama", "Barack Obama"]},  # duplicate query: ignored
        {"group": 1, "value": ["Paris"]},
    ]
    predictions = [{"value": "barack obama"}, {"value": "wrong"}, {"value": "London"}]
    assert metrics.record_metrics(targets, predictions) == {"em": 50.0, "f1": 50.0}
    # Plain answer lists work too (no de-duplication).
    assert metrics.record_metrics([["Paris"], ["x"]], ["paris", "y"]) == {"em": 50.0, "f1": 50.0}


# ----------------------------------------------------------------------------- MultiRC

def _multirc(groups, values):
    return [{"group": g, "value": v} for g, v in zip(groups, values)]


def test_multirc_grouping():
    groups = [0, 0, 0, 1, 1, 2]
    targets = _multirc(groups, [1, 0, 1, 0, 0, 1])
    predictions = _multirc(groups, [1, 0, 1, 0, 1, -1])
    # Question 0 all right, question 1 has one miss, question 2 invalid -> EM 1/3.
    # F1 over options (invalid -> flipped to 0 on a positive): TP=2, FP=1 (q1), FN=1 (q2) -> 4/6.
    assert metrics.multirc_exact_match(targets, predictions) == {"exact_match": pytest.approx(100 / 3)}
    assert metrics.multirc_f1_over_all_answers(targets, predictions) == {"f1": pytest.approx(200 / 3)}
    assert metrics.multirc_metrics(targets, predictions) == {
        "exact_match": pytest.approx(100 / 3), "f1a": pytest.approx(200 / 3)}


def test_multirc_groups_need_not_be_contiguous_and_must_align():
    targets = _multirc(["q1", "q2", "q1"], [1, 1, 0])
    assert metrics.multirc_exact_match(targets, [1, 0, 0])["exact_match"] == 50.0
    with pytest.raises(ValueError, match="prediction group"):
        metrics.multirc_exact_match(targets, _multirc(["q1", "q1", "q2"], [1, 1, 0]))


@pytest.mark.parametrize("seed", SEEDS)
def test_multirc_random_matches_sklearn(seed):
    rng = np.random.default_rng(seed)
    groups = np.sort(rng.integers(0, 10, 50))
    t, p = rng.integers(0, 2, 50), rng.integers(0, 2, 50)
    got = metrics.multirc_metrics(_multirc(groups, t), _multirc(groups, p))
    expected_em = np.mean([np.array_equal(t[groups == g], p[groups == g]) for g in np.unique(groups)])
    assert got["exact_match"] == pytest.approx(100 * expected_em)
    assert got["f1a"] == pytest.approx(100 * sklearn.metrics.f1_score(t, p))


# ----------------------------------------------------------------------------- BLEU / ROUGE

def _sacrebleu(predictions, streams):
    return sacrebleu.corpus_bleu(predictions, streams, smooth_method="exp", smooth_value=0.0, force=False,
                                 lowercase=False, tokenize="intl", use_effective_order=False).score


@pytest.mark.parametrize("seed", SEEDS)
def test_bleu_single_reference_matches_sacrebleu(seed):
    rng = np.random.default_rng(seed)
    refs = [_random_sentence(rng) for _ in range(20)]
    preds = [_noisy_copy(rng, r) for r in refs]
    got = metrics.bleu(refs, preds)
    assert got.keys() == {"bleu"}
    assert 0 < got["bleu"] < 100
    assert got["bleu"] == pytest.approx(_sacrebleu(preds, [refs]))


@pytest.mark.parametrize("seed", SEEDS)
def test_bleu_multiple_references_are_transposed_to_streams(seed):
    rng = np.random.default_rng(seed)
    refs = [[_random_sentence(rng) for _ in range(int(rng.integers(1, 4)))] for _ in range(15)]
    preds = [_noisy_copy(rng, r[0]) for r in refs]
    width = max(len(r) for r in refs)
    streams = [[r[j] if j < len(r) else None for r in refs] for j in range(width)]
    assert metrics.bleu(refs, preds)["bleu"] == pytest.approx(_sacrebleu(preds, streams))


def test_bleu_perfect_and_case_sensitive():
    assert metrics.bleu(["the cat sat on the mat ."], ["the cat sat on the mat ."])["bleu"] == pytest.approx(100)
    assert metrics.bleu(["the cat sat on the mat ."], ["The Cat Sat On The Mat ."])["bleu"] < 100


@pytest.mark.parametrize("seed", SEEDS[:3])
def test_rouge_matches_rouge_score(seed):
    rng = np.random.default_rng(seed)
    refs = [" . ".join(_random_sentence(rng) for _ in range(3)) for _ in range(12)]
    preds = [_noisy_copy(rng, r) for r in refs]
    keys = ("rouge1", "rouge2", "rougeLsum")

    np.random.seed(seed)
    got = metrics.rouge(refs, preds)
    assert got.keys() == set(keys)

    np.random.seed(seed)
    scorer = rouge_scorer.RougeScorer(list(keys))  # T5's scorer: no stemmer
    aggregator = scoring.BootstrapAggregator()
    for r, p in zip(refs, preds):
        aggregator.add_scores(scorer.score(r.replace(" . ", " .\n"), p.replace(" . ", " .\n")))
    result = aggregator.aggregate()
    for key in keys:
        assert got[key] == pytest.approx(100 * result[key].mid.fmeasure)


def test_rouge_stems_only_when_asked_and_splits_sentences_on_newlines():
    # No stemming by default, as in T5; with it "running" ~ "runs" ~ "run".
    assert metrics.rouge(["cats running"], ["cat runs"])["rouge1"] == pytest.approx(0)
    assert metrics.rouge(["cats running"], ["cat runs"], use_stemmer=True)["rouge1"] == pytest.approx(100)
    # rougeLsum is a union-LCS over sentences, so reordering sentences costs nothing.
    got = metrics.rouge(["a b c\nd e f"], ["d e f\na b c"], score_keys=("rougeL", "rougeLsum"))
    assert got["rougeLsum"] == pytest.approx(100)
    assert got["rougeL"] < 100


# ----------------------------------------------------------------------------- edge cases / combining

ALL_FNS = [metrics.accuracy, metrics.f1_score_with_invalid, metrics.matthews_corrcoef,
           metrics.pearson_corrcoef, metrics.spearman_corrcoef, metrics.squad, metrics.bleu,
           metrics.rouge, metrics.mean_multiclass_f1(3), metrics.multirc_f1_over_all_answers,
           metrics.multirc_exact_match, metrics.multirc_metrics, metrics.record_metrics]


@pytest.mark.parametrize("fn", ALL_FNS, ids=lambda f: f.__name__)
def test_empty_inputs_raise_naming_the_function(fn):
    with pytest.raises(ValueError, match=fn.__name__):
        fn([], [])


@pytest.mark.parametrize("fn", ALL_FNS, ids=lambda f: f.__name__)
def test_length_mismatch_raises_naming_the_function(fn):
    with pytest.raises(ValueError, match=fn.__name__):
        fn([1, 0], [1])


def test_compute_metrics_merges():
    got = metrics.compute_metrics([metrics.f1_score_with_invalid, metrics.accuracy], [1, 0, 1, 1], [1, 0, 0, -1])
    assert got == {"f1": pytest.approx(100 * 2 / 4), "accuracy": 50.0}  # TP=1 FN=2 -> 2/(2+2)


def test_compute_metrics_duplicate_key_names_both_metrics():
    def percent_correct(targets, predictions):
        return {"accuracy": 0.0}

    with pytest.raises(ValueError, match="'accuracy' returned by both accuracy and percent_correct"):
        metrics.compute_metrics([metrics.accuracy, percent_correct], [1, 0], [1, 1])


def test_compute_metrics_length_mismatch():
    with pytest.raises(ValueError, match=r"compute_metrics \(accuracy\): got 2 targets but 3 predictions"):
        metrics.compute_metrics([metrics.accuracy], [1, 0], [1, 0, 1])


def test_values_are_python_floats():
    for value in metrics.compute_metrics([metrics.accuracy, metrics.matthews_corrcoef,
                                          metrics.mean_multiclass_f1(2)], [0, 1, 1], [0, 1, 0]).values():
        assert type(value) is float


def test_squad_v2_scores_a_correct_unanswerable_as_full_f1():
    from t5lite.metrics import squad, squad_v2
    targets, predictions = [[""], ["the cat"], ["a dog", ""]], ["", "cat", "The"]
    assert squad(targets, predictions) == {"em": 100.0, "f1": pytest.approx(100 / 3)}
    # The v2.0 script drops the "" among ["a dog", ""], so "The" (normalised "") misses "a dog".
    assert squad_v2(targets, predictions) == {"em": pytest.approx(200 / 3), "f1": pytest.approx(200 / 3)}
    assert squad_v2([[""]], ["some words"]) == {"em": 0.0, "f1": 0.0}
