"""What a run cost: FLOPs, device-hours, and estimated energy, CO2e and cloud price.

Strubell et al. (2019), "Energy and Policy Considerations for Deep Learning in NLP", section 2,
eq. 1: p_t = 1.58 t (p_c + p_r + g p_g) / 1000, the kWh of t hours of training with the average
power of all CPU sockets p_c, of all DRAM p_r and of each of g GPUs p_g (W), times the PUE 1.58;
then CO2e = 0.954 p_t (lbs). This module computes

    energy (kWh)  = PUE x hours x (hosts x (cpu_power_watts + dram_power_watts)
                                   + devices x device_power_watts) / 1000
    CO2e (kg)     = energy x grid intensity (kg CO2e per kWh)
    cloud cost    = price per device-hour x devices x hours

with wall-clock hours of the run (compilation, input pipeline and evaluation included: the
devices are held all along). Every power, the PUE, the grid intensity and the price are gin
settings (`cost.device_power_watts`, `cost.cpu_power_watts`, `cost.dram_power_watts`, `cost.pue`,
`cost.grid_kg_co2e_per_kwh`, `cost.price_per_device_hour`). Left None, a device's power and price
come from `DEVICES` by its JAX `device_kind`, and a host's CPU and DRAM power from Green
Algorithms' defaults (Lannelongue et al. 2021): 12 W per core at full use (its 'Any' CPU) and
0.3725 W per GB of memory, for this machine's cores and memory. Strubell measured p_c and p_r;
these are assumptions, high for a host whose CPUs mostly wait on an accelerator. On the CPU
backend the CPU is the host's (the device row's power is 0, so it is not counted twice).
Every figure is an estimate: measured power varies with load, and prices with region and time.

`CostMeter` keeps the cumulative totals of a run in `MODEL_DIR/cost.json` (rewritten at every
log, so a resumed run continues from what the earlier attempts spent, lost steps included) and
adds them to `metrics.jsonl` as `cost_*`.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time

import gin
import jax
from etils import epath

from t5lite import finite
from t5lite.errors import ConfigError
from t5lite.run_layout import RunDir

log = logging.getLogger("t5lite")

FORMULA = ("energy_kwh = pue * hours * (hosts * (cpu_power_watts + dram_power_watts) + devices * "
           "device_power_watts) / 1000; co2e_kg = energy_kwh * grid_kg_co2e_per_kwh; usd = price_per_device_hour * "
           "devices * hours (Strubell et al. 2019, eq. 1)")


@dataclasses.dataclass(frozen=True)
class Device:
    """Per JAX device (on TPU v2 and v3 a TensorCore, half a chip; from v4 on a chip)."""
    power_watts: float
    price_per_hour: float
    source: str


# Keys are lower-case prefixes of `jax.devices()[0].device_kind`; the longest match wins.
DEVICES = {
    "tpu v2": Device(221 / 2, 4.50 / 8,
                     "power: 221 W per chip, measured mean system power (Patterson et al. 2021, 'Carbon Emissions "
                     "and Large Neural Network Training', Table 4), 2 devices per chip; price: $4.50 per v2-8 "
                     "on-demand hour (Google Cloud TPU pricing, as used by Strubell et al. 2019), 8 devices"),
    "tpu v3": Device(283 / 2, 8.00 / 8,
                     "power: 283 W per chip (Patterson et al. 2021, Table 4), 2 devices per chip; price: $8.00 per "
                     "v3-8 on-demand hour (Google Cloud TPU pricing), 8 devices"),
    "tpu v4": Device(170.0, 3.22,
                     "power: 170 W mean per chip (Jouppi et al. 2023, 'TPU v4', ISCA); price: $3.22 per chip-hour "
                     "on-demand, us-central2 (Google Cloud TPU pricing)"),
    "tpu v5 lite": Device(200.0, 1.20,
                          "power: no published figure, 200 W per chip assumed; price: $1.20 per chip-hour on-demand "
                          "(Google Cloud TPU v5e pricing)"),
    "tpu v5e": Device(200.0, 1.20, "as 'tpu v5 lite' (the same chip)"),
    "tpu v6 lite": Device(300.0, 2.70,
                          "power: no published figure, 300 W per chip assumed; price: $2.70 per chip-hour on-demand "
                          "(Google Cloud TPU v6e pricing)"),
    "tpu v5": Device(300.0, 4.20,
                     "power: no published figure, 300 W per chip assumed; price: $4.20 per chip-hour on-demand "
                     "(Google Cloud TPU v5p pricing)"),
    "nvidia a100": Device(400.0, 2.93,
                          "power: 400 W TDP (NVIDIA A100 SXM4 datasheet); price: $2.93 per GPU-hour on-demand, "
                          "a2-highgpu-1g (Google Cloud GPU pricing)"),
    "nvidia h100": Device(700.0, 11.06,
                          "power: 700 W TDP (NVIDIA H100 SXM5 datasheet); price: $88.49 per a3-highgpu-8g hour "
                          "on-demand / 8 GPUs (Google Cloud GPU pricing)"),
    "cpu": Device(0.0, 0.0335 * (os.cpu_count() or 1),
                  "power: 0, the CPU is the host's (cost.cpu_power_watts); price: $0.0335 per vCPU-hour (Google "
                  "Cloud e2-standard on-demand), times this machine's cores"),
}
# Green Algorithms (Lannelongue, Grealey and Inouye 2021, "Green Algorithms: Quantifying the Carbon
# Footprint of Computation", Advanced Science): TDP per core of its 'Any' CPU, and memory power per GB.
CPU_WATTS_PER_CORE = 12.0
DRAM_WATTS_PER_GB = 0.3725
DEFAULT_PUE = 1.58            # Strubell et al. 2019 (Uptime Institute's 2018 industry average)
DEFAULT_GRID = 0.954 * 0.45359237  # Strubell et al. 2019: 0.954 lbs CO2e per kWh (U.S. EPA average), in kg


def lookup(device_kind: str) -> Device:
    """The table row for a JAX device kind (case-insensitive longest-prefix match); for an unknown
    accelerator a ConfigError asks for the gin settings."""
    kind = device_kind.lower()
    matches = [k for k in DEVICES if kind.startswith(k)]
    if not matches:
        raise ConfigError(f"no cost defaults for device kind {device_kind!r}: set cost.device_power_watts and "
                          "cost.price_per_device_hour")
    return DEVICES[max(matches, key=len)]


def host_cpu_watts() -> float:
    """This machine's CPU power by Green Algorithms' default: 12 W per core."""
    return CPU_WATTS_PER_CORE * (os.cpu_count() or 1)


def host_dram_watts() -> float:
    """This machine's memory power by Green Algorithms' default: 0.3725 W per GB (10^9 bytes)."""
    return DRAM_WATTS_PER_GB * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9


@dataclasses.dataclass(frozen=True)
class CostModel:
    device_kind: str
    devices: int
    device_power_watts: float
    pue: float
    grid_kg_co2e_per_kwh: float
    price_per_device_hour: float
    source: str
    cpu_power_watts: float = 0.0     # per host, all its sockets (Strubell's p_c)
    dram_power_watts: float = 0.0    # per host, all its memory (Strubell's p_r)
    hosts: int = 1

    def estimate(self, flops: float, seconds: float) -> dict[str, float]:
        """Strubell's eq. 1 for `seconds` of wall time on `devices` devices and `hosts` hosts."""
        hours = seconds / 3600
        device_hours = self.devices * hours
        watts = self.hosts * (self.cpu_power_watts + self.dram_power_watts) + self.devices * self.device_power_watts
        energy = self.pue * hours * watts / 1000
        return {"flops": float(flops), "device_hours": device_hours, "energy_kwh": energy,
                "co2e_kg": energy * self.grid_kg_co2e_per_kwh, "usd": device_hours * self.price_per_device_hour}


