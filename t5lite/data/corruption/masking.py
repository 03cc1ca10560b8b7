"""BERT's masked LM, ELECTRA's generator masking and SpanBERT's span masking, on tokenized examples,
each as its upstream code draws it (`bert_mlm`, `electra_mlm`, `spanbert_mlm` say how and where
they differ).

Each chooses about `mask_rate` of the tokens (BERT and ELECTRA count [CLS] and [SEP] in; SpanBERT
counts the block between them), corrupts the choice ([MASK], a random token or unchanged), and
emits `inputs` (corrupted), `targets` (the original) and `targets_loss_weights` (nonzero exactly
on the chosen positions), which `EncoderFeatureConverter` turns into `encoder_*` features.

Words come from the vocabulary: a SentencePiece piece starting with "▁" (byte-level BPE: "Ġ")
starts a word, a WordPiece piece starting with "##" continues one (`word_starts`). Masking is
dynamic by default (a new mask each time the loader feeds the example: the loader gives every epoch its own seed) or
static (`static_seed` set: the mask depends only on that seed and the tokens, fixed across epochs;
`num_static_copies` emits each example that many times with different masks, RoBERTa's baseline).
"""
from __future__ import annotations

import functools
import math
import zlib
from typing import Any, Iterable, Iterator, Mapping

import gin
import numpy as np

from t5lite.errors import ConfigError

Example = dict[str, Any]


def special_ids(vocabulary) -> dict[str, int]:
    """The ids the encoder objectives use, for every vocabulary kind: [MASK] is the vocabulary's
    `mask_id`, else `<extra_id_0>`; [CLS] its `cls_id` (WordPiece), else its `bos_id` (byte-level
    BPE's `<s>`, as RoBERTa), else `<extra_id_1>`; [SEP] its `sep_id`, else EOS."""
    def own(name):
        value = getattr(vocabulary, name, None)
        return None if value is None else int(value)

    def sentinel(i):
        if int(getattr(vocabulary, "extra_ids", 0) or 0) <= i:
            raise ConfigError(f"{vocabulary!r} has no mask/CLS token and fewer than {i + 1} sentinels to stand in "
                              "for one; give it extra ids (vocabulary.extra_ids = 100)")
        return int(vocabulary.vocab_size) - 1 - i

    mask, cls, sep = own("mask_id"), own("cls_id"), own("sep_id")
    cls = own("bos_id") if cls is None else cls
    return {"mask": sentinel(0) if mask is None else mask, "cls": sentinel(1) if cls is None else cls,
            "sep": own("eos_id") if sep is None else sep}


def _never_masked(vocabulary) -> np.ndarray:
    """Sorted ids no objective may mask or draw as a random token: pad/EOS/UNK, CLS/SEP/[MASK], sentinels."""
    size = int(vocabulary.vocab_size)
    extra = int(getattr(vocabulary, "extra_ids", 0) or 0)
    ids = {0, int(getattr(vocabulary, "eos_id", 1)), int(getattr(vocabulary, "unk_id", 2)),
           *special_ids(vocabulary).values(), *range(size - extra, size)}
    return np.array(sorted(ids), dtype=np.int64)


@functools.lru_cache(maxsize=8)
def _regular_ids(vocabulary) -> np.ndarray:
    """The ids a random replacement may take: all but `_never_masked`."""
    return np.setdiff1d(np.arange(int(vocabulary.vocab_size)), _never_masked(vocabulary))


@functools.lru_cache(maxsize=8)
def _word_start_table(vocabulary) -> np.ndarray:
    if not hasattr(vocabulary, "id_to_piece"):
        raise ConfigError(f"whole-word masking reads word starts from the pieces, but {vocabulary!r} has no "
                          "id_to_piece; use a SentencePiece/WordPiece vocabulary or pass whole_word=False")
    pieces = [vocabulary.id_to_piece(i) for i in range(int(vocabulary.vocab_size))]
    wordpiece = any(p.startswith("##") for p in pieces)
    return np.array([not p.startswith("##") if wordpiece else p.startswith(("▁", "Ġ")) for p in pieces], dtype=bool)


