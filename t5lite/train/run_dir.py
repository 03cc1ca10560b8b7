"""Guards of a run directory: writable before anything compiles, one run at a time, same model.

- `ensure_writable` fails at start naming the path (orbax would otherwise fail the first save
  and then wait minutes for a directory that never appears).
- `RunLock` is a file `MODEL_DIR/RUN_LOCK` (a sweep's `--out/RUN_LOCK`) holding the host and pid
  of the run using the directory; a second run refuses at once, and a lock whose process is gone (same host, pid not
  alive) is taken over. Multi-host: process 0 takes it for the whole slice. It is created only if
  absent, on a gs:// MODEL_DIR too (`storage.create_if_absent`).
- `check_model_config` refuses to resume with a different model config unless the change is
  deliberate; `record_config` keeps every (re)start's config in `config_history/<step>-*` and
  the vocabulary's identity in `vocabulary.json` (checked by t5lite.data.vocab.check_identity).
"""
from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import socket

import jax
import numpy as np
from etils import epath
from jax.experimental import multihost_utils

from t5lite import storage
from t5lite.data import vocab as vocab_lib
from t5lite.errors import CheckpointError, ConfigError
from t5lite.models.config import ModelConfig, config_changes, load_config, save_config
from t5lite.run_layout import RunDir

log = logging.getLogger("t5lite")


def ensure_writable(path: str) -> None:
    """Creates `path` if needed and proves a file can be written in it (a local folder or gs://...)."""
    folder = epath.Path(path)
    probe = folder / f".t5lite-write-check-{socket.gethostname()}-{os.getpid()}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe.write_text("")
        probe.unlink()
    except Exception as e:  # OSError locally; the storage client's own errors for gs://
        raise CheckpointError(f"cannot write to {path!r} ({getattr(e, 'strerror', None) or e}); choose a MODEL_DIR "
                              "that can be written, or fix its permissions") from None


@contextlib.contextmanager
def writable_folders(*paths: str):
    """`ensure_writable` for each of `paths`; the folders this makes (parents too) are removed again
    when the block fails leaving them empty, so a refused first start leaves no empty folder behind."""
    created = []
    for path in map(epath.Path, paths):
        missing = list(itertools.takewhile(lambda folder: not folder.exists(), [path, *path.parents]))
        created += [folder for folder in reversed(missing) if folder not in created]
    try:
        for path in paths:
            ensure_writable(path)
        yield
    except BaseException:
        for folder in reversed(created):
            try:
                if folder.is_dir() and not any(folder.iterdir()):
                    folder.rmdir()
            except OSError:   # another host removed it, or it filled meanwhile: leave it
                pass
        raise


class RunLock:
    """Holds `MODEL_DIR/RUN_LOCK` while a run uses the directory (a context manager)."""

    def __init__(self, model_dir: str, flag: str = "MODEL_DIR"):
        self.path = str(RunDir(model_dir).lock)   # a sweep's --out folder is locked the same way
        self.flag = flag   # what the refusal tells the user to change
        self.owner = {"host": socket.gethostname(), "pid": os.getpid()}
        self.held = False

    def __enter__(self) -> "RunLock":
        error = self._acquire() if jax.process_index() == 0 else ""
        if jax.process_count() > 1:  # every host learns whether process 0 got it
            refused = multihost_utils.broadcast_one_to_all(np.int32(bool(error)))
            if refused and not error:
                error = f"{self.path} is held by another run (process 0 refused to start)"
        if error:
            raise CheckpointError(error)
        return self

    def __exit__(self, *exc) -> None:
        if self.held and self._read() == self.owner:
            self._remove()
        self.held = False

    def _acquire(self) -> str:
        """'' once the lock is ours, else why not."""
        for _ in range(2):  # a second try after clearing a stale lock
            if not storage.create_if_absent(self.path, json.dumps(self.owner)):
                holder = self._read()
                if holder is not None and not self._is_stale(holder):
                    return (f"{os.path.dirname(self.path)} is in use by another t5lite run (host "
                            f"{holder.get('host')}, pid {holder.get('pid')}); wait for it, stop it, or use another "
                            f"{self.flag}. If that run is gone (another host was deleted), remove {self.path}")
                log.warning("taking over the lock %s left by a run that is gone: %s", self.path, holder)
                self._remove()
                continue
            self.held = True
            return ""
        return f"could not take the lock {self.path}: another run took it at the same time"

    def _read(self) -> dict | None:
        """The holder, or None for a lock file that is empty or unreadable (a crash while writing it)."""
        try:
            return json.loads(epath.Path(self.path).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def _remove(self) -> None:
        try:
            epath.Path(self.path).unlink()
        except FileNotFoundError:
            pass

    def _is_stale(self, holder: dict) -> bool:
        if holder.get("host") != self.owner["host"]:
            return False  # another host's process can't be checked from here
        pid = int(holder.get("pid", -1))
        if pid == self.owner["pid"]:
            return True  # this process's own lock, left by an earlier train() that crashed
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False  # alive, owned by another user
        return _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    """A process that exited but was never reaped (a container whose init reaps no orphans) still
    answers os.kill(pid, 0); Linux's /proc says it is a zombie. Elsewhere: False."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def check_model_config(model_dir: str, config: ModelConfig, step: int, allow_config_change: bool) -> None:
    """Resuming (`step` > 0) with a model config that differs from the run's `model_config.json`
    is refused, naming each changed field, unless `allow_config_change` (then it is logged)."""
    current = RunDir(model_dir).model_config
    if step == 0 or not current.exists():
        return
    changes = config_changes(load_config(current), config)
    listed = ", ".join(f"{name}: {old!r} -> {new!r}" for name, (old, new) in changes.items())
    if changes and not allow_config_change:
        raise ConfigError(f"{model_dir} was trained to step {step} with another model config ({listed}). "
                          "Use a new MODEL_DIR, or continue with the change on purpose with "
                          "--gin.train.allow_config_change=True (recorded in config_history/)")
    if changes:
        log.warning("continuing from step %d with a changed model config: %s", step, listed)


def record_config(model_dir: str, config: ModelConfig, gin_config: str, step: int, vocabulary=None) -> None:
    """Writes the operative `model_config.json` and `config.gin`, and keeps a copy of each as
    `config_history/<step>-*` (the step this (re)start trains from), so no earlier config is lost.
    With `vocabulary`, its identity goes to `vocabulary.json` (t5lite.data.vocab.check_identity)."""
    if jax.process_index() != 0:
        return
    if vocabulary is not None:
        vocab_lib.record_identity(model_dir, vocabulary)
    run = RunDir(model_dir)
    run.config_history.mkdir(parents=True, exist_ok=True)
    operative = (run.model_config, run.config_gin)
    for model_config, config_gin in (operative, tuple(run.history(step, file.name) for file in operative)):
        save_config(config, model_config)
        config_gin.write_text(gin_config, encoding="utf-8")
