"""SQuAD as T5 casts it: `squad_v1` (v1.1) and `squad_v2` (v2.0, with unanswerable questions).

Inputs "question: <q> context: <c>" with T5's punctuation padding, target the first gold answer.
The padded gold answers stay in the example as `answers`, because SQuAD is scored against all of
them: the postprocessor returns that list for targets. Data: TFDS `squad/v1.1` / `squad/v2.0`,
or the official JSON files (`<data_dir>/dev-v1.1.json`, `train-v2.0.json`, ...).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import re
import string
from typing import Iterable, Iterator

from t5lite import metrics
from t5lite.data import preprocessors as P
from t5lite.data.registry import Example, TaskRegistry
from t5lite.data.sources import FileSource, FilesOrTfds, Malformed, Row, TfdsSource, open_file
from t5lite.data.tasks.pretraining import FEATURES

UNANSWERABLE = "unanswerable"  # squad_v2's target for a question the context does not answer

# T5 pads with TF's RE2 regexes. Today's t5 (since 2022) pads `[[:punct:]]`, RE2's ASCII
# punctuation (= Python's string.punctuation); the paper-era rule padded `\W`, which in RE2 is
# ASCII-only, so every non-ASCII character (an accented letter, a dash) was padded too. `\s` is
# ASCII whitespace in RE2 either way. Padding the whitespace itself, as the `\W` rule does, makes
# no difference after collapsing, so it is left out.
PUNCTUATION_RULES = {
    "punct": re.compile(f"([{re.escape(string.punctuation)}])"),
    "non_word": re.compile(r"([^0-9A-Za-z_\t\n\f\r ])"),
}
_SPACES = re.compile(r"[\t\n\f\r ]+")


@functools.lru_cache(maxsize=1024)  # a paragraph's context repeats for each of its questions
def pad_punctuation(text: str, rule: str = "punct") -> str:
    r"""T5's `_pad_punctuation`: spaces around punctuation, whitespace runs collapsed.

    `rule="punct"` is today's t5 (ASCII punctuation); `rule="non_word"` the paper-era `\W` rule.
    """
    if rule not in PUNCTUATION_RULES:
        raise ValueError(f"unknown punctuation rule {rule!r}; use one of {sorted(PUNCTUATION_RULES)}")
    return _SPACES.sub(" ", PUNCTUATION_RULES[rule].sub(r" \1 ", text))


def squad(dataset: Iterable[Example], unanswerable: str | None = None, punctuation: str = "punct") -> Iterator[Example]:
    """T5's `squad` formatting; with `unanswerable` set (v2.0), a question without answers gets that
    target and the single gold answer "" (what SQuAD v2.0's scoring expects). `punctuation` picks the
    padding rule (see `pad_punctuation`)."""
    pad = functools.partial(pad_punctuation, rule=punctuation)
    for ex in dataset:
        answers = [pad(a) for a in ex["answers"]["text"]]
        if not answers and unanswerable is not None:
            target, answers = unanswerable, [""]
        else:
            target = answers[0]
        question, context = pad(ex["question"]), pad(ex["context"])
        yield {"inputs": _SPACES.sub(" ", f"question: {question} context: {context}"), "targets": target,
               "id": ex["id"], "question": question, "context": context, "answers": answers}


def qa_postprocess(answer: str, example: Example | None = None, is_target: bool = False,
                   unanswerable: str | None = None):
    """Targets become the example's list of gold answers; a predicted `unanswerable` becomes ""."""
    if is_target:
        return list(example["answers"])
    return "" if unanswerable is not None and answer == unanswerable else answer


@dataclasses.dataclass(frozen=True)
class SquadJson:
    """SQuAD's official JSON (data -> paragraphs -> qas) flattened into TFDS squad's features.

    A question is located by its JSON path (the file is a single line). v2.0 questions carry
    `is_impossible` and `plausible_answers`; unanswerable ones have no answers.
    """
    version_2: bool = False

    def __call__(self, path: str) -> Iterator[Row]:
        with open_file(path) as f:
            try:
                data = json.load(f)["data"]
            except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
                raise ValueError(f"{path}: not a SQuAD JSON file ({e})") from e
        for a, article in enumerate(data):
            for p, paragraph in enumerate(article.get("paragraphs", [])):
                for q, qa in enumerate(paragraph.get("qas", [])):
                    where = f"data[{a}].paragraphs[{p}].qas[{q}]"
                    try:
                        yield where, self._example(article, paragraph, qa)
                    except (KeyError, TypeError, ValueError) as e:
                        yield where, Malformed(f"bad question ({type(e).__name__}: {e})")

    def _example(self, article, paragraph, qa) -> Example:
        ex = {"id": qa["id"], "title": article.get("title", ""), "context": paragraph["context"],
              "question": qa["question"], "answers": _answers(qa["answers"])}
        if self.version_2:
            ex["is_impossible"] = bool(qa.get("is_impossible", False))
            ex["plausible_answers"] = _answers(qa.get("plausible_answers", []))
        elif not ex["answers"]["text"]:
            raise ValueError("no answers")
        return ex


def _answers(answers: list) -> dict[str, list]:
    return {"text": [str(a["text"]) for a in answers], "answer_start": [int(a["answer_start"]) for a in answers]}


def _register(name: str, version: str, v2: bool) -> None:
    marker = UNANSWERABLE if v2 else None
    files = FileSource({"train": f"train-v{version}.json", "validation": f"dev-v{version}.json"},
                       SquadJson(version_2=v2))
    TaskRegistry.add(
        name,
        source=FilesOrTfds(files, TfdsSource(f"squad/v{version}", ("train", "validation"),
                                             module="tensorflow_datasets.datasets.squad.squad_dataset_builder")),
        preprocessors=[functools.partial(squad, unanswerable=marker), P.tokenize, P.append_eos_after_trim],
        output_features=FEATURES,
        metric_fns=[metrics.squad_v2 if v2 else metrics.squad],
        postprocess_fn=functools.partial(qa_postprocess, unanswerable=marker),
    )


_register("squad_v1", "1.1", v2=False)
_register("squad_v2", "2.0", v2=True)
