"""`t5lite train`: the gin entry point `train()` and the loop that only steps, logs, evaluates and saves.

Everything the loop needs is built once by t5lite.train.setup (the state restored or initialised,
the loader, the jitted step of t5lite.train.step, evaluators, writer, cost meter). A logged step
fetches the averaged metrics; the step's finite flag is fetched only at checkpoint steps, so a
diverging run never saves a non-finite state (nor rotates out its last finite one).
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Any, Mapping

import gin
import jax
import numpy as np
from tqdm.auto import tqdm

from t5lite import models
from t5lite.errors import DataError, T5liteError
from t5lite.infer import evaluation
from t5lite.models import flops, peft as peft_lib, windowed_attention
from t5lite.models.config import ModelConfig
from t5lite.objectives import families  # noqa: F401  (gin knows every objective: train.objective = @...())
from t5lite.objectives.base import Objective
from t5lite.run_layout import RunDir
from t5lite.train import checkpoints, cost, preemption, pruning as pruning_lib, run_dir, summaries
from t5lite.train.partitioning import Partitioner
from t5lite.train.setup import Run, TrainConfig, setup
from t5lite.train.step import FINITE

log = logging.getLogger("t5lite")
# The console's other channels (t5lite.cli.train sets their levels): evaluations and saves are
# printed even with --quiet, the cost line only with --verbose.
events = logging.getLogger("t5lite.events")
cost_log = logging.getLogger("t5lite.cost")

# PEFT methods for `train.peft = @LoRA()` / `@BitFit()` (t5lite.models.peft).
gin.external_configurable(peft_lib.LoRA, "LoRA")
gin.external_configurable(peft_lib.BitFit, "BitFit")
gin.external_configurable(peft_lib.PromptTuning, "PromptTuning")
gin.external_configurable(peft_lib.PrefixTuning, "PrefixTuning")
gin.external_configurable(peft_lib.Adapters, "Adapters")


class NonFiniteLossError(T5liteError, FloatingPointError):
    """The loss or gradients diverged; the message names the last finite checkpoint to resume from."""


@gin.configurable
def model_config(preset: str = gin.REQUIRED, overrides: Mapping[str, Any] | None = None,
                 dtype: str | None = None, scan_layers: bool | None = None, remat_policy: str | None = None,
                 dropout_rate: float | None = None, vocab_size: int | None = None,
                 pad_token_id: int | None = None, max_position_embeddings: int | None = None) -> ModelConfig:
    """A preset with the fields users change most often overridden from gin (`pad_token_id`: a
    RoBERTa preset, pad 1, trained on a T5-style vocabulary, pad 0), and any other field of the
    preset's config through `overrides` (`{'num_encoder_layers': 4}`; a misspelt field is a
    ConfigError naming the close ones)."""
    changes = dict(overrides or {})
    for key, value in dict(dtype=dtype, scan_layers=scan_layers, remat_policy=remat_policy,
                           dropout_rate=dropout_rate, vocab_size=vocab_size, pad_token_id=pad_token_id,
                           max_position_embeddings=max_position_embeddings).items():
        if value is not None:
            changes[key] = value
    return models.get_config(preset, **changes)


@gin.configurable(denylist=["progress"])
def train(model_dir: str = gin.REQUIRED, mixture_or_task_name: str = gin.REQUIRED,
          task_feature_lengths: Mapping[str, int] = gin.REQUIRED, batch_size: int = gin.REQUIRED,
          train_steps: int = gin.REQUIRED, model: ModelConfig = gin.REQUIRED, optimizer=gin.REQUIRED,
          feature_converter: str = "enc_dec", pack: bool = True, seed: int = 0, num_microbatches: int = 1,
          z_loss: float = 1e-4, label_smoothing: float = 0.0,
          loss_normalizing_factor: float | str | None = "NUM_REAL_TARGET_TOKENS",
          loss_normalizing_scope: str = "global_batch", log_every: int = 10,
          checkpoint_every: int = 100,
          keep_checkpoints: int = 3, async_checkpoints: bool = True, data_dir: str | None = None,
          initial_checkpoint_path: str | None = None, initial_checkpoint_restore: str = "params",
          vocabulary_path: str | None = None,
          peak_flops_per_device: float | None = None, partitioner: Partitioner | None = None,
          train_split: str = "train", train_examples: int | None = None, train_examples_seed: int = 0,
          eval_every: int = 0, eval_split: str = "validation",
          eval_batch_size: int | None = None,
          eval_max_examples: int | None = None, allow_config_change: bool = False, objective: Objective | None = None,
          data_block_size: int = 128, data_workers: int = 0, peft: peft_lib.Method | None = None,
          pruning: pruning_lib.MagnitudePruning | pruning_lib.HeadPruning | None = None, quantization: str | None = None,
          progress: bool = True) -> dict:
    """Trains (or resumes) a model in `model_dir`; returns the last logged metrics.

    The task's `train_split` is trained on (e.g. 'validation' where a dataset ships no train file);
    with `train_examples` = N, only N of its examples, drawn by `train_examples_seed` (the same N for
    every training seed), as learning curves over label counts (ULMFiT's Figure 3) need.
    With `eval_every`, the task's `eval_split` is evaluated every that many steps and at the end
    (t5lite.infer.evaluation): `eval_`-prefixed metrics go to metrics.jsonl, the predictions to
    `eval/<task>.<split>/predictions.jsonl`.

    `loss_normalizing_factor` takes T5X's values: the summed token loss is divided by the number
    of real target tokens ('NUM_REAL_TARGET_TOKENS', t5lite's default: a per-token mean; T5X's
    default is None), by all target positions ('NUM_TOTAL_TARGET_TOKENS'), by a constant (T5X
    fine-tunes the original T5 checkpoints with 233472), not at all (None), or every (packed)
    sequence weighs the same ('AVERAGE_PER_SEQUENCE'). `loss_normalizing_scope` says over what
    the factor (and every other divisor of the objective) is counted when `num_microbatches` > 1:
    'global_batch' (the default) counts the whole batch, so the update does not depend on
    `num_microbatches`; 'microbatch' is T5X's `accumulate_grads_microbatched` (microbatch i is
    its contiguous slice of rows, each microbatch's loss divided by its own count, gradients
    summed), so a batch gives T5X's gradient.
    The logged `loss` is always the per-real-token mean.

    `objective` (t5lite.objectives.base) is the module trained and its loss; the default is token
    cross entropy over the model's logits (span corruption, LM, MLM). An objective's frozen arrays
    (a distillation teacher, t5lite.objectives.distillation) are loaded once and passed to every step;
    its reference models (the teacher) are evaluated once at step 0 (`teacher_eval_*`).

    Cost (t5lite.train.cost): every log adds the cumulative FLOPs, device-hours and estimated
    energy, CO2e and cloud price (`cost_*`) to metrics.jsonl and rewrites `MODEL_DIR/cost.json`;
    the FLOPs are the training steps' and every evaluation's forward passes (periodic, final and
    a reference model's), each evaluation line carrying the totals after it; a resumed run
    continues those totals.

    The input pipeline (t5lite.data.loader) preprocesses `data_block_size` records at a time in
    `data_workers` grain worker processes (0: in the training process); the block size is part of
    the data order, so a resumed run must keep it.

    `initial_checkpoint_path` starts a new run from another run's checkpoint: its parameters with
    a fresh optimizer at step 0 (`initial_checkpoint_restore='params'`), or its whole train state
    (`'full'`: optimizer state and step, as T5X's finetune.gin restores a checkpoint, and rng;
    `train_steps` then counts the pre-training steps). The objective places the parameters: a task
    head's objective grafts them into `params["backbone"]` and keeps the new head's init
    (`Objective.initial_params`).

    `peft` (`@LoRA()`, `@BitFit()`; t5lite.models.peft) fine-tunes a frozen base, the
    `initial_checkpoint_path`: only the method's parameters (and a task head) train, get optimizer
    state and are checkpointed; `MODEL_DIR/peft.json` names the base (t5lite.infer.peft_checkpoint).

    `pruning` (`@MagnitudePruning()` or `@HeadPruning()`, t5lite.train.pruning) prunes the starting
    params (those of `initial_checkpoint_path`; head pruning scores heads on the run's training
    batches), optionally rewinds the kept weights to an early checkpoint, and
    keeps pruned weights at zero after every update; `MODEL_DIR/sparsity.json` has the sparsity
    of every kernel, metrics.jsonl the total `sparsity` on every line and each kernel's
    (`sparsity/<path>`) on the run's first.

    `quantization` ('int8' or 'int4') is quantisation-aware training through Qwix: the forward
    pass (`__call__`) sees every weight matmul's weights quantised per output channel, gradients
    pass straight through to the float params, which the checkpoints keep (`t5lite convert
    --quantize int8` then writes the int8 run).

    Run safety (docs/guides/troubleshooting.md): MODEL_DIR must be writable and not in use by
    another run (`run_dir`); SIGTERM / SIGINT stop after the current step with a checkpoint
    (`preemption`); resuming restores the newest readable checkpoint and refuses a changed model
    config unless `allow_config_change`. A step whose loss, gradient norm or parameters are not
    finite is never saved: the run stops (NonFiniteLossError) naming the last finite checkpoint. A
    full disk stops it with one CheckpointError; the last complete checkpoint is kept. The
    vocabulary is recorded in `vocabulary.json`; resuming or fine-tuning (`initial_checkpoint_path`)
    with another one is refused unless `allow_config_change` or the gin `vocabulary.allow_mismatch`.
    With no `vocabulary_path` (nor gin `vocabulary.path`), the tokenizer a run carries (`t5lite
    convert --from_hf`: `RUN/tokenizer`) of `initial_checkpoint_path` or of the resumed run is used,
    and a fine-tuned run keeps a copy in `MODEL_DIR/tokenizer`."""
    settings = dict(locals())
    del settings["progress"]
    config = TrainConfig(**settings)   # checks the values
    layout = RunDir(model_dir)
    with run_dir.writable_folders(str(layout.path), str(layout.checkpoints)), run_dir.RunLock(model_dir), \
            preemption.StopSignals() as stop:   # the folders checked before anything compiles
        meter = cost.CostMeter(model_dir)   # MODEL_DIR/cost.json: cumulative over restarts
        ckpt = checkpoints.Checkpointer(str(layout.checkpoints), checkpoint_every, keep_checkpoints,
                                        async_checkpoints)
        run = setup(config, ckpt, meter)
        if run is None:
            ckpt.close()
            return {}
        return loop(run, stop, progress)


def loop(run: Run, stop: preemption.StopSignals, progress: bool = True) -> dict:
    """Steps `run` to its TRAIN_STEPS (or a stop signal); logs every `log_every` steps, evaluates
    every `eval_every`, saves when due, at a signal and at the end. Returns the last logged metrics."""
    c, ckpt, state, step = run.config, run.checkpointer, run.state, run.start
    for name, (module, params) in run.reference_models.items():
        _evaluate(run, module, params, step, prefix=f"{name}_")
    last, dev, since = {}, {}, _SinceLog(step)
    bar = tqdm(total=c.train_steps, initial=step, desc="train", unit="step",
               disable=not progress or jax.process_index())
    try:
        with run.trainer.mesh_context():
            for step in range(run.start + 1, c.train_steps + 1):
                batch, data_state = next(run.batches)
                counts = flops.real_counts(batch, run.image_tokens)
                if windowed_attention.GLOBAL_MASK in batch:
                    windowed_attention.check_global_tokens(batch, run.trainer.config.max_global_tokens)
                since.real = [total + n * run.host_scale for total, n in zip(since.real, counts)]
                state, metrics = run.step(state, run.trainer.partitioner.shard_batch(batch))
                finite = metrics.pop(FINITE)
                since.pending.append(metrics)
                if step % c.log_every == 0 or step == c.train_steps or step == run.start + 1:
                    last, since = _log(run, step, since), _SinceLog(step)
                    _show(bar, last, dev, c.eval_split)
                if run.evaluators and (step % c.eval_every == 0 or step == c.train_steps):
                    dev = _evaluate(run, run.trainer.model, run.model_params(state.params), step)
                    last.update(dev)
                    _show(bar, last, dev, c.eval_split)
                stopping = stop.requested(step, ckpt)
                if stopping or step == c.train_steps or ckpt.due(step):
                    if not bool(finite):  # the only host sync of a step that is not logged
                        if since.pending:   # not logged yet: its metrics line first, as at a log step
                            _log(run, step, since)
                        raise _non_finite(step, _summarise([metrics]), ckpt)
                    ckpt.save(step, state, data_state, force=True)
                    events.info("step %d: saved a checkpoint in %s", step, ckpt.directory)
                bar.update(1)
                if stopping:
                    break
    finally:
        run.batches.close()  # stops the prefetch thread
        bar.close()
        ckpt.close()  # waits until the last save is committed
        run.writer.close()
    _finish(run, state, step, stop)
    return last


@dataclasses.dataclass
class _SinceLog:
    """The steps since the last metrics line: the step and time it was written at, the real
    (non-pad) tokens and examples read since on all hosts, and each step's metrics."""
    step: int
    time: float = dataclasses.field(default_factory=time.perf_counter)
    real: list = dataclasses.field(default_factory=lambda: [0, 0])
    pending: list = dataclasses.field(default_factory=list)


def _log(run: Run, step: int, since: _SinceLog) -> dict:
    """Writes and returns the metrics line of the steps since the last one (their means, speeds and
    the cost so far); a non-finite loss is null there, flagged "non_finite", and stops the run."""
    first = step == run.start + 1
    last = _summarise(since.pending)
    if first:
        _refuse_nothing_trained(run, last)
    last.update(_throughput(step - since.step, time.perf_counter() - since.time, since.real, run.config.batch_size,
                            run.tokens_per_step, run.flops_per_step / run.peak_flops))
    run.meter.add_flops(run.flops_per_step * (step - since.step))
    last.update(_cost_metrics(run.meter, step))
    last.update({**run.every_log, **(run.first_log if first else {})})
    run.writer.write(step, last)
    if not math.isfinite(last["loss"]):
        raise _non_finite(step, last, run.checkpointer)
    return last


def _refuse_nothing_trained(run: Run, metrics: dict) -> None:
    """Stops a run whose first step trained on nothing: a loss and a gradient of exactly 0 mean its
    batch held no target token, pair or example the objective counts (Skip-Thought on paragraphs
    of one sentence), and every later step would do the same, saving an untrained model."""
    if metrics["loss"] == 0 and metrics["grad_norm"] == 0:
        c = run.config
        raise DataError(f"task {c.mixture_or_task_name!r} split {c.train_split!r}: the first batch gives "
                        f"{type(run.trainer.objective).__name__} nothing to train on (loss 0, gradient 0), so "
                        "nothing was saved; check the data (Skip-Thought and Quick-Thought need paragraphs of two "
                        "or more sentences), TASK_FEATURE_LENGTHS and the feature converter")


def _finish(run: Run, state, step: int, stop: preemption.StopSignals) -> None:
    """The objective's end-of-training outputs (word2vec's vectors.txt), the loss plot, the cost."""
    layout = RunDir(run.config.model_dir)
    if step == run.config.train_steps:
        run.trainer.objective.finish(run.config.model_dir, run.model_params(state.params))
    if stop.signal_name:
        log.warning("stopped by %s at step %d; its checkpoint is saved in %s; rerun the same command to resume",
                    stop.signal_name, step, run.checkpointer.directory)
    if jax.process_index() == 0 and layout.metrics.exists():
        summaries.plot_loss_curve(str(layout.metrics), str(layout.loss_plot), run.trainer.objective.loss_label,
                                  console_split(run.config.eval_split))
    if step > run.start:
        cost_log.info("cost so far (%s, %d x %s): %s", run.meter.path, run.meter.model.devices, run.meter.model.device_kind,
                 cost.summary(run.meter.totals()))


def _cost_metrics(meter: cost.CostMeter, step: int) -> dict[str, float]:
    """The run's cost so far, rewritten to cost.json and returned as `cost_*` metrics."""
    totals = meter.totals()
    meter.write(step, totals)
    return {f"cost_{k}": v for k, v in totals.items()}


def _show(bar, metrics: dict, dev: dict, split: str) -> None:
    """The progress bar's postfix: the training loss, accuracy and learning rate, the speeds, and the
    latest evaluation's headline metric (t5lite's units, accuracy in %), named by its split."""
    accuracy, headline = _headline_accuracy(metrics), _headline_dev(dev)
    bar.set_postfix({"loss": f"{metrics['loss']:.3f}", **({} if accuracy is None else {"train_acc": f"{accuracy:.3f}"}),
                     "lr": f"{metrics['learning_rate']:.3g}",
                     "tok_s": f"{metrics['real_tokens_per_sec']:.0f}/{metrics['tokens_per_sec']:.0f}",
                     "ex_s": f"{metrics['examples_per_sec']:.1f}",
                     **({} if headline is None else {f"{console_split(split)}_{headline[0]}": f"{headline[1]:.4g}"})})


def _non_finite(step: int, metrics: dict, ckpt: checkpoints.Checkpointer) -> NonFiniteLossError:
    last = ckpt.latest_step()
    resume = (f"the last finite checkpoint is step {last} in {ckpt.directory}; rerun the same command to resume "
              "from it" if last is not None else "no checkpoint was saved before it")
    return NonFiniteLossError(f"loss {metrics['loss']:.4g}, gradient norm {metrics['grad_norm']:.4g} at step {step}: "
                              f"not finite, so not saved; {resume}. Lower the learning rate, enable z_loss, or check "
                              "the data")


EVAL_SPLIT_NAMES = {"validation": "dev"}   # how the console names an evaluated split


def console_split(split: str) -> str:
    """An evaluated split as the console names it: `dev` for validation, else the split's own name."""
    return EVAL_SPLIT_NAMES.get(split, split)


def _evaluate(run: Run, module, params, step: int, prefix: str = "") -> dict[str, float]:
    """Evaluates `params`; metrics into metrics.jsonl as `eval_*` (a reference model such as a
    distillation teacher: `teacher_eval_*`), predictions beside, and one console line
    (`step 300 dev: accuracy=81.2 (872 examples)`). The evaluation's forward FLOPs
    (`EvalResult.flops`) are part of the run's cost: they go to the meter, whose totals are rewritten
    to cost.json, added to the eval line (`cost_*`). Returns the metrics line written."""
    split = run.config.eval_split
    results = evaluation.evaluate_all(run.evaluators, module, params)
    scores = evaluation.flat_metrics(results)
    run.meter.add_flops(sum(result.flops for result in results.values()))
    record = {**{f"{prefix}eval_{k}": v for k, v in scores.items()}, **_cost_metrics(run.meter, step)}
    run.writer.write(step, record)
    if jax.process_index() == 0:
        for name, result in results.items():
            evaluation.write_result(str(RunDir(run.config.model_dir).eval_output(f"{prefix}{name}", split)), result)
    examples = sum(result.num_examples() for result in results.values())
    events.info("step %d %s%s: %s (%d examples)", step, prefix, console_split(split),
                " ".join(f"{k}={v:.4g}" for k, v in scores.items()), examples)
    return record


def _throughput(steps: int, seconds: float, real: list, batch_size: int, tokens_per_step: int,
                mfu_per_step: float) -> dict:
    """Speeds since the last log: padded (every row slot) and real (non-pad tokens, examples);
    `mfu` counts the real tokens' FLOPs only, `padded_mfu` every slot's."""
    padded_tokens = tokens_per_step * steps
    return {"steps_per_sec": steps / seconds, "tokens_per_sec": padded_tokens / seconds,
            "real_tokens_per_sec": real[0] / seconds, "rows_per_sec": batch_size * steps / seconds,
            "examples_per_sec": real[1] / seconds, "padded_mfu": mfu_per_step * steps / seconds,
            "mfu": mfu_per_step * steps / seconds * real[0] / max(padded_tokens, 1)}


def _headline_accuracy(metrics: dict) -> float | None:
    """The progress bar's accuracy: token accuracy, or the objective's main one (e.g. `mlm_accuracy`);
    None for an objective that measures none (word2vec, Quick-Thought), so the bar shows no `acc`."""
    value = metrics.get("accuracy", next((v for k, v in metrics.items() if k.endswith("accuracy")), None))
    return None if value is None or not math.isfinite(value) else value


HEADLINE_SUFFIXES = ("_average", "f1", "accuracy")   # the dev metric the bar shows, first found first


def _headline_dev(dev: dict) -> tuple[str, float] | None:
    """The progress bar's dev metric (`eval_` dropped from its name): a benchmark average, else an F1
    (tagging's entity F1, SQuAD's), else an accuracy, else the first that is not a loss; None before
    the first evaluation."""
    scores = {k.removeprefix("eval_"): v for k, v in dev.items() if k.startswith("eval_")}
    ranked = [k for suffix in HEADLINE_SUFFIXES for k in scores if k.endswith(suffix)]
    ranked += [k for k in scores if not k.endswith("loss")] + list(scores)
    return (ranked[0], scores[ranked[0]]) if ranked else None


def _summarise(pending: list[dict]) -> dict:
    """Means over the steps since the last log (one device-to-host transfer)."""
    fetched = jax.device_get(pending)
    return {k: float(np.mean([m[k] for m in fetched])) for k in fetched[0]}
