"""A sweep's forgetting lens: after each cell's fine-tuning on the forgetting task, `t5lite eval
--forgetting` scores it on its base's pre-training task with the base's own config.gin, and the lens
is the change (fine-tuned minus base), judged less-is-better for a loss, with the forgetting
frontier drawn. Through tests/sweep_fake_cli.py; the slow test runs the real commands."""
import json
import math

import numpy as np
import pytest

from conftest import REPO, shared_data_dir
from test_sweep import sweep, write_sweep

from t5lite.errors import ConfigError

scipy_stats = pytest.importorskip("scipy.stats", reason="the reference intervals are scipy's")

CELLS = """
sweep.cells = {
    'good_full': {'pretrain': ['configs/local/t5_tiny_pretrain.gin'], 'tokens_per_row': 160,
                  'finetune': ['configs/local/t5_tiny_finetune_sst2.gin']},
    'plain': {'pretrain': [], 'pretrain_from': 'good_full', 'finetune': ['configs/local/t5_tiny_finetune_sst2.gin'],
              'finetune_bindings': ['train.seed = 7']},
    'scratch': {'pretrain': [], 'finetune': ['configs/local/t5_tiny_finetune_sst2.gin']},
}
sweep.claims = []
"""
LENSES = """
sweep.lenses = {'forgetting': 'forgetting_mlm_loss', 'accuracy_kept': 'forgetting_mlm_accuracy'}
sweep.claims = [('the good cell forgets less', 'good_full', 'plain', 'forgetting')]
"""


def forgetting_sweep(tmp_path, extra=LENSES, cells=CELLS):
    gin_file = write_sweep(tmp_path)
    gin_file.write_text(gin_file.read_text() + cells + extra)
    return gin_file


def measured(out, cell, seed, task="sst2"):
    return json.loads((out / f"{cell}__seed{seed}" / f"finetune_{task}" / "eval" / "forgetting.json").read_text())


def test_each_fine_tuning_from_a_base_is_scored_on_the_bases_task_and_judged_less_is_better(tmp_path):
    out = tmp_path / "out"
    result = sweep(forgetting_sweep(tmp_path), out)
    assert result.returncode == 0, result.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["forgetting_task"] == "sst2"   # the first task by default
    rises = {}
    for name in ("good_full", "plain"):
        runs = [measured(out, name, seed) for seed in (0, 1)]
        for seed, run in enumerate(runs):   # the base: the cell's pre-training, or its source cell's of the same seed
            base = out / f"good_full__seed{seed}" / "pretrain"
            assert run["base"] == str(base) and f"--gin_file={base / 'config.gin'}" in run["argv"]
            assert "--gin.eval.max_examples=16" in run["argv"]   # the ci scale's pretrain_eval_examples
        rises[name] = [r["run_metrics"]["mlm_loss"] - r["base_metrics"]["mlm_loss"] for r in runs]
        mean = np.mean(rises[name])
        low, high = scipy_stats.t.interval(0.95, 1, loc=mean, scale=scipy_stats.sem(rises[name]))
        assert report["cells"][name]["summary"]["forgetting"] == pytest.approx({"mean": mean, "low": low, "high": high})
        fall = [r["run_metrics"]["mlm_accuracy"] - r["base_metrics"]["mlm_accuracy"] for r in runs]
        assert report["cells"][name]["summary"]["accuracy_kept"]["mean"] == pytest.approx(np.mean(fall))
    assert not (out / "scratch__seed0" / "finetune_sst2" / "eval").exists()   # no base, nothing to forget
    assert math.isnan(report["cells"]["scratch"]["summary"]["forgetting"]["mean"] or math.nan)
    comparison = report["claims"][0]["tasks"]["forgetting"]
    d = np.subtract(rises["good_full"], rises["plain"])
    low, high = scipy_stats.t.interval(0.95, 1, loc=d.mean(), scale=scipy_stats.sem(d))
    assert (comparison["low"], comparison["high"]) == pytest.approx((low, high))
    assert high < 0 and comparison["verdict"].startswith("reproduced")   # a smaller rise is better
    md = (out / "report.md").read_text()
    assert "forgetting (mlm_loss change after sst2)" in md and "accuracy_kept (mlm_accuracy change after sst2)" in md
    assert f"{np.mean(rises['good_full']):.3f} [" in md and "Forgetting lenses, of each cell's fine-tuning on sst2" in md
    for lens in ("forgetting", "accuracy_kept"):
        assert (out / f"{lens}_frontier.png").stat().st_size > 10_000


