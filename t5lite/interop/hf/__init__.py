"""Hugging Face checkpoints in and out: T5 (v1.0, v1.1, mT5), BERT, RoBERTa, ALBERT, ELECTRA,
DeBERTa-v2/v3, Longformer, GPT-2, BART, ViT, and VisionEncoderDecoderModel (ViT + GPT-2).

    module, variables = load("path/to/hf_folder")      # config.json + model.safetensors / pytorch_model.bin
    save(module_or_config, variables, "out_dir")       # a folder transformers' from_pretrained reads
    load_classifier("path/to/hf_folder")               # ...ForImageClassification (ViT), BERT's ForSequenceClassification
    load("path/to/hf_folder", adapter="path/to/peft_adapter")   # a peft LoRA merged in (a prompt, prefix added)
    method, trained = load_adapter("path/to/peft_adapter", module)   # ... or kept apart, to train on
    save_adapter(module, method, trained, "out_dir")   # a folder peft.PeftModel.from_pretrained reads

A family (one module each) is a config translation (HF config.json <-> ModelConfig, `from_hf` and
`to_hf`) plus a list of `Rule`s (rules.py), each pairing one HF tensor with t5lite parameters and
saying how the layouts differ; `FAMILIES` finds it by the config's `model_type`. Loading checks
every tensor's presence and shape before converting and names the tensor and the expected shape
when something is off. Params are plain (unboxed) float32 arrays in the looped layer layout;
`scan_layers=True` stacks them.
"""
from __future__ import annotations

import functools
import logging
import os
from typing import Callable, Protocol

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax.core import meta
from flax.traverse_util import flatten_dict, unflatten_dict

from t5lite import models
from t5lite.errors import first_line
from t5lite.interop.hf import adapter as adapter_lib
from t5lite.interop.hf import bart, bert, deberta, files, gpt2, longformer, t5, vision_encoder_decoder, vit
from t5lite.interop.hf.fields import HFConversionError, activation_from_hf
from t5lite.interop.hf.rules import Rule
from t5lite.models import heads, vision
from t5lite.models.config import ModelConfig
from t5lite.models.with_head import WithHead

log = logging.getLogger(__name__)


class Family(Protocol):
    """What each family module provides: config.json <-> ModelConfig, and the tensor rules of a config."""
    def from_hf(self, c: dict, tensors: dict[str, np.ndarray]) -> ModelConfig: ...

    def to_hf(self, cfg: ModelConfig) -> dict: ...

    def rules(self, cfg: ModelConfig) -> list[Rule]: ...


# HF model_type -> a new family object (one per conversion: DeBERTa's names depend on the checkpoint).
FAMILIES: dict[str, Callable[[], Family]] = {
    "t5": t5.T5Family, "mt5": t5.T5Family,
    **{model_type: functools.partial(bert.EncoderFamily, names) for model_type, names in bert.MEMBERS.items()},
    "deberta-v2": deberta.DebertaV2Family,
    "gpt2": gpt2.GPT2Family,
    "bart": bart.BartFamily,
    "vit": vit.ViTFamily,
    vision_encoder_decoder.MODEL_TYPE: vision_encoder_decoder.VisionEncoderDecoderFamily,
    "longformer": longformer.LongformerFamily,
}


def model_type_of(cfg: ModelConfig) -> str:
    """Which HF model_type a t5lite config exports to."""
    if cfg.share_encoder_decoder:
        raise HFConversionError("a shared encoder-decoder (share_encoder_decoder=True) has no Hugging Face "
                          "architecture; it stays a t5lite run")
    if cfg.image_size:
        return vision_encoder_decoder.MODEL_TYPE if cfg.arch == "encoder_decoder" else "vit"
    if cfg.attention_window is not None:
        return "longformer"
    if cfg.arch == "decoder":
        return "gpt2"
    if cfg.arch == "encoder_decoder":
        return "t5" if cfg.norm == "rms" else "bart"
    if cfg.share_layers:
        return "albert"
    if cfg.position_encoding == "disentangled":
        return "deberta-v2"
    if cfg.position_offset:
        return "roberta"
    return "electra" if cfg.embedding_size is not None or cfg.encoder_head == "discriminator" else "bert"


