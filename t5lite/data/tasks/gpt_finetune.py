"""GLUE for decoder-only models fine-tuned as GPT-1 was: `gpt_glue_<task>`, a classifier on the
last (extract) token plus the auxiliary LM loss (t5lite.objectives.finetune.
GptClassificationObjective).

Each reuses the source of the text-to-text task of the same data (`glue_<task>`), as the
`bert_glue_*` tasks do; the preprocessor is GPT-1's input transformation (t5lite.data.gpt_inputs):
`start A (delim B) extract`, and both orders of the pair for the similarity tasks (MRPC, QQP,
STS-B), as in the paper. Train with the `decoder_classification` converter
(`decoder_classification_both_orders` for those three), unpacked.
"""
from __future__ import annotations

import functools

from t5lite.data.gpt_inputs import gpt_inputs
from t5lite.data.registry import TaskRegistry
from t5lite.data.tasks import glue  # noqa: F401  (registers the tasks whose sources are reused)
from t5lite.data.tasks.pretraining import FEATURES

SIMILARITY = ("mrpc", "qqp", "stsb")   # GPT-1 reads these pairs in both orders

for _task in glue.GLUE_TASKS:
    if _task.name == "ax":      # test-only, no labels
        continue
    _text_keys = [key for key in _task.columns if key != "label"]
    _t5_task = TaskRegistry.get(f"glue_{_task.name}")
    TaskRegistry.add(f"gpt_glue_{_task.name}", source=_t5_task.source,
                     preprocessors=[functools.partial(gpt_inputs, text_keys=_text_keys,
                                                      both_orders=_task.name in SIMILARITY)],
                     output_features=FEATURES, metric_fns=_t5_task.metric_fns)
