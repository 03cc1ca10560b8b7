"""Hugging Face peft LoRA, prefix-tuning and prompt-tuning adapters <-> t5lite (t5lite.models.peft).

A peft adapter folder is `adapter_config.json` (r, lora_alpha, use_rslora, target_modules, ...)
plus `adapter_model.safetensors` with `base_model.model.<module>.lora_A.weight` [r, in] and
`.lora_B.weight` [out, r] per adapted module. The family's tensor rules say which t5lite
kernel(s) each HF module is, so the same rules place LoRA: A [*in, r] = lora_A.weight.T and
B [r, n, *out] = lora_B.weight.T (GPT-2's c_attn: n = 3, query | key | value).

A peft prompt-tuning folder (peft_type PROMPT_TUNING) holds `prompt_embeddings` [n, d], t5lite's
`params/<stack>/prompt`; t5lite prompts one stack, so peft's `num_transformer_submodules` is 1.
A prefix-tuning folder (PREFIX_TUNING) holds the same name for the prefix rows [n, layers * 2 * d].

A LoRA of a sequence classifier (peft's task_type SEQ_CLS) also saves its `modules_to_save`: BERT's
`classifier` (a dense on the pooler, t5lite's ClassificationObjective(pooling='pooler') head) and,
when named, the pooler. They are t5lite's trained `head` and `backbone/pooler`, beside the LoRA of
the backbone; any other module saved is a part of the base a PEFT run keeps frozen, and refused.
"""
from __future__ import annotations

import os
import re

import numpy as np
from flax.traverse_util import flatten_dict, unflatten_dict

from t5lite.interop.hf.fields import HFConversionError
from t5lite.interop.hf import files
from t5lite.interop.hf.files import RESAVE, _read_json, _read_safetensors
from t5lite.interop.hf.rules import Rule
from t5lite.models import peft
from t5lite.models.config import ModelConfig

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model."


def lora_modules(rules: list[Rule]) -> dict[str, tuple[tuple[str, ...], tuple[str, ...], int]]:
    """HF module name -> (t5lite parent module path, Dense names, kernel input axes) for every dense
    kernel rule."""
    out = {}
    for rule in rules:
        if rule.kind in ("linear", "conv1d") and rule.hf.endswith(".weight"):
            paths = [tuple(p.split("/")) for p in rule.ours]
            out[rule.hf[:-len(".weight")]] = (paths[0][:-2], tuple(p[-2] for p in paths), rule.in_ndim)
    return out


def _module_of(name: str, modules) -> str | None:
    """The rules' module for a peft module name (headless models drop the base prefix, e.g. "bert.")."""
    if name in modules:
        return name
    return next((m for m in modules if m.endswith("." + name)), None)


# What import does with each field of peft's configs (peft 0.21; tests/test_peft.py checks every
# dataclasses.fields(peft.LoraConfig) is in one set). Metadata and training-only fields, and those
# that only choose which modules get an adapter (the folder's tensors say which did), are honoured
# as they are; a refused field must hold the value named (or None, False, [], {}).
_METADATA = {"task_type", "peft_type", "auto_mapping", "peft_version", "base_model_name_or_path", "revision",
             "inference_mode", "runtime_config"}
LORA_HONOURED = _METADATA | {
    "r", "lora_alpha", "use_rslora", "rank_pattern", "alpha_pattern", "lora_bias", "lora_dropout",
    "target_modules", "exclude_modules", "layers_to_transform", "layers_pattern", "fan_in_fan_out",
    "init_lora_weights",   # but for _BASE_REWRITING_INITS
    "eva_config", "loftq_config", "corda_config", "lora_ga_config",   # their inits' settings
    "qalora_group_size", "megatron_core", "ensure_weight_tying",   # settings of refused fields
    "modules_to_save"}   # a sequence classifier's head only (_seq_cls_head)
LORA_REFUSED = {"bias": "none", "use_dora": False, "megatron_config": None,
                "trainable_token_indices": None, "velora_config": None, "alora_invocation_tokens": None,
                "use_qalora": False, "monteclora_config": None, "layer_replication": None, "target_parameters": None,
                "use_bdlora": None, "arrow_config": None, "kasa_config": None}
