"""Reading a t5lite run's checkpoints (written by `t5lite.train.checkpoints.Checkpointer`).

It lives on the infer floor because inference, evaluation and conversion read checkpoints as
well as training does, and a floor never imports a higher one: the parameters alone (to infer or
fine-tune from), their names, or the whole train state (to continue another run's optimizer).
"""
from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath
from flax.traverse_util import flatten_dict, unflatten_dict

from t5lite import storage
from t5lite.errors import CheckpointError, CheckpointMismatchError, CheckpointNotFoundError
from t5lite.models import quantization
from t5lite.run_layout import RunDir


def step_directory(path: str) -> str:
    """The step directory meant by `path`: itself, or the latest step of a run's `checkpoints/`
    or of the run directory holding it."""
    path = storage.absolute(path)
    if epath.Path(path, "state").is_dir():
        return path
    checkpoints = RunDir(path).checkpoints
    if checkpoints.is_dir():
        path = str(checkpoints)
    folder = epath.Path(path)
    steps = sorted((int(d.name) for d in folder.iterdir() if d.name.isdigit() and _complete(d)),
                   reverse=True) if folder.is_dir() else []
    if not steps:
        where = "does not exist" if not epath.Path(path).exists() else "holds no t5lite checkpoint"
        raise CheckpointNotFoundError(f"{path!r} {where} (expected a step directory with a `state/` item, a "
                                      "`checkpoints/` directory of them, or the run directory holding that); check "
                                      "the path, or whether the run has saved a checkpoint yet")
    return os.path.join(path, str(steps[0]))


def _complete(step_dir: epath.Path) -> bool:
    """A local step directory is complete once it has its name (orbax renames it when done); on
    cloud storage orbax writes it in place and adds `commit_success.txt` when done."""
    return not storage.is_remote(step_dir) or (step_dir / "commit_success.txt").exists()


def step_reader() -> ocp.Checkpointer:
    """Reads one step directory the way the CheckpointManager wrote it (a composite of items)."""
    return ocp.Checkpointer(ocp.CompositeCheckpointHandler(state=ocp.PyTreeCheckpointHandler(),
                                                           data=ocp.JsonCheckpointHandler()))


def restore_params(path: str, abstract_params: Any) -> Any:
    """Only the parameters of a t5lite checkpoint (see `step_directory`), to fine-tune or infer from.

    Shapes must match the model being trained; a mismatch names the parameter. An int8 weight
    of a quantised run (`t5lite convert --quantize int8`) that `abstract_params` wants as float is
    dequantised (t5lite.models.quantization): fine-tuning or a float model reads a quantised run;
    a packed int4 kernel (`--quantize int4`) is always read dequantised.
    """
    path = step_directory(path)
    reader = step_reader()
    stored_params = reader.metadata(path).item_metadata["state"]["params"]
    flat_expected = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(abstract_params)}
    flat_stored = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(stored_params)}
    expected = flatten_dict(abstract_params)
    int4 = {p for p in quantization.int4_leaves(stored_params) if p in expected}   # packed: shapes differ
    without_zero = sorted(p for p in int4 if quantization.zero_path(p) not in flatten_dict(stored_params))
    if without_zero:
        raise CheckpointError(f"checkpoint {path}: int4 kernel {'/'.join(without_zero[0])} has no zero point (an "
                              "int4 run of an earlier t5lite, symmetric); convert its float run again with "
                              "`t5lite convert --quantize int4`")
    packed_names = {"".join(f"[{k!r}]" for k in p) for p in int4}
    for name, wanted in flat_expected.items():
        if name not in flat_stored:
            raise CheckpointMismatchError(f"checkpoint {path} has no parameter {name} (it holds "
                                          f"{sorted(stored_params)}): {_what_else(set(stored_params))}")
        if name not in packed_names and tuple(flat_stored[name].shape) != tuple(wanted.shape):
            raise CheckpointMismatchError(
                f"checkpoint {path}: parameter {name} has shape {tuple(flat_stored[name].shape)}, the model expects "
                f"{tuple(wanted.shape)}; {_shape_advice(name, tuple(flat_stored[name].shape))}")
    to_dequantize = {p for p in quantization.quantized_leaves(stored_params)
                     if p in expected and jax.numpy.dtype(expected[p].dtype) != jax.numpy.int8}
    # Only the `params` subtree is read (partial restore), laid out as `abstract_params`' shardings.
    item = {"params": _as_stored(abstract_params, stored_params, to_dequantize, int4)}
    restored = reader.restore(path, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
        item=item, restore_args=ocp.checkpoint_utils.construct_restore_args(item), partial_restore=True)))
    params = restored.state["params"]
    if not to_dequantize and not int4:
        return params
    params = quantization.dequantize_params(params, to_dequantize)
    if int4:
        flat = flatten_dict(params)
        for p in int4:
            scale = p[:-1] + (p[-1] + quantization.SCALE_SUFFIX,)
            flat[p] = quantization.dequantize_int4(flat[p], flat.pop(scale), flat.pop(quantization.zero_path(p)),
                                                   expected[p].shape)
        params = unflatten_dict(flat)
    return jax.tree.map(lambda x, a: jax.device_put(x, a.sharding), params, abstract_params)


