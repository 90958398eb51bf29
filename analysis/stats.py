"""Interval primitives: t quantiles and t-intervals (scipy.stats), and the pre/post table's paired result.

The report's own intervals (curves, bands, arm vs anchor, arm vs arm, pre vs post) come from analysis.variance,
the one crossed items × seeds model.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Interval:
    mean: float
    lo: float
    hi: float
    n: int  # seeds
    method: str  # "t" | "point"


@dataclass(frozen=True)
class PairedResult:
    delta: float  # mean(a - b) over the paired examples
    lo: float
    hi: float
    n: int  # paired examples


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with `df` degrees of freedom (scipy.stats.t)."""
    if not 0 < p < 1 or df <= 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    from scipy.stats import t

    return float(t.ppf(p, df))


def _clean(values) -> np.ndarray:
    x = np.asarray(values, dtype=float).ravel()
    return x[np.isfinite(x)]


def t_interval(values, conf: float = 0.95) -> Interval:
    """Mean ± t_{(1+conf)/2, n-1} · s/√n over finite values; a point (lo = hi = mean) for n = 1."""
    x = _clean(values)
    if x.size == 0:
        return Interval(math.nan, math.nan, math.nan, 0, "point")
    mean = float(x.mean())
    if x.size == 1:
        return Interval(mean, mean, mean, 1, "point")
    half = t_quantile((1 + conf) / 2, x.size - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return Interval(mean, mean - half, mean + half, int(x.size), "t")
