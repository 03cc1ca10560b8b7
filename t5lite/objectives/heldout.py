"""Held-out evaluation of a pre-training objective by its own loss (MLM, MLM + NSP/SOP/SBO, ELECTRA,
the causal LM): a split's examples converted as training converts them and run through the
objective's `loss_and_metrics` without dropout, z-loss or label smoothing, so the evaluation's
`mlm_loss` is the plain cross entropy over the masked tokens and `mlm_accuracy` the share predicted
right (a causal LM's `loss` and `accuracy`: over every real target token, as nanoGPT's `estimate_loss`).
With a training split given, the evaluation also logs `unigram_loss`: the cross entropy of the same
targets under the training split's token frequencies, what a model that ignores its input scores.
A loss at or above it means the model has learnt no more than how often each token occurs.
"""
from __future__ import annotations

import functools
import itertools
import math

import jax
import numpy as np

from t5lite.data import converter_registry, converters
from t5lite.errors import DataError
from t5lite.infer.evaluation import EvalResult
from t5lite.infer.unigram import UNIGRAM_EXAMPLES, token_counts, unigram_loss
from t5lite.models import flops
from t5lite.objectives.base import LossConfig, target_keys

PLAIN = LossConfig(z_loss=0.0)


def converted_rows(converter: str, task, split: str, task_feature_lengths, data_dir=None,
                   max_examples=None, pack: bool = False) -> tuple[list[dict], int]:
    """The first `max_examples` examples of `split` as the named feature converter's rows (packed with
    `pack`), and how many examples they hold; a split with no example is refused, since there would
    be nothing to score."""
    examples = list(itertools.islice(task.get_dataset(split, task_feature_lengths, data_dir=data_dir), max_examples))
    if not examples:
        raise DataError(f"task {task.name!r} has no examples in split {split!r} (data_dir={data_dir!r})")
    rows = converter_registry.get_feature_converter(converter).convert(examples, task_feature_lengths, pack=pack)
    return list(rows), len(examples)


class LossEvaluator:
    """Each `(sum, count)` metric of the objective (z-loss aside) as its ratio over the split; FLOPs:
    the model's forward at each row's real tokens. The last batch is left short rather than filled,
    so that a per-row count (NSP's pairs) counts real rows only. `pack`: rows packed as training packs
    them (a causal LM's document stream)."""
    skipped: tuple[str, ...] = ()   # metrics whose (sum, count) do not add up over batches (a ROC AUC's)

    def __init__(self, objective, task, split: str, task_feature_lengths, batch_size: int = 32, data_dir=None,
                 max_examples=None, pack: bool = False):
        self.objective, self.task, self.pack = objective, task, pack
        rows, self.examples = converted_rows(objective.converter, task, split, task_feature_lengths, data_dir,
                                             max_examples, pack)
        self.lengths = [int(np.count_nonzero(row[target_keys(row)[0]])) for row in rows]
        self.targets = target_tokens(rows)
        self.train_counts = None
        self.batches = [{k: v for k, v in b.items() if k != converters.EXAMPLES_KEY}
                        for b in converters.batch(rows, batch_size, drop_remainder=False)]

    def evaluate(self, module, params) -> EvalResult:
        sums = [jax.device_get(_loss_sums(self.objective, module, params, b)) for b in self.batches]
        totals = {k: [sum(float(s[k][i]) for s in sums) for i in (0, 1)] for k in sums[0] if k not in self.skipped}
        ratios = {k: num / den if den else math.nan for k, (num, den) in totals.items()}
        scores = {k: float(v) for k, v in self.objective.derived_metrics(ratios).items()}
        if self.train_counts is not None:
            scores["unigram_loss"] = unigram_loss(self.train_counts, self.targets, self.vocab_size(module))
        done = sum(self.forward_flops(module, n) for n in self.lengths)
        return EvalResult(scores, [], flops=done, examples=self.examples)

    def count_training_tokens(self, task, split: str, task_feature_lengths, data_dir=None) -> None:
        """Count the target tokens of `task`'s `split` (the evaluated task's own: its first
        UNIGRAM_EXAMPLES examples, converted as the evaluated split is), so that each evaluation also
        logs `unigram_loss`."""
        rows, _ = converted_rows(self.objective.converter, task, split, task_feature_lengths, data_dir,
                                 UNIGRAM_EXAMPLES, self.pack)
        self.train_counts = token_counts([target_tokens(rows)])

    def vocab_size(self, module) -> int:
        return module.config.vocab_size

    def forward_flops(self, module, length: int) -> float:
        """FLOPs of the evaluation's forward passes over one row of `length` real tokens (which an
        encoder reads as its encoder length, a decoder-only model as its decoder length)."""
        return flops.forward_flops_per_example(module.config, length, length)


def target_tokens(rows: list[dict]) -> np.ndarray:
    """Every target token the objective scores in `rows` (loss weight > 0), in order."""
    return np.concatenate([np.asarray(row[target_keys(row)[0]])[np.asarray(row[target_keys(row)[1]]) > 0]
                           for row in rows]).astype(np.int64)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _loss_sums(objective, module, params, batch):
    _, metrics = objective.loss_and_metrics(module, params, batch, None, objective.normalizers(batch, PLAIN), PLAIN)
    return {k: v for k, v in metrics.items() if isinstance(v, tuple) and not k.endswith("z_loss")}
