"""The sweep's report: per cell, each task's T5 metric over seeds (mean and 95% t-interval), marked
where it is at chance (its interval reaches the task's constant-prediction baseline), each lens
(the pre-trained model's own held-out metric, e.g. its MLM loss), the pre-training cost, and for each claim a paired comparison and a verdict per task, with the seeds a
decision would need; PNGs of the pre-training curves and the table. Read only from the run
directories and the dev labels, so it can be rebuilt. report.json keeps each t-interval as
computed; the table and the PNG clip it to the metric's range (with few seeds it can reach past
100) and say so."""
from __future__ import annotations

import itertools
import math
import re
import statistics
from pathlib import Path

import numpy as np

from t5lite import metrics
from t5lite.errors import T5liteError
from t5lite.experiments import stats
from t5lite.experiments.runner import cell_dir, forgetting_report, probe_dir, read_json, read_metrics, write_json_atomic
from t5lite.experiments.spec import FORGETTING, PROBE_LENSES, Claim, Spec, is_forgetting
from t5lite.infer.unigram import UNIGRAM_EXAMPLES
from t5lite.plotting import plain_ticks, pyplot
from t5lite.run_layout import RunDir

# The trainer's start-up lines in a run's log: "model EncoderDecoder: 1.2M params; 2.23e+09 FLOPs/step; ..."
# and "trainable params: 1197824 || all params: 1197824 || ...".
FLOPS_LINE = re.compile(r"model \w+: [\d.]+M params; ([\d.e+-]+) FLOPs/step")
PARAMS_LINE = re.compile(r"\|\| all params: (\d+)")
COST_KEYS = ("cost_flops", "cost_device_hours", "cost_energy_kwh", "cost_co2e_kg", "cost_price_usd")
# Correlations as t5lite.metrics scales them (x100) run from -100 to 100; every other score from 0 to 100.
CORRELATIONS = frozenset({"matthews_corrcoef", "pearson_corrcoef", "spearman_corrcoef"})
# The metrics with a constant-prediction baseline, and how t5lite scores them.
SCORERS = {"accuracy": metrics.accuracy, "f1": metrics.f1_score_with_invalid,
           **{name: getattr(metrics, name) for name in CORRELATIONS}}
AT_CHANCE = "°"


def metric_range(metric: str) -> tuple[float, float]:
    """The values `eval_<metric>` can take: a loss is >= 0, a perplexity >= 1, a score x100 is
    within [0, 100] ([-100, 100] for a correlation); a forgetting lens (a change) is unbounded."""
    if is_forgetting(metric):
        return -math.inf, math.inf
    if metric.endswith("perplexity"):
        return 1.0, math.inf
    if metric.endswith("loss"):
        return 0.0, math.inf
    return (-100.0, 100.0) if metric in CORRELATIONS else (0.0, 100.0)


def direction(metric: str) -> int:
    """+1 where a higher score is better, -1 for a loss or a perplexity (and for a rise of either)."""
    return -1 if metric.endswith(("loss", "perplexity")) else 1


def has_average(report: dict) -> bool:
    """Whether the report shows a GLUE average: a sweep of one task has none beside that task."""
    return len(report["tasks"]) > 1


def average_tasks(report: dict) -> list[str]:
    """The tasks the GLUE average is over: those no cell is at chance on (every task in a report
    that marks none)."""
    return report.get("average_tasks", list(report["tasks"]))


def column_ranges(report: dict) -> dict[str, tuple[float, float]]:
    """Each report column's range: its task or lens metric's, and for the GLUE average the mean of
    its tasks' (of every task's, when it is over none)."""
    ranges = {task: metric_range(metric) for task, metric in report["tasks"].items()}
    averaged = [ranges[task] for task in average_tasks(report)] or list(ranges.values())
    lenses = {lens: metric_range(metric) for lens, metric in report.get("lenses", {}).items()}
    return ranges | lenses | {"glue_average": tuple(statistics.fmean(r[end] for r in averaged) for end in (0, 1))}


def clipped(summary: dict, bounds: tuple[float, float]) -> tuple[float, float, bool]:
    """(low, high) of a summary's t-interval inside `bounds`, and whether either end moved."""
    low, high = max(summary["low"], bounds[0]), min(summary["high"], bounds[1])
    return low, high, (low, high) != (summary["low"], summary["high"])


def _range_text(bounds: tuple[float, float]) -> str:
    return f"[{bounds[0]:g}, {bounds[1]:g}]".replace("inf", "∞")