# peft's inits that change what a loaded adapter means: they rewrite the base weights (PiSSA, OLoRA,
# CorDA, LoftQ, LoRA-GA) or freeze B (MiCA) when peft creates the layers, before the tensors load.
_BASE_REWRITING_INITS = ("pissa", "olora", "corda", "loftq", "lora_ga", "mica")
PROMPT_HONOURED = _METADATA | {"num_virtual_tokens", "token_dim", "num_transformer_submodules",
                               "num_attention_heads", "num_layers", "prompt_tuning_init", "prompt_tuning_init_text",
                               "tokenizer_name_or_path", "tokenizer_kwargs"}
PREFIX_HONOURED = _METADATA | {"num_virtual_tokens", "token_dim", "num_transformer_submodules", "num_attention_heads",
                               "num_layers", "init_weights", "encoder_hidden_size",
                               "prefix_projection"}   # peft saves the projection's output
PROMPT_REFUSED = {"modules_to_save": None}


def _check_fields(adapter_config: dict, honoured: set[str], refused: dict, where: str) -> None:
    """Refuses, in one line naming it, a field t5lite does not honour that holds something."""
    for field, value in adapter_config.items():
        if field in honoured or value in (None, False, [], {}, refused.get(field)):
            continue
        if field in refused:
            raise HFConversionError(f"{where}: {field}={value!r} is not supported; t5lite imports peft adapters "
                                    f"with {field}={refused[field]!r}")
        raise HFConversionError(f"{where}: {field}={value!r} is a peft setting t5lite does not know; import an "
                                "adapter saved without it")


def _peft_pattern(pattern: dict, name: str, default):
    """peft's get_pattern_key: the value of the first key whose regex matches the end of the module's name."""
    return next((v for k, v in (pattern or {}).items() if re.match(rf"(.*\.)?({k})$", name)), default)


