"""Parameter-efficient fine-tuning: which parameters train, and how they combine with a frozen base.

A method (`LoRA`, `BitFit`, `PromptTuning`, `PrefixTuning`, `Adapters`) is a value with two functions over plain
(unboxed) param trees:

    trained, trained_specs = method.init(rng, params, specs, config)   # the pytree that trains
    params = method.combine(frozen, trained)                           # what module.apply takes

The trained pytree is `{"params": <the base params that train, same paths>, "lora": ...}`; every
leaf keeps logical axis names (`trained_specs`), so it shards like the rest. The frozen base never
enters the optimizer, so it has no optimizer state and no gradient. Base params train when their
path holds a name of `modules_to_save` (peft's name; a task head, `WithHead`'s "head", trains by
default) or, for BitFit, when they are biases.

LoRA (Hu et al. 2021, as Hugging Face peft defines it): a target kernel W [*in, *out] is used as
W + s * A @ B with A [*in, r] (peft's lora_A.weight transposed) and B [r, n, *out] (lora_B.weight
transposed; n > 1 when one A feeds several projections, as GPT-2's fused c_attn feeds query, key
and value). s = lora_alpha / r, or lora_alpha / sqrt(r) with `use_rslora`. Training runs it
unmerged, as peft does (`for_training`: W x + s B A dropout(x), added to each target Dense by a
method interceptor, so the model code does not change and scanned and shared layers work as they
are); evaluation, inference and export use the merged weights (`combine`), which cost nothing extra.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import re
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.traverse_util import flatten_dict, unflatten_dict
from jax.sharding import PartitionSpec as P

from t5lite.errors import ConfigError
from t5lite.models.config import ModelConfig
from t5lite.models.layers import Dense

Target = str | tuple[str, ...]
_HEADS_OUT = ("heads", "kv")   # a kernel whose outputs are per-head: attention's query, key, value


def default_targets(config: ModelConfig) -> tuple[Target, ...]:
    """peft's per-family defaults in t5lite names: T5 q, v / BART q_proj, v_proj / BERT, RoBERTa,
    ELECTRA query, value are every attention's `query` and `value`; GPT-2's c_attn is one LoRA over
    query, key and value together. ALBERT has none in peft: name the targets."""
    if config.share_layers:
        raise ConfigError("LoRA on ALBERT has no default targets (peft has none either); set "
                          "LoRA.target_modules, e.g. ['query', 'value']")
    if config.arch == "decoder":
        return (("query", "key", "value"),)
    return ("query", "value")


def trainable_paths(flat_params: dict, modules_to_save: Sequence[str], also=lambda path: False) -> list[tuple]:
    """Paths of the base params that train: under a module named in `modules_to_save`, or `also`."""
    return [p for p in flat_params if set(p[:-1]) & set(modules_to_save) or also(p)]


def _subtree(flat: dict, paths) -> dict:
    return unflatten_dict({p: flat[p] for p in paths}) if paths else {}


@dataclasses.dataclass(frozen=True)
class Method:
    """What LoRA and BitFit share: the base params under `modules_to_save` train."""
    modules_to_save: tuple[str, ...] = ("head",)
    packs = True    # whether it trains on packed examples (class attributes, not fields)
    merges = True   # whether `combine` gives params of the base model alone (a full checkpoint)

    def _trained_base_paths(self, flat_params: dict) -> list[tuple]:
        return trainable_paths(flat_params, self.modules_to_save)

    def init(self, rng, params, specs, config: ModelConfig) -> tuple[dict, dict]:
        flat, flat_specs = flatten_dict(params), flatten_dict(specs)
        paths = self._trained_base_paths(flat)
        trained = {"params": _subtree(flat, paths)}
        trained_specs = {"params": _subtree(flat_specs, paths)}
        return trained, trained_specs

    def combine(self, frozen, trained) -> dict:
        """The model's params: the frozen base with the trained base params in their places."""
        flat = flatten_dict(frozen)
        flat.update(flatten_dict(trained.get("params", {})))
        return unflatten_dict(flat)

    def for_training(self, frozen, trained):
        """(params, a context to apply the module in) for the train step."""
        return self.combine(frozen, trained), contextlib.nullcontext()


@dataclasses.dataclass(frozen=True)
class BitFit(Method):
    """BitFit (Ben Zaken et al. 2022): only the bias terms train — every dense, LayerNorm and
    output bias — plus `modules_to_save`. T5 has no biases at all (dense layers without bias,
    RMSNorm without shift), so BitFit on T5 trains only a task head, and is refused without one."""

    def _trained_base_paths(self, flat_params: dict) -> list[tuple]:
        paths = trainable_paths(flat_params, self.modules_to_save, lambda p: p[-1].endswith("bias"))
        if not any(p[-1].endswith("bias") for p in paths):
            raise ConfigError("BitFit: this model has no bias parameters (T5 has none: no dense biases, RMSNorm "
                              "without shift), so nothing but a task head would train; use LoRA instead")
        return paths


