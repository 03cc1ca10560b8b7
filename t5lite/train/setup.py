"""Everything a run's loop needs, built once from its config: `setup(config, ...) -> Run`.

MaxText's `setup_train_loop` idea: the config becomes one value (the state restored or
initialised, the loader, the jitted step, evaluators, writer and cost meter) before the first
step, so the loop in t5lite.train.trainer only steps, logs, evaluates and saves. What a PEFT base,
a distillation teacher or a pruning mask changes is bound here, into the step and into the
params evaluation sees, never branched on in the loop.

Order matters for run safety: the model config and vocabulary are checked against the run's
before anything compiles, and a finished run returns None before the data is read.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
from typing import Any, Callable, Mapping

import gin
import jax

from t5lite.data import catalog, vocab as vocab_lib
from t5lite.data.loader import Loader, prefetch
from t5lite.errors import ConfigError, require_positive
from t5lite.infer import checkpoint_reader, evaluation, peft_checkpoint
from t5lite.models import peft as peft_lib
from t5lite.models.config import ModelConfig
from t5lite.objectives.base import LossConfig, Objective
from t5lite.run_layout import RunDir
from t5lite.train import checkpoints, cost, mfu, pruning as pruning_lib, run_dir, summaries
from t5lite.train.partitioning import Partitioner
from t5lite.train.step import TrainState, TrainTask

log = logging.getLogger("t5lite")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The arguments of `t5lite.train.trainer.train` (gin `train.*`), checked when made."""
    model_dir: str
    mixture_or_task_name: str
    task_feature_lengths: Mapping[str, int]
    batch_size: int
    train_steps: int
    model: ModelConfig
    optimizer: Any               # (optax transformation or OptimizerFactory, schedule)
    feature_converter: str = "enc_dec"
    pack: bool = True
    seed: int = 0
    num_microbatches: int = 1
    z_loss: float = 1e-4
    label_smoothing: float = 0.0
    loss_normalizing_factor: float | str | None = "NUM_REAL_TARGET_TOKENS"
    loss_normalizing_scope: str = "global_batch"
    log_every: int = 10
    checkpoint_every: int = 100
    keep_checkpoints: int = 3
    async_checkpoints: bool = True
    data_dir: str | None = None
    initial_checkpoint_path: str | None = None
    initial_checkpoint_restore: str = "params"
    vocabulary_path: str | None = None
    peak_flops_per_device: float | None = None
    partitioner: Partitioner | None = None
    train_split: str = "train"
    train_examples: int | None = None
    train_examples_seed: int = 0
    eval_every: int = 0
    eval_split: str = "validation"
    eval_batch_size: int | None = None
    eval_max_examples: int | None = None
    allow_config_change: bool = False
    objective: Objective | None = None
    data_block_size: int = 128
    data_workers: int = 0
    peft: peft_lib.Method | None = None
    pruning: pruning_lib.MagnitudePruning | pruning_lib.HeadPruning | None = None
    quantization: str | None = None

    def __post_init__(self):
        require_positive({"TRAIN_STEPS": self.train_steps, "BATCH_SIZE": self.batch_size,
                          **({"train.train_examples": self.train_examples} if self.train_examples is not None else {}),
                          "train.log_every": self.log_every, "train.checkpoint_every": self.checkpoint_every,
                          "train.keep_checkpoints": self.keep_checkpoints,
                          "train.num_microbatches": self.num_microbatches,
                          **{f"TASK_FEATURE_LENGTHS[{k!r}]": v for k, v in self.task_feature_lengths.items()}})
        quantized = getattr(self.model, "weight_quantization", "none")   # recurrent configs have none
        if quantized != "none":
            raise ConfigError(f"model weight_quantization={quantized!r} is an inference model: train a "
                              "float model (a quantised INITIAL_CHECKPOINT_PATH is dequantised when read)")
        if self.initial_checkpoint_restore not in ("params", "full"):
            raise ConfigError(f"train.initial_checkpoint_restore={self.initial_checkpoint_restore!r}: expected "
                              "'params' or 'full'")
        if self.peft is not None and self.initial_checkpoint_restore != "params":
            raise ConfigError("train.peft trains new parameters on a frozen base: use "
                              "train.initial_checkpoint_restore='params'")
        if self.pruning is not None and (self.peft is not None or self.initial_checkpoint_restore != "params"):
            raise ConfigError("train.pruning prunes the params a run starts from: use it without train.peft and "
                              "with train.initial_checkpoint_restore='params'")
        if self.peft is not None and self.pack and not self.peft.packs:
            raise ConfigError(f"train.peft={type(self.peft).__name__}(...) puts a prompt before each example, which "
                              "packed examples cannot share: set train.pack = False")

    @property
    def loss(self) -> LossConfig:
        return LossConfig(self.z_loss, self.label_smoothing, self.loss_normalizing_factor,
                          self.loss_normalizing_scope)