def from_peft(rules: list[Rule], adapter_config: dict, tensors: dict[str, np.ndarray],
              shapes: dict[str, tuple[int, ...]], where: str = "adapter",
              model_type: str = "") -> tuple[peft.Method, dict]:
    """(the method, the trained tree: {"params": {}, "lora": ...} for LoRA, {"params": {<stack>:
    {"prompt": ...}}} for prompt tuning, {"params": {}, "prefix": ...} for prefix tuning) of a peft
    adapter folder's contents. A LoRA keeps peft's per-module ranks and alphas (rank_pattern,
    alpha_pattern: t5lite patterns of the exact module paths), its B biases (lora_bias) and which
    modules it adapts (target_modules: t5lite's names when every module of those names has one,
    else a regex of the exact paths, as layers_to_transform or a regex target_modules give). A
    LoRA of a sequence classifier (`model_type` the base's) is a task-head model's: {"params":
    {"head": ..., maybe "backbone": {"pooler": ...}}, "lora": {"backbone": ...}} (_seq_cls_head)."""
    if adapter_config.get("peft_type") == "PROMPT_TUNING":
        _check_fields(adapter_config, PROMPT_HONOURED, PROMPT_REFUSED, where)
        return _prompt_from_peft(adapter_config, tensors, shapes, where)
    if adapter_config.get("peft_type") == "PREFIX_TUNING":
        _check_fields(adapter_config, PREFIX_HONOURED, PROMPT_REFUSED, where)
        return _prefix_from_peft(adapter_config, tensors, shapes, where)
    if adapter_config.get("peft_type") != "LORA":
        raise HFConversionError(f"{where}: peft_type {adapter_config.get('peft_type')!r}; t5lite imports LoRA, "
                                "prefix-tuning and prompt-tuning adapters")
    _check_fields(adapter_config, LORA_HONOURED, LORA_REFUSED, where)
    init = adapter_config.get("init_lora_weights", True)
    if isinstance(init, str) and init.lower().startswith(_BASE_REWRITING_INITS):
        raise HFConversionError(f"{where}: init_lora_weights={init!r} changes the base (or freezes B) when peft loads "
                                "the adapter; convert it to a plain LoRA with peft's save_pretrained(..., "
                                "path_initial_model_for_weight_conversion=...) and import that")
    r, alpha = _rank_and_alpha(adapter_config, where)
    head, saved = _seq_cls_head(rules, adapter_config, tensors, shapes, model_type, where)
    root = ("backbone",) if head else ()   # a task-head model's LoRA adapts its backbone
    modules = lora_modules(rules)
    lora, sites, rank_pattern, alpha_pattern = {}, [], [], []
    names = sorted({k[len(PREFIX):].rsplit(".lora_", 1)[0] for k in tensors if ".lora_A." in k})
    for name in names:
        module = _module_of(name, modules)
        if module is None:
            raise HFConversionError(f"{where}: no t5lite parameter for the adapted module {name!r}")
        parent, dense_names, in_ndim = modules[module]
        kernel = shapes["/".join(parent + (dense_names[0], "kernel"))]
        n_out = len(kernel) - in_ndim
        a, b = _lora_pair(tensors, name, kernel, in_ndim, len(dense_names), where)
        rank = a.shape[0]
        if rank != int(_peft_pattern(adapter_config.get("rank_pattern"), name, r)):
            raise HFConversionError(f"{where}: {name}.lora_A has rank {rank}, but r and rank_pattern give it "
                                    f"{_peft_pattern(adapter_config.get('rank_pattern'), name, r)}; {RESAVE}")
        path = root + parent + ("+".join(dense_names),)
        if rank != r:
            rank_pattern.append((re.escape("/".join(path)), rank))
        module_alpha = float(_peft_pattern(adapter_config.get("alpha_pattern"), name, alpha))
        if module_alpha != alpha:
            alpha_pattern.append((re.escape("/".join(path)), module_alpha))
        lora[path + ("lora_a",)] = a.T.reshape(kernel[:-n_out] + (rank,))
        lora[path + ("lora_b",)] = b.T.reshape((rank, len(dense_names)) + kernel[-n_out:])
        if adapter_config.get("lora_bias"):
            if not all("/".join(parent + (n, "bias")) in shapes for n in dense_names):
                raise HFConversionError(f"{where}: lora_bias=True, but {name} has no bias in t5lite (T5 has none), so "
                                        "the LoRA bias has nowhere to merge (peft cannot merge it either)")
            bias = np.asarray(tensors[f"{PREFIX}{name}.lora_B.bias"], np.float32)
            lora[path + ("lora_bias",)] = bias.reshape((len(dense_names),) + kernel[-n_out:])
        sites.append((root + parent, dense_names))
    if not lora:
        raise HFConversionError(f"{where}: {ADAPTER_WEIGHTS} holds no lora_A / lora_B tensors; {RESAVE}")
    rooted_shapes = {"/".join(root + (k,)): v for k, v in shapes.items()}
    method = peft.LoRA(r=r, lora_alpha=alpha, use_rslora=bool(adapter_config.get("use_rslora", False)),
                       lora_dropout=float(adapter_config.get("lora_dropout") or 0.0),
                       init_lora_weights="gaussian" if init == "gaussian" else "kaiming",
                       target_modules=_targets(sites, rooted_shapes), rank_pattern=tuple(rank_pattern),
                       alpha_pattern=tuple(alpha_pattern), lora_bias=bool(adapter_config.get("lora_bias")),
                       **({"modules_to_save": saved} if head else {}))
    return method, {"params": head, "lora": unflatten_dict(lora)}


# transformers' *ForSequenceClassification whose head t5lite's task head is: dropout and a dense
# `classifier` on BERT's pooler (ClassificationObjective(pooling='pooler')). RoBERTa's, ELECTRA's
# and DeBERTa's add a dense and an activation of their own, GPT-2's `score` has no bias and reads
# the last token, T5's and BART's read the end-of-sequence token: none is that head.
SEQ_CLS_HEAD = "classifier"   # the module of transformers' BertForSequenceClassification a task head is
_POOLER_CLASSIFIER_TYPES = ("bert",)
POOLER = "pooler"   # BERT's pooler, t5lite's module name (peft's names it by the same suffix)