def seed_result(spec: Spec, folder: Path, done: dict) -> dict:
    """One finished (cell, seed), `done` its done.json: each task's and each lens's last logged eval
    metric (a lens's from the pre-training run), the cost."""
    pretrain = read_metrics(folder / "pretrain")
    scores = {task: _last_eval(read_metrics(folder / f"finetune_{task}"), metric) for task, metric in spec.tasks.items()}
    scores |= {lens: _last_eval(pretrain, metric) for lens, metric in spec.eval_lenses.items()}
    unigram = {lens: _last_eval(pretrain, "unigram_loss") for lens, metric in spec.eval_lenses.items()
               if metric == _token_loss(pretrain)}
    for lens, probe in spec.probe_lenses.items():
        scores[lens], unigram[lens] = probe_scores(probe_dir(folder, probe) / "probe.json", probe)
    scores |= {lens: forgetting_score(forgetting_report(spec, folder), metric)
               for lens, metric in spec.forgetting_lenses.items()}
    cost = {"pretrain_steps": done["pretrain_steps"], "pretrain_tokens": done["pretrain_tokens"],
            "wall_hours": sum(_stage_seconds(folder / stage, seconds)
                              for stage, seconds in done["wall_seconds"].items()) / 3600}
    log = (folder / "pretrain.log").read_text(errors="replace") if (folder / "pretrain.log").exists() else ""
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
    return {"seed": done["seed"], "scores": scores, "lens_baselines": unigram, "cost": cost, "curve": curve}


def probe_scores(path: Path, probe: str) -> tuple[float, float]:
    """(the model's, its untrained control's) best layer's accuracy x100 in a `t5lite probe` JSON;
    NaN where the file or the probe is missing."""
    runs = (read_json(path) or {}).get(probe, {})
    best = {control: max((100 * a for name, r in runs.items() if name.endswith(" (untrained)") == control
                          for a in r.get("accuracy", [])), default=math.nan) for control in (False, True)}
    return best[False], best[True]


def forgetting_score(path: Path, metric: str) -> float:
    """The change of the base's `metric` in a `t5lite eval --forgetting` JSON, fine-tuned minus base;
    NaN where the file or the metric is missing (a cell from scratch has no base)."""
    measured = read_json(path) or {}
    before, after = (measured.get(key, {}).get(metric) for key in ("base_metrics", "run_metrics"))
    return math.nan if before is None or after is None else float(after) - float(before)


def _token_loss(pretrain: list[dict]) -> str:
    """The pre-training evaluation's cross entropy over its target tokens, which its `unigram_loss`
    is the baseline of (t5lite.objectives.heldout): a masked LM's `mlm_loss`, else a causal LM's `loss`."""
    return "mlm_loss" if any("eval_mlm_loss" in r for r in pretrain) else "loss"


def _last_eval(metrics_rows: list[dict], metric: str) -> float:
    """The last logged `eval_<metric>` of a run's metrics; NaN where it logged none."""
    evals = [r[f"eval_{metric}"] for r in metrics_rows if f"eval_{metric}" in r]
    return float(evals[-1]) if evals else math.nan


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


def dev_labels(spec: Spec, task: str) -> list:
    """The labels of the dev examples a fine-tuning run scores: the first `eval_max_examples` of
    the task's validation split, in file order, as the evaluation reads them."""
    import t5lite.data.tasks  # noqa: F401  (registers the tasks)
    from t5lite.data.registry import TaskRegistry
    rows = TaskRegistry.get(f"{spec.cells[0].task_prefix}{spec.registered_task(task)}").source.load(
        "validation", data_dir=spec.data_dir)
    return [row["label"] for row in itertools.islice(rows, spec.eval_max_examples)]


def baselines(spec: Spec) -> tuple[dict, str | None]:
    """Each task's constant-prediction baseline on its dev labels (None for a metric without one),
    and, when the labels cannot be read, why none are known."""
    if spec.data_dir is None:
        return dict.fromkeys(spec.tasks), "no sweep.data_dir to read the dev labels from"
    known = {}
    for task, metric in spec.tasks.items():
        if metric not in SCORERS:
            known[task] = None
            continue
        try:
            labels = dev_labels(spec, task)
        except (T5liteError, OSError, KeyError) as e:
            return dict.fromkeys(spec.tasks), f"the dev labels of {task} could not be read ({e})"
        known[task] = stats.constant_baseline(lambda t, p: SCORERS[metric](t, p)[metric], labels)
    return known, None


