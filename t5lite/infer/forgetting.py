"""Catastrophic forgetting: a fine-tuned run scored on its base's pre-training task.

A fine-tuned run's weights are put into the base model's layout: every base parameter the run
also holds (of a task-head run, its backbone's; of a PEFT run, its base with the method applied,
LoRA merged) is the run's, and the rest (the MLM or sentence head a classifier run dropped) stay
the base's, as forgetting studies reuse the base's pre-training head. `t5lite eval --forgetting`
scores the base and the grafted run on the same held-out split and prints them side by side. On
the infer floor: it reads checkpoints only.
"""
from __future__ import annotations

import re

import jax
import numpy as np
from flax.traverse_util import flatten_dict, unflatten_dict

from t5lite.errors import CheckpointError
from t5lite.infer import checkpoint_reader, peft_checkpoint
from t5lite.run_layout import RunDir

# gin writes a long value on the next line after a `\`.
_INITIAL = re.compile(r"^(?:INITIAL_CHECKPOINT_PATH|train\.initial_checkpoint_path)\s*=\s*(?:\\\n\s*)?'([^']+)'\s*$",
                      re.M)
BACKBONE = ("backbone",)


def run_of(path: str) -> str:
    """The run directory of a run or one of its step directories."""
    return str(RunDir.of_step(checkpoint_reader.step_directory(path)))


def base_of(run: str) -> str:
    """The base a fine-tuned run started from: its PEFT record's base, else the initial checkpoint
    its config.gin names; refused in one line when neither is known."""
    run_dir = run_of(run)
    record = peft_checkpoint.read(run_dir)
    if record is not None:
        return record["base_checkpoint"]
    config = RunDir(run_dir).config_gin
    found = _INITIAL.findall(config.read_text(encoding="utf-8")) if config.exists() else []
    if not found:
        raise CheckpointError(f"{run_dir} names no base (no PEFT record, no INITIAL_CHECKPOINT_PATH in its "
                              "config.gin): give the run it was fine-tuned from with --forgetting_base=BASE_RUN")
    return found[-1]


def grafted(base_params, run: str):
    """`base_params` with each leaf that `run` also holds (`shared`) replaced by the run's, and the
    leaves a PEFT method adds beside them (adapters, which their layers apply when present); a leaf
    of another shape is another model's run."""
    step_dir, run_dir = checkpoint_reader.step_directory(run), run_of(run)
    flat_base = flatten_dict(base_params)
    record = peft_checkpoint.read(run_dir)
    held = shared(set(flat_base), run)
    wanted = {p: _abstract(flat_base[p]) for p in held}
    if record is not None:   # the base with the method applied (LoRA merged), laid out as asked
        tuned = flatten_dict(peft_checkpoint.restore_merged(step_dir, run_dir, record, unflatten_dict(wanted)))
    else:
        stored = flatten_dict(checkpoint_reader.stored_params(step_dir))
        prefix = BACKBONE if any(p[:1] == BACKBONE for p in stored) else ()
        for p in held:
            if tuple(stored[prefix + p].shape) != tuple(np.shape(flat_base[p])):
                raise CheckpointError(f"{run_dir}'s {'/'.join(p)} has shape {tuple(stored[prefix + p].shape)}, the "
                                      f"base's {tuple(np.shape(flat_base[p]))}: another model's run")
        restored = checkpoint_reader.restore_params(step_dir, unflatten_dict({prefix + p: a for p, a in wanted.items()}))
        tuned = {p[len(prefix):]: x for p, x in flatten_dict(restored).items()}
    merged = {p: (tuned[p] if p in held else x) for p, x in flat_base.items()}
    added = {p: x for p, x in tuned.items() if p not in flat_base}   # adapters: their layers apply them
    return unflatten_dict({**merged, **added})


def shared(base_paths: set, run: str) -> set:
    """The base parameter paths that `run` holds (a task-head run's under its backbone; a PEFT run's
    as its record lists them); refused when there are none: another model's run."""
    step_dir, run_dir = checkpoint_reader.step_directory(run), run_of(run)
    record = peft_checkpoint.read(run_dir)
    if record is not None and "base_params" not in record:
        raise CheckpointError(f"{run_dir} is a PEFT run of an earlier t5lite that does not list its base's parameters; "
                              "merge it (`t5lite convert --merge`) and pass the merged run")
    names = ({tuple(n.split("/")) for n in record["base_params"]} if record is not None
             else set(flatten_dict(checkpoint_reader.stored_params(step_dir))))
    held = base_paths & {n[1:] if n[:1] == BACKBONE else n for n in names}
    if not held:
        raise CheckpointError(f"{run_dir} holds none of the base's parameters: it is another model's run; give a run "
                              "fine-tuned from this base")
    return held


def kept_from_base(base: str, run: str) -> list[str]:
    """The base's top-level parts `run` does not hold (a classifier run's dropped MLM head): the
    grafted model reads these from the base."""
    paths = set(flatten_dict(checkpoint_reader.stored_params(base)))
    return sorted({p[0] for p in paths - shared(paths, run)})


def _abstract(x) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=getattr(x, "sharding", None))
