"""Consecutive sentences of a text corpus, one per row, in corpus order (Quick-Thought's data).

The `consecutive_sentences` converter reads a text task's examples (`targets_pretokenized`, as
`wikitext2` or `embedded_docs_lines` give one paragraph or line each), splits each into sentences
(after `.`, `!` or `?` and white space, before a character that is not a lower-case letter, so
WikiText's " . " ends a sentence and "H. americanus" does not), drops WikiText's `= Heading =`
lines, and yields each sentence as `[CLS] sentence [SEP]` in `text0_input_tokens`, with
`paragraph` [1], the index of its example in the stream (so an objective knows which neighbours in
a batch come from the same paragraph: Skip-Thought decodes only those). Its batches
are runs of consecutive rows, never reordered: a batch holds `batch_size` consecutive sentences
of the example stream. The loader shuffles examples (paragraphs), not sentences, so a paragraph's
sentences stay together and only the sentences at a paragraph's edges meet another paragraph.
A paragraph counts as consumed (the loader's resume position) with its last sentence, so a run
resumed from a checkpoint taken inside a paragraph starts again at that paragraph's first sentence.
"""
from __future__ import annotations

import re
from typing import Iterable, Iterator

import numpy as np

from t5lite.data import vocab as vocab_lib
from t5lite.data.converters import EXAMPLES_KEY, Row
from t5lite.data.sentence_texts import SentenceTextsConverter, encode_text, text_key, text_lengths
from t5lite.errors import ConfigError

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[^a-z\s])")
_HEADING = re.compile(r"^\s*=.*=\s*$")


def split_sentences(text: str) -> list[str]:
    """The sentences of one paragraph, in order; none for a `= Heading =` line."""
    if _HEADING.match(text):
        return []
    return [s for s in (p.strip() for p in _SENTENCE_END.split(text.strip())) if s]


class ConsecutiveSentencesConverter(SentenceTextsConverter):
    """Rows `text0_input_tokens` [text0 length] (one sentence), `label` [1] (0) and `paragraph` [1]
    (int32: which example of the stream the sentence comes from), in corpus order."""
    name = "consecutive_sentences"

    def __init__(self):
        super().__init__(no_duplicates=False)

    def __repr__(self):
        return "ConsecutiveSentencesConverter()"

    def model_feature_lengths(self, task_feature_lengths, pack=False):
        return {**super().model_feature_lengths({"text0": self._length(task_feature_lengths)}, pack), "paragraph": 1}

    def convert(self, examples: Iterable[dict], task_feature_lengths, pack=False) -> Iterator[Row]:
        if pack:
            raise ConfigError("the 'consecutive_sentences' converter encodes each sentence on its own; "
                              "set train.pack = False")
        length = self._length(task_feature_lengths)
        vocabulary = vocab_lib.DEFAULT_VOCABULARY
        finished = 0   # examples done since the last row was counted (those without a sentence)
        for paragraph, ex in enumerate(examples):
            if "targets_pretokenized" not in ex:
                raise ConfigError(f"the 'consecutive_sentences' converter reads a text task's targets_pretokenized; "
                                  f"the examples have {sorted(ex)}: use a text task (wikitext2, embedded_docs_lines)")
            text = ex["targets_pretokenized"]
            text = text.decode("utf-8") if isinstance(text, bytes) else str(text)
            index = np.array([paragraph % 2**31], np.int32)
            sentences = split_sentences(text)
            finished += 1
            for i, sentence in enumerate(sentences):
                (row,) = super().convert([{text_key(0): encode_text(vocabulary, sentence, length)}], {"text0": length})
                counted = finished if i == len(sentences) - 1 else 0
                finished -= counted
                yield {**row, "paragraph": index, EXAMPLES_KEY: counted}

    @staticmethod
    def _length(task_feature_lengths) -> int:
        return text_lengths(task_feature_lengths)[0]