def _family(path: str, hf_config: dict) -> Family:
    model_type = hf_config.get("model_type")
    if model_type not in FAMILIES:
        raise HFConversionError(f"{os.path.join(path, files.CONFIG)}: unsupported model_type {model_type!r}; "
                                f"t5lite converts {', '.join(FAMILIES)}")
    return FAMILIES[model_type]()


def _translate(path: str, family: Family, hf_config: dict, tensors: dict[str, np.ndarray]) -> ModelConfig:
    """The t5lite config of a folder's config.json; what does not fit is an `HFConversionError` naming the file."""
    config_path = os.path.join(path, files.CONFIG)
    try:
        return family.from_hf(hf_config, tensors)
    except HFConversionError as e:
        raise HFConversionError(f"{config_path}: {e}") from None
    except KeyError as e:
        raise HFConversionError(f"{config_path}: a {hf_config['model_type']} config needs the field {e.args[0]!r}, "
                                f"which this one lacks; {files.RESAVE}") from None
    except (TypeError, ValueError) as e:
        raise HFConversionError(f"{config_path}: a field has a value t5lite cannot use ({first_line(e)})") from None


def _add_prefix(tensors: dict[str, np.ndarray], rules: list[Rule]) -> dict[str, np.ndarray]:
    """Headless checkpoints (BertModel, GPT2Model) drop the base-model prefix ("bert.", "transformer.")."""
    wanted = {r.hf for r in rules}
    if wanted & tensors.keys():
        return tensors
    prefixes = {name.split(".", 1)[0] for name in wanted if "." in name}
    renamed = lambda k: next((f"{p}.{k}" for p in prefixes if f"{p}.{k}" in wanted), k)
    return {renamed(k): v for k, v in tensors.items()}


def _param_shapes(module: nn.Module) -> dict[str, tuple[int, ...]]:
    cfg = module.config
    tokens = jnp.zeros((1, 4), jnp.int32)
    features = dict(encoder_input_tokens=tokens, decoder_input_tokens=tokens, **vision.init_features(cfg))
    shapes = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), **features))["params"]
    shapes = meta.unbox(shapes)
    assert not cfg.scan_layers
    return {"/".join(k): tuple(v.shape) for k, v in flatten_dict(shapes).items()}


def load(path: str, adapter: str | None = None, **config_overrides) -> tuple[nn.Module, dict]:
    """Reads a Hugging Face model folder -> (module, {"params": ...}).

    `adapter`: a peft adapter folder for this base: a LoRA merged into the params, a prompt or
    prefix added beside them (`load_adapter` keeps it apart). `config_overrides` replace t5lite
    config fields (e.g. `scan_layers=True`, `dtype="bfloat16"`, `dropout_rate=0.0`); they must not
    change parameter shapes.
    """
    hf_config = files.read_config(path)
    family = _family(path, hf_config)      # before reading gigabytes of weights
    tensors = files.read_tensors(path)
    config = _translate(path, family, hf_config, tensors)
    model_type = hf_config["model_type"]
    rules = family.rules(config)
    tensors = _add_prefix(tensors, rules)
    shapes = _param_shapes(models.build(config))

    flat, used = {}, set()
    for rule in rules:
        want = rule.hf_shape([shapes[p] for p in rule.ours])
        if rule.hf not in tensors:
            raise HFConversionError(f"{path}: missing tensor {rule.hf!r} (expected shape {want}) for {model_type}")
        tensor = np.asarray(tensors[rule.hf])
        if tuple(tensor.shape) != want:
            raise HFConversionError(f"{path}: tensor {rule.hf!r} has shape {tuple(tensor.shape)}, expected {want}")
        for p, value in zip(rule.ours, rule.from_hf(tensor, [shapes[p] for p in rule.ours])):
            flat[p] = value
        used.add(rule.hf)
    missing = sorted(shapes.keys() - flat.keys())
    assert not missing, f"no HF tensor maps to {missing}"
    unused = sorted(tensors.keys() - used)
    if unused:
        log.info("%s: tensors not used by t5lite's %s model (tied copies, unused heads): %s", path, model_type,
                 unused)
    params = unflatten_dict({tuple(k.split("/")): jnp.asarray(v) for k, v in flat.items()})
    if adapter is not None:
        method, trained = adapter_lib.from_peft(rules, *adapter_lib.read(adapter), shapes, where=adapter,
                                                model_type=model_type)
        if "head" in trained["params"]:
            raise HFConversionError(f"{adapter}: the adapter trains a classification head (modules_to_save), which a "
                                    "model without a head has no place for; import it as a run with `t5lite convert "
                                    "--from_hf BASE --peft_adapter DIR --out RUN`")
        params = method.combine(params, trained)
    config = config.replace(**config_overrides)
    if config.scan_layers:
        params = models.scan_params(params)
    return models.build(config), {"params": params}


