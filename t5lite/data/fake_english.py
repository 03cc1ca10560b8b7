"""Fake-English (K et al. 2020; Dufter & Schütze 2020): a second language made from the first by
shifting every vocabulary id by the vocabulary size, so the two share no token, only what the
model gives both (the special tokens, the positions, the parameters). A BERT trained on both
languages is multilingual exactly when these shared anchors and the architecture make it so.

As Dufter & Schütze's code (pdufter/minimult): each example comes twice, as it is and as its Fake
twin (`add_shifted_input`, a parallel corpus), [CLS], [SEP], [MASK], UNK and padding stay shared
unless `share_special` is off (`--shift_special_tokens`), and with `share_positions` off the Fake
twin reads positions of its own, offset by the sequence length, and token type 1
(`--language_specific_positions`). The twins are masked independently (`twins` comes before
`t5lite.data.corruption.masking.bert_mlm`, `fake_english` after), so a random replacement token of
the Fake twin is a Fake token.
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping

import gin
import numpy as np

from t5lite.data.corruption.masking import special_ids

Example = dict[str, Any]
ENGLISH, FAKE = 0, 1


def anchors(vocabulary) -> np.ndarray:
    """The ids minimult keeps shared (its `special_token_indices`): [CLS], [SEP], [MASK], UNK, padding."""
    return np.array(sorted({vocabulary.pad_id, vocabulary.unk_id, *special_ids(vocabulary).values()}), np.int32)


def shift_ids(tokens: np.ndarray, shift: int, shared: np.ndarray) -> np.ndarray:
    """minimult's `shift_example`: every id not in `shared` moved up by `shift`."""
    tokens = np.asarray(tokens, np.int32)
    return np.where(np.isin(tokens, shared), tokens, tokens + shift).astype(np.int32)


def twins(dataset: Iterable[Example]) -> Iterator[Example]:
    """Each example as English (`language` 0) and again as its Fake twin to be (`language` 1)."""
    for ex in dataset:
        yield {**ex, "language": ENGLISH}
        yield {**ex, "language": FAKE}


def all_fake(dataset: Iterable[Example]) -> Iterator[Example]:
    """Every example as a Fake one to be: a fine-tuned task's evaluation set read in Fake-English
    (minimult's `run_xnli.py` `evaluate` adds the shift to every evaluation example)."""
    for ex in dataset:
        yield {**ex, "language": FAKE}


@gin.configurable(denylist=["dataset", "sequence_length", "output_features"])
def fake_english(dataset: Iterable[Example], sequence_length: Mapping[str, int], output_features: Mapping[str, Any],
                 share_special: bool = True, share_positions: bool = True) -> Iterator[Example]:
    """The examples `twins` (or `all_fake`) marked Fake with `inputs` and `targets` (a task-head
    example has no `targets`: its label stays as it is) shifted by the vocabulary size
    (the anchors kept unless `share_special` is off: then only padding is), and every example's
    `positions` and `token_type_ids`: 0, 1, ... and 0, except for the Fake twin when `share_positions`
    is off: positions from the sequence length on, token type 1. The model needs twice the vocabulary's ids, and with
    positions of its own twice the positions (the `encoder_positions` converter reads them)."""
    vocabulary = output_features["inputs"].vocabulary
    shift = int(vocabulary.vocab_size)
    shared = anchors(vocabulary) if share_special else np.array([vocabulary.pad_id], np.int32)
    offset = 0 if share_positions else int(sequence_length["inputs"])
    for ex in dataset:
        fake = ex["language"] == FAKE
        length = len(ex["inputs"])
        out = {**ex, "positions": np.arange(length, dtype=np.int32) + (offset if fake else 0),
               "token_type_ids": np.full(length, fake and not share_positions, np.int32)}
        if fake:
            out.update({key: shift_ids(ex[key], shift, shared) for key in ("inputs", "targets") if key in ex})
        yield out
