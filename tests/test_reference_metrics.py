"""t5lite.metrics against the reference code each docstring names, run here on the same random
inputs: SQuAD, ReCoRD and MultiRC against t5's own metric functions (`t5.evaluation.metrics`, as
`t5.data.glue_utils` registers them), SQuAD 2.0 against the official v2.0 scoring that transformers
ships (`transformers.data.metrics.squad_metrics.get_raw_scores`), and the retrieval metrics against
sentence-transformers' `InformationRetrievalEvaluator.compute_metrics`."""
import types

import numpy as np
import pytest

from t5lite import metrics

t5_metrics = pytest.importorskip("t5.evaluation.metrics", reason="the t5 reference needs the `reference` extra")

WORDS = "The the a an cat sat on mat , . ! Denver Broncos blue dark sky sky".split()
SEEDS = range(5)


def _answer(rng, lo=0, hi=5):
    return " ".join(rng.choice(WORDS, size=int(rng.integers(lo, hi))))


def _squad_case(rng, n=60):
    """Gold answer lists (some normalising to "", e.g. "The ."), and predictions that often share words."""
    targets = [[_answer(rng, 1) for _ in range(int(rng.integers(1, 4)))] for _ in range(n)]
    predictions = [rng.choice(t) if rng.random() < 0.3 else _answer(rng) for t in targets]
    return targets, predictions


@pytest.mark.parametrize("seed", SEEDS)
def test_squad_equals_t5s(seed):
    targets, predictions = _squad_case(np.random.default_rng(seed))
    theirs = t5_metrics.squad(targets, predictions)
    ours = metrics.squad(targets, predictions)
    assert ours == pytest.approx({"em": theirs["em"], "f1": theirs["f1"]})


@pytest.mark.parametrize("seed", SEEDS)
def test_record_equals_t5s_deduplicated_squad(seed):
    rng = np.random.default_rng(seed)
    answers, predictions = _squad_case(rng)
    groups = np.sort(rng.integers(0, 25, len(answers)))
    targets = [{"group": int(g), "value": a} for g, a in zip(groups, answers)]
    preds = [{"value": p} for p in predictions]
    theirs = t5_metrics.deduplicate_metric(t5_metrics.squad)(targets, preds)   # glue_utils' record metric
    assert metrics.record_metrics(targets, preds) == pytest.approx({"em": theirs["em"], "f1": theirs["f1"]})


@pytest.mark.parametrize("seed", SEEDS)
def test_multirc_equals_t5s(seed):
    rng = np.random.default_rng(seed)
    groups = rng.integers(0, 12, 80)                       # not contiguous: t5 groups by key
    t, p = rng.integers(0, 2, 80), rng.choice([0, 1, -1], 80, p=[0.45, 0.45, 0.1])
    targets = [{"group": int(g), "value": int(v)} for g, v in zip(groups, t)]
    preds = [{"group": int(g), "value": int(v)} for g, v in zip(groups, p)]
    # glue_utils' multirc metrics: f1 over all answers, then the mean over questions of all_match.
    f1 = t5_metrics.multirc_f1_over_all_answers(targets, [dict(x) for x in preds])["f1"]
    em = t5_metrics.mean_group_metric(t5_metrics.all_match)(targets, preds)["exact_match"]
    assert metrics.multirc_metrics(targets, preds) == pytest.approx({"exact_match": em, "f1a": f1})


@pytest.mark.parametrize("seed", SEEDS)
def test_squad_v2_equals_the_official_v2_scoring(seed):
    squad_metrics = pytest.importorskip("transformers.data.metrics.squad_metrics",
                                        reason="transformers' squad_metrics is the SQuAD 2.0 reference")
    rng = np.random.default_rng(seed)
    targets, predictions = _squad_case(rng)
    targets = [t if rng.random() < 0.7 else [] for t in targets]           # unanswerable questions
    predictions = [p if rng.random() < 0.7 else "" for p in predictions]
    examples = [types.SimpleNamespace(qas_id=str(i), answers=[{"text": a} for a in t]) for i, t in enumerate(targets)]
    exact, f1 = squad_metrics.get_raw_scores(examples, {str(i): p for i, p in enumerate(predictions)})
    ours = metrics.squad_v2([t or [""] for t in targets], predictions)
    assert ours == pytest.approx({"em": 100 * np.mean(list(exact.values())), "f1": 100 * np.mean(list(f1.values()))})


def test_squad_v2_ignores_a_gold_answer_that_normalises_to_nothing():
    """The official v2.0 script drops such answers before taking the max (an empty prediction
    matches only a question with no real answer)."""
    assert metrics.squad_v2([["The", "Broncos"]], [""]) == {"em": 0.0, "f1": 0.0}


@pytest.mark.parametrize("seed", SEEDS)
def test_retrieval_equals_sentence_transformers_information_retrieval_evaluator(seed):
    evaluation = pytest.importorskip("sentence_transformers.sentence_transformer.evaluation.information_retrieval",
                                     reason="sentence-transformers is the reference for retrieval metrics")
    rng = np.random.default_rng(seed)
    num_queries, num_docs = 30, 40
    scores = rng.normal(size=(num_queries, num_docs))
    relevant = [set(rng.choice(num_docs, int(rng.integers(1, 4)), replace=False).tolist()) for _ in range(num_queries)]
    evaluator = evaluation.InformationRetrievalEvaluator(
        {str(q): "q" for q in range(num_queries)}, {str(d): "d" for d in range(num_docs)},
        {str(q): {str(d) for d in r} for q, r in enumerate(relevant)},
        mrr_at_k=[10], ndcg_at_k=[10], accuracy_at_k=[1], precision_recall_at_k=[1, 5, 10], map_at_k=[10])
    theirs = evaluator.compute_metrics([[{"corpus_id": str(d), "score": float(s)} for d, s in enumerate(row)]
                                        for row in scores])
    ranked = np.argsort(-scores, axis=1, kind="stable")[:, :10]
    ours = metrics.retrieval([sorted(r) for r in relevant], ranked.tolist())
    expected = {**{f"recall@{k}": 100 * theirs["recall@k"][k] for k in (1, 5, 10)},
                "mrr@10": 100 * theirs["mrr@k"][10], "ndcg@10": 100 * theirs["ndcg@k"][10]}
    assert ours == pytest.approx(expected)
