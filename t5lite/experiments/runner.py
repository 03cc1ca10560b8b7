"""Runs a sweep's cells as `t5lite train` subprocesses, several at once: per cell and seed,
pre-train, then fine-tune on each task from the pre-trained checkpoint (evaluating at the end).

Each (cell, seed) is a folder of normal run directories under the sweep's folder. `done.json`,
written atomically last, marks it finished, so a rerun skips it; a killed run resumes its run
directories (`t5lite train` resumes from its latest checkpoint). A failing stage writes
`error.json` with its output's last lines and stops that cell only; a stage that a signal stopped
before its last step (it exits 0, with a checkpoint) stops its cell unfinished, not done.

Each `t5lite train` runs in its own process group and dies with the sweep: a SIGTERM, SIGINT or
SIGHUP to the sweep stops every running train (they save their step) and starts no more, and on
Linux the kernel sends a train SIGTERM when its sweep dies, even by kill -9, so no orphan goes on
training and holding its run directory's lock against the rerun.

While it runs, the sweep says which (cell, seed) of how many each line is about, the running
stage's last logged step, and, once a (cell, seed) has finished, about how long the rest will take.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from t5lite import finite
from t5lite.errors import ConfigError
from t5lite.experiments.spec import Cell, Spec
from t5lite.run_layout import RunDir
from t5lite.train import summaries

ERROR_TAIL_LINES = 15
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
POLL_SECONDS = 1.0       # how often a running stage's metrics.jsonl is read for its step
PROGRESS_SECONDS = 30.0  # at most one step line per running stage this often (its first at once)
# What runs between the sweep and each train on Linux: a fresh interpreter (the sweep's threaded,
# JAX-holding process is never forked into Python code) asks the kernel to SIGTERM it when the
# sweep dies, gives up if the sweep already has, then becomes the train (exec keeps that request).
DIE_WITH_SWEEP = ("import ctypes, os, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGTERM); "
                  "os.getppid() == int(sys.argv[1]) or sys.exit(1); os.execvp(sys.argv[2], sys.argv[2:])")


def say(line: str) -> None:
    """The sweep's console line, flushed: progress must show when stdout is a pipe or a file."""
    print(line, flush=True)


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
    """The sweep got one of STOP_SIGNALS (the signal's name is the message): its cells end unfinished."""


class Children:
    """The `t5lite train` processes a sweep runs. While `handling_signals`, a STOP_SIGNALS signal to
    the sweep sends SIGTERM to each one's process group and lets no new one start."""

    def __init__(self):
        self.running: set[subprocess.Popen] = set()
        self.lock = threading.RLock()   # re-entrant: a second signal may arrive inside stop()
        self.stopped_by: str | None = None

    def call(self, argv: list[str], log, while_running=lambda: None) -> int:
        """Runs argv to its end (output to the file `log`), calling `while_running` every
        POLL_SECONDS meanwhile, and returns its exit code."""
        with self.lock:
            if self.stopped_by:
                raise Stopped(self.stopped_by)
            child = subprocess.Popen(_dying_with_sweep(argv), stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
            self.running.add(child)
        try:
            while (code := _wait(child, POLL_SECONDS)) is None:
                while_running()
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
        """STOP_SIGNALS stop the children while inside (the main thread's handlers, restored after)."""
        previous = {number: signal.signal(number, self.stop) for number in STOP_SIGNALS}
        try:
            yield self
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)


def _wait(child: subprocess.Popen, seconds: float) -> int | None:
    """The child's exit code once it ends, or None after `seconds` while it still runs."""
    try:
        return child.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        return None


def _dying_with_sweep(argv: list[str]) -> list[str]:
    """argv run through DIE_WITH_SWEEP on Linux (PR_SET_PDEATHSIG), so even a kill -9 of the sweep
    leaves no orphan; elsewhere argv itself."""
    if not sys.platform.startswith("linux"):
        return argv
    return [sys.executable, "-c", DIE_WITH_SWEEP, str(os.getpid()), *argv]


class Progress:
    """The sweep's console lines: `[k/n] cell seed s: ...` for the k-th of the n (cell, seed) pairs
    this run starts, and after each finished pair, the time left at the finished pairs' mean pace."""

    def __init__(self, total: int, workers: int, log):
        self.total, self.workers, self.log = total, workers, log
        self.finished_seconds: list[float] = []
        self.lock = threading.Lock()

    def teller(self, number: int, cell: Cell, seed: int):
        """What one (cell, seed) says its lines through."""
        return lambda text: self.log(f"[{number}/{self.total}] {cell.name} seed {seed}: {text}")

    def finished(self, tell, status: str, seconds: float) -> None:
        with self.lock:
            self.finished_seconds.append(seconds)
            left = self.total - len(self.finished_seconds)
            pace = sum(self.finished_seconds) / len(self.finished_seconds)
        eta = f"; {left} to go, about {duration(pace * math.ceil(left / self.workers))} left" if left else ""
        tell(f"{status} after {duration(seconds)}{eta}")


