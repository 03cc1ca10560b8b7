"""Feature converters of the word-level recurrent models: any text task to word ids (ELMo's biLM,
ULMFiT's AWD-LSTM) and, for ELMo, each word's 50 character ids.

The text is the example's `targets_pretokenized` (LM tasks such as `wikitext2`) or else
`inputs_pretokenized` (classification tasks such as `bert_glue_sst2`: their text for target-domain
LM fine-tuning, or with the `label` for classifying), split on whitespace and
framed by `<S>` ... `</S>`, cut to the `targets` (or `inputs`) length. Features:

- `encoder_input_tokens` [length]: word ids of t5lite.data.word_vocab (`word_vocabulary`, gin), 0 after
  the sentence. An LM predicts token t + 1 (forward) and t - 1 (backward) from position t, so the
  targets are the same row shifted and need no feature of their own.
- `encoder_input_chars` [length * 50] (the `*_chars` converters): t5lite.data.elmo_chars ids of
  each token, flattened so that every feature stays one row of ints; 0 after the sentence.
- `label` [1] (the `word_classification*` converters).

Rows are never packed: an LSTM carries its state across a row, so set `train.pack = False`.

`word_lm_stream` (ULMFiT's LM, `WordLMStreamConverter`) lays text out as fastai's `LMDataLoader`
instead: the framed texts joined into one stream, cut into B contiguous rows, so that row i of
batch k + 1 continues row i of batch k and a stateful LM carries its state from one to the next.
"""
from __future__ import annotations

import itertools
from typing import Iterable, Iterator, Mapping

import gin
import numpy as np

from t5lite.data import elmo_chars
from t5lite.data.converters import EXAMPLES_KEY, FeatureConverter, _length
from t5lite.data.word_vocab import SPECIALS, word_vocabulary
from t5lite.errors import ConfigError, DataError


class WordLMConverter(FeatureConverter):
    """Word ids (and char ids with `chars`) of each example's text, for LM pre-training."""
    name = "word_lm"
    text_keys, length_key = ("targets_pretokenized", "inputs_pretokenized"), "targets"

    def __init__(self, chars: bool = False):
        self.chars = chars

    def __repr__(self):
        return f"{type(self).__name__}(chars={self.chars})"

    def model_feature_lengths(self, task_feature_lengths: Mapping[str, int], pack: bool = False) -> dict[str, int]:
        length = _length(task_feature_lengths, self.length_key, self.name)
        lengths = {"encoder_input_tokens": length}
        if self.chars:
            lengths["encoder_input_chars"] = length * elmo_chars.MAX_CHARS
        return lengths

    def words(self, example) -> list[str]:
        key = next((k for k in self.text_keys if k in example), None)
        if key is None:
            raise DataError(f"the {self.name!r} converter reads {' or '.join(self.text_keys)}; this task's examples "
                            f"have {sorted(example)}: use a text task (wikitext2, embedded_docs_lines, bert_glue_*)")
        return word_vocabulary().tokens(str(example[key]))

    def row(self, words: list[str], length: int) -> dict[str, np.ndarray]:
        tokens = [SPECIALS[1], *words[:length - 2], SPECIALS[0]]
        row = {"encoder_input_tokens": np.zeros(length, np.int32)}
        row["encoder_input_tokens"][:len(tokens)] = word_vocabulary().encode_tokens(tokens)
        if self.chars:
            chars = np.zeros((length, elmo_chars.MAX_CHARS), np.int32)
            chars[0], chars[len(tokens) - 1] = elmo_chars.BOS_IDS, elmo_chars.EOS_IDS
            for i, word in enumerate(tokens[1:-1], start=1):
                chars[i] = elmo_chars.token_char_ids(word)
            row["encoder_input_chars"] = chars.reshape(-1)
        return row

    def checked_length(self, task_feature_lengths: Mapping[str, int], pack: bool) -> int:
        if pack:
            raise ConfigError(f"the {self.name!r} converter does not pack (an LSTM reads a row as one sequence); "
                              "set train.pack = False")
        length = _length(task_feature_lengths, self.length_key, self.name)
        if length < 3:
            raise ConfigError(f"{self.length_key!r} length {length}: a row needs <S>, a word and </S>")
        return length

    def convert(self, examples: Iterable, task_feature_lengths: Mapping[str, int],
                pack: bool = False) -> Iterator[dict]:
        length = self.checked_length(task_feature_lengths, pack)
        for example in examples:
            row = self.row(self.words(example), length)
            row.update(self.extra(example))
            row[EXAMPLES_KEY] = 1
            yield row

    def extra(self, example) -> dict[str, np.ndarray]:
        return {}