@gin.configurable("cost")
def cost_model(device_power_watts: float | None = None, pue: float = DEFAULT_PUE,
               grid_kg_co2e_per_kwh: float = DEFAULT_GRID, price_per_device_hour: float | None = None,
               device_kind: str | None = None, devices: int | None = None, cpu_power_watts: float | None = None,
               dram_power_watts: float | None = None) -> CostModel:
    """The settings of this run's estimate: given ones win, the rest come from `DEVICES` for the
    detected (or given) device kind (a kind without a row: 0, with a warning) and, for each host's
    CPU and memory, from Green Algorithms' defaults on this machine; `devices` defaults to all JAX
    devices of the run, the hosts are its processes."""
    kind = device_kind or jax.devices()[0].device_kind
    source = "configured"
    if device_power_watts is None or price_per_device_hour is None:
        try:
            row = lookup(kind)
        except ConfigError as e:   # a run never fails for want of a cost estimate
            log.warning("%s; its energy and price are reported as 0", e)
            row = Device(0.0, 0.0, str(e))
        device_power_watts = row.power_watts if device_power_watts is None else device_power_watts
        price_per_device_hour = row.price_per_hour if price_per_device_hour is None else price_per_device_hour
        source = row.source
    if cpu_power_watts is None or dram_power_watts is None:
        source += (f"; host: {CPU_WATTS_PER_CORE:g} W per core and {DRAM_WATTS_PER_GB:g} W per GB of memory "
                   "(Green Algorithms' defaults, Lannelongue et al. 2021)")
    cpu_power_watts = host_cpu_watts() if cpu_power_watts is None else cpu_power_watts
    dram_power_watts = host_dram_watts() if dram_power_watts is None else dram_power_watts
    for name, value in dict(device_power_watts=device_power_watts, cpu_power_watts=cpu_power_watts,
                            dram_power_watts=dram_power_watts, pue=pue, grid_kg_co2e_per_kwh=grid_kg_co2e_per_kwh,
                            price_per_device_hour=price_per_device_hour).items():
        if not 0 <= value < math.inf:   # NaN fails both
            raise ConfigError(f"cost.{name}={value}: must be a finite number >= 0")
    return CostModel(kind, devices or jax.device_count(), float(device_power_watts), float(pue),
                     float(grid_kg_co2e_per_kwh), float(price_per_device_hour), source, float(cpu_power_watts),
                     float(dram_power_watts), jax.process_count())


