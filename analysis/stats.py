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
    difference in proportions for the paired-sample design", Statistics in Medicine 17:891–908): the one-stratum
    case of `stratified_tango_limits`."""
    return stratified_tango_limits(np.asarray(gains)[..., None], np.asarray(losses)[..., None], [n], [1.0], conf, steps)


def stratified_tango_limits(gains, losses, n, weights, conf: float = 0.95, steps: int = 60) -> tuple[np.ndarray, np.ndarray]:
    """The score interval for Σ_b w_b Δ_b, Δ_b = P(gain) − P(loss) in stratum b of n_b paired 0/1 items (strata on
    the last axis of `gains` and `losses`): the Δ where |Σ_b w_b (Δ̂_b − Δ)| <= z √(Σ_b w_b² (2q_b + Δ_b(1 − Δ_b)) / n_b),
    each stratum's variance Tango's at Δ_b = Δ̂_b + (Δ − Σ w Δ̂) / Σ w (every stratum's estimate shifted alike to meet
    the tested Δ) with q_b its maximum-likelihood P(loss) under Δ_b: a stratified score statistic with fixed weights
    (after Miettinen & Nurminen 1985, "Comparative analysis of two rates", Statistics in Medicine 4:213–226, there for
    independent proportions), its variance under the tested Δ so that a stratum with no changed item still counts
    (a t on the strata's sample variances treats it as exact: the compare table's Avg. covered 0.82 at 95% with
    50 + 200 items, 3% changing); the shift, not one common Δ in every stratum, keeps benches whose differences
    differ in sign covered. One stratum: Tango's interval. Z falls as Δ grows, so each limit is found by bisection
    between the estimate and -1 or +1."""
    from scipy.stats import norm

    b, c = np.asarray(gains, float), np.asarray(losses, float)
    n, w = np.broadcast_to(np.asarray(n, float), b.shape), np.broadcast_to(np.asarray(weights, float), b.shape)
    own = (b - c) / n
    z, est = norm.ppf((1 + conf) / 2), (w * own).sum(axis=-1)

    def inside(delta, sign):   # sign · (estimate − Δ) <= z · its standard deviation under Δ
        d = np.clip(own + ((delta - est) / w.sum(axis=-1))[..., None], -1.0, 1.0)
        v = (2 * n - b + c) * d - b - c
        q = (np.sqrt(np.maximum(v * v + 8 * n * c * d * (1 - d), 0.0)) - v) / (4 * n)
        return sign * (est - delta) <= z * np.sqrt(np.maximum((w * w * (2 * q + d * (1 - d)) / n).sum(axis=-1), 0.0))

    limits = []
    for sign in (1, -1):   # the lower limit lies in [-1, estimate], the upper one in [estimate, 1]
        out, into = np.broadcast_to(-sign * 1.0, est.shape).copy(), est
        for _ in range(steps):
            mid = (out + into) / 2
            ok = inside(mid, sign)
            out, into = np.where(ok, out, mid), np.where(ok, mid, into)
        limits.append(np.where(inside(out, sign), out, into))
    return limits[0], limits[1]