def _lens_baselines(spec: Spec, seeds: dict) -> dict:
    """Per lens, the mean over a cell's seeds of its pre-training's `unigram_loss` (the same held-out
    targets under the training split's token frequencies), where every seed logged one; else None."""
    known = {}
    for lens in spec.lenses:
        values = [r.get("lens_baselines", {}).get(lens, math.nan) for r in seeds.values()]
        known[lens] = statistics.fmean(values) if values and not any(map(math.isnan, values)) else None
    return known


def _lens_at_chance(summary: dict, baseline: float | None, metric: str) -> bool:
    """Whether a lens's interval reaches its baseline from the wrong side: a loss's upper end at or
    above the unigram loss, an accuracy's lower end at or below the untrained control's."""
    if baseline is None:
        return False
    if direction(metric) < 0:
        return stats.at_chance(-summary["high"], -baseline)
    return stats.at_chance(summary["low"], baseline)


def _summary(values: list[float]) -> dict:
    mean, low, high = stats.t_interval(values) if values else (math.nan,) * 3
    return {"mean": mean, "low": low, "high": high}


def run_results(spec: Spec, out: Path) -> dict[str, tuple[dict, list]]:
    """Per cell, its finished seeds' results ({seed: seed_result}) and its failed seeds' errors, read
    from the run directories in `out`."""
    results = {}
    for cell in spec.cells:
        seeds, errors = {}, []
        for seed in spec.seeds:
            folder = cell_dir(out, cell, seed)
            if isinstance(done := read_json(folder / "done.json"), dict):
                seeds[seed] = seed_result(spec, folder, done)
            elif isinstance(error := read_json(folder / "error.json"), dict):
                errors.append({"seed": seed, **error})
        results[cell.name] = seeds, errors
    return results


def build(spec: Spec, out: Path, results: dict | None = None) -> dict:
    """report.json's content: per cell its seeds' results, summaries and at-chance marks, per
    claim a verdict on each task; from `results` (run_results' shape: a stored report's, to
    rebuild it) where given, else from the run directories in `out`."""
    results = run_results(spec, out) if results is None else results
    baseline, baseline_note = baselines(spec)
    cells = {}
    for cell in spec.cells:
        seeds, errors = results[cell.name]
        summary = {column: _summary([r["scores"].get(column, math.nan) for r in seeds.values()])
                   for column in (*spec.tasks, *spec.lenses)}
        cost = {k: statistics.fmean(r["cost"][k] for r in seeds.values() if k in r["cost"])   # over the seeds that log it
                for k in dict.fromkeys(k for r in seeds.values() for k in r["cost"])}
        lens_baseline = _lens_baselines(spec, seeds)
        cells[cell.name] = {"pretrain": list(cell.pretrain), "bindings": list(cell.bindings),
                            "finetune": list(cell.finetune), "seeds": seeds, "summary": summary,
                            "lens_baselines": lens_baseline,
                            "at_chance": {task: stats.at_chance(summary[task]["low"], baseline[task]) for task in spec.tasks}
                            | {lens: _lens_at_chance(summary[lens], lens_baseline[lens], metric)
                               for lens, metric in spec.lenses.items()},
                            "cost_per_seed": cost, "errors": errors}
    averaged = [task for task in spec.tasks if not any(cell["at_chance"][task] for cell in cells.values())]
    for cell in cells.values():   # the average over the tasks every cell is above chance on
        for result in cell["seeds"].values():
            result["scores"]["glue_average"] = statistics.fmean(result["scores"][t] for t in averaged) if averaged else math.nan
        cell["summary"]["glue_average"] = _summary([r["scores"]["glue_average"] for r in cell["seeds"].values()])
    return {"sweep": spec.name, "scale": spec.scale, "tasks": dict(spec.tasks), "lenses": dict(spec.lenses),
            **({"forgetting_task": spec.forgetting_task} if spec.forgetting_task else {}),
            "pretrain_eval_examples": spec.pretrain_eval_examples, "seeds": list(spec.seeds),
            "pretrain_tokens_budget": spec.pretrain_tokens, "batch_size": spec.batch_size,
            "finetune_steps": spec.finetune_steps, "eval_max_examples": spec.eval_max_examples,
            "baselines": baseline, "baseline_note": baseline_note,
            "average_tasks": averaged, "cells": cells,
            "claims": [judge(claim, cells, spec.tasks, spec.lenses) for claim in spec.claims]} | (
        {"probe_models": probed} if (probed := {c.name: c.probe_model for c in spec.cells if c.probe_model}) else {})


