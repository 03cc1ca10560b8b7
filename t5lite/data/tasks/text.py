"""Plain-text language-model tasks: `wikitext2` (the tokenized WikiText-2, one paragraph or heading
per example) and `embedded_docs_lines` (the embedded corpus, one non-blank line per example).

The text is `targets` (tokenized with the default vocabulary for the subword LMs, "decoder"
converter) and `targets_pretokenized`, which the word-level converters (`word_lm`, `word_lm_chars`)
split on whitespace. WikiText-2's files go in `<data_dir>/text/wikitext-2/` as `train.txt` (or
`wiki.train.tokens`), `valid.txt` and `test.txt`.
"""
from __future__ import annotations

import functools

from t5lite.data import preprocessors as P
from t5lite.data.corpus import embedded_documents
from t5lite.data.registry import FunctionSource, TaskRegistry
from t5lite.data.sources import FileSource, TextLines
from t5lite.data.tasks.pretraining import FEATURES, VALIDATION_EVERY

AS_TARGETS = functools.partial(P.rekey, key_map={"targets": "text"})
_WIKITEXT = "text/wikitext-2/"

TaskRegistry.add(
    "wikitext2",
    source=FileSource({"train": (_WIKITEXT + "train.txt", _WIKITEXT + "wiki.train.tokens"),
                       "validation": (_WIKITEXT + "valid.txt", _WIKITEXT + "wiki.valid.tokens"),
                       "test": (_WIKITEXT + "test.txt", _WIKITEXT + "wiki.test.tokens")}, TextLines()),
    preprocessors=[AS_TARGETS, P.tokenize],
    output_features={"targets": FEATURES["targets"]},
)


def embedded_lines(split: str) -> list[dict]:
    """Every non-blank line of the embedded documents; every 50th document is validation."""
    held_out = split == "validation"
    return [{"text": line.strip()} for i, doc in enumerate(embedded_documents())
            if (i % VALIDATION_EVERY == 0) == held_out for line in doc.splitlines() if line.strip()]


TaskRegistry.add(
    "embedded_docs_lines",
    source=FunctionSource(embedded_lines, splits=("train", "validation")),
    preprocessors=[AS_TARGETS, P.tokenize],
    output_features={"targets": FEATURES["targets"]},
)
