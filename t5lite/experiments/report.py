"""The sweep's report: per cell, each task's T5 metric over seeds (mean and 95% t-interval), the
pre-training cost, paired comparisons for the claims with a verdict each, and PNGs of the
pre-training curves and the table. Read only from the run directories, so it can be rebuilt.
report.json keeps each t-interval as computed; the table and the PNG clip it to the metric's range
(with few seeds it can reach past 100) and say so."""
from __future__ import annotations

import math
import re
import statistics
from pathlib import Path

from t5lite.experiments import stats
from t5lite.experiments.runner import cell_dir, read_json, read_metrics, write_json_atomic
from t5lite.experiments.spec import Spec
from t5lite.plotting import plain_ticks, pyplot
from t5lite.run_layout import RunDir

# The trainer's start-up lines in a run's log: "model EncoderDecoder: 1.2M params; 2.23e+09 FLOPs/step; ..."
# and "trainable params: 1197824 || all params: 1197824 || ...".
FLOPS_LINE = re.compile(r"model \w+: [\d.]+M params; ([\d.e+-]+) FLOPs/step")
PARAMS_LINE = re.compile(r"\|\| all params: (\d+)")
COST_KEYS = ("cost_flops", "cost_device_hours", "cost_energy_kwh", "cost_co2e_kg", "cost_price_usd")
# Correlations as t5lite.metrics scales them (x100) run from -100 to 100; every other score from 0 to 100.
CORRELATIONS = frozenset({"matthews_corrcoef", "pearson_corrcoef", "spearman_corrcoef"})


def metric_range(metric: str) -> tuple[float, float]:
    """The values `eval_<metric>` can take: a loss is >= 0, a perplexity >= 1, a score x100 is
    within [0, 100] ([-100, 100] for a correlation)."""
    if metric.endswith("perplexity"):
        return 1.0, math.inf
    if metric.endswith("loss"):
        return 0.0, math.inf
    return (-100.0, 100.0) if metric in CORRELATIONS else (0.0, 100.0)


def column_ranges(tasks: dict) -> dict[str, tuple[float, float]]:
    """Each report column's range: its task metric's, and for the GLUE average the mean of theirs."""
    ranges = {task: metric_range(metric) for task, metric in tasks.items()}
    return ranges | {"glue_average": tuple(statistics.fmean(r[end] for r in ranges.values()) for end in (0, 1))}


def clipped(summary: dict, bounds: tuple[float, float]) -> tuple[float, float, bool]:
    """(low, high) of a summary's t-interval inside `bounds`, and whether either end moved."""
    low, high = max(summary["low"], bounds[0]), min(summary["high"], bounds[1])
    return low, high, (low, high) != (summary["low"], summary["high"])


def _range_text(bounds: tuple[float, float]) -> str:
    return f"[{bounds[0]:g}, {bounds[1]:g}]".replace("inf", "∞")


def seed_result(spec: Spec, folder: Path, done: dict) -> dict:
    """One finished (cell, seed), `done` its done.json: each task's last logged eval metric, the
    GLUE average, the cost."""
    scores = {}
    for task, metric in spec.tasks.items():
        evals = [r for r in read_metrics(folder / f"finetune_{task}") if f"eval_{metric}" in r]
        scores[task] = float(evals[-1][f"eval_{metric}"]) if evals else math.nan
    scores["glue_average"] = sum(scores.values()) / len(scores)
    pretrain = read_metrics(folder / "pretrain")
    cost = {"pretrain_steps": done["pretrain_steps"], "pretrain_tokens": done["pretrain_tokens"],
            "wall_hours": sum(_stage_seconds(folder / stage, seconds)
                              for stage, seconds in done["wall_seconds"].items()) / 3600}
    log = (folder / "pretrain.log").read_text(errors="replace")
    flops, params = FLOPS_LINE.search(log), PARAMS_LINE.search(log)
    if flops:   # the trainer's own FLOPs per step (t5lite.train.mfu) and parameter count
        cost["flops"] = float(flops.group(1)) * done["pretrain_steps"]
    if params:
        cost["params"] = int(params.group(1))
    for key in COST_KEYS:   # written by the trainer's cost accounting, where it logs them
        values = [r[key] for r in pretrain if key in r]
        if values:
            cost[key] = values[-1]
    cost.update({f"cost_{k}": v for k, v in _cost_report(folder / "pretrain").items()})
    curve = [(r["step"], r["loss"]) for r in pretrain if "loss" in r]
    return {"seed": done["seed"], "scores": scores, "cost": cost, "curve": curve}


