"""A sweep's lenses: each pre-training run evaluates its own task's held-out split at its last step,
and the report gives that metric (e.g. the MLM loss) per cell beside the tasks, with scipy's
t-interval, and judges claims on it in the metric's direction (a lower loss is better). The fast
tests train through tests/sweep_fake_cli.py; the slow one evaluates a real bert_tiny pre-training."""
import json
import math

import numpy as np
import pytest

from conftest import REPO, shared_data_dir
from sweep_fake_cli import UNIGRAM_LOSS
from test_sweep import sweep, write_sweep

from t5lite.errors import ConfigError

scipy_stats = pytest.importorskip("scipy.stats", reason="the reference intervals are scipy's")

LENS = "\nsweep.lenses = {'heldout': 'mlm_loss'}\n"
LENS_CLAIM = "\nsweep.claims = [('good models the held-out text better', 'good_enc_dec', 'lm', 'heldout', {'effect': 0.5})]\n"


def logged_lens(out, cell, seed):
    rows = [json.loads(line) for line in (out / f"{cell}__seed{seed}" / "pretrain" / "metrics.jsonl").open()]
    return [r["eval_mlm_loss"] for r in rows if "eval_mlm_loss" in r]


def finished_sweep(tmp_path, extra: str):
    """The toy sweep with `extra` gin lines, run to its end: its folder and report."""
    gin_file = write_sweep(tmp_path)
    gin_file.write_text(gin_file.read_text() + extra)
    out = tmp_path / "out"
    result = sweep(gin_file, out)
    assert result.returncode == 0, result.stderr
    return out, json.loads((out / "report.json").read_text())


def test_each_pretraining_evaluates_at_its_last_step_and_the_report_judges_the_lens_lower_is_better(tmp_path):
    out, report = finished_sweep(tmp_path, LENS + LENS_CLAIM)
    assert report["lenses"] == {"heldout": "mlm_loss"} and report["pretrain_eval_examples"] == 16   # the ci scale's
    values = {}
    for name, cell in report["cells"].items():
        values[name] = [logged_lens(out, name, seed)[-1] for seed in (0, 1)]
        assert [len(logged_lens(out, name, seed)) for seed in (0, 1)] == [1, 1]   # once, at the last step
        mean = np.mean(values[name])
        low, high = scipy_stats.t.interval(0.95, 1, loc=mean, scale=scipy_stats.sem(values[name]))
        assert cell["summary"]["heldout"] == pytest.approx({"mean": mean, "low": low, "high": high}, rel=1e-12)
        assert "heldout" not in report["average_tasks"]
    claim, = report["claims"]
    comparison = claim["tasks"]["heldout"]
    d = np.subtract(values["good_enc_dec"], values["lm"])
    low, high = scipy_stats.t.interval(0.95, 1, loc=d.mean(), scale=scipy_stats.sem(d))
    assert (comparison["low"], comparison["high"]) == pytest.approx((low, high), rel=1e-12)
    assert comparison["p_value"] == pytest.approx(scipy_stats.ttest_rel(values["good_enc_dec"], values["lm"]).pvalue, rel=1e-9)
    # lower is better: reproduced only where the whole interval of good - lm is below 0
    expected = "reproduced" if high < 0 else "contradicted" if low > 0 else "undecided"
    assert expected == "reproduced"   # the fake runs' seeds decide it, so the direction is what is tested
    assert comparison["verdict"].startswith(expected) and claim["verdict"].startswith(expected)
    md = (out / "report.md").read_text()
    assert "heldout (mlm_loss, held out)" in md
    good = np.mean(values["good_enc_dec"])
    assert "| good_enc_dec | " in md and f"{good:.3f} [" in md
    assert "on the first 16 examples of its pre-training task's validation split" in md


