"""`t5lite convert`: Hugging Face folders <-> t5lite checkpoints.

A converted checkpoint is a run directory like training writes (`checkpoints/<step>/state` with
the params, plus `model_config.json`), so `INITIAL_CHECKPOINT_PATH`, `t5lite eval` and
`t5lite infer` take it as they take a pre-training run.
"""
from __future__ import annotations

import contextlib
import logging
import os

import flax.linen as nn
import jax
from etils import epath
from flax.traverse_util import flatten_dict, unflatten_dict

from t5lite import storage, writable
from t5lite.data import vocab as vocab_lib
from t5lite.errors import CheckpointError, ConfigError
from t5lite.models import quantization
from t5lite.models.config import ModelConfig, get_config, load_config, save_config
from t5lite.run_layout import RunDir

HEAD_RUN_PARAMS = ("backbone", "head")   # the params of a task-head model (t5lite.models.with_head)
PARTIAL_MARK = ".t5lite-partial"   # in an output folder while `written_whole` writes it


@contextlib.contextmanager
def written_whole(out_dir: str, flag: str):
    """Writes a command's output folder whole or not at all, so that rerunning a failed command works.
    OUT must be new or empty; it carries a mark while it is written. A failure (a full disk, input
    found bad late) takes back what was written; a folder still marked, left by a command that was
    killed, is t5lite's own partial output, which the rerun replaces."""
    from t5lite.train.checkpoints import is_disk_full
    out = epath.Path(out_dir)
    if (out / PARTIAL_MARK).exists():
        logging.getLogger("t5lite").warning("%s %s is the partial output of a command that was stopped; "
                                            "writing it again", flag, out_dir)
        out.rmtree()
    writable.ensure_new_dir(out_dir, flag)
    existed = out.is_dir()
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / PARTIAL_MARK).write_text("t5lite is writing this folder; a rerun of the command replaces it\n")
        yield
    except BaseException as e:
        if out.exists():
            out.rmtree()
        if existed:
            out.mkdir()
        if is_disk_full(e):
            raise CheckpointError(f"no space left writing {flag} {out_dir}; nothing was kept there. Free space "
                                  f"(or give another {flag}), then rerun the same command") from None
        raise
    (out / PARTIAL_MARK).unlink()


def read_model_config(run_dir: str, preset: str | None = None) -> ModelConfig:
    """The run's saved config, or a preset when the run has none (runs from before it was saved)."""
    path = RunDir(run_dir).model_config
    if path.exists():
        return load_config(path)
    if preset is None:
        raise CheckpointError(f"{run_dir} has no {path.name}; name the model with --preset (e.g. --preset t5_small)")
    try:
        return get_config(preset)
    except KeyError as e:
        raise ConfigError(f"--preset: {e.args[0]}") from None


# Runs of models that are not transformers: what each is, and what converts it.
NOT_TRANSFORMERS = {"bilm": "an ELMo run (write it with --to_elmo)", "awd_lstm": "an AWD-LSTM run",
                    "word2vec": "a word2vec run (its vectors.txt is the export)"}


def run_kind(step_dir: str) -> str:
    """What the run of a step directory is, in words, for a refusal to say."""
    from t5lite.infer.checkpoint_reader import stored_param_names
    record = _peft_record(step_dir)
    if record is not None:
        return f"a {record['method']} PEFT run"
    run = RunDir.of_step(step_dir)
    if not run.model_config.exists():   # a run from before it was saved
        return "a run"
    config = read_model_config(str(run))
    if config.arch in NOT_TRANSFORMERS:
        return NOT_TRANSFORMERS[config.arch]
    if config.weight_quantization != "none":
        return f"a {config.weight_quantization}-quantised run"
    return "a task-head run" if stored_param_names(step_dir) == set(HEAD_RUN_PARAMS) else f"a {config.arch} run"


def _refuse_not_transformer(step_dir: str, command: str) -> None:
    """Hugging Face export and quantisation read transformers only."""
    config = read_model_config(str(RunDir.of_step(step_dir)))
    if config.arch in NOT_TRANSFORMERS:
        raise CheckpointError(f"{RunDir.of_step(step_dir)} is {NOT_TRANSFORMERS[config.arch]}, which {command} does "
                              "not take: it reads t5lite's transformer runs")


