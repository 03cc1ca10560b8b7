"""Sentence-level inputs for encoder pre-training: BERT's NSP, ALBERT's SOP and RoBERTa's
FULL-SENTENCES / DOC-SENTENCES, from documents tokenized sentence by sentence.

NSP and SOP follow BERT's `create_instances_from_document` (ALBERT's for SOP), draw for draw
(`document_pairs`): sentences are gathered into a chunk of about `sequence_length["inputs"] - 3`
tokens (10% of documents, `short_seq_prob`, aim at a random shorter length), cut at a random
sentence into A and B, and the pair truncated to fit (`_truncate_pair`, BERT's `truncate_seq_pair`).
NSP replaces B, with probability 1/2 and always in a one-sentence chunk, by sentences from a random
other document (label `next_sentence_label` 1) and puts the displaced sentences back; SOP swaps A
and B with probability 1/2 (label `sentence_order_label` 1; a one-sentence chunk takes a random B,
labelled 1, as ALBERT's code does). Differences: the random document comes from the `buffer_size`
documents around it (BERT's from the whole shuffled corpus), and the pairs are made anew every
epoch instead of `dupe_factor` fixed copies.
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


def _random_segment(documents: list[list[np.ndarray]], exclude: int, target_length: int,
                    rng: np.random.Generator) -> np.ndarray:
    """BERT's random next segment: a document other than `exclude` (ten tries, then whichever came up),
    its sentences from a random one on until they reach `target_length` tokens."""
    for _ in range(10):
        other = int(rng.integers(len(documents)))
        if other != exclude:
            break
    sentences = documents[other][int(rng.integers(len(documents[other]))):]
    reached = np.flatnonzero(np.cumsum([len(s) for s in sentences]) >= target_length)
    return np.concatenate(sentences[:reached[0] + 1 if len(reached) else len(sentences)])


def document_pairs(documents: list[list[np.ndarray]], index: int, max_tokens: int, short_seq_prob: float,
                   objective: str, rng: np.random.Generator) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
    """(A, B, label) per chunk of `documents[index]`, as BERT's `create_instances_from_document`
    (NSP) or ALBERT's (SOP) before masking: a target length (with probability `short_seq_prob` a
    random one in [2, max_tokens]), sentences gathered until they reach it, A = a random number of
    them; B is random (label 1) for a one-sentence chunk or, for NSP, with probability 1/2, and the
    sentences it displaces are put back for the next chunk; for SOP the two halves swap (label 1)
    with probability 1/2. Then `_truncate_pair` to `max_tokens`."""
    document = documents[index]
    target_length = max_tokens
    if rng.random() < short_seq_prob:
        target_length = int(rng.integers(2, max_tokens + 1))
    chunk, length, i = [], 0, 0
    while i < len(document):
        chunk.append(document[i])
        length += len(document[i])
        if i == len(document) - 1 or length >= target_length:
            a_end = int(rng.integers(1, len(chunk))) if len(chunk) >= 2 else 1
            a, label = np.concatenate(chunk[:a_end]), 0
            if len(chunk) == 1 or (objective == "nsp" and rng.random() < 0.5):
                b, label = _random_segment(documents, index, target_length - len(a), rng), 1
                i -= len(chunk) - a_end
            else:
                b = np.concatenate(chunk[a_end:])
                if objective == "sop" and rng.random() < 0.5:
                    a, b, label = b, a, 1
            yield (*_truncate_pair(a, b, max_tokens, rng), label)
            chunk, length = [], 0
        i += 1


def sentence_pairs(dataset: Iterable[Example], sequence_length: Mapping[str, int],
                   output_features: Mapping[str, Any], seed: int, objective: str = "nsp",
                   buffer_size: int = 100, short_seq_prob: float = 0.1) -> Iterator[Example]:
    """NSP (`objective="nsp"`) or SOP (`"sop"`) pairs from `tokenize_sentences` documents, by
    `document_pairs` over each group of `buffer_size` documents; `short_seq_prob` 0.1 is BERT's
    and ALBERT's default (0 always fills the sequence)."""
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
        for d in range(len(documents)):
            for a, b, label in document_pairs(documents, d, max_tokens, short_seq_prob, objective, rng):
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
