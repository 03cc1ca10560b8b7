"""Summarization tasks on the CNN/DailyMail CSV in ../shared/data/summarization, JSON lines written in
tmp_path, and TFDS under mock_data."""
import itertools

import numpy as np
import pytest
from conftest import shared_data_dir

from t5lite import metrics
from t5lite.data import get_task

SHARED = shared_data_dir()  # <repo>/../shared/data or $T5LITE_SHARED_DATA
CNN = str(SHARED / "summarization" / "cnn_dailymail")


def test_cnn_dailymail_csv_first_row():
    task = get_task("cnn_dailymail")
    ex = next(task.get_dataset("validation", data_dir=CNN, sequence_length={"inputs": 64, "targets": 32}))
    assert ex["inputs_pretokenized"].startswith(
        "summarize: (CNN)Share, and your gift will be multiplied. That may sound like an esoteric adage, but when "
        "Zully Broussard selflessly decided to give one of her kidneys to a stranger")
    assert ex["targets_pretokenized"] == ("Zully Broussard decided to give a kidney to a stranger .\n"
                                          "A new computer program helped her donation spur transplants for six kidney "
                                          "patients .")
    assert len(ex["inputs"]) == 64 and ex["inputs"][-1] == 1 and ex["targets"].dtype == np.int32


def test_cnn_dailymail_split_mapping_and_count():
    files = get_task("cnn_dailymail").source.files
    assert files.files("validation", CNN) == [f"{CNN}/cnn_dailymail_validation_subset.csv"]
    assert files.files("train", CNN) == []
    task = get_task("cnn_dailymail")
    assert sum(1 for _ in task.source.load("validation", data_dir=CNN)) == 1000


def test_xsum_json_lines_and_malformed(tmp_path, monkeypatch):
    (tmp_path / "test.jsonl").write_text('{"document": "A long story.", "summary": "Short.", "id": "1"}\n'
                                         '{"document": "No summary here."}\n')
    task = get_task("xsum")
    with pytest.raises(ValueError, match=r"test\.jsonl:2: missing key\(s\) \['summary'\]"):
        list(task.get_dataset("test", data_dir=str(tmp_path)))
    monkeypatch.setattr(task.source.files, "on_malformed", "skip")
    got = [(e["inputs_pretokenized"], e["targets_pretokenized"])
           for e in task.get_dataset("test", data_dir=str(tmp_path))]
    assert got == [("summarize: A long story.", "Short.")]


def test_rouge_registered():
    task = get_task("cnn_dailymail")
    assert task.metric_fns == [metrics.rouge] and get_task("xsum").metric_fns == [metrics.rouge]
    refs = [ex["targets_pretokenized"] for ex in itertools.islice(task.get_dataset("validation", data_dir=CNN), 3)]
    assert metrics.compute_metrics(task.metric_fns, refs, refs)["rouge1"] == pytest.approx(100.0)


@pytest.mark.parametrize("name, article, summary", [("cnn_dailymail", "article", "highlights"),
                                                    ("xsum", "document", "summary")])
def test_tfds_source_with_mock_data(name, article, summary):
    tfds = pytest.importorskip("tensorflow_datasets", reason="the TFDS path needs tensorflow-datasets")
    task = get_task(name)
    with tfds.testing.mock_data(num_examples=3, policy=tfds.testing.MockPolicy.USE_CODE):
        raw = list(task.source.load("test"))
        examples = list(task.get_dataset("test", data_dir=CNN))  # no test files there: TFDS is used
    assert [e["inputs_pretokenized"] for e in examples] == [f"summarize: {r[article]}" for r in raw]
    assert [e["targets_pretokenized"] for e in examples] == [r[summary] for r in raw]