def hf_to_t5lite(hf_dir: str, out_dir: str, adapter_dir: str | None = None) -> ModelConfig:
    """Imports a Hugging Face model folder as a t5lite run directory (step 0), with the folder's
    tokenizer as the run's vocabulary (`OUT/tokenizer`, t5lite.data.vocab.record_tokenizer). With
    a peft adapter folder (LoRA, prefix or prompt tuning), OUT is a PEFT run (`peft_run_from_hf`)."""
    from t5lite.interop import hf
    if adapter_dir is not None:
        return peft_run_from_hf(hf_dir, out_dir, adapter_dir)
    config = _write_run(*hf.load(hf_dir), out_dir, {"converted_from": os.path.abspath(hf_dir)})
    vocab_lib.record_tokenizer(out_dir, hf_dir)
    return config


def peft_run_from_hf(hf_dir: str, out_dir: str, adapter_dir: str) -> ModelConfig:
    """A peft adapter folder as a PEFT run, as training would write it: the imported base in
    `OUT/base`, and OUT holding the adapter's parameters (step 0: LoRA's A, B, a prefix or a
    prompt) with `peft.json` naming that base, so it trains further, evaluates, and goes back out
    with `convert --to_hf`; `convert --merge` merges a LoRA into a full checkpoint. A LoRA of a
    sequence classifier is a run of a task-head model (LoRA of its backbone, the classifier its
    trained head), whose `config.gin` names the objective: a classifier on the pooler."""
    from t5lite.infer import peft_checkpoint
    from t5lite.interop import hf
    base_dir = os.path.join(out_dir, "base")
    module, variables = hf.load(hf_dir)
    method, trained = hf.load_adapter(adapter_dir, module)   # read (and checked) before OUT is written
    with_head = peft_checkpoint.trained_with_head(trained)
    _write_run(module, variables, base_dir, {"converted_from": os.path.abspath(hf_dir)})
    vocab_lib.record_tokenizer(base_dir, hf_dir)
    _write_run(module, {"params": trained}, out_dir, {"peft_adapter": os.path.abspath(adapter_dir)})
    base = {"backbone": variables["params"], "head": None} if with_head else variables["params"]
    peft_checkpoint.check_or_record(out_dir, method, base_dir, base, resuming=False)
    if with_head:
        labels = trained["params"]["head"]["classifier"]["bias"].shape[0]
        RunDir(out_dir).config_gin.write_text("# a sequence classifier on BERT's pooler, imported from peft\n"
                                              "train.objective = @ClassificationObjective()\n"
                                              f"ClassificationObjective.num_labels = {labels}\n"
                                              "ClassificationObjective.pooling = 'pooler'\n")
    vocab_lib.record_tokenizer(out_dir, hf_dir)
    return module.config


