"""Sentence embeddings the Sentence-BERT way, from a Hugging Face / sentence-transformers folder
(e.g. all-MiniLM-L6-v2): the folder's own tokenizer (tokenizer.json), a t5lite encoder loaded by
`t5lite.interop.hf.load`, mean pooling over non-padding tokens (or the first token, per
1_Pooling/config.json) and L2 normalisation, so that a dot product is the cosine similarity.

    encoder = SentenceEncoder(path)
    corpus = encoder.encode(documents)                       # [n, d], unit rows
    scores, indices = encoder.search(["a query"], corpus, k=5)
"""
from __future__ import annotations

import functools
import json
import os
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from t5lite.interop import hf
from t5lite.models.heads import pool


def _read_json(path: str, default: dict) -> dict:
    if not os.path.exists(path):
        return default
    with open(path) as f:
        return json.load(f)


class SentenceEncoder:
    """Text -> unit-norm sentence vectors with a t5lite encoder; `search` does cosine top-k."""

    def __init__(self, path: str, max_length: int | None = None, batch_size: int = 64, pad_to_multiple_of: int = 16):
        from tokenizers import Tokenizer  # reads the folder's tokenizer.json
        self.module, self.variables = hf.load(path, dropout_rate=0.0)
        if self.module.config.arch != "encoder":
            raise ValueError(f"{path}: sentence embeddings need an encoder model, got arch={self.module.config.arch}")
        st_config = _read_json(os.path.join(path, "sentence_bert_config.json"), {})
        pooling = _read_json(os.path.join(path, "1_Pooling", "config.json"), {"pooling_mode_mean_tokens": True})
        self.pooling = "first" if pooling.get("pooling_mode_cls_token") else "mean"
        self.max_length = max_length or st_config.get("max_seq_length") or self.module.config.max_position_embeddings
        self.batch_size = batch_size
        self.tokenizer = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
        self.tokenizer.enable_truncation(self.max_length)
        pad_id = self.module.config.pad_token_id
        self.tokenizer.enable_padding(pad_id=pad_id, pad_token=self.tokenizer.id_to_token(pad_id),
                                      pad_to_multiple_of=pad_to_multiple_of)
        self._embed = jax.jit(functools.partial(_embed_batch, self.module, self.pooling))

    def tokenize(self, sentences: Sequence[str]) -> dict[str, np.ndarray]:
        batch = self.tokenizer.encode_batch(list(sentences))
        return dict(tokens=np.array([e.ids for e in batch], np.int32),
                    token_types=np.array([e.type_ids for e in batch], np.int32),
                    mask=np.array([e.attention_mask for e in batch], np.int32))

    def encode(self, sentences: Sequence[str], normalize: bool = True) -> np.ndarray:
        """[len(sentences), d_model] float32 embeddings (unit rows when `normalize`)."""
        out = []
        for start in range(0, len(sentences), self.batch_size):
            feats = self.tokenize(sentences[start:start + self.batch_size])
            out.append(np.asarray(self._embed(self.variables, feats["tokens"], feats["token_types"], feats["mask"])))
        embeddings = np.concatenate(out) if out else np.zeros((0, self.module.config.d_model), np.float32)
        if normalize:
            embeddings = embeddings / np.maximum(np.linalg.norm(embeddings, axis=-1, keepdims=True), 1e-12)
        return embeddings

    def search(self, queries: Sequence[str] | np.ndarray, corpus_embeddings: np.ndarray, k: int = 5):
        """Cosine top-k: (scores [q, k], indices [q, k]) into the rows of `corpus_embeddings`."""
        q = self.encode(queries) if not isinstance(queries, np.ndarray) else queries
        return cosine_top_k(q, corpus_embeddings, k)


def _embed_batch(module, how, variables, tokens, token_types, mask):
    hidden = module.apply(variables, encoder_input_tokens=tokens, token_type_ids=token_types, method="encode")
    return pool(hidden.astype(jnp.float32), mask, how)


def cosine_top_k(queries: np.ndarray, corpus: np.ndarray, k: int):
    """Top-k rows of `corpus` by cosine similarity to each query row: (scores, indices), best first."""
    unit = lambda x: x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
    scores = unit(queries) @ unit(corpus).T
    k = min(k, corpus.shape[0])
    idx = np.argsort(-scores, axis=-1, kind="stable")[:, :k]
    return np.take_along_axis(scores, idx, axis=-1), idx
