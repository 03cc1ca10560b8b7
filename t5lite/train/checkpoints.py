"""Orbax checkpoints of the whole train state plus the data position.

Saves are asynchronous (training continues while the arrays are written) and atomic: orbax
writes into a temporary directory and renames it when complete, so a crash mid-save leaves the
previous checkpoint as the latest readable one.
"""
from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp


class Checkpointer:
    def __init__(self, directory: str, save_every: int, keep: int = 3, async_save: bool = True):
        self.directory = os.path.abspath(directory)
        options = ocp.CheckpointManagerOptions(save_interval_steps=save_every, max_to_keep=keep,
                                               enable_async_checkpointing=async_save, create=True)
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "data"))

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state: Any, data_state: dict, force: bool = False) -> bool:
        return self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                               data=ocp.args.JsonSave(data_state)), force=force)

    def restore(self, abstract_state: Any, step: int | None = None) -> tuple[Any, dict, int]:
        """The state (laid out as `abstract_state`'s shardings), the data position, and the step."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        restored = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()))
        return restored.state, restored.data, step

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


def step_directory(path: str) -> str:
    """The step directory meant by `path`: itself, or the latest step of a run's `checkpoints/`
    or of the run directory holding it."""
    path = os.path.abspath(path)
    if os.path.isdir(os.path.join(path, "state")):
        return path
    if os.path.isdir(os.path.join(path, "checkpoints")):
        path = os.path.join(path, "checkpoints")
    steps = sorted((int(d) for d in os.listdir(path) if d.isdigit()), reverse=True) if os.path.isdir(path) else []
    if not steps:
        raise FileNotFoundError(f"{path!r} holds no t5lite checkpoint (expected a step directory with a `state/` "
                                "item, a `checkpoints/` directory of them, or the run directory holding that)")
    return os.path.join(path, str(steps[0]))


def restore_params(path: str, abstract_params: Any) -> Any:
    """Only the parameters of a t5lite checkpoint (see `step_directory`), to fine-tune or infer from.

    Shapes must match the model being trained; a mismatch names the parameter.
    """
    path = step_directory(path)
    state_dir = os.path.join(path, "state")
    metadata = ocp.StandardCheckpointer().metadata(state_dir)
    stored = metadata.item_metadata if hasattr(metadata, "item_metadata") else metadata
    stored_params = stored["params"]
    flat_expected = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(abstract_params)}
    flat_stored = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(stored_params)}
    for name, expected in flat_expected.items():
        if name not in flat_stored:
            raise ValueError(f"checkpoint {path} has no parameter {name} (expected shape {expected.shape}); "
                             "is it from the same model preset?")
        if tuple(flat_stored[name].shape) != tuple(expected.shape):
            raise ValueError(f"checkpoint {path}: parameter {name} has shape {tuple(flat_stored[name].shape)}, "
                             f"the model expects {tuple(expected.shape)}; does the vocabulary or preset differ?")
    # Only the `params` subtree is read (partial restore), laid out as `abstract_params`' shardings.
    item = {"params": abstract_params}
    restored = ocp.PyTreeCheckpointer().restore(state_dir, args=ocp.args.PyTreeRestore(
        item=item, restore_args=ocp.checkpoint_utils.construct_restore_args(item), partial_restore=True))
    return restored["params"]


def restore_state(path: str, abstract_state: Any) -> Any:
    """The whole train state (params, optimizer state, step, rng) of another run's checkpoint
    (see `step_directory`), laid out as `abstract_state`'s shardings: fine-tuning that continues
    the pre-training optimizer, as T5X does."""
    state_dir = os.path.join(step_directory(path), "state")
    try:
        return ocp.StandardCheckpointer().restore(state_dir, abstract_state)
    except (ValueError, KeyError) as e:
        raise ValueError(f"cannot restore the full train state from {state_dir} ({e}); was it trained with the same "
                         "model and optimizer? Restore only the parameters with "
                         "train.initial_checkpoint_restore = 'params'") from e