def _cost_report(run_dir: Path) -> dict:
    """The numbers of a run's cost.json (the trainer's cost report, added to over resumes); {} without
    a readable one."""
    cost = read_json(RunDir(run_dir).cost)
    if not isinstance(cost, dict):
        return {}
    return {k: v for k, v in cost.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _stage_seconds(run_dir: Path, last_call_seconds: float) -> float:
    """A stage's wall time: its cost report's `seconds`, else (no cost report) the runner's timing
    of its last call, which for a resumed stage is only the rest."""
    return float(_cost_report(run_dir).get("seconds", last_call_seconds))


def build(spec: Spec, out: Path) -> dict:
    """report.json's content: per cell its seeds' results and summaries, per claim a verdict."""
    columns = [*spec.tasks, "glue_average"]
    cells = {}
    for cell in spec.cells:
        seeds, errors = {}, []
        for seed in spec.seeds:
            folder = cell_dir(out, cell, seed)
            if isinstance(done := read_json(folder / "done.json"), dict):
                seeds[seed] = seed_result(spec, folder, done)
            elif isinstance(error := read_json(folder / "error.json"), dict):
                errors.append({"seed": seed, **error})
        summary = {}
        for column in columns:
            mean, low, high = stats.t_interval([r["scores"][column] for r in seeds.values()]) if seeds else (math.nan,) * 3
            summary[column] = {"mean": mean, "low": low, "high": high}
        cost = {k: statistics.fmean(r["cost"][k] for r in seeds.values() if k in r["cost"])   # over the seeds that log it
                for k in dict.fromkeys(k for r in seeds.values() for k in r["cost"])}
        cells[cell.name] = {"pretrain": list(cell.pretrain), "bindings": list(cell.bindings),
                            "finetune": list(cell.finetune), "seeds": seeds, "summary": summary,
                            "cost_per_seed": cost, "errors": errors}
    claims = []
    for claim in spec.claims:
        a, b = cells[claim.better]["seeds"], cells[claim.worse]["seeds"]
        paired = sorted(set(a) & set(b))
        diff, p = stats.paired_t_test([a[s]["scores"][claim.column] for s in paired],
                                      [b[s]["scores"][claim.column] for s in paired])
        claims.append({"claim": claim.text, "better": claim.better, "worse": claim.worse, "column": claim.column,
                       "seeds": paired, "difference": diff, "p_value": p, "verdict": stats.verdict(diff, p)})
    return {"sweep": spec.name, "scale": spec.scale, "tasks": dict(spec.tasks), "seeds": list(spec.seeds),
            "pretrain_tokens_budget": spec.pretrain_tokens, "batch_size": spec.batch_size,
            "finetune_steps": spec.finetune_steps, "cells": cells, "claims": claims}


def _fmt(summary: dict, bounds: tuple[float, float]) -> str:
    """mean [low, high], the interval clipped to `bounds` and then marked †."""
    if math.isnan(summary["mean"]):
        return "–"
    low, high, moved = clipped(summary, bounds)
    return f"{summary['mean']:.1f} [{low:.1f}, {high:.1f}]" + ("†" if moved else "")


def _clipping_note(report: dict, columns: list[str], heads: list[str]) -> list[str]:
    """The footnote for the table's † marks, naming each clipped column's range; [] with none."""
    ranges = column_ranges(report["tasks"])
    hit = [(head, ranges[c]) for c, head in zip(columns, heads)
           if any(not math.isnan(cell["summary"][c]["mean"]) and clipped(cell["summary"][c], ranges[c])[2]
                  for cell in report["cells"].values())]
    if not hit:
        return []
    return ["", "† interval clipped to the metric's range: " + ", ".join(f"{head} {_range_text(bounds)}" for head, bounds in hit)
            + " (report.json keeps the t-interval as computed)."]


def _num(value, spec: str = ".3g") -> str:
    """value formatted, or a dash where there is none (a cell with no finished seed)."""
    return "–" if value is None or math.isnan(value) else format(value, spec)


def markdown(report: dict) -> str:
    columns = [*report["tasks"], "glue_average"]
    heads = [f"{t} ({m})" for t, m in report["tasks"].items()] + ["GLUE avg"]
    lines = [f"# Sweep `{report['sweep']}` at the `{report['scale']}` scale", "",
             f"Seeds {report['seeds']}; pre-training budget {report['pretrain_tokens_budget']} tokens per cell "
             f"(batch {report['batch_size']}); fine-tuning {report['finetune_steps']} steps per task. "
             "Each entry: mean over seeds [95% t-interval].", "",
             "| cell | " + " | ".join(heads) + " | params | pre-train steps | tokens | pre-train FLOPs | device h | wall h/seed | seeds |",
             "|---" * (len(heads) + 8) + "|"]
    ranges = column_ranges(report["tasks"])
    for name, cell in report["cells"].items():
        cost = cell["cost_per_seed"]
        flops = cost.get("cost_flops", cost.get("flops"))
        lines.append(f"| {name} | " + " | ".join(_fmt(cell["summary"][c], ranges[c]) for c in columns) +
                     f" | {_num(cost.get('params'))} | {cost.get('pretrain_steps', 0):.0f} | "
                     f"{cost.get('pretrain_tokens', 0):.0f} | {_num(flops)} | {_num(cost.get('cost_device_hours'))} | "
                     f"{cost.get('wall_hours', 0):.4f} | "
                     f"{len(cell['seeds'])} |")
    lines += _clipping_note(report, columns, heads)
    lines += ["", "## Claims", "", "| claim | difference | p (paired t) | verdict |", "|---|---|---|---|"]
    for c in report["claims"]:
        lines.append(f"| {c['claim']} ({c['better']} vs {c['worse']}, {c['column']}) | {_num(c['difference'], '+.2f')} | "
                     f"{_num(c['p_value'])} | {c['verdict']} |")
    failed = [(name, e) for name, cell in report["cells"].items() for e in cell["errors"]]
    if failed:
        lines += ["", "## Failed cells", ""]
        for name, e in failed:
            lines += [f"`{name}` seed {e['seed']} failed in {e['stage']} (exit {e['returncode']}):", "", "```",
                      *e["tail"], "```", ""]
    return "\n".join(lines).rstrip() + "\n"


def plots(report: dict, out: Path) -> None:
    """pretrain_curves.png and table.png."""
    plt = pyplot()
    for name, figure in (("pretrain_curves.png", curves_figure(report)), ("table.png", table_figure(report))):
        figure.savefig(out / name, dpi=100)
        plt.close(figure)


def curves_figure(report: dict):
    """Pre-training loss per step, one line per cell and seed."""
    fig, ax = pyplot().subplots(figsize=(6, 4))
    for i, (name, cell) in enumerate(report["cells"].items()):
        for j, result in enumerate(cell["seeds"].values()):
            if result["curve"]:
                steps, losses = zip(*result["curve"])
                ax.plot(steps, losses, color=f"C{i}", alpha=0.8, label=name if j == 0 else None)
    ax.set(xlabel="pre-training step", ylabel="loss", title=f"{report['sweep']} ({report['scale']})")
    plain_ticks(ax, integer_x=True)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def table_figure(report: dict):
    """Each cell's GLUE average with its t-interval, clipped to the average's range as the table's
    are (the x label says so when it is)."""
    names = list(report["cells"])
    bounds = column_ranges(report["tasks"])["glue_average"]
    summaries = [report["cells"][n]["summary"]["glue_average"] for n in names]
    intervals = [clipped(s, bounds) for s in summaries]
    fig, ax = pyplot().subplots(figsize=(6, 0.9 + 0.5 * len(names)))
    means = [s["mean"] for s in summaries]
    errors = [[m - low for m, (low, _, _) in zip(means, intervals)], [high - m for m, (_, high, _) in zip(means, intervals)]]
    ax.barh(names, means, xerr=errors, color=[f"C{i}" for i in range(len(names))])
    note = f"\nintervals clipped to the average's range {_range_text(bounds)}" if any(moved for *_, moved in intervals) else ""
    ax.set(xlabel=f"GLUE average (mean, 95% t-interval){note}")
    plain_ticks(ax)
    fig.tight_layout()
    return fig


def write(spec: Spec, out: Path) -> dict:
    report = build(spec, out)
    write_json_atomic(out / "report.json", report)
    (out / "report.md").write_text(markdown(report))
    plots(report, out)
    return report
