"""BERT-style inputs for fine-tuning encoders with a task head: the tokenizer step and the converters.

The tokenizer step is a preprocessor (it needs the vocabulary and the length, which a task's
preprocessors are given), doing what Hugging Face's tokenizer call does:
- `sentence_inputs`: `[CLS] A [SEP] (B [SEP])` with `token_type_ids` 0 / 1, cut to the length
  longest-first for pairs (the `tokenizers` rule), and the label kept as it is (a class id, or
  STS-B's float score);
- `squad_windows`: `[CLS] question [SEP] context-window [SEP]`, windows over the context
  overlapping by `doc_stride` tokens (run_qa's `stride`), each with the answer's start/end token
  (or 0, the [CLS] index, when the answer is not inside the window) and the context tokens'
  character offsets, so predictions map back to the original text;
- `tagging_inputs`: a sentence of words with a tag each -> `[CLS] subwords [SEP]` windows, the
  tag's id on each word's first subword and IGNORE elsewhere (run_ner's
  `tokenize_and_align_labels`), or on all its subwords with `label_all_subwords`.

The converters pad to the length and name the model features: `encoder_input_tokens`,
`token_type_ids` and the labels ([batch, 1] arrays `label`, or `start_position`/`end_position`;
[batch, length] `tag_ids` for tagging).
All three also pack (`pack=True`): several examples per row, greedy next-fit as seqio, with
`encoder_segment_ids` / `encoder_positions` (attention confined to each example, positions
restarting at its [CLS]); per-example labels go in one slot per possible example, `label` or
`start_position`/`end_position` and `label_weights` [batch, length // 2] (slot k is segment k + 1;
an example has at least [CLS] and [SEP], so a row never holds more; span positions index the
row), and `tag_ids` are packed like the tokens, so each head reads its own segment and padding
computes nothing but the unused slots.

For a windowed (Longformer) encoder, `global_tokens.which` marks each example's global tokens in
`encoder_global_attention_mask`, packed like the tokens: "first" its first token ([CLS] / <s>, as
transformers' LongformerForSequenceClassification marks it), "question" its first segment (the
tokens before its first separator, as transformers' `_compute_global_attention_mask` marks a QA
question).
"""
from __future__ import annotations

import re
from typing import Iterable, Iterator, Mapping, Sequence

import gin
import numpy as np

from t5lite.data import vocab as vocab_lib
from t5lite.data.converters import EXAMPLES_KEY, FeatureConverter, Row, _length, pack as pack_rows
from t5lite.data.corruption.masking import special_ids
from t5lite.data.registry import Example
from t5lite.errors import ConfigError, DataError

GLOBAL_TOKENS = ("first", "question")
GLOBAL_MASK = "encoder_global_attention_mask"
CLS_INDEX = 0   # SQuAD's "no answer in this window" target, as in Hugging Face's run_qa
IGNORE = -100   # a tagging position without a label (special tokens, later subwords, padding), as in run_ner


# ----------------------------------------------------------------------------- tokenizer step

def longest_first(len_a: int, len_b: int, budget: int) -> tuple[int, int]:
    """How many tokens of A and of B to keep so that they fit `budget` (the `tokenizers`
    LongestFirst rule: cut only the longer one while that suffices, else both to about half)."""
    if len_a + len_b <= budget:
        return len_a, len_b
    short, long = sorted((len_a, len_b))
    long = short if short > budget else max(short, budget - short)
    if short + long > budget:
        short, long = budget // 2, budget // 2 + budget % 2
    return (long, short) if len_a > len_b else (short, long)


def _build(segments: Sequence[Sequence[int]], cls: int, sep: int) -> tuple[np.ndarray, np.ndarray]:
    """[CLS] s0 [SEP] (s1 [SEP]): tokens and token type ids."""
    tokens, types = [cls], [0]
    for kind, segment in enumerate(segments):
        tokens += [*segment, sep]
        types += [kind] * (len(segment) + 1)
    return np.asarray(tokens, np.int32), np.asarray(types, np.int32)


