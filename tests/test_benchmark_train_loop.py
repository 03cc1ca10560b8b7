"""`benchmarks/train_loop.py` times the real `t5lite train` command beside its own bare step: at a
tiny size it runs both, writes one row per config with positive rates and their ratio, and the
loop side is the command's own metrics.jsonl (no timing is asserted)."""
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO

TINY = ["--gin", "TASK_FEATURE_LENGTHS = {'inputs': 32, 'targets': 8}", "--gin", "BATCH_SIZE = 4"]


def _run(*args, cwd=REPO):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, str(REPO / "benchmarks" / "train_loop.py"), *args], capture_output=True,
                          text=True, env=env, timeout=600, cwd=cwd)


def test_times_the_command_and_its_bare_step(tmp_path):
    out = tmp_path / "loop.json"
    run = _run("--configs", "configs/local/t5_tiny_pretrain.gin", *TINY, "--steps", "6", "--log_every", "2",
               "--runs", "1", "--out", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    [row] = json.loads(out.read_text())
    assert row["config"] == "configs/local/t5_tiny_pretrain.gin"
    assert len(row["loop_steps_per_sec"]) == len(row["bare_steps_per_sec"]) == 1
    assert min(row["loop_steps_per_sec"] + row["bare_steps_per_sec"]) > 0
    assert row["ratio"] == pytest.approx(row["loop_steps_per_sec"][0] / row["bare_steps_per_sec"][0], rel=1e-9)
    table = [line for line in run.stdout.splitlines() if line.startswith("configs/local/t5_tiny_pretrain.gin")]
    assert len(table) == 1 and float(table[0].split()[-1]) == pytest.approx(row["ratio"], abs=0.006), run.stdout


def test_a_fine_tuning_config_with_its_own_eval_every_macro_runs(tmp_path):
    """Fine-tuning configs set EVAL_EVERY; turning evaluation off through train.eval_every would leave
    that macro unused, which t5lite refuses."""
    from conftest import shared_data_dir
    out = tmp_path / "loop.json"
    run = _run("--configs", "configs/local/bert_tiny_finetune_sst2.gin", "--gin", f"DATA_DIR = '{shared_data_dir() / 'glue'}'",
               "--gin", "INITIAL_CHECKPOINT_PATH = None", "--gin", "BATCH_SIZE = 4", "--steps", "6", "--log_every", "2",
               "--runs", "1", "--out", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    [row] = json.loads(out.read_text())
    assert min(row["loop_steps_per_sec"] + row["bare_steps_per_sec"]) > 0


@pytest.mark.parametrize("args, message", [
    (["--steps", "0"], "--steps"),
    (["--runs", "-1"], "--runs"),
    (["--steps", "10", "--log_every", "10"], "no steady-state log line"),
])
def test_counts_that_measure_nothing_are_refused_in_one_line(args, message, tmp_path):
    run = _run(*args, "--out", str(tmp_path / "x.json"))
    assert run.returncode == 2 and message in run.stderr, run.stderr
    assert not (tmp_path / "x.json").exists()


def test_a_bad_binding_is_refused_in_one_line_naming_the_config():
    run = _run("--configs", "configs/local/t5_tiny_pretrain.gin", "--gin", "BATCH_SIZE = -4", "--steps", "4",
               "--log_every", "2", "--runs", "1")
    assert run.returncode == 2 and "BATCH_SIZE" in run.stderr, run.stderr[-2000:]
    assert "Traceback" not in run.stderr