def _pooler_rules(rules: list[Rule]) -> list[Rule]:
    return [r for r in rules if r.ours[0].startswith(POOLER + "/")]


def _saved_modules(entries: list[str], tensors: dict[str, np.ndarray]) -> dict[str, str]:
    """{module: the modules_to_save entry naming it} of the modules whose tensors peft saved for
    `entries`: the outermost module whose name ends with an entry (peft's _set_trainable match)."""
    out = {}
    for key in tensors:
        if not key.startswith(PREFIX) or ".lora_" in key:
            continue
        parts = key[len(PREFIX):].split(".")[:-1]
        modules = (".".join(parts[:i]) for i in range(1, len(parts) + 1))
        found = next(((module, e) for module in modules for e in entries if module.endswith(e)), None)
        if found is not None:
            out[found[0]] = found[1]
    return out


def _seq_cls_head(rules: list[Rule], adapter_config: dict, tensors: dict[str, np.ndarray],
                  shapes: dict[str, tuple[int, ...]], model_type: str, where: str) -> tuple[dict, tuple[str, ...]]:
    """(the trained params of a LoRA's saved modules: {"head": {"classifier": ...}} and, when peft
    saved the pooler, {"backbone": {"pooler": ...}}; t5lite's modules_to_save for them), or ({}, ())
    for an adapter that saves none. Any other saved module is refused, naming it and why."""
    modules = _saved_modules(list(adapter_config.get("modules_to_save") or []), tensors)
    if not modules:
        return {}, ()
    pooler_rules = _pooler_rules(rules)
    pooler = pooler_rules[0].hf.rsplit(".", 2)[0] if pooler_rules else None   # "bert.pooler"
    for module, entry in sorted(modules.items()):
        if model_type not in _POOLER_CLASSIFIER_TYPES:
            why = (f"a {model_type or 'this'} model's sequence-classification head is not t5lite's task head (a "
                   "dense classifier on BERT's pooler)")
        elif module not in (SEQ_CLS_HEAD, pooler):
            why = "it is a part of the base, which a PEFT run keeps frozen (t5lite trains BERT's classifier and pooler)"
        else:
            continue
        raise HFConversionError(f"{where}: modules_to_save {entry!r} saves {module!r}, which t5lite cannot train "
                                f"beside a LoRA: {why}; save the adapter without it")
    if SEQ_CLS_HEAD not in modules:
        raise HFConversionError(f"{where}: modules_to_save saves BERT's pooler without the classifier that reads it; "
                                "save it with task_type='SEQ_CLS' (peft then saves the classifier too)")
    if pooler is None:
        raise HFConversionError(f"{where}: the adapter's classifier reads BERT's pooler, which the base has not; "
                                "convert the base saved with its pooler (BertModel, BertForSequenceClassification)")
    params = {("head",) + k: v for k, v in _classifier(tensors, shapes[f"{POOLER}/dense/kernel"][-1], where).items()}
    if pooler in modules:
        params.update(_module_params(pooler_rules, tensors, shapes, ("backbone",), where))
    return unflatten_dict(params), ("head", POOLER) if pooler in modules else ("head",)


def _classifier(tensors: dict[str, np.ndarray], width: int, where: str) -> dict[tuple, np.ndarray]:
    """t5lite's `classifier` (kernel [d, labels], bias [labels]) of peft's saved BERT classifier."""
    try:
        weight = np.asarray(tensors[f"{PREFIX}{SEQ_CLS_HEAD}.weight"], np.float32)
        bias = np.asarray(tensors[f"{PREFIX}{SEQ_CLS_HEAD}.bias"], np.float32)
    except KeyError as e:
        raise HFConversionError(f"{where}: {ADAPTER_WEIGHTS} has no {e.args[0]}; {RESAVE}") from None
    if weight.ndim != 2 or weight.shape[1] != width or bias.shape != weight.shape[:1]:
        raise HFConversionError(f"{where}: {SEQ_CLS_HEAD} has weight {weight.shape} and bias {bias.shape}, but the "
                                f"base's pooler gives {width} features (weight [labels, {width}], bias [labels]); "
                                "import the adapter onto the base it was trained on")
    return {(SEQ_CLS_HEAD, "kernel"): weight.T, (SEQ_CLS_HEAD, "bias"): bias}


