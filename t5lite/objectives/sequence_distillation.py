"""Sequence-level knowledge distillation (Kim & Rush 2016) for encoder-decoders: the student is
trained on the teacher's beam-search outputs instead of the references.

`write_teacher_targets` decodes a task split's inputs with the teacher (`t5lite.infer.predict.infer`,
beam search) and writes `OUT/<split>.jsonl` ({"inputs", "targets", "teacher_score"}, in the
split's order); `register_teacher_task` registers a task reading those files with the base task's
vocabulary and metrics, so the student trains on it like any text-to-text task
(`--gin.MIXTURE_OR_TASK_NAME`, `--gin.DATA_DIR=OUT`), optionally with `DistillationObjective`'s
word-level soft targets on top.
"""
from __future__ import annotations

import itertools
import json
import os

from etils import epath

from t5lite.data import catalog
from t5lite.data import preprocessors as P
from t5lite.data.registry import Task, TaskRegistry
from t5lite.data.sources import FileSource, JsonLines
from t5lite.infer import predict


def write_teacher_targets(teacher_path: str, task_name: str, split: str, out_dir: str, *, data_dir: str | None = None,
                          max_examples: int | None = None, num_beams: int = 4, max_input_length: int = 512,
                          max_decode_length: int = 64, batch_size: int = 16) -> str:
    """Decodes `task_name`'s `split` inputs with the teacher's beam search; returns the file written."""
    task = catalog.get_task_or_mixture(task_name)
    examples = itertools.islice(task.get_dataset(split, data_dir=data_dir), max_examples)
    texts = [ex["inputs_pretokenized"] for ex in examples]
    records = predict.infer(texts, checkpoint_path=teacher_path, method="beam", num_beams=num_beams,
                            max_input_length=max_input_length, max_decode_length=max_decode_length,
                            batch_size=batch_size, progress=False)
    path = os.path.join(out_dir, f"{split}.jsonl")
    epath.Path(out_dir).mkdir(parents=True, exist_ok=True)
    epath.Path(path).write_text("".join(
        json.dumps({"inputs": r["input"], "targets": r["prediction"], "teacher_score": r["score"]}) + "\n"
        for r in records), encoding="utf-8")
    return path


def register_teacher_task(name: str, base_task: str, splits: tuple[str, ...] = ("train",)) -> Task:
    """A task over `write_teacher_targets`' files (under the run's `data_dir`), with `base_task`'s
    output features and metrics; its inputs are the base task's formatted inputs."""
    base = catalog.get_task_or_mixture(base_task)
    source = FileSource({split: f"{split}.jsonl" for split in splits}, JsonLines({"inputs": "inputs",
                                                                                  "targets": "targets"}))
    return TaskRegistry.add(name, source=source, preprocessors=[P.tokenize, P.append_eos_after_trim],
                            output_features=base.output_features, metric_fns=base.metric_fns)
