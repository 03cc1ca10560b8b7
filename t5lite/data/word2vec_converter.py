"""The `word2vec` feature converter: a text task's lines as rows of word2vec word ids.

Each example's `targets_pretokenized` (or `inputs_pretokenized`) is split on whitespace, words
outside t5lite.data.word2vec_vocab's vocabulary (gin `word2vec_vocabulary`) are dropped, as
word2vec.c does, and the ids fill `encoder_input_tokens` rows of the `targets` length, 0 after the
line's end; a longer line continues on the next rows (word2vec.c cuts its sentences at 1000
words). A line is one window context: rows are never packed. Subsampling and windows are drawn at
train time (t5lite.objectives.word2vec), so the rows are the same every epoch.
"""
from __future__ import annotations

from typing import Iterable, Iterator, Mapping

import numpy as np

from t5lite.data.converters import EXAMPLES_KEY, FeatureConverter, _length
from t5lite.data.word2vec_vocab import Word2VecVocabulary, word2vec_vocabulary
from t5lite.errors import ConfigError, DataError

TEXT_KEYS = ("targets_pretokenized", "inputs_pretokenized")


class Word2VecConverter(FeatureConverter):
    """Rows of word ids; `vocabulary` defaults to gin's `word2vec_vocabulary()`."""
    name = "word2vec"

    def __init__(self, vocabulary: Word2VecVocabulary | None = None):
        self.vocabulary = vocabulary

    def model_feature_lengths(self, task_feature_lengths: Mapping[str, int], pack: bool = False) -> dict[str, int]:
        return {"encoder_input_tokens": _length(task_feature_lengths, "targets", self.name)}

    def convert(self, examples: Iterable, task_feature_lengths: Mapping[str, int],
                pack: bool = False) -> Iterator[dict]:
        if pack:
            raise ConfigError("the 'word2vec' converter keeps each line in its own rows (a window never crosses "
                              "lines): set train.pack = False")
        length = _length(task_feature_lengths, "targets", self.name)
        vocabulary = self.vocabulary or word2vec_vocabulary()
        consumed = 0   # examples read since the last row (a line with no known word yields none)
        for example in examples:
            key = next((k for k in TEXT_KEYS if k in example), None)
            if key is None:
                raise DataError(f"the 'word2vec' converter reads {' or '.join(TEXT_KEYS)}; this task's examples have "
                                f"{sorted(example)}: use a text task (e.g. wikitext2)")
            ids = vocabulary.encode(str(example[key]))
            consumed += 1
            for start in range(0, len(ids), length):
                chunk = ids[start:start + length]
                row = np.zeros(length, np.int32)
                row[:len(chunk)] = chunk
                last = start + length >= len(ids)
                yield {"encoder_input_tokens": row, EXAMPLES_KEY: consumed if last else 0}
                consumed = 0 if last else consumed
