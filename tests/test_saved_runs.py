"""A run saved by an earlier version of t5lite resumes: `data/bert_tiny_run_before_objectives_floor` is
a 2-step bert_tiny MLM + NSP run (configs/local/bert_tiny_pretrain.gin, batch 2) written before the
objectives moved from t5lite.train to t5lite.objectives. Its operative config.gin names them by gin's
short names, and its checkpoint's tree is the model's, so both load unchanged."""
import json
import shutil
from pathlib import Path

import gin
import jax
import numpy as np
import pytest

from conftest import REPO, logged_losses
from t5lite import cli
from t5lite.infer import checkpoint_reader

SAVED = Path(__file__).parent / "data" / "bert_tiny_run_before_objectives_floor"


@pytest.fixture(autouse=True)
def clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def _saved_run(tmp_path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(SAVED, run)
    return run


def test_a_run_saved_before_the_objectives_floor_resumes_from_its_own_config_gin(tmp_path, monkeypatch, caplog):
    run = _saved_run(tmp_path)
    before = _params(run / "checkpoints" / "2")
    monkeypatch.chdir(REPO)   # the saved config names no include; the task and presets are built in
    # The vocabulary is the embedded corpus's SentencePiece model, trained on first use: allow it to be
    # another machine's training of it (its pieces' hash is what vocabulary.json records).
    caplog.set_level("INFO", logger="t5lite")
    cli.main(["train", f"--gin_file={run / 'config.gin'}", f"--gin.MODEL_DIR='{run}'", "--gin.TRAIN_STEPS=3",
              "--gin.vocabulary.allow_mismatch=True"])
    assert any("resumed from step 2" in r.getMessage() for r in caplog.records)
    assert sorted(logged_losses(run)) == [1, 2, 3]   # the saved steps' lines, then the resumed one
    after = _params(run / "checkpoints" / "3")
    assert [a.shape for a in after] == [b.shape for b in before]
    moved = [np.abs(a - b).max() for a, b in zip(before, after)]
    assert len(moved) > 10 and max(moved) > 0      # the same tree, one more update
    config = (run / "config.gin").read_text()
    assert "train.objective = @MlmNspObjective()" in config
    assert json.loads((run / "model_config.json").read_text())["encoder_head"] == "mlm"


def test_a_run_saved_before_the_objectives_floor_resumes_from_the_shipped_config(tmp_path, monkeypatch):
    run = _saved_run(tmp_path)
    monkeypatch.chdir(REPO)
    cli.main(["train", "--gin_file=configs/local/bert_tiny_pretrain.gin", f"--gin.MODEL_DIR='{run}'",
              "--gin.TRAIN_STEPS=3", "--gin.BATCH_SIZE=2", "--gin.train.log_every=1",
              "--gin.vocabulary.allow_mismatch=True"])
    assert sorted(logged_losses(run)) == [1, 2, 3]


def _params(step_dir: Path) -> list[np.ndarray]:
    """A checkpoint's parameters as they are stored (shapes and dtypes from its own metadata)."""
    stored = checkpoint_reader.step_reader().metadata(str(step_dir)).item_metadata["state"]["params"]
    abstract = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), stored)
    return [np.asarray(x) for x in jax.tree.leaves(checkpoint_reader.restore_params(str(step_dir), abstract))]
