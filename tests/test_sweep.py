"""`t5lite sweep`: the harness runs a grid of cells over seeds, resumes after kill -9, reports a
failing cell and gives t-intervals and paired p-values equal to scipy's. The fast tests run each
cell's `train` through tests/sweep_fake_cli.py; the slow one trains tiny models for real."""
import json
import math
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, shared_data_dir, write_glove

from t5lite.errors import ConfigError

stats = pytest.importorskip("scipy.stats", reason="the sweep's intervals use scipy (the `metrics` extra)")

FAKE = [sys.executable, str(REPO / "tests" / "sweep_fake_cli.py")]

SWEEP = """
include 'configs/sweeps/scales.gin'
sweep.name = 'toy'
sweep.command = {command}
sweep.cells = {{
    'good_enc_dec': {{'pretrain': ['configs/local/t5_tiny_pretrain.gin'], 'tokens_per_row': 160,
                     'finetune': ['configs/local/t5_tiny_finetune_sst2.gin']{extra}}},
    'lm': {{'pretrain': ['configs/local/t5_prefix_lm_tiny_pretrain.gin'], 'tokens_per_row': 256,
           'finetune': ['configs/local/t5_tiny_finetune_sst2.gin']}},
}}
sweep.tasks = {{'sst2': 'accuracy', 'rte': 'accuracy'}}
sweep.claims = [('enc-dec > LM on GLUE average', 'good_enc_dec', 'lm', 'glue_average')]
"""


def write_sweep(tmp_path, extra="", command=FAKE):
    path = tmp_path / "toy.gin"
    path.write_text(SWEEP.format(command=json.dumps(command), extra=extra))
    return path


def sweep(gin_file, out, *flags, **kwargs):
    env = {**os.environ, "PYTHONPATH": str(REPO), **kwargs.pop("env", {})}
    argv = [sys.executable, "-m", "t5lite.cli", "sweep", f"--gin_file={gin_file}", "--gin.SWEEP_SCALE='ci'",
            f"--out={out}", *flags]
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, **kwargs)


def without_wall_time(report):
    for cell in report["cells"].values():
        for cost in (cell["cost_per_seed"], *(result["cost"] for result in cell["seeds"].values())):
            cost.pop("wall_hours", None)
            cost.pop("cost_seconds", None)
    return report


def logged(out, cell, seed, task):
    rows = [json.loads(line) for line in (out / f"{cell}__seed{seed}" / f"finetune_{task}" / "metrics.jsonl").open()]
    return [r["eval_accuracy"] for r in rows if "eval_accuracy" in r][-1]


def test_a_2x2_sweep_reports_scipy_intervals_and_paired_p_values(tmp_path):
    out = tmp_path / "out"
    result = sweep(write_sweep(tmp_path), out)
    assert result.returncode == 0, result.stderr
    report = json.loads((out / "report.json").read_text())
    assert set(report["cells"]) == {"good_enc_dec", "lm"} and report["seeds"] == [0, 1]
    for name, cell in report["cells"].items():
        assert len(cell["seeds"]) == 2 and not cell["errors"]
        # ci: 2560 tokens / (batch 4 x tokens per row): the step count the harness set and recorded
        steps = 2560 // (4 * (160 if name == "good_enc_dec" else 256))
        assert cell["cost_per_seed"]["pretrain_steps"] == steps
        assert cell["cost_per_seed"]["flops"] == 1e6 * steps   # as the run's log states them
        assert cell["cost_per_seed"]["params"] == 1000 + len(name)
        assert cell["cost_per_seed"]["cost_flops"] == 2e6 * steps   # the run's cost.json, where written
        assert cell["cost_per_seed"]["cost_device_hours"] == 0.5
        for task in ("sst2", "rte"):
            values = [logged(out, name, s, task) for s in (0, 1)]
            low, high = stats.t.interval(0.95, len(values) - 1, loc=np.mean(values), scale=stats.sem(values))
            summary = cell["summary"][task]
            np.testing.assert_allclose([summary["mean"], summary["low"], summary["high"]],
                                       [np.mean(values), low, high], rtol=1e-9)
    claim, = report["claims"]   # judged on each task, not on their average
    for task in ("sst2", "rte"):
        good, lm = ([logged(out, n, s, task) for s in (0, 1)] for n in ("good_enc_dec", "lm"))
        np.testing.assert_allclose(claim["tasks"][task]["p_value"], stats.ttest_rel(good, lm).pvalue, rtol=1e-9)
    assert claim["verdict"].startswith(("reproduced", "contradicted", "mixed", "undecided"))
    markdown = (out / "report.md").read_text()
    assert "| good_enc_dec |" in markdown and claim["verdict"] in markdown
    assert "No constant baselines: no sweep.data_dir to read the dev labels from" in markdown
    assert (out / "pretrain_curves.png").stat().st_size > 0 and (out / "table.png").stat().st_size > 0
    again = sweep(write_sweep(tmp_path), out)   # finished cells are skipped, the report is the same
    assert "4 already done" in again.stdout
    assert without_wall_time(json.loads((out / "report.json").read_text())) == without_wall_time(report)
    (out / "lm__seed1" / "pretrain.log").write_text("")   # a log without the start-up lines: the other seed's count
    sweep(write_sweep(tmp_path), out)
    assert json.loads((out / "report.json").read_text())["cells"]["lm"]["cost_per_seed"]["params"] == 1000 + len("lm")
    before = json.loads((out / "report.json").read_text())
    done = out / "lm__seed0" / "done.json"   # cut short (a copy or a full disk): that seed runs again
    done.write_text(done.read_text()[:20])
    again = sweep(write_sweep(tmp_path), out)
    assert again.returncode == 0 and "3 already done" in again.stdout, again.stdout + again.stderr
    assert without_wall_time(json.loads((out / "report.json").read_text())) == without_wall_time(before)


