"""Model FLOPs utilisation's denominator: a device's peak FLOP/s, from spec sheets or (CPUs)
measured. The numerator, a step's FLOPs by formula, is t5lite.models.flops.
"""
from __future__ import annotations

import functools
import time
from typing import Callable

import jax
import jax.numpy as jnp

# Dense bf16 peak FLOP/s of one JAX device, by exact `device_kind` (vendor spec sheets). On TPU
# v2 and v3 a JAX device is one of the chip's two TensorCores (45 and 123 TFLOP/s per chip);
# from v4 on it is the whole chip.
PEAK_FLOPS = {
    "TPU v2": 22.5e12, "TPU v3": 61.5e12, "TPU v4": 275e12, "TPU v5 lite": 197e12, "TPU v5e": 197e12,
    "TPU v5": 459e12, "TPU v5p": 459e12, "TPU v6 lite": 918e12, "TPU v6e": 918e12,
    "NVIDIA A100-SXM4-40GB": 312e12, "NVIDIA A100-SXM4-80GB": 312e12, "NVIDIA A100-PCIE-40GB": 312e12,
    "NVIDIA A100 80GB PCIe": 312e12, "NVIDIA H100 80GB HBM3": 989e12, "NVIDIA H100 PCIe": 756e12,
    "NVIDIA H200": 989e12, "NVIDIA H200 NVL": 835e12,
}


def best_matmul_flops(matmul: Callable[[int], Callable[[], object]], sizes: tuple[int, ...] = (512, 1024, 2048, 4096),
                      repeats: int = 3, max_seconds: float = 1.0) -> float:
    """The best FLOP/s of square float32 matmuls over `sizes`; `matmul(n)` returns a function that
    runs one n x n product to completion. A size whose run would take over `max_seconds`
    (extrapolated from the previous size) is skipped, so start-up stays short on slow machines."""
    best, last = 0.0, None
    for n in sizes:
        if last is not None and last[1] * (n / last[0]) ** 3 > max_seconds:
            break
        run = matmul(n)
        run()  # compile / warm up
        fastest = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            run()
            fastest = min(fastest, time.perf_counter() - start)
        best, last = max(best, 2 * n ** 3 / fastest), (n, fastest)
    return best


def _jax_matmul(n: int) -> Callable[[], object]:
    a = jnp.ones((n, n), jnp.float32)
    product = jax.jit(lambda x: x @ x)
    return lambda: product(a).block_until_ready()


@functools.lru_cache(maxsize=None)
def measured_peak_flops() -> float:
    """A CPU's practical peak (there is no vendor figure): the best JAX float32 matmul, measured
    once per process."""
    return best_matmul_flops(_jax_matmul)


def peak_flops_per_device(override: float | None = None, device_kind: str | None = None) -> tuple[float, str]:
    """The peak used for MFU and where it came from: `override`, the spec-sheet table, or (CPUs,
    unknown accelerators) a measurement."""
    if override:
        return float(override), "configured"
    kind = device_kind or jax.devices()[0].device_kind
    by_kind = {k.lower(): v for k, v in PEAK_FLOPS.items()}
    if kind.lower() in by_kind:
        return by_kind[kind.lower()], f"{kind} spec sheet, bf16 dense"
    return measured_peak_flops(), f"best measured f32 matmul on {kind}"
