"""GLUE reading and formatting against TFDS's and t5's own, on the real GLUE files.

Reading: every file of a task in the shared data, read by t5lite and by TFDS's glue builder
(`tensorflow_datasets.text.glue.Glue._generate_examples` run on the same file in place, encoded by
the builder's features), gives the same records. Formatting: the raw rows t5lite reads, passed
through the preprocessor t5 registers for the same TFDS config
(`t5.data.glue_utils.get_glue_text_preprocessor`: `t5.data.preprocessors.glue` with TFDS's label
classes, or `preprocessors.stsb`), give the same inputs and targets as t5lite's task."""
import itertools
import os

import numpy as np
import pytest
from conftest import shared_data_dir

from t5lite.data import get_task
from t5lite.data.sources import to_python
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


def tfds_split(split):
    """The `split` argument TFDS's glue builder passes `_generate_examples` for one of its splits."""
    return next(name for prefix, name in (("validation", "dev"), ("test", "test"), ("train", "train"))
                if split.startswith(prefix))


def tfds_records(spec, split, data_dir):
    """The split's file read by TFDS's glue builder (MRPC: from the MSR release files, as TFDS builds it)."""
    builder = tfds_glue.Glue(config=spec.name, data_dir=data_dir)
    folder = os.path.join(GLUE, spec.folder)
    mrpc_files = {"train": os.path.join(folder, "msr_paraphrase_train.txt"),
                  "dev_ids": os.path.join(folder, "dev_ids.tsv"), "test": os.path.join(folder, "msr_paraphrase_test.txt")}
    examples = builder._generate_examples(os.path.join(folder, spec.split_files[split]), tfds_split(split),
                                          mrpc_files if spec.name == "mrpc" else None)
    return [to_python(builder.info.features.encode_example(ex)) for _, ex in examples]


def comparable(records, spec, split):
    """Records as TFDS stores them: STS-B's score as float32. MRPC's train and dev `idx` are left out:
    TFDS builds MRPC from the MSR release and numbers its rows (train and dev interleaved), where
    t5lite numbers the rows of GLUE's own train.tsv and dev.tsv."""
    out = []
    for record in records:
        if spec.label_names is None:
            record = {**record, "label": float(np.float32(record["label"]))}
        if spec.name == "mrpc" and split != "test":
            record = {k: v for k, v in record.items() if k != "idx"}
        out.append(record)
    return out


@pytest.mark.parametrize("spec", [s for s in GLUE_TASKS if _on_disk(s)], ids=lambda s: s.name)
def test_glue_files_read_as_tfds_reads_them(spec, tmp_path):
    task = get_task(f"glue_{spec.name}")
    for split, name in spec.split_files.items():
        if os.path.exists(os.path.join(GLUE, spec.folder, name)):
            ours = comparable(task.source.load(split, data_dir=GLUE), spec, split)
            assert ours == comparable(tfds_records(spec, split, str(tmp_path)), spec, split), split


def test_line_breaks_and_quotes_read_as_tfds_reads_them(tmp_path):
    """A lone carriage return ends a row, other line breaks (U+2028, U+0085, vertical tab) and bare
    quotes stay in the text, as in TFDS's reading (`csv`, QUOTE_NONE, over a text-mode file)."""
    (tmp_path / "RTE").mkdir()
    (tmp_path / "RTE" / "dev.tsv").write_bytes(
        "index\tsentence1\tsentence2\tlabel\r\n0\tHe said \"no.\tIt\u2028was\x85so\x0b.\tentailment\r"
        "1\ta\tb\tnot_entailment\n\n2\t\"c\"\td\tentailment\n".encode())
    builder = tfds_glue.Glue(config="rte", data_dir=str(tmp_path / "tfds"))
    theirs = [to_python(builder.info.features.encode_example(ex))
              for _, ex in builder._generate_examples(str(tmp_path / "RTE" / "dev.tsv"), "dev")]
    assert len(theirs) == 3
    assert list(get_task("glue_rte").source.load("validation", data_dir=str(tmp_path))) == theirs