def sentence_inputs(dataset: Iterable[Example], sequence_length: Mapping[str, int], output_features,
                    text_keys: Sequence[str]) -> Iterator[Example]:
    """One or two text fields -> `inputs` ([CLS] A [SEP] (B [SEP])) and `token_type_ids`, cut to
    `sequence_length["inputs"]`; the example's `label` and id pass through, the texts are kept
    as `inputs_pretokenized`."""
    if not 1 <= len(text_keys) <= 2:
        raise ConfigError(f"text_keys={list(text_keys)}: BERT inputs take one or two texts")
    vocabulary = output_features["inputs"].vocabulary
    ids = special_ids(vocabulary)
    length = sequence_length["inputs"]
    budget = length - 1 - len(text_keys)
    if budget < len(text_keys):
        raise ConfigError(f"sequence length {length} leaves no room for text after [CLS]/[SEP]; use a longer 'inputs'")
    for ex in dataset:
        segments = [vocabulary.encode(ex[key]) for key in text_keys]
        if len(segments) == 1:
            segments[0] = segments[0][:budget]
        else:
            keep_a, keep_b = longest_first(len(segments[0]), len(segments[1]), budget)
            segments = [segments[0][:keep_a], segments[1][:keep_b]]
        tokens, types = _build(segments, ids["cls"], ids["sep"])
        out = {"inputs": tokens, "token_type_ids": types, "label": ex["label"],
               "inputs_pretokenized": " [SEP] ".join(ex[key] for key in text_keys)}
        if "idx" in ex:
            out["idx"] = ex["idx"]
        yield out


def window_starts(num_tokens: int, window: int, stride: int) -> list[int]:
    """Starts of the context windows: every `window - stride` tokens until one reaches the end
    (the `tokenizers` overflow rule behind run_qa's `doc_stride`)."""
    if stride >= window:
        raise ConfigError(f"doc_stride={stride} must be smaller than the context window ({window} tokens); "
                          "lower doc_stride or raise the 'inputs' length")
    starts = [0]
    while starts[-1] + window < num_tokens:
        starts.append(starts[-1] + window - stride)
    return starts


def answer_span(offsets: np.ndarray, start_char: int, end_char: int) -> tuple[int, int] | None:
    """Token indices (inclusive) of the window's context tokens covering [start_char, end_char),
    or None if the answer is not wholly inside the window (run_qa's rule)."""
    if len(offsets) == 0 or not (offsets[0, 0] <= start_char and offsets[-1, 1] >= end_char):
        return None
    start = int(np.nonzero(offsets[:, 0] <= start_char)[0][-1])
    end = int(np.nonzero(offsets[:, 1] >= end_char)[0][0])
    return start, end


@gin.configurable(denylist=["dataset", "sequence_length", "output_features"])
def squad_windows(dataset: Iterable[Example], sequence_length: Mapping[str, int], output_features,
                  doc_stride: int = 128) -> Iterator[Example]:
    """SQuAD examples (question, context, answers) -> one example per context window.

    Each has `inputs`, `token_type_ids`, `start_position`/`end_position` of the first answer
    (CLS_INDEX outside the window), `offsets` [length, 2] (characters of the context; -1 on
    question and special tokens), and the `id`, `context` and gold `answers` texts for scoring.
    `doc_stride` (gin: `squad_windows.doc_stride`) must stay below the context window."""
    vocabulary = output_features["inputs"].vocabulary
    if not hasattr(vocabulary, "encode_with_offsets"):
        raise ConfigError(f"SQuAD windows map answers through character offsets, which {vocabulary!r} does not give; "
                          "use a WordPiece vocabulary (train.vocabulary_path = a BERT vocab.txt or tokenizer.json)")
    ids = special_ids(vocabulary)
    length = sequence_length["inputs"]
    for ex in dataset:
        question = vocabulary.encode(ex["question"].lstrip())
        context, offsets = vocabulary.encode_with_offsets(ex["context"])
        offsets = np.asarray(offsets, np.int32).reshape(-1, 2)
        window = length - len(question) - 3
        if window <= doc_stride:
            raise ConfigError(f"question {ex['id']!r} leaves {window} context tokens per window at length {length}, "
                              f"not more than doc_stride={doc_stride}; raise 'inputs' or lower doc_stride")
        answers = ex["answers"]
        start_char = answers["answer_start"][0] if answers["text"] else None
        for start in window_starts(len(context), window, doc_stride):
            stop = min(start + window, len(context))
            tokens, types = _build([question, context[start:stop]], ids["cls"], ids["sep"])
            first = len(question) + 2                       # the window's first context token
            token_offsets = np.full((len(tokens), 2), -1, np.int32)
            token_offsets[first:first + stop - start] = offsets[start:stop]
            span = None
            if start_char is not None:
                span = answer_span(offsets[start:stop], start_char, start_char + len(answers["text"][0]))
            start_pos, end_pos = (CLS_INDEX, CLS_INDEX) if span is None else (first + span[0], first + span[1])
            yield {"inputs": tokens, "token_type_ids": types, "start_position": start_pos,
                   "end_position": end_pos, "offsets": token_offsets, "id": ex["id"], "context": ex["context"],
                   "answers": list(answers["text"]), "inputs_pretokenized": ex["question"]}


