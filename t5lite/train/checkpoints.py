"""Orbax checkpoints of the whole train state plus every host's data position.

The data position is the loader's `state()` (t5lite.data.loader): a few numbers (block and offset
for a grain-read task, examples consumed for a streamed one), the same size at step 10 and 10^6.
The hosts' positions are gathered into one JSON item keyed by process index, and each host
restores its own.

Saves are asynchronous (training continues while the arrays are written) and atomic: orbax
writes into a temporary directory and renames it when complete, so a crash mid-save leaves the
previous checkpoint as the latest readable one; a full disk is one `CheckpointError` naming the
directory and the last complete step, which orbax keeps (it removes old steps only after a new
one is committed). A step that is complete but damaged later (truncated, garbled or deleted
file, bad metadata: `is_corruption`) is named with the reason, moved aside to
`damaged_checkpoints/` next to `checkpoints/` (never deleted), and the run resumes from the
newest step that reads; any other error while restoring (out of memory, an I/O error, storage
unavailable) propagates and moves nothing. Reading them back is
`t5lite.infer.checkpoint_reader` (a lower floor, since inference and conversion read checkpoints
too).
"""
from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import sys
import time
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils

from t5lite import storage
from t5lite.errors import CheckpointError
from t5lite.run_layout import RunDir

log = logging.getLogger("t5lite")

# Room for one host's data position as JSON when the hosts exchange them before a save.
_MAX_POSITION_BYTES = 4096

