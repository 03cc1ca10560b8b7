"""GLUE as T5 casts it: `glue_<task>` for cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli, ax, and
MNLI's dev sets as their own eval tasks `glue_mnli_matched` / `glue_mnli_mismatched`.

Each task reads TFDS `glue/<task>`, or GLUE as distributed (`<data_dir>/SST-2/dev.tsv`, ...) when
`data_dir` holds those files; both give TFDS's features, so the formatting below serves both.
Inputs are "<task> key1: value1 key2: value2" with the keys sorted, targets are label names
(label -1, an unlabelled test row, becomes "<unk>"); stsb's score is rounded to the nearest 0.2.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from t5lite import metrics
from t5lite.data import preprocessors as P
from t5lite.data.registry import Example, MixtureRegistry, TaskRegistry
from t5lite.data.sources import FileSource, FilesOrTfds, Table, TfdsSource
from t5lite.data.tasks.pretraining import FEATURES

# ----------------------------------------------------------------------------- formatting

def glue(dataset: Iterable[Example], benchmark_name: str, label_names: Sequence[str],
         feature_names: Sequence[str] | None = None, id_key: str | None = "idx") -> Iterator[Example]:
    """T5's GLUE-style formatting, also used for most of SuperGLUE.

    "<benchmark_name> k1: v1 k2: v2" over `feature_names`, or over all features but the label and
    id sorted by name (T5's default); the target is `label_names[label]`, "<unk>" for label -1.
    """
    for ex in dataset:
        keys = feature_names or sorted(set(ex) - {"label", "idx"})
        label = int(ex["label"])
        out = {"inputs": " ".join([benchmark_name, *(f"{k}: {ex[k]}" for k in keys)]),
               "targets": "<unk>" if label == -1 else label_names[label]}
        if id_key and id_key in ex:
            out[id_key] = ex[id_key]
        yield out


def stsb_score_text(score: float) -> str:
    """The STS-B target: the score rounded to the nearest 0.2 in float32 (half to even, as tf.round), "3.8"."""
    return f"{np.round(np.float32(score) * np.float32(5)) / np.float32(5):.1f}"


def stsb(dataset: Iterable[Example]) -> Iterator[Example]:
    """T5's stsb formatting: "stsb sentence1: ... sentence2: ..." -> the rounded score as text."""
    for ex in dataset:
        yield {"inputs": f"stsb sentence1: {ex['sentence1']} sentence2: {ex['sentence2']}",
               "targets": stsb_score_text(ex["label"]), "idx": ex.get("idx")}


def string_label_to_class_id(text: str, label_classes: Sequence[str], default: int = -1) -> int:
    """Postprocessing for classification: the label's index, `default` for any other text."""
    return label_classes.index(text) if text in label_classes else default


# ----------------------------------------------------------------------------- task table

def parse_label(label_names: Sequence[str]) -> Callable[[str], int]:
    """A TSV label (a label name, or its index as in SST-2's "0"/"1") -> class index."""
    def convert(value: str) -> int:
        if value in label_names:
            return label_names.index(value)
        index = int(value)
        if not 0 <= index < len(label_names):
            raise ValueError(f"expected one of {list(label_names)} or 0..{len(label_names) - 1}")
        return index
    return convert


SPLIT_FILES = {"train": "train.tsv", "validation": "dev.tsv", "test": "test.tsv"}
MNLI_LABELS = ("entailment", "neutral", "contradiction")


@dataclasses.dataclass(frozen=True)
class GlueTask:
    """One GLUE task: its TFDS name, its folder and columns in the GLUE download, labels, metrics."""
    name: str                               # TFDS config name; also T5's benchmark name unless `benchmark`
    folder: str                             # folder in the GLUE download
    columns: Mapping[str, str]              # TFDS feature -> TSV column ("label" last)
    label_names: tuple[str, ...] | None     # None: stsb's float score
    metric_fns: tuple[Callable, ...]
    split_files: Mapping[str, str] = dataclasses.field(default_factory=lambda: dict(SPLIT_FILES))
    headerless: tuple[str, ...] | None = None  # column names of header-less files (CoLA)
    benchmark: str | None = None

    def source(self) -> FilesOrTfds:
        convert = {"label": float if self.label_names is None else parse_label(self.label_names)}
        table = Table(self.columns, convert=convert, defaults={"label": -1.0 if self.label_names is None else -1},
                      headerless=self.headerless)
        files = FileSource({split: f"{self.folder}/{name}" for split, name in self.split_files.items()}, table)
        return FilesOrTfds(files, TfdsSource(f"glue/{self.name}", tuple(self.split_files),
                                             module="tensorflow_datasets.text.glue"))

    def preprocessors(self) -> list:
        if self.label_names is None:
            return [stsb, P.tokenize, P.append_eos_after_trim]
        return [functools.partial(glue, benchmark_name=self.benchmark or self.name, label_names=self.label_names),
                P.tokenize, P.append_eos_after_trim]

    def postprocess_fn(self) -> Callable[..., Any]:
        if self.label_names is None:
            return metrics.string_to_float
        return functools.partial(string_label_to_class_id, label_classes=self.label_names)


_PAIR = {"sentence1": "sentence1", "sentence2": "sentence2", "label": "label"}
_NLI = {"premise": "sentence1", "hypothesis": "sentence2"}
_F1_ACC = (metrics.f1_score_with_invalid, metrics.accuracy)

GLUE_TASKS = (
    GlueTask("cola", "CoLA", {"sentence": "sentence", "label": "label"}, ("unacceptable", "acceptable"),
             (metrics.matthews_corrcoef,), headerless=("source", "label", "star", "sentence")),
    GlueTask("sst2", "SST-2", {"sentence": "sentence", "label": "label"}, ("negative", "positive"),
             (metrics.accuracy,)),
    GlueTask("mrpc", "MRPC", {"sentence1": "#1 String", "sentence2": "#2 String", "label": "Quality"},
             ("not_equivalent", "equivalent"), _F1_ACC),
    GlueTask("qqp", "QQP", {"question1": "question1", "question2": "question2", "label": "is_duplicate"},
             ("not_duplicate", "duplicate"), _F1_ACC),
    GlueTask("stsb", "STS-B", {"sentence1": "sentence1", "sentence2": "sentence2", "label": "score"}, None,
             (metrics.pearson_corrcoef, metrics.spearman_corrcoef)),
    GlueTask("mnli", "MNLI", {**_NLI, "label": "gold_label"}, MNLI_LABELS, (metrics.accuracy,),
             split_files={"train": "train.tsv", "validation_matched": "dev_matched.tsv",
                          "validation_mismatched": "dev_mismatched.tsv", "test_matched": "test_matched.tsv",
                          "test_mismatched": "test_mismatched.tsv"}),
    # MNLI's dev sets as T5's eval-only tasks (glue_mnli_matched_v002, ...): TFDS glue/mnli_matched, ...
    *(GlueTask(f"mnli_{kind}", "MNLI", {**_NLI, "label": "gold_label"}, MNLI_LABELS, (metrics.accuracy,),
               split_files={"validation": f"dev_{kind}.tsv", "test": f"test_{kind}.tsv"}, benchmark="mnli")
      for kind in ("matched", "mismatched")),
    GlueTask("qnli", "QNLI", {"question": "question", "sentence": "sentence", "label": "label"},
             ("entailment", "not_entailment"), (metrics.accuracy,)),
    GlueTask("rte", "RTE", _PAIR, ("entailment", "not_entailment"), (metrics.accuracy,)),
    GlueTask("wnli", "WNLI", _PAIR, ("not_entailment", "entailment"), (metrics.accuracy,)),
    # The diagnostic set has no labels (test only) and is cast as mnli, as T5 does.
    GlueTask("ax", "diagnostic", {**_NLI, "label": "label"}, MNLI_LABELS, (), split_files={"test": "diagnostic.tsv"},
             benchmark="mnli"),
)

for _task in GLUE_TASKS:
    TaskRegistry.add(f"glue_{_task.name}", source=_task.source(), preprocessors=_task.preprocessors(),
                     output_features=FEATURES, metric_fns=_task.metric_fns, postprocess_fn=_task.postprocess_fn())

# T5's glue_v002_proportional (t5.data.glue_utils.GLUE_WEIGHT_MAPPING): the training-set sizes as
# rates; no WNLI (T5 trains on WSC and DPR instead); MNLI's dev sets and AX at rate 0, so they are
# evaluated with the mixture but never sampled. `glue_proportional` is the earlier name.
GLUE_V002_RATES = {"glue_cola": 8_551, "glue_sst2": 67_349, "glue_mrpc": 3_668, "glue_qqp": 363_849,
                   "glue_stsb": 5_749, "glue_mnli": 392_702, "glue_qnli": 104_743, "glue_rte": 2_490,
                   "glue_mnli_mismatched": 0, "glue_mnli_matched": 0, "glue_ax": 0}
for _name in ("glue_v002_proportional", "glue_proportional"):
    MixtureRegistry.add(_name, [(task, float(rate)) for task, rate in GLUE_V002_RATES.items()])
