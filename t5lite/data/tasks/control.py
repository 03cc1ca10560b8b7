"""Conditional language modelling with control codes (CTRL): `sst2_control_lm`, GLUE SST-2's
sentences each prefixed by its label's name ("negative" / "positive") as the code. Train a
decoder-only model with the `control_lm` converter (t5lite.data.control_codes); then the prompt
"positive" (or "positive the film") asks it for a positive review.

The source is `glue_sst2`'s (`<data_dir>/SST-2/train.tsv`, `dev.tsv`, or TFDS); the test split has
no labels, hence no codes, and no examples.
"""
from __future__ import annotations

import functools

from t5lite.data import preprocessors as P
from t5lite.data.control_codes import control_code_text
from t5lite.data.registry import Feature, TaskRegistry
from t5lite.data.tasks import glue
from t5lite.data.tasks.pretraining import FEATURES

SST2_CODES = next(task.label_names for task in glue.GLUE_TASKS if task.name == "sst2")   # label id -> code

TaskRegistry.add(
    "sst2_control_lm",
    source=TaskRegistry.get("glue_sst2").source,
    preprocessors=[functools.partial(control_code_text, codes=SST2_CODES), P.tokenize, P.append_eos_after_trim],
    output_features={"inputs": Feature(FEATURES["inputs"].vocabulary, add_eos=False), "targets": FEATURES["targets"]},
)