def test_a_stage_a_signal_stopped_leaves_its_cell_unfinished_and_a_rerun_finishes_it(tmp_path):
    """`t5lite train` stopped by SIGTERM exits 0 with a checkpoint: the cell must not go on to
    fine-tune from that early step nor be marked done; the rerun resumes it."""
    gin_file = write_sweep(tmp_path)
    whole = tmp_path / "whole"
    assert sweep(gin_file, whole).returncode == 0
    out = tmp_path / "stopped"
    first = sweep(gin_file, out, env={"FAKE_STOP_AT": "1"})
    assert first.stdout.count(": stopped in pretrain at step 1 of") == 4, first.stdout
    assert not list(out.glob("*/done.json")) and not list(out.glob("*/finetune_*"))
    assert sweep(gin_file, out).returncode == 0
    report = json.loads((out / "report.json").read_text())
    for cell in ("good_enc_dec", "lm"):   # the pre-training's wall time counts both of its calls
        done = json.loads((out / f"{cell}__seed0" / "done.json").read_text())
        finetuning = sum(s for stage, s in done["wall_seconds"].items() if stage != "pretrain")
        assert report["cells"][cell]["seeds"]["0"]["cost"]["wall_hours"] * 3600 == pytest.approx(200.0 + finetuning)
    assert without_wall_time(report) == without_wall_time(json.loads((whole / "report.json").read_text()))


def test_kill_9_mid_sweep_then_rerun_gives_the_same_report(tmp_path):
    gin_file = write_sweep(tmp_path)
    whole = tmp_path / "whole"
    assert sweep(gin_file, whole).returncode == 0
    out = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(REPO), "FAKE_SLEEP": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "t5lite.cli", "sweep", f"--gin_file={gin_file}",
                             "--gin.SWEEP_SCALE='ci'", f"--out={out}", "--parallel=1"], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 120
    while not list(out.glob("*/done.json")) and time.time() < deadline:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)   # the sweep and its running cell, at once
    proc.wait()
    assert len(list(out.glob("*/done.json"))) < 4 and not (out / "report.json").exists()
    assert sweep(gin_file, out).returncode == 0
    assert (without_wall_time(json.loads((out / "report.json").read_text()))
            == without_wall_time(json.loads((whole / "report.json").read_text())))


