"""A sweep's report rebuilt offline (`t5lite sweep --rebuild REPORT.json`): the per-seed results a
report.json keeps are checked against the sweep gin and judged again with the current statistics,
baselines and the gin's claims, so a report written by an older t5lite can be brought up to date
without its run directories and without training anything."""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from t5lite.errors import DataError
from t5lite.experiments.runner import read_json
from t5lite.experiments.spec import Spec

# What a report.json must hold to be rebuilt, and the sizes that must be the gin scale's (report key -> Spec field).
FIELDS = {"sweep": str, "tasks": dict, "seeds": list, "pretrain_tokens_budget": int, "batch_size": int,
          "finetune_steps": int, "cells": dict}
SIZES = {"pretrain_tokens_budget": "pretrain_tokens", "batch_size": "batch_size", "finetune_steps": "finetune_steps",
         "eval_max_examples": "eval_max_examples"}   # eval_max_examples: only where the report records it
SEED_FIELDS = {"scores": dict, "cost": dict, "curve": list}


def stored_results(spec: Spec, path: Path) -> tuple[Spec, dict[str, tuple[dict, list]]]:
    """The sweep cut to the lenses the report.json at `path` measured (one made before a lens was
    added has no such column), and its per-seed results in report.run_results' shape, once the
    file is a whole report of this sweep at this scale; anything else is one DataError line."""
    where = f"--rebuild {path}"
    stored = read_json(path) if path.is_file() else None
    if stored is None:
        why = "is cut short or not JSON" if path.is_file() else "is not a file"
        raise DataError(f"{where} {why}; give the report.json a `t5lite sweep` wrote")
    missing = [key for key, kind in FIELDS.items() if not isinstance(stored, dict) or not isinstance(stored.get(key), kind)]
    if missing:
        raise DataError(f"{where} has no {', '.join(missing)}: not a sweep's report.json; give the one "
                        "`t5lite sweep` wrote")
    if stored["sweep"] != spec.name:
        raise DataError(f"{where} is sweep {stored['sweep']!r}'s report, not {spec.name!r}'s; pass the --gin_file "
                        "it was made with")
    names = [cell.name for cell in spec.cells]
    if unknown := [name for name in stored["cells"] if name not in names]:
        raise DataError(f"{where} has cell(s) {', '.join(unknown)} that sweep {spec.name!r} does not; pass the "
                        "--gin_file it was made with")
    if absent := [name for name in names if name not in stored["cells"]]:
        raise DataError(f"{where} has no cell {', '.join(absent)}; pass --cells {','.join(stored['cells'])} "
                        "(the cells it holds)")
    _check_scale(where, stored, spec)
    measured = stored.get("lenses") if isinstance(stored.get("lenses"), dict) else {}
    spec = dataclasses.replace(spec, lenses={lens: m for lens, m in spec.lenses.items() if measured.get(lens) == m})
    return spec, {name: _cell_results(f"{where} cell {name!r}", stored["cells"][name], spec) for name in names}


def _check_scale(where: str, stored: dict, spec: Spec) -> None:
    """The report's sizes, seeds and tasks are the gin scale's: its runs are what the scale runs."""
    made = f"the gin's {spec.scale!r} scale"
    for key, field in SIZES.items():
        if key in stored and stored[key] != getattr(spec, field):
            raise DataError(f"{where} was made with {field} {stored[key]}, {made} has {getattr(spec, field)}; "
                            "pass the --gin.SWEEP_SCALE (and bindings) it was made with")
    if stored["seeds"] != list(spec.seeds):
        raise DataError(f"{where} was made with seeds {stored['seeds']}, {made} runs {list(spec.seeds)}; "
                        "pass the --gin.SWEEP_SCALE (or --seeds) it was made with")
    if other := [f"{task} ({metric})" for task, metric in spec.tasks.items() if stored["tasks"].get(task) != metric]:
        raise DataError(f"{where} has no score for {', '.join(other)}, which {made} reports; pass the "
                        "--gin.SWEEP_SCALE it was made with")


def _cell_results(where: str, cell, spec: Spec) -> tuple[dict, list]:
    """A stored cell's seeds (keys back to ints, null scores back to NaN) and errors."""
    if not isinstance(cell, dict) or not isinstance(cell.get("seeds"), dict) or not isinstance(cell.get("errors"), list):
        raise DataError(f"{where} has no 'seeds' and 'errors'; give the report.json `t5lite sweep` wrote")
    seeds = {}
    for key, result in cell["seeds"].items():
        seed = int(key) if str(key).isdigit() else None
        if seed not in spec.seeds:
            raise DataError(f"{where} has seed {key!r}, not one of {list(spec.seeds)}")
        if not isinstance(result, dict) or not all(isinstance(result.get(k), kind) for k, kind in SEED_FIELDS.items()):
            raise DataError(f"{where} seed {key} lacks {', '.join(SEED_FIELDS)}; give the report.json `t5lite sweep` wrote")
        scores = {task: result["scores"].get(task, "") for task in spec.tasks}
        scores |= {lens: result["scores"].get(lens) for lens in spec.lenses}
        if bad := [task for task, v in scores.items() if v is not None and not isinstance(v, (int, float))]:
            raise DataError(f"{where} seed {key} has no number for {', '.join(bad)}")
        seeds[seed] = {**result, "seed": seed, "cost": dict(result["cost"]),
                       "scores": {task: math.nan if v is None else float(v) for task, v in scores.items()}}
    return seeds, list(cell["errors"])

