"""Interval primitives: t quantiles and t-intervals (scipy.stats), and the pre/post table's paired result with
Tango's score interval for a difference of paired proportions (the pre/post table's interval for 0/1 scores).

The report's other intervals (curves, bands, arm vs anchor, arm vs arm, pre vs post of other values) come from
analysis.variance, the one crossed items × seeds model.
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
    method: str = "paired t"  # "paired t" | "Tango score" (0/1 values) | "exact" (no difference varies)


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


def tango_limits(gains, losses, n: int, conf: float = 0.95, steps: int = 60) -> tuple[np.ndarray, np.ndarray]:
    """Tango's score interval for Δ = P(gain) − P(loss) of n paired 0/1 items, `gains` of them 0 -> 1 and `losses`
    1 -> 0 (any array shape): the Δ where |Z(Δ)| <= z_{(1+conf)/2}, Z(Δ) = (gains − losses − nΔ) / √(n(2q + Δ(1 − Δ)))
    with q the maximum-likelihood P(loss) under Δ (Tango 1998, "Equivalence test and confidence interval for the
    difference in proportions for the paired-sample design", Statistics in Medicine 17:891–908).
    Z falls as Δ grows, so each limit is found by bisection between the estimate and -1 or +1."""
    from scipy.stats import norm

    b, c = np.asarray(gains, float), np.asarray(losses, float)
    z = norm.ppf((1 + conf) / 2)

    def inside(delta, sign):   # sign · (score numerator) <= z · its standard deviation under Δ
        w = (2 * n - b + c) * delta - b - c
        q = (np.sqrt(np.maximum(w * w + 8 * n * c * delta * (1 - delta), 0.0)) - w) / (4 * n)
        return sign * (b - c - n * delta) <= z * np.sqrt(np.maximum(n * (2 * q + delta * (1 - delta)), 0.0))

    limits = []
    for sign in (1, -1):   # the lower limit lies in [-1, estimate], the upper one in [estimate, 1]
        out, into = np.broadcast_to(-sign * 1.0, b.shape).copy(), (b - c) / n
        for _ in range(steps):
            mid = (out + into) / 2
            ok = inside(mid, sign)
            out, into = np.where(ok, out, mid), np.where(ok, mid, into)
        limits.append(np.where(inside(out, sign), out, into))
    return limits[0], limits[1]
