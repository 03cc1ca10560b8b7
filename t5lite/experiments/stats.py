"""Statistics over seeds: the mean with its 95% t-interval, paired comparisons between two rows
(seed i of one row against seed i of the other: same data order, same initialisation seed), the
constant-prediction baseline a task's score must clear, an equivalence test (TOST), and the seeds a
paired t-test needs to detect a given difference (its power, from the noncentral t)."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

ALPHA = 0.05        # every test's level
POWER = 0.8         # the power the seed counts are sized for
MAX_SEEDS = 10_000  # beyond this a seed count is "more than"


def t_interval(values, confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high); with one value the interval is that value (no spread to estimate)."""
    from scipy import stats
    x = np.asarray(values, dtype=np.float64)
    mean = float(x.mean())
    if len(x) < 2:
        return mean, mean, mean
    half = float(stats.t.ppf(0.5 + confidence / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return mean, mean - half, mean + half


def paired_t_test(a, b) -> tuple[float, float]:
    """(mean of a - b, two-sided p-value); p is nan with fewer than 2 pairs or no spread."""
    from scipy import stats
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    if len(d) < 2 or d.std(ddof=1) == 0:
        return float(d.mean()) if len(d) else math.nan, math.nan
    t = d.mean() / (d.std(ddof=1) / math.sqrt(len(d)))
    return float(d.mean()), float(2 * stats.t.sf(abs(t), len(d) - 1))


def constant_baseline(score: Callable[[Sequence, Sequence], float], labels: Sequence) -> float:
    """The best `score(labels, predictions)` of a prediction that is one label everywhere: what a
    model that learned only the label distribution gets (accuracy: the majority class's share; F1:
    predicting the positive class everywhere). An undefined score (the correlation of a constant)
    counts as 0: a constant correlates with nothing."""
    scores = (score(labels, [label] * len(labels)) for label in sorted(set(labels)))
    return max(0.0 if math.isnan(s) else s for s in scores)


def at_chance(low: float, baseline: float | None) -> bool:
    """Whether a cell's seed interval (its lower end `low`) reaches its task's baseline: the seeds
    cannot tell the cell from a constant prediction (an interval wholly below it is at chance too)."""
    return baseline is not None and not math.isnan(low) and low <= baseline


def tost_paired(a, b, margin: float) -> float:
    """The p-value of the paired two one-sided tests that the mean of a - b lies within
    (-margin, margin): the larger of the two one-sided p-values; nan with fewer than 2 pairs."""
    from scipy import stats
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    if len(d) < 2:
        return math.nan
    se = d.std(ddof=1) / math.sqrt(len(d))
    if se == 0:
        return 0.0 if abs(d.mean()) < margin else 1.0
    above_low = stats.t.sf((d.mean() + margin) / se, len(d) - 1)
    below_high = stats.t.cdf((d.mean() - margin) / se, len(d) - 1)
    return float(max(above_low, below_high))


def t_test_power(effect: float, n: int, alpha: float = ALPHA, alternative: str = "two-sided") -> float:
    """The chance a paired (one-sample) t-test over n pairs at level alpha rejects when the true
    mean is `effect` standard deviations from zero: the noncentral t with n - 1 degrees of freedom
    and noncentrality effect * sqrt(n) beyond the critical value(s)."""
    from scipy import stats
    df, nc = n - 1, effect * math.sqrt(n)
    if alternative == "larger":
        critical = stats.t.ppf(1 - alpha, df)
        power = stats.nct.sf(critical, df, nc)
    else:
        critical = stats.t.ppf(1 - alpha / 2, df)
        power = stats.nct.sf(critical, df, nc) + stats.nct.cdf(-critical, df, nc)
    if math.isfinite(power):
        return float(power)
    return _power_by_integration(critical, df, nc, two_sided=alternative != "larger")


def _power_by_integration(critical: float, df: int, nc: float, two_sided: bool) -> float:
    """The same power from the noncentral t's definition, T = (Z + nc) / sqrt(V / df) with V
    chi-squared: P(T > c) = E_V[P(Z > c sqrt(V / df) - nc)], for the large noncentralities where
    scipy's nct gives nan."""
    from scipy import integrate, stats

    def rejects(v):
        scaled = critical * math.sqrt(v / df)
        tail = stats.norm.sf(scaled - nc)
        return (tail + stats.norm.cdf(-scaled - nc) if two_sided else tail) * stats.chi2.pdf(v, df)
    return float(min(1.0, integrate.quad(rejects, 0, math.inf, limit=200)[0]))


def seeds_needed(effect: float, sd: float, alpha: float = ALPHA, power: float = POWER,
                 alternative: str = "two-sided") -> int | None:
    """The fewest seeds (pairs, at least 2) whose paired t-test detects a true difference `effect`
    with probability `power`, paired differences spreading by `sd`; None when not even MAX_SEEDS do
    (no effect, or no spread measured yet)."""
    if not (math.isfinite(effect) and math.isfinite(sd)) or effect == 0:
        return None
    if sd == 0:
        return 2
    d = abs(effect) / sd
    high = 2   # doubled until its power suffices (scipy's noncentral t is exact there, not far beyond)
    while not t_test_power(d, high, alpha, alternative) >= power:   # nan: not enough
        if high >= MAX_SEEDS:
            return None
        high = min(2 * high, MAX_SEEDS)
    low = max(high // 2, 1)   # power(low) < power <= power(high): it grows with n
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if t_test_power(d, middle, alpha, alternative) >= power else (middle, high)
    return max(high, 2)


def equivalence_seeds_needed(margin: float, sd: float, alpha: float = ALPHA, power: float = POWER) -> int | None:
    """Seeds for the TOST to show equivalence within ±margin with probability at least `power` when
    the true difference is 0: each one-sided test at level alpha gets power 1 - (1 - power) / 2, so
    both pass at least `power` of the time (a conservative count)."""
    return seeds_needed(margin, sd, alpha, 1 - (1 - power) / 2, alternative="larger")


def difference_verdict(low: float, high: float, direction: int, needed: int | None, seeds: int) -> str:
    """A claim that one row beats the other: 'reproduced' when the interval [low, high] of the
    paired difference (better - worse) excludes 0 on the claim's side (direction +1: higher is
    better, -1: lower is), 'contradicted' when it excludes 0 on the other, else undecided."""
    if low > 0 or high < 0:
        return "reproduced" if (low > 0) == (direction > 0) else "contradicted"
    return undecided(needed, seeds)


def equivalence_verdict(p_value: float, low: float, high: float, margin: float, needed: int | None, seeds: int) -> str:
    """A claim that two rows are on par: 'reproduced' when the TOST shows the difference within
    ±margin (p < ALPHA), 'contradicted' when its (1 - 2 ALPHA) interval [low, high] lies wholly
    outside ±margin, else undecided."""
    if p_value < ALPHA:
        return "reproduced"
    if low >= margin or high <= -margin:
        return "contradicted"
    return undecided(needed, seeds)


def undecided(needed: int | None, seeds: int) -> str:
    """What an undecided comparison lacks: seeds to measure a spread, or the seed count its power
    analysis asks for."""
    if seeds < 2:
        return "undecided: needs 2 seeds or more"
    if needed is None:
        return f"undecided: needs more than {MAX_SEEDS} seeds"
    if needed <= seeds:
        return f"undecided: the difference is smaller than the effect {needed} seeds detect"
    return f"undecided: needs {needed} seeds"
