"""A registered task's text without its labels, as documents for `t5lite prepare --task`.

Task-adaptive pre-training (Gururangan et al., 2020) pre-trains on the unlabelled text of the
tasks a model will be fine-tuned on. Here a task's raw records (before its preprocessors, read
from the task's files or TFDS as training reads them) become documents: one per record, its text
fields one per line, in `TEXT_FIELDS` order. Labels, ids, answers, titles and summaries are never
text fields, so nothing a task scores leaks into pre-training.

An input is written `NAME[:SPLIT]=DATA_DIR` (`glue_sst2=data/glue`, `squad_v1:validation=data/squad`);
the split defaults to train.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Iterator

from t5lite.errors import DataError

PREFIX = "task:"
# The fields that carry a task's text, across GLUE, SuperGLUE, SQuAD, CNN/DailyMail, XSum and the text tasks.
TEXT_FIELDS = ("text", "article", "document", "passage", "context", "premise", "hypothesis", "question",
               "question1", "question2", "sentence", "sentence1", "sentence2")


@dataclasses.dataclass(frozen=True)
class TaskInput:
    name: str
    split: str
    data_dir: str

    @classmethod
    def parse(cls, text: str) -> "TaskInput":
        """`NAME[:SPLIT]=DATA_DIR` (with or without the `task:` prefix); a typo is a DataError naming the fix."""
        spec = text.removeprefix(PREFIX)
        head, sep, data_dir = spec.partition("=")
        name, _, split = head.partition(":")
        if not sep or not name or not data_dir:
            raise DataError(f"--task {spec}: write it NAME[:SPLIT]=DATA_DIR, e.g. --task glue_sst2=data/glue")
        return cls(name, split or "train", data_dir)

    def __str__(self) -> str:
        return f"{PREFIX}{self.name}:{self.split}={self.data_dir}"

    def source(self):
        """The task's source, its split checked; a misspelt name or split says what exists."""
        from t5lite.data import catalog
        try:
            task = catalog.get_task(self.name)
        except KeyError as e:
            raise DataError(f"--task {self.name}: {e.args[0]}") from None
        if self.split not in task.source.splits:
            raise DataError(f"--task {self.name}:{self.split}: the task has no split {self.split!r}; it has "
                            f"{', '.join(task.source.splits)}")
        return task.source

    def files(self) -> list[str]:
        """The local files the task reads for the split ([] when it reads TFDS): what a restart checks."""
        from t5lite.data.sources import FileSource, FilesOrTfds
        source = self.source()
        local = source.files if isinstance(source, FilesOrTfds) else source
        return local.files(self.split, self.data_dir) if isinstance(local, FileSource) else []

    def stat(self) -> list[int]:
        """Size and newest modification time (ns) of the files read, so a changed file is noticed."""
        infos = [os.stat(path) for path in self.files()]
        return [sum(i.st_size for i in infos), max((i.st_mtime_ns for i in infos), default=0)]

    def documents(self) -> Iterator[tuple[int, str, str]]:
        """(record index, "", text) per record with text: its text fields' lines, blank lines dropped."""
        records = self.source().records(self.split, self.data_dir)
        for index in range(len(records)):
            record = records[index]
            fields = [f for f in TEXT_FIELDS if f in record]
            if index == 0 and not fields:
                raise DataError(f"--task {self.name}: its records have no text field ({', '.join(sorted(record))}; "
                                f"text fields are {', '.join(TEXT_FIELDS)}); give a task with text")
            lines = [" ".join(line.split()) for f in fields for value in _strings(record.get(f))
                     for line in value.splitlines()]
            text = "\n".join(line for line in lines if line)
            if text:
                yield index, "", text


def _strings(value) -> list[str]:
    """A text field's strings: the string, or a list's strings (several passages); nothing else."""
    values = value if isinstance(value, (list, tuple)) else [value]
    return [v for v in values if isinstance(v, str)]


def is_task(name: str) -> bool:
    return name.startswith(PREFIX)
