"""SuperGLUE as T5 casts it: `super_glue_<task>` for boolq, cb, copa, multirc, record, rte, wic, wsc
(and the diagnostics axb, axg, cast as rte). Data: TFDS `super_glue/<task>`, or SuperGLUE as
distributed (`<data_dir>/BoolQ/val.jsonl`, `<data_dir>/AX-b/AX-b.jsonl`, ...) read into TFDS's features.

Most tasks use the GLUE formatting ("<task> key: value ...", labels as TFDS names them). MultiRC
drops its HTML and keeps its ids, since exact match is taken per question; ReCoRD gives one example
per gold answer and keeps all of them for scoring; WSC is T5's "simple" variant: the pronoun marked
with asterisks, the referent noun phrase as target (`super_glue_wsc_train` keeps only the true
referents, for training, as T5's `wsc_v102_simple_train` does). `dpr_v001_simple` is T5's Definite
Pronoun Resolution task in the same "wsc:" format (TFDS `definite_pronoun_resolution`, or the release
files `<data_dir>/train.c.txt`, `test.c.txt`).
"""
from __future__ import annotations

import dataclasses
import functools
import re
from typing import Iterable, Iterator

from t5lite import metrics
from t5lite.data import preprocessors as P
from t5lite.data.registry import Example, MixtureRegistry, TaskRegistry
from t5lite.data.sources import FileSource, FilesOrTfds, JsonLines, Malformed, Row, TfdsSource, open_file
from t5lite.data.tasks.glue import glue, string_label_to_class_id
from t5lite.data.tasks.pretraining import FEATURES

BOOL = ("False", "True")
NLI = ("entailment", "not_entailment")
LABELS = {"cb": ("entailment", "contradiction", "neutral"), "copa": ("choice1", "choice2"), "rte": NLI, "axb": NLI,
          "axg": NLI}  # TFDS's label names; the others are BOOL
MODULE = "tensorflow_datasets.text.super_glue"

# ----------------------------------------------------------------------------- MultiRC

_BOLD = re.compile(r"</?b>")


def multirc(dataset: Iterable[Example]) -> Iterator[Example]:
    """GLUE formatting over question, answer, paragraph with HTML line breaks and bold removed; the
    ids move to `idx/paragraph`, `idx/question`, `idx/answer` for per-question scoring."""
    for ex in dataset:
        out = next(glue([ex], "multirc", BOOL, feature_names=("question", "answer", "paragraph"), id_key=None))
        out["inputs"] = _BOLD.sub("", out["inputs"].replace("<br>", " "))
        out.update({f"idx/{key}": ex["idx"][key] for key in ("paragraph", "question", "answer")})
        yield out


def multirc_postprocess(text: str, example: Example | None = None, is_target: bool = False) -> dict:
    """{"value": class id}; targets also carry their question as "group" (the prediction has none)."""
    out = {"value": string_label_to_class_id(text, BOOL)}
    if is_target:
        out["group"] = (example["idx/paragraph"], example["idx/question"])
    return out


# ----------------------------------------------------------------------------- ReCoRD

_HIGHLIGHT_AFTER_PUNCT = re.compile(r"([.?!\"'])\n@highlight\n")


def record(dataset: Iterable[Example]) -> Iterator[Example]:
    """T5's ReCoRD format, one example per gold answer ("<unk>" if none):
    "record query: <query> entities: e1, e2, ... passage: <passage>", `@highlight` lines joined as sentences."""
    for ex in dataset:
        passage = _HIGHLIGHT_AFTER_PUNCT.sub(r"\1 ", ex["passage"]).replace("\n@highlight\n", ". ")
        inputs = f"record query: {ex['query']} entities: {', '.join(ex['entities'])} passage: {passage}"
        for target in ex["answers"] or ["<unk>"]:
            yield {"inputs": inputs, "targets": target, "answers": list(ex["answers"]),
                   "idx/passage": ex["idx"]["passage"], "idx/query": ex["idx"]["query"]}


def record_postprocess(text: str, example: Example | None = None, is_target: bool = False) -> dict:
    """Targets: all gold answers grouped by query, so a query with several answers is scored once."""
    if is_target:
        return {"value": list(example["answers"]), "group": (example["idx/passage"], example["idx/query"])}
    return {"value": text}


# ----------------------------------------------------------------------------- WSC

# One of the two WSC texts T5 hard-codes (t5.data.preprocessors._wsc_inputs), with T5's blanked text:
# it drops the text's trailing space, which the rule below keeps.
_T5_BLANKED = {
    'The boy continued to whip the pony , and eventually the pony threw him over. John laughed out quite loud. '
    '"Good for him," he said. ':
    'The boy continued to whip the pony , and eventually the pony threw him over. John laughed out quite loud. '
    '"Good for X ," he said.'}


