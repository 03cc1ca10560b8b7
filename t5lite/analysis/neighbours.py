"""Contextual neighbours: every occurrence of a word in a corpus embedded by one layer (its first
subword; of ELMo, the word's own vector), and each occurrence's nearest neighbours by cosine, among the other occurrences of the
word ("same": do the senses of "play" separate?) or among every word of the corpus ("all").
"""
from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from t5lite import finite
from t5lite.analysis import forward, loading, words
from t5lite.errors import ConfigError, DataError

POOLS = ("same", "all")


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def neighbours(subject: loading.Subject, sentences: Sequence[words.Sentence], word: str, layer: int = -1,
               k: int = 5, pool: str = "same") -> dict:
    """{"occurrences": [{"sentence", "index", "neighbours": [{"sentence", "index", "word", "cosine"}]}]}
    for each (case-insensitive) occurrence of `word`; `layer` counts the embedding layer as 0
    (negative: from the top)."""
    if pool not in POOLS:
        raise ConfigError(f"--pool {pool!r}: choose from {', '.join(POOLS)}")
    target = word.lower()
    sentences = forward.fitting(subject, sentences)
    chosen = [s for s in sentences if target in (w.lower() for w in s.words)] if pool == "same" else list(sentences)
    if not any(target in (w.lower() for w in s.words) for s in chosen):
        raise DataError(f"--neighbours {word!r} does not occur in the corpus; pick a word it has")
    states, encoded = forward.word_states(subject, chosen)
    starts = [e.starts for e in encoded]
    layers = states[0].shape[0]
    if not -layers <= layer < layers:
        raise ConfigError(f"--layer {layer}: this model has layers 0 (embeddings) to {layers - 1}")
    places = [(i, j) for i, s in enumerate(chosen) for j, w in enumerate(s.words)
              if pool == "all" or w.lower() == target]
    vectors = _unit(np.stack([states[i][layer, starts[i][j]] for i, j in places]))
    queries = [n for n, (i, j) in enumerate(places) if chosen[i].words[j].lower() == target]
    cosine = vectors[queries] @ vectors.T
    occurrences = []
    for row, q in enumerate(queries):
        cosine[row, q] = -np.inf                        # not its own neighbour
        best = np.argsort(-cosine[row], kind="stable")[:min(k, len(places) - 1)]   # never itself
        i, j = places[q]
        occurrences.append({"sentence": " ".join(chosen[i].words), "index": j, "neighbours": [
            {"sentence": " ".join(chosen[places[n][0]].words), "index": places[n][1],
             "word": chosen[places[n][0]].words[places[n][1]], "cosine": round(float(cosine[row, n]), 4)}
            for n in best]})
    return {"model": subject.name, "word": word, "layer": layer % layers, "pool": pool, "sentences_read": len(chosen),
            "occurrences": occurrences}


def write(result: dict, out: str, name: str = "neighbours.json") -> str:
    """`result` as JSON in the folder `out` (made if missing); returns the file's path."""
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, name)
    with open(path, "w") as f:
        finite.dump(result, f, indent=1)
    return path
