"""Token tagging from CoNLL-style files, for encoders with a tagging head: `uner_en_ewt` (named
entities, Universal NER's English-EWT layer, IOB2 PER / LOC / ORG) and `ud_en_ewt_upos` (the 17
Universal POS tags of UD English-EWT).

Both read local files under `data_dir` (a folder laid out as the releases: `uner_en_ewt/
en_ewt-ud-{train,dev,test}.iob2`, `en_ewt/en_ewt-ud-{train,dev,test}.conllu`); there is no TFDS
copy. `conll_task` registers the same for any CoNLL files. Examples are BERT windows
(t5lite.data.finetune_converters.tagging_inputs): train with the `encoder_tagging` converter
(packed or not) and `TaggingObjective`; the metrics compare per-word tag lists.
"""
from __future__ import annotations

import functools
from typing import Mapping, Sequence

from t5lite import metrics
from t5lite.data.finetune_converters import tagging_inputs
from t5lite.data.registry import TaskRegistry
from t5lite.data.sources import Conll, FileSource
from t5lite.data.tasks.pretraining import FEATURES

UNER_TAGS = ("O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG")
UPOS_TAGS = ("ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON", "PROPN",
             "PUNCT", "SCONJ", "SYM", "VERB", "X")
SPLITS = {"train": "train", "validation": "dev", "test": "test"}


def conll_task(name: str, split_files: Mapping[str, str], label_names: Sequence[str], tag_column: int,
               word_column: int = 1, entities: bool = True, delimiter: str | None = "\t") -> None:
    """Registers a tagging task over CoNLL column files (`split_files`: split -> path under
    data_dir, globs allowed). `label_names[0]` is what a word without subwords is tagged with
    ("O" for BIO). `entities`: score entity P/R/F1 (BIO tags) besides token accuracy. `delimiter`:
    the column separator (None: any whitespace, as CoNLL-2003)."""
    TaskRegistry.add(name, source=FileSource(dict(split_files), Conll(tag_column, word_column, delimiter)),
                     preprocessors=[functools.partial(tagging_inputs, label_names=tuple(label_names))],
                     output_features=FEATURES,
                     metric_fns=[metrics.entity_f1, metrics.token_accuracy] if entities else [metrics.token_accuracy])


conll_task("uner_en_ewt", {split: f"uner_en_ewt/en_ewt-ud-{name}.iob2" for split, name in SPLITS.items()},
           UNER_TAGS, tag_column=2)
conll_task("ud_en_ewt_upos", {split: f"en_ewt/en_ewt-ud-{name}.conllu" for split, name in SPLITS.items()},
           UPOS_TAGS, tag_column=3, entities=False)
