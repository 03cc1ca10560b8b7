"""Where each file of a run directory (MODEL_DIR) lives: one type, so no module spells a path.

Every path is an `etils.epath.Path`, so a local folder and a `gs://` bucket are written and read
the same way. The layout (docs/getting-started.md has the table):

    checkpoints/<step>/   orbax checkpoints     metrics.jsonl, tensorboard/, loss.png, perplexity.png
    config.gin, model_config.json, config_history/<step>-*      vocabulary.json, tokenizer/
    eval/<name>.<split>/  predictions           cost.json, peft.json, sparsity.json, head_pruning.json
    RUN_LOCK              the run using it      damaged_checkpoints/, vectors.txt (word2vec)
"""
from __future__ import annotations

import os

from etils import epath

from t5lite import storage


class RunDir:
    """The run directory `path` (a str, os.PathLike or gs:// URL) and its files."""

    def __init__(self, path: str | os.PathLike):
        self.path = epath.Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def __str__(self) -> str:
        return str(self.path)

    @classmethod
    def of_step(cls, step_dir: str) -> "RunDir":
        """The run a step directory belongs to (`<run>/checkpoints/<step>` -> `<run>`); a step
        directory outside `checkpoints/` (an imported model's) is its own parent's."""
        parent = os.path.dirname(storage.absolute(str(step_dir)))
        return cls(os.path.dirname(parent) if os.path.basename(parent) == "checkpoints" else parent)

    def _file(self, name: str) -> epath.Path:
        return self.path / name

    checkpoints = property(lambda self: self._file("checkpoints"))
    damaged_checkpoints = property(lambda self: self._file("damaged_checkpoints"))
    metrics = property(lambda self: self._file("metrics.jsonl"))
    tensorboard = property(lambda self: self._file("tensorboard"))
    loss_plot = property(lambda self: self._file("loss.png"))
    perplexity_plot = property(lambda self: self._file("perplexity.png"))
    config_gin = property(lambda self: self._file("config.gin"))
    model_config = property(lambda self: self._file("model_config.json"))
    config_history = property(lambda self: self._file("config_history"))
    vocabulary = property(lambda self: self._file("vocabulary.json"))
    tokenizer = property(lambda self: self._file("tokenizer"))
    cost = property(lambda self: self._file("cost.json"))
    peft = property(lambda self: self._file("peft.json"))
    sparsity = property(lambda self: self._file("sparsity.json"))
    head_pruning = property(lambda self: self._file("head_pruning.json"))
    lock = property(lambda self: self._file("RUN_LOCK"))
    word_vectors = property(lambda self: self._file("vectors.txt"))
    evaluations = property(lambda self: self._file("eval"))

    def history(self, step: int, name: str) -> epath.Path:
        """The copy of `name` (config.gin, model_config.json) kept for the (re)start at `step`."""
        return self.config_history / f"{step}-{name}"

    def eval_output(self, name: str, split: str) -> epath.Path:
        """Where an evaluation of `name` on `split` writes its predictions and metrics."""
        return self.evaluations / f"{name}.{split}"