def judge(claim: Claim, cells: dict, tasks: dict, lenses: dict | None = None) -> dict:
    """A claim's comparison and verdict on each column (task or lens) it is judged on, and its
    verdict over them."""
    metrics = {**tasks, **(lenses or {})}
    results = {column: compare(claim, cells, column, metrics[column]) for column in claim.judged_on(tasks, lenses or {})}
    return {"claim": claim.text, "better": claim.better, "worse": claim.worse, "column": claim.column,
            "effect": claim.effect, "margin": claim.margin, "tasks": results, "verdict": overall_verdict(results)}


def compare(claim: Claim, cells: dict, task: str, metric: str) -> dict:
    """The paired difference better - worse on `task` over the seeds both rows finished (its mean,
    95% interval, spread and paired t-test p) and its verdict: left out where both rows are at
    chance; else a difference or equivalence verdict, with the seeds the paper's effect (or, where
    the sweep gives none, the observed one) would need."""
    a, b = cells[claim.better], cells[claim.worse]
    paired = sorted(set(a["seeds"]) & set(b["seeds"]))
    x, y = ([cell["seeds"][s]["scores"].get(task, math.nan) for s in paired] for cell in (a, b))
    d = np.subtract(x, y)
    difference, p = stats.paired_t_test(x, y)
    _, low, high = stats.t_interval(d) if len(d) else (math.nan,) * 3
    sd = float(np.std(d, ddof=1)) if len(d) >= 2 else math.nan
    row = {"seeds": paired, "difference": difference, "low": low, "high": high, "sd": sd, "p_value": p}
    if a["at_chance"].get(task) and b["at_chance"].get(task):
        return row | {"seeds_needed": None, "verdict": "at chance: left out"}
    if claim.margin is None:
        needed = stats.seeds_needed(claim.effect or abs(difference), sd)
        return row | {"seeds_needed": needed,
                      "verdict": stats.difference_verdict(low, high, direction(metric), needed, len(d))}
    tost_p = stats.tost_paired(x, y, claim.margin)
    _, low90, high90 = stats.t_interval(d, 1 - 2 * stats.ALPHA) if len(d) else (math.nan,) * 3
    needed = stats.equivalence_seeds_needed(claim.margin, sd)
    return row | {"tost_p_value": tost_p, "seeds_needed": needed,
                  "verdict": stats.equivalence_verdict(tost_p, low90, high90, claim.margin, needed, len(d))}


def overall_verdict(results: dict) -> str:
    """Over a claim's tasks: reproduced or contradicted on the tasks that decided (mixed when they
    disagree), else the fewest seeds any undecided task needs, else at chance on every task."""
    if not results:
        return "not run: its column is not one this report measured (a task this scale leaves out, or a lens the runs predate)"
    decided = {kind: [task for task, r in results.items() if r["verdict"] == kind] for kind in ("reproduced", "contradicted")}
    if all(decided.values()):
        return "mixed: " + "; ".join(f"{kind} on {', '.join(tasks)}" for kind, tasks in decided.items())
    for kind, tasks in decided.items():
        if tasks:
            return f"{kind} on {', '.join(tasks)}"
    undecided = [r for r in results.values() if r["verdict"].startswith("undecided")]
    if not undecided:
        return "at chance on every task: no verdict"
    return min(undecided, key=lambda r: (r["seeds_needed"] is None, r["seeds_needed"] or 0))["verdict"]


def _fmt(summary: dict, bounds: tuple[float, float], chance: bool = False, digits: str = ".1f") -> str:
    """mean [low, high], the interval clipped to `bounds` and then marked †; AT_CHANCE after it
    where the entry is at chance."""
    if math.isnan(summary["mean"]):
        return "–"
    low, high, moved = clipped(summary, bounds)
    return f"{summary['mean']:{digits}} [{low:{digits}}, {high:{digits}}]" + ("†" if moved else "") + (AT_CHANCE if chance else "")


def digits(report: dict, column: str) -> str:
    """How a column's numbers are written: a lens in nats (a loss, a perplexity) or a forgetting lens (a
    change) to 3 decimals, a score x100 to 1."""
    metric = report.get("lenses", {}).get(column)
    return ".3f" if metric is not None and (direction(metric) < 0 or is_forgetting(metric)) else ".1f"


