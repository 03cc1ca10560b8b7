"""Sentence-level inputs for encoder pre-training: BERT's NSP, ALBERT's SOP and RoBERTa's
FULL-SENTENCES / DOC-SENTENCES, from documents tokenized sentence by sentence.

NSP and SOP follow BERT's `create_instances_from_document`: sentences are gathered into a chunk of
about `sequence_length["inputs"] - 3` tokens, cut at a random sentence into A and B, and the pair
truncated to fit (one token at a time from the longer side, front or back at random). Then NSP
replaces B, with probability 1/2, by sentences from a random other document among the
`buffer_size` around it (label `next_sentence_label` 1), SOP swaps A and B with probability 1/2
(label `sentence_order_label` 1). Two differences from BERT: a one-sentence chunk is cut inside
the sentence instead of always taking a random B, so the labels are exactly Bernoulli(1/2); and
the B sentences a random B replaces are skipped rather than put back for the next chunk.
Output: `inputs` = `targets` = [CLS] A [SEP] B [SEP] and `token_type_ids` 0 up to the first
[SEP], 1 after; `bert_mlm` can follow to mask it.
"""
from __future__ import annotations

import itertools
import re
from typing import Any, Iterable, Iterator, Mapping

import numpy as np

from t5lite.data.corruption.masking import special_ids
from t5lite.errors import ConfigError

Example = dict[str, Any]
_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+|\n+")


def split_sentences(text: str) -> list[str]:
    """Sentences of a text: breaks after ".", "!" or "?" followed by whitespace, and at newlines."""
    return [s.strip() for s in _SENTENCE_BREAK.split(text) if s.strip()]


def tokenize_sentences(dataset: Iterable[Example], output_features: Mapping[str, Any],
                       text_key: str = "text") -> Iterator[Example]:
    """{"sentences": [int32 ids per sentence]} per document; empty documents are dropped."""
    vocabulary = output_features["inputs"].vocabulary
    for ex in dataset:
        sentences = [np.asarray(vocabulary.encode(s), np.int32) for s in split_sentences(ex[text_key])]
        sentences = [s for s in sentences if len(s)]
        if sentences:
            yield {"sentences": sentences}


def _truncate_pair(a: np.ndarray, b: np.ndarray, max_tokens: int, rng: np.random.Generator):
    """BERT's `truncate_seq_pair`: one token at a time off the longer segment (B when they are
    equal), front or back at random."""
    while len(a) + len(b) > max_tokens:
        if len(a) > len(b):
            a = a[1:] if rng.random() < 0.5 else a[:-1]
        else:
            b = b[1:] if rng.random() < 0.5 else b[:-1]
    return a, b


def _pair_example(a: np.ndarray, b: np.ndarray, ids: Mapping[str, int]) -> Example:
    cls, sep = np.array([ids["cls"]], np.int32), np.array([ids["sep"]], np.int32)
    tokens = np.concatenate([cls, a, sep, b, sep])
    token_type_ids = np.concatenate([np.zeros(len(a) + 2, np.int32), np.ones(len(b) + 1, np.int32)])
    return {"inputs": tokens, "targets": tokens, "token_type_ids": token_type_ids}


def _chunks(sentences: list[np.ndarray], target_length: int) -> Iterator[list[np.ndarray]]:
    """Consecutive sentences gathered until they reach `target_length` tokens (the last chunk may be short)."""
    chunk, length = [], 0
    for sentence in sentences:
        chunk.append(sentence)
        length += len(sentence)
        if length >= target_length:
            yield chunk
            chunk, length = [], 0
    if chunk:
        yield chunk


