"""Hewitt and Manning's (2019) structural distance probe: a rank-k linear map B under which the
squared distance ||B(h_i - h_j)||^2 between two words' vectors approximates their distance in the
dependency tree. As their code (john-hewitt/structural-probes) has it: trained with the L1 loss over
all word pairs divided by the squared sentence length, averaged over sentences (`L1DistanceLoss`),
by `ProbeRegimen` (Adam at 1e-3, the rate divided by 10 whenever the dev loss stops falling,
stopped five epochs after its last improvement, the best B kept); scored by UUAS (the share of the
gold distances' minimum spanning tree's edges in the predicted distances' one, both among the words
whose XPOS is not in their punctuation list: `prims_matrix_to_edges`) and the distance Spearman
correlation (per word, averaged per sentence length, then over lengths 5-50: `report_spearmanr`).
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
    """h [s, n, d] (padded), gold [s, n, n], lengths [s]: sum_ij |pred_ij - gold_ij| / length^2
    averaged over the sentences of non-zero length (padding sentences have length 0), pairs with a
    padded word left out (their `L1DistanceLoss`)."""
    mask = jnp.arange(h.shape[1]) < lengths[:, None]
    pair = (mask[:, :, None] & mask[:, None, :]).astype(h.dtype)
    per_sentence = jnp.sum(jnp.abs(squared_distances(b, h) - gold) * pair, (1, 2))
    return jnp.sum(per_sentence / jnp.maximum(lengths, 1).astype(h.dtype) ** 2) / jnp.sum(lengths > 0)


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


_loss = jax.jit(loss)


def _batches(h, gold, lengths, order, size):
    """Batches of `size` sentences in `order`, the last filled up with sentences of length 0 (one
    shape compiles; the loss leaves them out)."""
    for start in range(0, len(order), size):
        idx = order[start:start + size]
        pad = size - len(idx)
        yield (np.pad(h[idx], ((0, pad), (0, 0), (0, 0))), np.pad(gold[idx], ((0, pad), (0, 0), (0, 0))),
               np.pad(lengths[idx], (0, pad)), len(idx))


def fit(features: Sequence[np.ndarray], distances: Sequence[np.ndarray], dev_features: Sequence[np.ndarray],
        dev_distances: Sequence[np.ndarray], rank: int = 32, max_epochs: int = 40, batch_size: int = 20,
        learning_rate: float = 1e-3, seed: int = 0) -> tuple[np.ndarray, int]:
    """(B [rank, d] at its best dev loss, epochs trained), by H&M's `ProbeRegimen`: Adam on shuffled
    batches of sentences (the last one short), B initialised uniformly in [-0.05, 0.05]; after each
    epoch PyTorch's ReduceLROnPlateau (factor 0.1, patience 0, relative threshold 1e-4) on the dev
    loss, and a stop once five epochs have passed without the dev loss falling by 1e-4. H&M's
    configurations: `max_epochs` 40, batches of 20."""
    h, gold, lengths = padded(features, distances)
    dev = padded(dev_features, dev_distances)
    b = jax.random.uniform(jax.random.key(seed), (rank, h.shape[-1]), minval=-0.05, maxval=0.05)
    state = optax.adam(learning_rate).init(b)
    size = min(batch_size, len(lengths))
    rng = np.random.default_rng(seed)
    best, best_epoch, best_b = np.inf, -1, b
    plateau_best, rate = np.inf, learning_rate
    for epoch in range(max_epochs):
        for batch in _batches(h, gold, lengths, rng.permutation(len(lengths)), size):
            b, state = _step(b, state, *batch[:3], rate)
        dev_loss = sum(float(_loss(b, *batch[:3])) * batch[3]
                       for batch in _batches(*dev, np.arange(len(dev[2])), size)) / len(dev[2])
        if dev_loss < plateau_best * (1 - 1e-4):      # ReduceLROnPlateau(mode="min", factor=0.1, patience=0)
            plateau_best = dev_loss
        elif rate - rate * 0.1 > 1e-8:                  # its eps: smaller steps are not taken
            rate *= 0.1
        if dev_loss < best - 1e-4:
            best, best_epoch, best_b = dev_loss, epoch, b
        elif best_epoch < epoch - 4:
            return np.asarray(best_b), epoch + 1
    return np.asarray(best_b), max_epochs


def predict(b: np.ndarray, features: Sequence[np.ndarray]) -> list[np.ndarray]:
    return [np.asarray(squared_distances(jnp.asarray(b), jnp.asarray(f))) for f in features]


# H&M's punctuation: the XPOS (Penn Treebank) tags `prims_matrix_to_edges` leaves out of the trees.
PUNCTUATION_XPOS = ("''", ",", ".", ":", "``", "-LRB-", "-RRB-")


def punctuation(xpos: Sequence[str]) -> np.ndarray:
    return np.isin(np.asarray(xpos, dtype=object), PUNCTUATION_XPOS)


def spanning_tree(dist: np.ndarray, keep: np.ndarray) -> list[tuple[int, int]]:
    """Edges (i < j) of the minimum spanning tree over the words where `keep`, as H&M's
    `prims_matrix_to_edges` builds it (Kruskal over the pairs sorted stably by distance, row by row,
    so equal distances, as in gold trees, are taken in their order)."""
    nodes = np.flatnonzero(keep)
    i, j = np.triu_indices(len(nodes), 1)
    parent = list(range(len(nodes)))

    def root(x):
        while parent[x] != x:
            x = parent[x]
        return x
    edges = []
    for k in np.argsort(dist[nodes[i], nodes[j]], kind="stable"):
        a, c = root(i[k]), root(j[k])
        if a != c:
            parent[a] = c
            edges.append((int(nodes[i[k]]), int(nodes[j[k]])))
    return edges


def uuas(predicted: Sequence[np.ndarray], gold: Sequence[np.ndarray], punctuation_masks) -> float:
    """H&M's UUAS: the share of the gold distances' spanning tree edges (over the non-punctuation
    words: n - 1 of them) that the predicted distances' spanning tree holds."""
    correct = total = 0
    for pred, dist, punct in zip(predicted, gold, punctuation_masks):
        keep = ~np.asarray(punct, bool)
        gold_edges = set(spanning_tree(dist, keep))
        correct += len(gold_edges & set(spanning_tree(pred, keep)))
        total += len(gold_edges)
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
