"""Feature converters: task features (`inputs`, `targets`) to model features, with optional packing.

A converter turns an iterator of task examples (dicts of 1-D int32 arrays, already EOS-terminated)
into fixed-length model-feature dicts named as in T5X/seqio (`encoder_input_tokens`,
`decoder_input_tokens`, ...). With `pack=True`, several examples share one row: the greedy
next-fit packer below concatenates them and adds `*_segment_ids` (1, 2, ... per example, 0 on
padding) and `*_positions` (restarting at 0 per example) so attention and position encodings can
keep the examples apart.

Every row also carries `_examples`, the number of source examples it consumed (1 when unpacked),
and `batch` sums it per batch. A loader that checkpoints "the next batch starts at example m" can
then resume exactly; strip `_examples` before feeding a batch to the model.

    converter = EncDecFeatureConverter()   # by name: converter_registry.get_feature_converter("enc_dec")
    rows = converter.convert(task.get_dataset("train"), {"inputs": 512, "targets": 114}, pack=True)
    for b in batch(rows, batch_size=128): ...
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from t5lite.errors import ConfigError, UnknownNameError

Example = Mapping[str, Any]
Row = dict[str, Any]

EXAMPLES_KEY = "_examples"


# ---------------------------------------------------------------------------------------------
# Packing


def _as_tokens(values) -> np.ndarray:
    """Tokens as a 1-D int32 array, whatever sequence type a preprocessor produced."""
    array = np.asarray(values, dtype=np.int32)
    if array.ndim != 1:
        raise ValueError(f"expected a 1-D sequence of ids, got shape {array.shape}")
    return array


def _trim(example: Example, lengths: Mapping[str, int]) -> dict[str, np.ndarray]:
    """Keeps only the features in `lengths`, each cut to its length (seqio trims, it does not drop)."""
    missing = [key for key in lengths if key not in example]
    if missing:
        raise KeyError(f"example has no feature(s) {missing}; it has {sorted(example)}")
    return {key: _as_tokens(example[key])[:length] for key, length in lengths.items()}


def _fits(used: Mapping[str, int], example: Mapping[str, np.ndarray], lengths: Mapping[str, int]) -> bool:
    return all(used[key] + len(example[key]) <= length for key, length in lengths.items())


def _make_row(examples: list[dict[str, np.ndarray]], lengths: Mapping[str, int]) -> Row:
    """Concatenates `examples` feature by feature, padded with 0, with segment ids and positions.

    Segment id k marks the k-th example of the row in every feature, even one where that example is
    empty, so encoder and decoder segment ids agree on which example a token belongs to. seqio
    numbers each feature's segments on its own (from positions == 0), so after an example with
    empty `inputs` its decoder segment k would cross-attend to another example's inputs; the rows
    are otherwise seqio's.
    """
    row: Row = {}
    for key, length in lengths.items():
        parts = [example[key] for example in examples]
        sizes = [len(part) for part in parts]
        used = sum(sizes)
        tokens, segment_ids, positions = (np.zeros(length, np.int32) for _ in range(3))
        tokens[:used] = np.concatenate(parts)
        segment_ids[:used] = np.repeat(np.arange(1, len(parts) + 1), sizes)
        positions[:used] = np.concatenate([np.arange(size) for size in sizes])
        row[key] = tokens
        row[f"{key}_segment_ids"] = segment_ids
        row[f"{key}_positions"] = positions
    row[EXAMPLES_KEY] = len(examples)
    return row


def pack(examples: Iterable[Example], lengths: Mapping[str, int], restart_every: int | None = None) -> Iterator[Row]:
    """Greedy next-fit packing, seqio's pure-TF rule: never looks back at an earlier row.

    Each example (trimmed to `lengths` first) joins the current row if every feature still fits,
    otherwise the row is emitted and the example starts a new one. Next-fit wastes a little more
    padding than best-fit but keeps the example order, so `_examples` counts map rows onto a
    prefix of the input stream and a loader can resume mid-stream.

    seqio (`utils.trim_and_pack_dataset`) packs within padded batches of max(lengths) examples, so
    it also closes a row after every max(lengths)-th example; `restart_every=max(lengths)` does
    the same and gives seqio's rows. The default, None, packs the stream without those breaks:
    they depend on where the stream started, and a loader resuming at example m must pack as the
    uninterrupted run did (the breaks add about one part-filled row per max(lengths) examples).
    """
    current: list[dict[str, np.ndarray]] = []
    used = dict.fromkeys(lengths, 0)
    for i, example in enumerate(examples):
        example = _trim(example, lengths)
        if current and (not _fits(used, example, lengths) or (restart_every and i % restart_every == 0)):
            yield _make_row(current, lengths)
            current, used = [], dict.fromkeys(lengths, 0)
        current.append(example)
        for key in lengths:
            used[key] += len(example[key])
    if current:
        yield _make_row(current, lengths)


def pad(examples: Iterable[Example], lengths: Mapping[str, int]) -> Iterator[Row]:
    """One example per row, in the same layout as `pack`, so converters can treat both alike."""
    for example in examples:
        yield _make_row([_trim(example, lengths)], lengths)


def _pack_or_pad(examples: Iterable[Example], lengths: Mapping[str, int], packed: bool,
                 restart_every: int | None = None) -> Iterator[Row]:
    return pack(examples, lengths, restart_every) if packed else pad(examples, lengths)


# ---------------------------------------------------------------------------------------------
# Feature helpers


def shift_right(tokens: np.ndarray, segment_ids: np.ndarray | None = None) -> np.ndarray:
    """Teacher-forcing inputs: tokens moved one step right with 0 (BOS) first.

    With `segment_ids` the shift stays inside each packed example: every segment start, and all
    padding, gets 0, so no example sees the previous one's last token. Without them this is seqio's
    unpacked behaviour, where the first padding position holds the final target token (EOS); it
    carries no loss weight.
    """
    shifted = np.zeros_like(tokens)
    shifted[1:] = tokens[:-1]
    if segment_ids is not None:
        previous = np.zeros_like(segment_ids)
        previous[1:] = segment_ids[:-1]
        shifted[segment_ids != previous] = 0
    return shifted


def _non_padding(tokens: np.ndarray) -> np.ndarray:
    """1 where a token is not the pad id 0 (seqio's loss weights)."""
    return (tokens != 0).astype(np.int32)


def _decoder_features(row: Row, packed: bool) -> Row:
    """The three features every autoregressive decoder needs, from the row's `targets`."""
    targets = row["targets"]
    return {
        "decoder_target_tokens": targets,
        "decoder_input_tokens": shift_right(targets, row["targets_segment_ids"] if packed else None),
        "decoder_loss_weights": _non_padding(targets),
    }


# ---------------------------------------------------------------------------------------------
# Converters


class FeatureConverter:
    """Shared pipeline: prepare each example, pack or pad, then map a row to model features.

    A subclass declares `FEATURES` (model feature -> the row feature whose length it has) and
    `PACKED` (model prefix -> the row feature whose segment ids and positions it uses), and
    implements `_row_lengths` and `_features`; `_prepare` reshapes an example before packing.
    """
    name: str = ""
    FEATURES: Mapping[str, str] = {}
    PACKED: Mapping[str, str] = {}

    def _row_lengths(self, task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
        raise NotImplementedError

    def _prepare(self, example: Example, task_feature_lengths: Mapping[str, int]) -> Example:
        return example

    def _features(self, row: Row, packed: bool) -> Row:
        raise NotImplementedError

    def model_feature_lengths(self, task_feature_lengths: Mapping[str, int], pack: bool = False) -> dict[str, int]:
        """Length of every array `convert` emits (with `pack`, including segment ids and positions)."""
        row_lengths = self._row_lengths(task_feature_lengths)
        lengths = {name: row_lengths[source] for name, source in self.FEATURES.items()}
        if pack:
            for prefix, source in self.PACKED.items():
                lengths[f"{prefix}_segment_ids"] = row_lengths[source]
                lengths[f"{prefix}_positions"] = row_lengths[source]
        return lengths

    def convert(self, examples: Iterable[Example], task_feature_lengths: Mapping[str, int],
                pack: bool = False, restart_every: int | None = None) -> Iterator[Row]:
        """Model-feature dicts of fixed-length int32 arrays, one per example or per packed row
        (`restart_every`: see `pack`)."""
        row_lengths = self._row_lengths(task_feature_lengths)
        prepared = (self._prepare(example, task_feature_lengths) for example in examples)
        for row in _pack_or_pad(prepared, row_lengths, pack, restart_every):
            features = self._features(row, pack)
            if pack:
                features.update(self._packing_features(row))
            features[EXAMPLES_KEY] = row[EXAMPLES_KEY]
            yield features

    def batch(self, rows: Iterable[Row], batch_size: int, drop_remainder: bool = True) -> Iterator[Row]:
        """The loader's batches of this converter's rows (`batch`; a converter may group them otherwise)."""
        return batch(rows, batch_size, drop_remainder)

    def _packing_features(self, row: Row) -> Row:
        features = {}
        for prefix, source in self.PACKED.items():
            features[f"{prefix}_segment_ids"] = row[f"{source}_segment_ids"]
            features[f"{prefix}_positions"] = row[f"{source}_positions"]
        return features

    def __repr__(self):
        return f"{type(self).__name__}()"


def _length(task_feature_lengths: Mapping[str, int], key: str, converter: str) -> int:
    if key not in task_feature_lengths:
        raise UnknownNameError(f"{converter} needs a length for {key!r}; got {dict(task_feature_lengths)}")
    return int(task_feature_lengths[key])


class EncDecFeatureConverter(FeatureConverter):
    """Encoder-decoder (T5, BART): `inputs` feed the encoder, the decoder predicts `targets`."""
    name = "enc_dec"
    FEATURES = {"encoder_input_tokens": "inputs", "decoder_target_tokens": "targets",
                "decoder_input_tokens": "targets", "decoder_loss_weights": "targets"}
    PACKED = {"encoder": "inputs", "decoder": "targets"}

    def _row_lengths(self, task_feature_lengths):
        return {key: _length(task_feature_lengths, key, self.name) for key in ("inputs", "targets")}

    def _features(self, row, packed):
        return {"encoder_input_tokens": row["inputs"], **_decoder_features(row, packed)}


class DecoderOnlyLMFeatureConverter(FeatureConverter):
    """Decoder-only language model (GPT): only `targets`, predicted left to right."""
    name = "decoder"
    FEATURES = {"decoder_target_tokens": "targets", "decoder_input_tokens": "targets",
                "decoder_loss_weights": "targets"}
    PACKED = {"decoder": "targets"}

    def _row_lengths(self, task_feature_lengths):
        return {"targets": _length(task_feature_lengths, "targets", self.name)}

    def _features(self, row, packed):
        return _decoder_features(row, packed)


class PrefixLMFeatureConverter(FeatureConverter):
    """Prefix LM: one decoder sequence `inputs + targets`, bidirectional over the prefix.

    `decoder_causal_attention` is 1 on the input positions plus one more (the position whose input
    token is the last prefix token and which predicts the first target), as in seqio and
    mesh_tensorflow. The loss covers only the target positions. Each feature is trimmed to its own
    length before concatenation, so the decoder length is len(inputs) + len(targets). The rows are
    seqio's `PrefixLMFeatureConverter`'s but for an example with empty `targets`: seqio appends one
    padding target to it, which unpacked widens its causal attention by a pad and packed shifts the
    next example's masks by one position; here it stays its inputs alone, with nothing to predict.
    """
    name = "prefix_lm"
    FEATURES = {"decoder_target_tokens": "targets", "decoder_input_tokens": "targets",
                "decoder_loss_weights": "targets", "decoder_causal_attention": "targets"}
    PACKED = {"decoder": "targets"}

    def _row_lengths(self, task_feature_lengths):
        length = sum(_length(task_feature_lengths, key, self.name) for key in ("inputs", "targets"))
        # `inputs_width` is an aligned per-token copy of len(inputs), packed alongside the tokens.
        return {"targets": length, "inputs_width": length}

    def _prepare(self, example, task_feature_lengths):
        inputs = _as_tokens(example["inputs"])[:task_feature_lengths["inputs"]]
        targets = _as_tokens(example["targets"])[:task_feature_lengths["targets"]]
        tokens = np.concatenate([inputs, targets])
        return {"targets": tokens, "inputs_width": np.full(len(tokens), len(inputs), np.int32)}

    def _features(self, row, packed):
        features = _decoder_features(row, packed)
        positions, width = row["targets_positions"], row["inputs_width"]
        in_example = row["targets_segment_ids"] > 0
        features["decoder_causal_attention"] = (in_example & (positions <= width)).astype(np.int32)
        features["decoder_loss_weights"] = features["decoder_loss_weights"] * (positions >= width)
        return features


SENTENCE_LABELS = ("next_sentence_label", "sentence_order_label")
SPAN_BOUNDARY_FEATURES = ("span_left_boundary", "span_right_boundary", "span_relative_position")


class EncoderFeatureConverter(FeatureConverter):
    """Encoder-only masked LM (BERT): aligned `inputs` and `targets`, loss on chosen positions.

    Loss weights come from the example's `targets_loss_weights` (or `loss_weights`) when present,
    since MLM scores only the masked positions; otherwise from `mask_id` (1 where the input is the
    mask token, seqio's rule) when given; otherwise 1 on every non-pad target. `token_type_ids`
    (BERT's sentence A/B) are taken from the example, or zeros. All features use the `inputs`
    length.

    Pre-training objectives beyond MLM keep more: `sentence_label` (BERT's `next_sentence_label`,
    ALBERT's `sentence_order_label`) becomes a [1] feature per row, so it needs one example per
    row (`pack=False`); `span_boundaries` keeps SpanBERT's per-token `span_left_boundary`,
    `span_right_boundary` (row positions: shifted by the example's offset when packed) and
    `span_relative_position` (1-based within the span; 0 off the spans); `positions` keeps the
    example's own `positions` as `encoder_positions` (XLM's TLM restarts them at the second sentence,
    Fake-English may give its language positions of its own), one example per row.
    """
    name = "encoder"
    _ALIGNED = ("inputs", "targets", "loss_weights", "token_type_ids")

    def __init__(self, mask_id: int | None = None, sentence_label: str | None = None,
                 span_boundaries: bool = False, positions: bool = False):
        if sentence_label not in (None, *SENTENCE_LABELS):
            raise ConfigError(f"EncoderFeatureConverter: sentence_label={sentence_label!r}; expected None or one of "
                              f"{SENTENCE_LABELS}")
        self.mask_id, self.sentence_label, self.span_boundaries = mask_id, sentence_label, span_boundaries
        # Features passed through under their own names: per token (aligned) and per example.
        self.kept = (SPAN_BOUNDARY_FEATURES if span_boundaries else ()) + ((sentence_label,) if sentence_label else ())
        self.positions = positions
        self.aligned = (self._ALIGNED + (SPAN_BOUNDARY_FEATURES if span_boundaries else ())
                        + (("positions",) if positions else ()))
        self.FEATURES = {"encoder_input_tokens": "inputs", "encoder_target_tokens": "inputs",
                         "encoder_loss_weights": "inputs", "token_type_ids": "inputs", **{k: k for k in self.kept},
                         **({"encoder_positions": "inputs"} if positions else {})}
        self.PACKED = {"encoder": "inputs"}

    def __repr__(self):
        return (f"{type(self).__name__}(mask_id={self.mask_id}, sentence_label={self.sentence_label!r}, "
                f"span_boundaries={self.span_boundaries})")

    def _check_pack(self, pack: bool) -> None:
        if pack and self.sentence_label:
            raise ConfigError(f"{self.sentence_label} is one label per example, so NSP/SOP pre-training needs one "
                              "example per row: set train.pack = False")
        if pack and self.positions:
            raise ConfigError("the encoder_positions converter keeps each example's own positions, which packing "
                              "would overwrite: set train.pack = False")

    def model_feature_lengths(self, task_feature_lengths, pack=False):
        self._check_pack(pack)
        return super().model_feature_lengths(task_feature_lengths, pack)

    def convert(self, examples, task_feature_lengths, pack=False, restart_every=None):
        self._check_pack(pack)
        return super().convert(examples, task_feature_lengths, pack, restart_every)

    def _row_lengths(self, task_feature_lengths):
        lengths = dict.fromkeys(self.aligned, _length(task_feature_lengths, "inputs", self.name))
        if self.sentence_label:
            lengths[self.sentence_label] = 1
        return lengths

    def _loss_weights(self, example: Example, inputs: np.ndarray, targets: np.ndarray) -> np.ndarray:
        for key in ("targets_loss_weights", "loss_weights"):
            if key in example:
                return _as_tokens(example[key])
        if self.mask_id is not None:
            return (inputs == self.mask_id).astype(np.int32)
        return _non_padding(targets)

    def _prepare(self, example, task_feature_lengths):
        inputs, targets = _as_tokens(example["inputs"]), _as_tokens(example["targets"])
        prepared = {"inputs": inputs, "targets": targets,
                    "loss_weights": self._loss_weights(example, inputs, targets),
                    "token_type_ids": _as_tokens(example.get("token_type_ids", np.zeros_like(inputs)))}
        for key in self.kept + (("positions",) if self.positions else ()):
            if key not in example:
                raise KeyError(f"{self!r} needs the example feature {key!r}, which the task's preprocessors did not "
                               f"produce (it has {sorted(example)}); use the matching task or converter")
            prepared[key] = _as_tokens(np.reshape(example[key], (1,)) if key == self.sentence_label else example[key])
        sizes = {key: len(prepared[key]) for key in self.aligned}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"encoder features must be aligned (same length), got {sizes}")
        return prepared

    def _features(self, row, packed):
        features = {"encoder_input_tokens": row["inputs"], "encoder_target_tokens": row["targets"],
                    "encoder_loss_weights": row["loss_weights"], "token_type_ids": row["token_type_ids"]}
        if self.sentence_label:
            features[self.sentence_label] = row[self.sentence_label]
        if self.positions:
            features["encoder_positions"] = row["positions"]
        if self.span_boundaries:
            in_span = row["span_relative_position"] > 0
            offset = np.arange(len(in_span)) - row["inputs_positions"] if packed else 0
            for key in ("span_left_boundary", "span_right_boundary"):
                features[key] = np.where(in_span, row[key] + offset, 0).astype(np.int32)
            features["span_relative_position"] = row["span_relative_position"]
        return features


# ---------------------------------------------------------------------------------------------
# Batching


def _stack(rows: list[Row]) -> Row:
    stacked = {key: np.stack([row[key] for row in rows]) for key in rows[0] if key != EXAMPLES_KEY}
    stacked[EXAMPLES_KEY] = sum(int(row.get(EXAMPLES_KEY, 1)) for row in rows)
    return stacked


def batch(rows: Iterable[Row], batch_size: int, drop_remainder: bool = True) -> Iterator[Row]:
    """Stacks `batch_size` rows into [batch, length] arrays; `_examples` becomes their sum.

    The sum tells a resumable loader how many source examples the batch consumed (a row without
    `_examples` counts as one). With `drop_remainder`, a last short batch is dropped so every
    batch has a static shape for `jit`.
    """
    if batch_size < 1:
        raise ConfigError(f"batch_size must be positive, got {batch_size}")
    pending: list[Row] = []
    for row in rows:
        pending.append(row)
        if len(pending) == batch_size:
            yield _stack(pending)
            pending = []
    if pending and not drop_remainder:
        yield _stack(pending)


def bucket_widths(length: int, count: int = 4) -> tuple[int, ...]:
    """Up to `count` padded widths, `length` and its halvings (rounded up to a multiple of 8, at
    least 8), shortest first: the shapes length-bucketed batches compile to."""
    if count < 1:
        raise ConfigError(f"length buckets must be at least 1, got {count}")
    widths = {length}
    for k in range(1, count):
        widths.add(min(length, max(8, -(-length // 2 ** k // 8) * 8)))
    return tuple(sorted(widths))


def length_buckets(lengths: Sequence[int], batch_size: int, max_length: int, count: int = 4) -> list[tuple[np.ndarray, int]]:
    """Batches of similar length for evaluation: (example indices, padded width) per batch.

    The examples are sorted by length (stably) and cut into `batch_size` chunks, each padded to the
    smallest of `bucket_widths(max_length, count)` that holds its longest, so padding shrinks with
    at most `count` compiled shapes; concatenating the indices gives the order to undo. `count=1`
    keeps the input order at `max_length`."""
    if batch_size < 1:
        raise ConfigError(f"batch_size must be positive, got {batch_size}")
    lengths = np.asarray(lengths, np.int64)
    widths = np.asarray(bucket_widths(max_length, count))
    order = np.argsort(lengths, kind="stable") if count > 1 else np.arange(len(lengths))
    out = []
    for start in range(0, len(order), batch_size):
        indices = order[start:start + batch_size]
        longest = int(lengths[indices].max(initial=0))
        out.append((indices, int(widths[np.searchsorted(widths, min(longest, max_length))])))
    return out


def restore_order(values: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Rows given in `order` (the concatenated indices of `length_buckets`) put back in input order."""
    out = np.empty_like(values)
    out[order] = values
    return out