def _shape_advice(name: str, stored_shape: tuple[int, ...]) -> str:
    """What to do about a parameter of another shape than the model's: the carried state of a
    stateful AWD-LSTM LM (t5lite.models.awd_lstm) has a row per training batch row."""
    if "carried_state_" in name:
        return (f"the AWD-LSTM LM carries its state per batch row and this run was trained with BATCH_SIZE = "
                f"{stored_shape[0]} (AWDLSTMLMObjective.stream_rows = %BATCH_SIZE), so evaluate it with "
                f"--gin.BATCH_SIZE={stored_shape[0]}; the evaluation's own rows are eval.batch_size, any value")
    return "use the run's own model_config.preset and vocab_size (or no model gin)"


# The top-level names of a PEFT run's trained tree (t5lite.models.peft), where its base is not.
PEFT_TRAINED = {"lora", "prefix", "prefix_encoder", "adapters"}


def _what_else(stored_names: set[str]) -> str:
    """What a checkpoint that lacks a wanted parameter is, and what to do instead."""
    if stored_names & PEFT_TRAINED or stored_names == {"params"}:
        return ("it holds a PEFT run's trained parameters alone, and its run has no peft.json naming their base; "
                "put back the run's peft.json, or give the merged run (`t5lite convert --merge`)")
    if stored_names == {"backbone", "head"}:
        return ("it is a task-head run (a backbone and a task head, e.g. a classifier), which `t5lite eval` with its "
                "training gin config reads; `t5lite infer` reads text-to-text models")
    return ("it is another model than the configured one; use the run's own gin config, or no model gin (the "
            "run's model_config.json is read)")


def _as_stored(abstract_params, stored_params, int8_paths, int4_paths=frozenset()):
    """`abstract_params` with the float weights at `int8_paths` read as the stored int8 values and
    their (replicated) scales, and those at `int4_paths` as the stored packed bytes, scales and
    zero points (replicated)."""
    if not int8_paths and not int4_paths:
        return abstract_params
    flat, stored = flatten_dict(abstract_params), flatten_dict(stored_params)
    for path in (*int8_paths, *int4_paths):
        sharding = flat[path].sharding
        replicated = (jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())
                      if isinstance(sharding, jax.sharding.NamedSharding) else sharding)
        scale = path[:-1] + (path[-1] + quantization.SCALE_SUFFIX,)
        flat[path] = (jax.ShapeDtypeStruct(flat[path].shape, jax.numpy.int8, sharding=sharding) if path in int8_paths
                      else jax.ShapeDtypeStruct(tuple(stored[path].shape), jax.numpy.uint8, sharding=replicated))
        flat[scale] = jax.ShapeDtypeStruct(tuple(stored[scale].shape), jax.numpy.float32, sharding=replicated)
        if path in int4_paths:
            zero = quantization.zero_path(path)
            flat[zero] = jax.ShapeDtypeStruct(tuple(stored[zero].shape), jax.numpy.float32, sharding=replicated)
    return unflatten_dict(flat)


