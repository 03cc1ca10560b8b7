"""Evaluating encoders with a task head: GLUE classification / regression, SQuAD span extraction
and token tagging (NER, POS).

`ClassificationEvaluator`: the head's argmax (or its float, one output: regression) against the
example's label, scored with the task's metrics (accuracy, F1, MCC, Pearson/Spearman).
`DecoderClassificationEvaluator`: the same for a decoder-only model's last-token classifier
(GPT-1's inputs, one or both orders). `SpanEvaluator`: per context window, the `n_best` highest
start + end logit spans with start <= end, at most `max_answer_length` tokens, inside the
context; per question the best span over its windows, mapped back to the original context through
the tokens' character offsets, scored with SQuAD EM/F1. `TaggingEvaluator`: each word's tag is the argmax at its first subword,
the windows of a sentence put back together, scored on the words' tag lists (entity P/R/F1, token
accuracy) and written as a CoNLL file. All have `.evaluate(module, params) -> EvalResult`, as the
text-to-text `Evaluator`, so training evaluates them the same way, and count the forward FLOPs they
run (`forward_flops`).
"""
from __future__ import annotations

import functools
import itertools
from typing import Any, Mapping

import jax
import numpy as np

from t5lite import finite, metrics as metrics_lib
from t5lite.data import converter_registry, converters
from t5lite.errors import ConfigError, DataError
from t5lite.infer.evaluation import EvalResult
from t5lite.models import flops, windowed_attention
from t5lite.models.vision import IMAGES

MODEL_INPUTS = ("encoder_input_tokens", "token_type_ids")
SEQUENCES = ("encoder_input_tokens", "decoder_input_tokens", "swapped_decoder_input_tokens")   # each runs the backbone
DECODER_INPUTS = ("decoder_input_tokens", "decoder_segment_ids", "swapped_decoder_input_tokens",
                  "swapped_decoder_segment_ids")


@functools.partial(jax.jit, static_argnums=0)
def _apply(module, params, inputs):
    return module.apply({"params": params}, **inputs)


