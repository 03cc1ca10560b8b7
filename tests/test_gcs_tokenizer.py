"""A run that carries its own tokenizer (`t5lite convert --from_hf`, or fine-tuned from such a run)
in a bucket: converting into gs:// records the tokenizer there, and the commands on the gs:// run
encode with it exactly as on a local copy (they used to fall back to the default vocabulary).
A peft adapter folder in a bucket is refused in one line saying to copy it."""
from __future__ import annotations

from pathlib import Path

import gin
import numpy as np
import pytest

from test_analysis import _tiny_bert_folder
from test_gcs import BUCKET, gcs  # noqa: F401  (the emulator fixture)
from t5lite import cli
from t5lite.data import vocab as vocab_lib

TEXTS = ["the play was long .", "a cat sat on 42 mats !"]


def _embed(run: str, output: Path) -> np.ndarray:
    gin.clear_config()
    try:
        cli.main(["embed", f"--gin.CHECKPOINT_PATH='{run}'", f"--output={output}", *TEXTS])
    finally:
        gin.clear_config()
        vocab_lib.set_default_vocabulary(None)
    return np.load(output)


@pytest.fixture(scope="module")
def converted(gcs, tmp_path_factory):  # noqa: F811
    """(the Hugging Face folder, `convert --from_hf` of it into the bucket, the same into a local folder)."""
    tmp = tmp_path_factory.mktemp("bert")
    folder = _tiny_bert_folder(tmp / "hf")
    remote, local = f"gs://{BUCKET}/converted/bert", str(tmp / "run")
    for out in (remote, local):
        cli.main(["convert", "--from_hf", str(folder), "--out", out])
    return folder, remote, local


def _encodings(run: str) -> list[list[int]]:
    try:
        vocab_lib.use_run_vocabulary(None, run)
        return [vocab_lib.DEFAULT_VOCABULARY.encode(text) for text in TEXTS]
    finally:
        vocab_lib.set_default_vocabulary(None)


def test_a_converted_run_in_a_bucket_embeds_with_its_own_tokenizer(converted, gcs, tmp_path,  # noqa: F811
                                                                  monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder, remote, local = converted
    _, fs = gcs
    assert fs.cat(f"{remote[5:]}/tokenizer/vocab.txt") == (folder / "vocab.txt").read_bytes()
    assert fs.exists(f"{remote[5:]}/vocabulary.json")
    fs.put(local, f"{BUCKET}/copied/bert", recursive=True)   # a local run copied into the bucket reads the same
    expected = _embed(local, tmp_path / "local.npy")
    for run in (remote, f"gs://{BUCKET}/copied/bert"):
        np.testing.assert_array_equal(_embed(run, tmp_path / "remote.npy"), expected)
    assert not (tmp_path / "gs:").exists(), "a gs:// path was used as a local one"


def test_a_run_fine_tuned_from_a_gs_run_carries_its_tokenizer_on(converted, tmp_path, monkeypatch):
    """Training from a gs:// run into a gs:// MODEL_DIR copies the tokenizer as train/setup.py does."""
    monkeypatch.chdir(tmp_path)
    folder, remote, local = converted
    tuned = f"gs://{BUCKET}/tuned/bert"
    assert vocab_lib.record_tokenizer(tuned, f"{remote}/tokenizer") is not None
    local_encodings = _encodings(local)
    assert local_encodings[0] != _encodings(str(tmp_path / "no_run"))   # the default vocabulary encodes otherwise
    assert _encodings(tuned) == _encodings(remote) == local_encodings
    assert not (tmp_path / "gs:").exists(), "a gs:// path was used as a local one"


def test_a_peft_adapter_folder_in_a_bucket_is_refused_in_one_line(converted, gcs, tmp_path, capsys):  # noqa: F811
    """Adapter folders are read from local disk: the refusal says to copy it, where it used to say
    that the folder has no adapter_config.json."""
    folder, _, _ = converted
    _, fs = gcs
    fs.pipe(f"{BUCKET}/adapter/adapter_config.json", b'{"peft_type": "LORA", "r": 2}')
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["convert", "--from_hf", str(folder), "--peft_adapter", f"gs://{BUCKET}/adapter",
                  "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"gs://{BUCKET}/adapter is in a bucket" in err and "peft adapter folders" in err and "copy it first" in err
    assert not (tmp_path / "run").exists()