def _start_and_wait_for_a_train(gin_file, out):
    """A sweep (its own process, one cell at a time, each train 60 s long) and the pid of the fake
    `t5lite train` it started, read from the run lock that train holds. The sweep's lines so far
    must have reached its stdout pipe (a student watching `| tee` sees them as they happen), with
    Python's block-buffered stdout."""
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}, "PYTHONPATH": str(REPO),
           "FAKE_SLEEP": "60"}
    proc = subprocess.Popen([sys.executable, "-m", "t5lite.cli", "sweep", f"--gin_file={gin_file}",
                             "--gin.SWEEP_SCALE='ci'", f"--out={out}", "--parallel=1"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (locks := list(out.glob("*/pretrain/RUN_LOCK"))) or not locks[0].read_text():
        assert time.time() < deadline and proc.poll() is None, "the sweep started no train"
        time.sleep(0.2)
    assert select.select([proc.stdout], [], [], 10)[0], "the sweep's lines are held in a buffer"
    assert proc.stdout.readline().startswith("sweep toy (ci): 4 cell runs, 0 already done")
    assert proc.stdout.readline() == "[1/4] good_enc_dec seed 0: pretrain, 4 steps\n"
    return proc, int(locks[0].read_text())


def _running(pid: int) -> bool:
    """Whether `pid` is a live process; a zombie (ended, not yet reaped by init) is not."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.time() + seconds
    while _running(pid) and time.time() < deadline:
        time.sleep(0.1)
    return not _running(pid)


def _assert_a_rerun_finishes_every_cell(gin_file, out):
    rerun = sweep(gin_file, out)
    assert rerun.returncode == 0 and "FAILED" not in rerun.stdout, rerun.stdout + rerun.stderr
    report = json.loads((out / "report.json").read_text())
    assert all(len(cell["seeds"]) == 2 and not cell["errors"] for cell in report["cells"].values())


def test_kill_9_of_the_sweep_alone_takes_its_running_train_with_it(tmp_path):
    """No orphan goes on training and holding its run's lock, so the rerun finishes that cell."""
    gin_file, out = write_sweep(tmp_path), tmp_path / "out"
    proc, train = _start_and_wait_for_a_train(gin_file, out)
    try:
        proc.kill()   # the sweep's pid only: its train is in a process group of its own
        proc.communicate()
        assert _gone_within(train, 5), "the train outlived its sweep"
        _assert_a_rerun_finishes_every_cell(gin_file, out)
    finally:
        if _running(train):
            os.kill(train, signal.SIGKILL)


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGINT", "SIGHUP"])
def test_a_signal_to_the_sweep_stops_its_trains_and_starts_no_more(tmp_path, signal_name):
    gin_file, out = write_sweep(tmp_path), tmp_path / "out"
    proc, train = _start_and_wait_for_a_train(gin_file, out)
    try:
        proc.send_signal(getattr(signal, signal_name))
        stdout, stderr = proc.communicate(timeout=30)
        assert proc.returncode == 128 + getattr(signal, signal_name), stdout + stderr
        assert stdout.count(f"stopped in pretrain by {signal_name}") == 1, stdout
        assert stdout.count(f"not started ({signal_name})") == 3, stdout
        assert f"sweep stopped by {signal_name}; run the same command again to resume" in stdout
        assert not _running(train) and len(list(out.glob("*/pretrain.log"))) == 1   # no other cell started
        assert not list(out.glob("*/error.json")) and not (out / "report.json").exists()
        _assert_a_rerun_finishes_every_cell(gin_file, out)
    finally:
        if _running(train):
            os.kill(train, signal.SIGKILL)


def test_a_second_sweep_on_the_same_out_is_refused_and_the_first_finishes(tmp_path):
    gin_file = write_sweep(tmp_path)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO), "FAKE_SLEEP": "1"}
    first = subprocess.Popen([sys.executable, "-m", "t5lite.cli", "sweep", f"--gin_file={gin_file}",
                              "--gin.SWEEP_SCALE='ci'", f"--out={out}"], cwd=REPO, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not list(out.glob("*/pretrain.log")) and time.time() < deadline:
        time.sleep(0.2)
    second = sweep(gin_file, out)
    assert second.returncode == 2
    message, = second.stderr.strip().splitlines()
    assert f"{out} is in use by another t5lite run" in message and "use another --out" in message
    stdout, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr
    report = json.loads((out / "report.json").read_text())
    assert all(len(cell["seeds"]) == 2 and not cell["errors"] for cell in report["cells"].values())
    assert sweep(gin_file, out).returncode == 0   # the lock went with the first sweep


def test_an_out_that_is_a_file_is_a_one_line_error(tmp_path):
    out = tmp_path / "taken"
    out.write_text("not a folder")
    result = sweep(write_sweep(tmp_path), out)
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        f"t5lite: error: --out {out}: File exists; choose a folder that can be written"]
    assert out.read_text() == "not a folder"


def test_a_failing_cell_is_reported_and_the_rest_finish(tmp_path):
    out = tmp_path / "out"
    result = sweep(write_sweep(tmp_path, extra=", 'bindings': ['modle_config.d_model = 3']"), out)
    assert result.returncode == 0, result.stderr
    report = json.loads((out / "report.json").read_text())
    assert len(report["cells"]["lm"]["seeds"]) == 2
    errors = report["cells"]["good_enc_dec"]["errors"]
    assert [e["seed"] for e in errors] == [0, 1] and errors[0]["stage"] == "pretrain"
    markdown = (out / "report.md").read_text()
    assert "## Failed cells" in markdown and "modle_config" in markdown
    assert report["claims"][0]["verdict"] == "undecided: needs 2 seeds or more"
    claim_rows = [line for line in markdown.splitlines() if line.startswith(f"| {report['claims'][0]['claim']} | sst2")]
    assert claim_rows and claim_rows[0].endswith("| – – | – | – | 0 | – | undecided: needs 2 seeds or more |"), claim_rows


