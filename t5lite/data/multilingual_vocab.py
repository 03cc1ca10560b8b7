"""One SentencePiece vocabulary for several languages, learnt as XLM learns its BPE codes (Conneau &
Lample 2019, section 3.1): on sentences sampled from each language's corpus with the probabilities
of XLM's language sampling, q_i = p_i^alpha / sum_j p_j^alpha (`smoothed_rates`; XLM: alpha = 0.5),
so that a small language gets pieces of its own instead of being split into characters. Each
language's sentences are drawn with replacement, as XLM's README builds its `bpe.train`
(`shuf -r -n N train.<lang> >> bpe.train`), and SentencePiece learns the pieces on them all.
Behind `t5lite prepare --vocab_size`.
"""
from __future__ import annotations

import json
import os
import shutil
from typing import Mapping, Sequence

import numpy as np

from t5lite.data import vocab as vocab_lib
from t5lite.data.registry import smoothed_rates
from t5lite.errors import ConfigError, DataError, DataNotFoundError

MODEL_FILE, LANGUAGES_FILE = "spm.model", "languages.json"


def sentence_counts(sizes: Sequence[int], alpha: float, total: int) -> np.ndarray:
    """How many of `total` sampled sentences each language gives: total * q_i, rounded to whole
    sentences that add up to `total` (the largest remainders get the leftover ones)."""
    exact = smoothed_rates(sizes, alpha) * total
    counts = np.floor(exact).astype(np.int64)
    counts[np.argsort(counts - exact, kind="stable")[:total - counts.sum()]] += 1
    return counts


def language_of(path: str) -> str:
    """A corpus file's language: its last suffix (`train.de` -> "de", `newsdev2016-enro.ro` -> "ro")."""
    suffix = os.path.splitext(path)[1].lstrip(".")
    if not suffix:
        raise ConfigError(f"--input {path}: name each language's file with its language as suffix (train.en, "
                          "train.de)")
    return suffix


def read_corpora(paths: Sequence[str]) -> dict[str, list[str]]:
    """Each language's non-empty lines (one sentence a line), files of one language together."""
    corpora: dict[str, list[str]] = {}
    for path in paths:
        if not os.path.isfile(path):
            raise DataNotFoundError(f"--input {path} does not exist; give one text file per language, one sentence "
                                    "per line")
        with open(path, encoding="utf-8") as f:
            corpora.setdefault(language_of(path), []).extend(line.strip() for line in f if line.strip())
    if empty := [language for language, lines in corpora.items() if not lines]:
        raise DataError(f"--input: no sentences for {', '.join(empty)}; give files with one sentence per line")
    return corpora


def sample_sentences(corpora: Mapping[str, Sequence[str]], alpha: float, total: int,
                     seed: int = 0) -> dict[str, list[str]]:
    """Each language's share of `total` sentences (`sentence_counts`), drawn with replacement."""
    rng = np.random.default_rng(seed)
    counts = sentence_counts([len(lines) for lines in corpora.values()], alpha, total)
    return {language: [lines[i] for i in rng.integers(len(lines), size=count)]
            for (language, lines), count in zip(corpora.items(), counts)}


def train(paths: Sequence[str], out_dir: str, vocab_size: int, alpha: float = 0.5, sentences: int | None = None,
          seed: int = 0) -> dict:
    """Samples the languages' sentences, trains a `vocab_size`-piece SentencePiece model on them and
    writes `<out_dir>/spm.model` and `<out_dir>/languages.json` (each language's sentences, share and
    sampled sentences). `sentences` defaults to all the corpora's sentences together."""
    corpora = read_corpora(paths)
    total = sentences or sum(len(lines) for lines in corpora.values())
    sampled = sample_sentences(corpora, alpha, total, seed)
    texts = [text for lines in sampled.values() for text in lines]
    np.random.default_rng(seed).shuffle(texts)          # XLM shuffles bpe.train before learning
    os.makedirs(out_dir, exist_ok=True)
    shutil.copyfile(vocab_lib.train_sentencepiece(texts, vocab_size), os.path.join(out_dir, MODEL_FILE))
    sizes = {language: len(lines) for language, lines in corpora.items()}
    summary = {"alpha": alpha, "vocab_size": vocab_size, "sentences_sampled": total, "languages": {
        language: {"sentences": sizes[language], "share": sizes[language] / sum(sizes.values()),
                   "sampled": len(sampled[language])} for language in corpora}}
    with open(os.path.join(out_dir, LANGUAGES_FILE), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    return summary
