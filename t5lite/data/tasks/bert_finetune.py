"""GLUE and SQuAD for encoders with a task head (BERT-style fine-tuning): `bert_glue_<task>` and
`bert_squad_v1`.

Each reuses the source of the text-to-text task of the same data (`glue_<task>`, `squad_v1`), so
the files are read one way; only the preprocessors differ: BERT's tokenizer step
(t5lite.data.finetune_converters) instead of T5's text formatting. Labels stay class ids (or
STS-B's float score); the metrics are the GLUE task's, on predicted ids (or floats).
Train with the `encoder_classification` / `encoder_span` converters, unpacked.
"""
from __future__ import annotations

import functools

from t5lite import metrics
from t5lite.data.finetune_converters import sentence_inputs, squad_windows
from t5lite.data.registry import TaskRegistry
from t5lite.data.tasks import glue, squad  # noqa: F401  (registers the tasks whose sources are reused)
from t5lite.data.tasks.pretraining import FEATURES

for _task in glue.GLUE_TASKS:
    if _task.name == "ax":      # test-only, no labels
        continue
    _text_keys = [key for key in _task.columns if key != "label"]   # sentence A first, as BERT orders them
    _t5_task = TaskRegistry.get(f"glue_{_task.name}")
    TaskRegistry.add(f"bert_glue_{_task.name}", source=_t5_task.source,
                     preprocessors=[functools.partial(sentence_inputs, text_keys=_text_keys)],
                     output_features=FEATURES, metric_fns=_t5_task.metric_fns)

TaskRegistry.add("bert_squad_v1", source=TaskRegistry.get("squad_v1").source, preprocessors=[squad_windows],
                 output_features=FEATURES, metric_fns=[metrics.squad])