def _blank_pronoun(text: str, index: int, pronoun: str) -> str:
    """The text with the pronoun (word `index`, split on spaces) replaced by "X".

    T5 asserts that word `index` is the pronoun and hard-codes the two WSC texts where it is not
    (the index points at a neighbour, or the pronoun carries punctuation: 'him,"'); here the nearest
    word that is, or starts with, the pronoun is taken, which gives T5's text for the first of them
    and, but for a trailing space, for the second (`_T5_BLANKED` holds T5's).
    """
    if text in _T5_BLANKED:
        return _T5_BLANKED[text]
    words = text.split(" ")

    def is_pronoun(word: str) -> bool:
        return word.startswith(pronoun) and not word[len(pronoun):len(pronoun) + 1].isalnum()

    if not 0 <= index < len(words):
        raise ValueError(f"wsc: span2_index {index} is outside the text ({len(words)} words): {text!r}")
    if not is_pronoun(words[index]):
        index = min((j for j, w in enumerate(words) if is_pronoun(w)), key=lambda j: abs(j - index), default=index)
    rest = words[index][len(pronoun):]
    return " ".join([" ".join(words[:index]), f"X {rest}" if rest else "X", " ".join(words[index + 1:])])


def wsc_simple(dataset: Iterable[Example], correct_referent_only: bool = False) -> Iterator[Example]:
    """T5's `wsc_simple`: "wsc: ... *pronoun* ..." -> the candidate referent (span1); `label` says
    whether it is the right one. With `correct_referent_only`, wrong candidates are dropped."""
    for ex in dataset:
        label = int(ex.get("label", 0))
        if correct_referent_only and label != 1:
            continue
        text = _blank_pronoun(ex["text"], int(ex["span2_index"]), ex["span2_text"])
        yield {"inputs": "wsc: " + text.replace(" X ", f" *{ex['span2_text']}* "), "targets": ex["span1_text"],
               "label": label, "idx": ex["idx"]}


_DETERMINERS = frozenset("a an few her his each every many much my our some that the their these this those which "
                         "whose your".split())


def _content_words(text: str) -> str:
    return " ".join(w for w in text.strip().lower().split(" ") if w not in _DETERMINERS)


def wsc_postprocess(text: str, example: Example | None = None, is_target: bool = False) -> int:
    """T5's rule: 1 if the prediction names the example's candidate (ignoring case and determiners,
    either word set containing the other, possessives not mixed with plain names), else 0; the
    target is the label. So accuracy asks "did the model pick this candidate exactly when it is right"."""
    if is_target:
        return int(example["label"])
    prediction, referent = _content_words(text), _content_words(example["targets_pretokenized"])
    if not prediction:
        return -1
    if ("'" in prediction) != ("'" in referent):
        return 0
    p, r = set(prediction.split(" ")), set(referent.split(" "))
    return int(p <= r or r <= p)


# ----------------------------------------------------------------------------- DPR

def dpr_simple(dataset: Iterable[Example]) -> Iterator[Example]:
    """T5's `definite_pronoun_resolution_simple` (task `dpr_v001_simple`): "wsc: ..." with the first
    occurrence of the pronoun that is followed by a space, "." or "," marked with asterisks -> the
    right candidate."""
    for ex in dataset:
        marked = re.sub(rf" ({re.escape(ex['pronoun'])})( |\.|,)", r" *\1*\2", ex["sentence"], count=1)
        yield {"inputs": f"wsc: {marked}", "targets": ex["candidates"][int(ex["label"])]}


@dataclasses.dataclass(frozen=True)
class DprText:
    """The DPR release files (`train.c.txt`, `test.c.txt`) as TFDS `definite_pronoun_resolution`
    examples: blocks of sentence, pronoun, "candidate1,candidate2", answer, then a blank line."""

    def __call__(self, path: str) -> Iterator[Row]:
        with open_file(path) as f:
            lines = [line.strip() for line in f.read().decode("utf-8").split("\n")]
        for start in range(0, len(lines), 5):
            sentence, pronoun, candidates, answer = (lines[start:start + 4] + [""] * 4)[:4]
            if not sentence:
                continue
            candidates = [c.strip() for c in candidates.split(",")]
            if answer not in candidates:
                yield start + 1, Malformed(f"answer {answer!r} is not one of the candidates {candidates}")
            else:
                yield start + 1, {"sentence": sentence, "pronoun": pronoun, "candidates": candidates,
                                  "label": candidates.index(answer)}


# ----------------------------------------------------------------------------- local files