@pytest.mark.parametrize("unigram", [UNIGRAM_LOSS, 1.0])
def test_a_cell_whose_held_out_loss_interval_reaches_its_unigram_loss_is_at_chance(tmp_path, unigram):
    """The pre-training logs its `unigram_loss` beside `mlm_loss`; a cell is at chance on the lens
    where scipy's 95% interval of its seeds reaches it from below (its upper end at or above it), and
    a claim whose two rows are both at chance is left out (the fake's held-out losses are about 2.5
    for its good cell and 3.0 for the other: below 5.0 both, above 1.0 both)."""
    gin_file = write_sweep(tmp_path)
    gin_file.write_text(gin_file.read_text() + LENS +
                        "\nsweep.claims = [('good models the held-out text better', 'good_enc_dec', 'lm', 'heldout')]\n")
    out = tmp_path / "out"
    result = sweep(gin_file, out, env={"FAKE_UNIGRAM_LOSS": str(unigram)})
    assert result.returncode == 0, result.stderr
    report = json.loads((out / "report.json").read_text())
    marks = {}
    for name, cell in report["cells"].items():
        values = [logged_lens(out, name, seed)[-1] for seed in (0, 1)]
        _, high = scipy_stats.t.interval(0.95, 1, loc=np.mean(values), scale=scipy_stats.sem(values))
        assert cell["lens_baselines"] == {"heldout": unigram}
        marks[name] = cell["at_chance"]["heldout"]
        assert marks[name] is bool(high >= unigram), name
    assert marks == dict.fromkeys(marks, unigram == 1.0)
    verdict = report["claims"][0]["tasks"]["heldout"]["verdict"]
    assert verdict == "at chance: left out" if unigram == 1.0 else verdict.startswith("reproduced")
    md = (out / "report.md").read_text()
    baseline_row = next(line for line in md.splitlines() if line.startswith("| constant baseline |"))
    assert baseline_row.split(" | ")[len(report["tasks"]) + 2] == f"{unigram:.3f}"   # the lens column
    assert "is the run's `unigram_loss`" in md


def test_without_lenses_the_pretraining_does_not_evaluate(tmp_path, clean_gin_state):
    from t5lite.experiments import spec
    from t5lite.experiments.runner import stages
    plain = spec.load([str(write_sweep(tmp_path))], [], [str(REPO)])
    gin_file = write_sweep(tmp_path)
    gin_file.write_text(gin_file.read_text() + LENS)
    lensed = spec.load([str(gin_file)], [], [str(REPO)])
    cell = lensed.cells[0]
    steps = lensed.pretrain_steps(cell)
    (_, _, with_lens), *finetunes = stages(lensed, cell, 0, tmp_path)
    (_, _, without), *_ = stages(plain, plain.cells[0], 0, tmp_path)
    assert f"train.eval_every = {steps}" in with_lens and "train.eval_max_examples = 16" in with_lens
    assert not any(b.startswith("train.eval_every") for b in without)
    assert all(not any(b.startswith("train.eval_every") for b in bindings) for _, _, bindings in finetunes)


@pytest.mark.parametrize("lenses, claim, message", [
    ("{'sst2': 'mlm_loss'}", "", r"lens 'sst2' has a task's name"),
    ("{'glue_average': 'mlm_loss'}", "", r"lens 'glue_average' has a task's name"),
    ("{'heldout': 3}", "", r"lens 'heldout': its metric is 3; give the name the pre-training run logs as eval_<metric>"),
    ("{'held out': 'mlm_loss'}", "", r"lens 'held out': a name becomes a folder name"),
    ("{'heldout': 'mlm_loss'}", "\nsweep.claims = [('x', 'good_enc_dec', 'lm', 'heldot')]\n",
     r"column 'heldot' is neither a task \['rte', 'sst2'\], a lens \['heldout'\] nor 'glue_average'"),
])
def test_a_bad_lens_is_one_line(tmp_path, clean_gin_state, lenses, claim, message):
    from t5lite.experiments import spec
    gin_file = write_sweep(tmp_path)
    gin_file.write_text(gin_file.read_text() + f"\nsweep.lenses = {lenses}\n" + claim)
    with pytest.raises(ConfigError, match=message):
        spec.load([str(gin_file)], [], [str(REPO)])


def test_a_report_made_before_a_lens_rebuilds_without_its_column(tmp_path, capsys):
    """The shipped ci report of bert_tasks predates its lens: rebuilt, it keeps its tables and says
    a claim on a lens it never measured was not run."""
    from t5lite import cli
    stored = REPO / "docs" / "results" / "sweeps_ci" / "bert_tasks_report.json"
    assert "heldout_mlm" not in json.loads(stored.read_text()).get("lenses", {})
    gin_file = tmp_path / "bert_tasks_lensed.gin"
    gin_file.write_text(f"include '{REPO / 'configs' / 'sweeps' / 'bert_tasks.gin'}'\n"
                        "sweep.claims = [('MLM alone models text better', 'mlm', 'mlm_nsp', 'heldout_mlm')]\n")
    cli.main(["sweep", f"--gin_file={gin_file}", "--gin.SWEEP_SCALE='ci'", f"--gin.DATA_DIR='{shared_data_dir() / 'glue'}'",
              "--cells", "mlm_nsp,mlm", f"--rebuild={stored}", f"--out={tmp_path / 'out'}"])
    rebuilt = json.loads((tmp_path / "out" / "report.json").read_text())
    assert rebuilt["lenses"] == {} and "held out" not in (tmp_path / "out" / "report.md").read_text()
    assert rebuilt["claims"][0]["verdict"].startswith("not run") and "a lens the runs predate" in rebuilt["claims"][0]["verdict"]
    assert all(not math.isnan(cell["summary"]["sst2"]["mean"]) for cell in rebuilt["cells"].values())


