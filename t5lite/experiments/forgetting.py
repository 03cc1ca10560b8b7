"""The forgetting frontier: per fine-tuning method, how much it forgot of its base's pre-training
task (the held-out loss increase `t5lite eval --forgetting` reports) against how well it fits its
task (dev accuracy), as seed means with 95% t-intervals, and which methods no other beats on both."""
from __future__ import annotations

from typing import Mapping, Sequence

from t5lite import plotting
from t5lite.experiments.stats import t_interval


def summarize(runs: Mapping[str, Sequence[tuple[float, float]]]) -> dict[str, dict]:
    """{method: {forgetting, accuracy: (mean, low, high), seeds, on_frontier}} from each method's
    (forgetting, accuracy) per seed. On the frontier: no other method's means forget no more and fit
    no worse, one of them strictly."""
    out = {m: {"forgetting": t_interval([f for f, _ in pairs]), "accuracy": t_interval([a for _, a in pairs]),
               "seeds": len(pairs)} for m, pairs in runs.items()}
    for m, row in out.items():
        f, a = row["forgetting"][0], row["accuracy"][0]
        row["on_frontier"] = not any(o["forgetting"][0] <= f and o["accuracy"][0] >= a
                                     and (o["forgetting"][0] < f or o["accuracy"][0] > a)
                                     for n, o in out.items() if n != m)
    return out


def plot(summary: Mapping[str, dict], path: str, title: str, loss_name: str = "increase of the base's held-out MLM loss",
         fit_name: str = "task dev accuracy, %", fit_range: tuple[float, float] = (0.0, 100.0)) -> None:
    """One point per method with its intervals (the fit's clipped to `fit_range`); the frontier joined
    by a line."""
    plt = plotting.pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for row in summary.values():
        (f, fl, fh), (a, al, ah) = row["forgetting"], row["accuracy"]
        al, ah = max(al, fit_range[0]), min(ah, fit_range[1])   # the fit's interval within what it can take
        ax.errorbar(f, a, xerr=[[f - fl], [fh - f]], yerr=[[a - al], [ah - a]], fmt="o", capsize=3,
                    color="C0" if row["on_frontier"] else "C7", zorder=3 if row["on_frontier"] else 2)
    # Labels of points that look alike at the axes' scale (set by the intervals) are stacked, not overprinted.
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    placed = []
    for name, row in summary.items():
        f, a = row["forgetting"][0], row["accuracy"][0]
        stacked = sum(abs(f - pf) < 0.08 * (x1 - x0) and abs(a - pa) < 0.04 * (y1 - y0) for pf, pa in placed)
        placed.append((f, a))
        ax.annotate(name, (f, a), textcoords="offset points", xytext=(6, 4 + 11 * stacked), fontsize=9)
    front = sorted((r["forgetting"][0], r["accuracy"][0]) for r in summary.values() if r["on_frontier"])
    if len(front) > 1:
        ax.plot(*zip(*front), color="C0", linewidth=1, zorder=0, label="frontier")
        ax.legend(loc="lower right")
    ax.set_xlabel(f"forgetting: {loss_name}")
    ax.set_ylabel(f"{fit_name} (95% t-interval within [{fit_range[0]:g}, {fit_range[1]:g}])")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    plotting.plain_ticks(ax)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
