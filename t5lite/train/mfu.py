"""Model FLOPs utilisation: the FLOPs a step needs by formula, over time and the chips' peak.

Counted as MaxText does: 2 FLOPs per multiply-add of every matmul with a parameter, plus the
two attention matmuls (QK^T and AV, halved under a causal mask), times 3 for forward + backward.
Rematerialisation is not counted. Norms, softmax and elementwise work are ignored.
"""
from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp

from t5lite.models.config import ModelConfig

# Dense bf16 peak FLOP/s per chip (vendor figures).
PEAK_FLOPS = {"TPU v2": 45e12, "TPU v3": 123e12, "TPU v4": 275e12, "TPU v5 lite": 197e12, "TPU v5e": 197e12,
              "TPU v5p": 459e12, "TPU v5": 459e12, "TPU v6 lite": 918e12, "TPU v6e": 918e12}


def _layer_matmul_macs(cfg: ModelConfig, q_len: int, kv_len: int, cross: bool) -> float:
    attn = cfg.d_model * cfg.num_heads * cfg.head_dim
    if cross:  # q and out on the decoder side, k and v on the encoder side
        return 2 * attn * q_len + 2 * attn * kv_len
    return 4 * attn * q_len


def _mlp_macs(cfg: ModelConfig, length: int) -> float:
    return (len(cfg.mlp_activations) + 1) * cfg.d_model * cfg.d_ff * length


def _attention_macs(cfg: ModelConfig, q_len: int, kv_len: int, causal: bool) -> float:
    macs = 2 * q_len * kv_len * cfg.num_heads * cfg.head_dim
    return macs / 2 if causal else macs


def train_flops_per_example(cfg: ModelConfig, inputs_length: int, targets_length: int) -> float:
    """Forward + backward FLOPs of one encoder-decoder example of the given lengths."""
    li, lt = inputs_length, targets_length
    enc = cfg.num_encoder_layers * (_layer_matmul_macs(cfg, li, li, False) + _mlp_macs(cfg, li)
                                    + _attention_macs(cfg, li, li, False))
    dec = cfg.num_decoder_layers * (_layer_matmul_macs(cfg, lt, lt, False) + _layer_matmul_macs(cfg, lt, li, True)
                                    + _mlp_macs(cfg, lt) + _attention_macs(cfg, lt, lt, True)
                                    + _attention_macs(cfg, lt, li, False))
    logits = cfg.d_model * cfg.vocab_size * lt
    return 3 * 2 * (enc + dec + logits)


@functools.lru_cache(maxsize=None)
def measured_peak_flops(n: int = 1024, repeats: int = 5) -> float:
    """FLOP/s of a large float32 matmul on this device: the CPU's practical peak (no vendor figure)."""
    a = jnp.ones((n, n), jnp.float32)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        f(a).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2 * n ** 3 / best


def peak_flops_per_device(override: float | None = None) -> tuple[float, str]:
    """The peak used for MFU and where it came from."""
    if override:
        return float(override), "configured"
    kind = jax.devices()[0].device_kind
    for name, flops in PEAK_FLOPS.items():
        if kind.lower().startswith(name.lower()):
            return flops, f"{kind} spec sheet"
    return measured_peak_flops(), f"measured f32 matmul on {kind}"
