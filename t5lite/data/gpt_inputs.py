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
  Packed, several examples share a row (`decoder_positions`, label slots; see the class).
"""
from __future__ import annotations

from typing import Iterable, Iterator, Mapping, Sequence

import gin
import numpy as np

from t5lite.data.converters import EXAMPLES_KEY, FeatureConverter, Row, _length, pad as pad_rows
from t5lite.data.finetune_converters import label_slots, longest_first, max_segments, packed_with_members
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
    """`gpt_inputs` examples -> decoder features for one order of each input (or both, `both_orders`).

    Packed (`pack=True`): greedy next-fit rows as seqio, `decoder_segment_ids` numbering the
    examples and `decoder_positions` restarting at each one's start token (both orders of an
    example have the same length, so they pack alike); each segment's LM targets stop at its own
    extract token, and `label` / `label_weights` are [length // 2] slots (slot k is segment k + 1;
    an example has at least its start and extract tokens)."""
    name = "decoder_classification"
    ORDER_KEYS = ("decoder_input_tokens", "decoder_segment_ids", "decoder_target_tokens", "decoder_loss_weights")

    def __init__(self, both_orders: bool = False):
        self.both_orders = both_orders
        self.prefixes = ("", SWAPPED) if both_orders else ("",)

    def __repr__(self):
        return f"DecoderClassificationConverter(both_orders={self.both_orders})"

    def model_feature_lengths(self, task_feature_lengths, pack=False):
        length = _length(task_feature_lengths, "inputs", self.name)
        keys = self.ORDER_KEYS + (("decoder_positions",) if pack else ())
        labels = dict.fromkeys(("label", "label_weights"), max_segments(length)) if pack else {"label": 1}
        return {**{p + k: length for p in self.prefixes for k in keys}, **labels}

    def convert(self, examples: Iterable[Example], task_feature_lengths, pack=False) -> Iterator[Row]:
        length = _length(task_feature_lengths, "inputs", self.name)
        orders = [p + "inputs" for p in self.prefixes]
        checked = self._checked(examples, length)
        rows = packed_with_members(checked, orders, length) if pack else \
            ((next(pad_rows([ex], dict.fromkeys(orders, length))), [ex]) for ex in checked)
        for row, members in rows:
            out = {}
            for prefix in self.prefixes:
                features = order_features(row[prefix + "inputs"], row[prefix + "inputs_segment_ids"])
                if pack:
                    features["decoder_positions"] = row[prefix + "inputs_positions"]
                out.update({prefix + k: v for k, v in features.items()})
            if pack:
                out.update(label_slots({"label": [ex["label"] for ex in members]}, len(members), max_segments(length)))
            else:
                label = np.asarray(members[0]["label"])
                out["label"] = label.reshape(1).astype(np.float32 if label.dtype.kind == "f" else np.int32)
            out[EXAMPLES_KEY] = len(members)
            yield out

    def _checked(self, examples: Iterable[Example], length: int) -> Iterator[Example]:
        """The examples, refusing ones whose orders do not fit the converter or that are too long."""
        for ex in examples:
            if (SWAPPED + "inputs" in ex) != self.both_orders:
                has, fits = ("one order", "decoder_classification") if self.both_orders else \
                    ("both orders", "decoder_classification_both_orders")
                raise ConfigError(f"the task's GPT inputs have {has}; use train.feature_converter = {fits!r}")
            if len(ex["inputs"]) > length:
                raise ConfigError(f"an example has {len(ex['inputs'])} input tokens, more than the length {length}; "
                                  "gpt_inputs cuts them")
            yield ex


def order_features(tokens: np.ndarray, segment_ids: np.ndarray) -> dict[str, np.ndarray]:
    """One order's features from a padded or packed row: each token's target is the next token of
    its own segment (the last token of a segment, its extract token, predicts nothing)."""
    same_next = (segment_ids[:-1] > 0) & (segment_ids[:-1] == segment_ids[1:])
    targets, weights = np.zeros_like(tokens), np.zeros_like(tokens)
    targets[:-1] = np.where(same_next, tokens[1:], 0)
    weights[:-1] = same_next
    return {"decoder_input_tokens": tokens.astype(np.int32), "decoder_segment_ids": segment_ids.astype(np.int32),
            "decoder_target_tokens": targets.astype(np.int32), "decoder_loss_weights": weights.astype(np.int32)}
