"""Hugging Face checkpoints in and out: T5 (v1.0, v1.1, mT5), BERT, RoBERTa, ALBERT, ELECTRA,
DeBERTa-v2/v3, GPT-2 and BART.

    module, variables = load("path/to/hf_folder")      # config.json + model.safetensors / pytorch_model.bin
    save(module_or_config, variables, "out_dir")       # a folder transformers' from_pretrained reads

A family is a config translation (HF config.json <-> ModelConfig) plus a list of `Rule`s, each
pairing one HF tensor with one (or, for GPT-2's fused qkv, several) t5lite parameters and saying
how the layouts differ. Loading checks every tensor's presence and shape before converting and
names the tensor and the expected shape when something is off. Params are plain (unboxed) float32
arrays in the looped layer layout; `scan_layers=True` stacks them. Only numpy, safetensors and
json are needed; torch only to read a legacy pytorch_model.bin (with `weights_only=True`).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax.core import meta
from flax.traverse_util import flatten_dict, unflatten_dict

from t5lite import models
from t5lite.models.config import ModelConfig

log = logging.getLogger(__name__)

# HF activation names <-> ours ("gelu" is HF's exact erf GELU; our "gelu" is the tanh form).
_ACT_FROM_HF = {"relu": "relu", "gelu": "gelu_exact", "gelu_new": "gelu", "gelu_pytorch_tanh": "gelu",
                "gelu_fast": "gelu", "silu": "silu", "swish": "silu", "tanh": "tanh"}
_ACT_TO_HF = {"relu": "relu", "gelu_exact": "gelu", "gelu": "gelu_new", "silu": "silu", "tanh": "tanh"}


class HFConversionError(ValueError):
    """A checkpoint that does not fit: unsupported model_type or option, missing or mis-shaped tensor."""


@dataclasses.dataclass(frozen=True)
class Rule:
    """One HF tensor <-> t5lite params (paths "a/b/kernel"), with the layout change `kind`:

    copy: same shape; vector: HF flattens ([heads, kv] bias <-> [heads*kv]); row: HF adds a
    leading 1 (BART's final_logits_bias); linear: torch Linear [out, in] <-> our kernel
    [*in, *out] (`in_ndim` input axes); conv1d: GPT-2's Conv1D [in, out]. Several params are
    concatenated along the HF tensor's last axis (GPT-2's c_attn = q | k | v).
    """
    hf: str
    ours: tuple[str, ...]
    kind: str = "copy"
    in_ndim: int = 1

    def hf_shape(self, shapes) -> tuple[int, ...]:
        parts = [self._part_shape(s) for s in shapes]
        return (*parts[0][:-1], sum(p[-1] for p in parts))

    def _part_shape(self, shape):
        inputs, outputs = math.prod(shape[:self.in_ndim]), math.prod(shape[self.in_ndim:])
        return {"copy": tuple(shape), "vector": (math.prod(shape),), "row": (1, math.prod(shape)),
                "linear": (outputs, inputs), "conv1d": (inputs, outputs)}[self.kind]

    def to_hf(self, arrays) -> np.ndarray:
        parts = []
        for a in arrays:
            a = np.asarray(a, np.float32)
            if self.kind in ("linear", "conv1d"):
                a = a.reshape(math.prod(a.shape[:self.in_ndim]), -1)
                a = a.T if self.kind == "linear" else a
            parts.append(a.reshape(self._part_shape(a.shape)) if self.kind not in ("linear", "conv1d") else a)
        return np.ascontiguousarray(np.concatenate(parts, axis=-1) if len(parts) > 1 else parts[0])

    def from_hf(self, tensor: np.ndarray, shapes) -> list[np.ndarray]:
        parts = np.split(tensor, len(shapes), axis=-1) if len(shapes) > 1 else [tensor]
        return [np.asarray(p.T if self.kind == "linear" else p, np.float32).reshape(s) for p, s in zip(parts, shapes)]


def _dense(hf: str, ours: str, bias: bool = True, in_ndim: int = 1) -> list[Rule]:
    rules = [Rule(f"{hf}.weight", (f"{ours}/kernel",), "linear", in_ndim)]
    return rules + ([Rule(f"{hf}.bias", (f"{ours}/bias",), "vector")] if bias else [])


def _norm(hf: str, ours: str, bias: bool = True) -> list[Rule]:
    return [Rule(f"{hf}.weight", (f"{ours}/scale",))] + ([Rule(f"{hf}.bias", (f"{ours}/bias",))] if bias else [])


def _attention(hf: str, ours: str, names: tuple[str, str, str, str], bias: bool = True) -> list[Rule]:
    q, k, v, o = names
    return (_dense(f"{hf}.{q}", f"{ours}/query", bias) + _dense(f"{hf}.{k}", f"{ours}/key", bias)
            + _dense(f"{hf}.{v}", f"{ours}/value", bias) + _dense(f"{hf}.{o}", f"{ours}/out", bias, in_ndim=2))


def _mlp(wi: str, wo: str, ours: str, cfg: ModelConfig, gated_names=("wi_0", "wi_1")) -> list[Rule]:
    if len(cfg.mlp_activations) == 1:
        rules = _dense(wi, f"{ours}/wi", cfg.use_bias)
    else:
        prefix = wi.rsplit(".", 1)[0]
        rules = [r for i, n in enumerate(gated_names) for r in _dense(f"{prefix}.{n}", f"{ours}/wi_{i}", cfg.use_bias)]
    return rules + _dense(wo, f"{ours}/wo", cfg.use_bias)


def _require(cfg: ModelConfig, family: str, **fields):
    """Refuses to export a config the HF architecture cannot express."""
    for name, want in fields.items():
        if getattr(cfg, name) != want:
            raise HFConversionError(f"{family} cannot express {name}={getattr(cfg, name)!r} (needs {want!r})")


def _special_ids(c: dict, start: int, eos: int) -> dict:
    """decoder_start_token_id and eos_token_id from an HF config (defaults: the family's own);
    a list of EOS ids (some generation configs) keeps the first."""
    eos_id = c.get("eos_token_id", eos)
    eos_id = eos_id[0] if isinstance(eos_id, list) else eos_id
    start_id = c.get("decoder_start_token_id", start)
    return dict(decoder_start_token_id=start if start_id is None else start_id,
                eos_token_id=eos if eos_id is None else eos_id)


def _act(hf_name: str) -> str:
    if hf_name not in _ACT_FROM_HF:
        raise HFConversionError(f"unsupported activation {hf_name!r}; known: {sorted(_ACT_FROM_HF)}")
    return _ACT_FROM_HF[hf_name]


# ============================================================================ T5 / mT5

class T5Family:
    model_types = ("t5", "mt5")

    @staticmethod
    def from_hf(c: dict, tensors: dict[str, np.ndarray]) -> ModelConfig:
        proj = c.get("feed_forward_proj", "relu").split("-")
        act = "gelu" if proj == ["gated", "gelu"] else _act(proj[-1])
        # transformers 5.x always ties lm_head in its T5 classes and marks v1.1 by scale_decoder_outputs=False
        # (mT5 never scales); a checkpoint with its own, different lm_head.weight is untied (v1.1 / mT5 releases).
        untied = "lm_head.weight" in tensors and not np.array_equal(tensors["lm_head.weight"], tensors["shared.weight"])
        scale_flag = c.get("scale_decoder_outputs", c.get("tie_word_embeddings"))
        scale = c.get("model_type") == "t5" and scale_flag is not False
        return ModelConfig(
            arch="encoder_decoder", vocab_size=c["vocab_size"], d_model=c["d_model"], num_heads=c["num_heads"],
            head_dim=c["d_kv"], d_ff=c["d_ff"], num_encoder_layers=c["num_layers"],
            num_decoder_layers=c.get("num_decoder_layers") or c["num_layers"],
            mlp_activations=(act, "linear") if proj[0] == "gated" else (act,),
            dropout_rate=c.get("dropout_rate", 0.1), layer_norm_epsilon=c.get("layer_norm_epsilon", 1e-6),
            relative_attention_num_buckets=c.get("relative_attention_num_buckets", 32),
            relative_attention_max_distance=c.get("relative_attention_max_distance", 128),
            tie_embeddings=not untied,
            scale_tied_logits=scale and not untied,
            pad_token_id=c.get("pad_token_id", 0), **_special_ids(c, start=0, eos=1))

    @staticmethod
    def to_hf(cfg: ModelConfig) -> dict:
        _require(cfg, "T5", norm="rms", norm_position="pre", use_bias=False, scale_attention=False,
                 position_encoding="t5_relative", embedding_size=None, type_vocab_size=0, logits_bias=False,
                 final_norm=True, embedding_norm=False, scale_embeddings=False)
        acts = cfg.mlp_activations
        if len(acts) == 2 and acts[1] == "linear":
            proj = "gated-gelu" if acts[0] == "gelu" else f"gated-{_ACT_TO_HF[acts[0]]}"
            if acts[0] == "gelu_exact":
                raise HFConversionError("HF T5 maps 'gated-gelu' to the tanh GELU; exact gated GELU has no name")
        elif len(acts) == 1:
            proj = _ACT_TO_HF[acts[0]]
        else:
            raise HFConversionError(f"T5 cannot express mlp_activations={acts}")
        return dict(model_type="t5", architectures=["T5ForConditionalGeneration"], vocab_size=cfg.vocab_size,
                    d_model=cfg.d_model, d_kv=cfg.head_dim, d_ff=cfg.d_ff, num_layers=cfg.num_encoder_layers,
                    num_decoder_layers=cfg.num_decoder_layers, num_heads=cfg.num_heads,
                    relative_attention_num_buckets=cfg.relative_attention_num_buckets,
                    relative_attention_max_distance=cfg.relative_attention_max_distance,
                    dropout_rate=cfg.dropout_rate, layer_norm_epsilon=cfg.layer_norm_epsilon,
                    feed_forward_proj=proj, tie_word_embeddings=cfg.tie_embeddings,
                    scale_decoder_outputs=cfg.tie_embeddings and cfg.scale_tied_logits,
                    is_encoder_decoder=True, pad_token_id=cfg.pad_token_id, eos_token_id=cfg.eos_token_id,
                    decoder_start_token_id=cfg.decoder_start_token_id)

    @staticmethod
    def rules(cfg: ModelConfig) -> list[Rule]:
        rules = [Rule("shared.weight", ("token_embedder/embedding",))]
        for stack, n in (("encoder", cfg.num_encoder_layers), ("decoder", cfg.num_decoder_layers)):
            rules.append(Rule(f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                              (f"{stack}/relpos_bias/rel_embedding",)))
            for i in range(n):
                hf, ours = f"{stack}.block.{i}.layer", f"{stack}/layers_{i}"
                rules += _attention(f"{hf}.0.SelfAttention", f"{ours}/self_attention", ("q", "k", "v", "o"), False)
                rules += _norm(f"{hf}.0.layer_norm", f"{ours}/self_attention_norm", False)
                mlp = 1
                if stack == "decoder":
                    rules += _attention(f"{hf}.1.EncDecAttention", f"{ours}/cross_attention", ("q", "k", "v", "o"),
                                        False)
                    rules += _norm(f"{hf}.1.layer_norm", f"{ours}/cross_attention_norm", False)
                    mlp = 2
                rules += _mlp(f"{hf}.{mlp}.DenseReluDense.wi", f"{hf}.{mlp}.DenseReluDense.wo", f"{ours}/mlp", cfg)
                rules += _norm(f"{hf}.{mlp}.layer_norm", f"{ours}/mlp_norm", False)
            rules += _norm(f"{stack}.final_layer_norm", f"{stack}/final_norm", False)
        if not cfg.tie_embeddings:
            rules += _dense("lm_head", "lm_head/logits_dense", bias=False)
        return rules


# ============================================================================ BERT family

@dataclasses.dataclass(frozen=True)
class _EncoderNames:
    """Where one BERT-family member keeps its tensors."""
    model_type: str
    prefix: str
    mlm: tuple[str, str, str]          # transform dense, transform LayerNorm, output bias
    projection: str | None = None      # factorised embedding -> hidden
    pooler: str = "pooler.dense"
    mlm_architecture: str = ""
    discriminator: tuple[str, str] | None = None
    sentence: str | None = None        # NSP / SOP classifier on the pooler
    attention: tuple[str, ...] = ("self.query", "self.key", "self.value", "output.dense")


_ENCODERS = {
    "bert": _EncoderNames("bert", "bert", ("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
                                           "cls.predictions.bias"), mlm_architecture="BertForMaskedLM",
                         sentence="cls.seq_relationship"),
    "roberta": _EncoderNames("roberta", "roberta", ("lm_head.dense", "lm_head.layer_norm", "lm_head.bias"),
                             mlm_architecture="RobertaForMaskedLM"),
    "albert": _EncoderNames("albert", "albert", ("predictions.dense", "predictions.LayerNorm", "predictions.bias"),
                            projection="encoder.embedding_hidden_mapping_in", pooler="pooler",
                            mlm_architecture="AlbertForMaskedLM", sentence="sop_classifier.classifier"),
    "electra": _EncoderNames("electra", "electra", ("generator_predictions.dense", "generator_predictions.LayerNorm",
                                                    "generator_lm_head.bias"),
                             projection="embeddings_project", mlm_architecture="ElectraForMaskedLM",
                             discriminator=("discriminator_predictions.dense",
                                            "discriminator_predictions.dense_prediction")),
    "deberta-v2": _EncoderNames("deberta-v2", "deberta",
                                ("lm_predictions.lm_head.dense", "lm_predictions.lm_head.LayerNorm",
                                 "lm_predictions.lm_head.bias"),
                                mlm_architecture="DebertaV2ForMaskedLM",
                                attention=("self.query_proj", "self.key_proj", "self.value_proj", "output.dense")),
}
# transformers' DebertaV2 `legacy=True` MLM head uses BERT's names.
_DEBERTA_LEGACY_MLM = _ENCODERS["bert"].mlm


class EncoderFamily:
    model_types = tuple(_ENCODERS)

    def __init__(self, model_type: str):
        self.names = _ENCODERS[model_type]

    def from_hf(self, c: dict, tensors: dict[str, np.ndarray]) -> ModelConfig:
        n = self.names
        names = set(tensors) | {k.split(".", 1)[1] for k in tensors if "." in k}   # with and without prefix
        if c.get("position_embedding_type", "absolute") != "absolute":
            raise HFConversionError(f"position_embedding_type={c['position_embedding_type']!r} is not supported")
        if n.model_type == "albert" and (c.get("num_hidden_groups", 1) != 1 or c.get("inner_group_num", 1) != 1):
            raise HFConversionError("ALBERT with num_hidden_groups or inner_group_num other than 1 is not supported")
        if n.model_type == "deberta-v2":
            self._check_deberta(c)
            if _DEBERTA_LEGACY_MLM[2] in tensors:
                self.names = n = dataclasses.replace(n, mlm=_DEBERTA_LEGACY_MLM)
        head = "mlm" if n.mlm[2] in names else "discriminator" if n.discriminator and \
            f"{n.discriminator[0]}.weight" in names else "none"
        offset = c.get("pad_token_id", 1) + 1 if n.model_type == "roberta" else 0
        hidden = c["hidden_size"]
        embedding = c.get("embedding_size", hidden)
        factorised = n.model_type == "albert" or (n.model_type == "electra" and embedding != hidden)
        return ModelConfig(
            arch="encoder", vocab_size=c["vocab_size"], d_model=hidden, num_heads=c["num_attention_heads"],
            head_dim=hidden // c["num_attention_heads"], d_ff=c["intermediate_size"],
            num_encoder_layers=c["num_hidden_layers"], num_decoder_layers=0,
            mlp_activations=(_act(c.get("hidden_act", "gelu")),), dropout_rate=c.get("hidden_dropout_prob", 0.1),
            norm="layer", norm_position="post", final_norm=False, embedding_norm=True, use_bias=True,
            scale_attention=True, layer_norm_epsilon=c.get("layer_norm_eps", 1e-12), init_std=0.02,
            pad_token_id=c.get("pad_token_id", 0) or 0, embedding_size=embedding if factorised else None,
            type_vocab_size=c.get("type_vocab_size", 2), **self._positions(c),
            max_position_embeddings=c.get("max_position_embeddings", 512) - offset, position_offset=offset,
            share_layers=n.model_type == "albert", scale_tied_logits=False, encoder_head=head,
            pooler=f"{n.pooler}.weight" in names, sentence_head=bool(n.sentence) and f"{n.sentence}.weight" in names)

    def _positions(self, c: dict) -> dict:
        if self.names.model_type != "deberta-v2":
            return dict(position_encoding="learned")
        max_relative = c.get("max_relative_positions", -1)
        return dict(position_encoding="disentangled", relative_attention_num_buckets=c["position_buckets"],
                    relative_attention_max_distance=max_relative if max_relative > 0 else
                    c.get("max_position_embeddings", 512))

    @staticmethod
    def _check_deberta(c: dict):
        wanted = dict(relative_attention=True, position_biased_input=False, share_att_key=True,
                      norm_rel_ebd="layer_norm", conv_kernel_size=0)
        got = {k: c.get(k, 0 if k == "conv_kernel_size" else None) for k in wanted}
        pos_att = c.get("pos_att_type") or []
        pos_att = pos_att.split("|") if isinstance(pos_att, str) else pos_att
        if got != wanted or sorted(pos_att) != ["c2p", "p2c"] or (c.get("position_buckets") or 0) <= 0 or \
                c.get("embedding_size", c["hidden_size"]) != c["hidden_size"]:
            raise HFConversionError(f"only DeBERTa-v3-style configs are supported ({wanted}, pos_att_type "
                                    f"c2p|p2c, position_buckets > 0, embedding_size == hidden_size); got {got}, "
                                    f"pos_att_type={pos_att}")

    def to_hf(self, cfg: ModelConfig) -> dict:
        n = self.names
        deberta = n.model_type == "deberta-v2"
        _require(cfg, n.model_type, arch="encoder", norm="layer", norm_position="post", final_norm=False,
                 embedding_norm=True, use_bias=True, scale_attention=True,
                 position_encoding="disentangled" if deberta else "learned",
                 scale_embeddings=False, tie_embeddings=True, share_layers=n.model_type == "albert",
                 position_offset=cfg.pad_token_id + 1 if n.model_type == "roberta" else 0)
        if len(cfg.mlp_activations) != 1:
            raise HFConversionError(f"{n.model_type} cannot express a gated MLP {cfg.mlp_activations}")
        if cfg.num_heads * cfg.head_dim != cfg.d_model:
            raise HFConversionError(f"{n.model_type} needs num_heads * head_dim == d_model")
        if n.model_type in ("bert", "roberta", "deberta-v2"):
            _require(cfg, n.model_type, embedding_size=None)
        if n.model_type == "electra" and cfg.embedding_size == cfg.d_model:
            raise HFConversionError("ELECTRA projects embeddings only when embedding_size != d_model; use None")
        model_name = "DebertaV2" if deberta else n.model_type.capitalize()
        arch = {"mlm": n.mlm_architecture, "none": f"{model_name}Model",
                "discriminator": "ElectraForPreTraining"}[cfg.encoder_head]
        if cfg.sentence_head:
            if cfg.encoder_head != "mlm" or not n.sentence:
                raise HFConversionError(f"{n.model_type} has no architecture with this head and a sentence head")
            arch = arch.replace("ForMaskedLM", "ForPreTraining")
        hf = dict(model_type=n.model_type, architectures=[arch],
                  vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, num_hidden_layers=cfg.num_encoder_layers,
                  num_attention_heads=cfg.num_heads, intermediate_size=cfg.d_ff,
                  hidden_act=_ACT_TO_HF[cfg.mlp_activations[0]], hidden_dropout_prob=cfg.dropout_rate,
                  attention_probs_dropout_prob=cfg.dropout_rate, layer_norm_eps=cfg.layer_norm_epsilon,
                  max_position_embeddings=cfg.max_position_embeddings + cfg.position_offset,
                  type_vocab_size=cfg.type_vocab_size, pad_token_id=cfg.pad_token_id, initializer_range=0.02,
                  tie_word_embeddings=True)
        if n.model_type in ("albert", "electra"):
            hf["embedding_size"] = cfg.embed_dim
        if n.model_type == "albert":
            hf.update(num_hidden_groups=1, inner_group_num=1, classifier_dropout_prob=cfg.dropout_rate)
        if deberta:
            hf.update(relative_attention=True, position_biased_input=False, share_att_key=True,
                      pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm", legacy=False,
                      position_buckets=cfg.relative_attention_num_buckets,
                      max_relative_positions=cfg.relative_attention_max_distance)
        return hf

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        n, p = self.names, self.names.prefix
        rules = [Rule(f"{p}.embeddings.word_embeddings.weight", ("token_embedder/embedding",))]
        if cfg.position_encoding == "learned":
            rules.append(Rule(f"{p}.embeddings.position_embeddings.weight",
                              ("encoder/position_embedder/table/embedding",)))
        if cfg.position_encoding == "disentangled":
            rules.append(Rule(f"{p}.encoder.rel_embeddings.weight", ("encoder/rel_embedding",)))
            rules += _norm(f"{p}.encoder.LayerNorm", "encoder/rel_embedding_norm")
        if cfg.type_vocab_size:
            rules.append(Rule(f"{p}.embeddings.token_type_embeddings.weight",
                              ("encoder/token_type_embedder/embedding",)))
        rules += _norm(f"{p}.embeddings.LayerNorm", "encoder/embedding_norm")
        if cfg.embedding_size is not None:
            rules += _dense(f"{p}.{n.projection}", "encoder/embedding_projection")
        if n.model_type == "albert":
            layers = [(f"{p}.encoder.albert_layer_groups.0.albert_layers.0", "encoder/layers")]
        else:
            layers = [(f"{p}.encoder.layer.{i}", f"encoder/layers_{i}") for i in range(cfg.num_encoder_layers)]
        for hf, ours in layers:
            if n.model_type == "albert":
                rules += _attention(f"{hf}.attention", f"{ours}/self_attention", ("query", "key", "value", "dense"))
                rules += _norm(f"{hf}.attention.LayerNorm", f"{ours}/self_attention_norm")
                rules += _mlp(f"{hf}.ffn", f"{hf}.ffn_output", f"{ours}/mlp", cfg)
                rules += _norm(f"{hf}.full_layer_layer_norm", f"{ours}/mlp_norm")
            else:
                rules += _attention(f"{hf}.attention", f"{ours}/self_attention", n.attention)
                rules += _norm(f"{hf}.attention.output.LayerNorm", f"{ours}/self_attention_norm")
                rules += _mlp(f"{hf}.intermediate.dense", f"{hf}.output.dense", f"{ours}/mlp", cfg)
                rules += _norm(f"{hf}.output.LayerNorm", f"{ours}/mlp_norm")
        if cfg.pooler:
            rules += _dense(f"{p}.{n.pooler}", "pooler/dense")
        if cfg.sentence_head:
            rules += _dense(n.sentence, "sentence_head/classifier")
        if cfg.encoder_head == "mlm":
            rules += _dense(n.mlm[0], "mlm_head/dense") + _norm(n.mlm[1], "mlm_head/norm")
            rules.append(Rule(n.mlm[2], ("mlm_head/bias",)))
        elif cfg.encoder_head == "discriminator":
            if n.discriminator is None:
                raise HFConversionError(f"{n.model_type} has no discriminator head")
            rules += _dense(n.discriminator[0], "discriminator_head/dense")
            rules += _dense(n.discriminator[1], "discriminator_head/prediction")
        return rules


# ============================================================================ GPT-2

class GPT2Family:
    model_types = ("gpt2",)

    @staticmethod
    def from_hf(c: dict, tensors: dict[str, np.ndarray]) -> ModelConfig:
        for flag in ("scale_attn_by_inverse_layer_idx", "add_cross_attention"):
            if c.get(flag):
                raise HFConversionError(f"GPT-2 with {flag}=True is not supported")
        d = c["n_embd"]
        return ModelConfig(
            arch="decoder", vocab_size=c["vocab_size"], d_model=d, num_heads=c["n_head"],
            head_dim=d // c["n_head"], d_ff=c.get("n_inner") or 4 * d, num_encoder_layers=0,
            num_decoder_layers=c["n_layer"], mlp_activations=(_act(c.get("activation_function", "gelu_new")),),
            dropout_rate=c.get("resid_pdrop", 0.1), norm="layer", norm_position="pre", final_norm=True,
            use_bias=True, scale_attention=c.get("scale_attn_weights", True),
            layer_norm_epsilon=c.get("layer_norm_epsilon", 1e-5), init_std=0.02, position_encoding="learned",
            max_position_embeddings=c.get("n_positions", 1024), scale_tied_logits=False,
            pad_token_id=c.get("pad_token_id") or 0,
            **_special_ids({**c, "decoder_start_token_id": c.get("bos_token_id")}, start=50256, eos=50256))

    @staticmethod
    def to_hf(cfg: ModelConfig) -> dict:
        _require(cfg, "GPT-2", arch="decoder", norm="layer", norm_position="pre", final_norm=True,
                 embedding_norm=False, use_bias=True, position_encoding="learned", position_offset=0,
                 embedding_size=None, type_vocab_size=0, tie_embeddings=True, scale_tied_logits=False,
                 logits_bias=False, scale_embeddings=False, share_layers=False)
        if len(cfg.mlp_activations) != 1 or cfg.num_heads * cfg.head_dim != cfg.d_model:
            raise HFConversionError("GPT-2 needs a plain MLP and num_heads * head_dim == d_model")
        return dict(model_type="gpt2", architectures=["GPT2LMHeadModel"], vocab_size=cfg.vocab_size,
                    n_embd=cfg.d_model, n_head=cfg.num_heads, n_layer=cfg.num_decoder_layers, n_inner=cfg.d_ff,
                    n_positions=cfg.max_position_embeddings, activation_function=_ACT_TO_HF[cfg.mlp_activations[0]],
                    resid_pdrop=cfg.dropout_rate, embd_pdrop=cfg.dropout_rate, attn_pdrop=cfg.dropout_rate,
                    layer_norm_epsilon=cfg.layer_norm_epsilon, scale_attn_weights=cfg.scale_attention,
                    tie_word_embeddings=True, bos_token_id=cfg.decoder_start_token_id, eos_token_id=cfg.eos_token_id)

    @staticmethod
    def rules(cfg: ModelConfig) -> list[Rule]:
        rules = [Rule("transformer.wte.weight", ("token_embedder/embedding",)),
                 Rule("transformer.wpe.weight", ("decoder/position_embedder/table/embedding",))]
        for i in range(cfg.num_decoder_layers):
            hf, ours = f"transformer.h.{i}", f"decoder/layers_{i}"
            qkv = tuple(f"{ours}/self_attention/{n}" for n in ("query", "key", "value"))
            rules += [Rule(f"{hf}.attn.c_attn.weight", tuple(f"{q}/kernel" for q in qkv), "conv1d"),
                      Rule(f"{hf}.attn.c_attn.bias", tuple(f"{q}/bias" for q in qkv), "vector"),
                      Rule(f"{hf}.attn.c_proj.weight", (f"{ours}/self_attention/out/kernel",), "conv1d", 2),
                      Rule(f"{hf}.attn.c_proj.bias", (f"{ours}/self_attention/out/bias",)),
                      Rule(f"{hf}.mlp.c_fc.weight", (f"{ours}/mlp/wi/kernel",), "conv1d"),
                      Rule(f"{hf}.mlp.c_fc.bias", (f"{ours}/mlp/wi/bias",)),
                      Rule(f"{hf}.mlp.c_proj.weight", (f"{ours}/mlp/wo/kernel",), "conv1d"),
                      Rule(f"{hf}.mlp.c_proj.bias", (f"{ours}/mlp/wo/bias",))]
            rules += _norm(f"{hf}.ln_1", f"{ours}/self_attention_norm") + _norm(f"{hf}.ln_2", f"{ours}/mlp_norm")
        return rules + _norm("transformer.ln_f", "decoder/final_norm")


# ============================================================================ BART

class BartFamily:
    model_types = ("bart",)

    @staticmethod
    def from_hf(c: dict, tensors: dict[str, np.ndarray]) -> ModelConfig:
        if c["encoder_attention_heads"] != c["decoder_attention_heads"] or \
                c["encoder_ffn_dim"] != c["decoder_ffn_dim"]:
            raise HFConversionError("BART with different encoder and decoder widths is not supported")
        if c.get("normalize_before") or c.get("add_final_layer_norm"):
            raise HFConversionError("pre-norm BART (mBART layout) is not supported")
        d = c["d_model"]
        return ModelConfig(
            arch="encoder_decoder", vocab_size=c["vocab_size"], d_model=d, num_heads=c["encoder_attention_heads"],
            head_dim=d // c["encoder_attention_heads"], d_ff=c["encoder_ffn_dim"],
            num_encoder_layers=c["encoder_layers"], num_decoder_layers=c["decoder_layers"],
            mlp_activations=(_act(c.get("activation_function", "gelu")),), dropout_rate=c.get("dropout", 0.1),
            norm="layer", norm_position="post", final_norm=False, embedding_norm=True, use_bias=True,
            scale_attention=True, layer_norm_epsilon=1e-5, init_std=0.02, pad_token_id=c.get("pad_token_id", 1),
            scale_embeddings=bool(c.get("scale_embedding", False)), position_encoding="learned",
            max_position_embeddings=c.get("max_position_embeddings", 1024), position_offset=2,
            scale_tied_logits=False, logits_bias=True, **_special_ids(c, start=2, eos=2))

    @staticmethod
    def to_hf(cfg: ModelConfig) -> dict:
        _require(cfg, "BART", arch="encoder_decoder", norm="layer", norm_position="post", final_norm=False,
                 embedding_norm=True, use_bias=True, scale_attention=True, position_encoding="learned",
                 position_offset=2, embedding_size=None, type_vocab_size=0, tie_embeddings=True,
                 scale_tied_logits=False, logits_bias=True, share_layers=False, layer_norm_epsilon=1e-5)
        return dict(model_type="bart", architectures=["BartForConditionalGeneration"], vocab_size=cfg.vocab_size,
                    d_model=cfg.d_model, encoder_layers=cfg.num_encoder_layers,
                    decoder_layers=cfg.num_decoder_layers, encoder_attention_heads=cfg.num_heads,
                    decoder_attention_heads=cfg.num_heads, encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff,
                    activation_function=_ACT_TO_HF[cfg.mlp_activations[0]], dropout=cfg.dropout_rate,
                    attention_dropout=0.0, activation_dropout=0.0, max_position_embeddings=cfg.max_position_embeddings,
                    scale_embedding=cfg.scale_embeddings, pad_token_id=cfg.pad_token_id, bos_token_id=0,
                    eos_token_id=cfg.eos_token_id, decoder_start_token_id=cfg.decoder_start_token_id,
                    forced_eos_token_id=cfg.eos_token_id, is_encoder_decoder=True,
                    tie_word_embeddings=True)

    @staticmethod
    def rules(cfg: ModelConfig) -> list[Rule]:
        rules = [Rule("model.shared.weight", ("token_embedder/embedding",)),
                 Rule("final_logits_bias", ("lm_head/logits_bias",), "row")]
        attn_names = ("q_proj", "k_proj", "v_proj", "out_proj")
        for stack, n in (("encoder", cfg.num_encoder_layers), ("decoder", cfg.num_decoder_layers)):
            rules.append(Rule(f"model.{stack}.embed_positions.weight", (f"{stack}/position_embedder/table/embedding",)))
            rules += _norm(f"model.{stack}.layernorm_embedding", f"{stack}/embedding_norm")
            for i in range(n):
                hf, ours = f"model.{stack}.layers.{i}", f"{stack}/layers_{i}"
                rules += _attention(f"{hf}.self_attn", f"{ours}/self_attention", attn_names)
                rules += _norm(f"{hf}.self_attn_layer_norm", f"{ours}/self_attention_norm")
                if stack == "decoder":
                    rules += _attention(f"{hf}.encoder_attn", f"{ours}/cross_attention", attn_names)
                    rules += _norm(f"{hf}.encoder_attn_layer_norm", f"{ours}/cross_attention_norm")
                rules += _mlp(f"{hf}.fc1", f"{hf}.fc2", f"{ours}/mlp", cfg)
                rules += _norm(f"{hf}.final_layer_norm", f"{ours}/mlp_norm")
        return rules


def _family(model_type: str):
    if model_type in T5Family.model_types:
        return T5Family()
    if model_type in EncoderFamily.model_types:
        return EncoderFamily(model_type)
    for fam in (GPT2Family, BartFamily):
        if model_type in fam.model_types:
            return fam()
    supported = T5Family.model_types + EncoderFamily.model_types + GPT2Family.model_types + BartFamily.model_types
    raise HFConversionError(f"unsupported model_type {model_type!r}; supported: {', '.join(supported)}")


def _family_of_config(cfg: ModelConfig) -> str:
    """Which HF model_type a t5lite config exports to."""
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


# ============================================================================ files

def _read_tensors(path: str) -> dict[str, np.ndarray]:
    """All tensors of a folder; old TF-converted names (LayerNorm gamma / beta) renamed as HF does."""
    legacy = {".gamma": ".weight", ".beta": ".bias"}
    rename = lambda k: next((k[:-len(old)] + new for old, new in legacy.items() if k.endswith(old)), k)
    return {rename(k): v for k, v in _read_files(path).items()}


def _read_files(path: str) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file
    files = os.listdir(path)
    if "model.safetensors" in files:
        return dict(load_file(os.path.join(path, "model.safetensors")))
    if "model.safetensors.index.json" in files:
        with open(os.path.join(path, "model.safetensors.index.json")) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        return {k: v for s in shards for k, v in load_file(os.path.join(path, s)).items()}
    if "pytorch_model.bin" in files:
        import torch  # only for legacy checkpoints; weights_only refuses arbitrary pickled objects
        state = torch.load(os.path.join(path, "pytorch_model.bin"), map_location="cpu", weights_only=True)
        return {k: v.float().numpy() for k, v in state.items()}
    raise FileNotFoundError(f"{path}: no model.safetensors, model.safetensors.index.json or pytorch_model.bin")


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
    features = dict(encoder_input_tokens=tokens, decoder_input_tokens=tokens)
    shapes = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), **features))["params"]
    shapes = meta.unbox(shapes)
    assert not cfg.scan_layers
    return {"/".join(k): tuple(v.shape) for k, v in flatten_dict(shapes).items()}


_GENERATION_IDS = ("decoder_start_token_id", "eos_token_id", "bos_token_id", "pad_token_id")


def load(path: str, **config_overrides) -> tuple[nn.Module, dict]:
    """Reads a Hugging Face model folder -> (module, {"params": ...}).

    `config_overrides` replace t5lite config fields (e.g. `scan_layers=True`, `dtype="bfloat16"`,
    `dropout_rate=0.0`); they must not change parameter shapes.
    """
    with open(os.path.join(path, "config.json")) as f:
        hf_config = json.load(f)
    generation = os.path.join(path, "generation_config.json")
    if os.path.exists(generation):   # what `generate` uses; transformers 5 keeps some ids only there
        with open(generation) as f:
            hf_config.update({k: v for k, v in json.load(f).items() if k in _GENERATION_IDS and v is not None})
    model_type = hf_config.get("model_type")
    family = _family(model_type)
    tensors = _read_tensors(path)
    config = family.from_hf(hf_config, tensors)
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
    config = config.replace(**config_overrides)
    if config.scan_layers:
        params = models.scan_params(params)
    return models.build(config), {"params": params}


def save(module_or_config: nn.Module | ModelConfig, variables: dict, out_dir: str) -> str:
    """Writes config.json + model.safetensors that `transformers.AutoModel*.from_pretrained` reads."""
    from safetensors.numpy import save_file
    config = module_or_config if isinstance(module_or_config, ModelConfig) else module_or_config.config
    family = _family(_family_of_config(config))
    hf_config = family.to_hf(config)
    params = meta.unbox(variables["params"] if "params" in variables else variables)
    if config.scan_layers:
        params = models.unscan_params(params)
    flat = {"/".join(k): np.asarray(v) for k, v in flatten_dict(params).items()}
    rules = family.rules(config.replace(scan_layers=False))
    tensors, exported = {}, set()
    for rule in rules:
        absent = [p for p in rule.ours if p not in flat]
        if absent:
            raise HFConversionError(f"cannot export {rule.hf!r}: params {absent} are missing from the variables")
        tensors[rule.hf] = rule.to_hf([flat[p] for p in rule.ours])
        exported.update(rule.ours)
    leftover = sorted(flat.keys() - exported)
    if leftover:
        raise HFConversionError(f"{hf_config['model_type']} has no place for params {leftover}")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(hf_config, f, indent=2, sort_keys=True)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    return out_dir


__all__ = ["HFConversionError", "Rule", "load", "save"]