def _clipping_note(report: dict, columns: list[str], heads: list[str]) -> list[str]:
    """The footnote for the table's † marks, naming each clipped column's range; [] with none."""
    ranges = column_ranges(report)
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
    lenses = report.get("lenses", {})
    average = ["glue_average"] if has_average(report) else []
    columns = [*report["tasks"], *average, *lenses]
    heads = [f"{t} ({m})" for t, m in report["tasks"].items()] + ["GLUE avg"] * len(average) + [
        _lens_head(lens, m, report.get("forgetting_task")) for lens, m in lenses.items()]
    lines = [f"# Sweep `{report['sweep']}` at the `{report['scale']}` scale", "",
             f"Seeds {report['seeds']}; pre-training budget {report['pretrain_tokens_budget']} tokens per cell "
             f"(batch {report['batch_size']}); fine-tuning {report['finetune_steps']} steps per task. "
             "Each entry: mean over seeds [95% t-interval].", "",
             "| cell | " + " | ".join(heads) + " | params | pre-train steps | tokens | pre-train FLOPs | device h | wall h/seed | seeds |",
             "|---" * (len(heads) + 8) + "|"]
    baseline = {**report.get("baselines", {}), **{lens: _lens_baseline_text(report, lens) for lens in lenses}}
    if any(v is not None for v in baseline.values()):
        lines.append("| constant baseline | " + " | ".join(
            baseline.get(c) or "–" if c in lenses else _num(baseline.get(c), ".1f") for c in columns) + " |" + " |" * 7)
    ranges = column_ranges(report)
    for name, cell in report["cells"].items():
        cost = cell["cost_per_seed"]
        flops = cost.get("cost_flops", cost.get("flops"))
        chance = cell.get("at_chance", {})
        lines.append(f"| {name} | " + " | ".join(_fmt(cell["summary"][c], ranges[c], chance.get(c, False), digits(report, c)) for c in columns) +
                     f" | {_num(cost.get('params'))} | {cost.get('pretrain_steps', 0):.0f} | "
                     f"{cost.get('pretrain_tokens', 0):.0f} | {_num(flops)} | {_num(cost.get('cost_device_hours'))} | "
                     f"{cost.get('wall_hours', 0):.4f} | "
                     f"{len(cell['seeds'])} |")
    lines += _clipping_note(report, columns, heads) + _chance_note(report) + _lens_note(report)
    lines += ["", "## Claims", "", "Each claim is judged on each task on its own (a claim on `glue_average` on every "
              "task; one on a lens on that lens), never on an average: *reproduced* where the 95% interval of the paired difference "
              "(better - worse, seed by seed) excludes 0 in the paper's direction, *contradicted* where it "
              "excludes 0 the other way; a claim of equivalence (a margin) is *reproduced* where the paired TOST "
              f"shows the difference within ±margin (p < {stats.ALPHA:g}), *contradicted* where its "
              f"{100 * (1 - 2 * stats.ALPHA):g}% interval lies outside. Otherwise *undecided*, with the seeds a paired "
              f"t-test at {stats.ALPHA:g} needs for {100 * stats.POWER:g}% power against the paper's effect (the "
              "observed difference where the sweep gives none), from the spread of the paired differences.",
              "", "| claim | rows | paper's effect | verdict |", "|---|---|---|---|"]
    for c in report["claims"]:
        effect = f"on par within ±{c['margin']:g}" if c.get("margin") else _num(c.get("effect"), "+g")
        lines.append(f"| {c['claim']} | {c['better']} vs {c['worse']}, {c['column']} | {effect} | {c['verdict']} |")
    lines += ["", *claim_table(report)]
    if report.get("pilot"):
        pilot = report["pilot"]
        lines += ["", "## The pilot", "", f"Before this sweep, its pilot (`pilot/report.md`: seeds {pilot['seeds']}, "
                  f"the `{pilot['scale']}` scale) measured:", "", *claim_table(pilot)]
    failed = [(name, e) for name, cell in report["cells"].items() for e in cell["errors"]]
    if failed:
        lines += ["", "## Failed cells", ""]
        for name, e in failed:
            lines += [f"`{name}` seed {e['seed']} failed in {e['stage']} (exit {e['returncode']}):", "", "```",
                      *e["tail"], "```", ""]
    return "\n".join(lines).rstrip() + "\n"


