"""Nothing non-finite passes as a result.

The rule for model outputs (scores, log-likelihoods, logits, embeddings, hidden states): where any
is NaN or infinite, the command stops with one line naming the checkpoint and its step (exit code
2) and writes nothing. Such outputs come from parameters that diverged (a run stopped at its first
non-finite step keeps its last finite checkpoint, whose weights may be huge); no row of them
means anything, so none is written.

A metric can be undefined on finite outputs (Pearson's r of constant predictions): a metrics line
records it as null and lists it under "non_finite" (`flag_non_finite`). Every JSON t5lite writes
goes through `dumps` / `dump`, which refuse NaN and infinity (JSON has neither) instead of
writing a line other programs can't read.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
from typing import Any, Iterator, Mapping

import numpy as np

from t5lite.errors import CheckpointError

NON_FINITE = "non_finite"   # a metrics line's key: {name: "NaN" | "Infinity" | "-Infinity"} of its null values


class NonFiniteOutputError(CheckpointError):
    """A model's outputs hold NaN or infinity; names the checkpoint once `outputs_of` knows it."""

    def __init__(self, what: str, checkpoint: str | None = None):
        self.what, self.checkpoint = what, checkpoint
        super().__init__(f"{_describe(checkpoint)}the model's {what} are not finite (NaN or infinity): its "
                         "parameters diverged. Use an earlier checkpoint of the run (its checkpoints/<step> "
                         "folder) or retrain with a lower learning rate")


def _describe(checkpoint: str | None) -> str:
    if checkpoint is None:
        return ""
    step = os.path.basename(os.path.normpath(checkpoint))
    return f"{checkpoint} (step {step}): " if step.isdigit() else f"{checkpoint}: "


def require_finite(values, what: str, checkpoint: str | None = None) -> None:
    """Refuses model outputs (an array, or a list of arrays of different shapes: one per sentence)
    that hold NaN or infinity; `what` names them ("scores"), `checkpoint` (else `outputs_of`)
    where their parameters come from."""
    if not _all_finite(values):
        raise NonFiniteOutputError(what, checkpoint)


def _all_finite(values) -> bool:
    if isinstance(values, (list, tuple)):
        return all(map(_all_finite, values))
    return bool(np.isfinite(np.asarray(values)).all())


@contextlib.contextmanager
def outputs_of(checkpoint: str) -> Iterator[None]:
    """Names `checkpoint` (a step directory, whose name is its step) in the NonFiniteOutputError of
    outputs computed inside: the code that checks them need not know where the parameters came from."""
    try:
        yield
    except NonFiniteOutputError as error:
        if error.checkpoint is not None:
            raise
        raise NonFiniteOutputError(error.what, checkpoint) from None


def dumps(value: Any, *, default=None, **kwargs) -> str:
    """`json.dumps` that raises ValueError on NaN or infinity (numpy's too) instead of writing invalid JSON."""
    return json.dumps(value, allow_nan=False, default=_numpy_first(default), **kwargs)


def dump(value: Any, file, *, default=None, **kwargs) -> None:
    """`json.dump` that raises ValueError on NaN or infinity (numpy's too) instead of writing invalid JSON."""
    json.dump(value, file, allow_nan=False, default=_numpy_first(default), **kwargs)


def _numpy_first(default):
    """json's `default` hook: a numpy scalar as the Python number it is (so its NaN is refused too,
    not written as a string by `default=str`), anything else to `default`."""
    def encode(value):
        if isinstance(value, np.generic):
            return value.item()
        if default is None:
            raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
        return default(value)
    return encode


def _is_non_finite(value: Any) -> bool:
    return isinstance(value, (float, np.floating)) and not math.isfinite(value)


def flag_non_finite(record: Mapping[str, Any]) -> dict:
    """A metrics line JSON can hold: each NaN or infinite value null, and named with what it was
    under "non_finite" ({"loss": "NaN"}), so the line still says what happened."""
    flagged = {key: json.dumps(float(value)) for key, value in record.items() if _is_non_finite(value)}
    out = {key: None if key in flagged else value for key, value in record.items()}
    return {**out, NON_FINITE: flagged} if flagged else out


def null_non_finite(value: Any) -> Any:
    """`value` (nested dicts and lists) with each NaN or infinite number as None: for results in
    which such a number means "undefined" (a correlation over no sentence), never for model outputs."""
    if isinstance(value, Mapping):
        return {key: null_non_finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [null_non_finite(item) for item in value]
    return None if _is_non_finite(value) else value


def unflag_non_finite(record: Mapping[str, Any]) -> dict:
    """A line written by `flag_non_finite` as it was logged: its flagged values back as floats."""
    flagged = record.get(NON_FINITE) or {}
    return {key: float(flagged[key]) if key in flagged else value for key, value in record.items() if key != NON_FINITE}
