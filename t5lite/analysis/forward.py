"""One frozen forward pass over a set of sentences: every layer's token states (the embedding
layer's output as layer 0) and, when asked, every self-attention head's probabilities. Batches
are padded to a few lengths so each shape compiles once.
"""
from __future__ import annotations

import functools
from typing import Iterator, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from t5lite import finite
from t5lite.analysis import words
from t5lite.analysis.loading import Subject
from t5lite.analysis.words import Encoded
from t5lite.errors import ConfigError, DataError
from t5lite.models.transformer import Stack, TransformerLayer

_BUCKET = 32


def _captured(module: nn.Module, method_name: str) -> bool:
    return (isinstance(module, Stack) and method_name == "_embed") or (
        isinstance(module, TransformerLayer) and method_name == "__call__")


def _layer_index(name: str) -> int:
    return int(name.rsplit("_", 1)[-1]) if name[-1].isdigit() else 0


@functools.partial(jax.jit, static_argnames=("module", "attention"))
def _run(module, variables, tokens, attention: bool, positions=None, token_types=None):
    arch = module.config.arch
    stack = "decoder" if arch == "decoder" else "encoder"
    features = {f"{stack}_input_tokens": tokens}
    if positions is not None:
        features[f"{stack}_positions"] = positions
    if token_types is not None:
        features["token_type_ids"] = token_types
    _, state = module.apply(variables, **features, method="encode", capture_intermediates=_captured,
                            mutable=["intermediates", "attention"] if attention else ["intermediates"])
    captured = state["intermediates"][stack]
    layer_names = sorted((n for n in captured if n != "_embed"), key=_layer_index)
    # A shared (ALBERT) layer is one name with one output per call.
    states = [captured["_embed"][0]] + [out for n in layer_names for out, _ in captured[n]["__call__"]]
    weights = None
    if attention:
        sown = state["attention"][stack]
        weights = jnp.stack([w for n in layer_names for w in sown[n]["self_attention"]["weights"]])
    return jnp.stack(states).astype(jnp.float32), weights


def encoder_states(subject: Subject, tokens: np.ndarray, positions: np.ndarray, token_types: np.ndarray) -> np.ndarray:
    """An encoder's states [layers + 1, rows, length, d_model] (float32 numpy) of token rows read at the
    given positions and token types (a second language may have its own, as Fake-English's)."""
    hidden, _ = _run(subject.module, subject.variables, jnp.asarray(tokens), False, jnp.asarray(positions),
                     jnp.asarray(token_types))
    hidden = np.asarray(hidden)
    finite.require_finite(hidden, "hidden states", subject.checkpoint)
    return hidden


def fitting(subject: Subject, sentences: Sequence[words.Sentence], source: str = "") -> list[words.Sentence]:
    """The sentences whose subwords fit the model's learned positions (ELMo and static vectors have none: all); refused
    when none does, naming `source` (the file they were read from) when given: the analyses would
    have nothing to read."""
    config = getattr(subject.module, "config", None)    # static vectors: no module
    if getattr(config, "position_encoding", None) != "learned":
        return list(sentences)
    limit = config.max_position_embeddings
    lengths = [len(words.encode(subject.vocabulary, s.words, config.arch).tokens) for s in sentences]
    kept = [s for s, n in zip(sentences, lengths) if n <= limit]
    if sentences and not kept:
        where = f" from {source}" if source else ""
        count = f"{len(sentences)} sentence{'s' * (len(sentences) != 1)}"
        raise DataError(f"{count} read{where}, but none fits the model's {limit} positions (the "
                        f"shortest has {min(lengths)} subwords); use a model with more positions or shorter sentences")
    return kept


def read_fitting(subject: Subject, path: str, limit: int | None = None) -> list[words.Sentence]:
    """The first `limit` sentences of the UD or Universal NER file `path` (under --data_dir) that fit
    the model (`fitting`)."""
    return fitting(subject, words.read_conll(path, limit), path)


def _batches(encoded: Sequence[Encoded], batch_size: int, limit: int) -> Iterator[tuple[list[int], np.ndarray]]:
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i].tokens))
    for start in range(0, len(order), batch_size):
        chosen = order[start:start + batch_size]
        longest = max(len(encoded[i].tokens) for i in chosen)
        width = max(longest, min(-(-longest // _BUCKET) * _BUCKET, limit))
        tokens = np.zeros((batch_size, width), np.int32)
        for row, i in enumerate(chosen):
            tokens[row, :len(encoded[i].tokens)] = encoded[i].tokens
        yield chosen, tokens


def run(subject: Subject, encoded: Sequence[Encoded], attention: bool = False, batch_size: int = 16):
    """Per sentence: states [layers + 1, tokens, d_model] (float32 numpy) and, with `attention`,
    probabilities [layers, heads, tokens, tokens] (query, key)."""
    if not encoded:
        raise DataError("forward.run needs at least one sentence (the readers and `fitting` refuse fewer)")
    limit = subject.module.config.max_position_embeddings
    longest = max(len(e.tokens) for e in encoded)
    if subject.module.config.position_encoding == "learned" and longest > limit:
        raise ConfigError(f"a sentence has {longest} subwords, more than the model's {limit} positions; "
                          "leave such sentences out (t5lite.analysis.forward.fitting)")
    states, weights = [None] * len(encoded), [None] * len(encoded)
    for chosen, tokens in _batches(encoded, batch_size, limit):
        hidden, probs = _run(subject.module, subject.variables, jnp.asarray(tokens), attention)
        hidden = np.asarray(hidden)
        finite.require_finite(hidden, "hidden states", subject.checkpoint)
        probs = None if probs is None else np.asarray(probs)
        for row, i in enumerate(chosen):
            n = len(encoded[i].tokens)
            states[i] = hidden[:, row, :n]
            if probs is not None:
                weights[i] = probs[:, row, :, :n, :n]
    return states, (weights if attention else None)


def word_states(subject: Subject, sentences: Sequence[words.Sentence]) -> tuple[list[np.ndarray], list[Encoded]]:
    """Per sentence, the states [layers + 1, positions, d] the analyses read and where each word
    sits in them (`Encoded.starts` / `stops`). Transformers: the embeddings, then each layer, over
    the sentence's subwords (`run`); ELMo: the char-CNN token vector, then each biLSTM layer, one
    position per word (t5lite.interop.elmo.embed, every sentence from zero states); static vectors:
    one layer, the word's vector (`WordVectors.vector_of`; zeros for a word the table lacks)."""
    whole_words = [words.one_position_per_word(len(s.words)) for s in sentences]
    if subject.word_vectors is not None:
        table = subject.word_vectors
        zero = np.zeros(table.vectors.shape[1], np.float32)
        states = [np.stack([v if (v := table.vector_of(w)) is not None else zero for w in s.words])[None]
                  for s in sentences]
        finite.require_finite(states, "word vectors", subject.checkpoint)
        return [x.astype(np.float32) for x in states], whole_words
    if subject.module.config.arch == "bilm":
        from t5lite.interop import elmo
        states = elmo.embed(subject.module, subject.variables, [s.words for s in sentences])
        finite.require_finite(states, "hidden states", subject.checkpoint)
        return states, whole_words
    encoded = [words.encode(subject.vocabulary, s.words, subject.module.config.arch) for s in sentences]
    return run(subject, encoded)[0], encoded