def _module_params(rules: list[Rule], tensors: dict[str, np.ndarray], shapes: dict[str, tuple[int, ...]],
                   root: tuple[str, ...], where: str) -> dict[tuple, np.ndarray]:
    """The t5lite params (under `root`) of the saved tensors of `rules`' HF tensors, as the rules place them."""
    out = {}
    for rule in rules:
        want = rule.hf_shape([shapes[p] for p in rule.ours])
        tensor = tensors.get(PREFIX + rule.hf)
        if tensor is None or tuple(tensor.shape) != want:
            found = "has none" if tensor is None else f"is {tuple(tensor.shape)}"
            raise HFConversionError(f"{where}: {ADAPTER_WEIGHTS}'s {PREFIX}{rule.hf} {found}, the base's is {want}; "
                                    "import the adapter onto the base it was trained on")
        for p, value in zip(rule.ours, rule.from_hf(np.asarray(tensor, np.float32), [shapes[p] for p in rule.ours])):
            out[root + tuple(p.split("/"))] = value
    return out


def _rank_and_alpha(adapter_config: dict, where: str) -> tuple[int, float]:
    """adapter_config.json's r and lora_alpha, refused unless they are what peft's LoraConfig holds."""
    r, alpha = adapter_config.get("r"), adapter_config.get("lora_alpha")
    if isinstance(r, bool) or not isinstance(r, int) or r < 1 or isinstance(alpha, bool) or \
            not isinstance(alpha, (int, float)):
        raise HFConversionError(f"{where}: {ADAPTER_CONFIG} has r={r!r}, lora_alpha={alpha!r}; peft's are a whole "
                                f"number of at least 1 and a number; {RESAVE}")
    return r, float(alpha)


def _lora_pair(tensors: dict, name: str, kernel: tuple[int, ...], in_ndim: int, n_dense: int,
               where: str) -> tuple[np.ndarray, np.ndarray]:
    """`name`'s lora_A [r, in] and lora_B [out, r], refused unless both are there, of one rank, and
    as wide as the base's projection (`n_dense` kernels of shape `kernel`, fused as GPT-2's c_attn)."""
    try:
        a = np.asarray(tensors[f"{PREFIX}{name}.lora_A.weight"], np.float32)
        b = np.asarray(tensors[f"{PREFIX}{name}.lora_B.weight"], np.float32)
    except KeyError as e:
        raise HFConversionError(f"{where}: {ADAPTER_WEIGHTS} has no {e.args[0]}; {RESAVE}") from None
    fan_in, fan_out = int(np.prod(kernel[:in_ndim])), n_dense * int(np.prod(kernel[in_ndim:]))
    if a.ndim != 2 or a.shape[1] != fan_in or b.shape != (fan_out, a.shape[0]):
        raise HFConversionError(f"{where}: {name} has lora_A {a.shape} and lora_B {b.shape}, but the base's "
                                f"projection takes {fan_in} and gives {fan_out} (lora_A [r, {fan_in}], lora_B "
                                f"[{fan_out}, r]); import the adapter onto the base it was trained on")
    return a, b


def _targets(sites: list[tuple[tuple[str, ...], tuple[str, ...]]], shapes: dict) -> tuple | str:
    """The t5lite target_modules adapting exactly `sites`: Dense names, when every module holding
    them is adapted; else a regex of the exact module paths."""
    names = tuple(sorted({g if len(g) > 1 else g[0] for _, g in sites}, key=str))
    kernels = {tuple(k.split("/")) for k in shapes if k.endswith("/kernel")}
    parents = {p[:-2] for p in kernels}
    every = {(parent, g if isinstance(g, tuple) else (g,)) for g in names for parent in parents
             if all(parent + (n, "kernel") in kernels for n in (g if isinstance(g, tuple) else (g,)))}
    if every == set(sites):
        return names
    return "|".join(re.escape("/".join(parent + ("+".join(g),))) for parent, g in sorted(sites))


