"""Runs a sweep's cells as `t5lite train` subprocesses, several at once: per cell and seed,
pre-train, then fine-tune on each task from the pre-trained checkpoint (evaluating at the end).

Each (cell, seed) is a folder of normal run directories under the sweep's folder. `done.json`,
written atomically last, marks it finished, so a rerun skips it; a killed run resumes its run
directories (`t5lite train` resumes from its latest checkpoint). A failing stage writes
`error.json` with its output's last lines and stops that cell only; a stage that a signal stopped
before its last step (it exits 0, with a checkpoint) stops its cell unfinished, not done.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from t5lite.experiments.spec import Cell, Spec
from t5lite.run_layout import RunDir
from t5lite.train import summaries

ERROR_TAIL_LINES = 15


def cell_dir(out: Path, cell: Cell, seed: int) -> Path:
    return out / f"{cell.name}__seed{seed}"


def write_json_atomic(path: Path, value) -> None:
    """Writes then renames, so a reader (or a rerun after kill -9) never sees half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(value, indent=1, sort_keys=True))
    os.replace(tmp, path)


def read_json(path: Path):
    """A JSON file's value; None when it is missing or cut short (a copy or a disk that stopped
    mid-file), so a damaged `done.json` means "run again", not a crash."""
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, UnicodeDecodeError, json.JSONDecodeError):
        return None


def is_done(out: Path, cell: Cell, seed: int) -> bool:
    return isinstance(read_json(cell_dir(out, cell, seed) / "done.json"), dict)


def run_sweep(spec: Spec, out: Path, parallel: int | None = None, log=print) -> None:
    """Runs every unfinished (cell, seed), `parallel` (default: the scale's) at a time."""
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(cell, seed) for cell in spec.cells for seed in spec.seeds]
    todo = [(c, s) for c, s in jobs if not is_done(out, c, s)]
    log(f"sweep {spec.name} ({spec.scale}): {len(jobs)} cell runs, {len(jobs) - len(todo)} already done")
    with ThreadPoolExecutor(max_workers=max(1, parallel or spec.parallel)) as pool:
        for cell, seed, status in pool.map(lambda job: (*job, run_cell(spec, out, *job)), todo):
            log(f"  {cell.name} seed {seed}: {status}")


def run_cell(spec: Spec, out: Path, cell: Cell, seed: int) -> str:
    """Pre-trains and fine-tunes one (cell, seed); 'done' or the failed stage's name."""
    folder = cell_dir(out, cell, seed)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "error.json").unlink(missing_ok=True)
    steps = spec.pretrain_steps(cell)
    seconds = {}
    for stage, files, bindings in stages(spec, cell, seed, folder):
        run_dir = folder / stage
        started = time.time()
        result = _train(spec, files, [*bindings, f"MODEL_DIR = '{run_dir}'"], folder / f"{stage}.log")
        seconds[stage] = time.time() - started
        if result is not None:
            write_json_atomic(folder / "error.json", {"stage": stage, "returncode": result[0], "tail": result[1]})
            return f"FAILED in {stage} (see {folder / 'error.json'})"
        wanted = steps if stage == "pretrain" else spec.finetune_steps
        if (reached := _last_logged_step(run_dir)) < wanted:
            return f"stopped in {stage} at step {reached} of {wanted} (a signal; run the sweep again to resume)"
    write_json_atomic(folder / "done.json", {
        "cell": cell.name, "seed": seed, "pretrain_steps": steps, "pretrain_tokens_budget": spec.pretrain_tokens,
        "pretrain_tokens": steps * spec.batch_size * cell.tokens_per_row, "batch_size": spec.batch_size,
        "finetune_steps": spec.finetune_steps, "wall_seconds": seconds})
    return "done"


def stages(spec: Spec, cell: Cell, seed: int, folder: Path) -> list[tuple[str, list[str], list[str]]]:
    """(stage name, gin files, bindings) of each `t5lite train` a (cell, seed) runs, in order:
    pre-training, then fine-tuning on each task from its checkpoint (MODEL_DIR not yet bound)."""
    out = [("pretrain", list(cell.pretrain), [
        *cell.bindings, *spec.scale_bindings, f"TRAIN_STEPS = {spec.pretrain_steps(cell)}",
        f"BATCH_SIZE = {spec.batch_size}", f"train.seed = {seed}"])]
    for task in spec.tasks:
        out.append((f"finetune_{task}", list(cell.finetune), [
            *cell.finetune_bindings_for(task), f"MIXTURE_OR_TASK_NAME = '{cell.task_prefix}{task}'",
            f"INITIAL_CHECKPOINT_PATH = '{folder / 'pretrain'}'", f"TRAIN_STEPS = {spec.finetune_steps}",
            f"BATCH_SIZE = {spec.finetune_batch_size}", f"EVAL_EVERY = {spec.finetune_steps}",
            f"train.eval_max_examples = {spec.eval_max_examples}", f"train.seed = {seed}",
            f"train.checkpoint_every = {spec.finetune_steps}", *spec.scale_bindings,
            *([f"DATA_DIR = '{spec.data_dir}'"] if spec.data_dir else [])]))
    return out


def _train(spec: Spec, files: list[str], bindings: list[str], log_path: Path):
    """One `t5lite train`; None on success, else (return code, last lines of its output)."""
    command = list(spec.command) or [sys.executable, "-m", "t5lite.cli"]
    argv = [*command, "train", *(f"--gin_file={f}" for f in files), *(_flag(b) for b in bindings)]
    with open(log_path, "a") as log:   # a rerun adds to it: a resumed stage keeps its first start's lines
        code = subprocess.call(argv, stdout=log, stderr=subprocess.STDOUT)
    if code == 0:
        return None
    return code, log_path.read_text(errors="replace").splitlines()[-ERROR_TAIL_LINES:]


def read_metrics(run_dir: Path) -> list[dict]:
    """A run directory's metrics (t5lite.train.summaries.read_metrics); none before it logs."""
    path = RunDir(run_dir).metrics
    return summaries.read_metrics(str(path)) if path.exists() else []


def _last_logged_step(run_dir: Path) -> int:
    """The last step a run logged: `t5lite train` logs its final step, and exits 0 also when a
    SIGTERM or SIGINT stopped it earlier (with a checkpoint to resume from)."""
    return max((int(m.get("step", 0)) for m in read_metrics(run_dir)), default=0)


def _flag(binding: str) -> str:
    name, value = (part.strip() for part in binding.split("=", 1))
    return f"--gin.{name}={value}"
