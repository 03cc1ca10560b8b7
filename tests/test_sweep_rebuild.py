"""`t5lite sweep --rebuild REPORT.json` trains nothing: from a hand-written report.json's per-seed
scores it rebuilds the report with sklearn's constant baselines on GLUE's dev labels, scipy's
t-intervals and paired t-tests and statsmodels' paired TOST, replacing the verdicts the file
carried; a report.json cut short, missing a field or naming other cells is one line, exit 2."""
import json

import numpy as np
import pytest

from conftest import REPO
from test_sweep_verdicts import GLUE, SCORES, dummy, scipy_stats, tsv_labels, weightstats

from t5lite import cli

SEEDS = [0, 1, 2, 3]
CLAIMS = [("a > b", "a", "b", "glue_average", {"effect": 2.0}), ("b > a on sst2", "b", "a", "sst2"),
          ("a on par with c", "a", "c", "glue_average", {"margin": 2.0})]
GIN = """
include 'configs/sweeps/scales.gin'
sweep.name = 'toy'
sweep.data_dir = '{data}'
sweep.scales = {{'ci': {{'seeds': 4}}}}
sweep.cells = {cells}
sweep.tasks = {{'sst2': 'accuracy', 'rte': 'accuracy'}}
sweep.claims = {claims}
"""


def stored_report():
    """A report.json as an older t5lite wrote it: per-seed scores, a verdict now out of date."""
    cells = {name: {"seeds": {str(s): {"seed": s, "scores": {t: v[s] for t, v in scores.items()}, "cost": {"pretrain_steps": 4},
                                       "curve": [[1, 7.0 - s / 10], [2, 6.5]]} for s in SEEDS}, "errors": []}
             for name, scores in SCORES.items()}
    return {"sweep": "toy", "scale": "ci", "tasks": {"sst2": "accuracy", "rte": "accuracy"}, "seeds": SEEDS,
            "pretrain_tokens_budget": 4096, "batch_size": 8, "finetune_steps": 4, "cells": cells,
            "claims": [{"claim": "a > b", "verdict": "reproduced", "p_value": 0.01}]}


@pytest.fixture
def files(tmp_path, clean_gin_state):
    cells = {name: {"pretrain": ["configs/local/t5_tiny_pretrain.gin"], "finetune": ["configs/local/t5_tiny_finetune_sst2.gin"]}
             for name in SCORES}
    gin_file = tmp_path / "toy.gin"
    gin_file.write_text(GIN.format(data=GLUE, cells=cells, claims=CLAIMS))
    stored = tmp_path / "old_report.json"
    stored.write_text(json.dumps(stored_report()))
    return gin_file, stored


def rebuild(gin_file, stored, out, *flags):
    cli.main(["sweep", f"--gin_file={gin_file}", f"--rebuild={stored}", f"--out={out}", *flags])
    return json.loads((out / "report.json").read_text())


def interval_low(values):
    return scipy_stats.t.interval(0.95, len(values) - 1, loc=np.mean(values), scale=scipy_stats.sem(values))[0]


def expected_verdict(better, worse, task, options, baselines):
    """The verdict from the references alone: both rows at chance (scipy's interval reaches
    sklearn's baseline), else statsmodels' TOST and scipy's 90% interval for a margin, else scipy's
    95% interval of the paired differences."""
    x, y = (np.array(SCORES[row][task]) for row in (better, worse))
    if all(interval_low(v) <= baselines[task] for v in (x, y)):
        return "at chance: left out"
    d = x - y
    if "margin" in options:   # contradicted: the TOST's 90% interval wholly outside ±margin
        margin = options["margin"]
        low, high = scipy_stats.t.interval(0.90, len(d) - 1, loc=d.mean(), scale=scipy_stats.sem(d))
        if weightstats.ttost_paired(x, y, -margin, margin)[0] < 0.05:
            return "reproduced"
        return "contradicted" if low >= margin or high <= -margin else "undecided"
    low, high = scipy_stats.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=scipy_stats.sem(d))
    return "reproduced" if low > 0 else "contradicted" if high < 0 else "undecided"