def word_windows(piece_counts: Sequence[int], budget: int) -> list[tuple[int, int]]:
    """Consecutive word ranges [a, b) whose subwords fit `budget` each (a word longer than the
    budget alone gets a window of its own and is cut there)."""
    windows, start, used = [], 0, 0
    for i, n in enumerate(piece_counts):
        if used and used + n > budget:
            windows.append((start, i))
            start, used = i, 0
        used += n
    windows.append((start, len(piece_counts)))
    return windows


def _continuation(tag_id: int, names: Sequence[str]) -> int:
    """The label of a word's later subwords under `label_all_subwords`: B-X becomes I-X (run_ner's
    `b_to_i_label`) when I-X is a tag."""
    name = names[tag_id]
    inside = "I-" + name[2:] if name.startswith("B-") else None
    return names.index(inside) if inside in names else tag_id


@gin.configurable(denylist=["dataset", "sequence_length", "output_features", "label_names"])
def tagging_inputs(dataset: Iterable[Example], sequence_length: Mapping[str, int], output_features,
                   label_names: Sequence[str], label_all_subwords: bool = False) -> Iterator[Example]:
    """Sentences `{"id", "words", "tags"}` -> one example per window of words, each with `inputs`
    ([CLS] subwords [SEP]; each word's subwords as `vocab.word_pieces` gives them, so byte-level BPE
    words carry their leading space as in `run_ner`), `token_type_ids` (0), `tag_ids` (the tag's index in `label_names` on
    each word's first subword, IGNORE elsewhere; `label_all_subwords`, gin:
    `tagging_inputs.label_all_subwords`, labels every subword), `word_positions` (each window word's
    first-subword index, -1 for a word with no subword) and, for scoring, `window_start` (its first
    word), the sentence's `words`, `tags` and the `label_names`."""
    vocabulary = output_features["inputs"].vocabulary
    ids = special_ids(vocabulary)
    length = sequence_length["inputs"]
    if length < 3:
        raise ConfigError(f"sequence length {length} leaves no room for words after [CLS]/[SEP]; use a longer 'inputs'")
    index = {name: i for i, name in enumerate(label_names)}
    names = tuple(label_names)
    for ex in dataset:
        unknown = sorted(set(ex["tags"]) - set(index))
        if unknown:
            raise DataError(f"sentence {ex['id']!r} has tags {unknown} outside the task's {list(names)}; "
                            "register the task with those tags or fix the file")
        pieces = [p[:length - 2] for p in vocab_lib.word_pieces(vocabulary, ex["words"])]
        for start, stop in word_windows([len(p) for p in pieces], length - 2):
            tokens, tag_ids, positions = [ids["cls"]], [IGNORE], []
            for word, tag in zip(pieces[start:stop], ex["tags"][start:stop]):
                positions.append(len(tokens) if word else -1)
                first = index[tag]
                later = _continuation(first, names) if label_all_subwords else IGNORE
                tokens += word
                tag_ids += [first] + [later] * (len(word) - 1)
            tokens.append(ids["sep"])
            tag_ids.append(IGNORE)
            yield {"inputs": np.asarray(tokens, np.int32), "token_type_ids": np.zeros(len(tokens), np.int32),
                   "tag_ids": np.asarray(tag_ids, np.int32), "word_positions": np.asarray(positions, np.int32),
                   "window_start": start, "id": ex["id"], "words": list(ex["words"]), "tags": list(ex["tags"]),
                   "label_names": names, "inputs_pretokenized": " ".join(ex["words"][start:stop])}


@gin.configurable
def global_tokens(which: str | None = None) -> str | None:
    """Which tokens of each example attend, and are attended, globally in a windowed encoder: None
    (none; no feature), "first" or "question" (see the module's docstring). Training and evaluation
    read the same binding."""
    if which is not None and which not in GLOBAL_TOKENS:
        raise ConfigError(f"global_tokens.which={which!r}: expected None or one of {GLOBAL_TOKENS}")
    return which