@dataclasses.dataclass
class Run:
    """What the loop needs, built once by `setup`."""
    config: TrainConfig
    trainer: TrainTask
    state: TrainState
    start: int                                 # the step the state is at
    batches: Any                               # prefetched (batch, data_state) pairs
    step: Callable                             # (state, batch) -> (state, metrics), jitted
    model_params: Callable                     # state.params -> what module.apply takes
    evaluators: dict
    reference_models: dict                     # name -> (module, params), evaluated once at step 0
    checkpointer: checkpoints.Checkpointer
    writer: summaries.MetricsWriter
    meter: cost.CostMeter
    flops_per_step: float
    tokens_per_step: int                       # padded input tokens of one global batch
    image_tokens: int                          # an input image's tokens (patches and [CLS]); 0: text
    peak_flops: float                          # of all devices
    host_scale: int                            # global batch / this host's batch
    every_log: dict                            # metrics added to every log line (a pruned run's sparsity)
    first_log: dict                            # and to the run's first line only


def setup(config: TrainConfig, checkpointer: checkpoints.Checkpointer, meter: cost.CostMeter) -> Run | None:
    """The run of `config` (its MODEL_DIR locked by the caller), or None when it is already done."""
    c, ckpt = config, checkpointer
    latest = ckpt.latest_step()
    if (latest or 0) >= c.train_steps:
        log.warning("%s is already at step %d (TRAIN_STEPS=%d): nothing to do; raise TRAIN_STEPS to train further",
                    c.model_dir, latest or 0, c.train_steps)
        return None
    objective = c.objective or Objective()
    model = objective.complete_config(c.model)
    run_dir.check_model_config(c.model_dir, model, latest or 0, c.allow_config_change)
    partitioner = c.partitioner or Partitioner()
    partitioner.check_batch_size(c.batch_size, c.num_microbatches)
    task = catalog.get_task_or_mixture(c.mixture_or_task_name)
    vocabulary = _checked_vocabulary(c, task, model, objective.embedding_rows(model), resuming=latest is not None)
    optimizer, schedule = c.optimizer
    shard_index, shard_count = partitioner.data_shard()  # hosts of one data-parallel replica read the same data
    make_loader = functools.partial(
        Loader, task, c.train_split, c.task_feature_lengths, c.batch_size, c.feature_converter, pack=c.pack,
        seed=c.seed, data_dir=c.data_dir, shard_index=shard_index, shard_count=shard_count,
        block_size=c.data_block_size, worker_count=c.data_workers, max_examples=c.train_examples,
        subset_seed=c.train_examples_seed)
    loader = make_loader()
    if c.train_examples is not None:
        split_size = loader.source.split_size
        log.info("training on %d of the %d examples of %r (train.train_examples, drawn with train_examples_seed %d)",
                 min(c.train_examples, split_size), split_size, c.train_split, c.train_examples_seed)
    feature_lengths = loader.converter.model_feature_lengths(c.task_feature_lengths, pack=c.pack)
    trainer = TrainTask(model, optimizer, schedule, partitioner, feature_lengths, c.loss, c.num_microbatches,
                        objective, c.peft, c.quantization)
    frozen = None if c.peft is None else _peft_base(trainer, c, resuming=latest is not None)
    teacher = trainer.objective.load_frozen(partitioner)
    state, start = _initial_state(trainer, c, ckpt, loader, frozen)
    masks, every_log, first_log = None, {}, {}
    if c.pruning is not None:
        state, masks, every_log, first_log = _pruned(trainer, c, state, teacher, make_loader, fresh=latest is None)
    run_dir.record_config(c.model_dir, model, gin.config_str(), start, vocabulary)
    peak, peak_source = mfu.peak_flops_per_device(c.peak_flops_per_device)
    flops_per_step = trainer.flops_per_step(c.batch_size)
    image_tokens = model.image_positions if "encoder_input_images" in feature_lengths else 0
    log.info("model %s: %.1fM params; %.3g FLOPs/step; peak %.3g FLOP/s/device (%s); mesh %s",
             type(trainer.model).__name__, trainer.num_base_params / 1e6, flops_per_step, peak, peak_source,
             dict(partitioner.mesh.shape))
    total = trainer.num_base_params + (trainer.num_params if c.peft is not None else 0)
    log.info("trainable params: %d || all params: %d || trainable%%: %.4f; optimizer state %.3g MB",
             trainer.num_params, total, 100 * trainer.num_params / total, trainer.opt_state_bytes / 1e6)
    evaluators = {} if not c.eval_every else evaluation.per_task(
        trainer.objective.evaluators, task, c.eval_split, c.task_feature_lengths,
        batch_size=c.eval_batch_size or c.batch_size, data_dir=c.data_dir, max_examples=c.eval_max_examples)
    evaluation.count_training_tokens(evaluators, c.train_split, c.task_feature_lengths, c.data_dir)
    return Run(
        config=c, trainer=trainer, state=state, start=start, batches=prefetch(loader),
        step=trainer.jit_train_step(frozen, teacher, masks),
        model_params=functools.partial(trainer.model_params, frozen=frozen), evaluators=evaluators,
        reference_models=trainer.objective.reference_models(teacher) if evaluators and not start else {},
        checkpointer=ckpt, writer=summaries.MetricsWriter(c.model_dir, resume_step=start), meter=meter,
        flops_per_step=flops_per_step,
        tokens_per_step=c.batch_size * (sum(v for k, v in feature_lengths.items() if k.endswith("_input_tokens"))
                                        + image_tokens),
        image_tokens=image_tokens,
        peak_flops=peak * jax.device_count(), host_scale=c.batch_size // loader.local_batch_size,
        every_log=every_log, first_log=first_log)