@dataclasses.dataclass(frozen=True)
class LoRA(Method):
    """LoRA with peft's defaults: r 8, lora_alpha 8, no dropout (`lora_dropout` drops the LoRA
    input in training), A Kaiming-uniform (a = sqrt(5), i.e. U(+-1/sqrt(fan_in))) or N(0, 1/r)
    (`init_lora_weights="gaussian"`), B zeros. A's and B's own axes are named `lora_rank` and
    `lora_group` (the fused projections).

    `target_modules`, as peft's: a tuple of t5lite Dense names (`query`, `key`, `value`, `out`,
    `wi`, `wo`, `wi_0`, `wi_1`, or any other Dense's name) matched wherever a module holds them
    (self- and cross-attention alike, as peft matches by name suffix), a tuple of names being one
    LoRA whose A is shared and whose B covers all of them (GPT-2's c_attn); or a str, a regex that
    must match a module's whole path, e.g. "decoder/layers_[01]/self_attention/(query|value)"
    (GPT-2's fused group is the path ".../self_attention/query+key+value"). None: peft's default
    for the family (`default_targets`).

    `rank_pattern` and `alpha_pattern`, peft's: (regex, rank or alpha) pairs; the first whose
    regex matches the end of a LoRA's path (peft's get_pattern_key, `(.*/)?(regex)` in full, with
    t5lite's "/" for peft's ".") gives that module its own rank or alpha, so its scale is
    alpha / r (alpha / sqrt(r) with `use_rslora`) of its own. `lora_bias` (peft's) gives B a bias,
    added as s * bias to the target's own bias (a target without a bias, as T5's, is refused:
    peft cannot merge it either)."""
    r: int = 8
    lora_alpha: float = 8.0
    lora_dropout: float = 0.0
    use_rslora: bool = False
    init_lora_weights: str = "kaiming"
    target_modules: tuple[Target, ...] | str | None = None
    rank_pattern: tuple[tuple[str, int], ...] = ()
    alpha_pattern: tuple[tuple[str, float], ...] = ()
    lora_bias: bool = False

    def __post_init__(self):
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ConfigError(f"LoRA.lora_dropout={self.lora_dropout}: expected a rate in [0, 1)")
        if self.init_lora_weights not in ("kaiming", "gaussian"):
            raise ConfigError(f"LoRA.init_lora_weights={self.init_lora_weights!r}: expected 'kaiming' or 'gaussian'")
        if self.r < 1 or any(r < 1 for _, r in self.rank_pattern):
            raise ConfigError(f"LoRA.r={self.r}, rank_pattern={self.rank_pattern}: every rank must be at least 1")
        for name in ("rank_pattern", "alpha_pattern") + (("target_modules",) if isinstance(self.target_modules, str)
                                                          else ()):
            for pattern in [self.target_modules] if name == "target_modules" else [p for p, _ in getattr(self, name)]:
                try:
                    re.compile(pattern)
                except re.error as e:
                    raise ConfigError(f"LoRA.{name}: {pattern!r} is not a regex ({e})") from None

    @property
    def scale(self) -> float:
        """The scale of a module without a pattern of its own."""
        return self.scale_of(self.r, self.lora_alpha)

    def scale_of(self, r: int, alpha: float) -> float:
        return alpha / (math.sqrt(r) if self.use_rslora else r)

    @staticmethod
    def _pattern(pairs, path: tuple[str, ...], default):
        """peft's get_pattern_key on a t5lite path: the value of the first regex matching its end."""
        name = "/".join(path)
        return next((v for p, v in pairs if re.fullmatch(rf"(.*/)?({p})", name)), default)

    def rank_of(self, path: tuple[str, ...]) -> int:
        return int(self._pattern(self.rank_pattern, path, self.r))

    def alpha_of(self, path: tuple[str, ...]) -> float:
        return float(self._pattern(self.alpha_pattern, path, self.lora_alpha))

    def targets(self, config: ModelConfig) -> tuple[tuple[str, ...], ...]:
        targets = default_targets(config) if self.target_modules is None else self.target_modules
        return tuple((t,) if isinstance(t, str) else tuple(t) for t in targets)

    def sites(self, kernel_paths, config: ModelConfig) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
        """(module path, Dense names) of each LoRA, given the paths of the base's kernels."""
        kernels = set(kernel_paths)
        parents = sorted({p[:-2] for p in kernels})
        if not isinstance(self.target_modules, str):
            return [(parent, group) for group in self.targets(config) for parent in parents
                    if all(parent + (n, "kernel") in kernels for n in group)]
        fused = [g for g in (() if config.share_layers else default_targets(config)) if not isinstance(g, str)]
        out = []
        for parent in parents:
            groups = [(p[-2],) for p in sorted(kernels) if p[:-2] == parent] + \
                [g for g in fused if all(parent + (n, "kernel") in kernels for n in g)]
            out += [(parent, g) for g in groups if re.fullmatch(self.target_modules, "/".join(parent + ("+".join(g),)))]
        return out

    def init(self, rng, params, specs, config: ModelConfig) -> tuple[dict, dict]:
        trained, trained_specs = super().init(rng, params, specs, config)
        flat, flat_specs = flatten_dict(params), flatten_dict(specs)
        saved = set(self.modules_to_save)
        kernel_paths = [p for p in flat if p[-1] == "kernel" and not set(p[:-2]) & saved]
        lora, lora_specs = {}, {}
        for parent, group in self.sites(kernel_paths, config):
            kernels = [flat[parent + (n, "kernel")] for n in group]
            axes = tuple(flat_specs[parent + (group[0], "kernel")])
            if len({k.shape for k in kernels}) != 1:
                raise ConfigError(f"LoRA target {'+'.join(group)} in {'/'.join(parent)}: one LoRA over several "
                                  "projections needs kernels of one shape")
            if self.lora_bias and not all(parent + (n, "bias") in flat for n in group):
                raise ConfigError(f"LoRA.lora_bias=True: {'/'.join(parent + (group[0],))} has no bias to add it to "
                                  "(T5 has none); set lora_bias=False")
            rng, key = jax.random.split(rng)
            lead = 1 if axes[0] == "layers" else 0
            n_out = len(_HEADS_OUT) if axes[-2:] == _HEADS_OUT else 1
            shape = kernels[0].shape
            path = parent + ("+".join(group),)
            r = self.rank_of(path)
            a_shape, b_shape = shape[:-n_out] + (r,), shape[:lead] + (r, len(group)) + shape[-n_out:]
            lora[path + ("lora_a",)] = self._init_a(key, a_shape, math.prod(shape[lead:-n_out]), r)
            lora[path + ("lora_b",)] = jnp.zeros(b_shape, jnp.float32)
            lora_specs[path + ("lora_a",)] = P(*axes[:-n_out], "lora_rank")
            lora_specs[path + ("lora_b",)] = P(*axes[:lead], "lora_rank", "lora_group", *axes[-n_out:])
            if self.lora_bias:   # peft: zeros, as B
                lora[path + ("lora_bias",)] = jnp.zeros(shape[:lead] + (len(group),) + shape[-n_out:], jnp.float32)
                lora_specs[path + ("lora_bias",)] = P(*axes[:lead], "lora_group", *axes[-n_out:])
        if not lora:
            raise ConfigError(f"LoRA.target_modules={self.target_modules}: no module of this model has them; "
                              "t5lite names its projections query, key, value, out, wi, wo (wi_0, wi_1 gated)")
        trained["lora"], trained_specs["lora"] = unflatten_dict(lora), unflatten_dict(lora_specs)
        return trained, trained_specs

    def _init_a(self, key, shape, fan_in: int, r: int):
        if self.init_lora_weights == "gaussian":
            return jax.random.normal(key, shape, jnp.float32) / r
        bound = 1.0 / math.sqrt(fan_in)   # kaiming_uniform_(a=sqrt(5)) on lora_A [r, fan_in]
        return jax.random.uniform(key, shape, jnp.float32, -bound, bound)

    def factors(self, flat_params: dict, lora):
        """(kernel path, number of leading layer axes, A [*in, r], s * B [r, *out], s * bias [*out]
        or None) per target kernel; a fused group's members share A and take their slice of B."""
        for path, ab in flatten_dict(lora, is_leaf=lambda _, x: "lora_a" in x).items():
            a, b = ab["lora_a"], ab["lora_b"]
            s = self.scale_of(a.shape[-1], self.alpha_of(path))
            for j, name in enumerate(path[-1].split("+")):
                kernel_path = path[:-1] + (name, "kernel")
                lead = a.ndim - 1 + b.ndim - 2 - flat_params[kernel_path].ndim
                bias = s * jnp.take(ab["lora_bias"], j, axis=lead) if "lora_bias" in ab else None
                yield kernel_path, lead, a, s * jnp.take(b, j, axis=lead + 1), bias

    def deltas(self, flat_params: dict, lora) -> dict:
        """{param path: s * A @ B for every LoRA target kernel, shaped as the kernel; s * bias for its bias}."""
        out = {}
        for kernel_path, lead, a, b, bias in self.factors(flat_params, lora):
            a2 = a.reshape(a.shape[:lead] + (-1, a.shape[-1]))
            b2 = b.reshape(b.shape[:lead + 1] + (-1,))
            out[kernel_path] = jnp.matmul(a2, b2).reshape(flat_params[kernel_path].shape)
            if bias is not None:
                out[kernel_path[:-1] + ("bias",)] = bias
        return out

    def for_training(self, frozen, trained):
        """Unmerged, as peft trains: the base kernels stay as they are and each target Dense gets
        `lora_a` and `lora_b` (scaled, and `lora_bias`) beside its kernel, which `lora_interceptor`
        adds as s * (B A dropout(x) + bias); no full-size update is formed. Returns (params, the
        interceptor)."""
        flat = flatten_dict(Method.combine(self, frozen, trained))
        for kernel_path, _, a, b, bias in self.factors(flat, trained["lora"]):
            flat[kernel_path[:-1] + ("lora_a",)] = a
            flat[kernel_path[:-1] + ("lora_b",)] = b
            if bias is not None:
                flat[kernel_path[:-1] + ("lora_bias",)] = bias
        return unflatten_dict(flat), nn.intercept_methods(lora_interceptor(self.lora_dropout))

    def combine(self, frozen, trained) -> dict:
        """The params with each target kernel W replaced by W + s * A @ B (the merged weights; the
        bias + s * lora_bias)."""
        flat = flatten_dict(super().combine(frozen, trained))
        for path, delta in self.deltas(flat, trained["lora"]).items():
            flat[path] = flat[path] + delta.astype(flat[path].dtype)
        return unflatten_dict(flat)

    def unmerge(self, merged, trained) -> dict:
        """The base params back from merged ones: W = merged - s * A @ B."""
        flat = flatten_dict(merged)
        for path, delta in self.deltas(flat, trained["lora"]).items():
            flat[path] = flat[path] - delta.astype(flat[path].dtype)
        return unflatten_dict(flat)