def _chance_note(report: dict) -> list[str]:
    """What the AT_CHANCE marks and the GLUE average mean, or why no baseline is known."""
    if report.get("baseline_note"):
        return ["", f"No constant baselines: {report['baseline_note']}; no entry is marked at chance."]
    if "baselines" not in report:
        return []
    averaged = average_tasks(report)
    average = ("" if not has_average(report) else
               f" GLUE avg is the mean over {', '.join(averaged)}: the tasks no cell is at chance on." if averaged
               else " GLUE avg is – : every task has a cell at chance.")
    return ["", f"constant baseline: the best score of one label predicted for every dev example scored. "
            f"{AT_CHANCE} at chance: the seeds' 95% interval reaches the baseline (its lower end is at or below it); "
            f"such entries are kept out of {'the GLUE average and out of ' if has_average(report) else ''}the claims' "
            f"verdicts (where both rows are at chance).{average}"]


def _lens_head(lens: str, metric: str, forgetting_task: str | None = None) -> str:
    if is_forgetting(metric):
        return f"{lens} ({metric.removeprefix(FORGETTING)} change after {forgetting_task})"
    return f"{lens} ({PROBE_LENSES[metric]} probe, best layer)" if metric in PROBE_LENSES else f"{lens} ({metric}, held out)"


def _lens_baseline_text(report: dict, lens: str) -> str | None:
    """A lens's unigram baseline as the table shows it: one value where every cell's agrees to the
    digits shown, else their range; None where no cell has one."""
    values = sorted({format(v, digits(report, lens)) for cell in report["cells"].values()
                     if (v := cell.get("lens_baselines", {}).get(lens)) is not None}, key=float)
    return None if not values else values[0] if len(values) == 1 else f"{values[0]}–{values[-1]}"


def _lens_note(report: dict) -> list[str]:
    """What the lens columns are; [] without lenses."""
    lenses = report.get("lenses", {})
    if not lenses:
        return []
    count = report.get("pretrain_eval_examples")
    read = f"the first {count} examples" if count else "every example"
    held_out = {lens: metric for lens, metric in lenses.items() if metric not in PROBE_LENSES and not is_forgetting(metric)}
    forgotten = {lens: metric.removeprefix(FORGETTING) for lens, metric in lenses.items() if is_forgetting(metric)}
    probed = {lens: PROBE_LENSES[metric] for lens, metric in lenses.items() if metric in PROBE_LENSES}
    lines = []
    if held_out:
        names = ", ".join(f"{lens} is `eval_{metric}`" for lens, metric in held_out.items())
        lines += [
            "", f"Lenses, of the pre-trained model itself at its last step, on {read} of its pre-training task's "
            f"validation split (converted as training converts them): {names}. A lower loss or perplexity is better. "
            "The baseline of a lens that is the pre-training's own token cross entropy (`mlm_loss`, a causal LM's "
            "`loss`) is the run's `unigram_loss`: the same targets scored by the token frequencies of its first "
            f"{UNIGRAM_EXAMPLES:,} training examples, what a model that ignores its input scores; {AT_CHANCE} marks a "
            "cell whose interval reaches it (its upper end at or above). Other lenses have no baseline, and – is "
            "shown where a cell's objective does not log that metric or its runs predate the baseline."]
    if probed:
        names = ", ".join(f"{lens} is the {probe} probe's" for lens, probe in probed.items())
        lines += [
            "", f"{'Probe lenses' if held_out else 'Lenses'}, of the pre-trained model at its last step{_probe_models(report)}, "
            "by `t5lite probe` "
            f"on UD English-EWT (a linear probe per layer, trained on those of the first 500 training sentences and "
            f"scored on those of the first 200 test sentences that fit the model's positions): {names} test accuracy "
            "x100 at its best layer. "
            "A higher accuracy is better. Its baseline is the same probe on the same shape of model freshly "
            f"initialised (the probe's untrained control, best layer{'; of word vectors, random ones of their spread' if report.get('probe_models') else ''}): "
            f"what word identity alone gives; {AT_CHANCE} "
            "marks a cell whose interval reaches it (its lower end at or below)."]
    if forgotten:
        names = ", ".join(f"{lens} is `{metric}`'s" for lens, metric in forgotten.items())
        lines += [
            "", f"Forgetting lenses, of each cell's fine-tuning on {report.get('forgetting_task')}, by `t5lite eval "
            f"--forgetting` on {read} of its base's pre-training task's validation split (the base run's own "
            "config.gin; the fine-tuned weights put into the base's model, its pre-training head kept): the change "
            f"fine-tuning made, fine-tuned minus base: {names}. Less rise of a loss (more of an accuracy) is less "
            "forgotten. A cell fine-tuned from scratch has no base and shows –; there is no baseline (no change is 0)."]
    return lines