_PROMPT_TASKS = {"encoder_decoder": "SEQ_2_SEQ_LM", "decoder": "CAUSAL_LM", "encoder": "FEATURE_EXTRACTION"}


def _prompt_from_peft(adapter_config: dict, tensors: dict[str, np.ndarray], shapes: dict[str, tuple[int, ...]],
                      where: str) -> tuple[peft.PromptTuning, dict]:
    submodules = adapter_config.get("num_transformer_submodules") or 1
    if submodules != 1:
        raise HFConversionError(f"{where}: num_transformer_submodules={submodules} also prompts the decoder; t5lite "
                                "prompts the encoder input only (train peft with num_transformer_submodules=1)")
    if "prompt_embeddings" not in tensors:
        raise HFConversionError(f"{where}: {ADAPTER_WEIGHTS} holds no prompt_embeddings; {RESAVE}")
    prompt = np.asarray(tensors["prompt_embeddings"], np.float32)
    stack = "encoder" if any(k.startswith("encoder/") for k in shapes) else "decoder"
    if prompt.shape[1] != shapes["token_embedder/embedding"][1]:
        raise HFConversionError(f"{where}: prompt_embeddings {prompt.shape}, but the model's embeddings are "
                                f"{shapes['token_embedder/embedding'][1]} wide")
    return peft.PromptTuning(num_virtual_tokens=prompt.shape[0]), {"params": {stack: {"prompt": prompt}}}


def _prompt_to_peft(config: ModelConfig, method: peft.PromptTuning, trained: dict,
                    base_model_name_or_path: str) -> tuple[dict, dict[str, np.ndarray]]:
    flat = flatten_dict(trained["params"])
    if set(flat) != {(method.stack(config), "prompt")}:
        raise HFConversionError("a prompt-tuning run that also trains base parameters (a task head: "
                                "modules_to_save) has no peft adapter equivalent in t5lite yet")
    prompt = np.ascontiguousarray(np.asarray(flat[(method.stack(config), "prompt")], np.float32))
    adapter_config = dict(peft_type="PROMPT_TUNING", task_type=_PROMPT_TASKS[config.arch],
                          num_virtual_tokens=method.num_virtual_tokens, token_dim=prompt.shape[1],
                          num_transformer_submodules=1, prompt_tuning_init="RANDOM", inference_mode=True,
                          base_model_name_or_path=base_model_name_or_path)
    return adapter_config, {"prompt_embeddings": prompt}


def _layers_of(shapes: dict[str, tuple[int, ...]]) -> dict[str, int]:
    """Layers per stack of a looped model's param shapes."""
    return {stack: len({k.split("/")[1] for k in shapes if k.startswith(f"{stack}/layers_")})
            for stack in ("encoder", "decoder")}


def _prefix_from_peft(adapter_config: dict, tensors: dict[str, np.ndarray], shapes: dict[str, tuple[int, ...]],
                      where: str) -> tuple[peft.PrefixTuning, dict]:
    """peft saves the prefix encoder's output (`prompt_embeddings` [n, layers * 2 * d], any
    projection applied), which t5lite takes as the embedding of a PrefixTuning without projection."""
    if "prompt_embeddings" not in tensors:
        raise HFConversionError(f"{where}: {ADAPTER_WEIGHTS} holds no prompt_embeddings; {RESAVE}")
    layers = _layers_of(shapes)
    arch = "encoder_decoder" if all(layers.values()) else "decoder" if layers["decoder"] else "encoder"
    submodules = adapter_config.get("num_transformer_submodules") or 1
    if submodules != (2 if arch == "encoder_decoder" else 1):
        raise HFConversionError(f"{where}: num_transformer_submodules={submodules}, but peft gives a {arch} model "
                                f"{2 if arch == 'encoder_decoder' else 1}; was the adapter trained on another model?")
    rows = np.asarray(tensors["prompt_embeddings"], np.float32)
    stack = "decoder" if arch == "decoder" else "encoder"
    key = shapes[f"{stack}/layers_0/self_attention/key/kernel"]
    want = 2 * layers[stack] * key[-2] * key[-1]
    if rows.ndim != 2 or rows.shape[1] != want:
        raise HFConversionError(f"{where}: prompt_embeddings {rows.shape}, but the model's prefix rows are "
                                f"[num_virtual_tokens, {want}] (2 x {layers[stack]} layers x {key[-2]} heads x "
                                f"{key[-1]}); was the adapter trained on another model?")
    return peft.PrefixTuning(num_virtual_tokens=rows.shape[0]), {"params": {}, "prefix": {"embedding": rows}}