def word_starts(tokens: np.ndarray, vocabulary) -> np.ndarray:
    """True where a token starts a word: a "▁" (SentencePiece) or "Ġ" (byte-level BPE) prefix, or
    no "##" (WordPiece)."""
    return _word_start_table(vocabulary)[np.asarray(tokens)]


def word_ids(tokens: np.ndarray, maskable: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Word index per token (-1 for unmaskable tokens); a word is a start plus its continuations,
    and an unmaskable token also ends a word (BERT's code would join a "##" piece right after [SEP]
    to the word before it, which only a front-truncated segment B can show; here no word crosses a
    special token)."""
    boundary = starts | ~maskable | np.concatenate([[True], ~maskable[:-1]])
    ids = np.cumsum(boundary & maskable) - 1
    return np.where(maskable, ids, -1)


RANDOM_POOLS = ("non_special", "vocabulary")


def random_pool(vocabulary, random_from: str = "non_special") -> np.ndarray:
    """The ids a random replacement is drawn from: "vocabulary" is every id (BERT's code draws from
    its whole vocab.txt, [CLS], [SEP], [MASK] and [unused*] included); "non_special" leaves out the
    ids no objective masks (pad/EOS/UNK, CLS/SEP/[MASK], sentinels), which t5lite's vocabularies
    have many of (100 sentinels, standing in for [MASK] and [CLS] where the vocabulary has none)."""
    if random_from == "vocabulary":
        return np.arange(int(vocabulary.vocab_size))
    if random_from == "non_special":
        return _regular_ids(vocabulary)
    raise ConfigError(f"random_from={random_from!r} is not a random-token pool; use one of {RANDOM_POOLS}")


def corrupt(tokens: np.ndarray, groups: Iterable[np.ndarray], vocabulary, rng: np.random.Generator,
            mask_token_rate: float = 0.8, random_token_rate: float = 0.1,
            random_from: str = "non_special") -> np.ndarray:
    """BERT's 80/10/10, drawn in the order BERT's `create_masked_lm_predictions` draws it: per group
    of positions (one token for `bert_mlm`), in the order given, one uniform for
    [MASK], then if unmasked one for kept vs random, then a token from `random_pool` per position."""
    pool = random_pool(vocabulary, random_from)
    kept_share = (1 - mask_token_rate - random_token_rate) / (1 - mask_token_rate) if mask_token_rate < 1 else 1.0
    out = np.array(tokens, dtype=np.int32)
    for positions in groups:
        if rng.random() < mask_token_rate:
            out[positions] = special_ids(vocabulary)["mask"]
        elif rng.random() >= kept_share:
            out[positions] = pool[rng.integers(len(pool), size=len(positions))]
    return out


def choose_whole_words(words: np.ndarray, num_to_predict: int, rng: np.random.Generator) -> list[np.ndarray]:
    """BERT's `create_masked_lm_predictions`: the words in random order, each taken whole unless it
    would take the total past `num_to_predict` (then skipped); the positions of the words taken, in
    the order taken."""
    sizes = np.bincount(words[words >= 0])
    taken, total = [], 0
    for word in rng.permutation(len(sizes)):
        if total >= num_to_predict:
            break
        if total + sizes[word] <= num_to_predict:
            taken.append(np.flatnonzero(words == word))
            total += sizes[word]
    return taken


def bert_num_to_predict(length: int, mask_rate: float, max_predictions_per_seq: int | None) -> int:
    """BERT's count: round(mask_rate x all the tokens, [CLS] and [SEP] included), at least 1, at most
    `max_predictions_per_seq` (None: no cap)."""
    count = max(1, int(round(length * mask_rate)))
    return count if max_predictions_per_seq is None else min(max_predictions_per_seq, count)


def _mask_rngs(seed: int, index: int, tokens: np.ndarray, static_seed: int | None, copies: int):
    """One generator per mask to draw: dynamic ones from (seed, index), which the loader changes every
    epoch; static ones from (static_seed, the tokens' checksum, copy), the same in every epoch."""
    if static_seed is None:
        return [np.random.default_rng([seed, 3, index])]
    digest = zlib.crc32(np.ascontiguousarray(tokens, dtype=np.int32).tobytes())
    return [np.random.default_rng([static_seed, 3, digest, copy]) for copy in range(copies)]


@gin.configurable(denylist=["dataset", "output_features", "seed"])
def bert_mlm(dataset: Iterable[Example], output_features: Mapping[str, Any], seed: int,
             mask_rate: float = 0.15, mask_token_rate: float = 0.8, random_token_rate: float = 0.1,
             whole_word: bool = True, static_seed: int | None = None, num_static_copies: int = 1,
             feature: str = "inputs", max_predictions_per_seq: int | None = None,
             random_from: str = "non_special") -> Iterator[Example]:
    """BERT's masked LM on `feature` (kept as `targets`), as google-research/bert's
    `create_masked_lm_predictions`: `bert_num_to_predict` tokens chosen among the maskable ones,
    as whole words when `whole_word` (BERT's --do_whole_word_mask, its whole-word-masking models),
    then `corrupt`; other features (e.g. `token_type_ids`) pass through.

    `max_predictions_per_seq` defaults to None, no cap: BERT's README sets its flag to about
    max_seq_length x masked_lm_prob (20 at 128, 80 at 512), a bound on its fixed-size
    masked_lm_positions that never binds on a sequence within max_seq_length; t5lite weights the
    positions in place, so a fixed number like 20 would only under-mask longer sequences.
    `random_from` defaults to "non_special" (see `random_pool`), not BERT's whole vocabulary: t5lite's
    vocabularies carry sentinels (the stand-ins for [MASK] and [CLS] among them, a third of the ids
    of a small test vocabulary), so a whole-vocabulary "random word" could be a mask or a structure
    token; "vocabulary" gives BERT's draws.
    """
    if num_static_copies > 1 and static_seed is None:
        raise ConfigError("bert_mlm: num_static_copies needs static masking; set static_seed (e.g. 0)")
    vocabulary = output_features[feature].vocabulary
    forbidden = _never_masked(vocabulary)
    for i, ex in enumerate(dataset):
        tokens = np.asarray(ex[feature], dtype=np.int32)
        maskable = ~np.isin(tokens, forbidden)
        starts = word_starts(tokens, vocabulary) if whole_word else np.ones(len(tokens), bool)
        words = word_ids(tokens, maskable, starts)
        num_to_predict = bert_num_to_predict(len(tokens), mask_rate, max_predictions_per_seq)
        for rng in _mask_rngs(seed, i, tokens, static_seed, num_static_copies):
            positions = np.concatenate([np.zeros(0, np.int64), *choose_whole_words(words, num_to_predict, rng)])
            inputs = corrupt(tokens, positions[:, None], vocabulary, rng, mask_token_rate, random_token_rate,
                             random_from)
            chosen = np.zeros(len(tokens), np.int32)
            chosen[positions] = 1
            yield {**ex, "inputs": inputs, "targets": tokens, "targets_loss_weights": chosen}


def electra_max_predictions(mask_rate: float, max_seq_length: int) -> int:
    """ELECTRA's `max_predictions_per_seq` (configure_pretraining.py): int((mask_prob + 0.005) x max_seq_length)."""
    return int((mask_rate + 0.005) * max_seq_length)


def electra_mlm(dataset: Iterable[Example], output_features: Mapping[str, Any], sequence_length: Mapping[str, int],
                seed: int, mask_rate: float = 0.15, mask_token_rate: float = 0.85,
                max_predictions_per_seq: int | None = None, feature: str = "inputs") -> Iterator[Example]:
    """ELECTRA's generator input, as its `pretrain_helpers.mask`: `bert_num_to_predict` over every
    token ([CLS] and [SEP] counted), capped at `max_predictions_per_seq` (None: `electra_max_predictions`
    of `sequence_length[feature]`, ELECTRA's config); that many positions drawn uniformly *with
    replacement* among the tokens other than [CLS], [SEP], [MASK] and padding (drawn as ELECTRA draws
    them: a cap's worth, the first ones used), each draw then [MASK] with probability
    `mask_token_rate`, else kept. `targets_loss_weights` counts the draws per position, so a position
    drawn twice weighs twice in the generator's loss, as in ELECTRA's masked_lm_weights. Unlike ELECTRA,
    such a position then gets one generator sample (`ElectraObjective`): ELECTRA's `scatter_update`
    writes the floor of the mean of its two samples' ids, which samples nothing."""
    vocabulary = output_features[feature].vocabulary
    ids = special_ids(vocabulary)
    cap = max_predictions_per_seq
    if cap is None:
        cap = electra_max_predictions(mask_rate, int(sequence_length[feature]))
    for i, ex in enumerate(dataset):
        rng = np.random.default_rng([seed, 7, i])
        tokens = np.asarray(ex[feature], dtype=np.int32)
        candidates = np.flatnonzero(~np.isin(tokens, [0, ids["cls"], ids["sep"], ids["mask"]]))
        num_to_predict = bert_num_to_predict(len(tokens), mask_rate, cap) if len(candidates) else 0
        positions = candidates[rng.integers(max(len(candidates), 1), size=cap)[:num_to_predict]]
        to_mask = rng.random(cap)[:num_to_predict] < mask_token_rate
        inputs = tokens.copy()
        inputs[positions[to_mask]] = ids["mask"]
        draws = np.bincount(positions, minlength=len(tokens)).astype(np.int32)
        yield {**ex, "inputs": inputs, "targets": tokens, "targets_loss_weights": draws}


def span_length_distribution(p: float = 0.2, max_span_words: int = 10) -> np.ndarray:
    """P(span of k words), k = 1..max: Geometric(p) clipped as SpanBERT's code does (renormalized over
    1..max, mean 3.8 words for p = 0.2, the paper's figure)."""
    weights = p * (1 - p) ** np.arange(max_span_words)
    return weights / weights.sum()


def span_mask(starts: np.ndarray, num_to_predict: int, rng: np.random.Generator, p: float = 0.2,
              max_span_words: int = 10) -> list[tuple[int, int]]:
    """SpanBERT's `PairWithSpanMaskingScheme.mask` over a block (`starts`: True where a word starts):
    until `num_to_predict` tokens are masked, a span length in words from `span_length_distribution`
    and a random anchor token (drawn again if already masked); the span runs from the anchor's word
    start over that many words (fewer at the block's end), adding tokens until the count is reached,
    so the last span may end inside a word. Spans may overlap or touch; returns them merged, sorted,
    as (first, last) inclusive (SpanBERT's `merge_intervals`)."""
    lengths = np.arange(1, max_span_words + 1)
    probs = span_length_distribution(p, max_span_words)
    word_begins = np.flatnonzero(np.concatenate([[True], starts[1:]])) if len(starts) else np.zeros(0, np.int64)
    masked = np.zeros(len(starts), bool)
    spans = []
    while masked.sum() < num_to_predict:
        num_words = int(rng.choice(lengths, p=probs))
        anchor = int(rng.integers(len(starts)))
        if masked[anchor]:
            continue
        word = int(np.searchsorted(word_begins, anchor, side="right")) - 1
        first = int(word_begins[word])
        end = int(word_begins[word + num_words]) if word + num_words < len(word_begins) else len(starts)
        new = np.cumsum(~masked[first:end])
        room = num_to_predict - int(masked.sum())
        last = first + int(np.argmax(new >= room)) if new[-1] >= room else end - 1
        masked[first:last + 1] = True
        spans.append((first, last))
    return _merge_spans(spans)


def _merge_spans(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Overlapping or touching (first, last) spans joined, sorted by first."""
    merged: list[list[int]] = []
    for first, last in sorted(spans):
        if merged and first <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], last)
        else:
            merged.append([first, last])
    return [(first, last) for first, last in merged]


def span_boundary_features(spans: list[tuple[int, int]], length: int, with_boundary_target: np.ndarray,
                           max_pair_targets: int) -> dict[str, np.ndarray]:
    """What SpanBERT's span boundary objective needs, for a sequence of `length` tokens: per span its
    first and last token (`span_starts`, `span_ends`, inclusive), and per token the left and right
    boundary positions (first - 1, last + 1) and the 1-based position in its span, on the first
    `max_pair_targets` tokens of the spans `with_boundary_target` (0 elsewhere), which
    `SpanBoundaryHead` takes and the `encoder_sbo` feature converter keeps."""
    left, right, relative = (np.zeros(length, np.int32) for _ in range(3))
    for (first, last), target in zip(spans, with_boundary_target):
        if target:
            kept = slice(first, min(last, first + max_pair_targets - 1) + 1)
            left[kept], right[kept] = first - 1, last + 1
            relative[kept] = np.arange(1, kept.stop - first + 1)
    return {"span_starts": np.array([f for f, _ in spans], np.int32),
            "span_ends": np.array([l for _, l in spans], np.int32),
            "span_left_boundary": left, "span_right_boundary": right, "span_relative_position": relative}


def corrupt_spans(tokens: np.ndarray, spans: list[tuple[int, int]], vocabulary, rng: np.random.Generator,
                  mask_token_rate: float = 0.8, random_token_rate: float = 0.1) -> np.ndarray:
    """SpanBERT's `span_masking` with --replacement-method span: one uniform per span, in order:
    below `mask_token_rate` [MASK] on every token, else below the two rates' sum a random token per
    position (from `random_pool`, one draw each), else kept."""
    pool, mask = random_pool(vocabulary), special_ids(vocabulary)["mask"]
    out = np.array(tokens, dtype=np.int32)
    for first, last in spans:
        draw = rng.random()
        for i in range(first, last + 1):
            if draw < mask_token_rate:
                out[i] = mask
            elif draw < mask_token_rate + random_token_rate:
                out[i] = pool[rng.integers(len(pool))]
    return out


def spanbert_mlm(dataset: Iterable[Example], output_features: Mapping[str, Any], seed: int,
                 mask_rate: float = 0.15, p: float = 0.2, max_span_words: int = 10,
                 mask_token_rate: float = 0.8, random_token_rate: float = 0.1, max_pair_targets: int = 15,
                 feature: str = "inputs") -> Iterator[Example]:
    """SpanBERT's masked LM as its code with the published recipe (--schemes pair_span, span 1-10,
    geometric-p 0.2, --replacement-method span, --endpoints external, --max-pair-targets 15) on
    [CLS] block [SEP] sequences: ceil(mask_rate x the block's tokens) masked by `span_mask`,
    `corrupt_spans`, and the span boundary features, with a boundary target only for the spans
    whose boundaries are both inside the block (not [CLS] or [SEP]), as SpanBERT's pair targets.
    One difference: a random token is drawn uniformly from `random_pool`, where SpanBERT draws it
    from the training corpus's token stream (its unigram frequencies), which t5lite does not hold."""
    vocabulary = output_features[feature].vocabulary
    for i, ex in enumerate(dataset):
        rng = np.random.default_rng([seed, 4, i])
        tokens = np.asarray(ex[feature], dtype=np.int32)
        block = tokens[1:-1]
        num_to_predict = math.ceil(len(block) * mask_rate)
        spans = [(first + 1, last + 1) for first, last in
                 span_mask(word_starts(block, vocabulary), num_to_predict, rng, p, max_span_words)]
        inner = np.array([first > 1 and last < len(block) for first, last in spans], bool)
        chosen = np.zeros(len(tokens), np.int32)
        for first, last in spans:
            chosen[first:last + 1] = 1
        yield {**ex, "inputs": corrupt_spans(tokens, spans, vocabulary, rng, mask_token_rate, random_token_rate),
               "targets": tokens, "targets_loss_weights": chosen,
               **span_boundary_features(spans, len(tokens), inner, max_pair_targets)}