def duration(seconds: float) -> str:
    """A wall time as a person reads it: 42 s, 3.5 min, 2.1 h."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def run_sweep(spec: Spec, out: Path, parallel: int | None = None, log=say) -> None:
    """Runs every unfinished (cell, seed), `parallel` (default: the scale's) at a time, saying how
    each goes. Stopped by a STOP_SIGNALS signal, it waits for the running trains to save and exits
    with 128 + the signal."""
    _check_inputs(spec)
    out.mkdir(parents=True, exist_ok=True)
    # A cell that fine-tunes from another's pre-training comes after every cell that pre-trains: the
    # pool starts jobs in order, so its source has started (and it can wait for it) before it does.
    jobs = [(cell, seed) for cell in sorted(spec.cells, key=lambda c: c.pretrain_from is not None) for seed in spec.seeds]
    todo = [(c, s) for c, s in jobs if not is_done(out, c, s) or _unmeasured(spec, c, s, cell_dir(out, c, s))]
    ended = {(c.name, s): threading.Event() for c, s in todo}
    to_probe = sum(is_done(out, c, s) for c, s in todo)
    log(f"sweep {spec.name} ({spec.scale}): {len(jobs)} cell runs, {len(jobs) - len(todo)} already done"
        + (f", {to_probe} trained but not yet measured by every lens" if to_probe else ""))
    workers = max(1, parallel or spec.parallel)
    progress = Progress(len(todo), workers, log)

    def run(number: int, cell: Cell, seed: int) -> None:
        tell, started = progress.teller(number, cell, seed), time.time()
        try:
            if (source := ended.get((cell.pretrain_from, seed))) is not None:
                source.wait()
            status = run_cell(spec, out, cell, seed, children, tell)
        finally:
            ended[(cell.name, seed)].set()
        if children.stopped_by:
            tell(status)
        else:
            progress.finished(tell, status, time.time() - started)

    with Children().handling_signals() as children, ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(run, range(1, len(todo) + 1), *zip(*todo)))
    if children.stopped_by:
        log(f"sweep stopped by {children.stopped_by}; run the same command again to resume")
        raise SystemExit(128 + signal.Signals[children.stopped_by].value)


def run_cell(spec: Spec, out: Path, cell: Cell, seed: int, children: Children, tell=lambda text: None) -> str:
    """Pre-trains and fine-tunes one (cell, seed), telling each stage's steps as they are logged;
    'done', or the failed or stopped stage's name."""
    if children.stopped_by:
        return f"not started ({children.stopped_by})"
    folder = cell_dir(out, cell, seed)
    if cell.pretrain_from:
        source = spec.cell(cell.pretrain_from)
        if _last_logged_step(cell_dir(out, source, seed) / "pretrain") < spec.pretrain_steps(source):
            return f"not started: it fine-tunes from {source.name}'s pre-training, which has not finished for seed {seed}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "error.json").unlink(missing_ok=True)
    steps = spec.pretrain_steps(cell)
    done = read_json(folder / "done.json")
    seconds = done.get("wall_seconds", {}) if isinstance(done, dict) else {}
    for stage, files, bindings in stages(spec, cell, seed, folder):
        run_dir = folder / stage
        wanted = steps if stage == "pretrain" else spec.finetune_steps
        if stage in seconds and _last_logged_step(run_dir) >= wanted:
            continue   # finished in an earlier run of the sweep (which had fewer lenses)
        tell(f"{stage}, {wanted} steps")
        started = time.time()
        try:
            result = _train(spec, files, [*bindings, f"MODEL_DIR = '{run_dir}'"], folder / f"{stage}.log", children,
                            _step_teller(run_dir, stage, wanted, tell))
        except Stopped as signal_name:
            return f"stopped in {stage} by {signal_name} (run the sweep again to resume)"
        seconds[stage] = time.time() - started
        if result is not None:
            write_json_atomic(folder / "error.json", {"stage": stage, "returncode": result[0], "tail": result[1]})
            return f"FAILED in {stage} (see {folder / 'error.json'})"
        if (reached := _last_logged_step(run_dir)) < wanted:
            return f"stopped in {stage} at step {reached} of {wanted} (a signal; run the sweep again to resume)"
        if stage == "pretrain" and (failed := _probe(spec, cell, folder, children, tell)):
            return failed
    if _unprobed(spec, cell, folder) and (failed := _probe(spec, cell, folder, children, tell)):
        return failed
    if _forgetting_unmeasured(spec, cell, seed, folder) and (failed := _measure_forgetting(spec, cell, seed, folder,
                                                                                           children, tell)):
        return failed
    write_json_atomic(folder / "done.json", {
        "cell": cell.name, "seed": seed, "pretrain_steps": steps, "pretrain_tokens_budget": spec.pretrain_tokens,
        "pretrain_tokens": steps * spec.batch_size * cell.tokens_per_row, "batch_size": spec.batch_size,
        "finetune_steps": spec.finetune_steps, "wall_seconds": seconds})
    return "done"


def stages(spec: Spec, cell: Cell, seed: int, folder: Path) -> list[tuple[str, list[str], list[str]]]:
    """(stage name, gin files, bindings) of each `t5lite train` a (cell, seed) runs, in order:
    pre-training (evaluating its task's validation split at the last step where the sweep has
    lenses), then fine-tuning on each task (column) from its checkpoint (of a cell with
    `pretrain_from`, the checkpoint of that cell's run of the same seed; of one with `start_from`, that
    checkpoint), or from scratch for a cell without pre-training (MODEL_DIR not yet bound)."""
    steps = spec.pretrain_steps(cell)
    lens_eval = [f"train.eval_every = {steps}", f"train.eval_max_examples = {spec.pretrain_eval_examples}"] if spec.eval_lenses else []
    out = [("pretrain", list(cell.pretrain), [
        *cell.bindings, *spec.scale_bindings, f"TRAIN_STEPS = {steps}",
        f"BATCH_SIZE = {spec.batch_size}", f"train.seed = {seed}", *lens_eval])] if cell.pretrain else []
    start = f"'{cell.start(folder, seed)}'" if cell.start(folder, seed) else "None"
    for task in spec.tasks:
        out.append((f"finetune_{task}", list(cell.finetune), [
            *spec.variant_bindings(task), *cell.finetune_bindings_for(task),
            f"MIXTURE_OR_TASK_NAME = '{cell.task_prefix}{spec.registered_task(task)}'",
            f"INITIAL_CHECKPOINT_PATH = {start}", f"TRAIN_STEPS = {spec.finetune_steps}",
            f"BATCH_SIZE = {spec.finetune_batch_size}", f"EVAL_EVERY = {spec.finetune_steps}",
            f"train.eval_max_examples = {spec.eval_max_examples}", f"train.seed = {seed}",
            f"train.checkpoint_every = {spec.finetune_steps}", *spec.scale_bindings,
            *([f"DATA_DIR = '{spec.data_dir}'"] if spec.data_dir else [])]))
    return out


def _check_inputs(spec: Spec) -> None:
    """A probe lens's UD files, the cells' `start_from` and `probe_model` paths and, for a forgetting
    lens, a `start_from`'s config.gin exist before any training starts, so a wrong path costs no run."""
    from t5lite.analysis.probe import SPLITS
    for probe in dict.fromkeys(spec.probe_lenses.values()):
        pattern, *splits = SPLITS[probe]
        missing = [pattern.format(split) for split in splits if not (Path(spec.probe_data_dir) / pattern.format(split)).is_file()]
        if missing:
            raise ConfigError(f"sweep.probe_data_dir {spec.probe_data_dir} holds no {', '.join(missing)} for the {probe} "
                              "probe lens: download UD English-EWT there (docs/guides/data.md) or point UD_DIR at it")
    for cell in spec.cells:
        for key, path in (("start_from", cell.start_from), ("probe_model", spec.probe_lenses and cell.probe_model)):
            if path and not Path(path).exists():
                raise ConfigError(f"sweep {spec.name!r} cell {cell.name!r}: its {key} {path} does not exist; write it "
                                  "there first (the sweep file says how) or point its macro elsewhere")
        if spec.forgetting_lenses and cell.start_from and not RunDir(cell.start_from).config_gin.is_file():
            raise ConfigError(f"sweep {spec.name!r} cell {cell.name!r}: its start_from {cell.start_from} has no "
                              "config.gin, which the forgetting lens evaluates the base's pre-training task with; "
                              "give the run folder a `t5lite train` pre-training wrote")


def probe_dir(folder: Path, probe: str) -> Path:
    return folder / f"probe_{probe}"


def _unmeasured(spec: Spec, cell: Cell, seed: int, folder: Path) -> bool:
    """Whether a lens of the sweep that measures this (cell, seed) after training has no result yet."""
    return _unprobed(spec, cell, folder) or _forgetting_unmeasured(spec, cell, seed, folder)


def forgetting_report(spec: Spec, folder: Path) -> Path:
    """Where `t5lite eval --forgetting` writes the forgetting of a (cell, seed)'s fine-tuning on the
    sweep's forgetting task."""
    return RunDir(folder / f"finetune_{spec.forgetting_task}").evaluations / "forgetting.json"


def _forgetting_unmeasured(spec: Spec, cell: Cell, seed: int, folder: Path) -> bool:
    """Whether the sweep has a forgetting lens and this (cell, seed), fine-tuned from a base, has no
    forgetting report yet."""
    return bool(spec.forgetting_lenses) and cell.start(folder, seed) is not None and not isinstance(
        read_json(forgetting_report(spec, folder)), dict)


def _measure_forgetting(spec: Spec, cell: Cell, seed: int, folder: Path, children: Children, tell) -> str | None:
    """`t5lite eval --forgetting` of the fine-tuning on the forgetting task, with its base's own
    config.gin (the base's pre-training task and held-out split); None, or why the (cell, seed) stopped."""
    base = cell.start(folder, seed)
    tell(f"forgetting after {spec.forgetting_task}")
    args = ["eval", "--forgetting", f"--forgetting_base={base}", f"--gin_file={RunDir(base).config_gin}",
            f"--gin.CHECKPOINT_PATH='{folder / f'finetune_{spec.forgetting_task}'}'",
            *([f"--gin.eval.max_examples={spec.pretrain_eval_examples}"] if spec.pretrain_eval_examples else [])]
    try:
        result = _run_cli(spec, args, folder / "forgetting.log", children)
    except Stopped as signal_name:
        return f"stopped in the forgetting evaluation by {signal_name} (run the sweep again to resume)"
    if result is not None:
        write_json_atomic(folder / "error.json", {"stage": "forgetting", "returncode": result[0], "tail": result[1]})
        return f"FAILED in the forgetting evaluation (see {folder / 'error.json'})"
    return None


def _unprobed(spec: Spec, cell: Cell, folder: Path) -> bool:
    """Whether a probe lens of the sweep has no result in this (cell, seed)'s folder yet, for a cell
    with something to probe (its pre-training or its `probe_model`)."""
    return bool(cell.probed_model(folder)) and any(not isinstance(read_json(probe_dir(folder, probe) / "probe.json"), dict)
                                       for probe in spec.probe_lenses.values())


def _probe(spec: Spec, cell: Cell, folder: Path, children: Children, tell) -> str | None:
    """`t5lite probe` of the cell's probed model (`Cell.probed_model`) for each probe lens still
    without a result; None, or why the (cell, seed) stopped."""
    model = cell.probed_model(folder)
    for probe in dict.fromkeys(spec.probe_lenses.values() if model else ()):
        out = probe_dir(folder, probe)
        if isinstance(read_json(out / "probe.json"), dict):
            continue
        shutil.rmtree(out, ignore_errors=True)   # a probe stopped part-way: `t5lite probe` wants a new folder
        tell(f"{probe} probe")
        args = ["probe", "--model", model, "--name", cell.name, "--data_dir",
                str(spec.probe_data_dir), "--probes", probe, "--out", str(out)]
        try:
            result = _run_cli(spec, args, folder / f"probe_{probe}.log", children)
        except Stopped as signal_name:
            return f"stopped in the {probe} probe by {signal_name} (run the sweep again to resume)"
        if result is not None:
            write_json_atomic(folder / "error.json", {"stage": f"probe_{probe}", "returncode": result[0],
                                                      "tail": result[1]})
            return f"FAILED in the {probe} probe (see {folder / 'error.json'})"
    return None


def _step_teller(run_dir: Path, stage: str, wanted: int, tell):
    """A `while_running` callback: tells the stage's last logged step when it has moved, the first
    time at once, then at most every PROGRESS_SECONDS."""
    started, last = time.time(), {"step": 0, "told": -math.inf}

    def tell_step() -> None:
        now = time.time()
        if now - last["told"] >= PROGRESS_SECONDS and (step := _last_logged_step(run_dir)) > last["step"]:
            last.update(step=step, told=now)
            tell(f"{stage} step {step} of {wanted} ({duration(now - started)})")
    return tell_step


def _train(spec: Spec, files: list[str], bindings: list[str], log_path: Path, children: Children,
           while_running=lambda: None):
    """One `t5lite train`; None on success, else (return code, last lines of its output)."""
    return _run_cli(spec, ["train", *(f"--gin_file={f}" for f in files), *(_flag(b) for b in bindings)], log_path,
                    children, while_running)


def _run_cli(spec: Spec, args: list[str], log_path: Path, children: Children, while_running=lambda: None):
    """One `t5lite` command (`sweep.command` in place of `python -m t5lite.cli`); None on success, else
    (return code, last lines of its output)."""
    argv = [*(list(spec.command) or [sys.executable, "-m", "t5lite.cli"]), *args]
    with open(log_path, "a") as log:   # a rerun adds to it: a resumed stage keeps its first start's lines
        code = children.call(argv, log, while_running)
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