# TensorStore reports every problem as a ValueError. Its status codes for a condition of the
# storage (not of the files' content), and an OS error other than a missing file, mean "not damaged".
_STORAGE_CONDITION = re.compile(r"\b(UNAVAILABLE|DEADLINE_EXCEEDED|RESOURCE_EXHAUSTED|ABORTED|CANCELLED|"
                                r"PERMISSION_DENIED|UNAUTHENTICATED)\b|os_error_code='(?!2')|\[OS error (?!2:)")
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class Checkpointer:
    def __init__(self, directory: str, save_every: int, keep: int = 3, async_save: bool = True):
        self.directory = storage.absolute(directory)
        options = ocp.CheckpointManagerOptions(save_interval_steps=save_every, max_to_keep=keep,
                                               enable_async_checkpointing=async_save, create=True)
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_handlers={
            "state": ocp.StandardCheckpointHandler(), "data": ocp.JsonCheckpointHandler()})
        self._quiet, self._disk_full = _QuietFailedSaves(), False
        self._quiet.start()

    def due(self, step: int) -> bool:
        """Whether `save(step, ...)` would save (every `save_every` steps)."""
        return self.manager.should_save(step)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def reached_preemption(self, step: int) -> bool:
        """True on every host at the same step once any host got a preemption notice (multi-host)."""
        return self.manager.reached_preemption(step)

    def save(self, step: int, state: Any, data_state: dict, force: bool = False) -> bool:
        """Saves if `step` is due (or `force`); `data_state` is this host's data position.

        Orbax writes a JSON item from the primary host only, so the hosts first exchange their
        positions and the item holds all of them, keyed by process index."""
        if not (force or self.due(step)):
            return False
        positions = _positions_of_all_processes(data_state)
        with self._disk_full_is_reported():  # an async save's failure surfaces at the next save
            return self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                                   data=ocp.args.JsonSave(positions)), force=True)

    def restore(self, abstract_state: Any, step: int | None = None) -> tuple[Any, dict, int]:
        """The state (laid out as `abstract_state`'s shardings), this host's data position, the step."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"no checkpoint in {self.directory}")
        restored = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()))
        return restored.state, _position_of_this_process(restored.data, step), step

    def restore_newest_readable(self, abstract_state: Any) -> tuple[Any, dict, int]:
        """Restores the newest step that reads; newer damaged steps are named and moved aside."""
        damaged = []
        for step in sorted(self.manager.all_steps(), reverse=True):
            try:
                self._check_same_params(abstract_state, step)
                restored = self.restore(abstract_state, step)
            except CheckpointError:
                raise
            except Exception as e:
                if not is_corruption(e):
                    raise
                reason = _one_line(e)
                log.warning("checkpoint step %d in %s is damaged and is skipped: %s", step, self.directory, reason)
                damaged.append((step, reason))
                continue
            for bad_step, _ in damaged:
                self._set_aside(bad_step)
            if damaged:
                self.manager.reload()
                log.warning("resuming from step %d, the newest readable checkpoint", step)
            return restored
        raise CheckpointError(f"no checkpoint in {self.directory} can be read: " +
                              "; ".join(f"step {s}: {r}" for s, r in damaged) +
                              ". Nothing was changed; restore the files or start over in a new MODEL_DIR.")

    def _check_same_params(self, abstract_state: Any, step: int) -> None:
        """Parameters of another model are a mismatch to report, not damage to skip."""
        try:
            stored = self.manager.item_metadata(step).state
        except (KeyError, TypeError, AttributeError) as e:  # JSON that parses, but not as orbax wrote it
            raise ValueError(f"the metadata does not parse ({_one_line(e)})") from e
        if stored is None or "params" not in stored:
            raise FileNotFoundError("the `state` item or its parameters are missing")
        params = abstract_state["params"] if isinstance(abstract_state, dict) else abstract_state.params
        expected, found = _param_shapes(params), _param_shapes(stored["params"])
        if expected != found:
            differences = [f"{k}: {found.get(k, 'missing')} in the checkpoint, {expected.get(k, 'none')} in this "
                           "model" for k in sorted(set(expected) | set(found)) if expected.get(k) != found.get(k)]
            raise CheckpointError(f"checkpoint step {step} in {self.directory} holds parameters of another model "
                                  f"({'; '.join(differences[:3])}{'; ...' if len(differences) > 3 else ''}). Use "
                                  "a new MODEL_DIR, or start from its parameters with INITIAL_CHECKPOINT_PATH")

    def _set_aside(self, step: int) -> None:
        """Moves a damaged step out of orbax's way (a later save of that step would be skipped)."""
        target = RunDir(epath.Path(self.directory).parent).damaged_checkpoints / f"{step}-{int(time.time())}"
        if jax.process_index() == 0:
            storage.rename(epath.Path(self.directory, str(step)), target)
            log.warning("moved the damaged step %d to %s", step, target)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(f"t5lite_set_aside_{step}")

    @contextlib.contextmanager
    def _disk_full_is_reported(self):
        try:
            yield
        except Exception as e:
            if not is_disk_full(e):
                raise
            self._disk_full = True
            # The steps on disk: orbax stops tracking the step it rotates out when a save starts, but
            # deletes its files only once the new step is committed.
            self.manager.reload()
            last = self.latest_step()
            kept = (f"the last complete checkpoint, step {last}, is kept" if last is not None
                    else "no checkpoint is complete")
            raise CheckpointError(f"no space left on {self.directory}: a checkpoint could not be written; {kept}. "
                                  "Free space there (or move MODEL_DIR), then rerun the same command to resume"
                                  ) from None

    def wait(self) -> None:
        with self._disk_full_is_reported():
            self.manager.wait_until_finished()

    def close(self) -> None:
        """Waits for the last save, then releases orbax's threads. Orbax raises a failed save's
        error again on every wait; a full disk already reported is not raised twice."""
        reported = self._disk_full
        try:
            self.wait()
        except CheckpointError:
            if not reported:
                raise
        finally:
            try:
                self.manager.close()
            except Exception as e:
                if not is_disk_full(e):
                    raise
            finally:
                self._quiet.stop()


