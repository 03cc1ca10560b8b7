"""GPT-1's input transformations for fine-tuning a decoder-only model with a classifier on its last
token (Radford et al. 2018, section 3.3), and the converters that make model features of them.

- `gpt_inputs`: one text -> `start A extract`; a pair -> `start A delim B extract`, cut to the
  length longest-first; with `both_orders` (similarity tasks, where the pair has no order) also
  `start B delim A extract` as `swapped_inputs`, whose last-token state the model adds to the
  first order's.
- The start, delimiter and extract tokens are new symbols in GPT-1. Here they are the
  vocabulary's first three sentinels (`<extra_id_0..2>`, which a causal LM never trains on) unless
  `gpt_inputs.token_ids` names three ids; the model's vocab_size must cover them.
- `DecoderClassificationConverter` ("decoder_classification"; "decoder_classification_both_orders"
  for `both_orders` tasks) pads each order to the `inputs` length as `decoder_input_tokens` and
  `decoder_segment_ids` (1 on real tokens: the last 1 marks the extract token), the next token as
  `decoder_target_tokens` with `decoder_loss_weights` (for the auxiliary LM loss; the extract token
  predicts nothing), and `label` [1]; the second order's features are prefixed `swapped_`.
"""
from __future__ import annotations

from typing import Iterable, Iterator, Mapping, Sequence

import gin
import numpy as np

from t5lite.data.converters import EXAMPLES_KEY, FeatureConverter, Row, _length
from t5lite.data.finetune_converters import longest_first
from t5lite.data.registry import Example
from t5lite.errors import ConfigError

SWAPPED = "swapped_"   # prefix of the second order's features


def special_tokens(vocabulary, token_ids: Sequence[int] | None) -> tuple[int, int, int]:
    """(start, delim, extract): `token_ids`, or the vocabulary's sentinels 0, 1, 2."""
    if token_ids is not None:
        if len(token_ids) != 3:
            raise ConfigError(f"gpt_inputs.token_ids={list(token_ids)}: give three ids (start, delimiter, extract)")
        return tuple(int(i) for i in token_ids)
    if int(getattr(vocabulary, "extra_ids", 0) or 0) < 3:
        raise ConfigError(f"{vocabulary!r} has fewer than 3 extra ids for GPT's start/delimiter/extract tokens; give "
                          "it extra ids (vocabulary.extra_ids = 100) or set gpt_inputs.token_ids = (start, delim, extract)")
    return tuple(int(vocabulary.sentinel_id(i)) for i in range(3))


@gin.configurable(denylist=["dataset", "sequence_length", "output_features", "text_keys", "both_orders"])
def gpt_inputs(dataset: Iterable[Example], sequence_length: Mapping[str, int], output_features,
               text_keys: Sequence[str], both_orders: bool = False,
               token_ids: Sequence[int] | None = None) -> Iterator[Example]:
    """One or two text fields -> `inputs` (`start A (delim B) extract`) and, with `both_orders`,
    `swapped_inputs` (`start B delim A extract`); `label` and `idx` pass through."""
    if not 1 <= len(text_keys) <= 2 or (both_orders and len(text_keys) != 2):
        raise ConfigError(f"text_keys={list(text_keys)} (both_orders={both_orders}): GPT inputs take one or two "
                          "texts, two for both orders")
    vocabulary = output_features["inputs"].vocabulary
    start, delim, extract = special_tokens(vocabulary, token_ids)
    length = sequence_length["inputs"]
    budget = length - 1 - len(text_keys)
    if budget < len(text_keys):
        raise ConfigError(f"sequence length {length} leaves no room for text between GPT's special tokens; "
                          "use a longer 'inputs'")
    for ex in dataset:
        texts = [list(vocabulary.encode(ex[key])) for key in text_keys]
        if len(texts) == 1:
            texts[0] = texts[0][:budget]
        else:
            keep_a, keep_b = longest_first(len(texts[0]), len(texts[1]), budget)
            texts = [texts[0][:keep_a], texts[1][:keep_b]]
        join = lambda parts: np.asarray([start, *parts[0], *([delim, *parts[1]] if len(parts) > 1 else []), extract],
                                        np.int32)
        out = {"inputs": join(texts), "label": ex["label"],
               "inputs_pretokenized": " [DELIM] ".join(ex[key] for key in text_keys)}
        if both_orders:
            out[SWAPPED + "inputs"] = join(texts[::-1])
        if "idx" in ex:
            out["idx"] = ex["idx"]
        yield out


class DecoderClassificationConverter(FeatureConverter):
    """`gpt_inputs` examples -> decoder features for one order of each input (or both, `both_orders`)."""
    name = "decoder_classification"

    def __init__(self, both_orders: bool = False):
        self.both_orders = both_orders
        self.prefixes = ("", SWAPPED) if both_orders else ("",)

    def __repr__(self):
        return f"DecoderClassificationConverter(both_orders={self.both_orders})"

    def model_feature_lengths(self, task_feature_lengths, pack=False):
        length = _length(task_feature_lengths, "inputs", self.name)
        keys = ("decoder_input_tokens", "decoder_segment_ids", "decoder_target_tokens", "decoder_loss_weights")
        return {**{p + k: length for p in self.prefixes for k in keys}, "label": 1}

    def convert(self, examples: Iterable[Example], task_feature_lengths, pack=False) -> Iterator[Row]:
        if pack:
            raise ConfigError(f"the {self.name!r} converter does not pack fine-tuning examples; set train.pack = False")
        length = _length(task_feature_lengths, "inputs", self.name)
        for ex in examples:
            if (SWAPPED + "inputs" in ex) != self.both_orders:
                has, fits = ("one order", "decoder_classification") if self.both_orders else \
                    ("both orders", "decoder_classification_both_orders")
                raise ConfigError(f"the task's GPT inputs have {has}; use train.feature_converter = {fits!r}")
            row = {}
            for prefix in self.prefixes:
                row.update({prefix + k: v for k, v in self.order_features(ex[prefix + "inputs"], length).items()})
            label = np.asarray(ex["label"])
            row["label"] = label.reshape(1).astype(np.float32 if label.dtype.kind == "f" else np.int32)
            row[EXAMPLES_KEY] = 1
            yield row

    @staticmethod
    def order_features(tokens, length: int) -> dict[str, np.ndarray]:
        tokens = np.asarray(tokens, np.int32)
        n = len(tokens)
        if n > length:
            raise ConfigError(f"an example has {n} input tokens, more than the length {length}; gpt_inputs cuts them")
        out = {k: np.zeros(length, np.int32) for k in ("decoder_input_tokens", "decoder_segment_ids",
                                                      "decoder_target_tokens", "decoder_loss_weights")}
        out["decoder_input_tokens"][:n] = tokens
        out["decoder_segment_ids"][:n] = 1
        out["decoder_target_tokens"][:n - 1] = tokens[1:]
        out["decoder_loss_weights"][:n - 1] = 1
        return out
