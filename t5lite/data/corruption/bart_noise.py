"""BART's noising functions (Lewis et al. 2020), composable, on tokenized `targets` (no EOS yet).

Token masking, token deletion, text infilling (Poisson span lengths, each span becomes a single
[MASK]; a zero-length span inserts one), sentence permutation and document rotation, in two layouts:

- `layout="fairseq"` (the default): fairseq's `DenoisingDataset` (fairseq/data/denoising_dataset.py:
  `permute_sentences`, `add_whole_word_mask`, `add_insertion_noise`, `add_rolling_noise`), with
  BART's published pre-training settings: `--mask 0.3 --mask-length span-poisson --poisson-lambda 3.5
  --mask-random 0.1 --replace-length 1 --permute-sentences 1 --insert 0 --rotate 0`. The infilling
  masks ceil(0.3 x words) worth of whole words: spans start at random word starts (they may overlap
  and merge), a span's first token becomes [MASK] (10% of them a random id from 1 to vocab_size - 1,
  as fairseq draws them, special ids included) and the rest of the span is dropped; the zero-length
  spans are inserted afterwards at random places. Sentences end at the "." token (fairseq's full
  stop for GPT-2 BPE) and the document's last token. It is the default because it is what BART was
  trained with; the paper's description leaves the layout open.
- `layout="uniform"`: the paper's description as t5lite had it before: round(ratio x tokens)
  tokens covered by non-overlapping Poisson(3) spans laid out uniformly (stars and bars), every span
  exactly one [MASK], no random tokens, sentences ending at any piece ending in ".", "!" or "?".

Both apply the steps in fairseq's order (permute, mask, insert, rotate); `delete_ratio` is t5lite's
own deletion step after the mask (fairseq deletes through `replace_length=0`). Inputs are the noised
tokens, targets the original. t5lite's documents have no <s> and </s>; fairseq's counts that include
them (insertion counts, the rotation offset) are taken with them. Word starts come from the pieces
(`masking.word_starts`); fairseq also counts its special symbols as word starts.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Iterable, Iterator, Mapping

import gin
import numpy as np

from t5lite.data.corruption.masking import special_ids, word_starts
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


# --- fairseq's DenoisingDataset, on a document without its <s> and </s>. Its torch draws map to the
# generator's one for one: randperm(n) -> permutation(n), Categorical.sample(n) -> choice(.., n, p),
# uniform_() -> random(n), randint(lo, hi, n) -> integers(lo, hi, n).

def fairseq_span_distribution(poisson_lambda: float) -> np.ndarray:
    """P(span of k tokens/words), k = 0, 1, ...: Poisson(lambda) cut after the first term under 1e-7
    (at most 128 terms) and renormalised, as fairseq's `DenoisingDataset.__init__` builds it."""
    pmf = [math.exp(-poisson_lambda) * poisson_lambda ** k / math.factorial(k) for k in range(128)]
    size = next((k + 1 for k, p in enumerate(pmf) if p < 1e-7), len(pmf))
    return np.array(pmf[:size]) / sum(pmf[:size])


