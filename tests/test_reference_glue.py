"""GLUE formatting against t5's own: the raw rows t5lite reads from the GLUE files, passed through
the preprocessor t5 registers for the same TFDS config (`t5.data.glue_utils.get_glue_text_preprocessor`:
`t5.data.preprocessors.glue` with TFDS's label classes, or `preprocessors.stsb`), give the same
inputs and targets as t5lite's task."""
import itertools
import os

import numpy as np
import pytest
from conftest import shared_data_dir

from t5lite.data import get_task
from t5lite.data.tasks.glue import GLUE_TASKS

tf = pytest.importorskip("tensorflow", reason="the t5 reference needs the `reference` extra")
glue_utils = pytest.importorskip("t5.data.glue_utils", reason="the t5 reference needs the `reference` extra")
tfds_glue = pytest.importorskip("tensorflow_datasets.text.glue", reason="TFDS's GLUE label names are the reference")

GLUE = str(shared_data_dir() / "glue")
ROWS = 40


def t5_formatted(config, rows):
    """t5's preprocessor over rows with TFDS's dtypes (strings, int64 / float32 label, int32 idx)."""
    columns = {k: [r[k] for r in rows] for k in rows[0]}
    label = np.asarray(columns["label"], np.float32 if config.label_classes is None else np.int64)
    ds = tf.data.Dataset.from_tensor_slices({**{k: v for k, v in columns.items() if k not in ("label", "idx")},
                                             "label": label, "idx": np.asarray(columns["idx"], np.int32)})
    out = glue_utils.get_glue_text_preprocessor(config)(ds)
    return [(ex["inputs"].numpy().decode(), ex["targets"].numpy().decode()) for ex in out]


def _on_disk(spec):
    return any(os.path.exists(os.path.join(GLUE, spec.folder, f)) for f in spec.split_files.values())


# The tasks whose files ../shared/data/glue holds (QQP, MNLI and the diagnostic set are not there).
@pytest.mark.parametrize("spec", [s for s in GLUE_TASKS if _on_disk(s)], ids=lambda s: s.name)
def test_glue_inputs_and_targets_equal_t5s(spec):
    config = next(c for c in tfds_glue.Glue.BUILDER_CONFIGS if c.name == spec.name)
    task = get_task(f"glue_{spec.name}")
    split = next(k for k, f in spec.split_files.items() if os.path.exists(os.path.join(GLUE, spec.folder, f)))
    raw = list(itertools.islice(task.source.load(split, data_dir=GLUE), ROWS))
    rows = [{**r, "idx": r.get("idx", i)} for i, r in enumerate(raw)]
    ours = [(ex["inputs_pretokenized"], ex["targets_pretokenized"]) for ex in task.preprocess(iter(raw))]
    assert ours == t5_formatted(config, rows)
