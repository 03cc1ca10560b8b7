"""XLA:CPU options t5lite turns on by default, set before JAX creates its CPU backend.

`--xla_cpu_use_xnnpack=true` runs XLA:CPU's dots through XNNPACK. With other jobs on the 2 AVX2
cores here it made the t5_small train step 31% faster (34.6 -> 23.7 s); on the idle machine it
changed nothing beyond noise (11.4 vs 11.7 s), so it is on for what it gains on a busy CPU
(README "Training speed"). The options only touch the
CPU compiler (TPU and GPU backends ignore them), never override an option the user already put
in XLA_FLAGS, and are skipped with T5LITE_NO_XLA_CPU_DEFAULTS=1 or once a backend exists (XLA
reads XLA_FLAGS once, when the first backend is created).
"""
from __future__ import annotations

import os
import sys

CPU_DEFAULTS = {"xla_cpu_use_xnnpack": "true"}
OPT_OUT = "T5LITE_NO_XLA_CPU_DEFAULTS"


def with_cpu_defaults(xla_flags: str) -> str:
    """`xla_flags` plus every default whose option it does not already set."""
    missing = [f"--{name}={value}" for name, value in CPU_DEFAULTS.items() if f"--{name}" not in xla_flags]
    return " ".join([xla_flags.strip(), *missing]).strip()


def _backend_exists() -> bool:
    xla_bridge = sys.modules.get("jax._src.xla_bridge")
    return bool(xla_bridge is not None and getattr(xla_bridge, "_backends", None))


def apply_cpu_defaults() -> None:
    if os.environ.get(OPT_OUT) == "1" or _backend_exists():
        return
    os.environ["XLA_FLAGS"] = with_cpu_defaults(os.environ.get("XLA_FLAGS", ""))