def stored_params(path: str) -> Any:
    """The metadata (shape, dtype) of a checkpoint's params (`step_directory`), as a tree."""
    return step_reader().metadata(step_directory(path)).item_metadata["state"]["params"]


def stored_param_names(path: str) -> set[str]:
    """The top-level names of a checkpoint's params (`step_directory`); an ELECTRA run stores
    "generator" and "discriminator"."""
    return set(stored_params(path))


def restore_model(path: str, abstract_params: Any) -> Any:
    """`restore_params` of the model a run's commands read: of a task-head run its backbone (not
    the head), of an ELECTRA run the discriminator (not the generator), else the params. A module
    the part never created is left out (a fine-tuned BERT's backbone has no MLM head, which its
    config still names): the commands that read a backbone read its layers, not its pre-training heads."""
    stored = stored_params(path)
    part = next((p for p in ("backbone", "discriminator") if p in stored), None)
    if part is None:
        return restore_params(path, abstract_params)
    held = {name: tree for name, tree in abstract_params.items() if name in stored[part]}
    return restore_params(path, {part: held})[part]


def restore_state(path: str, abstract_state: Any) -> Any:
    """The whole train state (params, optimizer state, step, rng) of another run's checkpoint
    (see `step_directory`), laid out as `abstract_state`'s shardings: fine-tuning that continues
    the pre-training optimizer state and step."""
    path = step_directory(path)
    try:
        restored = step_reader().restore(path, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
            item=abstract_state, restore_args=ocp.checkpoint_utils.construct_restore_args(abstract_state))))
    except (ValueError, KeyError) as e:
        raise CheckpointError(f"cannot restore the full train state from {path} ({e}); was it trained with the same "
                              "model and optimizer? Restore only the parameters with "
                              "train.initial_checkpoint_restore = 'params'") from e
    return restored.state



# The commands that read a run whose model is not a transformer (by its model_config.json's arch);
# `t5lite eval` scores one on a task with the run's training gin config (its objective).
OTHER_MODELS = {"bilm": ("an ELMo run", ("eval", "embed", "probe", "probe --neighbours")),
                "awd_lstm": ("an AWD-LSTM run", ("eval",)), "word2vec": ("a word2vec run", ("embed", "probe"))}


def other_model(path: str) -> tuple[str, tuple[str, ...]] | None:
    """(what the run is, the commands that read it) of a run whose model is not a transformer (an
    ELMo, AWD-LSTM or word2vec run); None for a transformer's."""
    from t5lite.models.config import load_config
    config = RunDir.of_step(step_directory(path)).model_config
    return OTHER_MODELS.get(load_config(config).arch) if config.exists() else None


def commands_taking(other: tuple[str, tuple[str, ...]]) -> str:
    """The commands that read such a run, in words."""
    return ", ".join("`t5lite eval` with the run's training gin config" if c == "eval" else f"`t5lite {c}`"
                     for c in other[1])


def require_command_takes(path: str, command: str) -> None:
    """Refuses, before any work, a run whose model `t5lite COMMAND` cannot read (an ELMo, AWD-LSTM
    or word2vec run given to a command for transformers), saying what the run is and what reads it."""
    other = other_model(path)
    if other is not None and command not in other[1]:
        raise CheckpointError(f"{RunDir.of_step(step_directory(path))} is {other[0]}, which `t5lite {command}` does "
                              f"not read (it reads transformer runs); use {commands_taking(other)}")
