"""Interval primitives: t quantiles and t-intervals, seeded bootstraps over examples, the paired bootstrap.

All bootstraps are seeded and vectorized (one index matrix per chunk), so results are reproducible
and fast at 500 examples × 10k resamples. Quantiles come from scipy.stats.

The report's own intervals (curves, bands, arm vs anchor, arm vs arm) come from analysis.variance, the one
crossed items × seeds model; these primitives remain for the pre/post table and the tests.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# Resamples are drawn in chunks so the index matrix stays under ~32 MB whatever n is.
_MAX_CELLS = 4_000_000


@dataclass(frozen=True)
class Interval:
    mean: float
    lo: float
    hi: float
    n: int  # seeds (t) or examples (bootstrap)
    method: str  # "t" | "bootstrap" | "point"


@dataclass(frozen=True)
class PairedResult:
    delta: float  # mean(a - b) over the paired examples
    lo: float
    hi: float
    n: int  # paired examples
    p_le_zero: float  # fraction of bootstrap deltas <= 0 (one-sided evidence that a does not beat b)


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


def bootstrap_means(values, n_boot: int = 2000, seed: int = 0) -> np.ndarray:
    """`n_boot` means of with-replacement resamples of `values` (seeded, vectorized in chunks)."""
    x = _clean(values)
    if x.size == 0:
        raise ValueError("bootstrap over zero values")
    rng = np.random.default_rng(seed)
    per_chunk = max(1, _MAX_CELLS // x.size)
    out = np.empty(n_boot)
    for start in range(0, n_boot, per_chunk):
        stop = min(n_boot, start + per_chunk)
        idx = rng.integers(0, x.size, size=(stop - start, x.size))
        out[start:stop] = x[idx].mean(axis=1)
    return out


def percentile_limits(boot: np.ndarray, conf: float) -> tuple[float, float]:
    """The percentile interval's limits (lo, hi) at confidence `conf` of bootstrap draws `boot`."""
    alpha = (1 - conf) / 2
    lo, hi = np.quantile(boot, [alpha, 1 - alpha])
    return float(lo), float(hi)


def paired_bootstrap(a, b, n_boot: int = 2000, seed: int = 0, conf: float = 0.95) -> PairedResult:
    """Mean of a − b over paired examples with a percentile bootstrap CI (a[i] and b[i] are the same example)."""
    a = np.asarray(a, dtype=float).ravel()
    b = np.asarray(b, dtype=float).ravel()
    if a.shape != b.shape:
        raise ValueError(f"paired bootstrap needs equal lengths, got {a.size} and {b.size}")
    d = a - b
    d = d[np.isfinite(d)]
    if d.size == 0:
        return PairedResult(math.nan, math.nan, math.nan, 0, math.nan)
    boot = bootstrap_means(d, n_boot, seed)
    lo, hi = percentile_limits(boot, conf)
    return PairedResult(float(d.mean()), lo, hi, int(d.size), float((boot <= 0).mean()))