class CostMeter:
    """Cumulative cost of one run directory: what earlier attempts spent (from `cost.json`) plus
    this process's wall time since it started and the FLOPs it reports."""

    def __init__(self, model_dir: str | None, model: CostModel | None = None):
        self.model = model or cost_model()
        self.path = str(RunDir(model_dir).cost) if model_dir else None
        self.start = time.perf_counter()
        self.base_flops = self.base_seconds = 0.0
        if self.path and epath.Path(self.path).exists():
            earlier = json.loads(epath.Path(self.path).read_text(encoding="utf-8"))
            self.base_flops, self.base_seconds = float(earlier["flops"]), float(earlier["seconds"])
        self.flops = 0.0

    def add_flops(self, flops: float) -> None:
        self.flops += flops

    def totals(self) -> dict[str, float]:
        seconds = self.base_seconds + time.perf_counter() - self.start
        return {**self.model.estimate(self.base_flops + self.flops, seconds), "seconds": seconds}

    def metrics(self) -> dict[str, float]:
        """The cumulative totals as `metrics.jsonl` fields (`cost_*`)."""
        return {f"cost_{k}": v for k, v in self.totals().items()}

    def write(self, step: int | None = None, totals: dict[str, float] | None = None, folder: str | None = None) -> dict:
        """Writes `cost.json` (first host only; in `folder` when given, else the run directory's)
        and returns its record."""
        record = {**(totals or self.totals()), **({"step": step} if step is not None else {}),
                  **{k: v for k, v in dataclasses.asdict(self.model).items()}, "formula": FORMULA}
        path = RunDir(folder).cost if folder else self.path   # another folder (an evaluation's) has it as a run does
        if path and jax.process_index() == 0:
            epath.Path(path).write_text(finite.dumps(record, indent=1), encoding="utf-8")
        return record


def summary(totals: dict[str, float]) -> str:
    """One line for logs: FLOPs (when counted), device-hours, kWh, kg CO2e, USD."""
    flops = f"{totals['flops']:.3g} FLOPs, " if totals["flops"] else ""
    return (f"{flops}{totals['device_hours']:.3g} device-hours, {totals['energy_kwh']:.3g} kWh, "
            f"{totals['co2e_kg']:.3g} kg CO2e, ${totals['usd']:.3g}")