def quantize(out_dir: str, scheme: str, hf_dir: str | None = None, run_dir: str | None = None) -> ModelConfig:
    """Writes a weight-only quantised run (`scheme` 'int8' or 'int4'; t5lite.models.quantization) of a
    Hugging Face folder or a t5lite run: int8 kernels and embedding tables with their scales on
    disk, and a `model_config.json` with `weight_quantization`, so every command builds the
    quantised model; the source's tokenizer and vocabulary record come along. A run fine-tuned
    with a task head keeps its head float32 (t5lite.models.heads: task heads are not quantised)."""
    from t5lite import models
    from t5lite.infer import predict
    if hf_dir is not None:
        from t5lite.interop import hf
        module, variables = hf.load(hf_dir)
        config, params, note = module.config, variables["params"], {"converted_from": os.path.abspath(hf_dir)}
    else:
        step_dir = _step_dir(run_dir, "--from_run")
        source = str(RunDir.of_step(step_dir))
        _refuse_not_transformer(step_dir, "--quantize")
        if _peft_record(step_dir) is not None:
            raise CheckpointError(f"{run_dir} is a PEFT run (its checkpoint holds the trained parameters alone); "
                                  "write it merged with `t5lite convert --merge RUN --out FULL`, then quantise FULL")
        config = read_model_config(source)
        if config.weight_quantization != "none":
            raise CheckpointError(f"{run_dir} is quantised already ({config.weight_quantization}); quantise its "
                                  "float source instead")
        params, note = _restore_params(step_dir, config, RunDir(source).model_config.name), {"quantized_from": step_dir}
    qconfig = config.replace(weight_quantization=scheme, scan_layers=False)
    abstract = predict.abstract_params(qconfig.replace(weight_quantization="int8"))   # which weights, which scales
    if set(params) == set(HEAD_RUN_PARAMS):   # a task-head run: its backbone quantised, the head kept float
        qparams = {"backbone": quantization.quantize_params(params["backbone"], abstract, scheme),
                   "head": params["head"]}
    else:
        qparams = quantization.quantize_params(params, abstract, scheme)
    _write_run(models.build(qconfig), {"params": qparams}, out_dir, note)
    if hf_dir is not None:
        vocab_lib.record_tokenizer(out_dir, hf_dir)
    else:
        _copy_vocabulary(source, out_dir)
    return qconfig


def _copy_vocabulary(source: str, out_dir: str) -> None:
    """The run's tokenizer folder and vocabulary record, where it has them (through epath: a gs:// run too)."""
    src, out = RunDir(source), RunDir(out_dir)
    if src.tokenizer.is_dir():
        out.tokenizer.mkdir(parents=True, exist_ok=True)
        for file in src.tokenizer.iterdir():
            (out.tokenizer / file.name).write_bytes(file.read_bytes())
    if src.vocabulary.exists():
        out.vocabulary.write_text(src.vocabulary.read_text())


def _write_run(module, variables, out_dir: str, note: dict) -> ModelConfig:
    from t5lite.train.checkpoints import Checkpointer
    epath.Path(out_dir).mkdir(parents=True, exist_ok=True)
    run = RunDir(out_dir)
    ckpt = Checkpointer(str(run.checkpoints), save_every=1, async_save=False)
    ckpt.save(0, {"params": variables["params"]}, note, force=True)
    ckpt.close()
    save_config(module.config, run.model_config)
    return module.config


def _step_dir(run_dir: str, flag: str) -> str:
    from t5lite.infer.checkpoint_reader import step_directory
    if not epath.Path(run_dir).exists():   # epath: a gs:// run is not a local path
        raise CheckpointError(f"{run_dir} does not exist; give {flag} a t5lite run directory or one of its steps")
    try:
        return step_directory(run_dir)
    except FileNotFoundError as e:
        raise CheckpointError(str(e)) from e


def _peft_record(step_dir: str) -> dict | None:
    from t5lite.infer import peft_checkpoint
    return peft_checkpoint.read(str(RunDir.of_step(step_dir)))


def merge_peft_run(run_dir: str, out_dir: str) -> ModelConfig:
    """A PEFT run (its latest checkpoint) as a plain full checkpoint: its base with LoRA merged
    (or BitFit's biases in place), which any command loads without the base."""
    from t5lite import models
    from t5lite.infer import peft_checkpoint, predict
    step_dir = _step_dir(run_dir, "--merge")
    record = _peft_record(step_dir)
    if record is None:
        raise CheckpointError(f"{run_dir} is {run_kind(step_dir)}, not a PEFT run (no {RunDir(run_dir).peft.name}); "
                              "its checkpoint is full already")
    if not peft_checkpoint.method_of(record).merges:
        raise CheckpointError(f"{run_dir} is a {record['method']} run: what it trains (a prompt, a prefix, bottleneck "
                              "adapters) is not a weight of the base, so it does not merge; evaluate and infer with the "
                              "run itself")
    run = str(RunDir.of_step(step_dir))
    config = read_model_config(run)
    params = peft_checkpoint.restore_merged(step_dir, run, record, _peft_run_abstract(step_dir, record, config))
    config = _write_run(models.build(config), {"params": params}, out_dir, {"merged_from": step_dir})
    _copy_vocabulary(run, out_dir)
    return config