def test_the_sweep_tells_each_stages_steps_while_it_trains_and_the_time_left(tmp_path, monkeypatch):
    from t5lite.experiments import runner, spec
    monkeypatch.setattr(runner, "POLL_SECONDS", 0.05)
    monkeypatch.setattr(runner, "PROGRESS_SECONDS", 0.0)
    monkeypatch.setenv("FAKE_STEP_SECONDS", "0.2")
    sweep_ = spec.only_cells(spec.load([str(write_sweep(tmp_path))], [], [str(REPO)]), ["lm"])
    lines = []
    runner.run_sweep(sweep_, tmp_path / "out", parallel=1, log=lines.append)
    for seed, number in ((0, 1), (1, 2)):
        said = [line.removeprefix(f"[{number}/2] lm seed {seed}: ") for line in lines if f"lm seed {seed}:" in line]
        for stage, wanted in (("pretrain", 2), ("finetune_sst2", 4), ("finetune_rte", 4)):
            start = said.index(f"{stage}, {wanted} steps")
            steps = [int(text.split()[2]) for text in said[start + 1:] if text.startswith(f"{stage} step ")]
            assert steps and steps == sorted(steps) and steps[-1] <= wanted and f" of {wanted} (" in said[start + 1], said
    first_done = next(line for line in lines if line.startswith("[1/2] lm seed 0: done after "))
    took = first_done.split("done after ")[1].split(";")[0]
    assert first_done.endswith(f"; 1 to go, about {took} left"), first_done   # one worker: the rest at its pace
    assert re.fullmatch(r"\[2/2\] lm seed 1: done after \d+ s", lines[-1]), lines[-1]


def test_cells_runs_those_rows_and_their_claims_and_a_full_run_reuses_them(tmp_path):
    gin_file, out = write_sweep(tmp_path), tmp_path / "out"
    only = sweep(gin_file, out, "--cells=lm")
    assert only.returncode == 0 and "sweep toy (ci): 2 cell runs, 0 already done" in only.stdout, only.stderr
    report = json.loads((out / "report.json").read_text())
    assert list(report["cells"]) == ["lm"] and report["claims"] == []
    full = sweep(gin_file, out)
    assert full.returncode == 0 and "4 cell runs, 2 already done" in full.stdout, full.stderr
    assert len(json.loads((out / "report.json").read_text())["claims"]) == 1


@pytest.mark.parametrize("flag, message", [
    ("--gin.sweep.cellz={}", "sweep gin error"),
    ("--cells=lm,gpt", "--cells lm,gpt: sweep 'toy' has no cell named 'gpt'; give some of good_enc_dec, lm, "
                       "separated by commas"),
    ("--cells=,", "argument --cells: give one or more cell names separated by commas, not ','"),
    ("--gin.SWEEP_SCALE='gpu'", "is not one of ['ci', 'cpu', 'tpu']"),
    ("--parallel=0", "argument --parallel: give a whole number >= 1, not 0"),
])
def test_bad_sweep_gin_is_a_one_line_error(tmp_path, flag, message):
    result = sweep(write_sweep(tmp_path), tmp_path / "out", flag)
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "out").exists()


def test_a_pilot_without_a_claim_to_size_is_a_one_line_error(tmp_path):
    result = sweep(write_sweep(tmp_path), tmp_path / "out", "--cells=lm", "--pilot")
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        "t5lite: error: --pilot: sweep 'toy' has no claim between the cells it runs; a pilot measures what the "
        "claims need: give --cells two rows a claim compares, or leave --cells out"]
    assert not (tmp_path / "out").exists()


