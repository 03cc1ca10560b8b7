"""word2vec's vocabulary: the words of a corpus seen at least `min_count` times, by falling count,
with the two distributions training draws from.

- `keep_probabilities`: frequent-word subsampling, word2vec.c's keep probability
  (sqrt(f / t) + 1) * t / f of a word with corpus frequency f (capped at 1; t = `sample`).
- `noise_distribution`: negative samples from the unigram distribution raised to 3/4.

Id 0 is padding; the words take ids 1..n (most frequent first), so a word vector file written from
the table keeps word2vec's row order.

    vocab = word2vec_vocabulary(task="wikitext2", split="test", min_count=5, data_dir="/data")
"""
from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Iterable

import gin
import numpy as np

from t5lite.data.registry import TaskRegistry
from t5lite.errors import ConfigError, DataError

PAD_ID = 0


@dataclasses.dataclass(frozen=True)
class Word2VecVocabulary:
    """`words[i]` has id i + 1 and was counted `counts[i]` times; other words are dropped."""
    words: tuple[str, ...]
    counts: np.ndarray
    lowercase: bool = False

    @functools.cached_property
    def ids(self) -> dict[str, int]:
        return {w: i + 1 for i, w in enumerate(self.words)}

    @property
    def vocab_size(self) -> int:
        """Rows of the embedding tables: the words and the pad."""
        return len(self.words) + 1

    def encode(self, text: str) -> list[int]:
        """Ids of the whitespace tokens of `text` that are in the vocabulary (word2vec skips the others)."""
        ids = self.ids
        return [ids[w] for w in (text.lower() if self.lowercase else text).split() if w in ids]

    def keep_probabilities(self, sample: float) -> np.ndarray:
        """[vocab_size] probability that a word is kept by subsampling (0 for the pad; all 1 when
        `sample` is 0, word2vec's 'off')."""
        keep = np.ones(self.vocab_size)
        if sample > 0:
            threshold = sample * self.counts.sum()
            keep[1:] = np.minimum((np.sqrt(self.counts / threshold) + 1) * threshold / self.counts, 1.0)
        keep[PAD_ID] = 0.0
        return keep

    def noise_distribution(self, power: float = 0.75) -> np.ndarray:
        """[vocab_size] probability of each id as a negative sample: count^power, normalised; 0 for the pad."""
        weights = np.concatenate([[0.0], self.counts.astype(np.float64) ** power])
        return weights / weights.sum()


def build(texts: Iterable[str], min_count: int = 5, lowercase: bool = False) -> Word2VecVocabulary:
    """Words seen at least `min_count` times, most frequent first (ties in order of first appearance)."""
    counts = collections.Counter(w for text in texts for w in (text.lower() if lowercase else text).split())
    kept = sorted(((w, c) for w, c in counts.items() if c >= min_count), key=lambda wc: -wc[1])
    if not kept:
        raise DataError(f"no word occurs {min_count} times in the corpus; lower word2vec_vocabulary.min_count")
    return Word2VecVocabulary(tuple(w for w, _ in kept), np.array([c for _, c in kept], np.int64), lowercase)


@gin.configurable
@functools.lru_cache(maxsize=4)
def word2vec_vocabulary(task: str | None = None, split: str = "train", field: str = "text", min_count: int = 5,
                        lowercase: bool = False, data_dir: str | None = None) -> Word2VecVocabulary:
    """The vocabulary counted over the `field` of `task`'s raw `split` records (the corpus trained on)."""
    if task is None:
        raise ConfigError("word2vec_vocabulary.task is not set: name the text task to count words in "
                          "(e.g. 'wikitext2') and set word2vec_vocabulary.data_dir")
    records = TaskRegistry.get(task).source.load(split, data_dir=data_dir)
    try:
        texts = [str(r[field]) for r in records]
    except KeyError:
        raise ConfigError(f"task {task!r} has no field {field!r} in its raw records; set "
                          "word2vec_vocabulary.field to the text field") from None
    return build(texts, min_count, lowercase)