def _prefix_to_peft(config: ModelConfig, method: peft.PrefixTuning, trained: dict,
                    base_model_name_or_path: str) -> tuple[dict, dict[str, np.ndarray]]:
    """The prefix encoder's output as peft saves it; peft loads it without the projection
    (prefix_projection=False), as its own inference mode does."""
    if "prefix_encoder" in trained:
        raise HFConversionError("a prefix-tuning run with PrefixTuning.placement='li_liang' (encoder and "
                                "cross-attention prefixes) has no peft equivalent: peft prefixes the decoder's "
                                "self-attention only; evaluate and infer with the run itself")
    if trained.get("params"):
        raise HFConversionError("a prefix-tuning run that also trains base parameters (a task head: "
                                "modules_to_save) has no peft adapter equivalent in t5lite yet")
    rows = np.ascontiguousarray(np.asarray(peft.PrefixTuning.rows(trained["prefix"]), np.float32))
    adapter_config = dict(peft_type="PREFIX_TUNING", task_type=_PROMPT_TASKS[config.arch],
                          num_virtual_tokens=method.num_virtual_tokens, token_dim=config.num_heads * config.head_dim,
                          num_transformer_submodules=2 if config.arch == "encoder_decoder" else 1,
                          num_attention_heads=config.num_heads, num_layers=peft.PrefixTuning.num_rows(config) // 2,
                          encoder_hidden_size=config.num_heads * config.head_dim, prefix_projection=False,
                          inference_mode=True, base_model_name_or_path=base_model_name_or_path)
    return adapter_config, {"prompt_embeddings": rows}


def _sequence_classifier(rules: list[Rule], params: dict) -> tuple[list[str], dict[str, np.ndarray]]:
    """(modules_to_save, their tensors) of a t5lite classification head (a dense `classifier` on
    BERT's pooler) and the pooler when it trained, as peft saves a sequence-classification model's."""
    kernel = np.asarray(params["head"][SEQ_CLS_HEAD]["kernel"], np.float32)
    tensors = {f"{PREFIX}{SEQ_CLS_HEAD}.weight": np.ascontiguousarray(kernel.T),
               f"{PREFIX}{SEQ_CLS_HEAD}.bias": np.ascontiguousarray(np.asarray(params["head"][SEQ_CLS_HEAD]["bias"],
                                                                               np.float32))}
    trained = {"/".join(p): x for p, x in flatten_dict(params.get("backbone", {})).items()}
    pooler = _pooler_rules(rules)
    if not trained:
        return [SEQ_CLS_HEAD], tensors
    if set(trained) != {p for r in pooler for p in r.ours}:
        raise HFConversionError(f"the run trains {', '.join(sorted(trained))} of its base beside the LoRA; peft "
                                "saves a sequence classifier's classifier and pooler, so only those may train")
    tensors.update({PREFIX + r.hf: r.to_hf([trained[p] for p in r.ours]) for r in pooler})
    return [SEQ_CLS_HEAD, POOLER], tensors


