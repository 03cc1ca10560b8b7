"""T5's denoising objectives (Raffel et al. 2020, Tables 3-7), as `t5.data.preprocessors.denoise`.

An objective is three choices: a noise mask (`iid_noise_mask`, `random_spans_noise_mask`,
`random_prefix_noise_mask`), what the inputs show of it (`noise_span_to_unique_sentinel`,
`noise_token_to_sentinel`, `noise_token_to_random_token_or_sentinel`, `drop_noise_tokens`,
`permute_noise_tokens`, ...) and what the targets hold (the noise only, e.g.
`nonnoise_span_to_unique_sentinel` / `drop_nonnoise_tokens`, or the whole original: `None`).
`OBJECTIVES` names the paper's combinations. Mask functions are `fn(length, noise_density, rng)`,
inputs/targets functions `fn(tokens, noise_mask, vocabulary, rng)`; numpy, written from t5's
descriptions (TF random streams differ, the distributions do not).
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np

from t5lite.data import preprocessors as P
from t5lite.errors import ConfigError, UnknownNameError

Example = dict[str, Any]
NUM_RESERVED_TOKENS = 3  # pad, EOS, UNK are never drawn as random tokens (t5's default)


# ------------------------------------------------------------------------------- noise masks


def iid_noise_mask(length: int, noise_density: float, rng: np.random.Generator) -> np.ndarray:
    """Each token is noise independently with probability `noise_density`."""
    return rng.random(int(length)) < noise_density


def random_spans_noise_mask(length: int, noise_density: float, rng: np.random.Generator,
                            mean_noise_span_length: float = 3.0) -> np.ndarray:
    """T5's span mask: exactly round(length * density) noise tokens in spans of mean length `mean_noise_span_length`."""
    return P.random_spans_noise_mask(length, noise_density, mean_noise_span_length, rng)


def random_prefix_noise_mask(length: int, noise_density: float, rng: np.random.Generator) -> np.ndarray:
    """The first k tokens are noise (the prefix LM's inputs), k uniform in
    [max(1, round((1 - 2 * density) * (length - 1))), length - 1]; density 0.5 gives [1, length - 1]."""
    if noise_density > 0.5:
        raise ConfigError(f"random_prefix_noise_mask: noise_density must not exceed 0.5, got {noise_density}")
    max_inputs = int(length) - 1
    min_inputs = min(max_inputs, max(1, int(round((1 - 2 * noise_density) * max_inputs))))
    return np.arange(length) < rng.integers(min_inputs, max_inputs + 1)


# ------------------------------------------------------------------- inputs and targets functions


def _sentinel(vocabulary) -> int:
    """t5's single sentinel: the last id of the vocabulary (`<extra_id_0>`)."""
    return int(vocabulary.vocab_size) - 1


def noise_token_to_sentinel(tokens, noise_mask, vocabulary, rng=None) -> np.ndarray:
    """Every noise token becomes the sentinel (BERT's [MASK] without random tokens: MASS-style)."""
    return np.where(noise_mask, _sentinel(vocabulary), tokens).astype(tokens.dtype)


def noise_span_to_sentinel(tokens, noise_mask, vocabulary, rng=None) -> np.ndarray:
    """Every run of noise becomes one (the same) sentinel."""
    tokens = noise_token_to_sentinel(tokens, noise_mask, vocabulary)
    previous = np.concatenate([[False], noise_mask[:-1]])
    return tokens[~(noise_mask & previous)]


def nonnoise_span_to_sentinel(tokens, noise_mask, vocabulary, rng=None) -> np.ndarray:
    return noise_span_to_sentinel(tokens, ~noise_mask, vocabulary)


def noise_span_to_unique_sentinel(tokens, noise_mask, vocabulary, rng=None) -> np.ndarray:
    """Every run of noise becomes its own sentinel, counting down from the last id (span corruption)."""
    return P.noise_span_to_unique_sentinel(tokens, noise_mask, int(vocabulary.vocab_size))


def nonnoise_span_to_unique_sentinel(tokens, noise_mask, vocabulary, rng=None) -> np.ndarray:
    return P.nonnoise_span_to_unique_sentinel(tokens, noise_mask, int(vocabulary.vocab_size))


def drop_noise_tokens(tokens, noise_mask, vocabulary=None, rng=None) -> np.ndarray:
    return tokens[~noise_mask]


def drop_nonnoise_tokens(tokens, noise_mask, vocabulary=None, rng=None) -> np.ndarray:
    return tokens[noise_mask]


def permute_noise_tokens(tokens, noise_mask, vocabulary, rng) -> np.ndarray:
    """The noise tokens shuffled among their own positions; all noise = the deshuffling objective."""
    out = tokens.copy()
    out[noise_mask] = rng.permutation(tokens[noise_mask])
    return out


def noise_token_to_random_token(tokens, noise_mask, vocabulary, rng,
                                num_reserved_tokens: int = NUM_RESERVED_TOKENS) -> np.ndarray:
    """Every noise token becomes a uniform random id in [num_reserved_tokens, vocab_size)."""
    random = rng.integers(num_reserved_tokens, int(vocabulary.vocab_size), size=tokens.shape)
    return np.where(noise_mask, random, tokens).astype(tokens.dtype)


