"""Statistics over seeds: the mean with its 95% t-interval, and a paired t-test between two rows
(seed i of one row against seed i of the other: same data order, same initialisation seed)."""
from __future__ import annotations

import math

import numpy as np


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


def verdict(difference: float, p_value: float, alpha: float = 0.05) -> str:
    """'reproduced' (better row ahead, p < alpha), 'not reproduced' (behind, p < alpha), else
    'inconclusive at this size'."""
    if math.isnan(p_value) or p_value >= alpha:
        return "inconclusive at this size"
    return "reproduced" if difference > 0 else "not reproduced"