@pytest.mark.slow
def test_a_real_bert_pretraining_logs_the_lens_as_its_own_heldout_evaluation(tmp_path):
    """One cell, one seed of real bert_tiny MLM + NSP pre-training at the ci scale, with the lens
    (about a minute): its eval_mlm_loss is logged once at the last step and is a loss over a
    2176-piece vocabulary after a handful of steps, near ln(2176) = 7.69."""
    gin_file = tmp_path / "one.gin"
    gin_file.write_text(f"include '{REPO / 'configs' / 'sweeps' / 'bert_sizes.gin'}'\n"
                        "sweep.scales = {'ci': {'seeds': 1, 'pretrain_tokens': 2560, 'batch_size': 4, 'finetune_steps': 2,"
                        " 'finetune_batch_size': 4, 'eval_max_examples': 8, 'pretrain_eval_examples': 16, 'tasks': ['sst2']}}\n")
    out = tmp_path / "out"
    result = sweep(gin_file, out, f"--gin.DATA_DIR='{shared_data_dir() / 'glue'}'", "--cells=L3_H768_A12")
    assert result.returncode == 0, result.stderr
    logged = logged_lens(out, "L3_H768_A12", 0)
    report = json.loads((out / "report.json").read_text())
    assert len(logged) == 1 and report["cells"]["L3_H768_A12"]["seeds"]["0"]["scores"]["heldout_mlm"] == logged[0]
    assert abs(logged[0] - math.log(2176)) < 0.5
    # the unigram baseline, logged beside it, is far below: the model has not yet learnt token frequencies
    cell = report["cells"]["L3_H768_A12"]
    assert cell["lens_baselines"]["heldout_mlm"] < logged[0] - 0.5 and cell["at_chance"]["heldout_mlm"] is True


PROBE_LENS = f"\nsweep.lenses = {{'pos': 'pos_probe'}}\nsweep.probe_data_dir = '{shared_data_dir() / 'ud'}'\n"
PROBE_CLAIM = "\nsweep.claims = [('good models tag better', 'good_enc_dec', 'lm', 'pos')]\n"


def probe_json(out, cell, seed):
    return json.loads((out / f"{cell}__seed{seed}" / "probe_pos" / "probe.json").read_text())


def test_a_probe_lens_probes_each_pretrained_model_and_is_judged_higher_is_better(tmp_path):
    out, report = finished_sweep(tmp_path, PROBE_LENS + PROBE_CLAIM)
    values = {}
    for name, cell in report["cells"].items():
        runs = [probe_json(out, name, seed)["pos"] for seed in (0, 1)]
        values[name] = [100 * max(r[name]["accuracy"]) for r in runs]   # the best layer, x100
        controls = [100 * max(r[f"{name} (untrained)"]["accuracy"]) for r in runs]
        mean = np.mean(values[name])
        low, high = scipy_stats.t.interval(0.95, 1, loc=mean, scale=scipy_stats.sem(values[name]))
        assert cell["summary"]["pos"] == pytest.approx({"mean": mean, "low": low, "high": high}, rel=1e-12)
        assert cell["lens_baselines"]["pos"] == pytest.approx(np.mean(controls))
        assert cell["at_chance"]["pos"] is bool(low <= np.mean(controls)) is False
    for folder in out.glob("*__seed*"):   # a probe lens alone: the pre-training does not evaluate
        assert not logged_lens(out, *folder.name.split("__seed"))
    comparison = report["claims"][0]["tasks"]["pos"]
    d = np.subtract(values["good_enc_dec"], values["lm"])
    low, high = scipy_stats.t.interval(0.95, 1, loc=d.mean(), scale=scipy_stats.sem(d))
    assert (comparison["low"], comparison["high"]) == pytest.approx((low, high), rel=1e-12)
    assert low > 0 and comparison["verdict"].startswith("reproduced")   # higher is better
    md = (out / "report.md").read_text()
    assert "pos (pos probe, best layer)" in md and "untrained control" in md
    assert f"{np.mean(values['good_enc_dec']):.1f} [" in md


def test_runs_made_before_a_probe_lens_are_probed_without_training_again(tmp_path):
    gin_file = write_sweep(tmp_path)
    out = tmp_path / "out"
    assert sweep(gin_file, out).returncode == 0
    trained = {path: path.stat().st_mtime_ns for path in out.glob("*/*/metrics.jsonl")}
    gin_file.write_text(gin_file.read_text() + PROBE_LENS)
    result = sweep(gin_file, out)
    assert result.returncode == 0, result.stderr
    assert "4 cell runs, 0 already done, 4 trained but not yet measured by every lens" in result.stdout
    assert {path: path.stat().st_mtime_ns for path in out.glob("*/*/metrics.jsonl")} == trained
    report = json.loads((out / "report.json").read_text())
    assert all(len(cell["seeds"]) == 2 and not math.isnan(cell["summary"]["pos"]["mean"])
               for cell in report["cells"].values())


