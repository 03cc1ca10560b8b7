"""An iso-FLOP scaling pilot's arithmetic and figure: model sizes trained on one FLOP budget each,
their held-out losses against their parameter counts, and the size a parabola in log(parameters)
puts the least loss at (Hoffmann et al. 2022's "approach 2": for each budget, fit a parabola to the
iso-FLOP profile and take its minimum as the compute-optimal size)."""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from t5lite import plotting


def steps_for_budget(budget_flops: float, flops_per_step: float) -> int:
    """The steps that spend `budget_flops` at `flops_per_step` (the trainer's count), at least 1."""
    if not budget_flops > 0 or not flops_per_step > 0:
        raise ValueError(f"a FLOP budget and FLOPs per step must be > 0, not {budget_flops} and {flops_per_step}")
    return max(1, round(budget_flops / flops_per_step))


def optimum(params: Sequence[float], losses: Sequence[float]) -> dict:
    """The least-squares parabola loss = a (ln N)^2 + b ln N + c through the (N, loss) points and the
    N at its vertex, with whether the vertex is a minimum inside the sizes tried (else the optimum
    lies beyond them: try larger or smaller ones)."""
    if len(params) < 3:
        raise ValueError(f"a parabola needs 3 or more sizes, not {len(params)}")
    x = np.log(np.asarray(params, float))
    a, b, c = np.polyfit(x, np.asarray(losses, float), 2)
    vertex = -b / (2 * a) if a != 0 else math.nan
    inside = bool(a > 0 and x.min() <= vertex <= x.max())
    return {"coefficients": [float(a), float(b), float(c)], "best_params": float(np.exp(vertex)) if a > 0 else None,
            "best_loss": float(a * vertex ** 2 + b * vertex + c) if a > 0 else None, "inside": inside}


def plot(rows: Sequence[Mapping], fit: dict, path: str, title: str, metric: str = "held-out MLM loss") -> None:
    """Each size's loss against its parameters (log scale; every seed a point, the mean ringed and
    named), the fitted parabola, and its minimum."""
    plt = plotting.pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for row in rows:
        ax.scatter([row["params"]] * len(row["losses"]), row["losses"], color="C0", s=12, alpha=0.6)
        mean = float(np.mean(row["losses"]))
        ax.scatter(row["params"], mean, facecolors="none", edgecolors="C0", s=60)
        ax.annotate(row["size"], (row["params"], mean), textcoords="offset points", xytext=(6, 6), fontsize=9)
    sizes = np.array([r["params"] for r in rows], float)
    grid = np.exp(np.linspace(np.log(sizes.min()), np.log(sizes.max()), 100))
    ax.plot(grid, np.polyval(fit["coefficients"], np.log(grid)), color="C1", linewidth=1, label="parabola in log N")
    if fit["inside"]:
        ax.axvline(fit["best_params"], color="C1", linestyle=":", linewidth=1,
                   label=f"least loss at {plotting.plain_number(fit['best_params'] / 1e6)}M parameters")
    ax.set_xscale("log")
    ax.margins(x=0.12)   # room for the outer sizes' names
    ax.set(xlabel="parameters (log scale)", ylabel=metric, title=title)
    ax.title.set_fontsize(10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    plotting.plain_ticks(ax)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