def is_corruption(error: BaseException) -> bool:
    """Whether a restore failed because the step's files are damaged: missing (FileNotFoundError),
    undecodable JSON, or a TensorStore/orbax ValueError about their content (DATA_LOSS, OUT_OF_RANGE
    for a truncated file, NOT_FOUND, bad metadata). Orbax wraps a failed array read in a plain
    Exception, so the causes count too; any storage condition among them (an OSError such as
    ENOSPC or EIO, MemoryError, TensorStore's UNAVAILABLE, RESOURCE_EXHAUSTED, ...) means not."""
    causes = []
    while error is not None and error not in causes:
        causes.append(error)
        error = error.__cause__
    if any(_is_transient(e) for e in causes):
        return False
    return any(isinstance(e, (FileNotFoundError, NotADirectoryError, ValueError)) for e in causes)


def _is_transient(error: BaseException) -> bool:
    """A condition of the machine or the storage (it may pass), not of the step's files."""
    if isinstance(error, (FileNotFoundError, NotADirectoryError)):
        return False
    if isinstance(error, (OSError, MemoryError)):
        return True
    return isinstance(error, ValueError) and bool(_STORAGE_CONDITION.search(str(error)))


def is_disk_full(error: BaseException) -> bool:
    """ENOSPC (or a full quota), as an OSError or in TensorStore's message, anywhere among the causes."""
    seen = []
    while error is not None and error not in seen:
        seen.append(error)
        if isinstance(error, OSError) and error.errno in _DISK_FULL:
            return True
        if any(os.strerror(code) in str(error) for code in _DISK_FULL):
            return True
        error = error.__cause__ or error.__context__
    return False


class _QuietFailedSaves(logging.Filter):
    """A save that fails on a full disk makes orbax log a traceback per thread, and TensorStore's
    late callbacks hit orbax's closed event loop ("unraisable" RuntimeErrors): hundreds of lines.
    While a Checkpointer is open they are dropped; the full disk is reported once, as a
    CheckpointError."""

    def start(self) -> None:
        logging.getLogger("absl").addFilter(self)  # orbax logs through absl
        self._hook, sys.unraisablehook = sys.unraisablehook, self._unraisable

    def stop(self) -> None:
        logging.getLogger("absl").removeFilter(self)
        if sys.unraisablehook == self._unraisable:
            sys.unraisablehook = self._hook

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not (is_disk_full(error) if error is not None else
                    any(os.strerror(code) in record.getMessage() for code in _DISK_FULL))

    def _unraisable(self, unraisable) -> None:
        error = unraisable.exc_value
        if not (isinstance(error, RuntimeError) and str(error) == "Event loop is closed"):
            self._hook(unraisable)


def _param_shapes(params: Any) -> dict[str, tuple]:
    return {"/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path): tuple(x.shape)
            for path, x in jax.tree_util.tree_leaves_with_path(params)}


def _one_line(error: Exception) -> str:
    first = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {first[:300]}"


def _positions_of_all_processes(data_state: dict) -> dict[str, dict]:
    """{process index: that host's data position}, the same on every host (an allgather)."""
    if jax.process_count() == 1:
        return {"0": data_state}
    encoded = json.dumps(data_state).encode()
    if len(encoded) > _MAX_POSITION_BYTES:
        raise ValueError(f"data position of {len(encoded)} bytes exceeds {_MAX_POSITION_BYTES}: {data_state}")
    padded = np.frombuffer(encoded.ljust(_MAX_POSITION_BYTES), np.uint8)
    gathered = np.asarray(multihost_utils.process_allgather(padded))
    return {str(i): json.loads(bytes(row).decode()) for i, row in enumerate(gathered)}


def _position_of_this_process(positions: dict, step: int) -> dict:
    index = str(jax.process_index())
    if not isinstance(positions, dict):
        raise ValueError(f"the `data` item holds {type(positions).__name__}, not the hosts' data positions")
    if index not in positions:
        raise CheckpointError(f"checkpoint step {step} holds the data positions of processes {sorted(positions)}, "
                              f"not of this process ({index}); resume on as many hosts as wrote it")
    return positions[index]