def check_recorded_global_tokens(config_gin: str, run: str) -> None:
    """Refuses to read `run` with other global tokens than it was trained with (its config.gin's
    `global_tokens.which`): a windowed encoder scores differently without them."""
    found = re.search(r"^global_tokens\.which = (.+)$", config_gin, flags=re.M)
    trained = found.group(1).strip() if found else "None"
    if trained != repr(global_tokens()):
        raise ConfigError(f"{run} was trained with global_tokens.which = {trained}, and this command marks "
                          f"{global_tokens()!r}: add --gin.global_tokens.which=\"{trained}\"")


def global_marks(tokens: np.ndarray, which: str) -> np.ndarray:
    """1 on an example's global tokens. An example ends with its separator ([SEP], </s>), the same
    id that closes its first segment, so the first segment is what precedes the first occurrence of
    the last token."""
    marks = np.zeros(len(tokens), np.int32)
    if which == "first":
        marks[:1] = 1
    else:
        marks[:int(np.flatnonzero(tokens == tokens[-1])[0])] = 1
    return marks


# ----------------------------------------------------------------------------- converters

class EncoderTaskConverter(FeatureConverter):
    """Pads `inputs` / `token_type_ids` to the `inputs` length and adds the `LABELS` as [1] rows;
    an example's own `positions` (a Fake-English one's) come as `encoder_positions`.

    Packed (`pack=True`): greedy next-fit rows as seqio with `encoder_segment_ids` /
    `encoder_positions`, and each example's `LABELS` in its slot of [length // 2] arrays (slot k
    is segment k + 1) with `label_weights` marking the filled slots."""
    LABELS: tuple[str, ...] = ()         # per-example labels
    TOKEN_LABELS: tuple[str, ...] = ()   # per-position labels, packed like the inputs

    def model_feature_lengths(self, task_feature_lengths, pack=False):
        length = _length(task_feature_lengths, "inputs", self.name)
        lengths = {"encoder_input_tokens": length, "token_type_ids": length,
                   **({GLOBAL_MASK: length} if global_tokens() else {})}
        if not pack:
            return {**lengths, **dict.fromkeys(self.LABELS, 1)}
        slots = max_segments(length)
        return {**lengths, "encoder_segment_ids": length, "encoder_positions": length,
                **dict.fromkeys(self.LABELS + ("label_weights",), slots)}

    def convert(self, examples: Iterable[Example], task_feature_lengths, pack=False) -> Iterator[Row]:
        length = _length(task_feature_lengths, "inputs", self.name)
        which = global_tokens()
        if which:
            examples = ({**ex, GLOBAL_MASK: global_marks(np.asarray(ex["inputs"]), which)} for ex in examples)
        if pack:
            yield from self._packed(examples, length, bool(which))
            return
        for ex in examples:
            tokens = np.asarray(ex["inputs"], np.int32)
            _check_length(tokens, length)
            row = {"encoder_input_tokens": np.zeros(length, np.int32), "token_type_ids": np.zeros(length, np.int32)}
            row["encoder_input_tokens"][:len(tokens)] = tokens
            row["token_type_ids"][:len(tokens)] = ex["token_type_ids"]
            if which:
                row[GLOBAL_MASK] = np.zeros(length, np.int32)
                row[GLOBAL_MASK][:len(tokens)] = ex[GLOBAL_MASK]
            if "positions" in ex:   # an example at positions of its own (Fake-English's)
                row["encoder_positions"] = np.zeros(length, np.int32)
                row["encoder_positions"][:len(tokens)] = ex["positions"]
            row.update(self.label_features(ex, length))
            row[EXAMPLES_KEY] = 1
            yield row

    def label_features(self, ex: Example, length: int) -> dict[str, np.ndarray]:
        """The example's `LABELS` as [1] rows (int32 class ids, float32 scores)."""
        return {key: _array(ex[key]).reshape(1) for key in self.LABELS}

    def _packed(self, examples: Iterable[Example], length: int, marked: bool) -> Iterator[Row]:
        per_token = ("inputs", "token_type_ids") + self.TOKEN_LABELS + ((GLOBAL_MASK,) if marked else ())
        for row, members in packed_with_members(examples, per_token, length):
            out = {"encoder_input_tokens": row["inputs"], "token_type_ids": row["token_type_ids"],
                   "encoder_segment_ids": row["inputs_segment_ids"], "encoder_positions": row["inputs_positions"],
                   **({GLOBAL_MASK: row[GLOBAL_MASK]} if marked else {})}
            out.update(self.packed_labels(members, row, length))
            out[EXAMPLES_KEY] = len(members)
            yield out

    def packed_labels(self, members: Sequence[Example], row: Row, length: int) -> dict[str, np.ndarray]:
        """The row's `LABELS` in their slots and `label_weights` (1 on the filled slots)."""
        starts = np.cumsum([0] + [len(ex["inputs"]) for ex in members[:-1]])
        return label_slots({key: [self.slot_value(key, ex, start) for ex, start in zip(members, starts)]
                            for key in self.LABELS}, len(members), max_segments(length))

    def slot_value(self, key: str, ex: Example, start: int):
        """Label `key` of an example whose segment starts at token `start` of its row."""
        return ex[key]

    def __repr__(self):
        return f"{type(self).__name__}()"