def _probe_models(report: dict) -> str:
    """The lens note's words for cells probed without pre-training ('' where there are none)."""
    models = report.get("probe_models", {})
    return "".join(f" ({cell}, which pre-trains nothing: {path})" for cell, path in models.items())


def plan(report: dict) -> list[str]:
    """The console's summary of a (pilot) report: per claim and task, each row's distance from
    chance, the paired differences' spread, and the seeds a decision needs."""
    lines = [f"{report['sweep']} ({report['scale']}, seeds {report['seeds']}): the seeds each claim needs, per task"]
    for c in report["claims"]:
        for task, r in c["tasks"].items():
            rows = ", ".join(f"{row} {_distance(report, row, task)}" for row in (c["better"], c["worse"]))
            needs = "more tokens or steps, not seeds" if r["verdict"].startswith("at chance") else (
                f"{r['seeds_needed']} seeds" if r["seeds_needed"] else r["verdict"].removeprefix("undecided: "))
            lines.append(f"  {c['claim']} | {task}: {rows}; difference {_num(r['difference'], '+.2f')} "
                         f"(sd {_num(r['sd'], '.2f')} over {len(r['seeds'])} seeds); needs {needs}")
    return lines


def _distance(report: dict, row: str, task: str) -> str:
    """A row's mean on a task and how far it is from the task's baseline."""
    cell, baseline = report["cells"][row], report.get("baselines", {}).get(task)
    if baseline is None or _num(cell["summary"][task]["mean"]) == "–":
        return _mean(cell, task, digits(report, task))
    where = "at chance" if cell["at_chance"][task] else "above chance"
    return f"{_mean(cell, task)} ({_num(cell['summary'][task]['mean'] - baseline, '+.1f')} from {baseline:.1f}, {where})"


def _mean(cell: dict, task: str, spec: str = ".1f") -> str:
    """A cell's mean on a task, marked where it is at chance."""
    return _num(cell["summary"][task]["mean"], spec) + (AT_CHANCE if cell.get("at_chance", {}).get(task) else "")


def claim_table(report: dict) -> list[str]:
    """Each claim's comparison on each of its tasks: the rows' means, the paired difference, its
    spread, and the seeds a decision needs (the power analysis)."""
    lines = ["| claim | task | baseline | better | worse | difference [95% interval] | sd of differences | p (paired t) "
             "| seeds | seeds needed | verdict |", "|---" * 11 + "|"]
    for c in report["claims"]:
        for task, r in c["tasks"].items():
            shown = digits(report, task).replace("1f", "2f")   # a score's difference to 2 decimals, a nats lens's to 3
            means = [_mean(report["cells"][row], task, digits(report, task)) for row in (c["better"], c["worse"])]
            interval = "–" if r["low"] is None or math.isnan(r["low"]) else f"[{r['low']:+{shown}}, {r['high']:+{shown}}]"
            lines.append(f"| {c['claim']} | {task} | {_num(report.get('baselines', {}).get(task), '.1f')} | {means[0]} | "
                         f"{means[1]} | {_num(r['difference'], '+' + shown)} {interval} | {_num(r['sd'], shown)} | "
                         f"{_num(r['p_value'])} | {len(r['seeds'])} | {_num(r['seeds_needed'], 'd')} | {r['verdict']} |")
    return lines


def plots(report: dict, out: Path) -> None:
    """pretrain_curves.png and table.png, and LENS_frontier.png per forgetting lens."""
    plt = pyplot()
    for name, figure in (("pretrain_curves.png", curves_figure(report)), ("table.png", table_figure(report))):
        figure.savefig(out / name, dpi=100)
        plt.close(figure)
    for lens, metric in report.get("lenses", {}).items():
        if is_forgetting(metric):
            frontier_plot(report, lens, out / f"{lens}_frontier.png")


