"""The sweep's report: per cell, each task's T5 metric over seeds (mean and 95% t-interval), the
pre-training cost, paired comparisons for the claims with a verdict each, and PNGs of the
pre-training curves and the table. Read only from the run directories, so it can be rebuilt."""
from __future__ import annotations

import math
import re
import statistics
from pathlib import Path

from t5lite.experiments import stats
from t5lite.experiments.runner import cell_dir, read_json, read_metrics, write_json_atomic
from t5lite.experiments.spec import Spec
from t5lite.run_layout import RunDir

# The trainer's start-up lines in a run's log: "model EncoderDecoder: 1.2M params; 2.23e+09 FLOPs/step; ..."
# and "trainable params: 1197824 || all params: 1197824 || ...".
FLOPS_LINE = re.compile(r"model \w+: [\d.]+M params; ([\d.e+-]+) FLOPs/step")
PARAMS_LINE = re.compile(r"\|\| all params: (\d+)")
COST_KEYS = ("cost_flops", "cost_device_hours", "cost_energy_kwh", "cost_co2e_kg", "cost_price_usd")


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


def _fmt(summary: dict) -> str:
    if math.isnan(summary["mean"]):
        return "–"
    return f"{summary['mean']:.1f} [{summary['low']:.1f}, {summary['high']:.1f}]"


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
    for name, cell in report["cells"].items():
        cost = cell["cost_per_seed"]
        flops = cost.get("cost_flops", cost.get("flops"))
        lines.append(f"| {name} | " + " | ".join(_fmt(cell["summary"][c]) for c in columns) +
                     f" | {_num(cost.get('params'))} | {cost.get('pretrain_steps', 0):.0f} | "
                     f"{cost.get('pretrain_tokens', 0):.0f} | {_num(flops)} | {_num(cost.get('cost_device_hours'))} | "
                     f"{cost.get('wall_hours', 0):.4f} | "
                     f"{len(cell['seeds'])} |")
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
    """pretrain_curves.png (loss per step, one line per cell and seed) and table.png (GLUE average)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (name, cell) in enumerate(report["cells"].items()):
        for j, result in enumerate(cell["seeds"].values()):
            if result["curve"]:
                steps, losses = zip(*result["curve"])
                ax.plot(steps, losses, color=f"C{i}", alpha=0.8, label=name if j == 0 else None)
    ax.set(xlabel="pre-training step", ylabel="loss", title=f"{report['sweep']} ({report['scale']})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "pretrain_curves.png", dpi=100)
    plt.close(fig)
    names = list(report["cells"])
    summaries = [report["cells"][n]["summary"]["glue_average"] for n in names]
    fig, ax = plt.subplots(figsize=(6, 0.5 + 0.5 * len(names)))
    means = [s["mean"] for s in summaries]
    errors = [[s["mean"] - s["low"] for s in summaries], [s["high"] - s["mean"] for s in summaries]]
    ax.barh(names, means, xerr=errors, color=[f"C{i}" for i in range(len(names))])
    ax.set(xlabel="GLUE average (mean, 95% t-interval)")
    fig.tight_layout()
    fig.savefig(out / "table.png", dpi=100)
    plt.close(fig)


def write(spec: Spec, out: Path) -> dict:
    report = build(spec, out)
    write_json_atomic(out / "report.json", report)
    (out / "report.md").write_text(markdown(report))
    plots(report, out)
    return report
