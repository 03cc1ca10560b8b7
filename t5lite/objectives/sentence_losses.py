"""Sentence-BERT losses over sentence embeddings, as sentence-transformers defines them.

Each takes [batch, d] embeddings (one array per text column) and returns per-example losses
[batch] whose mean is the library's loss, so microbatches add up as sums; CoSENT, a single
log-sum-exp over all pairs of the batch, returns its one value. Similarities are cosines of
L2-normalised rows (torch's `normalize`, eps 1e-12), as `util.cos_sim`.

- `multiple_negatives_ranking`: InfoNCE. Row i's anchor scores every positive of the batch and
  every hard negative (scale * cosine); the target is its own positive.
- `contrastive`: 0.5 * (y d^2 + (1 - y) relu(margin - d)^2), d the cosine distance 1 - cos.
- `triplet`: relu(|a - p| - |a - n| + margin), Euclidean distances.
- `softmax`: cross entropy of a linear classifier's logits over (u, v, |u - v|)
  (t5lite.models.sentence.BiEncoder.classify), for NLI labels.
- `cosent`: log(1 + sum over pairs with y_i > y_j of exp(scale (cos_j - cos_i))).
- `cosine_similarity`: (cos(u, v) - y)^2, y the similarity in [0, 1] (STS-B's score / 5).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def unit(x):
    """Rows scaled to unit L2 norm (norms below 1e-12 clamped, as torch.nn.functional.normalize)."""
    return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def pairwise_cosine(u, v):
    """[batch] cosine of row i of u with row i of v."""
    return jnp.sum(unit(u) * unit(v), axis=-1)


def multiple_negatives_ranking(anchors, positives, *negatives, scale: float = 20.0):
    """[batch] cross entropy of each anchor over the batch's positives then the hard negatives."""
    candidates = jnp.concatenate([positives, *negatives], axis=0)
    scores = scale * unit(anchors) @ unit(candidates).T
    return optax.softmax_cross_entropy_with_integer_labels(scores, jnp.arange(anchors.shape[0]))


def contrastive(u, v, labels, margin: float = 0.5):
    """[batch] for binary labels (1: similar pair, 0: dissimilar), cosine distance."""
    distance = 1.0 - pairwise_cosine(u, v)
    labels = labels.astype(distance.dtype)
    return 0.5 * (labels * distance ** 2 + (1 - labels) * jax.nn.relu(margin - distance) ** 2)


def triplet(anchors, positives, negatives, margin: float = 5.0):
    """[batch] Euclidean triplet hinge."""
    distance = lambda x, y: jnp.linalg.norm(x - y, axis=-1)
    return jax.nn.relu(distance(anchors, positives) - distance(anchors, negatives) + margin)


def softmax(logits, labels):
    """[batch] cross entropy of the classifier's logits over (u, v, |u - v|)."""
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels.astype(jnp.int32))


def cosent(u, v, labels, scale: float = 20.0, weights=None):
    """The batch's CoSENT loss (a scalar): every pair (i, j) with labels[i] > labels[j] should have
    cos_i > cos_j. `weights` (0/1 per row) leaves padded rows out."""
    scores = scale * pairwise_cosine(u, v)
    higher = labels[:, None] > labels[None, :]
    if weights is not None:
        higher = higher & (weights[:, None] > 0) & (weights[None, :] > 0)
    differences = jnp.where(higher, scores[None, :] - scores[:, None], -jnp.inf)
    return jax.nn.logsumexp(jnp.concatenate([jnp.zeros(1, scores.dtype), differences.reshape(-1)]))


def cosine_similarity(u, v, labels):
    """[batch] squared error of the cosine against the label (mean: torch's MSELoss)."""
    return (pairwise_cosine(u, v) - labels.astype(jnp.float32)) ** 2
