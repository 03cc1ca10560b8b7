"""Tensor mapping: a `Rule` pairs one HF tensor with t5lite parameters, and the builders below make
the rules of the pieces every family has (dense layers, norms, attention, MLPs)."""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from t5lite.models.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class Rule:
    """One HF tensor <-> t5lite params (paths "a/b/kernel"), with the layout change `kind`:

    copy: same shape; vector: HF flattens ([heads, kv] bias <-> [heads*kv]); row: HF adds
    `in_ndim` leading 1s (BART's final_logits_bias, ViT's position table; ViT's [CLS]: two);
    linear: torch Linear [out, in] <-> our kernel [*in, *out] (`in_ndim` input axes); conv1d:
    GPT-2's Conv1D [in, out]; conv2d: torch Conv2d [out, in, kh, kw] <-> flax's [kh, kw, in, out].
    Several params are concatenated along the HF tensor's last axis (GPT-2's c_attn = q | k | v).
    """
    hf: str
    ours: tuple[str, ...]
    kind: str = "copy"
    in_ndim: int = 1

    def hf_shape(self, shapes) -> tuple[int, ...]:
        parts = [self._part_shape(s) for s in shapes]
        return (*parts[0][:-1], sum(p[-1] for p in parts))

    def _part_shape(self, shape):
        if self.kind == "conv2d":
            return tuple(shape[i] for i in _CONV2D_TO_HF)
        inputs, outputs = math.prod(shape[:self.in_ndim]), math.prod(shape[self.in_ndim:])
        return {"copy": tuple(shape), "vector": (math.prod(shape),), "row": (1,) * self.in_ndim + tuple(shape),
                "linear": (outputs, inputs), "conv1d": (inputs, outputs)}[self.kind]

    def to_hf(self, arrays) -> np.ndarray:
        parts = []
        for a in arrays:
            a = np.asarray(a, np.float32)
            if self.kind in ("linear", "conv1d"):
                a = a.reshape(math.prod(a.shape[:self.in_ndim]), -1)
                a = a.T if self.kind == "linear" else a
            elif self.kind == "conv2d":
                a = a.transpose(_CONV2D_TO_HF)
            parts.append(a.reshape(self._part_shape(a.shape)) if self.kind not in ("linear", "conv1d", "conv2d") else a)
        return np.ascontiguousarray(np.concatenate(parts, axis=-1) if len(parts) > 1 else parts[0])

    def from_hf(self, tensor: np.ndarray, shapes) -> list[np.ndarray]:
        parts = np.split(tensor, len(shapes), axis=-1) if len(shapes) > 1 else [tensor]
        ours = {"linear": lambda p: p.T, "conv2d": lambda p: p.transpose(_CONV2D_FROM_HF)}.get(self.kind, lambda p: p)
        return [np.asarray(ours(p), np.float32).reshape(s) for p, s in zip(parts, shapes)]


_CONV2D_TO_HF = (3, 2, 0, 1)     # [kh, kw, in, out] -> [out, in, kh, kw]
_CONV2D_FROM_HF = (2, 3, 1, 0)


def prefixed(rules: list[Rule], old: str, new: str) -> list[Rule]:
    """The rules with each HF name's leading `old` replaced by `new`: a model's tensors held inside a
    composite one (VisionEncoderDecoderModel keeps ViT's `vit.*` as `encoder.*`, GPT-2's under `decoder.`)."""
    return [dataclasses.replace(r, hf=new + r.hf.removeprefix(old)) for r in rules]


def dense(hf: str, ours: str, bias: bool = True, in_ndim: int = 1) -> list[Rule]:
    rules = [Rule(f"{hf}.weight", (f"{ours}/kernel",), "linear", in_ndim)]
    return rules + ([Rule(f"{hf}.bias", (f"{ours}/bias",), "vector")] if bias else [])


def norm(hf: str, ours: str, bias: bool = True) -> list[Rule]:
    return [Rule(f"{hf}.weight", (f"{ours}/scale",))] + ([Rule(f"{hf}.bias", (f"{ours}/bias",))] if bias else [])


def attention(hf: str, ours: str, names: tuple[str, str, str, str], bias: bool = True) -> list[Rule]:
    q, k, v, o = names
    return (dense(f"{hf}.{q}", f"{ours}/query", bias) + dense(f"{hf}.{k}", f"{ours}/key", bias)
            + dense(f"{hf}.{v}", f"{ours}/value", bias) + dense(f"{hf}.{o}", f"{ours}/out", bias, in_ndim=2))


def mlp(wi: str, wo: str, ours: str, cfg: ModelConfig, gated_names=("wi_0", "wi_1")) -> list[Rule]:
    if len(cfg.mlp_activations) == 1:
        rules = dense(wi, f"{ours}/wi", cfg.use_bias)
    else:
        prefix = wi.rsplit(".", 1)[0]
        rules = [r for i, n in enumerate(gated_names) for r in dense(f"{prefix}.{n}", f"{ours}/wi_{i}", cfg.use_bias)]
    return rules + dense(wo, f"{ours}/wo", cfg.use_bias)