def test_runs_made_before_a_forgetting_lens_are_measured_without_training_again(tmp_path):
    gin_file = forgetting_sweep(tmp_path, extra="")
    out = tmp_path / "out"
    assert sweep(gin_file, out).returncode == 0
    trained = {path: path.stat().st_mtime_ns for path in out.glob("*/*/metrics.jsonl")}
    gin_file.write_text(gin_file.read_text() + LENSES)
    result = sweep(gin_file, out)
    assert result.returncode == 0, result.stderr
    assert "6 cell runs, 2 already done, 4 trained but not yet measured by every lens" in result.stdout
    assert {path: path.stat().st_mtime_ns for path in out.glob("*/*/metrics.jsonl")} == trained
    report = json.loads((out / "report.json").read_text())
    assert report["claims"][0]["verdict"].startswith("reproduced")


def test_a_failing_forgetting_evaluation_fails_its_cell_and_a_rerun_finishes_it(tmp_path):
    gin_file = forgetting_sweep(tmp_path)
    out = tmp_path / "out"
    sweep(gin_file, out, env={"FAKE_EVAL_FAIL": "1"})
    errors = [json.loads(p.read_text()) for p in out.glob("*/error.json")]
    assert len(errors) == 4 and {e["stage"] for e in errors} == {"forgetting"}
    assert len(list(out.glob("*/done.json"))) == 2   # the scratch cell has nothing to measure
    assert sweep(gin_file, out).returncode == 0
    assert len(list(out.glob("*/done.json"))) == 6 and not list(out.glob("*/error.json"))


def test_the_forgetting_task_can_be_named_and_must_be_one_the_scale_runs(tmp_path, clean_gin_state):
    from t5lite.experiments import spec
    named = spec.load([str(forgetting_sweep(tmp_path, LENSES + "sweep.forgetting_task = 'rte'\n"))], [], [str(REPO)])
    assert named.forgetting_task == "rte" and named.forgetting_lenses == {"forgetting": "mlm_loss",
                                                                         "accuracy_kept": "mlm_accuracy"}
    assert named.eval_lenses == {}   # the pre-training does not evaluate for these
    with pytest.raises(ConfigError, match=r"sweep.forgetting_task 'cola' is not one of the tasks it fine-tunes "
                                          r"\['rte', 'sst2'\]"):
        spec.load([str(forgetting_sweep(tmp_path, LENSES + "sweep.forgetting_task = 'cola'\n"))], [], [str(REPO)])
    with pytest.raises(ConfigError, match="sweep.forgetting_task is set but no lens is 'forgetting_<metric>'"):
        spec.load([str(forgetting_sweep(tmp_path, "sweep.forgetting_task = 'rte'\n"))], [], [str(REPO)])
    with pytest.raises(ConfigError, match="name the base's held-out metric it measures the change of"):
        spec.load([str(forgetting_sweep(tmp_path, "sweep.lenses = {'f': 'forgetting_'}\n"))], [], [str(REPO)])


def test_a_start_from_without_a_config_gin_stops_the_sweep_before_any_run(tmp_path):
    converted = tmp_path / "converted"
    converted.mkdir()
    cells = CELLS.replace("'pretrain_from': 'good_full'", f"'start_from': '{converted}'")
    result = sweep(forgetting_sweep(tmp_path, cells=cells), tmp_path / "out")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert f"cell 'plain': its start_from {converted} has no config.gin" in result.stderr
    assert not list((tmp_path / "out").glob("*__seed*"))


@pytest.mark.slow
def test_the_shipped_forgetting_sweep_measures_real_runs_at_the_ci_scale(tmp_path):
    out = tmp_path / "out"
    result = sweep(REPO / "configs" / "sweeps" / "forgetting.gin", out, "--cells", "full,lora",
                   f"--gin.DATA_DIR='{shared_data_dir() / 'glue'}'")
    assert result.returncode == 0, result.stderr
    report = json.loads((out / "report.json").read_text())
    for name in ("full", "lora"):
        for seed in (0, 1):
            run = measured(out, name, seed)
            assert run["base"] == str(out / f"full__seed{seed}" / "pretrain") and run["task"] == "embedded_docs_bert_mlm"
            assert report["cells"][name]["seeds"][str(seed)]["scores"]["forgetting"] == pytest.approx(
                run["run_metrics"]["mlm_loss"] - run["base_metrics"]["mlm_loss"], abs=1e-12)
    assert not (out / "lora__seed0" / "pretrain").exists()   # LoRA fine-tunes full's base of the same seed
    assert (out / "forgetting_frontier.png").stat().st_size > 10_000
