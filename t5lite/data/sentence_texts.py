"""Texts for bi-encoders (Sentence-BERT): each text of an example encoded on its own.

- `sentence_texts` (a preprocessor) turns an example's `text_keys` into `text0`, `text1`, ...
  (anchor, positive, hard negatives; or sentence 1, sentence 2), each `[CLS] text [SEP]` cut to
  `sequence_length["text<i>"]`, keeping the strings as `text<i>_pretokenized` and the `label`.
- The `sentence_texts` converter pads each to its length as `text<i>_input_tokens` plus `label`
  [1] (float32; 0 when the task has none). Its batches never hold a text twice (sentence-
  transformers' NoDuplicatesBatchSampler): a row whose text is already in the batch waits for a
  later one, so a repeated text (a SQuAD context asked about twice) is never its own in-batch
  negative. Resuming restarts from the number of rows trained on, so a row still waiting at a
  checkpoint may come in another batch than it would have.
"""
from __future__ import annotations

from typing import Iterable, Iterator, Mapping, Sequence

import gin
import numpy as np

from t5lite.data.converters import EXAMPLES_KEY, FeatureConverter, Row, _stack
from t5lite.data.finetune_converters import _build
from t5lite.data.corruption.masking import special_ids
from t5lite.data.registry import Example
from t5lite.errors import ConfigError

PASSED_THROUGH = ("idx", "id")


def text_key(i: int) -> str:
    return f"text{i}"


def text_lengths(task_feature_lengths: Mapping[str, int]) -> list[int]:
    """The lengths of `text0`, `text1`, ... (consecutive keys) in TASK_FEATURE_LENGTHS."""
    lengths = []
    while text_key(len(lengths)) in task_feature_lengths:
        lengths.append(int(task_feature_lengths[text_key(len(lengths))]))
    if not lengths:
        raise ConfigError(f"TASK_FEATURE_LENGTHS={dict(task_feature_lengths)} has no 'text0': a bi-encoder task "
                          "needs one length per text, e.g. {'text0': 64, 'text1': 256}")
    return lengths


def encode_text(vocabulary, text: str, length: int) -> np.ndarray:
    """`[CLS] text [SEP]` in at most `length` tokens (the text cut, as a tokenizer truncates)."""
    if length < 3:
        raise ConfigError(f"a text length of {length} leaves no room for text after [CLS]/[SEP]; use 3 or more")
    ids = special_ids(vocabulary)
    return _build([vocabulary.encode(text)[:length - 2]], ids["cls"], ids["sep"])[0]


def sentence_texts(dataset: Iterable[Example], sequence_length: Mapping[str, int], output_features,
                   text_keys: Sequence[str]) -> Iterator[Example]:
    """Each example's `text_keys` -> `text0`, `text1`, ... token ids (see the module)."""
    vocabulary = output_features["inputs"].vocabulary
    lengths = text_lengths(sequence_length)
    if len(lengths) < len(text_keys):
        raise ConfigError(f"the task has {len(text_keys)} texts {list(text_keys)} but TASK_FEATURE_LENGTHS gives "
                          f"{len(lengths)}; add 'text{len(lengths)}'")
    for ex in dataset:
        out = {k: ex[k] for k in ("label", *PASSED_THROUGH) if k in ex}
        for i, key in enumerate(text_keys):
            out[text_key(i)] = encode_text(vocabulary, ex[key], lengths[i])
            out[f"{text_key(i)}_pretokenized"] = ex[key]
        yield out


@gin.configurable
class SentenceTextsConverter(FeatureConverter):
    """Rows `text<i>_input_tokens` [length_i] and `label` [1]; batches without repeated texts
    (`no_duplicates`, gin: `SentenceTextsConverter.no_duplicates`)."""
    name = "sentence_texts"

    def __init__(self, no_duplicates: bool = True):
        self.no_duplicates = no_duplicates

    def __repr__(self):
        return f"SentenceTextsConverter(no_duplicates={self.no_duplicates})"

    def model_feature_lengths(self, task_feature_lengths, pack=False):
        return {**{f"{text_key(i)}_input_tokens": n for i, n in enumerate(text_lengths(task_feature_lengths))},
                "label": 1}

    def convert(self, examples, task_feature_lengths, pack=False) -> Iterator[Row]:
        if pack:
            raise ConfigError("the 'sentence_texts' converter encodes each text on its own; set train.pack = False")
        lengths = text_lengths(task_feature_lengths)
        for ex in examples:
            row = {}
            for i, n in enumerate(lengths):
                tokens = np.zeros(n, np.int32)
                ids = np.asarray(ex[text_key(i)], np.int32)[:n]
                tokens[:len(ids)] = ids
                row[f"{text_key(i)}_input_tokens"] = tokens
            row["label"] = np.asarray(ex.get("label", 0), np.float32).reshape(1)
            row[EXAMPLES_KEY] = 1
            yield row

    def batch(self, rows: Iterable[Row], batch_size: int, drop_remainder: bool = True) -> Iterator[Row]:
        if not self.no_duplicates:
            return super().batch(rows, batch_size, drop_remainder)
        return no_duplicate_batches(rows, batch_size, drop_remainder)


def _texts(row: Row) -> set[bytes]:
    return {v.tobytes() for k, v in row.items() if k.endswith("_input_tokens")}


def no_duplicate_batches(rows: Iterable[Row], batch_size: int, drop_remainder: bool = True) -> Iterator[Row]:
    """Batches of `batch_size` rows in which no text occurs twice: each batch takes the waiting
    rows first, in order, then new ones; a row sharing a text with the batch waits."""
    if batch_size < 1:
        raise ConfigError(f"batch_size must be positive, got {batch_size}")
    rows, waiting, exhausted = iter(rows), [], False
    while True:
        batch, seen, still_waiting = [], set(), []

        def fits(row) -> bool:
            texts = _texts(row)
            if texts & seen:
                return False
            batch.append(row)
            seen.update(texts)
            return True

        for i, row in enumerate(waiting):
            if len(batch) == batch_size:
                still_waiting.extend(waiting[i:])
                break
            if not fits(row):
                still_waiting.append(row)
        while len(batch) < batch_size and not exhausted:
            row = next(rows, None)
            if row is None:
                exhausted = True
            elif not fits(row):
                still_waiting.append(row)
        waiting = still_waiting
        if len(batch) == batch_size or (batch and not drop_remainder):
            yield _stack(batch)
        if not batch or (exhausted and len(batch) < batch_size and not waiting):
            return