def _peft_run_abstract(step_dir: str, record: dict, config: ModelConfig) -> dict:
    """The params of a PEFT run's model: the model's; of a run with a task head, `{"backbone": the
    model's, "head": the head as trained (or as its fine-tuned base holds it)}`, a task-head run's."""
    from t5lite.infer import checkpoint_reader, peft_checkpoint, predict
    model = predict.abstract_params(config)
    trained = checkpoint_reader.stored_params(step_dir)
    if not peft_checkpoint.trained_with_head(trained):
        return model
    head = trained.get("params", {}).get("head") or checkpoint_reader.stored_params(record["base_checkpoint"])["head"]
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return {"backbone": model, "head": jax.tree.map(lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype,
                                                                                   sharding=device), head)}


def t5lite_to_hf(run_dir: str, out_dir: str, preset: str | None = None) -> ModelConfig:
    """Exports a t5lite run (its latest checkpoint) as a Hugging Face model folder; of an ELECTRA
    run, the discriminator (the run's model; t5lite.objectives.electra); of a LoRA, prefix- or
    prompt-tuning run, the base folder
    `OUT/base` and the peft adapter folder `OUT/adapter` (`peft.PeftModel.from_pretrained` loads it
    onto the base; a LoRA's classification head comes along as peft's `modules_to_save`)."""
    from t5lite.interop import hf

    step_dir = _step_dir(run_dir, "--to_hf")
    record = _peft_record(step_dir)
    if record is not None:
        return _lora_run_to_hf(step_dir, record, out_dir)
    run_dir = str(RunDir.of_step(step_dir))   # a step directory's config lives in its run directory
    saved_config = RunDir(run_dir).model_config
    from_preset = not saved_config.exists()
    if not from_preset:
        _refuse_not_transformer(step_dir, "--to_hf")
    config = read_model_config(run_dir, preset)
    if config.weight_quantization != "none":
        raise hf.HFConversionError(f"{run_dir} is an {config.weight_quantization}-quantised run, whose integer "
                                   "weights a Hugging Face model does not hold; export the float run it was quantised "
                                   "from")
    try:
        hf.export_config(config)      # most models HF cannot express fail here, before the checkpoint is read
        params = _restore_params(step_dir, config, f"--preset {preset}" if from_preset else saved_config.name)
        if set(params) == set(HEAD_RUN_PARAMS):
            raise hf.HFConversionError("it is a task-head run (a backbone and a task head, e.g. a classifier), and "
                                       "t5lite exports models without a task head; evaluate and infer with the run")
        hf.save(config.replace(scan_layers=False), {"params": params}, out_dir)
    except hf.HFConversionError as e:
        raise hf.HFConversionError(f"{run_dir} cannot be written as a Hugging Face model: {e}") from None
    return config


def _restore_params(step_dir: str, config: ModelConfig, source: str):
    """The run's params in the looped layout; of an ELECTRA run, the discriminator's. A checkpoint
    that does not fit `config` is a CheckpointError that says where the config came from."""
    from t5lite import models
    from t5lite.infer.checkpoint_reader import restore_params, stored_param_names, stored_params
    from t5lite.objectives import electra

    module = models.build(config.replace(scan_layers=False))
    abstract = jax.eval_shape(lambda: nn.unbox(module.init(jax.random.key(0), **_dummy_features(config))))["params"]
    abstract = _maybe_scanned(abstract, config)
    names = stored_param_names(step_dir)
    if names == set(HEAD_RUN_PARAMS):
        abstract = _head_run_abstract(stored_params(step_dir), abstract)
    try:
        if "discriminator" in names and config.encoder_head == "discriminator":
            params = electra.discriminator_params(restore_params(step_dir, {"discriminator": abstract}))
        else:
            params = restore_params(step_dir, abstract)
    except ValueError as e:
        raise CheckpointError(f"{str(e).strip().splitlines()[0]} (the model is {source})") from None
    return models.unscan_params(params) if config.scan_layers else params