_PROMPT_INITS = ("random", "sample_vocab", "sample_vocab_5000", "text")


@dataclasses.dataclass(frozen=True)
class PromptTuning(Method):
    """Prompt tuning (Lester et al. 2021, as peft's PromptTuningConfig): `num_virtual_tokens`
    trained vectors (`prompt`, [n, embed]) stand in front of the input's token embeddings — the
    encoder's input (T5, BART: Lester's setting; peft's seq2seq default also prompts the decoder,
    `num_transformer_submodules=2`, which t5lite does not), a decoder-only model's input, an encoder's
    input. They sit in the token embedder's output space, so positions, token types, embedding
    norm and dropout apply to them as to a token; every token attends to them, and the model's
    outputs cover the input tokens only (a classifier pools [CLS], where peft's pools the first
    virtual token). A decoder-only model scores with its prompt but does not KV-cache decode.

    `prompt_tuning_init`: "random" N(0, 1) (peft's RANDOM, torch.nn.Embedding's init);
    "sample_vocab" rows of the token embedding table drawn uniformly over the whole vocabulary
    (peft's SAMPLE_VOCAB); "sample_vocab_5000" drawn from the first 5000 rows (Lester et al.'s
    code: the most frequent SentencePiece pieces); "text" the embeddings of `init_token_ids`, cut
    or repeated to length (peft's TEXT; encode the text with the task's vocabulary)."""
    num_virtual_tokens: int = 20
    prompt_tuning_init: str = "random"
    init_token_ids: tuple[int, ...] = ()
    modules_to_save: tuple[str, ...] = ("head",)
    packs = False    # an encoder's prompt states depend on their example: each row holds one
    merges = False   # `combine` adds the prompt beside the base params (params/<stack>/prompt)

    def __post_init__(self):
        if self.num_virtual_tokens < 1:
            raise ConfigError(f"PromptTuning.num_virtual_tokens={self.num_virtual_tokens}: expected at least 1")
        if self.prompt_tuning_init not in _PROMPT_INITS:
            raise ConfigError(f"PromptTuning.prompt_tuning_init={self.prompt_tuning_init!r}: expected one of "
                              f"{', '.join(_PROMPT_INITS)}")
        if (self.prompt_tuning_init == "text") != bool(self.init_token_ids):
            raise ConfigError("PromptTuning: prompt_tuning_init='text' takes init_token_ids (the text's token ids) "
                              "and the other inits take none; set both or neither")

    @staticmethod
    def stack(config: ModelConfig) -> str:
        """The stack whose input takes the prompt."""
        if config.share_encoder_decoder:
            raise ConfigError("PromptTuning on a shared encoder-decoder (share_encoder_decoder=True) is not "
                              "supported: the encoder has no params of its own to hold the prompt")
        return "decoder" if config.arch == "decoder" else "encoder"

    def init(self, rng, params, specs, config: ModelConfig) -> tuple[dict, dict]:
        trained, trained_specs = super().init(rng, params, specs, config)
        flat = flatten_dict(params)
        at = next(p[:-2] for p in flat if p[-2:] == ("token_embedder", "embedding"))   # "backbone" under a head
        table = flat[at + ("token_embedder", "embedding")]
        n = self.num_virtual_tokens
        if self.prompt_tuning_init == "random":
            prompt = jax.random.normal(rng, (n, table.shape[1]), jnp.float32)
        else:
            if self.prompt_tuning_init == "text":
                ids = jnp.resize(jnp.asarray(self.init_token_ids, jnp.int32), (n,))   # cut or repeated
            else:
                high = table.shape[0] if self.prompt_tuning_init == "sample_vocab" else min(5000, table.shape[0])
                ids = jax.random.randint(rng, (n,), 0, high)
            prompt = jnp.take(table, ids, axis=0).astype(jnp.float32)
        path = at + (self.stack(config), "prompt")
        trained["params"] = unflatten_dict({**flatten_dict(trained["params"]), path: prompt})
        trained_specs["params"] = unflatten_dict({**flatten_dict(trained_specs["params"]),
                                                  path: P("prompt_tokens", "embed")})
        return trained, trained_specs


