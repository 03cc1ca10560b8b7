"""Hewitt and Manning's (2019) structural distance probe: a rank-k linear map B under which the
squared distance ||B(h_i - h_j)||^2 between two words' vectors approximates their distance in the
dependency tree. Trained with the L1 loss over all word pairs divided by the squared sentence
length, averaged over sentences (their `L1DistanceLoss`); scored by UUAS (the undirected edges of
the minimum spanning tree of the predicted distances among non-punctuation words that are gold
edges) and the distance Spearman correlation (per word, averaged per sentence length, then over
lengths 5-50), as their reporter does. Gold edges are the tree's edges between non-punctuation
words.
"""
from __future__ import annotations

import collections
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from t5lite import metrics

SPEARMAN_LENGTHS = (5, 50)


def tree_distances(heads: Sequence[int]) -> np.ndarray:
    """[n, n] path lengths in the tree given by 1-based heads (0: the root)."""
    n = len(heads)
    neighbours = [[] for _ in range(n)]
    for i, h in enumerate(heads):
        if h:
            neighbours[i].append(h - 1)
            neighbours[h - 1].append(i)
    dist = np.full((n, n), -1, np.int64)
    for source in range(n):     # breadth-first from every word
        dist[source, source], frontier = 0, [source]
        while frontier:
            nxt = []
            for i in frontier:
                for j in neighbours[i]:
                    if dist[source, j] < 0:
                        dist[source, j] = dist[source, i] + 1
                        nxt.append(j)
            frontier = nxt
    return dist.astype(np.float32)


def squared_distances(b, h):
    """||B(h_i - h_j)||^2 for all pairs: h [..., n, d], b [k, d] -> [..., n, n]."""
    t = h @ b.T
    diff = t[..., :, None, :] - t[..., None, :, :]
    return jnp.sum(diff * diff, -1)


def loss(b, h, gold, lengths):
    """h [s, n, d] (padded), gold [s, n, n], lengths [s]: mean over sentences of
    sum_ij |pred_ij - gold_ij| / length^2, pairs with a padded word left out."""
    mask = jnp.arange(h.shape[1]) < lengths[:, None]
    pair = (mask[:, :, None] & mask[:, None, :]).astype(h.dtype)
    per_sentence = jnp.sum(jnp.abs(squared_distances(b, h) - gold) * pair, (1, 2))
    return jnp.mean(per_sentence / lengths.astype(h.dtype) ** 2)


def padded(features: Sequence[np.ndarray], distances: Sequence[np.ndarray]):
    n = max(len(f) for f in features)
    h = np.zeros((len(features), n, features[0].shape[-1]), np.float32)
    gold = np.zeros((len(features), n, n), np.float32)
    for i, (f, d) in enumerate(zip(features, distances)):
        h[i, :len(f)], gold[i, :len(f), :len(f)] = f, d
    return h, gold, np.array([len(f) for f in features], np.int32)


@jax.jit
def _step(b, state, h, gold, lengths, learning_rate):
    updates, state = optax.adam(learning_rate).update(jax.grad(loss)(b, h, gold, lengths), state, b)
    return optax.apply_updates(b, updates), state


def fit(features: Sequence[np.ndarray], distances: Sequence[np.ndarray], rank: int = 32, epochs: int = 30,
        batch_size: int = 20, learning_rate: float = 1e-3, seed: int = 0) -> np.ndarray:
    """B [rank, d] by Adam on shuffled mini-batches of sentences (H&M: Adam at 1e-3, batches of 20,
    B initialised uniformly in [-0.05, 0.05])."""
    h, gold, lengths = padded(features, distances)
    b = jax.random.uniform(jax.random.key(seed), (rank, h.shape[-1]), minval=-0.05, maxval=0.05)
    state = optax.adam(learning_rate).init(b)
    size = min(batch_size, len(lengths))
    rng = np.random.default_rng(seed)
    for _ in range(epochs):     # full batches only, so one shape compiles
        order = rng.permutation(len(lengths))
        for start in range(0, len(order) - size + 1, size):
            idx = order[start:start + size]
            b, state = _step(b, state, h[idx], gold[idx], lengths[idx], learning_rate)
    return np.asarray(b)


def predict(b: np.ndarray, features: Sequence[np.ndarray]) -> list[np.ndarray]:
    return [np.asarray(squared_distances(jnp.asarray(b), jnp.asarray(f))) for f in features]


def spanning_tree(dist: np.ndarray, keep: np.ndarray) -> set[tuple[int, int]]:
    """Undirected edges (i < j) of the minimum spanning tree over the words where `keep` (Prim)."""
    nodes = np.flatnonzero(keep)
    if len(nodes) < 2:
        return set()
    d = dist[np.ix_(nodes, nodes)]
    inside = np.zeros(len(nodes), bool)
    inside[0] = True
    best, parent = d[0].copy(), np.zeros(len(nodes), np.int64)
    edges = set()
    for _ in range(len(nodes) - 1):
        j = int(np.argmin(np.where(inside, np.inf, best)))
        a, b = sorted((int(nodes[j]), int(nodes[parent[j]])))
        edges.add((a, b))
        inside[j] = True
        closer = d[j] < best
        best, parent = np.where(closer, d[j], best), np.where(closer, j, parent)
    return edges


def gold_edges(heads: Sequence[int], keep: np.ndarray) -> set[tuple[int, int]]:
    return {tuple(sorted((i, h - 1))) for i, h in enumerate(heads) if h and keep[i] and keep[h - 1]}


def uuas(predicted: Sequence[np.ndarray], heads: Sequence[Sequence[int]], punctuation) -> float:
    """Share of gold edges (between non-punctuation words) in the predicted distances' spanning tree."""
    correct = total = 0
    for dist, hs, punct in zip(predicted, heads, punctuation):
        keep = ~np.asarray(punct, bool)
        gold = gold_edges(hs, keep)
        correct += len(gold & spanning_tree(dist, keep))
        total += len(gold)
    return correct / total if total else float("nan")


def distance_spearman(predicted: Sequence[np.ndarray], gold: Sequence[np.ndarray],
                      lengths: tuple[int, int] = SPEARMAN_LENGTHS) -> float:
    """Spearman's rho between each word's predicted and gold distances to all words, averaged per
    sentence length, then over the lengths in [lengths[0], lengths[1]]."""
    by_length = collections.defaultdict(list)
    for p, g in zip(predicted, gold):
        if lengths[0] <= len(g) <= lengths[1]:
            by_length[len(g)] += [metrics.spearman_corrcoef(list(g[i]), list(p[i]))["spearman_corrcoef"] / 100
                                  for i in range(len(g))]
    return float(np.mean([np.mean(v) for v in by_length.values()])) if by_length else float("nan")
