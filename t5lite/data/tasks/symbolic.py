"""Generated inverse problems, no download: Lample & Charton's symbolic derivatives and integrals
(t5lite.data.symbolic, prefix notation) and Python bytecode back to its source
(t5lite.data.bytecode), over one closed word vocabulary (`VOCABULARY`; t5_tiny's embedding has
room for it).

- `symbolic_derivative`: f -> f'. Metrics: `accuracy` (the exact prefix text) and `equivalence`
  (any expression equal to f' as a function).
- `symbolic_integration`: F' (simplified) -> F. `equivalence`: the prediction's derivative
  equals F' (any constant goes).
- `bytecode_to_source`: a `dis` listing -> the expression's source. `equivalence`: compiles to
  the same listing.

A split is a pure function of (seed, index): example i of a split is drawn from a generator
seeded with (SEED, split, i) and redrawn until it is valid and belongs to its split (a hash of the
question sends one in VALIDATION_EVERY to validation), so the splits share no question.
`VERIFIERS` check a prediction against the question alone, for beam search with verification
(t5lite.infer.verified).
"""
from __future__ import annotations

import dataclasses
import zlib
from typing import Callable

import numpy as np

from t5lite.data import bytecode, preprocessors as P, symbolic
from t5lite.data.registry import Feature, FunctionSource, TaskRegistry
from t5lite.data.word_vocab import SPECIALS, WordVocabulary

SEED = 0
SIZES = {"train": 10_000_000, "validation": 200}   # train is drawn on the fly, never materialised
VALIDATION_EVERY = 10
MAX_OPS = 3
VOCABULARY = WordVocabulary([*SPECIALS, *dict.fromkeys((*symbolic.TOKENS, *bytecode.TOKENS))])
FEATURES = {"inputs": Feature(VOCABULARY), "targets": Feature(VOCABULARY)}


@dataclasses.dataclass(frozen=True)
class GeneratedSplit:
    """A split's examples by index, computed on demand from `draw(rng, max_ops)`, a function that
    returns (question, answer) or None to draw again."""
    draw: Callable[[np.random.Generator, int], tuple[str, str] | None]
    split: str
    seed: int = SEED

    def __len__(self) -> int:
        return SIZES[self.split]

    def __getitem__(self, index: int) -> dict[str, str]:
        if not 0 <= index < len(self):
            raise IndexError(f"{self.split} has {len(self)} examples, not {index}")
        rng = np.random.default_rng([self.seed, list(SIZES).index(self.split), int(index)])
        while True:
            pair = self.draw(rng, MAX_OPS)
            if pair is not None and in_validation(pair[0]) == (self.split == "validation"):
                return {"inputs": pair[0], "targets": pair[1]}


def in_validation(question: str) -> bool:
    return zlib.crc32(question.encode("utf-8")) % VALIDATION_EVERY == 0


def accuracy_of(name: str, is_right: Callable[[str, str], bool]):
    """A metric fn: the percentage of predictions `is_right(prediction, target)` accepts."""
    def metric(targets, predictions) -> dict[str, float]:
        right = [is_right(p, t) for t, p in zip(targets, predictions, strict=True)]
        return {name: 100.0 * float(np.mean(right))}
    metric.__name__ = name
    return metric


def exact(prediction: str, target: str) -> bool:
    return prediction.split() == target.split()


GENERATORS = {
    "symbolic_derivative": (symbolic.derivative_example, symbolic.same_function),
    "symbolic_integration": (symbolic.integration_example, symbolic.same_primitive),
    "bytecode_to_source": (bytecode.example, bytecode.same_bytecode),
}
VERIFIERS = {"symbolic_derivative": symbolic.is_derivative_of, "symbolic_integration": symbolic.is_antiderivative,
             "bytecode_to_source": bytecode.compiles_to}

for _name, (_draw, _equivalent) in GENERATORS.items():
    TaskRegistry.add(
        _name,
        source=FunctionSource(lambda split, draw=_draw: GeneratedSplit(draw, split), splits=tuple(SIZES)),
        preprocessors=[P.tokenize, P.append_eos_after_trim],
        output_features=FEATURES,
        metric_fns=[accuracy_of("accuracy", exact), accuracy_of("equivalence", _equivalent)],
    )