@dataclasses.dataclass(frozen=True)
class PrefixTuning(Method):
    """Prefix tuning (Li and Liang 2021, as peft's PrefixTuningConfig): per layer, `num_virtual_tokens`
    trained keys and values stand in front of an attention's own (params `.../prefix_key`,
    `.../prefix_value` [n, heads, head_dim], put there by `combine`), and every token attends to
    them. The trained tree's `prefix` is peft's prefix encoder: `embedding` [n, layers * 2 * d], or
    with `prefix_projection` `embedding` [n, d_model] -> `transform_0` (d_model -> `encoder_hidden_size`,
    default d_model) -> tanh -> `transform_2` (-> layers * 2 * d), the reparameterisation of Li and
    Liang; d = heads * head_dim. As in Hugging Face's cache, the prefix takes positions 0..n-1 and
    the tokens' positions are shifted by n.

    Which attentions get it is peft's choice: a decoder-only model's self-attentions (layer i the
    rows 2i, 2i + 1); of an encoder-decoder (T5, BART) only the decoder's self-attentions, layer i
    the rows 4i, 4i + 1 modulo 2 * layers (peft duplicates the rows for the cross-attentions, then
    gives the cross-attentions no prefix, and the encoder none). An encoder-only model's
    self-attentions, layer i the rows 2i, 2i + 1, as are an encoder-decoder's encoder's when the
    params hold the encoder only (a T5 backbone under a classification head).

    `placement="li_liang"` is Li and Liang's own encoder-decoder layout (their code,
    XiangLi1999/PrefixTuning seq2seq/prefixTuning.py, PrefixTuning.get_prompt_p5): three prefix
    encoders of the same kind, one per attention kind — `prefix` for the decoder's self-attentions,
    `prefix_cross` for its cross-attentions, `prefix_encoder` for the encoder's self-attentions —
    each giving its stack's layer i the rows 2i, 2i + 1 (each layer its own prefix). peft cannot
    hold it. On other models it is the "peft" placement."""
    num_virtual_tokens: int = 20
    prefix_projection: bool = False
    encoder_hidden_size: int | None = None
    placement: str = "peft"
    modules_to_save: tuple[str, ...] = ("head",)
    merges = False   # `combine` adds the prefixes beside the base params

    def __post_init__(self):
        if self.placement not in ("peft", "li_liang"):
            raise ConfigError(f"PrefixTuning.placement={self.placement!r}: expected 'peft' (decoder self-attention "
                              "of an encoder-decoder, as Hugging Face peft) or 'li_liang' (encoder, decoder and "
                              "cross-attention)")
        if self.num_virtual_tokens < 1:
            raise ConfigError(f"PrefixTuning.num_virtual_tokens={self.num_virtual_tokens}: expected at least 1")
        if self.encoder_hidden_size is not None and self.encoder_hidden_size < 1:
            raise ConfigError(f"PrefixTuning.encoder_hidden_size={self.encoder_hidden_size}: expected at least 1")

    @staticmethod
    def sites(arch: str, encoder_layers: int, decoder_layers: int) -> list[tuple[str, int, int]]:
        """(stack, layer, the key's row among the prefix rows; the value's is the next) of each
        prefixed self-attention. peft's num_layers is an encoder-decoder's encoder layers."""
        if arch != "encoder_decoder":
            return [(arch, i, 2 * i) for i in range(decoder_layers if arch == "decoder" else encoder_layers)]
        if decoder_layers > encoder_layers:
            raise ConfigError(f"PrefixTuning on an encoder-decoder gives the decoder peft's prefixes for "
                              f"{encoder_layers} layers (the encoder's), but the decoder has {decoder_layers}")
        return [("decoder", i, 4 * i % (2 * encoder_layers)) for i in range(decoder_layers)]

    @classmethod
    def num_rows(cls, config: ModelConfig) -> int:
        """peft's num_layers * 2: the prefix rows (each heads * head_dim wide)."""
        cls._refuse_shared(config)
        cls.sites(config.arch, config.num_encoder_layers, config.num_decoder_layers)   # refuses what peft cannot
        return 2 * (config.num_decoder_layers if config.arch == "decoder" else config.num_encoder_layers)

    @staticmethod
    def _refuse_shared(config: ModelConfig) -> None:
        if config.share_layers:
            raise ConfigError("PrefixTuning needs a prefix per layer; ALBERT shares one layer (share_layers=True)")
        if config.share_encoder_decoder:
            raise ConfigError("PrefixTuning needs a prefix per layer and stack; a shared encoder-decoder "
                              "(share_encoder_decoder=True) has one set of layers")

    def init(self, rng, params, specs, config: ModelConfig) -> tuple[dict, dict]:
        """peft's init: torch.nn.Embedding's N(0, 1), torch.nn.Linear's U(+-1/sqrt(fan_in)) for weights and biases."""
        trained, trained_specs = super().init(rng, params, specs, config)
        per_row = config.num_heads * config.head_dim
        layers = _stack_layers(flatten_dict(params))[1]
        if self._li_liang(layers):
            self._refuse_shared(config)
            encoders = self._encoders(layers)
        else:
            encoders = [("prefix", "", "", self.num_rows(config))]
        for i, (name, _, _, rows) in enumerate(encoders):
            trained[name], trained_specs[name] = self._prefix_encoder(jax.random.fold_in(rng, i) if i else rng,
                                                                      rows * per_row, config)
        return trained, trained_specs

    @staticmethod
    def _encoders(layers: dict[str, int]) -> list[tuple[str, str, str, int]]:
        """(trained name, stack, sublayer, rows) of Li and Liang's three prefix encoders (get_prompt_p5's
        control_trans, control_trans2, control_trans_enc)."""
        return [("prefix", "decoder", "self_attention", 2 * layers["decoder"]),
                ("prefix_cross", "decoder", "cross_attention", 2 * layers["decoder"]),
                ("prefix_encoder", "encoder", "self_attention", 2 * layers["encoder"])]

    def _li_liang(self, layers: dict[str, int]) -> bool:
        """Whether the encoder and cross-attentions get prefixes too: Li and Liang's placement on an encoder-decoder."""
        return self.placement == "li_liang" and all(layers.values())

    def _prefix_encoder(self, rng, width: int, config: ModelConfig) -> tuple[dict, dict]:
        """(params, logical specs) of one prefix encoder giving [n, width] rows: an embedding, or
        with `prefix_projection` an embedding and peft's two-layer tanh MLP."""
        keys = jax.random.split(rng, 5)
        n = self.num_virtual_tokens
        if not self.prefix_projection:
            return ({"embedding": jax.random.normal(keys[0], (n, width), jnp.float32)},
                    {"embedding": P("prompt_tokens", "joined_kv")})
        d, hidden = config.d_model, self.encoder_hidden_size or config.d_model
        linear = lambda k1, k2, n_in, n_out: {
            "kernel": jax.random.uniform(k1, (n_in, n_out), jnp.float32, -n_in ** -0.5, n_in ** -0.5),
            "bias": jax.random.uniform(k2, (n_out,), jnp.float32, -n_in ** -0.5, n_in ** -0.5)}
        return ({"embedding": jax.random.normal(keys[0], (n, d), jnp.float32),
                 "transform_0": linear(keys[1], keys[2], d, hidden),
                 "transform_2": linear(keys[3], keys[4], hidden, width)},
                {"embedding": P("prompt_tokens", "embed"),
                 "transform_0": {"kernel": P("embed", "mlp"), "bias": P("mlp")},
                 "transform_2": {"kernel": P("mlp", "joined_kv"), "bias": P("joined_kv")}})

    @staticmethod
    def rows(prefix: dict):
        """The prefix encoder's output [n, layers * 2 * d]: what peft saves as `prompt_embeddings`."""
        if "transform_0" not in prefix:
            return prefix["embedding"]
        hidden = jnp.tanh(prefix["embedding"] @ prefix["transform_0"]["kernel"] + prefix["transform_0"]["bias"])
        return hidden @ prefix["transform_2"]["kernel"] + prefix["transform_2"]["bias"]

    def combine(self, frozen, trained) -> dict:
        """The base params (with any trained head) plus `prefix_key` and `prefix_value` in each
        prefixed attention (stacked on the layers axis when the layers are scanned)."""
        flat = flatten_dict(super().combine(frozen, trained))
        at, layers = _stack_layers(flat)
        arch = "encoder_decoder" if all(layers.values()) else "decoder" if layers["decoder"] else "encoder"
        if self._li_liang(layers):
            for name, stack, sublayer, _ in self._encoders(layers):
                _put_prefixes(flat, at + (stack,), sublayer, self.rows(trained[name]),
                              [(layer, 2 * layer) for layer in range(layers[stack])])
            return unflatten_dict(flat)
        rows = self.rows(trained["prefix"])
        for stack in layers:
            sites = [(layer, row) for s, layer, row in self.sites(arch, layers["encoder"], layers["decoder"])
                     if s == stack]
            if sites:
                _put_prefixes(flat, at + (stack,), "self_attention", rows, sites)
        return unflatten_dict(flat)


