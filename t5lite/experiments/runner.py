"""Runs a sweep's cells as `t5lite train` subprocesses, several at once: per cell and seed,
pre-train, then fine-tune on each task from the pre-trained checkpoint (evaluating at the end).

Each (cell, seed) is a folder of normal run directories under the sweep's folder. `done.json`,
written atomically last, marks it finished, so a rerun skips it; a killed run resumes its run
directories (`t5lite train` resumes from its latest checkpoint). A failing stage writes
`error.json` with its output's last lines and stops that cell only; a stage that a signal stopped
before its last step (it exits 0, with a checkpoint) stops its cell unfinished, not done.

Each `t5lite train` runs in its own process group and dies with the sweep: a SIGTERM or SIGINT to
the sweep stops every running train (they save their step) and starts no more, and on Linux the
kernel sends a train SIGTERM when its sweep dies, even by kill -9, so no orphan goes on training
and holding its run directory's lock against the rerun.
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from t5lite import finite
from t5lite.experiments.spec import Cell, Spec
from t5lite.run_layout import RunDir
from t5lite.train import summaries

ERROR_TAIL_LINES = 15


def cell_dir(out: Path, cell: Cell, seed: int) -> Path:
    return out / f"{cell.name}__seed{seed}"


def write_json_atomic(path: Path, value) -> None:
    """Writes then renames, so a reader (or a rerun after kill -9) never sees half a file. An
    undefined number (NaN: a seed without an eval, the interval of one seed) is written as null."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(finite.dumps(finite.null_non_finite(value), indent=1, sort_keys=True))
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


class Stopped(Exception):
    """The sweep got SIGTERM or SIGINT (the signal's name is the message): its cells end unfinished."""


class Children:
    """The `t5lite train` processes a sweep runs. While `handling_signals`, a SIGTERM or SIGINT to
    the sweep sends SIGTERM to each one's process group and lets no new one start."""

    def __init__(self):
        self.running: set[subprocess.Popen] = set()
        self.lock = threading.RLock()   # re-entrant: a second signal may arrive inside stop()
        self.stopped_by: str | None = None

    def call(self, argv: list[str], log) -> int:
        """Runs argv to its end (output to the file `log`) and returns its exit code."""
        with self.lock:
            if self.stopped_by:
                raise Stopped(self.stopped_by)
            child = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=_die_with_parent(os.getpid()))
            self.running.add(child)
        try:
            code = child.wait()
        finally:
            with self.lock:
                self.running.discard(child)
        if self.stopped_by:
            raise Stopped(self.stopped_by)
        return code

    def stop(self, signum: int, frame=None) -> None:
        """A signal handler: stops the running children's process groups and starts no more."""
        with self.lock:
            self.stopped_by = signal.Signals(signum).name
            for child in self.running:
                try:
                    os.killpg(child.pid, signal.SIGTERM)
                except ProcessLookupError:   # it ended meanwhile
                    pass

    @contextlib.contextmanager
    def handling_signals(self):
        """SIGTERM and SIGINT stop the children while inside (the main thread's handlers, restored after)."""
        previous = {number: signal.signal(number, self.stop) for number in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield self
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)


def _die_with_parent(parent: int):
    """A preexec_fn asking the kernel to send the child SIGTERM when the sweep dies, kill -9 included
    (Linux's PR_SET_PDEATHSIG; elsewhere None). prctl is looked up before the fork, so the child only
    calls it; a sweep that died before that call has left an orphan, which exits at once."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    pr_set_pdeathsig, sigterm = 1, int(signal.SIGTERM)

    def preexec() -> None:
        prctl(pr_set_pdeathsig, sigterm)
        if os.getppid() != parent:
            os._exit(1)
    return preexec


def run_sweep(spec: Spec, out: Path, parallel: int | None = None, log=print) -> None:
    """Runs every unfinished (cell, seed), `parallel` (default: the scale's) at a time. Stopped by
    SIGTERM or SIGINT, it waits for the running trains to save and exits with 128 + the signal."""
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(cell, seed) for cell in spec.cells for seed in spec.seeds]
    todo = [(c, s) for c, s in jobs if not is_done(out, c, s)]
    log(f"sweep {spec.name} ({spec.scale}): {len(jobs)} cell runs, {len(jobs) - len(todo)} already done")
    with Children().handling_signals() as children, \
            ThreadPoolExecutor(max_workers=max(1, parallel or spec.parallel)) as pool:
        for cell, seed, status in pool.map(lambda job: (*job, run_cell(spec, out, *job, children)), todo):
            log(f"  {cell.name} seed {seed}: {status}")
    if children.stopped_by:
        log(f"sweep stopped by {children.stopped_by}; run the same command again to resume")
        raise SystemExit(128 + signal.Signals[children.stopped_by].value)


def run_cell(spec: Spec, out: Path, cell: Cell, seed: int, children: Children) -> str:
    """Pre-trains and fine-tunes one (cell, seed); 'done', or the failed or stopped stage's name."""
    if children.stopped_by:
        return f"not started ({children.stopped_by})"
    folder = cell_dir(out, cell, seed)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "error.json").unlink(missing_ok=True)
    steps = spec.pretrain_steps(cell)
    seconds = {}
    for stage, files, bindings in stages(spec, cell, seed, folder):
        run_dir = folder / stage
        started = time.time()
        try:
            result = _train(spec, files, [*bindings, f"MODEL_DIR = '{run_dir}'"], folder / f"{stage}.log", children)
        except Stopped as signal_name:
            return f"stopped in {stage} by {signal_name} (run the sweep again to resume)"
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


def _train(spec: Spec, files: list[str], bindings: list[str], log_path: Path, children: Children):
    """One `t5lite train`; None on success, else (return code, last lines of its output)."""
    command = list(spec.command) or [sys.executable, "-m", "t5lite.cli"]
    argv = [*command, "train", *(f"--gin_file={f}" for f in files), *(_flag(b) for b in bindings)]
    with open(log_path, "a") as log:   # a rerun adds to it: a resumed stage keeps its first start's lines
        code = children.call(argv, log)
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
