"""Evaluating a task split: decode, postprocess, run the task's metrics, write what was predicted.

An `Evaluator` reads and batches the split once (no packing; length-bucketed inputs, see
t5lite.data.converters.length_buckets, outputs back in the split's order), so training can call it every N
steps with new parameters, of an encoder-decoder (the inputs feed the encoder) or a decoder-only
model (the inputs are the prompt, the targets its continuation). Each call computes
- `loss`: teacher-forced cross entropy per target token,
- the task's metrics on greedy decodes (text through `task.postprocess`, as are the targets),
- for tasks with a fixed set of answers, the same metrics on rank classification (the label
  whose text the model finds most likely), prefixed `score_`,
and counts the forward FLOPs it ran (`EvalResult.flops`, see `text_forward_flops`).

`evaluate` is the gin entry point behind `t5lite eval`; given the run's training objective it
evaluates what that objective trained the way training does (a task head: t5lite.infer.classify).
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import os
from typing import Any, Mapping, Sequence

import gin
import jax
import numpy as np
from etils import epath

from t5lite import finite, metrics as metrics_lib, models, storage, writable
from t5lite.data import catalog, converters, finetune_converters, registry, vocab as vocab_lib
from t5lite.errors import DataError, require_positive
from t5lite.infer import checkpoint_reader, decoding, predict, scoring, unigram
from t5lite.models import flops, vision
from t5lite.run_layout import RunDir

log = logging.getLogger("t5lite")

MAX_LABELS = 10   # more distinct targets than this: a free-text task, not a classification one
SCORE_PREFIX = "score_"


def label_strings(task, examples: Sequence[Mapping[str, Any]]) -> list[str] | None:
    """The fixed answers of a classification task, or None.

    A task's own `label_names` win; otherwise the distinct targets of the split, if there are
    at most MAX_LABELS of them ("<unk>", an unlabelled row, is not an answer).
    """
    names = getattr(task, "label_names", None)
    if names:
        return list(names)
    vocabulary = task.output_features["targets"].vocabulary
    seen = sorted({text_of(ex, "targets", vocabulary) for ex in examples} - {"<unk>"})
    return seen if 2 <= len(seen) <= MAX_LABELS else None


def text_of(example: Mapping[str, Any], feature: str, vocabulary) -> str:
    """The example's `<feature>_pretokenized` text, or its tokens decoded when a preprocessor
    (span corruption, say) made them without keeping a text."""
    text = example.get(f"{feature}_pretokenized")
    return text if text is not None else predict.detokenize(vocabulary, example[feature])


def padded_rows(arrays: Sequence[np.ndarray], width: int) -> tuple[np.ndarray, np.ndarray]:
    """([n, width] tokens, 0 after each row's end; [n] lengths): the model's pad id goes in later."""
    tokens = np.zeros((len(arrays), width), np.int32)
    for row, ids in zip(tokens, arrays):
        row[:len(ids)] = ids
    return tokens, np.array([len(ids) for ids in arrays], np.int32)


def input_rows(examples: Sequence[Mapping[str, Any]], width: int) -> tuple[np.ndarray, np.ndarray]:
    """A batch's inputs: token rows as `padded_rows`, or an image task's images [n, H, W, C] (each
    one's length: its rows, as `len` counts them for the buckets)."""
    if np.ndim(examples[0].get("inputs", ())) == 3:
        images = np.stack([np.asarray(ex["inputs"], np.float32) for ex in examples])
        return images, np.full(len(examples), images.shape[1], np.int32)
    return padded_rows([ex.get("inputs", ()) for ex in examples], width)


def with_pad(tokens: np.ndarray, lengths: np.ndarray, pad_id: int) -> np.ndarray:
    """Every position past a row's length set to `pad_id` (BART pads with 1, T5 with 0)."""
    return np.where(np.arange(tokens.shape[1])[None] < lengths[:, None], tokens, pad_id).astype(np.int32)


def model_inputs(config, tokens: np.ndarray, lengths: np.ndarray) -> dict[str, np.ndarray]:
    """A task's `inputs` as what the family decodes from: the encoder's input (encoder-decoders),
    or the prompt a decoder-only model continues (a prefix LM's prefix)."""
    if config.arch == "encoder_decoder" and config.image_size:   # `tokens` are the images (`input_rows`)
        return {vision.IMAGES: tokens}
    if config.arch == "encoder_decoder":
        return {"encoder_input_tokens": with_pad(tokens, lengths, config.pad_token_id)}
    if config.arch == "decoder":
        return {"decoder_prompt_tokens": with_pad(tokens, lengths, config.pad_token_id),
                "decoder_prompt_lengths": lengths}
    raise DataError(f"a {config.arch} model: {NO_DECODER}")


NO_DECODER = ("an encoder has no decoder to generate or score text; evaluate it through a task head (fine-tune it "
              "with a head's gin config and evaluate that run), or read it with `t5lite embed` or `t5lite probe`")


def scores_text(objective) -> bool:
    """Whether `objective` (None: text-to-text) evaluates with the text-to-text `Evaluator`: its (or
    the objective a distillation trains) `produces_text` (t5lite.objectives.base.Objective)."""
    inner = getattr(objective, "objective", objective)
    return inner is None or inner.produces_text


def text_forward_flops(config, input_lengths: Sequence[int], output_lengths: Sequence[int]) -> float:
    """Forward FLOPs (t5lite.models.flops) of examples at their own lengths, padding left out: an
    encoder-decoder encodes the inputs and runs its decoder over the outputs, a decoder-only model
    runs both as one sequence. Decoding costs the same as this teacher-forced pass over the tokens
    it generated: a KV-cache step does one token's matmuls and attends to the tokens before it, so
    its steps sum to the causal forward over the generated length (the encoder runs once)."""
    if config.arch == "encoder_decoder":
        return float(sum(flops.forward_flops_per_example(config, int(i), int(o))
                         for i, o in zip(input_lengths, output_lengths)))
    return float(sum(flops.forward_flops_per_example(config, decoder_length=int(i) + int(o))
                     for i, o in zip(input_lengths, output_lengths)))


def batch_flops(config, input_lengths: np.ndarray, target_lengths: np.ndarray | None = None,
                decoded: np.ndarray | None = None, label_lengths: Sequence[int] = ()) -> float:
    """Forward FLOPs of a batch's real examples (`text_forward_flops`): scoring their targets,
    greedy decoding (`decoded` tokens, up to each row's EOS) and scoring each label (rank
    classification runs the model once per label). An image model encodes its image's positions."""
    if config.image_size:
        input_lengths = np.full(len(input_lengths), config.image_positions)
    done = 0.0 if target_lengths is None else text_forward_flops(config, input_lengths, target_lengths)
    if decoded is not None:
        done += text_forward_flops(config, input_lengths, predict.decoded_lengths(decoded, config.eos_token_id))
    return done + sum(text_forward_flops(config, input_lengths, np.full(len(input_lengths), n))
                      for n in label_lengths)


@dataclasses.dataclass
class EvalResult:
    metrics: dict[str, float]
    predictions: list[dict]
    files: dict[str, str] = dataclasses.field(default_factory=dict)  # more files to write beside them: name -> text
    flops: float = 0.0   # forward FLOPs the evaluation ran, by formula; 0 where not counted
    examples: int | None = None   # examples scored, where there is no prediction per example (a loss's)

    def num_examples(self) -> int:
        return len(self.predictions) if self.examples is None else self.examples


def write_result(folder: str, result: EvalResult) -> None:
    """`predictions.jsonl` and the result's other `files` (a tagger's `predictions.conll`) in `folder`."""
    write_predictions(os.path.join(folder, "predictions.jsonl"), result.predictions)
    for name, text in result.files.items():
        with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
            f.write(text)


class Evaluator:
    """One task split, read and batched once; `evaluate(module, params)` scores any parameters of
    any family with a decoder: the task's inputs feed an encoder-decoder's encoder or prompt a
    decoder-only model, and its targets (or labels) are scored as what comes next."""

    def __init__(self, task, split: str, task_feature_lengths: Mapping[str, int], batch_size: int = 32,
                 data_dir: str | None = None, max_examples: int | None = None, rank_classification: bool = True,
                 length_buckets: int = 4):
        self.task, self.split = task, split
        self.max_decode_length = int(task_feature_lengths["targets"])
        self.vocabulary = task.output_features["targets"].vocabulary
        self.examples = list(itertools.islice(
            task.get_dataset(split, task_feature_lengths, shuffle=False, data_dir=data_dir), max_examples))
        if not self.examples:
            raise DataError(f"task {task.name!r} has no examples in split {split!r} (data_dir={data_dir!r}); "
                            "check the split name, data_dir and max_examples")
        self.batches, self.rows = [], []   # rows: each batch's real examples (the rest fill it up)
        buckets = converters.length_buckets([len(ex.get("inputs", ())) for ex in self.examples], batch_size,
                                            int(task_feature_lengths.get("inputs", 1)), length_buckets)
        self.order = np.concatenate([indices for indices, _ in buckets])
        for indices, width in buckets:
            self.rows.append(len(indices))
            chunk = [self.examples[i] for i in indices]
            inputs, input_lengths = input_rows(chunk, width)
            targets, target_lengths = padded_rows([ex["targets"] for ex in chunk], self.max_decode_length)
            self.batches.append(predict.fill_batch({"inputs": inputs, "input_lengths": input_lengths,
                                                    "targets": targets, "target_lengths": target_lengths},
                                                   batch_size))
        self.target_tokens = sum(len(ex["targets"]) for ex in self.examples)
        self.train_counts = None
        self.targets = [task.postprocess(text_of(ex, "targets", self.vocabulary), example=ex, is_target=True)
                        for ex in self.examples]
        self.labels = label_strings(task, self.examples) if rank_classification and task.metric_fns else None
        self.label_tokens = None
        if self.labels:   # tokenized as the task tokenizes a target: ending in EOS
            eos = getattr(self.vocabulary, "eos_id", vocab_lib.EOS_ID)
            self.label_tokens, self.label_lengths = padded_rows(
                [(self.vocabulary.encode(label) + [eos])[:self.max_decode_length] for label in self.labels],
                self.max_decode_length)

    def count_training_tokens(self, task, split: str, task_feature_lengths: Mapping[str, int], data_dir=None) -> None:
        """For a task scored by its loss alone (no metric functions: span corruption and the other
        sequence-to-sequence pre-training tasks), count the target tokens of `task`'s `split` (the
        evaluated task's own: its first UNIGRAM_EXAMPLES examples), so that each evaluation also
        logs `unigram_loss` beside `loss`."""
        if self.task.metric_fns:
            return
        examples = task.get_dataset(split, task_feature_lengths, shuffle=False, data_dir=data_dir)
        self.train_counts = unigram.token_counts(ex["targets"] for ex in
                                                 itertools.islice(examples, unigram.UNIGRAM_EXAMPLES))

    def __repr__(self):
        return (f"Evaluator({self.task.name!r}, split={self.split!r}, examples={len(self.examples)}, "
                f"labels={self.labels})")

    def _run(self, module, params) -> tuple[dict[str, np.ndarray], float]:
        """Device outputs for every batch, fetched once at the end, and the forward FLOPs run."""
        cfg, outputs = module.config, []
        for batch in self.batches:
            inputs = model_inputs(cfg, batch["inputs"], batch["input_lengths"])
            targets = with_pad(batch["targets"], batch["target_lengths"], cfg.pad_token_id)
            out = {"log_likelihood": scoring.target_log_likelihood(module, params, inputs, targets,
                                                                   batch["target_lengths"])}
            if self.task.metric_fns:
                out["decoded"] = decoding.greedy(module, params, inputs, max_decode_length=self.max_decode_length).tokens
            if self.label_tokens is not None:
                out["label_scores"] = label_log_likelihoods(module, params, inputs, self.label_tokens,
                                                            self.label_lengths)
            outputs.append(out)
        fetched = jax.device_get(outputs)
        n = len(self.examples)
        done = sum(batch_flops(cfg, b["input_lengths"][:rows], b["target_lengths"][:rows],
                               o["decoded"][:rows] if "decoded" in o else None,
                               self.label_lengths if self.label_tokens is not None else ())
                   for b, o, rows in zip(self.batches, fetched, self.rows))
        out = {k: converters.restore_order(np.concatenate([o[k] for o in fetched])[:n], self.order) for k in fetched[0]}
        finite.require_finite(out["log_likelihood"], "log-likelihoods of the targets")
        finite.require_finite(out.get("label_scores", ()), "log-likelihoods of the labels")
        return out, done

    def evaluate(self, module, params) -> EvalResult:
        out, done = self._run(module, params)
        metrics = {"loss": float(-out["log_likelihood"].sum() / max(self.target_tokens, 1))}
        if self.train_counts is not None:
            targets = np.concatenate([np.asarray(ex["targets"], np.int64) for ex in self.examples])
            metrics["unigram_loss"] = unigram.unigram_loss(self.train_counts, targets, module.config.vocab_size)
        inputs_vocabulary = self.task.output_features.get("inputs", self.task.output_features["targets"]).vocabulary
        records = [{"inputs": text_of(ex, "inputs", inputs_vocabulary),
                    "target": text_of(ex, "targets", self.vocabulary)} for ex in self.examples]
        if "decoded" in out:
            texts = [predict.detokenize(self.vocabulary, predict.until_eos(ids, module.config.eos_token_id))
                     for ids in out["decoded"]]
            metrics.update(self._score(texts))
            for record, text in zip(records, texts):
                record["prediction"] = text
        if "label_scores" in out:
            chosen = [self.labels[i] for i in out["label_scores"].argmax(axis=1)]
            metrics.update({SCORE_PREFIX + k: v for k, v in self._score(chosen).items()})
            for record, text in zip(records, chosen):
                record["score_prediction"] = text
        return EvalResult(metrics, records, flops=done)

    def _score(self, texts: Sequence[str]) -> dict[str, float]:
        predictions = [self.task.postprocess(t, example=ex, is_target=False) for t, ex in zip(texts, self.examples)]
        return metrics_lib.compute_metrics(self.task.metric_fns, self.targets, predictions)


def label_log_likelihoods(module, params, inputs: Mapping[str, np.ndarray], label_tokens: np.ndarray,
                          label_lengths: np.ndarray) -> jax.Array:
    """[batch, labels] log-likelihood of each label (rows of `label_tokens`, 0 past `label_lengths`)
    after each input: rank classification, T5's "score" mode. Labels are scored with their
    lengths, so a label token equal to the pad id (T5's EOS 1 is BART's pad) still counts."""
    batch = len(next(iter(inputs.values())))
    labels = with_pad(label_tokens, label_lengths, module.config.pad_token_id)
    return jax.numpy.stack([scoring.target_log_likelihood(module, params, inputs, np.repeat(row[None], batch, 0),
                                                          np.full(batch, n, np.int32))
                            for row, n in zip(labels, label_lengths)], axis=1)


def evaluators(task_or_mixture, split: str, task_feature_lengths: Mapping[str, int], **kwargs) -> dict[str, Evaluator]:
    """An Evaluator per task: the task itself, or each task of a mixture that has the split."""
    return per_task(lambda task, *args, **kw: {task.name: Evaluator(task, *args, **kw)}, task_or_mixture, split,
                    task_feature_lengths, **kwargs)


def per_task(make_evaluators, task_or_mixture, split: str, task_feature_lengths: Mapping[str, int], **kwargs) -> dict:
    """`make_evaluators(task, split, task_feature_lengths, **kwargs)` (an objective's `evaluators`) of
    the task itself, or merged over each task of a mixture that has the split: a mixture samples
    its tasks without end, so each is scored alone and logged under its own name."""
    if not isinstance(task_or_mixture, registry.Mixture):
        return make_evaluators(task_or_mixture, split, task_feature_lengths, **kwargs)
    made = {name: evaluator for task in task_or_mixture.tasks if split in task.splits
            for name, evaluator in make_evaluators(task, split, task_feature_lengths, **kwargs).items()}
    if not made:
        raise DataError(f"mixture {task_or_mixture.name!r}: none of its tasks has a {split!r} split to evaluate; "
                        f"evaluate a split they have ({sorted(task_or_mixture.tasks[0].splits)})")
    return made


def count_training_tokens(evaluators_by_task: Mapping[str, Any], split: str, task_feature_lengths: Mapping[str, int],
                          data_dir: str | None = None) -> None:
    """Each held-out loss evaluator (a pre-training objective's, or an `Evaluator` of a task without
    metrics) counts its own task's `split`, so that it also reports `unigram_loss`; the others
    have no such baseline."""
    for evaluator in evaluators_by_task.values():
        if hasattr(evaluator, "count_training_tokens"):
            evaluator.count_training_tokens(evaluator.task, split, task_feature_lengths, data_dir)


def evaluate_all(evaluators_by_task: Mapping[str, Evaluator], module, params) -> dict[str, EvalResult]:
    return {name: e.evaluate(module, params) for name, e in evaluators_by_task.items()}


# T5's benchmark averages (t5.evaluation.eval_utils.compute_avg_glue over its METRIC_NAMES): the
# metrics in one group (MRPC's F1 and accuracy, MNLI matched and mismatched, ...) are averaged
# first, then the groups. WNLI and DPR are not part of them.
BENCHMARK_GROUPS = {
    "glue_average": {
        "CoLA": [("glue_cola", "matthews_corrcoef")], "SST-2": [("glue_sst2", "accuracy")],
        "MRPC": [("glue_mrpc", "f1"), ("glue_mrpc", "accuracy")],
        "STSB": [("glue_stsb", "pearson_corrcoef"), ("glue_stsb", "spearman_corrcoef")],
        "QQP": [("glue_qqp", "f1"), ("glue_qqp", "accuracy")],
        "MNLI": [("glue_mnli_matched", "accuracy"), ("glue_mnli_mismatched", "accuracy")],
        "QNLI": [("glue_qnli", "accuracy")], "RTE": [("glue_rte", "accuracy")]},
    "super_glue_average": {
        "BoolQ": [("super_glue_boolq", "accuracy")],
        "CB": [("super_glue_cb", "mean_3class_f1"), ("super_glue_cb", "accuracy")],
        "COPA": [("super_glue_copa", "accuracy")],
        "MultiRC": [("super_glue_multirc", "f1"), ("super_glue_multirc", "exact_match")],
        "ReCoRD": [("super_glue_record", "f1"), ("super_glue_record", "em")],
        "RTE": [("super_glue_rte", "accuracy")], "WiC": [("super_glue_wic", "accuracy")],
        "WSC": [("super_glue_wsc", "accuracy")]},
}


def benchmark_averages(metrics_by_task: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """`glue_average` / `super_glue_average` of the tasks' decoded metrics, each only when every
    metric it needs is there (as T5 does)."""
    averages = {}
    for name, groups in BENCHMARK_GROUPS.items():
        try:
            means = [np.mean([metrics_by_task[task][key] for task, key in members]) for members in groups.values()]
        except KeyError:
            continue
        averages[name] = float(np.mean(means))
    return averages


def flat_metrics(results: Mapping[str, EvalResult]) -> dict[str, float]:
    """One dict of metrics; with several tasks (a mixture) each key is prefixed `<task>/`, and
    the GLUE / SuperGLUE averages are added when the tasks cover a benchmark."""
    if len(results) == 1:
        return dict(next(iter(results.values())).metrics)
    by_task = {name: r.metrics for name, r in results.items()}
    flat = {f"{name}/{k}": v for name, r in results.items() for k, v in r.metrics.items()}
    return {**flat, **benchmark_averages(by_task)}


def write_predictions(path: str, predictions: Sequence[Mapping[str, Any]]) -> None:
    """JSON lines, one per example, to a local file or a gs:// object."""
    epath.Path(path).parent.mkdir(parents=True, exist_ok=True)
    epath.Path(path).write_text("".join(finite.dumps(record, ensure_ascii=False, default=str) + "\n"
                                        for record in predictions), encoding="utf-8")


def append_metrics(path: str, record: Mapping[str, Any]) -> None:
    """One JSON line; an undefined metric (NaN) is null there, flagged under "non_finite"."""
    epath.Path(path).parent.mkdir(parents=True, exist_ok=True)
    storage.append_text(path, finite.dumps(finite.flag_non_finite(record), default=str) + "\n")


@gin.configurable("eval", denylist=["meter", "weights_of"])
def evaluate(checkpoint_path: str = gin.REQUIRED, mixture_or_task_name: str = gin.REQUIRED,
             task_feature_lengths: Mapping[str, int] = gin.REQUIRED, model=None, split: str = "validation",
             data_dir: str | None = None, batch_size: int = 32, max_examples: int | None = None,
             output_dir: str | None = None, rank_classification: bool = True,
             vocabulary_path: str | None = None, fewshot=None, objective=None, meter=None,
             weights_of: str | None = None, unigram_split: str | None = None) -> dict[str, float]:
    """Evaluates a checkpoint on a task split; writes `<output_dir>/<task>.<split>/predictions.jsonl`
    (a tagger also `predictions.conll`, word / gold / predicted tag per line) and appends a line to
    `.../metrics.jsonl`. `output_dir` defaults to the run's `eval/` folder.

    `model` defaults to the run's saved config. With `fewshot` (a `t5lite.infer.fewshot.FewShot`,
    which builds on this module; gin: `eval.fewshot = @FewShot()`) a decoder-only model is
    evaluated in context, with demonstrations. `objective` is the run's training objective
    (`t5lite.objectives.base.Objective`; `t5lite eval` takes the config's `train.objective`): it
    builds the module trained and the evaluators training used, so a classification or span
    head is scored as during training (accuracy, F1, SQuAD EM/F1). None: text-to-text.

    `meter` (a `t5lite.train.cost.CostMeter` started before the work, as `t5lite eval` does) gets
    the evaluations' forward FLOPs (`EvalResult.flops`) and adds this call's cost to each metrics
    line (`cost_*`) and writes it to `<output_dir>/cost.json`.

    `weights_of` (a run fine-tuned from `checkpoint_path`): the checkpoint's model scored with that
    run's weights grafted in (t5lite.infer.forgetting.grafted; written to that run's `eval/`), to
    measure what fine-tuning forgot of the checkpoint's task.

    `unigram_split` (a pre-training's training split, `'train'`): a held-out loss evaluation (a
    pre-training objective's, a sequence-to-sequence task without metrics) also reports
    `unigram_loss`, counted on that split as training counts it (t5lite.infer.unigram)."""
    limit = {"eval.max_examples": max_examples} if max_examples is not None else {}
    require_positive({"eval.batch_size": batch_size, **limit,
                      **{f"TASK_FEATURE_LENGTHS[{k!r}]": v for k, v in task_feature_lengths.items()}})
    checkpoint_reader.require_command_takes(checkpoint_path, "eval")
    run = RunDir.of_step(checkpoint_reader.step_directory(checkpoint_path))
    vocab_lib.use_run_vocabulary(vocabulary_path, str(run))
    model = predict.model_config_of(checkpoint_path, model)
    if run.config_gin.exists():
        finetune_converters.check_recorded_global_tokens(run.config_gin.read_text(), str(run))
    if fewshot is None and model.arch == "encoder" and scores_text(objective):
        raise DataError(f"{run} is an encoder run: {NO_DECODER}")
    module = models.build(model) if objective is None else objective.build_model(model)
    task = catalog.get_task_or_mixture(mixture_or_task_name)
    params, step, step_dir = predict.load_params(model, checkpoint_path, module=module, objective=objective,
                                                 vocabulary=task.output_features["targets"].vocabulary)
    if weights_of is not None:
        from t5lite.infer import forgetting
        vocab_lib.check_identity(forgetting.run_of(weights_of), task.output_features["targets"].vocabulary)
        params = forgetting.grafted(params, weights_of)
        step_dir = checkpoint_reader.step_directory(weights_of)
        step = int(os.path.basename(step_dir)) if os.path.basename(step_dir).isdigit() else None
    output_dir = output_dir or str(RunDir.of_step(step_dir).evaluations)
    writable.ensure_writable_dir(output_dir, "eval.output_dir")
    with finite.outputs_of(step_dir):
        if fewshot is not None:
            tasks = task.tasks if isinstance(task, registry.Mixture) else [task]
            results = {t.name: fewshot.evaluate(t, split, module, params, data_dir=data_dir,
                                                max_examples=max_examples, batch_size=batch_size)
                       for t in tasks if split in t.splits}
        else:
            make_evaluators = (functools.partial(evaluators, rank_classification=rank_classification)
                               if objective is None else objective.evaluators)
            by_task = per_task(make_evaluators, task, split, task_feature_lengths, batch_size=batch_size,
                               data_dir=data_dir, max_examples=max_examples)
            if unigram_split is not None:
                count_training_tokens(by_task, unigram_split, task_feature_lengths, data_dir)
            results = evaluate_all(by_task, module, params)
    if meter is not None:
        meter.add_flops(sum(result.flops for result in results.values()))
    totals = meter.totals() if meter is not None else {}
    cost_fields = {f"cost_{k}": v for k, v in totals.items()}
    for name, result in results.items():
        folder = os.path.join(output_dir, f"{name}.{split}")
        write_result(folder, result)
        append_metrics(os.path.join(folder, "metrics.jsonl"), {"step": step, "checkpoint": step_dir,
                                                               "examples": result.num_examples(), **result.metrics,
                                                               **cost_fields})
        log.info("%s/%s at step %s: %s (written to %s)", name, split, step,
                 " ".join(f"{k}={v:.4g}" for k, v in result.metrics.items()), folder)
    if meter is not None:
        epath.Path(output_dir).mkdir(parents=True, exist_ok=True)
        meter.write(totals=totals, folder=output_dir)
    return flat_metrics(results)  # with the GLUE / SuperGLUE averages for those mixtures