def _head_run_abstract(stored, backbone_abstract) -> dict:
    """A task-head run's params to restore: the backbone as `backbone_abstract` lays it out (less
    the pre-training heads fine-tuning dropped), the head as stored (its shape is the task's)."""
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    kept = flatten_dict(stored["backbone"])
    backbone = {p: a for p, a in flatten_dict(backbone_abstract).items() if p in kept}
    head = {p: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=device)
            for p, m in flatten_dict(stored["head"]).items()}
    return {"backbone": unflatten_dict(backbone), "head": unflatten_dict(head)}


def _lora_run_to_hf(step_dir: str, record: dict, out_dir: str) -> ModelConfig:
    from t5lite.infer import peft_checkpoint
    from t5lite.interop import hf
    method = peft_checkpoint.method_of(record)
    if not isinstance(method, (peft_checkpoint.peft.LoRA, peft_checkpoint.peft.PromptTuning,
                               peft_checkpoint.peft.PrefixTuning)):
        fix = ("write a full checkpoint with `t5lite convert --merge RUN --out DIR`, then --to_hf that" if method.merges
               else "evaluate and infer with the run itself")
        raise hf.HFConversionError(f"{step_dir}: a {record['method']} run has no peft adapter format in t5lite; {fix}")
    run = str(RunDir.of_step(step_dir))
    config = read_model_config(run)
    trained = peft_checkpoint.restore_trained(step_dir)
    with_head = peft_checkpoint.trained_with_head(trained)
    if with_head:
        _refuse_unexported_head(step_dir, record, config, method, trained)
    # Check the base has not changed since training (restore_merged refuses a different one).
    peft_checkpoint.restore_merged(step_dir, run, record, _peft_run_abstract(step_dir, record, config))
    config = t5lite_to_hf(record["base_checkpoint"], os.path.join(out_dir, "base"))
    hf.save_adapter(config, method, trained, os.path.join(out_dir, "adapter"),
                    base_model_name_or_path=storage.absolute(os.path.join(out_dir, "base")),
                    sequence_classifier=with_head)
    return config


def _refuse_unexported_head(step_dir: str, record: dict, config: ModelConfig, method, trained) -> None:
    """A PEFT run with a task head exports as peft saves a sequence-classification model: a LoRA
    of a BERT base (not a fine-tuned one) with a classifier on the pooler; anything else is refused
    with what to do instead."""
    from t5lite.infer.checkpoint_reader import stored_param_names
    from t5lite.interop import hf
    from t5lite.models import peft
    head = trained.get("params", {}).get("head", {})
    what = (f"{step_dir} is a {record['method']} run with a task head, which exports to Hugging Face only as a LoRA "
            "with a classification head on BERT's pooler over a pre-trained (not fine-tuned) BERT base")
    objective = RunDir.of_step(step_dir).config_gin
    operative = objective.read_text() if objective.exists() else ""
    if not (isinstance(method, peft.LoRA) and set(head) == {"classifier"} and config.pooler
            and hf.model_type_of(config) == "bert" and "train.objective = @ClassificationObjective()" in operative
            and "ClassificationObjective.pooling = 'pooler'" in operative
            and "head" not in stored_param_names(record["base_checkpoint"])):
        raise hf.HFConversionError(f"{what}; evaluate and infer with the run itself (or its `t5lite convert --merge` "
                                   "copy)")


def _dummy_features(config: ModelConfig) -> dict:
    """Inputs to initialise the model with: token ids, and an image model's images (vision.init_features)."""
    import jax.numpy as jnp

    from t5lite.models import vision
    ones = jnp.ones((1, 4), jnp.int32)
    images = vision.init_features(config)
    if config.arch == "encoder_decoder":
        return {"encoder_input_tokens": ones, "decoder_input_tokens": ones, **images}
    if config.arch == "decoder":
        return {"decoder_input_tokens": ones}
    return {"encoder_input_tokens": ones, **images}


def _maybe_scanned(abstract_params, config: ModelConfig):
    if not config.scan_layers:
        return abstract_params
    from t5lite import models
    return jax.eval_shape(models.scan_params, abstract_params)
