"""Strubell et al.'s table for t5lite's presets: estimated FLOPs, hours, energy, CO2e and cloud cost
of each preset's published pre-training recipe, on a chosen accelerator at an assumed MFU.

FLOPs come from t5lite.models.flops (forward + backward, per example, times batch and steps); hours
= FLOPs / (devices x spec-sheet peak x MFU); energy, CO2e and cost from t5lite.train.cost
(Strubell's formula with the device's defaults; the accelerators only, as the hosts of a recipe
are unknown: their CPU and DRAM power are 0). Nothing is measured: it is the formula applied.
    python benchmarks/cost_table.py [--device "TPU v3"] [--devices 8] [--mfu 0.4]
"""
from __future__ import annotations

import argparse

from t5lite.models import flops, get_config
from t5lite.train import cost, mfu

# preset: (recipe, encoder length, decoder length, batch, steps)
RECIPES = {
    "t5_small": ("T5 baseline: span corruption, 2^19 steps x 128 x 512 (Raffel et al. 2020)", 512, 114, 128, 2 ** 19),
    "t5_base": ("T5 baseline recipe", 512, 114, 128, 2 ** 19),
    "t5_large": ("T5 baseline recipe", 512, 114, 128, 2 ** 19),
    "bert_base": ("BERT: 1M steps x 256 x 512 (Devlin et al. 2019; all at 512, an upper bound)", 512, 0, 256, 10 ** 6),
    "bert_large": ("BERT recipe", 512, 0, 256, 10 ** 6),
    "gpt2_small": ("nanoGPT's GPT-2 reproduction: 600k steps x 480 x 1024", 0, 1024, 480, 600_000),
    "minilm_l6_h384": ("configs/local/minilm_finetune_sst2.gin: 100 steps x 8 x 64", 64, 0, 8, 100),
}


def rows(device_kind: str, devices: int, utilisation: float) -> list[dict]:
    model = cost.cost_model(device_kind=device_kind, devices=devices, cpu_power_watts=0.0, dram_power_watts=0.0)
    peak = mfu.peak_flops_per_device(device_kind=device_kind)[0]
    out = []
    for preset, (recipe, enc, dec, batch, steps) in RECIPES.items():
        total = steps * batch * flops.train_flops_per_example(get_config(preset), enc, dec)
        seconds = total / (devices * peak * utilisation)
        out.append({"preset": preset, "recipe": recipe, **model.estimate(total, seconds), "hours": seconds / 3600})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="TPU v3", help="a device kind of t5lite.train.cost.DEVICES")
    parser.add_argument("--devices", type=int, default=8, help="JAX devices (TPU v3-8: 8 TensorCores)")
    parser.add_argument("--mfu", type=float, default=0.4, help="assumed model FLOPs utilisation")
    args = parser.parse_args()
    print(f"{args.devices} x {args.device}, MFU {args.mfu:.0%}, PUE {cost.DEFAULT_PUE}, "
          f"{cost.DEFAULT_GRID:.4f} kg CO2e/kWh\n")
    print("| preset | recipe | FLOPs | hours | device-hours | kWh | kg CO2e | cloud cost (USD) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows(args.device, args.devices, args.mfu):
        print(f"| `{r['preset']}` | {r['recipe']} | {r['flops']:.2e} | {r['hours']:.3g} | {r['device_hours']:.3g} | "
              f"{r['energy_kwh']:.3g} | {r['co2e_kg']:.3g} | {r['usd']:.3g} |")


if __name__ == "__main__":
    main()
