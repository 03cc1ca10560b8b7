"""Pre-training tasks: span corruption on the embedded corpus (no download needed; a corpus `t5lite
prepare` wrote replaces it when data_dir holds one) and on C4."""
from __future__ import annotations

import functools

from t5lite.data import preprocessors as P
from t5lite.data.corpus import embedded_documents
from t5lite.data.prepared import PreparedSource
from t5lite.data.registry import Feature, FunctionSource, TaskRegistry
from t5lite.data.sources import TfdsSource
from t5lite.data.vocab import DEFAULT_VOCABULARY

VALIDATION_EVERY = 50  # every 50th document is held out for validation


def embedded_docs(split: str) -> list[dict]:
    docs = embedded_documents()
    held_out = split == "validation"
    return [{"text": d} for i, d in enumerate(docs) if (i % VALIDATION_EVERY == 0) == held_out]


FEATURES = {"inputs": Feature(DEFAULT_VOCABULARY), "targets": Feature(DEFAULT_VOCABULARY)}
# A corpus `t5lite prepare` wrote when data_dir holds one, else the embedded corpus.
EMBEDDED_SOURCE = PreparedSource(fallback=FunctionSource(embedded_docs, splits=("train", "validation")))

TaskRegistry.add(
    "embedded_docs_span_corruption",
    source=EMBEDDED_SOURCE,
    preprocessors=[functools.partial(P.rekey, key_map={"inputs": None, "targets": "text"}), P.tokenize,
                   P.span_corruption],
    output_features=FEATURES,
)

# T5's pre-training task: your own corpus when data_dir holds `t5lite prepare` output, else TFDS c4/en
# (cleaned by TFDS with the rules t5lite.data.c4 implements).
TaskRegistry.add(
    "c4_span_corruption",
    source=PreparedSource(fallback=TfdsSource("c4/en", ("train", "validation"),
                                              module="tensorflow_datasets.text.c4")),
    preprocessors=[functools.partial(P.rekey, key_map={"inputs": None, "targets": "text"}), P.tokenize,
                   P.span_corruption],
    output_features=FEATURES,
)
