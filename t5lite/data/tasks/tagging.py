"""Token tagging from CoNLL-style files, for encoders with a tagging head: `uner_en_ewt` (named
entities, Universal NER's English-EWT layer, IOB2 PER / LOC / ORG) and `ud_en_ewt_upos` (the 17
Universal POS tags of UD English-EWT).

Both read local files under `data_dir` (a folder laid out as the releases: `uner_en_ewt/
en_ewt-ud-{train,dev,test}.iob2`, `en_ewt/en_ewt-ud-{train,dev,test}.conllu`); there is no TFDS
copy. `conll_task` registers the same for any CoNLL files. Examples are BERT windows
(t5lite.data.finetune_converters.tagging_inputs): train with the `encoder_tagging` converter
(packed or not) and `TaggingObjective`; the metrics compare per-word tag lists.

`uner_en_ewt_t2t` and `ud_en_ewt_upos_t2t` are the same data as text for T5 / BART
(t5lite.data.tagging_text): "ner: <words>" -> "PER: John Smith; LOC: Paris", "upos: <words>" ->
the tags in order; the postprocessor reads the decoded text back into per-word tags, so the
same metrics score both.
"""
from __future__ import annotations

import functools
from typing import Mapping, Sequence

from t5lite import metrics
from t5lite.data import bio, preprocessors as P
from t5lite.data.finetune_converters import tagging_inputs
from t5lite.data.tagging_text import tagging_text, text_to_tags
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
    TaskRegistry.add(name, source=FileSource(dict(split_files), _reader(tag_column, word_column, delimiter, entities)),
                     preprocessors=[functools.partial(tagging_inputs, label_names=tuple(label_names))],
                     output_features=FEATURES,
                     metric_fns=_metric_fns(entities))


def conll_text_task(name: str, split_files: Mapping[str, str], label_names: Sequence[str], tag_column: int,
                    prefix: str, word_column: int = 1, entities: bool = True,
                    delimiter: str | None = "\t") -> None:
    """`conll_task`'s data as text-to-text: inputs "<prefix>: w1 w2 ...", targets the entities
    ("TYPE: span; ...") or, with `entities=False`, the tags in word order."""
    types = sorted({tag[2:] for tag in label_names if tag[:2] in ("B-", "I-")}) if entities else None
    TaskRegistry.add(name, source=FileSource(dict(split_files), _reader(tag_column, word_column, delimiter, entities)),
                     preprocessors=[functools.partial(tagging_text, prefix=prefix, entities=entities), P.tokenize,
                                    P.append_eos_after_trim],
                     output_features=FEATURES, metric_fns=_metric_fns(entities),
                     postprocess_fn=functools.partial(text_to_tags, types=types))


def _reader(tag_column: int, word_column: int, delimiter: str | None, entities: bool):
    """The CoNLL column reader; entity (BIO) tags are checked against IOB2, warning once per file."""
    reader = Conll(tag_column, word_column, delimiter)
    return bio.Checked(reader) if entities else reader


def _metric_fns(entities: bool) -> list:
    return [metrics.entity_f1, metrics.token_accuracy] if entities else [metrics.token_accuracy]


UNER_FILES = {split: f"uner_en_ewt/en_ewt-ud-{name}.iob2" for split, name in SPLITS.items()}
UPOS_FILES = {split: f"en_ewt/en_ewt-ud-{name}.conllu" for split, name in SPLITS.items()}
conll_task("uner_en_ewt", UNER_FILES, UNER_TAGS, tag_column=2)
conll_task("ud_en_ewt_upos", UPOS_FILES, UPOS_TAGS, tag_column=3, entities=False)
conll_text_task("uner_en_ewt_t2t", UNER_FILES, UNER_TAGS, tag_column=2, prefix="ner")
conll_text_task("ud_en_ewt_upos_t2t", UPOS_FILES, UPOS_TAGS, tag_column=3, prefix="upos", entities=False)