def test_a_failing_probe_fails_its_cell_and_a_rerun_finishes_it(tmp_path):
    gin_file = write_sweep(tmp_path)
    gin_file.write_text(gin_file.read_text() + PROBE_LENS)
    out = tmp_path / "out"
    result = sweep(gin_file, out, env={"FAKE_PROBE_FAIL": "1"})
    errors = [json.loads(p.read_text()) for p in out.glob("*/error.json")]
    assert len(errors) == 4 and {e["stage"] for e in errors} == {"probe_pos"}
    assert "no UD file" in errors[0]["tail"][-1] and not list(out.glob("*/done.json"))
    assert sweep(gin_file, out).returncode == 0
    assert len(list(out.glob("*/done.json"))) == 4 and not list(out.glob("*/error.json"))


def test_a_probe_lens_without_its_ud_files_stops_before_any_run(tmp_path):
    gin_file = write_sweep(tmp_path)
    gin_file.write_text(gin_file.read_text() + f"\nsweep.lenses = {{'pos': 'pos_probe'}}\nsweep.probe_data_dir = '{tmp_path}'\n")
    result = sweep(gin_file, tmp_path / "out")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert f"sweep.probe_data_dir {tmp_path} holds no en_ewt/en_ewt-ud-train.conllu" in result.stderr
    assert not list((tmp_path / "out").glob("*__seed*"))   # no run started


def test_a_probe_lens_needs_the_ud_folder(tmp_path, clean_gin_state):
    from t5lite.experiments import spec
    gin_file = write_sweep(tmp_path)
    gin_file.write_text(gin_file.read_text() + "\nsweep.lenses = {'pos': 'pos_probe'}\n")
    with pytest.raises(ConfigError, match=r"lens 'pos' probes the pre-trained model on UD English-EWT: set "
                                          r"sweep.probe_data_dir"):
        spec.load([str(gin_file)], [], [str(REPO)])


@pytest.mark.slow
def test_a_real_pos_probe_lens_of_a_bert_pretraining(tmp_path):
    """One cell, one seed of real bert_tiny MLM pre-training at the ci scale with the POS probe lens on
    the shared UD English-EWT (about a minute): the lens is `t5lite probe`'s best layer x100, and its
    baseline the untrained control's."""
    gin_file = tmp_path / "one.gin"
    gin_file.write_text(f"include '{REPO / 'configs' / 'sweeps' / 'peft_vs_full.gin'}'\n"
                        "sweep.scales = {'ci': {'seeds': 1, 'pretrain_tokens': 20480, 'batch_size': 32, 'finetune_steps': 2,"
                        " 'finetune_batch_size': 4, 'eval_max_examples': 8, 'tasks': ['sst2']}}\n"
                        f"sweep.lenses = {{'pos': 'pos_probe'}}\nsweep.probe_data_dir = '{shared_data_dir() / 'ud'}'\n")
    out = tmp_path / "out"
    result = sweep(gin_file, out, f"--gin.DATA_DIR='{shared_data_dir() / 'glue'}'", "--cells=full")
    assert result.returncode == 0, result.stderr
    probe = probe_json(out, "full", 0)["pos"]
    cell = json.loads((out / "report.json").read_text())["cells"]["full"]
    assert cell["seeds"]["0"]["scores"]["pos"] == pytest.approx(100 * max(probe["full"]["accuracy"]))
    assert cell["lens_baselines"]["pos"] == pytest.approx(100 * max(probe["full (untrained)"]["accuracy"]))
    assert all(20 < value < 100 for value in (cell["lens_baselines"]["pos"], cell["seeds"]["0"]["scores"]["pos"]))


@pytest.mark.parametrize("metric, summary, baseline, at_chance", [
    ("pos_probe", {"low": 59.0, "high": 70.0}, 60.0, True),    # an accuracy whose interval reaches the control
    ("pos_probe", {"low": 61.0, "high": 70.0}, 60.0, False),
    ("mlm_loss", {"low": 4.0, "high": 5.1}, 5.0, True),        # a loss whose interval reaches the unigram loss
    ("mlm_loss", {"low": 4.0, "high": 4.9}, 5.0, False),
    ("mlm_loss", {"low": 4.0, "high": 4.9}, None, False),      # no baseline, no mark
])
def test_a_lens_is_at_chance_when_its_interval_reaches_its_baseline_from_the_wrong_side(metric, summary, baseline, at_chance):
    from t5lite.experiments.report import _lens_at_chance
    assert _lens_at_chance(summary, baseline, metric) is at_chance