class _HeadEvaluator:
    """Reads, converts and batches the split once; `_outputs` runs the model on every batch.

    Batches are length-bucketed (`length_buckets` widths, see t5lite.data.converters.length_buckets):
    examples of similar length share a batch cut to a bucket width, so padding computes little and
    at most that many shapes compile; the outputs come back in the split's order."""
    converter = ""
    # positions: only rows that carry their own; global tokens: only a windowed encoder's (global_tokens)
    model_inputs = MODEL_INPUTS + ("encoder_positions", "encoder_global_attention_mask")
    per_token = False     # outputs [batch, length, ...] (span, tagging), padded back to the full length

    def __init__(self, task, split: str, task_feature_lengths: Mapping[str, int], batch_size: int = 32,
                 data_dir: str | None = None, max_examples: int | None = None, length_buckets: int = 4):
        self.task, self.split = task, split
        self.examples = list(itertools.islice(
            task.get_dataset(split, task_feature_lengths, shuffle=False, data_dir=data_dir), max_examples))
        if not self.examples:
            raise DataError(f"task {task.name!r} has no examples in split {split!r} (data_dir={data_dir!r}); "
                            "check the split name, data_dir and max_examples")
        rows = list(converter_registry.get_feature_converter(self.converter).convert(self.examples, task_feature_lengths))
        keys = [k for k in self.model_inputs if k in rows[0]]
        self.length = len(rows[0][keys[0]])
        per_position = {k: len(rows[0][k]) // self.length for k in keys}   # ELMo's chars: 50 ids a position
        self.used_lengths = [_used_length(row, keys, self.length) for row in rows]
        self.sequences = sum(k in SEQUENCES for k in keys)
        buckets = converters.length_buckets(self.used_lengths, batch_size, self.length, length_buckets)
        self.batches = [_fill({k: np.stack([rows[i][k][:width * per_position[k]] for i in indices]) for k in keys},
                              batch_size)
                        for indices, width in buckets]
        self.order = np.concatenate([indices for indices, _ in buckets])

    def __repr__(self):
        return f"{type(self).__name__}({self.task.name!r}, split={self.split!r}, examples={len(self.examples)})"

    def forward_flops(self, module) -> float:
        """The backbone's forward (t5lite.models.flops.encode_flops) over each example's used length,
        once per token sequence it reads (GPT-1's two orders: twice). Not counted: the task head (a
        d_model x labels classifier, per example or token) and the padding of each bucket."""
        return self.sequences * sum(flops.encode_flops(module.config, n) for n in self.used_lengths)

    def _outputs(self, module, params) -> list[np.ndarray]:
        """The model's outputs for every example in the split's order (a tuple of arrays per
        output), fetched once; refused if any is not finite."""
        for batch in self.batches:   # only a transformer's task-head batches carry global tokens
            if windowed_attention.GLOBAL_MASK in batch:
                windowed_attention.check_global_tokens(batch, module.config.max_global_tokens)
        fetched = jax.device_get([_apply(module, params, b) for b in self.batches])
        outputs = [o if isinstance(o, (tuple, list)) else (o,) for o in fetched]
        restored = []
        for parts in zip(*outputs):
            if self.per_token:
                parts = [np.pad(p, [(0, 0), (0, self.length - p.shape[1])] + [(0, 0)] * (p.ndim - 2)) for p in parts]
            restored.append(converters.restore_order(np.concatenate(parts)[:len(self.examples)], self.order))
            finite.require_finite(restored[-1], "logits")
        return restored


def _used_length(row: Mapping[str, np.ndarray], keys, length: int) -> int:
    """A row's length up to its last non-zero input position (padding is zeros at the end); a
    feature holds `length` positions, flattened or not."""
    return max(int(np.flatnonzero(np.asarray(row[k]).reshape(length, -1).any(-1)).max(initial=-1)) + 1
               for k in keys)


def _fill(batch: dict[str, np.ndarray], size: int) -> dict[str, np.ndarray]:
    """A short last batch padded to `size` rows (one compiled shape; the extra rows are dropped)."""
    rows = len(next(iter(batch.values())))
    return {k: np.concatenate([v, np.zeros((size - rows,) + v.shape[1:], v.dtype)]) for k, v in batch.items()}


class ClassificationEvaluator(_HeadEvaluator):
    converter = "encoder_classification"

    def evaluate(self, module, params) -> EvalResult:
        (logits,) = self._outputs(module, params)
        if logits.shape[-1] == 1:
            predictions = [float(x) for x in logits[:, 0]]
        else:
            predictions = [int(x) for x in logits.argmax(-1)]
        targets = [ex["label"].item() if hasattr(ex["label"], "item") else ex["label"] for ex in self.examples]
        scores = metrics_lib.compute_metrics(self.task.metric_fns, targets, predictions)
        records = [{"inputs": ex.get("inputs_pretokenized"), "target": t, "prediction": p}
                   for ex, t, p in zip(self.examples, targets, predictions)]
        return EvalResult(scores, records, flops=self.forward_flops(module))


class ImageClassificationEvaluator(ClassificationEvaluator):
    """A ViT's classifier: every image is a full row (its patches and [CLS]), so one width, no buckets."""
    converter = "image_classification"
    model_inputs = (IMAGES,)

    def __init__(self, task, split, task_feature_lengths, **kwargs):
        super().__init__(task, split, task_feature_lengths, **{**kwargs, "length_buckets": 1})

    def forward_flops(self, module) -> float:
        return len(self.examples) * flops.encode_flops(module.config, module.config.image_positions)


class DecoderClassificationEvaluator(ClassificationEvaluator):
    model_inputs = DECODER_INPUTS

    @property
    def converter(self) -> str:
        """The converter of the task's inputs: both orders when its examples have them."""
        both = "swapped_inputs" in self.examples[0]
        return "decoder_classification_both_orders" if both else "decoder_classification"


def best_spans(start_logits: np.ndarray, end_logits: np.ndarray, in_context: np.ndarray, n_best: int = 20,
               max_answer_length: int = 30) -> list[tuple[float, int, int]]:
    """The `n_best` (score, start, end) of one window, best first: start + end logit over every
    pair with start <= end < start + max_answer_length and both tokens in the context.

    Exact over all pairs (an [L, L] table); Hugging Face's run_qa only pairs the 20 best starts
    with the 20 best ends, which can miss the best valid span."""
    length = len(start_logits)
    i, j = np.arange(length)[:, None], np.arange(length)[None, :]
    valid = in_context[:, None] & in_context[None, :] & (j >= i) & (j - i < max_answer_length)
    scores = np.where(valid, start_logits[:, None] + end_logits[None, :], -np.inf)
    flat = np.argsort(-scores, axis=None, kind="stable")[:n_best]
    return [(float(scores.flat[k]), int(k // length), int(k % length)) for k in flat if np.isfinite(scores.flat[k])]


class SpanEvaluator(_HeadEvaluator):
    converter = "encoder_span"
    per_token = True

    def __init__(self, task, split, task_feature_lengths, n_best: int = 20, max_answer_length: int = 30, **kwargs):
        super().__init__(task, split, task_feature_lengths, **kwargs)
        self.n_best, self.max_answer_length = n_best, max_answer_length

    def evaluate(self, module, params) -> EvalResult:
        start_logits, end_logits = self._outputs(module, params)
        candidates: dict[str, list[tuple[float, str]]] = {}     # question id -> (score, answer) of all windows
        questions: dict[str, Any] = {}
        for ex, s, e in zip(self.examples, start_logits, end_logits):
            offsets = np.asarray(ex["offsets"])
            in_context = np.zeros(len(s), bool)
            in_context[:len(offsets)] = offsets[:, 0] >= 0
            questions.setdefault(ex["id"], ex)
            candidates.setdefault(ex["id"], []).extend(
                (score, ex["context"][offsets[start, 0]:offsets[end, 1]])
                for score, start, end in best_spans(s, e, in_context, self.n_best, self.max_answer_length))
        n_best = {i: sorted(c, key=lambda sc: -sc[0])[:self.n_best] or [(0.0, "")] for i, c in candidates.items()}
        predictions = [n_best[i][0][1] for i in questions]
        targets = [list(ex["answers"]) for ex in questions.values()]
        scores = metrics_lib.compute_metrics(self.task.metric_fns, targets, predictions)
        records = [{"id": i, "inputs": ex.get("inputs_pretokenized"), "target": t, "prediction": p,
                    "n_best": [{"text": text, "score": score} for score, text in n_best[i]]}
                   for (i, ex), t, p in zip(questions.items(), targets, predictions)]
        return EvalResult(scores, records, flops=self.forward_flops(module))


def conll_text(sentences) -> str:
    """conlleval's input: "word gold predicted" per line, a blank line after each sentence; spaces
    inside a word become "_" so every line has three columns."""
    lines = []
    for words, gold, predicted in sentences:
        lines += [f"{'_'.join(w.split()) or '_'} {g} {p}" for w, g, p in zip(words, gold, predicted)]
        lines.append("")
    return "\n".join(lines) + "\n"


class TaggingEvaluator(_HeadEvaluator):
    converter = "encoder_tagging"
    per_token = True

    def evaluate(self, module, params) -> EvalResult:
        (logits,) = self._outputs(module, params)
        names = self.examples[0]["label_names"]
        if logits.shape[-1] != len(names):
            raise ConfigError(f"the tagging head has {logits.shape[-1]} outputs but task {self.task.name!r} has "
                              f"{len(names)} tags {list(names)}; set TaggingObjective.num_tags = {len(names)}")
        sentences = []          # [example, predicted tags], the windows of one sentence merged
        for ex, window in zip(self.examples, logits.argmax(-1)):
            if ex["window_start"] == 0 or not sentences:
                sentences.append((ex, [names[0]] * len(ex["words"])))
            predicted = sentences[-1][1]
            for i, position in enumerate(ex["word_positions"]):
                if position >= 0:
                    predicted[ex["window_start"] + i] = names[int(window[position])]
        targets = [list(ex["tags"]) for ex, _ in sentences]
        predictions = [p for _, p in sentences]
        scores = metrics_lib.compute_metrics(self.task.metric_fns, targets, predictions)
        records = [{"id": ex["id"], "words": list(ex["words"]), "target": t, "prediction": p}
                   for (ex, _), t, p in zip(sentences, targets, predictions)]
        conll = conll_text((ex["words"], t, p) for (ex, _), t, p in zip(sentences, targets, predictions))
        return EvalResult(scores, records, {"predictions.conll": conll}, self.forward_flops(module))