ROBERTA_HEADS = ("roberta", "longformer")   # model types whose classifier is transformers' RobertaClassificationHead


def load_classifier(path: str, **config_overrides) -> tuple[nn.Module, dict]:
    """A Hugging Face classifier folder -> a task-head model (`WithHead`, as fine-tuning trains) and its
    variables `{"params": {"backbone", "head"}}`. Three heads are read: one dense `classifier`
    (ViTForImageClassification on the [CLS] state, BertForSequenceClassification on the pooler);
    RoBERTa's `classifier.dense` + tanh + `classifier.out_proj` on the first token (Roberta- and
    LongformerForSequenceClassification); and DeBERTa-v2's ContextPooler, `pooler.dense` +
    `pooler_hidden_act` on the first token, then `classifier`. The last two are BERT's pooler
    (with DeBERTa's activation) and classifier under other names, so they become those."""
    tensors = files.read_tensors(path)
    pooled = _pooled_head(path, files.read_config(path), tensors)
    if pooled:
        dense_name, classifier_name, activation = pooled
        module, variables = load(path, **config_overrides, pooler=True, pooler_activation=activation)
        dense = {"kernel": np.asarray(tensors[f"{dense_name}.weight"], np.float32).T,
                 "bias": np.asarray(tensors[f"{dense_name}.bias"], np.float32)}
        variables = {"params": {**variables["params"], "pooler": {"dense": jax.tree.map(jnp.asarray, dense)}}}
        weight, bias = tensors[f"{classifier_name}.weight"], tensors[f"{classifier_name}.bias"]
    elif "classifier.weight" in tensors and "classifier.bias" in tensors:
        module, variables = load(path, **config_overrides)
        weight, bias = tensors["classifier.weight"], tensors["classifier.bias"]
    else:
        raise HFConversionError(f"{path}: neither a 'classifier' dense nor RoBERTa's 'classifier.dense' and "
                                "'classifier.out_proj'; load_classifier reads a ...ForImageClassification or a BERT, "
                                "RoBERTa, Longformer or DeBERTa-v2 ...ForSequenceClassification folder")
    weight = np.asarray(weight, np.float32)
    config = module.config
    model = WithHead(config, heads.SequenceClassificationHead(config, weight.shape[0]),
                     "pooler" if config.pooler else "first")
    head = {"classifier": {"kernel": weight.T, "bias": np.asarray(bias, np.float32)}}
    return model, {"params": {"backbone": variables["params"], "head": jax.tree.map(jnp.asarray, head)}}


