"""Span representations for edge probing (Tenney et al. 2019, "What do you learn from context?"):
each gold entity span of a BIO-tagged sentence (conlleval's chunks, as `seqeval` reads them) as
one vector per layer, pooled from the states of the span's subwords, for a probe that tells the
span's type from that vector alone. Edge probing pools with a learned self-attention; a linear
probe has no such parameters, so the pooling is fixed:

- `mean` (default): the average of every subword of the span. It reads every token of the span
  and keeps the width d_model, so the span probe has the capacity of the word probes per layer.
- `endpoint`: the first and last subword's states side by side ([first; last], 2 x d_model; Lee
  et al. 2017's endpoint features), which asks whether a span's edges carry its type.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from t5lite.analysis.words import Encoded, Sentence
from t5lite.errors import ConfigError, DataError
from t5lite.metrics import entities

POOLINGS = ("mean", "endpoint")


def entity_spans(sentence: Sentence) -> list[tuple[str, int, int]]:
    """(type, first word, last word) of each entity of the sentence's BIO tags."""
    return entities(sentence.tags)


def span_labels(sentences: Sequence[Sentence], types: Sequence[str]) -> np.ndarray:
    """Each span's index in `types`, sentence after sentence."""
    index = {t: i for i, t in enumerate(types)}
    labels = []
    for s in sentences:
        for type_, first, last in entity_spans(s):
            if type_ not in index:
                raise DataError(f"the entity {' '.join(s.words[first:last + 1])!r} has type {type_!r}, outside "
                                f"{list(types)}; fix its BIO tags")
            labels.append(index[type_])
    return np.array(labels, np.int32)


def span_vectors(states: np.ndarray, encoded: Encoded, spans: Sequence[tuple[str, int, int]],
                 pooling: str = "mean") -> np.ndarray:
    """[layers + 1, spans, d] (d = 2 x d_model for `endpoint`) from one sentence's states
    [layers + 1, tokens, d_model]: each span's subwords run from its first word's first subword to
    its last word's last."""
    if pooling not in POOLINGS:
        raise ConfigError(f"--span_pooling {pooling}: choose from {', '.join(POOLINGS)}")
    width = states.shape[-1] * (2 if pooling == "endpoint" else 1)
    vectors = np.zeros((states.shape[0], len(spans), width), states.dtype)
    for i, (_, first, last) in enumerate(spans):
        start, stop = encoded.starts[first], encoded.stops[last]
        if pooling == "mean":
            vectors[:, i] = states[:, start:stop].mean(1)
        else:
            vectors[:, i] = np.concatenate([states[:, start], states[:, stop - 1]], -1)
    return vectors