def _split_chunk(chunk: list[np.ndarray], rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A and B: the chunk cut before a random sentence (inside the sentence if it is the only one)."""
    if len(chunk) == 1:
        cut = int(rng.integers(1, len(chunk[0]))) if len(chunk[0]) > 1 else 1
        return chunk[0][:cut], chunk[0][cut:]
    a_end = int(rng.integers(1, len(chunk)))
    return np.concatenate(chunk[:a_end]), np.concatenate(chunk[a_end:])


def _random_segment(documents: list[list[np.ndarray]], exclude: int, length: int,
                    rng: np.random.Generator) -> np.ndarray | None:
    """About `length` tokens of consecutive sentences from a random other document (None if there is none)."""
    if len(documents) < 2:
        return None
    other = int(rng.integers(len(documents) - 1))
    sentences = documents[other + (other >= exclude)]
    start = int(rng.integers(len(sentences)))
    tokens = np.concatenate(sentences[start:])
    return tokens[:max(length, 1)]


def sentence_pairs(dataset: Iterable[Example], sequence_length: Mapping[str, int],
                   output_features: Mapping[str, Any], seed: int, objective: str = "nsp",
                   buffer_size: int = 100) -> Iterator[Example]:
    """NSP (`objective="nsp"`) or SOP (`"sop"`) pairs from `tokenize_sentences` documents."""
    if objective not in ("nsp", "sop"):
        raise ConfigError(f"sentence_pairs: objective must be 'nsp' or 'sop', got {objective!r}")
    max_tokens = int(sequence_length["inputs"]) - 3
    if max_tokens < 2:
        raise ConfigError(f"sentence_pairs: sequence_length['inputs'] is {sequence_length['inputs']}; "
                          "[CLS] A [SEP] B [SEP] needs at least 5")
    ids = special_ids(output_features["inputs"].vocabulary)
    label_key = "next_sentence_label" if objective == "nsp" else "sentence_order_label"
    dataset = iter(dataset)
    for group in itertools.count():
        documents = [ex["sentences"] for ex in itertools.islice(dataset, buffer_size)]
        if not documents:
            return
        rng = np.random.default_rng([seed, 6, group])
        for d, document in enumerate(documents):
            for chunk in _chunks(document, max_tokens):
                a, b = _split_chunk(chunk, rng)
                label = int(rng.random() < 0.5)
                if label and objective == "nsp":
                    b = _random_segment(documents, d, max_tokens - len(a), rng)
                    if b is None:
                        b, label = _split_chunk(chunk, rng)[1], 0
                elif label:
                    a, b = b, a
                a, b = _truncate_pair(a, b, max_tokens, rng)
                yield {**_pair_example(a, b, ids), label_key: np.int32(label)}


def full_sentences(dataset: Iterable[Example], sequence_length: Mapping[str, int],
                   output_features: Mapping[str, Any], cross_documents: bool = True) -> Iterator[Example]:
    """RoBERTa's inputs without NSP: [CLS] consecutive sentences [SEP] filling `sequence_length["inputs"]`.

    FULL-SENTENCES (`cross_documents=True`) keeps filling across documents with a [SEP] at each
    document boundary; DOC-SENTENCES (False) ends the sequence with the document. A sentence longer
    than a whole sequence is cut into pieces.
    """
    budget = int(sequence_length["inputs"]) - 2
    if budget < 1:
        raise ConfigError(f"full_sentences: sequence_length['inputs'] must be at least 3, got {sequence_length['inputs']}")
    ids = special_ids(output_features["inputs"].vocabulary)

    def emit(tokens: list[int]) -> Example:
        array = np.array([ids["cls"], *tokens, ids["sep"]], np.int32)
        return {"inputs": array, "targets": array, "token_type_ids": np.zeros(len(array), np.int32)}

    current: list[int] = []
    for ex in dataset:
        for sentence in ex["sentences"]:
            for start in range(0, len(sentence), budget):
                piece = sentence[start:start + budget].tolist()
                if current and len(current) + len(piece) > budget:
                    yield emit(current)
                    current = []
                current.extend(piece)
        if not current:
            continue
        if not cross_documents or len(current) >= budget:
            yield emit(current)
            current = []
        else:
            current.append(ids["sep"])
    if current:
        yield emit(current)
