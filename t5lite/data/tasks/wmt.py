"""WMT translation as T5 casts it: "translate English to German: <English>" -> German.

`wmt14_ende`, `wmt14_enfr`, `wmt16_enro` read TFDS `wmt14_translate/de-en`, ... by default, or aligned
plain-text files `<data_dir>/<prefix>.<lang>` (validation newstest2013 / newsdev2016, test newstest2014 /
newstest2016, with or without the pair suffix as in `newstest2014-deen.en`; train `train.<lang>`).
"""
from __future__ import annotations

import functools
from typing import Iterable, Iterator

from t5lite import metrics
from t5lite.data import preprocessors as P
from t5lite.data.registry import Example, TaskRegistry
from t5lite.data.sources import FileSource, FilesOrTfds, ParallelText, TfdsSource
from t5lite.data.tasks.pretraining import FEATURES

LANGUAGE_NAMES = {"en": "English", "de": "German", "fr": "French", "ro": "Romanian"}


def translate(dataset: Iterable[Example], source_language: str, target_language: str) -> Iterator[Example]:
    """T5's `translate`: "translate <Source> to <Target>: <source text>" -> target text (names in English)."""
    prefix = f"translate {LANGUAGE_NAMES[source_language]} to {LANGUAGE_NAMES[target_language]}: "
    for ex in dataset:
        yield {"inputs": prefix + ex[source_language], "targets": ex[target_language]}


def _register(name: str, tfds_name: str, module: str, target: str, validation: str, test: str) -> None:
    def names(prefix):  # newstest2014-deen, newsdev2016-enro, or the bare prefix
        return [f"{prefix}-{target}en", f"{prefix}-en{target}", prefix]

    files = FileSource({"train": "train", "validation": names(validation), "test": names(test)},
                       ParallelText(("en", target)))
    TaskRegistry.add(
        name,
        source=FilesOrTfds(files, TfdsSource(tfds_name, ("train", "validation", "test"), module=module)),
        preprocessors=[functools.partial(translate, source_language="en", target_language=target), P.tokenize,
                       P.append_eos_after_trim],
        output_features=FEATURES,
        metric_fns=[metrics.bleu],
    )


_register("wmt14_ende", "wmt14_translate/de-en", "tensorflow_datasets.translate.wmt14", "de", "newstest2013",
          "newstest2014")
_register("wmt14_enfr", "wmt14_translate/fr-en", "tensorflow_datasets.translate.wmt14", "fr", "newstest2013",
          "newstest2014")
_register("wmt16_enro", "wmt16_translate/ro-en", "tensorflow_datasets.translate.wmt16", "ro", "newsdev2016",
          "newstest2016")
