"""RunDir is the one place a run directory's file names are spelt (docs/getting-started.md's table)."""
import pathlib
import re

import pytest

import t5lite
from t5lite.run_layout import RunDir

PACKAGE = pathlib.Path(t5lite.__file__).parent
# Names only a run directory has; a module that spells one builds a run path by hand.
RUN_ONLY = ("checkpoints", "cost.json", "peft.json", "sparsity.json", "head_pruning.json", "RUN_LOCK",
            "vocabulary.json", "model_config.json", "config_history", "config.gin", "loss.png", "vectors.txt")


def test_run_files_are_named_only_by_run_layout():
    spelt = [f"{path.relative_to(PACKAGE)}: {name}" for path in sorted(PACKAGE.rglob("*.py"))
             if path.name != "run_layout.py"
             for name in RUN_ONLY if re.search(rf"[\"']{re.escape(name)}[\"']", path.read_text())]
    assert not spelt, "build these paths with t5lite.run_layout.RunDir:\n" + "\n".join(spelt)


def test_paths_of_a_local_run(tmp_path):
    run = RunDir(tmp_path / "run")
    assert run.metrics == tmp_path / "run" / "metrics.jsonl"
    assert run.checkpoints == tmp_path / "run" / "checkpoints"
    assert run.history(120, "config.gin") == tmp_path / "run" / "config_history" / "120-config.gin"
    assert run.eval_output("glue_sst2", "validation") == tmp_path / "run" / "eval" / "glue_sst2.validation"
    assert str(run) == str(tmp_path / "run")


def test_a_gs_run_keeps_its_url():
    pytest.importorskip("gcsfs", reason="gs:// paths in etils.epath need gcsfs (the gcs extra)")
    assert str(RunDir("gs://bucket/runs/a").cost) == "gs://bucket/runs/a/cost.json"


@pytest.mark.parametrize("step_dir, run", [("runs/a/checkpoints/40", "runs/a"), ("runs/hf_import/7", "runs/hf_import")])
def test_the_run_of_a_step_directory(tmp_path, monkeypatch, step_dir, run):
    monkeypatch.chdir(tmp_path)
    assert RunDir.of_step(step_dir).path == tmp_path / run
