"""Summarization as T5 casts it: "summarize: <article>" -> summary, scored with ROUGE.

`cnn_dailymail` (TFDS `cnn_dailymail`: article -> highlights) and `xsum` (TFDS `xsum`: document ->
summary). Local files: JSON lines or CSV with those columns, named after the split (`validation.jsonl`,
or any `*validation*.csv` such as the Hugging Face export `cnn_dailymail_validation_subset.csv`).
"""
from __future__ import annotations

import functools
from typing import Iterable, Iterator

from t5lite import metrics
from t5lite.data import preprocessors as P
from t5lite.data.registry import Example, TaskRegistry
from t5lite.data.sources import BySuffix, FileSource, FilesOrTfds, JsonLines, Table, TfdsSource
from t5lite.data.tasks.pretraining import FEATURES

SPLITS = ("train", "validation", "test")


def summarize(dataset: Iterable[Example], article_key: str, summary_key: str) -> Iterator[Example]:
    """T5's `summarize`: "summarize: <article>" -> the summary."""
    for ex in dataset:
        yield {"inputs": f"summarize: {ex[article_key]}", "targets": ex[summary_key]}


def _register(name: str, module: str, article_key: str, summary_key: str) -> None:
    columns = {article_key: article_key, summary_key: summary_key}
    csv = Table(columns, delimiter=",", quoted=True, index_key=None)
    reader = BySuffix({".jsonl": JsonLines(columns), ".csv": csv})
    files = FileSource({split: [f"{split}.jsonl", f"{split}.csv", f"*{split}*.jsonl", f"*{split}*.csv"]
                        for split in SPLITS}, reader)
    TaskRegistry.add(
        name,
        source=FilesOrTfds(files, TfdsSource(name, SPLITS, module=module)),
        preprocessors=[functools.partial(summarize, article_key=article_key, summary_key=summary_key), P.tokenize,
                       P.append_eos_after_trim],
        output_features=FEATURES,
        metric_fns=[metrics.rouge],
    )


_register("cnn_dailymail", "tensorflow_datasets.summarization.cnn_dailymail", "article", "highlights")
_register("xsum", "tensorflow_datasets.summarization.xsum", "document", "summary")