def _array(value) -> np.ndarray:
    """A label as int32 (class ids, token indices) or float32 (scores)."""
    value = np.asarray(value)
    return value.astype(np.float32 if value.dtype.kind == "f" else np.int32)


def packed_with_members(examples: Iterable[Example], per_token: Sequence[str], length: int
                        ) -> Iterator[tuple[Row, list[Example]]]:
    """Greedy next-fit rows of the `per_token` features (each `length` long), each with the
    examples it holds, in order (segment k + 1 is members[k])."""
    pending: list[Example] = []

    def remembered(stream):
        for ex in stream:   # pack() keeps the order, so pending examples line up with the segments
            _check_length(ex[per_token[0]], length)
            pending.append(ex)
            yield {k: ex[k] for k in per_token}

    for row in pack_rows(remembered(examples), dict.fromkeys(per_token, length)):
        n = row[EXAMPLES_KEY]
        members = pending[:n]
        del pending[:n]
        yield row, members


def label_slots(values: Mapping[str, Sequence], filled: int, slots: int) -> dict[str, np.ndarray]:
    """Per-example labels of a row's `filled` examples (`values[key][k]` is segment k + 1's) as
    [slots] arrays, zero in the unused slots, and `label_weights` (1 on the filled slots)."""
    out = {}
    for key, labels in values.items():
        stacked = np.stack([_array(v) for v in labels])
        out[key] = np.zeros(slots, stacked.dtype)
        out[key][:filled] = stacked
    out["label_weights"] = (np.arange(slots) < filled).astype(np.int32)
    return out


def _check_length(tokens, length: int) -> None:
    if len(tokens) > length:
        raise ConfigError(f"an example has {len(tokens)} input tokens, more than the length {length}; "
                          "its preprocessors must cut it (sentence_inputs / squad_windows / tagging_inputs do)")


class EncoderClassificationConverter(EncoderTaskConverter):
    """GLUE-style: `label` is a class id (int32) or a regression target (float32, STS-B)."""
    name = "encoder_classification"
    LABELS = ("label",)


def max_segments(length: int) -> int:
    """The most examples a packed row of `length` tokens can hold: each has [CLS] and [SEP]."""
    return length // 2


class EncoderSpanConverter(EncoderTaskConverter):
    """SQuAD-style: the answer's `start_position` / `end_position` token indices; packed, indices
    into the row (the window's own index plus where its segment starts)."""
    name = "encoder_span"
    LABELS = ("start_position", "end_position")

    def slot_value(self, key, ex, start):
        return int(ex[key]) + start


class EncoderTaggingConverter(EncoderTaskConverter):
    """Tagging: `tag_ids` [length] per position, IGNORE on special tokens, later subwords, padding;
    packed, concatenated like the inputs (no label slots)."""
    name = "encoder_tagging"
    TOKEN_LABELS = ("tag_ids",)

    def model_feature_lengths(self, task_feature_lengths, pack=False):
        lengths = super().model_feature_lengths(task_feature_lengths, pack)
        lengths = {k: v for k, v in lengths.items() if k != "label_weights"}
        return {**lengths, "tag_ids": lengths["encoder_input_tokens"]}

    def label_features(self, ex: Example, length: int) -> dict[str, np.ndarray]:
        tag_ids = np.full(length, IGNORE, np.int32)
        tag_ids[:len(ex["tag_ids"])] = ex["tag_ids"]
        return {"tag_ids": tag_ids}

    def packed_labels(self, members, row, length):
        return {"tag_ids": np.where(row["inputs_segment_ids"] > 0, row["tag_ids"], IGNORE).astype(np.int32)}