FOLDERS = {"boolq": "BoolQ", "cb": "CB", "copa": "COPA", "multirc": "MultiRC", "record": "ReCoRD", "rte": "RTE",
           "wic": "WiC", "wsc.fixed": "WSC", "axb": "AX-b", "axg": "AX-g"}
TEXT_FEATURES = {"boolq": ("question", "passage"), "cb": ("premise", "hypothesis"),
                 "copa": ("premise", "choice1", "choice2", "question"), "rte": ("premise", "hypothesis"),
                 "wic": ("word", "sentence1", "sentence2", "start1", "start2", "end1", "end2"),
                 "wsc.fixed": ("text", "span1_index", "span2_index", "span1_text", "span2_text"),
                 "axb": ("sentence1", "sentence2"), "axg": ("premise", "hypothesis")}


@dataclasses.dataclass(frozen=True)
class SuperGlueJsonl:
    """A SuperGLUE .jsonl file as TFDS's `super_glue/<config>` examples (labels as class indices,
    -1 when absent; MultiRC one example per answer, ReCoRD one per query)."""
    config: str
    label_names: tuple[str, ...] = BOOL

    def __call__(self, path: str) -> Iterator[Row]:
        for number, row in JsonLines()(path):
            if isinstance(row, Malformed):
                yield number, row
                continue
            try:
                yield from ((number, ex) for ex in list(self.examples(row)))
            except (ValueError, KeyError, TypeError, IndexError) as e:
                yield number, Malformed(f"bad {self.config} row ({type(e).__name__}: {e})")

    def examples(self, row: dict) -> Iterator[Example]:
        if self.config == "multirc":
            for question in row["passage"]["questions"]:
                for answer in question["answers"]:
                    yield {"paragraph": row["passage"]["text"], "question": question["question"],
                           "answer": answer["text"], "label": self.label(answer),
                           "idx": {"paragraph": row["idx"], "question": question["idx"], "answer": answer["idx"]}}
        elif self.config == "record":
            text = row["passage"]["text"]
            entities = sorted({text[e["start"]:e["end"] + 1] for e in row["passage"]["entities"]})
            for qa in row["qas"]:
                yield {"passage": text, "query": qa["query"], "entities": entities,
                       "answers": sorted({a["text"] for a in qa.get("answers", [])}),
                       "idx": {"passage": row["idx"], "query": qa["idx"]}}
        else:
            if self.config == "wsc.fixed":
                row = {**row, **row["target"]}
            ex = {key: row[key] for key in TEXT_FEATURES[self.config]}
            if self.config == "wsc.fixed":
                ex = _fix_spans(ex)
            yield {**ex, "idx": row["idx"], "label": self.label(row)}

    def label(self, row: dict) -> int:
        if "label" not in row:
            return -1
        value = row["label"]  # a bool, 0/1 (COPA: the right choice, MultiRC), or a label name
        return self.label_names.index(value) if isinstance(value, str) else int(value)


# The spans TFDS's repair leaves as they are: their words are not contiguous in the text.
_UNREPAIRABLE_SPANS = ("Kamenev and Zinoviev", "Kamenev, Zinoviev, and Stalin")


def _fix_spans(ex: Example) -> Example:
    """TFDS's wsc.fixed repair (`_fix_wst`, tensorflow_datasets/text/super_glue.py) of span texts
    that are not in the text: the first letter's case taken from the word at the span's index, a
    trailing "." and newlines removed. As TFDS: the two Kamenev spans are kept; a span containing
    "theyscold" sets span2_index to 10 (TFDS's text fix there is a no-op, its `str.replace` result
    being dropped, so the text is kept); a span still not in the text, or an index outside it, is
    a malformed row (TFDS's assertion)."""
    ex, words = dict(ex), ex["text"].split()
    for span in ("span1", "span2"):
        text, index = ex[f"{span}_text"], ex[f"{span}_index"]
        if text in ex["text"] or text in _UNREPAIRABLE_SPANS:
            continue
        if "theyscold" in text:
            ex["span2_index"] = 10
        if not -len(words) <= index < len(words):
            raise ValueError(f"{span}_index {index} is outside the text ({len(words)} words)")
        text = (text[0].lower() if words[index][0].islower() else text[0].upper()) + text[1:]
        ex[f"{span}_text"] = text.rstrip(".").replace("\n", " ")
        if ex[f"{span}_text"] not in ex["text"]:
            raise ValueError(f"{span}_text {ex[f'{span}_text']!r} is not in the text, even after TFDS's wsc.fixed "
                             "repair")
    return ex