def frontier_plot(report: dict, lens: str, path: Path) -> None:
    """The forgetting frontier (t5lite.experiments.forgetting) of the cells with a base: how much each
    forgot (a loss's rise, an accuracy's fall) against its score on the task it was fine-tuned on."""
    from t5lite.experiments import forgetting
    metric, task = report["lenses"][lens].removeprefix(FORGETTING), report["forgetting_task"]
    sign = -direction(metric)   # what was forgotten: a loss's rise, an accuracy's fall
    pairs = {name: [(sign * r["scores"][lens], r["scores"][task]) for r in cell["seeds"].values()
                    if not math.isnan(r["scores"][lens]) and not math.isnan(r["scores"][task])]
             for name, cell in report["cells"].items()}
    summary = forgetting.summarize({name: p for name, p in pairs.items() if p})
    if not summary:
        return
    forgetting.plot(summary, str(path), f"{report['sweep']} ({report['scale']}, seeds {report['seeds']}): "
                    f"forgetting against {task}", f"{'rise' if sign > 0 else 'fall'} of the base's held-out {metric}",
                    f"{task} dev {report['tasks'][task]}", metric_range(report["tasks"][task]))


def curves_figure(report: dict):
    """Pre-training loss per step, one line per cell and seed (a sweep whose cells all start from
    elsewhere says so instead)."""
    fig, ax = pyplot().subplots(figsize=(6, 4))
    for i, (name, cell) in enumerate(report["cells"].items()):
        curves = [result["curve"] for result in cell["seeds"].values() if result["curve"]]
        for j, curve in enumerate(curves):
            steps, losses = zip(*curve)
            ax.plot(steps, losses, color=f"C{i}", alpha=0.8, label=name if j == 0 else None)
    ax.set(xlabel="pre-training step", ylabel="loss", title=f"{report['sweep']} ({report['scale']})")
    plain_ticks(ax, integer_x=True)
    if ax.lines:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no cell pre-trains", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    return fig


def table_figure(report: dict):
    """Each cell's GLUE average (of a one-task sweep, its task's score) with its t-interval, clipped
    to the metric's range as the table's are (the x label says so when it is); every cell is named,
    and a figure without a bar (an average over no task) says why."""
    names = list(report["cells"])
    column = "glue_average" if has_average(report) else next(iter(report["tasks"]))
    shown = "GLUE average" if has_average(report) else f"{column} {report['tasks'][column]}"
    bounds = column_ranges(report)[column]
    summaries = [report["cells"][n]["summary"][column] for n in names]
    intervals = [clipped(s, bounds) for s in summaries]
    fig, ax = pyplot().subplots(figsize=(6, 0.9 + 0.5 * len(names)))
    means = [s["mean"] for s in summaries]
    errors = [[m - low for m, (low, _, _) in zip(means, intervals)], [high - m for m, (_, high, _) in zip(means, intervals)]]
    rows = range(len(names))   # positions, not names: a row without a bar (a NaN mean) keeps its label
    ax.barh(rows, means, xerr=errors, color=[f"C{i}" for i in rows])
    ax.set(yticks=rows, yticklabels=names, ylim=(len(names) - 0.5, -0.5))
    if all(math.isnan(m) for m in means):
        why = "no cell finished a seed" if average_tasks(report) or column != "glue_average" else "every task has a cell at chance"
        ax.text(0.5, 0.5, f"no {shown}: {why}", transform=ax.transAxes, ha="center", va="center")
        ax.set_xticks([])
    note = (f"\nintervals clipped to the {'average' if column == 'glue_average' else 'metric'}'s range "
            f"{_range_text(bounds)}" if any(moved for *_, moved in intervals) else "")
    ax.set(xlabel=f"{shown} (mean, 95% t-interval){note}")
    plain_ticks(ax)
    fig.tight_layout()
    return fig


def write(spec: Spec, out: Path, results: dict | None = None) -> dict:
    """report.json, report.md and the PNGs in `out` (from `results` as `build` reads them); the
    report carries its pilot's comparisons where `out/pilot` holds one."""
    report = build(spec, out, results)
    if isinstance(pilot := read_json(out / "pilot" / "report.json"), dict):
        report["pilot"] = {"scale": pilot["scale"], "seeds": pilot["seeds"], "baselines": pilot["baselines"],
                           "claims": pilot["claims"], "cells": {name: {key: cell[key] for key in ("summary", "at_chance")}
                                                               for name, cell in pilot["cells"].items()}}
    write_json_atomic(out / "report.json", report)
    (out / "report.md").write_text(markdown(report))
    plots(report, out)
    return report
