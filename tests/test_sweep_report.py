"""The sweep report's table and figures read as the metrics do: a t-interval that reaches past the
metric's range is clipped in report.md and table.png, which say so, while report.json keeps it as
scipy computes it; the axes carry plain decimal labels and whole-number steps."""
import json

import numpy as np
import pytest

from t5lite.experiments import report

stats = pytest.importorskip("scipy.stats", reason="the reference intervals are scipy's")
TASKS = {"sst2": "accuracy", "cola": "matthews_corrcoef"}


def summary(values):
    """Mean and 95% t-interval as scipy computes them (the reference)."""
    low, high = stats.t.interval(0.95, len(values) - 1, loc=np.mean(values), scale=stats.sem(values))
    return {"mean": float(np.mean(values)), "low": float(low), "high": float(high)}


def cell(scores):
    """A report cell of two seeds with `scores` {task: [seed 0, seed 1]} and a short loss curve."""
    average = [np.mean([scores[t][s] for t in TASKS]) for s in (0, 1)]
    return {"seeds": {s: {"curve": [[1, 6.9 - s / 10], [2, 6.8], [3, 6.75], [4, 6.7]]} for s in (0, 1)},
            "summary": {**{t: summary(v) for t, v in scores.items()}, "glue_average": summary(average)},
            "cost_per_seed": {}, "errors": []}


def sweep_report(**cells):
    return {"sweep": "toy", "scale": "ci", "tasks": TASKS, "seeds": [0, 1], "pretrain_tokens_budget": 2560,
            "batch_size": 4, "finetune_steps": 4, "cells": cells, "claims": []}


# Two seeds at 0 and 50 give the t-interval [-292.7, 342.7] for an accuracy of 25.
WIDE = {"sst2": [0.0, 50.0], "cola": [-90.0, 90.0]}
NARROW = {"sst2": [80.0, 82.0], "cola": [30.0, 32.0]}


def test_intervals_past_the_metric_range_are_clipped_in_the_table_and_figure_and_kept_in_the_json(tmp_path, monkeypatch):
    built = sweep_report(wide=cell(WIDE), narrow=cell(NARROW))
    monkeypatch.setattr(report, "build", lambda spec, out, results: built)
    report.write(None, tmp_path)

    raw = json.loads((tmp_path / "report.json").read_text())["cells"]["wide"]["summary"]
    assert raw["sst2"]["low"] == pytest.approx(-292.7, abs=0.05) and raw["sst2"]["high"] == pytest.approx(342.7, abs=0.05)
    rows = {line.split(" | ")[0][2:]: line.split(" | ")[1:4] for line in (tmp_path / "report.md").read_text().splitlines()
            if line.startswith(("| wide ", "| narrow "))}
    # accuracy in [0, 100]; a correlation in [-100, 100]; their average in [-50, 100]
    assert rows["wide"] == ["25.0 [0.0, 100.0]†", "0.0 [-100.0, 100.0]†", "12.5 [-50.0, 100.0]†"]
    assert rows["narrow"] == ["81.0 [68.3, 93.7]", "31.0 [18.3, 43.7]", "56.0 [43.3, 68.7]"]
    assert ("† interval clipped to the metric's range: sst2 (accuracy) [0, 100], cola (matthews_corrcoef) "
            "[-100, 100], GLUE avg [-50, 100] (report.json keeps the t-interval as computed).") in \
        (tmp_path / "report.md").read_text()
    assert (tmp_path / "table.png").stat().st_size > 0

    ax, = report.table_figure(built).axes
    from matplotlib.container import ErrorbarContainer
    errorbar, = (c for c in ax.containers if isinstance(c, ErrorbarContainer))
    _, _, (lines,) = errorbar.lines   # (data line, caps, the bars' line collection)
    ends = np.array([segment[:, 0] for segment in lines.get_segments()])
    np.testing.assert_allclose(ends, [[-50.0, 100.0], [43.3, 68.7]], atol=0.05)   # wide, narrow
    assert "intervals clipped to the average's range [-50, 100]" in ax.get_xlabel()


def test_a_table_within_range_says_nothing_of_clipping(tmp_path):
    within = sweep_report(narrow=cell(NARROW))
    assert "†" not in report.markdown(within)
    assert "clipped" not in report.table_figure(within).axes[0].get_xlabel()


def test_a_figure_without_an_average_names_every_cell_and_says_why():
    """A GLUE average over no task (every task has a cell at chance) is NaN in every row."""
    nan = {"mean": np.nan, "low": np.nan, "high": np.nan}
    built = sweep_report(narrow=cell(NARROW), wide=cell(WIDE)) | {"average_tasks": []}
    for c in built["cells"].values():
        c["summary"]["glue_average"] = nan
    fig = report.table_figure(built)
    ax, = fig.axes
    fig.canvas.draw()
    assert [t.get_text() for t in ax.get_yticklabels()] == ["narrow", "wide"]
    assert [t.get_text() for t in ax.texts] == ["no GLUE average: every task has a cell at chance"]
    assert not len(ax.get_xticks())   # no scale to read
    del built["average_tasks"]   # an average over every task, and still none: no seed finished
    assert [t.get_text() for t in report.table_figure(built).axes[0].texts] == ["no GLUE average: no cell finished a seed"]
    assert not report.table_figure(sweep_report(narrow=cell(NARROW))).axes[0].texts   # with an average: no note


def test_metric_ranges_follow_the_metrics_scale():
    assert report.metric_range("accuracy") == report.metric_range("f1") == (0.0, 100.0)
    assert report.metric_range("spearman_corrcoef") == (-100.0, 100.0)
    assert report.metric_range("loss") == (0.0, np.inf) and report.metric_range("perplexity") == (1.0, np.inf)


def test_report_axes_read_as_plain_decimals_with_whole_steps():
    fig = report.curves_figure(sweep_report(wide=cell(WIDE)))
    ax, = fig.axes
    fig.canvas.draw()
    assert all(float(t).is_integer() for t in ax.get_xticks())
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert labels and all(float(label) == pytest.approx(loc) for label, loc in zip(labels, ax.get_yticks()))
    assert ax.yaxis.get_offset_text().get_text() == ""


def test_a_one_task_sweep_shows_its_task_and_no_glue_average(tmp_path):
    """Averaging one task repeats it: the table has no GLUE avg column and the figure shows the task."""
    built = sweep_report(wide=cell(WIDE), narrow=cell(NARROW)) | {"tasks": {"sst2": "accuracy"},
                                                                    "baselines": {"sst2": 50.9}}
    text = report.markdown(built)
    assert "| cell | sst2 (accuracy) | params |" in text and "GLUE" not in text
    assert "| narrow | 81.0 [68.3, 93.7] | " in text
    ax, = report.table_figure(built).axes
    assert ax.get_xlabel() == "sst2 accuracy (mean, 95% t-interval)\nintervals clipped to the metric's range [0, 100]"
    assert [bar.get_width() for bar in ax.patches] == pytest.approx([25.0, 81.0])