def _files(config: str, splits) -> FileSource:
    folder = FOLDERS[config]
    names = {"train": "train.jsonl", "validation": "val.jsonl", "test": "test.jsonl"}
    if config in ("axb", "axg"):
        names = {"test": f"{folder}.jsonl"}
    return FileSource({split: f"{folder}/{names[split]}" for split in splits},
                      SuperGlueJsonl(config, LABELS.get(config, BOOL)))


# ----------------------------------------------------------------------------- registration

def _labels_postprocess(labels):
    return functools.partial(string_label_to_class_id, label_classes=labels)


def _glue_style(benchmark, labels, feature_names=None):
    return functools.partial(glue, benchmark_name=benchmark, label_names=labels, feature_names=feature_names)


AXB_AS_RTE = {"premise": "sentence1", "hypothesis": "sentence2", "label": "label", "idx": "idx"}


def axb_as_rte(dataset: Iterable[Example]) -> Iterator[Example]:
    """AX-b as T5's super_glue_axb_v102 casts it: sentence1/sentence2 renamed premise/hypothesis, then
    formatted as rte ("rte hypothesis: <sentence2> premise: <sentence1>", as AX-g and RTE read)."""
    return glue(P.rekey(dataset, AXB_AS_RTE), "rte", NLI)


def _add(name, config, splits, formatter, metric_fns, postprocess_fn):
    TaskRegistry.add(name, source=FilesOrTfds(_files(config, splits), TfdsSource(f"super_glue/{config}", splits,
                                                                                  module=MODULE)),
                     preprocessors=[formatter, P.tokenize, P.append_eos_after_trim], output_features=FEATURES,
                     metric_fns=metric_fns, postprocess_fn=postprocess_fn)


SPLITS = ("train", "validation", "test")
for _name, _features, _metrics in [
        ("boolq", None, [metrics.accuracy]),
        ("cb", None, [metrics.mean_multiclass_f1(3), metrics.accuracy]),
        ("copa", None, [metrics.accuracy]),
        ("rte", None, [metrics.accuracy]),
        ("wic", ("sentence1", "sentence2", "word"), [metrics.accuracy])]:
    _labels = LABELS.get(_name, BOOL)
    _add(f"super_glue_{_name}", _name, SPLITS, _glue_style(_name, _labels, _features), _metrics,
         _labels_postprocess(_labels))
# The diagnostics: test only, cast as rte, no metrics (as T5).
_add("super_glue_axb", "axb", ("test",), axb_as_rte, [], _labels_postprocess(NLI))
_add("super_glue_axg", "axg", ("test",), _glue_style("rte", NLI), [], _labels_postprocess(NLI))
_add("super_glue_multirc", "multirc", SPLITS, multirc,
     [metrics.multirc_f1_over_all_answers, metrics.multirc_exact_match], multirc_postprocess)
_add("super_glue_record", "record", SPLITS, record, [metrics.record_metrics], record_postprocess)
_add("super_glue_wsc", "wsc.fixed", SPLITS, wsc_simple, [metrics.accuracy], wsc_postprocess)
_add("super_glue_wsc_train", "wsc.fixed", ("train",), functools.partial(wsc_simple, correct_referent_only=True), [],
     wsc_postprocess)

TaskRegistry.add("dpr_v001_simple",
                 source=FilesOrTfds(FileSource({"train": "train.c.txt", "test": "test.c.txt"}, DprText()),
                                    TfdsSource("definite_pronoun_resolution", ("train", "test"),
                                               module="tensorflow_datasets.text.definite_pronoun_resolution")),
                 preprocessors=[dpr_simple, P.tokenize, P.append_eos_after_trim], output_features=FEATURES,
                 metric_fns=[metrics.accuracy])

# T5's super_glue_v102_proportional (t5.data.glue_utils.SUPER_GLUE_WEIGHT_MAPPING): training-set sizes as
# rates (ReCoRD counted per answer, as its examples are), DPR and WSC's true referents for training; the
# WSC eval task and the diagnostics at rate 0. `super_glue_proportional` is the earlier name.
SUPER_GLUE_V102_RATES = {"dpr_v001_simple": 1_322, "super_glue_wsc_train": 259, "super_glue_wsc": 0,
                         "super_glue_boolq": 9_427, "super_glue_cb": 250, "super_glue_copa": 400,
                         "super_glue_multirc": 27_243, "super_glue_record": 138_854, "super_glue_rte": 2_490,
                         "super_glue_wic": 5_428, "super_glue_axb": 0, "super_glue_axg": 0}
for _name in ("super_glue_v102_proportional", "super_glue_proportional"):
    MixtureRegistry.add(_name, [(task, float(rate)) for task, rate in SUPER_GLUE_V102_RATES.items()])