def test_a_sweep_without_gin_file_names_the_flag_and_the_shipped_sweeps(tmp_path):
    result = subprocess.run([sys.executable, "-m", "t5lite.cli", "sweep", f"--out={tmp_path / 'out'}"],
                            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "no --gin_file given" in result.stderr and "peft_vs_full" in result.stderr
    assert "scales" not in result.stderr and not (tmp_path / "out").exists()


@pytest.mark.parametrize("gin_file, message", [
    ("configs/sweeps/scales.gin", "binds no sweep.name, sweep.cells, sweep.tasks"),
    ("configs/sweeps/peft_vs_full.gin", "uses gin macro(s) DATA_DIR that nothing sets: pass --gin.DATA_DIR=..."),
])
def test_a_sweep_file_missing_settings_names_them_and_how_to_give_them(tmp_path, gin_file, message):
    result = sweep(gin_file, tmp_path / "out")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert f"--gin_file {gin_file} {message}" in result.stderr and not (tmp_path / "out").exists()


@pytest.mark.parametrize("old, new, message", [
    ("'lm': {{", "'../lm': {{", "cell '../lm': a name becomes a folder name"),
    ("'rte': 'accuracy'", "'rte/../../x': 'accuracy'", "task 'rte/../../x': a name becomes a folder name"),
    ("'tokens_per_row': 256", "'tokens_per_row': 0", "cell 'lm' 'tokens_per_row' is 0; give a whole number >= 1"),
    ("sweep.name = 'toy'", "sweep.name = 'toy'\nsweep.scales = {{'ci': {{'seeds': 0}}}}", "'seeds' is 0"),
    ("sweep.name = 'toy'", "sweep.name = 'toy'\nsweep.scales = {{'ci': {{'batch_size': -4}}}}", "'batch_size' is -4"),
])
def test_names_that_escape_the_folder_and_sizes_below_one_are_one_line_errors(tmp_path, old, new, message):
    gin_file = tmp_path / "toy.gin"
    text = SWEEP.replace(old, new).format(command=json.dumps(FAKE), extra="")
    assert text != SWEEP.format(command=json.dumps(FAKE), extra="")
    gin_file.write_text(text)
    result = sweep(gin_file, tmp_path / "out")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert message in result.stderr and not (tmp_path / "out").exists()


@pytest.mark.parametrize("claim, message", [
    ("'good_enc_dec', 'gpt', 'glue_average'", "no cell named 'gpt'"),
    ("'good_enc_dec', 'lm', 'mnli'", "column 'mnli' is neither a task"),
    ("'good_enc_dec', 'lm', 'glue_average', {'effect': -2.0}",
     "'effect' is -2.0; give the paper's effect in the metric's points, a number > 0"),
    ("'good_enc_dec', 'lm', 'glue_average', {'efect': 2.0}", "unknown key(s) ['efect']; allowed: ['effect', 'margin']"),
    ("'good_enc_dec', 'lm', 'glue_average', 2.0", "give (text, better row, worse row, column, {'effect': points})"),
])
def test_a_claim_naming_no_cell_or_column_is_a_one_line_error(tmp_path, claim, message):
    gin_file = write_sweep(tmp_path)
    gin_file.write_text(gin_file.read_text().replace("'good_enc_dec', 'lm', 'glue_average'", claim))
    result = sweep(gin_file, tmp_path / "out")
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("name", ["t5_table2", "t5_objectives", "bert_tasks", "bert_sizes", "roberta_masking",
                                  "encoder_objectives", "peft_vs_full", "pretraining_corpus", "ulmfit_labels",
                                  "feature_based", "peft_minilm", "forgetting"])
@pytest.mark.parametrize("scale", ["ci", "cpu", "tpu"])
def test_shipped_sweeps_parse_at_every_scale(name, scale, clean_gin_state, tmp_path):
    import contextlib
    from t5lite.experiments import spec
    (tmp_path / "data").mkdir()   # the layout the sweeps' relative paths name (the word LMs read their vocabulary)
    (tmp_path / "data" / "text").symlink_to(shared_data_dir() / "text")
    if name == "feature_based":   # its glove cell's vectors, where the sweep file says to write them
        write_glove(tmp_path / "data" / "glove.6B.50d.100k.txt", 200)
    sweep_ = spec.load([str(REPO / "configs" / "sweeps" / f"{name}.gin")],
                       ["DATA_DIR = 'data/glue'", "UD_DIR = 'data/ud'", f"SWEEP_SCALE = '{scale}'"], [str(REPO)])
    assert len(sweep_.cells) >= 2 and sweep_.claims and sweep_.data_dir == "data/glue"
    import gin
    from t5lite import cli
    from t5lite.data.registry import TaskRegistry
    from t5lite.train.trainer import train
    from t5lite.experiments.runner import stages
    from t5lite.train.trainer import model_config
    for cell in sweep_.cells:   # every run the cell starts parses as `t5lite train` parses it, and builds its model
        for stage, files, bindings in stages(sweep_, cell, 0, Path("/tmp/cell")):
            gin.clear_config()
            cli.parse_gin(list(files), [*bindings, "MODEL_DIR = '/tmp/run'"], entry=("train", train))
            if "train.objective" in gin.config_str():   # else text to text, the trainer's default
                with contextlib.chdir(tmp_path):
                    gin.query_parameter("train.objective").scoped_configurable_fn().build_model(model_config())
            task = TaskRegistry.get(gin.query_parameter("%MIXTURE_OR_TASK_NAME"))
            if stage.startswith("finetune") and task.name.startswith("gpt_glue_"):
                # GPT-1's similarity tasks read both orders, and their converter must say so
                both = task.name.removeprefix("gpt_glue_") in ("mrpc", "qqp", "stsb")
                assert (gin.query_parameter("train.feature_converter") == "decoder_classification_both_orders") == both


# Each shipped claim's effect, recomputed from the paper's own table (transcribed here, not from the
# gin): (sweep, better row, worse row) -> the difference in GLUE points.
_MEAN = lambda better, worse: sum(b - w for b, w in zip(better, worse)) / len(better)
_BERT_T5 = {"base": [84.4, 88.4, 86.7, 92.7], "no_nsp": [83.9, 84.9, 86.5, 92.6],   # Devlin et al. 2019,
            "ltr": [82.1, 84.3, 77.5, 92.1], "bilstm": [82.1, 84.1, 75.7, 91.6]}    # Table 5: MNLI-m QNLI MRPC SST-2
_BERT_T6 = {"L3_H768_A12": [77.9, 79.8, 88.4], "L12_H768_A12": [84.4, 86.7, 92.9],  # Devlin et al. 2019,
            "L12_H1024_A16": [85.7, 86.9, 93.3], "L24_H1024_A16": [86.6, 87.8, 93.7]}  # Table 6: MNLI-m MRPC SST-2
PAPER_EFFECTS = {
    # Raffel et al. 2020, Table 2, GLUE column
    ("t5_table2", "enc_dec_denoising", "enc_dec_lm"): 83.28 - 79.56,
    ("t5_table2", "enc_dec_denoising", "lm_denoising"): 83.28 - 74.70,
    ("t5_table2", "enc_dec_denoising", "prefix_lm_denoising"): 83.28 - 81.82,
    ("t5_table2", "prefix_lm_denoising", "lm_denoising"): 81.82 - 74.70,
    ("t5_table2", "enc_dec_denoising", "enc_dec_half_denoising"): 83.28 - 80.88,
    ("t5_table2", "enc_dec_denoising", "enc_dec_shared_denoising"): 83.28 - 82.81,
    ("t5_table2", "enc_dec_shared_denoising", "enc_dec_half_denoising"): 82.81 - 80.88,
    # Raffel et al. 2020, Table 7 (mean span length 3) against Table 5 (BERT-style); Table 6 (15% vs 50%)
    ("t5_objectives", "span_corruption_mean3", "bert_style"): 83.49 - 82.96,
    ("t5_objectives", "iid_replace_spans_15", "iid_replace_spans_50"): 83.28 - 81.27,
    ("bert_tasks", "mlm_nsp", "mlm"): _MEAN(_BERT_T5["base"], _BERT_T5["no_nsp"]),
    ("bert_tasks", "mlm", "ltr"): _MEAN(_BERT_T5["no_nsp"], _BERT_T5["ltr"]),
    ("bert_tasks", "mlm", "ltr_bilstm"): _MEAN(_BERT_T5["no_nsp"], _BERT_T5["bilstm"]),
    ("bert_sizes", "L12_H768_A12", "L3_H768_A12"): _MEAN(_BERT_T6["L12_H768_A12"], _BERT_T6["L3_H768_A12"]),
    ("bert_sizes", "L12_H1024_A16", "L12_H768_A12"): _MEAN(_BERT_T6["L12_H1024_A16"], _BERT_T6["L12_H768_A12"]),
    ("bert_sizes", "L24_H1024_A16", "L12_H768_A12"): _MEAN(_BERT_T6["L24_H1024_A16"], _BERT_T6["L12_H768_A12"]),
    ("encoder_objectives", "spanbert", "mlm"): 82.8 - 81.7,   # Joshi et al. 2020, Table 5: SpanBERT, Our BERT-1seq
    ("encoder_objectives", "electra", "mlm"): 79.9 - 75.1,    # Clark et al. 2020, Table 1: ELECTRA-, BERT-Small
    ("feature_based", "bert", "elmo"): 93.5 - 90.4,   # Devlin et al. 2019, Table 1, SST-2: BERT-base, BiLSTM+ELMo+Attn
    # Devlin et al. 2019, Table 6, "LM (ppl)" (masked LM perplexity on held-out training data), as log ratios (nats)
    ("bert_sizes", "L12_H768_A12", "L3_H768_A12", "heldout_mlm"): math.log(5.84 / 3.99),
    ("bert_sizes", "L12_H1024_A16", "L12_H768_A12", "heldout_mlm"): math.log(3.99 / 3.54),
    ("bert_sizes", "L24_H1024_A16", "L12_H768_A12", "heldout_mlm"): math.log(3.99 / 3.23),
}


# Claims whose paper gives no difference of two rows to size the seeds by (the report sizes them by
# the difference it observes): ELMo's paper has no GloVe-only SST-2 or POS row, no paper probes
# BERT-tiny against ELMo-tiny, and the forgetting papers measure other models' forgetting on other
# scales (Biderman et al.: the drop on HellaSwag, ARC-Challenge and WinoGrande) than this model's MLM nats.
NO_PAPER_EFFECT = {("feature_based", "elmo", "glove", "sst2"), ("feature_based", "elmo", "glove", "pos"),
                   ("feature_based", "bert", "elmo", "pos"),
                   *(("forgetting", row, "full", "forgetting") for row in ("lora", "adapters", "ulmfit", "full_low")),
                   ("forgetting", "full", "lora", "sst2")}


@pytest.mark.parametrize("name", ["t5_table2", "t5_objectives", "bert_tasks", "bert_sizes", "roberta_masking",
                                  "encoder_objectives", "peft_vs_full", "feature_based", "peft_minilm", "forgetting"])
def test_shipped_effects_are_the_papers_table_differences_to_a_tenth(name, clean_gin_state):
    from t5lite.experiments import spec
    sweep_ = spec.load([str(REPO / "configs" / "sweeps" / f"{name}.gin")], ["DATA_DIR = 'data/glue'", "UD_DIR = 'data/ud'"],
                       [str(REPO)])
    for claim in sweep_.claims:
        if claim.margin is not None:   # an equivalence margin is the sweep's choice, not a paper's number
            assert claim.effect is None, claim
            continue
        if (name, claim.better, claim.worse, claim.column) in NO_PAPER_EFFECT:
            assert claim.effect is None, claim
            continue
        if claim.column in sweep_.lenses:   # a loss in nats, to a hundredth
            paper, tolerance = PAPER_EFFECTS[(name, claim.better, claim.worse, claim.column)], 0.005
        else:
            paper, tolerance = PAPER_EFFECTS[(name, claim.better, claim.worse)], 0.05
        assert claim.effect is not None and abs(claim.effect - paper) <= tolerance + 1e-9, (claim, paper)


def test_task_bindings_reach_that_tasks_run_only_and_name_known_tasks(tmp_path, clean_gin_state):
    from t5lite.experiments import spec
    from t5lite.experiments.runner import stages
    gin_file = write_sweep(tmp_path, extra=", 'task_bindings': {'rte': ['X = 1']}")
    text = gin_file.read_text()
    sweep_ = spec.load([str(gin_file)], [], [str(REPO)])
    cell = next(c for c in sweep_.cells if c.name == "good_enc_dec")
    runs = {stage: bindings for stage, _, bindings in stages(sweep_, cell, 0, tmp_path)}
    assert "X = 1" in runs["finetune_rte"] and all("X = 1" not in b for s, b in runs.items() if s != "finetune_rte")
    gin_file.write_text(text.replace("{'rte': ['X = 1']}", "{'mrcp': ['X = 1']}"))
    with pytest.raises(ConfigError, match=r"task_bindings names \['mrcp'\]"):
        spec.load([str(gin_file)], [], [str(REPO)])


@pytest.mark.slow
def test_a_real_ci_sweep_trains_and_reports(tmp_path):
    """2 cells x 2 seeds of real tiny pre-training and SST-2 / RTE fine-tuning (3 to 15 minutes, with the load)."""
    gin_file = write_sweep(tmp_path, command=[])
    gin_file.write_text(gin_file.read_text() + f"\nsweep.data_dir = '{shared_data_dir() / 'glue'}'\n")
    result = sweep(gin_file, tmp_path / "out")
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    for cell in report["cells"].values():
        assert len(cell["seeds"]) == 2, cell["errors"]
        for task in ("sst2", "rte"):
            assert 0 <= cell["summary"][task]["mean"] <= 100


def test_sweep_json_writes_an_undefined_number_as_null(tmp_path):
    """report.json's interval of one seed or a seed without an eval is NaN in Python; the file holds
    null, so any JSON reader can read it."""
    from t5lite.experiments.runner import write_json_atomic

    def refuse(constant):
        raise AssertionError(f"{constant} in a JSON file")
    write_json_atomic(tmp_path / "report.json", {"mean": float("nan"), "interval": [np.float32("inf"), 1.5]})
    assert json.loads((tmp_path / "report.json").read_text(), parse_constant=refuse) == {"mean": None,
                                                                                         "interval": [None, 1.5]}


def write_dev_sets(folder):
    """SST-2 and RTE dev files of 20 rows each: SST-2's first 16 (what the ci scale scores) hold 11
    positives, RTE's 8 of each label."""
    (folder / "SST-2").mkdir(parents=True)
    (folder / "RTE").mkdir()
    sst2 = [int(i % 3 != 0) for i in range(1, 21)]
    (folder / "SST-2" / "dev.tsv").write_text("sentence\tlabel\n" + "".join(f"s {i}\t{y}\n" for i, y in enumerate(sst2)))
    rte = ["entailment" if i % 2 else "not_entailment" for i in range(20)]
    (folder / "RTE" / "dev.tsv").write_text("index\tsentence1\tsentence2\tlabel\n" +
                                            "".join(f"{i}\ta\tb\t{y}\n" for i, y in enumerate(rte)))
    return {"sst2": sst2[:16], "rte": rte[:16]}


def _seeds_for_80_percent_power(analysis, effect_size: float) -> int | None:
    """The fewest seeds (at least 2) whose paired t-test at alpha 0.05 has 80% power: statsmodels'
    power for each count, and where its noncentral t is nan (a large effect over little spread)
    20,000 simulated t-tests of that many seeds. Its `solve_power` is only a starting guess: its
    root finder gives nan, or a count below the answer, for large effects."""
    from scipy import stats as scipy_stats

    def power_at(n):
        p = analysis.power(effect_size, n, 0.05)
        if np.isnan(p):
            d = np.random.default_rng(n).normal(effect_size, 1.0, (20_000, n))
            t = d.mean(axis=1) / (d.std(axis=1, ddof=1) / np.sqrt(n))
            p = np.mean(np.abs(t) > scipy_stats.t.ppf(0.975, n - 1))
        return p
    solved = analysis.solve_power(effect_size=effect_size, alpha=0.05, power=0.8)
    n = max(2, int(np.ceil(solved)) if np.isfinite(solved) else 2)
    while n > 2 and power_at(n - 1) >= 0.8:
        n -= 1
    while power_at(n) < 0.8:
        if n >= 10_000:
            return None
        n += 1
    return n


def test_a_ci_pilot_prints_the_seeds_each_claim_needs_and_the_sweep_shows_it_first(tmp_path):
    """`--pilot` runs the claims' cells at the pilot's 3 seeds in OUT/pilot, with each task's
    majority baseline (sklearn's DummyClassifier on the dev labels scored) and statsmodels' seed
    counts; the sweep on the same --out prints the pilot's plan before it starts and reports it."""
    dummy = pytest.importorskip("sklearn.dummy", reason="the majority-baseline reference (the `test` extra)")
    power = pytest.importorskip("statsmodels.stats.power", reason="the seed counts' reference (the `test` extra)")
    labels = write_dev_sets(tmp_path / "glue")
    gin_file = write_sweep(tmp_path)
    gin_file.write_text(gin_file.read_text() + f"\nsweep.data_dir = '{tmp_path / 'glue'}'\n")
    out = tmp_path / "out"
    pilot = sweep(gin_file, out, "--pilot")
    assert pilot.returncode == 0, pilot.stderr
    assert pilot.stdout.startswith("sweep toy (ci pilot): 6 cell runs, 0 already done"), pilot.stdout
    made = json.loads((out / "pilot" / "report.json").read_text())
    for task, y in labels.items():
        majority = dummy.DummyClassifier(strategy="most_frequent").fit(np.zeros((16, 1)), y)
        assert made["baselines"][task] == pytest.approx(100 * majority.score(np.zeros((16, 1)), y))
    claim, = made["claims"]
    said = pilot.stdout.splitlines()
    start = said.index("toy (ci pilot, seeds [0, 1, 2]): the seeds each claim needs, per task")
    plan = said[start:start + 3]   # the heading, and the claim on each of the two tasks
    for task, r in claim["tasks"].items():
        good, lm = ([logged(out / "pilot", n, s, task) for s in (0, 1, 2)] for n in ("good_enc_dec", "lm"))
        d = np.subtract(good, lm)
        line, = [line for line in plan if line.startswith(f"  enc-dec > LM on GLUE average | {task}: ")]
        assert f"difference {d.mean():+.2f} (sd {np.std(d, ddof=1):.2f} over 3 seeds)" in line
        if r["verdict"].startswith("at chance"):
            assert line.endswith("needs more tokens or steps, not seeds")
        else:   # the observed difference (the toy claim gives no paper's effect)
            expected = _seeds_for_80_percent_power(power.TTestPower(), abs(d.mean()) / np.std(d, ddof=1))
            assert r["seeds_needed"] == expected
            assert expected is None or line.endswith(f"needs {expected} seeds")
    full = sweep(gin_file, out)
    assert full.returncode == 0, full.stderr
    lines = full.stdout.splitlines()
    assert lines[:6] == ["the pilot measured:", plan[0], *sorted(plan[1:]), "this sweep runs seeds [0, 1]",
                         "sweep toy (ci): 4 cell runs, 0 already done"], lines   # report.json's tasks: in name order
    assert "## The pilot" in (out / "report.md").read_text()


def test_more_seeds_run_only_the_new_ones_and_the_report_holds_them_all(tmp_path):
    gin_file, out = write_sweep(tmp_path), tmp_path / "out"
    assert sweep(gin_file, out).returncode == 0   # the ci scale's 2 seeds
    trained = {path: path.stat().st_mtime_ns for path in out.glob("*/*/metrics.jsonl")}
    result = sweep(gin_file, out, "--seeds", "3")
    assert result.returncode == 0, result.stderr
    assert "4 cell runs" not in result.stdout and "6 cell runs, 4 already done" in result.stdout
    assert all(path.stat().st_mtime_ns == mtime for path, mtime in trained.items())
    report = json.loads((out / "report.json").read_text())
    assert report["seeds"] == [0, 1, 2] and all(len(c["seeds"]) == 3 for c in report["cells"].values())
    rebuilt = sweep(gin_file, tmp_path / "rebuilt", "--rebuild", str(out / "report.json"))
    assert rebuilt.returncode == 2 and "pass the --gin.SWEEP_SCALE (or --seeds) it was made with" in rebuilt.stderr
    assert sweep(gin_file, tmp_path / "rebuilt", "--seeds", "3", "--rebuild", str(out / "report.json")).returncode == 0


@pytest.mark.parametrize("flags, message", [(["--seeds", "0"], "argument --seeds: give a whole number >= 1, not 0"),
                                            (["--pilot", "--seeds", "1"], "a pilot measures the spread between seeds")])
def test_bad_seed_counts_are_one_line(tmp_path, flags, message):
    result = sweep(write_sweep(tmp_path), tmp_path / "out", *flags)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
