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
"""
from __future__ import annotations

from typing import Iterable, Iterator, Mapping

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

    def convert(self, examples: Iterable, task_feature_lengths: Mapping[str, int],
                pack: bool = False) -> Iterator[dict]:
        if pack:
            raise ConfigError(f"the {self.name!r} converter does not pack (an LSTM reads a row as one sequence); "
                              "set train.pack = False")
        length = _length(task_feature_lengths, self.length_key, self.name)
        if length < 3:
            raise ConfigError(f"{self.length_key!r} length {length}: a row needs <S>, a word and </S>")
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