def _stack_layers(flat: dict) -> tuple[tuple, dict[str, int]]:
    """(the path holding the stacks: () or ("backbone",) under a head, {stack: its layers}) of a flat param tree."""
    at = next(p[:-2] for p in flat if p[-2:] == ("token_embedder", "embedding"))
    return at, {stack: _num_layers(flat, at + (stack,)) for stack in ("encoder", "decoder")}


def _put_prefixes(flat: dict, stack: tuple, sublayer: str, rows, sites: list[tuple[int, int]]) -> None:
    """Writes `prefix_key` (row r) and `prefix_value` (row r + 1) of prefix `rows` [n, rows * heads
    * head_dim] into `sublayer` of each (layer, r) of `sites`, stacked on the layers axis when scanned."""
    scanned = stack + ("layers", sublayer, "key", "kernel") in flat
    heads, head_dim = flat[stack + ("layers" if scanned else "layers_0", sublayer, "key", "kernel")].shape[-2:]
    per_row = rows.reshape(rows.shape[0], -1, heads, head_dim)
    for name, offset in (("prefix_key", 0), ("prefix_value", 1)):
        if scanned:
            flat[stack + ("layers", sublayer, name)] = jnp.stack([per_row[:, row + offset] for _, row in sites])
        else:
            for layer, row in sites:
                flat[stack + (f"layers_{layer}", sublayer, name)] = per_row[:, row + offset]


