"""BART's noising functions (Lewis et al. 2020), composable, on tokenized `targets` (no EOS yet).

Token masking, token deletion, text infilling (span lengths ~ Poisson(3), each span, even an empty
one, becomes a single [MASK]), sentence permutation and document rotation. `bart_denoise` applies
them in the order of fairseq's `DenoisingDataset` (permute, mask, rotate; deletion, which fairseq
does through `replace_length=0`, comes after the mask); its defaults are the paper's pre-training
recipe: infilling 30% of tokens plus a full sentence permutation. Inputs are the noised tokens,
targets the original. Spans and masks are over tokens (fairseq can also count whole words).

The infilling is the paper's description, not fairseq's `add_whole_word_mask`: here round(ratio x
length) tokens are covered by non-overlapping spans laid out uniformly, and every span's tokens
become one [MASK]; fairseq masks ceil(ratio x words), starts spans at random word starts (they may
overlap), turns 10% of the span heads into random tokens (`--mask-random 0.1` in BART's recipe)
and adds the zero-length spans as insertions at random places.
"""
from __future__ import annotations

import functools
from typing import Any, Iterable, Iterator, Mapping

import numpy as np

from t5lite.data.corruption.masking import special_ids
from t5lite.errors import ConfigError

Example = dict[str, Any]
SENTENCE_END = (".", "!", "?")


def token_masking(tokens: np.ndarray, ratio: float, mask_id: int, rng: np.random.Generator) -> np.ndarray:
    """round(ratio * length) tokens, chosen uniformly, become [MASK]."""
    chosen = rng.permutation(len(tokens))[:int(round(ratio * len(tokens)))]
    out = tokens.copy()
    out[chosen] = mask_id
    return out


def token_deletion(tokens: np.ndarray, ratio: float, rng: np.random.Generator) -> np.ndarray:
    """round(ratio * length) tokens, chosen uniformly, are dropped."""
    keep = np.ones(len(tokens), bool)
    keep[rng.permutation(len(tokens))[:int(round(ratio * len(tokens)))]] = False
    return tokens[keep]


def poisson_span_lengths(num_to_mask: int, poisson_lambda: float, rng: np.random.Generator) -> np.ndarray:
    """Poisson(lambda) lengths drawn until they cover `num_to_mask`, the last cut so they sum to it exactly."""
    lengths: list[int] = []
    while sum(lengths) < num_to_mask:
        lengths.append(int(rng.poisson(poisson_lambda)))
    if lengths:
        lengths[-1] -= sum(lengths) - num_to_mask
    return np.array(lengths, dtype=np.int64)


def text_infilling(tokens: np.ndarray, ratio: float, mask_id: int, rng: np.random.Generator,
                   poisson_lambda: float = 3.0) -> np.ndarray:
    """BART's infilling: spans covering round(ratio * length) tokens, each replaced by one [MASK].

    The spans (zero-length ones included, which insert a [MASK]) are laid out in order with the
    unmasked tokens split into uniformly random gaps between them (stars and bars), so spans never
    overlap and every span keeps its own [MASK].
    """
    lengths = poisson_span_lengths(int(round(ratio * len(tokens))), poisson_lambda, rng)
    num_kept, num_spans = len(tokens) - int(lengths.sum()), len(lengths)
    bars = np.sort(rng.choice(num_kept + num_spans, num_spans, replace=False)) - np.arange(num_spans)
    gaps = np.diff(np.concatenate([[0], bars, [num_kept]]))
    pieces, position = [], 0
    for k, (gap, length) in enumerate(zip(gaps, np.append(lengths, 0))):
        pieces.append(tokens[position:position + gap])
        position += gap + length
        if k < num_spans:
            pieces.append(np.array([mask_id], tokens.dtype))
    return np.concatenate(pieces) if pieces else tokens


@functools.lru_cache(maxsize=8)
def _sentence_end_table(vocabulary) -> np.ndarray:
    return np.array([vocabulary.id_to_piece(i).endswith(SENTENCE_END) for i in range(int(vocabulary.vocab_size))])


def sentence_ends(tokens: np.ndarray, vocabulary) -> np.ndarray:
    """True on tokens whose piece ends a sentence (".", "!" or "?" at its end)."""
    return _sentence_end_table(vocabulary)[tokens]


def sentence_permutation(tokens: np.ndarray, ends: np.ndarray, ratio: float, rng: np.random.Generator) -> np.ndarray:
    """Sentences (split after each `ends` token; a trailing fragment counts as one) shuffled:
    ceil(ratio * count) of them, chosen at random, permuted among their own places (1.0: all)."""
    cuts = np.flatnonzero(ends) + 1
    sentences = np.split(tokens, cuts[cuts < len(tokens)])
    chosen = np.sort(rng.permutation(len(sentences))[:int(np.ceil(ratio * len(sentences)))])
    order = np.arange(len(sentences))
    order[chosen] = rng.permutation(chosen)
    return np.concatenate([sentences[k] for k in order]) if sentences else tokens


def document_rotation(tokens: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The document rotated to start at a uniformly random token other than the first."""
    return np.roll(tokens, -int(rng.integers(1, len(tokens)))) if len(tokens) > 1 else tokens


def bart_denoise(dataset: Iterable[Example], output_features: Mapping[str, Any], seed: int,
                 permute_sentence_ratio: float = 1.0, mask_ratio: float = 0.3, mask_length: str = "span_poisson",
                 poisson_lambda: float = 3.0, delete_ratio: float = 0.0, rotate_ratio: float = 0.0) -> Iterator[Example]:
    """BART's noise on `targets`: sentence permutation, then masking (`mask_length` "span_poisson":
    text infilling; "token": token masking), token deletion, and with probability `rotate_ratio` a
    document rotation; a ratio of 0 turns a step off. Example i draws from `default_rng([seed, 5, i])`."""
    if mask_length not in ("span_poisson", "token"):
        raise ConfigError(f"bart_denoise: mask_length must be 'span_poisson' or 'token', got {mask_length!r}")
    vocabulary = output_features["targets"].vocabulary
    mask_id = special_ids(vocabulary)["mask"]
    for i, ex in enumerate(dataset):
        rng = np.random.default_rng([seed, 5, i])
        original = np.asarray(ex["targets"], dtype=np.int32)
        tokens = original
        if permute_sentence_ratio > 0:
            tokens = sentence_permutation(tokens, sentence_ends(tokens, vocabulary), permute_sentence_ratio, rng)
        if mask_ratio > 0:
            tokens = (text_infilling(tokens, mask_ratio, mask_id, rng, poisson_lambda) if mask_length == "span_poisson"
                      else token_masking(tokens, mask_ratio, mask_id, rng))
        if delete_ratio > 0:
            tokens = token_deletion(tokens, delete_ratio, rng)
        if rotate_ratio > 0 and rng.random() < rotate_ratio:
            tokens = document_rotation(tokens, rng)
        yield {"inputs": tokens, "targets": original}