class WordClassificationConverter(WordLMConverter):
    """Word ids (and char ids) of a classification example's text, and its `label`."""
    name = "word_classification"
    text_keys, length_key = ("inputs_pretokenized",), "inputs"

    def model_feature_lengths(self, task_feature_lengths, pack=False):
        return {**super().model_feature_lengths(task_feature_lengths), "label": 1}

    def extra(self, example):
        return {"label": np.asarray(example["label"], np.int32).reshape(1)}


@gin.configurable
class WordLMStreamConverter(WordLMConverter):
    """fastai's `LMDataLoader` layout (fastai/text/data.py): the framed word ids of `stream_examples`
    consecutive examples joined into one stream of n ids, its first (n - 1) // B * B + 1 cut into B
    rows of bl = (n - 1) // B ids (plus the next row's first as the last target), and batch k row r
    = stream[r * bl + k * S : r * bl + k * S + S + 1] with S = `targets` length - 1 (fastai's
    seq_len, the words an LM reads per row): inputs are its first S ids, targets its last S, and
    the next batch starts at the last target, so every word but the first is predicted once.
    `reset_state` [1] is 1 in a stream's first batch (fastai's `ModelResetter` resets the LM at
    each epoch), 0 after.

    Where it differs from fastai, and why: a stream is `stream_examples` examples (gin) rather than
    one epoch, because the loader yields one endless, reshuffled example stream without epoch
    marks (set it to the split's size for fastai's exact epochs; None: every example, for
    evaluation); fastai's shorter last batch (bl % S words) is dropped, as every batch must have
    one shape for `jit`. A stream is read whole before its first batch and its examples count as
    consumed at its last batch, so resuming from a checkpoint inside a stream replays that stream
    from its start (with the state reset)."""
    name = "word_lm_stream"

    def __init__(self, stream_examples: int | None = 4096):
        super().__init__()
        if stream_examples is not None and stream_examples < 1:
            raise ConfigError(f"WordLMStreamConverter.stream_examples={stream_examples}: use a positive number of "
                              "examples per stream (the split's size for fastai's one stream per epoch) or None")
        self.stream_examples = stream_examples

    def __repr__(self):
        return f"{type(self).__name__}(stream_examples={self.stream_examples})"

    def model_feature_lengths(self, task_feature_lengths, pack=False):
        return {**super().model_feature_lengths(task_feature_lengths), "reset_state": 1}

    def convert(self, examples, task_feature_lengths, pack=False):
        """Each example's framed word ids, whole (the rows are cut by `batch`)."""
        length = self.checked_length(task_feature_lengths, pack)
        vocab = word_vocabulary()
        for example in examples:
            ids = vocab.encode_tokens([SPECIALS[1], *self.words(example), SPECIALS[0]])
            yield {"ids": np.asarray(ids, np.int32), "length": length, EXAMPLES_KEY: 1}

    def batch(self, rows, batch_size, drop_remainder=True):
        rows = iter(rows)
        while True:
            stream = list(itertools.islice(rows, self.stream_examples))
            if not stream:
                return
            yield from stream_batches(stream, batch_size, self.stream_examples)
            if self.stream_examples is None or len(stream) < self.stream_examples:
                return


def stream_batches(stream: list[dict], batch_size: int, stream_examples) -> Iterator[dict]:
    """`WordLMStreamConverter`'s batches of one stream of `convert` rows (fastai's
    `LMDataLoader.create_item` for every item of every full batch)."""
    ids = np.concatenate([row["ids"] for row in stream])
    seq_len = stream[0]["length"] - 1
    bl = (len(ids) - 1) // batch_size
    n_batches = bl // seq_len
    if n_batches == 0:
        raise ConfigError(f"a stream of {len(stream)} examples ({len(ids)} words) fills no batch of {batch_size} rows "
                          f"x {seq_len + 1} words: raise WordLMStreamConverter.stream_examples (now {stream_examples}) "
                          "or lower the batch size or the 'targets' length")
    starts = np.arange(batch_size)[:, None] * bl + np.arange(seq_len + 1)[None, :]
    for k in range(n_batches):
        yield {"encoder_input_tokens": ids[starts + k * seq_len],
               "reset_state": np.full((batch_size, 1), int(k == 0), np.int32),
               EXAMPLES_KEY: len(stream) if k == n_batches - 1 else 0}