def _num_layers(flat: dict, stack: tuple) -> int:
    """A stack's layers in a flat param tree: looped `layers_<i>`, or the leading axis of scanned `layers`."""
    looped = {p[len(stack)] for p in flat if p[:len(stack)] == stack and p[len(stack)].startswith("layers_")}
    if looped:
        return len(looped)
    scanned = flat.get(stack + ("layers", "self_attention", "key", "kernel"))
    return 0 if scanned is None else scanned.shape[0]
_ADAPTER_SUBLAYERS = {"houlsby": ("self_attention", "mlp"), "pfeiffer": ("mlp",)}
_ADAPTER_INITS = ("bert", "houlsby", "mam_adapter")


@dataclasses.dataclass(frozen=True)
class Adapters(Method):
    """Bottleneck adapters as the `adapters` package (1.3) defines them, in every Transformer layer
    of every stack (`t5lite.models.bottleneck` says where the residuals and layer norms go):
    "houlsby" (adapters' DoubleSeqBnConfig: after self-attention and after the MLP, swish) or
    "pfeiffer" (SeqBnConfig: after the MLP only, relu); `cross_adapter` adds one after a decoder's
    cross-attention. The bottleneck has int(d_model // reduction_factor) units (at least 1).
    `init_weights` as adapters: "bert" (both projections N(0, 0.02), zero biases: near identity),
    "houlsby" (truncated N(0, 0.01) within +-0.02) or "mam_adapter" (down Kaiming-uniform, up
    zeros: the identity). An ALBERT's shared layer has one shared set, as in adapters."""
    config: str = "houlsby"
    reduction_factor: float = 16
    init_weights: str = "bert"
    cross_adapter: bool = False
    merges = False   # the adapters are params of their layers, which apply them when present

    def __post_init__(self):
        if self.config not in _ADAPTER_SUBLAYERS:
            raise ConfigError(f"Adapters.config={self.config!r}: expected 'houlsby' (double_seq_bn) or 'pfeiffer' "
                              "(seq_bn)")
        if self.init_weights not in _ADAPTER_INITS:
            raise ConfigError(f"Adapters.init_weights={self.init_weights!r}: expected one of {', '.join(_ADAPTER_INITS)}")
        if self.reduction_factor <= 0:
            raise ConfigError(f"Adapters.reduction_factor={self.reduction_factor}: expected a positive number")

    def init(self, rng, params, specs, config: ModelConfig) -> tuple[dict, dict]:
        trained, trained_specs = super().init(rng, params, specs, config)
        flat, flat_specs = flatten_dict(params), flatten_dict(specs)
        saved = set(self.modules_to_save)
        sublayers = _ADAPTER_SUBLAYERS[self.config] + (("cross_attention",) if self.cross_adapter else ())
        d, m = config.d_model, max(1, int(config.d_model // self.reduction_factor))
        out, out_specs = flatten_dict(trained["params"]), flatten_dict(trained_specs["params"])
        for path in sorted(p for p in flat if p[-3:] == ("mlp", "wo", "kernel") and not set(p) & saved):
            layer = path[:-3]
            lead_axes = tuple(flat_specs[path])[:flat[path].ndim - 2]   # ("layers",) when scanned
            lead = flat[path].shape[:len(lead_axes)]
            for name in sublayers:
                if not any(p[:len(layer) + 1] == layer + (name,) for p in flat):
                    continue
                rng, k_down, k_up = jax.random.split(rng, 3)
                at = layer + (self.config, name)
                out[at + ("down", "kernel")] = self._init_kernel(k_down, lead + (d, m), d, "down")
                out[at + ("down", "bias")] = jnp.zeros(lead + (m,), jnp.float32)
                out[at + ("up", "kernel")] = self._init_kernel(k_up, lead + (m, d), m, "up")
                out[at + ("up", "bias")] = jnp.zeros(lead + (d,), jnp.float32)
                out_specs[at + ("down", "kernel")] = P(*lead_axes, "embed", "adapter")
                out_specs[at + ("down", "bias")] = P(*lead_axes, "adapter")
                out_specs[at + ("up", "kernel")] = P(*lead_axes, "adapter", "embed")
                out_specs[at + ("up", "bias")] = P(*lead_axes, "embed")
        trained["params"], trained_specs["params"] = unflatten_dict(out), unflatten_dict(out_specs)
        return trained, trained_specs

    def _init_kernel(self, key, shape, fan_in: int, which: str):
        if self.init_weights == "bert":
            return 0.02 * jax.random.normal(key, shape, jnp.float32)
        if self.init_weights == "houlsby":
            return 0.01 * jax.random.truncated_normal(key, -2.0, 2.0, shape, jnp.float32)
        if which == "up":   # mam_adapter
            return jnp.zeros(shape, jnp.float32)
        bound = 1.0 / math.sqrt(fan_in)   # kaiming_uniform_(a=sqrt(5))
        return jax.random.uniform(key, shape, jnp.float32, -bound, bound)


def count(tree) -> int:
    """Number of scalars in a param tree (peft's `get_nb_trainable_parameters` counts these)."""
    return sum(math.prod(x.shape) for x in jax.tree.leaves(tree))


def logical_specs(module, feature_lengths: dict[str, int] | None = None) -> Any:
    """The logical axis names of a module's params (init traced with dummy features, nothing computed)."""
    tokens = jnp.zeros((1, 4), jnp.int32)
    features = {k: jnp.zeros((1, n), jnp.int32) for k, n in feature_lengths.items()} if feature_lengths else \
        dict(encoder_input_tokens=tokens, decoder_input_tokens=tokens)
    abstract = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), **features))
    return nn.get_partition_spec(abstract)["params"]


