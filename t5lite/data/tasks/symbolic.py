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

Splits as Lample & Charton build theirs (facebookresearch/SymbolicMathematics, README "remove
duplicates" and `split_data.py`): a hash of the question sends one question in HELD_OUT_EVERY to
`validation`, one to `test` and the rest to `train`, so no held-out question is ever trained on;
the held-out splits hold distinct questions (`HeldOutSplit`, their deduplication). `train` is drawn
on the fly, a pure function of (seed, index): example i comes from a generator seeded with
(SEED, split, i), redrawn until valid and in its split. Their training file holds each
(question, answer) line once (the README's `awk '{c[$0]++}'`); a stream cannot hold all it has
drawn, so `distinct_pairs` drops a repeated pair within one preprocessing pass (a loader block of
`train.data_block_size` records), remembering at most WINDOW pairs.
`VERIFIERS` check a prediction against the question alone, for beam search with verification
(t5lite.infer.verified).
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import zlib
from typing import Callable, Iterable, Iterator

import numpy as np

from t5lite.data import bytecode, preprocessors as P, symbolic
from t5lite.data.registry import Feature, FunctionSource, TaskRegistry
from t5lite.data.word_vocab import SPECIALS, WordVocabulary

SEED = 0
SIZES = {"train": 10_000_000, "validation": 200, "test": 200}   # train is never materialised
HELD_OUT = ("validation", "test")
HELD_OUT_EVERY = 10
MAX_DRAWS = 1000   # per distinct held-out question: a generator with too few fails, not hangs
MAX_OPS = 5
WINDOW = 100_000   # pairs `distinct_pairs` remembers: a pass over a split read as one stream
VOCABULARY = WordVocabulary([*SPECIALS, *dict.fromkeys((*symbolic.TOKENS, *bytecode.TOKENS))])
FEATURES = {"inputs": Feature(VOCABULARY), "targets": Feature(VOCABULARY)}
Draw = Callable[[np.random.Generator, int], "tuple[str, str] | None"]


def split_of(question: str) -> str:
    """The split a question belongs to, by a hash of its text."""
    bucket = zlib.crc32(question.encode("utf-8")) % HELD_OUT_EVERY
    return HELD_OUT[bucket] if bucket < len(HELD_OUT) else "train"


def draw_in_split(draw: Draw, split: str, index: int, seed: int = SEED, max_ops: int = MAX_OPS) -> dict[str, str]:
    """Draw `index` of `split`'s stream: redrawn until it is valid and its question is in `split`."""
    rng = np.random.default_rng([seed, list(SIZES).index(split), int(index)])
    while True:
        pair = draw(rng, max_ops)
        if pair is not None and split_of(pair[0]) == split:
            return {"inputs": pair[0], "targets": pair[1]}


@dataclasses.dataclass(frozen=True)
class GeneratedSplit:
    """A split's examples by index, computed on demand from `draw(rng, max_ops)`, a function that
    returns (question, answer) or None to draw again. Held-out splits skip questions already in
    them (`HeldOutSplit`)."""
    draw: Draw
    split: str
    seed: int = SEED
    max_ops: int = MAX_OPS

    def __len__(self) -> int:
        return SIZES[self.split]

    def __getitem__(self, index: int) -> dict[str, str]:
        if not 0 <= index < len(self):
            raise IndexError(f"{self.split} has {len(self)} examples, not {index}")
        if self.split in HELD_OUT:
            return held_out(self.draw, self.split, self.seed, self.max_ops).get(index)
        return draw_in_split(self.draw, self.split, index, self.seed, self.max_ops)


class HeldOutSplit:
    """The distinct questions of a held-out split's stream, in order of first draw, extended as far
    as an index asks (so evaluating 4 questions draws only a few)."""

    def __init__(self, draw: Draw, split: str, seed: int, max_ops: int):
        self.draw, self.split, self.seed, self.max_ops = draw, split, seed, max_ops
        self.examples: list[dict[str, str]] = []
        self.seen: set[str] = set()
        self.draws = 0

    def get(self, index: int) -> dict[str, str]:
        while len(self.examples) <= index:
            if self.draws >= MAX_DRAWS * (len(self.examples) + 1):
                raise RuntimeError(f"{self.split}: only {len(self.examples)} distinct questions in {self.draws} draws")
            example = draw_in_split(self.draw, self.split, self.draws, self.seed, self.max_ops)
            self.draws += 1
            if example["inputs"] not in self.seen:
                self.seen.add(example["inputs"])
                self.examples.append(example)
        return self.examples[index]


@functools.lru_cache(maxsize=None)
def held_out(draw: Draw, split: str, seed: int, max_ops: int) -> HeldOutSplit:
    """One `HeldOutSplit` per (generator, split, seed, max_ops) in a process."""
    return HeldOutSplit(draw, split, seed, max_ops)


def distinct_pairs(dataset: Iterable[dict[str, str]], window: int | None = None) -> Iterator[dict[str, str]]:
    """Each (question, answer) pair once, in order of first draw, as Lample & Charton's README
    deduplicates whole lines (a question with two answers keeps both); only the last `window`
    (default WINDOW) pairs yielded are remembered, so memory stays bounded on an endless stream. A
    pure function of the records it is given, so a loader block (`train.data_block_size` records,
    the window in training) gives the same examples when a run resumes."""
    window = WINDOW if window is None else window
    recent: collections.OrderedDict[tuple[str, str], None] = collections.OrderedDict()
    for example in dataset:
        pair = (example["inputs"], example["targets"])
        if pair in recent:
            continue
        recent[pair] = None
        if len(recent) > window:
            recent.popitem(last=False)
        yield example


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
        preprocessors=[distinct_pairs, P.tokenize, P.append_eos_after_trim],
        output_features=FEATURES,
        metric_fns=[accuracy_of("accuracy", exact), accuracy_of("equivalence", _equivalent)],
    )