def _checked_vocabulary(c: TrainConfig, task, model: ModelConfig, embedding_rows: int, resuming: bool):
    """The task's vocabulary, refused when it cannot train, when a model that decodes would stop at
    another end-of-sequence id than the one its targets end with, or when it is not the one of the
    resumed run or of `initial_checkpoint_path`; a fine-tuned run keeps a copy of the tokenizer it
    starts from."""
    source = c.model_dir if resuming or not c.initial_checkpoint_path else str(
        RunDir.of_step(checkpoint_reader.step_directory(c.initial_checkpoint_path)))
    own = vocab_lib.use_run_vocabulary(c.vocabulary_path, source)
    vocabulary = task.output_features["targets"].vocabulary
    vocab_lib.check_trainable(vocabulary)
    if getattr(model, "num_decoder_layers", 0) and model.eos_token_id != vocabulary.eos_id:   # recurrent: none
        raise ConfigError(f"the model ends its outputs with id {model.eos_token_id} but "
                          f"{vocab_lib.resolved(vocabulary)!r} ends every sequence with {vocabulary.eos_id}, so "
                          f"decoding would never stop; set model_config.eos_token_id = {vocabulary.eos_id}")
    allow_mismatch = True if c.allow_config_change else None  # None: the gin vocabulary.allow_mismatch
    vocab_lib.check_identity(c.model_dir if resuming else None, vocabulary, embedding_rows, allow_mismatch)
    if c.initial_checkpoint_path and not resuming:
        vocab_lib.check_identity(source, vocabulary, allow_mismatch=allow_mismatch)
    if own is not None and source != c.model_dir:   # the fine-tuned run carries the tokenizer on
        vocab_lib.record_tokenizer(c.model_dir, str(RunDir(source).tokenizer))
    return vocabulary


def _initial_state(trainer: TrainTask, c: TrainConfig, ckpt: checkpoints.Checkpointer, loader: Loader,
                   frozen) -> tuple[TrainState, int]:
    """(state, step): the run's newest readable checkpoint (and the loader's position in it);
    another run's whole state (`initial_checkpoint_restore='full'`); or a fresh state, with the
    params of `initial_checkpoint_path` placed by the objective, or a PEFT run's new parameters."""
    if frozen is not None and peft_checkpoint.imported(c.model_dir):   # `convert --peft_adapter`: its A, B alone
        return peft_checkpoint.start_from_import(c.model_dir, trainer.init_state(c.seed, frozen)), 0
    if ckpt.latest_step() is not None:
        state, data_state, start = ckpt.restore_newest_readable(trainer.abstract_state)
        loader.restore(data_state)
        log.info("resumed from step %d in %s", start, ckpt.directory)
        return state, start
    if c.initial_checkpoint_path and c.initial_checkpoint_restore == "full":
        state = checkpoint_reader.restore_state(c.initial_checkpoint_path, trainer.abstract_state)
        log.info("continuing the train state of %s from its step %d", c.initial_checkpoint_path, int(state.step))
        return state, int(state.step)
    if frozen is not None:
        return trainer.init_state(c.seed, frozen), 0
    params = None
    if c.initial_checkpoint_path:
        params = trainer.objective.initial_params(c.initial_checkpoint_path, trainer.abstract_state.params)
        log.info("initialised the parameters from %s", c.initial_checkpoint_path)
    return trainer.init_state(c.seed, params), 0