def noise_token_to_random_token_or_sentinel(tokens, noise_mask, vocabulary, rng,
                                            random_prob: float = 0.1) -> np.ndarray:
    """T5's BERT-style corruption: a noise token becomes a random token with `random_prob`, else the sentinel."""
    use_random = rng.random(tokens.shape) < random_prob
    return np.where(use_random, noise_token_to_random_token(tokens, noise_mask, vocabulary, rng),
                    noise_token_to_sentinel(tokens, noise_mask, vocabulary)).astype(tokens.dtype)


# ----------------------------------------------------------------------------- the preprocessor

MaskFn = Callable[..., np.ndarray]
TokensFn = Callable[..., np.ndarray]


def denoise(dataset: Iterable[Example], output_features: Mapping[str, Any], seed: int, noise_density: float,
            noise_mask_fn: MaskFn, inputs_fn: TokensFn, targets_fn: TokensFn | None = None) -> Iterator[Example]:
    """t5's `denoise` on tokenized `targets` (no EOS yet): inputs = inputs_fn(noise), targets =
    targets_fn(noise), or the original tokens when `targets_fn` is None. Example i draws from
    `np.random.default_rng([seed, 2, i])`."""
    vocabulary = output_features["targets"].vocabulary
    for i, ex in enumerate(dataset):
        rng = np.random.default_rng([seed, 2, i])
        tokens = np.asarray(ex["targets"], dtype=np.int32)
        noise_mask = np.asarray(noise_mask_fn(len(tokens), noise_density, rng=rng), dtype=bool)
        inputs = inputs_fn(tokens, noise_mask, vocabulary, rng)
        targets = tokens if targets_fn is None else targets_fn(tokens, noise_mask, vocabulary, rng)
        yield {"inputs": np.asarray(inputs, np.int32), "targets": np.asarray(targets, np.int32)}


def split_tokens_to_length(dataset: Iterable[Example], sequence_length: Mapping[str, int],
                           output_features: Mapping[str, Any], feature: str = "inputs") -> Iterator[Example]:
    """t5's `split_tokens_to_inputs_length` / `_targets_length`: pieces of `sequence_length[feature]`
    tokens, one fewer when that feature gets an EOS appended later."""
    length = int(sequence_length[feature]) - int(getattr(output_features[feature], "add_eos", True))
    return P.split_tokens(dataset, length)


def spans(mean_noise_span_length: float) -> MaskFn:
    """The span mask with a given mean span length, for the tables' span variants."""
    return functools.partial(random_spans_noise_mask, mean_noise_span_length=mean_noise_span_length)


# The paper's objectives: name -> (noise_density, noise_mask_fn, inputs_fn, targets_fn).
OBJECTIVES: dict[str, tuple[float, MaskFn, TokensFn, TokensFn | None]] = {
    "prefix_lm": (0.5, random_prefix_noise_mask, drop_nonnoise_tokens, drop_noise_tokens),
    "bert_style": (0.15, iid_noise_mask, noise_token_to_random_token_or_sentinel, None),
    "mass_style": (0.15, iid_noise_mask, noise_token_to_sentinel, None),
    "deshuffling": (1.0, iid_noise_mask, permute_noise_tokens, None),
    "iid_drop_tokens": (0.15, iid_noise_mask, drop_noise_tokens, drop_nonnoise_tokens),
}
for _density in (0.10, 0.15, 0.25, 0.50):  # Table 6: corruption rates
    OBJECTIVES[f"iid_replace_spans_{round(_density * 100)}"] = (
        _density, iid_noise_mask, noise_span_to_unique_sentinel, nonnoise_span_to_unique_sentinel)
for _mean in (2, 3, 5, 10):  # Table 7: span lengths
    OBJECTIVES[f"span_corruption_mean{_mean}"] = (
        0.15, spans(_mean), noise_span_to_unique_sentinel, nonnoise_span_to_unique_sentinel)


def t5_objective(name: str) -> Callable[..., Iterator[Example]]:
    """The `denoise` preprocessor of one of the paper's objectives, by name (see `OBJECTIVES`)."""
    if name not in OBJECTIVES:
        raise UnknownNameError(f"unknown T5 objective {name!r}; choose one of {sorted(OBJECTIVES)}")
    density, mask_fn, inputs_fn, targets_fn = OBJECTIVES[name]
    fn = functools.partial(denoise, noise_density=density, noise_mask_fn=mask_fn, inputs_fn=inputs_fn,
                           targets_fn=targets_fn)
    fn.__name__ = f"denoise_{name}"
    return fn


def causal_lm(dataset: Iterable[Example], sequence_length: Mapping[str, int],
              output_features: Mapping[str, Any], seed: int) -> Iterator[Example]:
    """t5's `full_lm`: a random chunk per document, EOS after each, 128 documents concatenated and
    cut into pieces of `sequence_length["targets"]`; EOS only marks document boundaries."""
    eos = getattr(output_features["targets"].vocabulary, "eos_id", P.EOS_ID)
    with_eos = ({"targets": np.append(ex["targets"], eos).astype(np.int32)}
                for ex in P.select_random_chunk(dataset, seed))
    return P.split_tokens(P.reduce_concat_tokens(with_eos), int(sequence_length["targets"]))
