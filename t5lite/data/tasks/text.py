"""Plain-text language-model tasks: `wikitext2` and `wikitext103` (WikiText, tokenized or raw, one
paragraph or heading per example) and `embedded_docs_lines` (the embedded corpus, one non-blank line
per example).

The text is `targets` (tokenized with the default vocabulary for the subword LMs, "decoder"
converter) and `targets_pretokenized`, which the word-level converters (`word_lm`, `word_lm_chars`)
split on whitespace. WikiText-2's files go in `<data_dir>/text/wikitext-2/` as `train.txt` (or
`wiki.train.tokens` / `wiki.train.raw`), `valid.txt` and `test.txt`; WikiText-103's in
`<data_dir>/text/wikitext-103/`.
"""
from __future__ import annotations

import functools

from t5lite.data import preprocessors as P
from t5lite.data.corpus import embedded_documents
from t5lite.data.registry import FunctionSource, TaskRegistry
from t5lite.data.sources import FileSource, TextLines
from t5lite.data.tasks.pretraining import FEATURES, VALIDATION_EVERY

AS_TARGETS = functools.partial(P.rekey, key_map={"targets": "text"})


def wikitext_source(folder: str) -> FileSource:
    """WikiText's files in `<data_dir>/text/<folder>/`: `train.txt` (PyTorch's examples' name), the
    release's tokenized `wiki.train.tokens` or its raw `wiki.train.raw`, the first that exists."""
    def names(short: str) -> tuple[str, ...]:
        return tuple(f"text/{folder}/{name}" for name in (f"{short}.txt", f"wiki.{short}.tokens", f"wiki.{short}.raw"))
    return FileSource({split: names(short) for split, short in
                       (("train", "train"), ("validation", "valid"), ("test", "test"))}, TextLines())


for _name, _folder in (("wikitext2", "wikitext-2"), ("wikitext103", "wikitext-103")):
    TaskRegistry.add(_name, source=wikitext_source(_folder), preprocessors=[AS_TARGETS, P.tokenize],
                     output_features={"targets": FEATURES["targets"]})


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