def lora_interceptor(rate: float):
    """A flax method interceptor: a Dense whose params hold `lora_a` and `lora_b` (see
    `LoRA.for_training`) returns W x + (B A dropout(x)) (+ `lora_bias`) — dropout with the "dropout" rng, as peft's
    lora_dropout. A fused group's projections (GPT-2's c_attn) draw their masks separately."""
    def intercept(next_fun, args, kwargs, context):
        module = context.module
        y = next_fun(*args, **kwargs)
        if context.method_name != "__call__" or not isinstance(module, Dense) \
                or not module.has_variable("params", "lora_a"):
            return y
        x = args[0]
        if rate and module.has_rng("dropout"):   # training (an rng given); never at inference
            keep = jax.random.bernoulli(module.make_rng("dropout"), 1.0 - rate, x.shape)
            x = jnp.where(keep, x / (1.0 - rate), 0.0).astype(x.dtype)
        a, b = (module.get_variable("params", n).astype(module.dtype) for n in ("lora_a", "lora_b"))
        h = jnp.tensordot(x.astype(module.dtype), a, axes=module.in_ndim)
        if module.has_variable("params", "lora_bias"):
            y = y + module.get_variable("params", "lora_bias").astype(module.dtype)
        return y + jnp.tensordot(h, b, axes=1)
    return intercept


METHODS = {"LoRA": LoRA, "BitFit": BitFit, "PromptTuning": PromptTuning, "PrefixTuning": PrefixTuning,
           "Adapters": Adapters}   # by name, as a PEFT run records its method