def _peft_base(trainer: TrainTask, c: TrainConfig, resuming: bool):
    """A PEFT run's frozen base params, checked against (or recorded in) MODEL_DIR/peft.json."""
    if not c.initial_checkpoint_path:   # refuses with the fix
        peft_checkpoint.check_or_record(c.model_dir, c.peft, c.initial_checkpoint_path, None, resuming)
    abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                            trainer.abstract_base, trainer.base_shardings)
    base = trainer.objective.initial_params(c.initial_checkpoint_path, abstract)
    record = peft_checkpoint.check_or_record(c.model_dir, c.peft, c.initial_checkpoint_path, base, resuming)
    log.info("PEFT %s on the frozen base %s (fingerprint %s)", record["method"], c.initial_checkpoint_path,
             record["base_fingerprint"])
    return trainer.init_base(c.seed, base)


def _pruned(trainer: TrainTask, c: TrainConfig, state: TrainState, teacher, make_loader, fresh: bool):
    """(state, masks, every_log, first_log): a fresh run's params pruned (and rewound), or a resumed
    run's own pattern; the masks keep pruned weights at zero, so the sparsity is fixed and is
    recorded in MODEL_DIR/sparsity.json and logged (the total on every line, each kernel's on the
    first)."""
    pruning = c.pruning
    if fresh:
        pruned = c.initial_checkpoint_path and RunDir.of_step(   # a pruned run's zeros are its mask
            checkpoint_reader.step_directory(c.initial_checkpoint_path)).sparsity.exists()
        with trainer.mesh_context():
            scoring = _head_scoring(trainer, teacher, state.rng, make_loader, getattr(pruning, "batches", 0))
            masks = pruning.masks(state.params, scoring, pruning_lib.nonzero_masks(state.params) if pruned else None)
        params = state.params
        if pruning.rewind_checkpoint:
            rewound = trainer.objective.initial_params(pruning.rewind_checkpoint, trainer.abstract_state.params)
            params = trainer.init_state(c.seed, rewound).params
            log.info("rewound the kept weights to %s", pruning.rewind_checkpoint)
        masks = jax.device_put(masks, trainer.mask_shardings(masks))
        params = jax.jit(pruning_lib.apply_masks, out_shardings=trainer.state_shardings.params)(params, masks)
        log.info("pruned to sparsity %.4f (%s)", pruning_lib.sparsity(params)["total"], pruning)
        state = state.replace(params=params)
    else:
        masks = pruning_lib.nonzero_masks(state.params)
        masks = jax.device_put(masks, trainer.mask_shardings(masks))
    sparsity = pruning_lib.sparsity(state.params)
    pruning_lib.write_sparsity(c.model_dir, sparsity)
    if getattr(pruning, "record", None):
        pruning_lib.write_head_pruning(c.model_dir, pruning.record)
    return (state, masks, {"sparsity": sparsity["total"]},
            {f"sparsity/{k}": v for k, v in sparsity["layers"].items()})


def _head_scoring(trainer: TrainTask, teacher, rng, make_loader, count: int):
    """(loss_fn, batches) as `pruning.head_importance` takes them: the training loss of
    {"params", "head_gates"}, without dropout, on the first `count` batches of `make_loader()`."""
    extra = {} if teacher is None else {"frozen": teacher}

    def loss_fn(variables, item):
        batch, key = item
        module = pruning_lib.WithVariables(trainer.model, {k: v for k, v in variables.items() if k != "params"})
        normalizers = trainer.objective.normalizers(batch, trainer.loss)
        return trainer.objective.loss_and_metrics(module, variables["params"], batch, key, normalizers, trainer.loss,
                                                  **extra)[0]
    batches = [(trainer.partitioner.shard_batch(batch), jax.random.fold_in(jax.random.wrap_key_data(rng), i))
               for i, batch in enumerate(itertools.islice(make_loader(), count))] if count else []
    return loss_fn, batches