def test_a_rebuilt_report_judges_the_stored_seeds_against_scipy_statsmodels_and_sklearn(files, tmp_path, capsys):
    gin_file, stored = files
    built = rebuild(gin_file, stored, tmp_path / "out")
    x = np.zeros((1, 1))
    baselines = {}
    for task in ("sst2", "rte"):   # the majority class over the whole dev set (no eval_max_examples)
        labels = tsv_labels(task)
        baselines[task] = 100 * dummy.DummyClassifier(strategy="most_frequent").fit(x.repeat(len(labels), 0), labels).score(
            x.repeat(len(labels), 0), labels)
    assert built["baselines"] == pytest.approx(baselines, rel=1e-12) and built["eval_max_examples"] is None
    assert {name: cell["at_chance"] for name, cell in built["cells"].items()} == {
        name: {task: bool(interval_low(v) <= baselines[task]) for task, v in scores.items()} for name, scores in SCORES.items()}
    for claim, (_, better, worse, column, *options) in zip(built["claims"], CLAIMS):
        for task, result in claim["tasks"].items():
            assert result["verdict"].startswith(expected_verdict(better, worse, task, (options or [{}])[0], baselines))
            assert result["p_value"] == pytest.approx(scipy_stats.ttest_rel(SCORES[better][task], SCORES[worse][task]).pvalue,
                                                      rel=1e-9)
    assert [c["verdict"] for c in built["claims"]] == ["reproduced on sst2", "contradicted on sst2",
                                                       "mixed: reproduced on sst2; contradicted on rte"]
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == f"rebuilt toy (ci, seeds {SEEDS}) from {stored}:"
    assert printed[1:4] == [f"  {c['claim']}: {c['verdict']}" for c in built["claims"]]
    assert {p.name for p in (tmp_path / "out").iterdir()} >= {"report.md", "report.json", "table.png", "pretrain_curves.png"}
    assert "| a > b | sst2 |" in (tmp_path / "out" / "report.md").read_text()
    again = rebuild(gin_file, tmp_path / "out" / "report.json", tmp_path / "again")   # a rebuilt report rebuilds the same
    assert again["claims"] == built["claims"] and again["cells"]["a"]["summary"] == built["cells"]["a"]["summary"]


def damaged(case, path):
    """The stored report.json at `path` damaged as `case` says."""
    text = path.read_text()
    report = json.loads(text)
    if case == "cut short":
        path.write_text(text[: len(text) // 2])
    elif case == "a field missing":
        del report["seeds"]
    elif case == "a cell the gin lacks":
        report["cells"]["d"] = report["cells"]["a"]
    elif case == "a cell missing":
        del report["cells"]["c"]
    elif case == "a score missing":
        del report["cells"]["b"]["seeds"]["1"]["scores"]["rte"]
    elif case == "cells not an object":
        report["cells"] = list(report["cells"])
    elif case == "another scale":
        report["finetune_steps"] = 300
    elif case == "other dev examples":
        report["eval_max_examples"] = 16
    if case != "cut short":
        path.write_text(json.dumps(report))


@pytest.mark.parametrize("case, message", [
    ("cut short", "is cut short or not JSON; give the report.json a `t5lite sweep` wrote"),
    ("a field missing", "has no seeds: not a sweep's report.json"),
    ("a cell the gin lacks", "has cell(s) d that sweep 'toy' does not; pass the --gin_file it was made with"),
    ("a cell missing", "has no cell c; pass --cells a,b (the cells it holds)"),
    ("a score missing", "cell 'b' seed 1 has no number for rte"),
    ("cells not an object", "has no cells: not a sweep's report.json"),
    ("another scale", "was made with finetune_steps 300, the gin's 'ci' scale has 4"),
    ("other dev examples", "was made with eval_max_examples 16, the gin's 'ci' scale has None"),
])
def test_a_damaged_or_foreign_report_json_is_one_line_and_writes_nothing(files, tmp_path, capsys, case, message):
    gin_file, stored = files
    damaged(case, stored)
    with pytest.raises(SystemExit) as exit_:
        rebuild(gin_file, stored, tmp_path / "out")
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1 and err[0].startswith(f"t5lite: error: --rebuild {stored}"), err
    assert message in err[0] and not (tmp_path / "out").exists()
