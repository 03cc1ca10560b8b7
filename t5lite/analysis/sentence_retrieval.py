"""Zero-shot sentence retrieval between two languages, as XTREME's BUCC / Tatoeba task (Hu et al.
2020, `third_party/run_retrieval.py`): each sentence's vector at a layer is the mean of its tokens'
states there (`mean_pool_embedding` over the attention mask, [CLS] and [SEP] included), and for each
sentence of one language its nearest sentence of the other by cosine (`similarity_search` on
normalised vectors) should be its translation. The score is that share (Tatoeba's accuracy, i.e.
precision@1); chance is 1 over the number of sentences. Nothing parallel is trained for it: a model
trained on each language alone (multilingual MLM) aligns the two only through what they share.

A sentence is read as the run read its training rows: `[CLS] s [SEP]` with token type 0 (masked LM),
or with `tlm` as one side of XLM's translation LM stream, `</s> s </s>` with its language as token
type (t5lite.data.corruption.translation_lm).
"""
from __future__ import annotations

import os

import numpy as np

from t5lite.analysis import cross_lingual, forward, loading, neighbours
from t5lite.data.corruption.masking import special_ids
from t5lite.errors import DataError, DataNotFoundError


def read_pairs(first: str, second: str, limit: int | None = None) -> tuple[list[str], list[str]]:
    """The first `limit` lines of two aligned files (line i of one translates line i of the other)."""
    texts = []
    for path in (first, second):
        if not os.path.isfile(path):
            raise DataNotFoundError(f"--parallel {path} does not exist; give two aligned text files, one sentence "
                                    "per line (data/multi30k/task1/raw/test_2016_flickr.en and .de)")
        with open(path, encoding="utf-8") as f:
            texts.append([line.strip() for line in f][:limit])
    if len(texts[0]) != len(texts[1]) or not texts[0]:
        raise DataError(f"--parallel {first} has {len(texts[0])} lines and {second} {len(texts[1])}; give two "
                        "aligned, non-empty files of the same length")
    return texts[0], texts[1]


def rows(subject: loading.Subject, texts: list[str], language: int = 0, tlm: bool = False) -> dict[str, np.ndarray]:
    """Token rows padded to the model's positions (longer sentences cut), with positions and token types."""
    vocabulary = subject.vocabulary
    ids = special_ids(vocabulary)
    start, end = (vocabulary.eos_id, vocabulary.eos_id) if tlm else (ids["cls"], ids["sep"])
    length = subject.module.config.max_position_embeddings
    tokens = np.full((len(texts), length), vocabulary.pad_id, np.int32)
    for i, text in enumerate(texts):
        row = [start, *vocabulary.encode(text)[:length - 2], end]
        tokens[i, :len(row)] = row
    return {"tokens": tokens, "positions": np.broadcast_to(np.arange(length, dtype=np.int32), tokens.shape),
            "token_types": np.full(tokens.shape, language if tlm else 0, np.int32)}


def mean_pooled(subject: loading.Subject, texts: list[str], language: int = 0, tlm: bool = False,
                batch_size: int = 128) -> np.ndarray:
    """Each sentence's mean token state at every layer: [layers + 1, sentences, d_model]."""
    inputs = rows(subject, texts, language, tlm)
    mask = (inputs["tokens"] != subject.vocabulary.pad_id).astype(np.float32)
    pooled = []
    for i in range(0, len(texts), batch_size):
        states = forward.encoder_states(subject, *(inputs[k][i:i + batch_size] for k in
                                                   ("tokens", "positions", "token_types")))
        weights = mask[i:i + batch_size]
        pooled.append((states * weights[None, :, :, None]).sum(2) / weights.sum(1)[None, :, None])
    return np.concatenate(pooled, axis=1)


def accuracy(queries: np.ndarray, keys: np.ndarray) -> float:
    """The share of queries whose nearest key by cosine is the key of the same index."""
    unit = lambda x: x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
    nearest = np.argmax(unit(queries) @ unit(keys).T, axis=1)
    return float(np.mean(nearest == np.arange(len(queries))))


def retrieval(subject: loading.Subject, first: list[str], second: list[str], languages=("en", "de"),
              tlm: bool = False) -> dict:
    """Per layer (0: the embeddings), retrieval accuracy from the second language to the first and back."""
    a, b = mean_pooled(subject, first, 0, tlm), mean_pooled(subject, second, 1, tlm)
    forth, back = f"{languages[1]}_to_{languages[0]}", f"{languages[0]}_to_{languages[1]}"
    return {"model": subject.name, "languages": list(languages), "sentences": len(first), "tlm": tlm,
            "chance": 1 / len(first),
            "layers": [{forth: accuracy(y, x), back: accuracy(x, y)} for x, y in zip(a, b)]}


def write(result: dict, out: str) -> str:
    return neighbours.write(result, out, "sentence_retrieval.json")


def plot(result_paths: list[str], out: str) -> str:
    """Second-to-first language accuracy per layer of each `sentence_retrieval.json`, one line per run."""
    results = [cross_lingual.read_result(path) for path in result_paths]
    first, second = results[-1]["languages"]
    curves = [(r["model"], [layer[f"{second}_to_{first}"] for layer in r["layers"]]) for r in results]
    return cross_lingual.plot_layers(curves, results[-1]["chance"], f"accuracy, {second} to {first}", out)
