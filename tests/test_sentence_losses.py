"""Sentence-BERT losses and pooling against sentence-transformers: its loss modules called with a
dummy model that returns given embeddings, and its Pooling module on given token embeddings."""
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close

from t5lite.models.heads import pool
from t5lite.models.sentence import classifier_features
from t5lite.objectives import sentence_losses as S

torch = pytest.importorskip("torch", reason="sentence-transformers runs on PyTorch")
st_losses = pytest.importorskip("sentence_transformers.sentence_transformer.losses",
                                reason="sentence-transformers' loss classes are the reference")


class Given(torch.nn.Module):
    """A stand-in SentenceTransformer: each column's features carry its embeddings."""
    device = torch.device("cpu")

    def forward(self, features):
        return {"sentence_embedding": features["embedding"]}


def reference(loss, columns, labels=None):
    features = [{"embedding": torch.tensor(np.asarray(c))} for c in columns]
    return float(loss(features, None if labels is None else torch.tensor(np.asarray(labels))).detach())


def columns(n, batch=6, d=8, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(batch, d)).astype(np.float32) for _ in range(n)]


@pytest.mark.parametrize("n", [2, 3, 4])
def test_multiple_negatives_ranking(n):
    cols = columns(n)
    ours = float(jnp.mean(S.multiple_negatives_ranking(*cols, scale=20.0)))
    assert_close(ours, reference(st_losses.MultipleNegativesRankingLoss(Given(), scale=20.0), cols,
                                 np.zeros(6, np.int64)), rtol=1e-5)


def test_contrastive():
    u, v = columns(2, seed=1)
    labels = np.array([1, 0, 1, 0, 0, 1], np.float32)
    ours = float(jnp.mean(S.contrastive(u, v, labels, margin=0.5)))
    # near-orthogonal random vectors: move some pairs inside the margin so both terms count
    assert_close(ours, reference(st_losses.ContrastiveLoss(Given(), margin=0.5), [u, v], labels), rtol=1e-5)
    close = [u, u + 0.3 * v]
    ours = float(jnp.mean(S.contrastive(*close, labels, margin=0.5)))
    assert_close(ours, reference(st_losses.ContrastiveLoss(Given(), margin=0.5), close, labels), rtol=1e-5)


def test_triplet():
    a, p, n = columns(3, seed=2)
    ours = float(jnp.mean(S.triplet(a, p, n, margin=5.0)))
    assert ours > 0
    assert_close(ours, reference(st_losses.TripletLoss(Given(), triplet_margin=5), [a, p, n]), rtol=1e-5)


def test_softmax_over_u_v_difference():
    u, v = columns(2, seed=3)
    labels = np.array([0, 1, 2, 2, 1, 0])
    loss = st_losses.SoftmaxLoss(Given(), sentence_embedding_dimension=8, num_labels=3)
    kernel = loss.classifier.weight.detach().numpy().T
    bias = loss.classifier.bias.detach().numpy()
    ours = float(jnp.mean(S.softmax(classifier_features(u, v) @ kernel + bias, labels)))
    assert_close(ours, reference(loss, [u, v], labels), rtol=1e-5)


def test_cosent_with_ties():
    u, v = columns(2, seed=4)
    labels = np.array([0.2, 0.8, 0.2, 1.0, 0.0, 0.6], np.float32)
    ours = float(S.cosent(u, v, labels, scale=20.0))
    assert_close(ours, reference(st_losses.CoSENTLoss(Given(), scale=20.0), [u, v], labels), rtol=1e-5)
    # padded rows (weight 0) change nothing
    pad = lambda x: np.concatenate([x, np.ones_like(x[:2])])
    padded = float(S.cosent(pad(u), pad(v), np.concatenate([labels, [5.0, -5.0]]), 20.0, np.array([1] * 6 + [0] * 2)))
    assert_close(padded, ours, rtol=1e-5)


def test_cosine_similarity_regression():
    u, v = columns(2, seed=5)
    labels = np.linspace(0, 1, 6).astype(np.float32)
    ours = float(jnp.mean(S.cosine_similarity(u, v, labels)))
    assert_close(ours, reference(st_losses.CosineSimilarityLoss(Given()), [u, v], labels), rtol=1e-5)


@pytest.mark.parametrize("how,mode", [("mean", "mean"), ("cls", "cls"), ("max", "max")])
def test_pooling_as_sentence_transformers(how, mode):
    from sentence_transformers.sentence_transformer.modules import Pooling
    rng = np.random.default_rng(6)
    hidden = rng.normal(size=(3, 7, 8)).astype(np.float32)
    mask = np.array([[1] * 7, [1] * 3 + [0] * 4, [1] * 5 + [0] * 2])
    expected = Pooling(8, pooling_mode=mode)({"token_embeddings": torch.tensor(hidden),
                                                "attention_mask": torch.tensor(mask)})["sentence_embedding"]
    assert_close(np.asarray(pool(jnp.asarray(hidden), jnp.asarray(mask), how)), expected.numpy(), rtol=1e-5)
