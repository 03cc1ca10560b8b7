"""A small vocabulary with known word and sentence structure for the objective tests."""
from __future__ import annotations

import numpy as np
from scipy import stats


class PieceVocabulary:
    """Ids 0-2 pad/EOS/UNK, then pieces: every third starts a word ("▁w…", or "##" WordPiece style
    marks the others as continuations), every seventh ends a sentence ("."), sentinels on top."""
    pad_id, eos_id, unk_id = 0, 1, 2

    def __init__(self, vocab_size: int = 200, extra_ids: int = 10, wordpiece: bool = False):
        self.vocab_size, self.extra_ids, self.wordpiece = vocab_size, extra_ids, wordpiece

    def id_to_piece(self, i: int) -> str:
        if i < 3:
            return ["<pad>", "</s>", "<unk>"][i]
        if i >= self.vocab_size - self.extra_ids:
            return f"▁<extra_id_{self.vocab_size - 1 - i}>"
        stop = "." if i % 7 == 0 else ""
        if i % 3 == 0:
            return (f"w{i}" if self.wordpiece else f"▁w{i}") + stop
        return (f"##x{i}" if self.wordpiece else f"x{i}") + stop


class Feature:
    def __init__(self, vocabulary):
        self.vocabulary, self.add_eos = vocabulary, True


def features(vocabulary) -> dict:
    return {"inputs": Feature(vocabulary), "targets": Feature(vocabulary)}


def binomial_bounds(n: int, p: float, alpha: float = 1e-6) -> tuple[float, float]:
    """Counts outside [low, high] have probability below alpha under Binomial(n, p)."""
    return stats.binom.ppf(alpha / 2, n, p), stats.binom.isf(alpha / 2, n, p)


def assert_binomial(count: int, n: int, p: float):
    low, high = binomial_bounds(n, p)
    assert low <= count <= high, f"{count} of {n} is outside the binomial bounds [{low}, {high}] for p={p}"
