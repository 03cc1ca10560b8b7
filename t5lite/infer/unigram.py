"""The unigram baseline of a held-out cross entropy: the same target tokens scored by how often each
token occurs among the targets of the first UNIGRAM_EXAMPLES training examples, what a model that
ignores its input scores. A loss at or above it means the model has learnt no more than how often
each token occurs."""
from __future__ import annotations

from typing import Iterable

import numpy as np

UNIGRAM_EXAMPLES = 10_000   # training examples the unigram frequencies are counted over


def token_counts(targets: Iterable[np.ndarray]) -> np.ndarray:
    """How often each token id occurs in `targets` (arrays of ids), indexed by id."""
    return np.bincount(np.concatenate([np.asarray(t, np.int64).reshape(-1) for t in targets] or [np.zeros(0, np.int64)]))


def unigram_loss(train_counts: np.ndarray, targets: np.ndarray, vocab_size: int) -> float:
    """The mean -log p(target) under the training counts with add-one-half smoothing over the
    vocabulary (Krichevsky-Trofimov), so that a token training never scored costs a finite amount."""
    counts = np.zeros(max(vocab_size, len(train_counts)))
    counts[:len(train_counts)] = train_counts
    log_p = np.log(counts + 0.5) - np.log(counts.sum() + 0.5 * len(counts))
    return float(-log_p[targets].mean())