def to_peft(config: ModelConfig, rules: list[Rule], method: peft.LoRA | peft.PromptTuning | peft.PrefixTuning,
            trained: dict, base_model_name_or_path: str = "",
            sequence_classifier: bool = False) -> tuple[dict, dict[str, np.ndarray]]:
    """(adapter_config.json's fields, adapter_model.safetensors' tensors) of a t5lite LoRA, prefix or
    prompt. `sequence_classifier`: the run trained a classification head on BERT's pooler (LoRA
    under "backbone", the head in params), saved as peft saves a SEQ_CLS model's: its classifier
    in modules_to_save."""
    if isinstance(method, peft.PromptTuning):
        return _prompt_to_peft(config, method, trained, base_model_name_or_path)
    if isinstance(method, peft.PrefixTuning):
        return _prefix_to_peft(config, method, trained, base_model_name_or_path)
    lora, head, saved = trained["lora"], {}, None
    if sequence_classifier:
        saved, head = _sequence_classifier(rules, trained["params"])
        lora = lora["backbone"]
    elif trained.get("params"):
        raise HFConversionError("a LoRA run that also trains base parameters (a task head: modules_to_save) has no "
                                "peft adapter equivalent in t5lite yet; merge it into a full checkpoint instead")
    by_place = {(parent, names): hf for hf, (parent, names, _) in lora_modules(rules).items()}
    tensors, names, rank_pattern, alpha_pattern = dict(head), [], {}, {}
    for path, ab in flatten_dict(lora, is_leaf=lambda _, x: "lora_a" in x).items():
        place = (path[:-1], tuple(path[-1].split("+")))
        if place not in by_place:
            raise HFConversionError(f"LoRA on {'/'.join(path)} has no Hugging Face module to adapt")
        a, b = np.asarray(ab["lora_a"], np.float32), np.asarray(ab["lora_b"], np.float32)
        r = a.shape[-1]
        hf = by_place[place]
        tensors[f"{PREFIX}{hf}.lora_A.weight"] = np.ascontiguousarray(a.reshape(-1, r).T)
        tensors[f"{PREFIX}{hf}.lora_B.weight"] = np.ascontiguousarray(b.reshape(r, -1).T)
        if "lora_bias" in ab:
            tensors[f"{PREFIX}{hf}.lora_B.bias"] = np.ascontiguousarray(np.asarray(ab["lora_bias"], np.float32).ravel())
        if r != method.r:   # peft's keys are regexes matching the end of the module's name
            rank_pattern[re.escape(hf)] = r
        if method.alpha_of(path) != method.lora_alpha:
            alpha_pattern[re.escape(hf)] = method.alpha_of(path)
        names.append(hf)
    adapter_config = dict(peft_type="LORA", r=method.r, lora_alpha=method.lora_alpha, lora_dropout=method.lora_dropout,
                          use_rslora=method.use_rslora, target_modules=sorted(names), bias="none",
                          rank_pattern=rank_pattern, alpha_pattern=alpha_pattern, lora_bias=method.lora_bias,
                          fan_in_fan_out=config.arch == "decoder", inference_mode=True,
                          base_model_name_or_path=base_model_name_or_path,
                          modules_to_save=saved, task_type="SEQ_CLS" if saved else None,
                          init_lora_weights=True)
    return adapter_config, tensors


def read(path: str) -> tuple[dict, dict[str, np.ndarray]]:
    """A peft adapter folder's config and tensors."""
    files.refuse_remote(path, "peft adapter folders")
    config_path = os.path.join(path, ADAPTER_CONFIG)
    if not os.path.isfile(config_path):
        raise HFConversionError(f"{path} is not a peft adapter folder: it has no {ADAPTER_CONFIG} (peft's "
                                "save_pretrained writes it with adapter_model.safetensors)")
    return _read_json(config_path), _read_safetensors(os.path.join(path, ADAPTER_WEIGHTS))


def write(out_dir: str, adapter_config: dict, tensors: dict[str, np.ndarray]) -> str:
    """adapter_config.json + adapter_model.safetensors, as `peft.PeftModel.from_pretrained` reads them."""
    return files.write(out_dir, adapter_config, tensors, ADAPTER_CONFIG, ADAPTER_WEIGHTS)
