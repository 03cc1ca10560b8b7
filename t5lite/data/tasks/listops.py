"""ListOps as Long Range Arena generates it (t5lite.data.listops), text to text: the tree's tokens
-> its value, one digit. No download: example i of a split is drawn from a generator seeded with
(SEED, split, i) (Python's `random`, as LRA's), so any example is computed on demand.

- `listops`: LRA's settings (depth <= 10, 2..10 arguments, 500 < length < 2000, which is some 1,500
  to 6,000 tokens with the parentheses) and split sizes (96,000 / 2,000 / 2,000).
- `listops_1k`: the same distribution kept at 100 < length < 500 (some 150 to 1,500 tokens), for
  training on a CPU (configs/local/listops_longformer.gin).

LRA keeps distinct trees across its splits; at these lengths two draws are all but never the same
tree, so the splits here are not deduplicated.
"""
from __future__ import annotations

import dataclasses
import random

from t5lite import metrics
from t5lite.data import listops, preprocessors as P
from t5lite.data.registry import Feature, FunctionSource, TaskRegistry
from t5lite.data.word_vocab import SPECIALS, WordVocabulary

SEED = 0
SIZES = {"train": 96_000, "validation": 2_000, "test": 2_000}   # LRA's
VOCABULARY = WordVocabulary([*SPECIALS, *listops.TOKENS])
FEATURES = {"inputs": Feature(VOCABULARY), "targets": Feature(VOCABULARY)}


@dataclasses.dataclass(frozen=True)
class ListOpsSplit:
    """A split's examples by index, each drawn on demand (`listops.draw`) with its lengths."""
    split: str
    min_length: int
    max_length: int
    seed: int = SEED

    def __len__(self) -> int:
        return SIZES[self.split]

    def __getitem__(self, index: int) -> dict:
        if not 0 <= index < len(self):
            raise IndexError(f"{self.split} has {len(self)} examples, not {index}")
        rng = random.Random(f"{self.seed}/{self.split}/{index}")   # a str seed: the same in every process
        tree = listops.draw(rng, self.min_length, self.max_length)
        return {"inputs": " ".join(listops.tokens(tree)), "targets": str(listops.value(tree)), "idx": int(index)}


for _name, (_min, _max) in {"listops": (listops.MIN_LENGTH, listops.MAX_LENGTH), "listops_1k": (100, 500)}.items():
    TaskRegistry.add(
        _name,
        source=FunctionSource(lambda split, lo=_min, hi=_max: ListOpsSplit(split, lo, hi), splits=tuple(SIZES)),
        preprocessors=[P.tokenize, P.append_eos_after_trim],
        output_features=FEATURES,
        metric_fns=[metrics.accuracy],
    )