def _pooled_head(path: str, hf_config: dict, tensors: dict) -> tuple[str, str, str] | None:
    """(the dense on the first token, the classifier after it, t5lite's name of the activation
    between) of a classifier head that t5lite reads as its pooler + classifier; None for a head
    that is one dense."""
    model_type = hf_config.get("model_type")
    if all(f"classifier.{m}.{p}" in tensors for m in ("dense", "out_proj") for p in ("weight", "bias")):
        if model_type not in ROBERTA_HEADS:   # ELECTRA's has these names with a GELU
            raise HFConversionError(f"{path}: this {model_type} classifier's head (classifier.dense, its activation, "
                                    "classifier.out_proj) is not RoBERTa's dense + tanh, which load_classifier reads; "
                                    "load the backbone with hf.load and fine-tune a new head")
        return "classifier.dense", "classifier.out_proj", "tanh"
    if model_type == "deberta-v2" and "pooler.dense.weight" in tensors:
        width = hf_config.get("pooler_hidden_size") or hf_config["hidden_size"]
        if width != hf_config["hidden_size"]:
            raise HFConversionError(f"{path}: pooler_hidden_size={width} differs from hidden_size="
                                    f"{hf_config['hidden_size']}; t5lite's pooler keeps the model's width")
        return "pooler.dense", "classifier", activation_from_hf(hf_config.get("pooler_hidden_act", "gelu"))
    return None


def export_config(config: ModelConfig) -> dict:
    """The config.json `save` writes for a t5lite config; an `HFConversionError` if Hugging Face
    cannot express the model."""
    return _family_of(config).to_hf(config)


def save(module_or_config: nn.Module | ModelConfig, variables: dict, out_dir: str) -> str:
    """Writes config.json + model.safetensors that `transformers.AutoModel*.from_pretrained` reads."""
    config = module_or_config if isinstance(module_or_config, ModelConfig) else module_or_config.config
    family = _family_of(config)
    config_json = family.to_hf(config)
    params = meta.unbox(variables["params"] if "params" in variables else variables)
    if config.scan_layers:
        params = models.unscan_params(params)
    flat = {"/".join(k): np.asarray(v) for k, v in flatten_dict(params).items()}
    tensors, exported = {}, set()
    for rule in family.rules(config.replace(scan_layers=False)):
        absent = [p for p in rule.ours if p not in flat]
        if absent:
            raise HFConversionError(f"cannot export {rule.hf!r}: params {absent} are missing from the variables")
        tensors[rule.hf] = rule.to_hf([flat[p] for p in rule.ours])
        exported.update(rule.ours)
    leftover = sorted(flat.keys() - exported)
    if leftover:
        raise HFConversionError(f"{config_json['model_type']} has no place for params {leftover}")
    return files.write(out_dir, config_json, tensors)


def load_adapter(path: str, module: nn.Module):
    """A peft LoRA, prefix- or prompt-tuning folder for `module`'s (looped) params -> (the method, trained
    tree); `method.combine(params, trained)` applies it. A LoRA of a sequence classifier (peft's
    SEQ_CLS, its classifier in modules_to_save) is one of a task-head model, `{"backbone": params,
    "head": ...}` (adapter.from_peft)."""
    config = module.config
    if config.scan_layers:
        raise HFConversionError(f"{path}: load the adapter onto a looped model (scan_layers=False), then scan")
    return adapter_lib.from_peft(_family_of(config).rules(config), *adapter_lib.read(path),
                                 _param_shapes(module), where=path, model_type=model_type_of(config))


def save_adapter(module_or_config: nn.Module | ModelConfig, method, trained: dict, out_dir: str,
                 base_model_name_or_path: str = "", sequence_classifier: bool = False) -> str:
    """Writes a t5lite LoRA, prefix or prompt as a peft adapter folder (adapter_config.json +
    adapter_model.safetensors); `sequence_classifier`: with its classification head, as peft saves
    a SEQ_CLS model's (adapter.to_peft)."""
    config = module_or_config if isinstance(module_or_config, ModelConfig) else module_or_config.config
    if config.scan_layers:
        raise HFConversionError("save the adapter of a looped model (scan_layers=False)")
    adapter_config, tensors = adapter_lib.to_peft(config, _family_of(config).rules(config), method, trained,
                                                  base_model_name_or_path, sequence_classifier)
    return adapter_lib.write(out_dir, adapter_config, tensors)


def _family_of(config: ModelConfig) -> Family:
    return FAMILIES[model_type_of(config)]()


__all__ = ["FAMILIES", "HFConversionError", "Rule", "export_config", "load", "load_adapter", "load_classifier",
           "model_type_of", "save", "save_adapter"]