def fairseq_span_lengths(num_to_mask: int, probs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Span lengths drawn `num_to_mask` at a time until they cover it, the covering one cut to fit and
    the rest dropped (zero lengths kept)."""
    lengths = rng.choice(len(probs), size=num_to_mask, p=probs)
    while lengths.sum() < num_to_mask:
        lengths = np.concatenate([lengths, rng.choice(len(probs), size=num_to_mask, p=probs)])
    covered = np.cumsum(lengths)
    last = int(np.argmax(covered >= num_to_mask))
    lengths[last] = num_to_mask - (covered[last - 1] if last else 0)
    return lengths[:last + 1]


def _random_ids(count: int, vocab_size: int, rng: np.random.Generator) -> np.ndarray:
    """fairseq's random replacements: ids 1 .. vocab_size - 1, special ids included."""
    return rng.integers(1, vocab_size, size=count)


def insertion_noise(tokens: np.ndarray, p: float, mask_id: int, vocab_size: int, random_ratio: float,
                    rng: np.random.Generator) -> np.ndarray:
    """fairseq's `add_insertion_noise`: ceil(p x (length + 2)) new tokens at random places,
    ceil(random_ratio x that many) of them random ids, the others [MASK]."""
    count = math.ceil((len(tokens) + 2) * p)
    places = rng.permutation(len(tokens) + count)[:count]
    num_random = math.ceil(count * random_ratio)
    out = np.empty(len(tokens) + count, tokens.dtype)
    inserted = np.zeros(len(out), bool)
    inserted[places] = True
    out[places[num_random:]] = mask_id
    out[places[:num_random]] = _random_ids(num_random, vocab_size, rng)
    out[~inserted] = tokens
    return out


def whole_word_mask(tokens: np.ndarray, starts: np.ndarray, ratio: float, mask_id: int, vocab_size: int,
                    rng: np.random.Generator, span_probs: np.ndarray | None, random_ratio: float,
                    replace_length: int) -> np.ndarray:
    """fairseq's `add_whole_word_mask`: ceil(ratio x words) (counted in float32, as fairseq's tensor
    sum) spread over spans of `span_probs` lengths (None: one word each) starting at random word
    starts. `replace_length` 1: a span's first token becomes [MASK] (`random_ratio` of them a
    random id), the rest is dropped; 0: the span is dropped; -1: every token becomes [MASK]."""
    num_to_mask = math.ceil(np.float32(starts.sum()) * np.float32(ratio))
    if num_to_mask == 0:
        return tokens
    num_inserts = 0
    if span_probs is not None:
        lengths = fairseq_span_lengths(num_to_mask, span_probs, rng)
        num_inserts = int((lengths == 0).sum())
        lengths = lengths[lengths > 0]
        if len(lengths) == 0:
            return insertion_noise(tokens, num_inserts / (len(tokens) + 2), mask_id, vocab_size, random_ratio, rng)
    else:
        lengths = np.ones(num_to_mask, np.int64)
    word_first = np.flatnonzero(starts)
    positions = word_first[rng.permutation(len(word_first))[:len(lengths)]]
    random = rng.random(len(positions)) < random_ratio
    out, keep = tokens.copy(), np.ones(len(tokens), bool)
    if replace_length == 0:
        keep[positions] = False
    else:
        out[positions] = mask_id
        out[positions[random]] = _random_ids(int(random.sum()), vocab_size, rng)
    boundary = np.append(starts, 255).astype(np.int64)   # the end of the document ends every span
    lengths = lengths - 1
    while len(positions):
        if span_probs is not None:
            lengths = lengths - boundary[positions + 1]
            going = lengths >= 0
            lengths = lengths[going]
        else:
            going = boundary[positions + 1] == 0
        positions, random = positions[going] + 1, random[going]
        if replace_length != -1:
            keep[positions] = False
        else:
            out[positions] = mask_id
            out[positions[random]] = _random_ids(int(random.sum()), vocab_size, rng)
    out = out[keep]
    if num_inserts:
        out = insertion_noise(out, num_inserts / (len(out) + 2), mask_id, vocab_size, random_ratio, rng)
    return out


@functools.lru_cache(maxsize=8)
def _full_stop_table(vocabulary) -> np.ndarray:
    return np.array([vocabulary.id_to_piece(i) == "." for i in range(int(vocabulary.vocab_size))])


def full_stops(tokens: np.ndarray, vocabulary) -> np.ndarray:
    """True on the "." token (fairseq's `full_stop_index` for GPT-2 BPE)."""
    return _full_stop_table(vocabulary)[tokens]


def fairseq_sentence_permutation(tokens: np.ndarray, stops: np.ndarray, ratio: float,
                                 rng: np.random.Generator) -> np.ndarray:
    """fairseq's `permute_sentences`: a sentence ends at the first of a run of full stops and at the
    last token; ceil(ratio x count) sentences, chosen at random, are permuted among their places
    (tokens after the last sentence end stay)."""
    stops = stops.copy()
    stops[-1:] = True
    ends = np.flatnonzero(stops & ~np.append(False, stops[:-1])) + 1
    count = len(ends)
    num_to_permute = math.ceil((count * 2 * ratio) / 2.0)
    chosen = rng.permutation(count)[:num_to_permute]
    order = np.arange(count)
    order[chosen] = chosen[rng.permutation(num_to_permute)]
    begins = np.append(0, ends[:-1])
    out = tokens.copy()
    out[:ends[-1] if count else 0] = np.concatenate([tokens[begins[k]:ends[k]] for k in order] or [tokens[:0]])
    return out


def fairseq_rotation(tokens: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """fairseq's `add_rolling_noise`: rotated by a uniform offset in 0..length (both ends: unchanged)."""
    offset = int(rng.integers(1, max(1, len(tokens) + 1) + 1)) - 1
    return np.concatenate([tokens[offset:], tokens[:offset]])


LAYOUT_DEFAULTS = {"fairseq": {"poisson_lambda": 3.5, "random_ratio": 0.1},
                   "uniform": {"poisson_lambda": 3.0, "random_ratio": 0.0}}


def _check_settings(layout: str, mask_length: str, random_ratio: float, insert_ratio: float, replace_length: int):
    """One line naming the setting that `layout` / fairseq cannot take, and the fix."""
    if layout not in LAYOUT_DEFAULTS:
        raise ConfigError(f"bart_denoise: layout must be 'fairseq' or 'uniform', got {layout!r}")
    if mask_length not in ("span_poisson", "token"):
        raise ConfigError(f"bart_denoise: mask_length must be 'span_poisson' or 'token', got {mask_length!r}")
    if replace_length not in (-1, 0, 1) or (mask_length == "token" and replace_length == -1):
        raise ConfigError(f"bart_denoise: replace_length must be 1 or 0 (or -1 with mask_length='span_poisson'), "
                          f"got {replace_length!r}")
    if layout == "uniform" and (random_ratio or insert_ratio or replace_length != 1):
        raise ConfigError("bart_denoise: random_ratio, insert_ratio and replace_length are fairseq's; "
                          "layout='uniform' takes none of them (use layout='fairseq')")


def _fairseq_noise(tokens, vocabulary, mask_id, rng, permute_sentence_ratio, mask_ratio, mask_length, span_probs,
                   random_ratio, replace_length, delete_ratio, insert_ratio, rotate_ratio):
    """fairseq's `DenoisingDataset.__getitem__` steps (plus t5lite's deletion after the mask)."""
    size = int(vocabulary.vocab_size)
    if permute_sentence_ratio > 0:
        tokens = fairseq_sentence_permutation(tokens, full_stops(tokens, vocabulary), permute_sentence_ratio, rng)
    if mask_ratio > 0:
        spans = mask_length == "span_poisson"
        starts = word_starts(tokens, vocabulary) if spans else np.ones(len(tokens), bool)
        tokens = whole_word_mask(tokens, starts, mask_ratio, mask_id, size, rng, span_probs if spans else None,
                                 random_ratio, replace_length)
    if delete_ratio > 0:
        tokens = token_deletion(tokens, delete_ratio, rng)
    if insert_ratio > 0:
        tokens = insertion_noise(tokens, insert_ratio, mask_id, size, random_ratio, rng)
    if rotate_ratio > 0 and rng.random() < rotate_ratio:
        tokens = fairseq_rotation(tokens, rng)
    return tokens


def _uniform_noise(tokens, vocabulary, mask_id, rng, permute_sentence_ratio, mask_ratio, mask_length,
                   poisson_lambda, delete_ratio, rotate_ratio):
    """The paper's steps as t5lite laid them out before the fairseq layout."""
    if permute_sentence_ratio > 0:
        tokens = sentence_permutation(tokens, sentence_ends(tokens, vocabulary), permute_sentence_ratio, rng)
    if mask_ratio > 0:
        tokens = (text_infilling(tokens, mask_ratio, mask_id, rng, poisson_lambda) if mask_length == "span_poisson"
                  else token_masking(tokens, mask_ratio, mask_id, rng))
    if delete_ratio > 0:
        tokens = token_deletion(tokens, delete_ratio, rng)
    if rotate_ratio > 0 and rng.random() < rotate_ratio:
        tokens = document_rotation(tokens, rng)
    return tokens


@gin.configurable(denylist=["dataset", "output_features", "seed"])
def bart_denoise(dataset: Iterable[Example], output_features: Mapping[str, Any], seed: int, layout: str = "fairseq",
                 permute_sentence_ratio: float = 1.0, mask_ratio: float = 0.3, mask_length: str = "span_poisson",
                 poisson_lambda: float | None = None, random_ratio: float | None = None, replace_length: int = 1,
                 insert_ratio: float = 0.0, delete_ratio: float = 0.0, rotate_ratio: float = 0.0) -> Iterator[Example]:
    """BART's noise on `targets` (module docstring): sentence permutation, masking (`mask_length`
    "span_poisson": text infilling; "token": single tokens), deletion, insertion and with probability
    `rotate_ratio` a rotation; a ratio of 0 turns a step off. `poisson_lambda` and `random_ratio`
    default to the layout's: 3.5 and 0.1 for "fairseq" (BART's published command), 3.0 and none for
    "uniform" (the paper's lambda). Example i draws from `default_rng([seed, 5, i])`."""
    _check_settings(layout, mask_length, random_ratio or 0.0, insert_ratio, replace_length)
    defaults = LAYOUT_DEFAULTS[layout]
    poisson_lambda = defaults["poisson_lambda"] if poisson_lambda is None else poisson_lambda
    random_ratio = defaults["random_ratio"] if random_ratio is None else random_ratio
    vocabulary = output_features["targets"].vocabulary
    mask_id = special_ids(vocabulary)["mask"]
    span_probs = fairseq_span_distribution(poisson_lambda)
    for i, ex in enumerate(dataset):
        rng = np.random.default_rng([seed, 5, i])
        original = np.asarray(ex["targets"], dtype=np.int32)
        if layout == "fairseq":
            tokens = _fairseq_noise(original, vocabulary, mask_id, rng, permute_sentence_ratio, mask_ratio,
                                    mask_length, span_probs, random_ratio, replace_length, delete_ratio,
                                    insert_ratio, rotate_ratio)
        else:
            tokens = _uniform_noise(original, vocabulary, mask_id, rng, permute_sentence_ratio, mask_ratio,
                                    mask_length, poisson_lambda, delete_ratio, rotate_ratio)
        yield {"inputs": tokens, "targets": original}
