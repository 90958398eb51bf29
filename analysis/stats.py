"""Uncertainty for the transfer curves and tables: t-intervals across seeds, bootstraps over examples.

- Across seeds (>= 2): a Student-t interval on the seed means (seeds are the unit of replication).
- One seed: a percentile bootstrap over the bench's examples (the only variance left to show).
- Arm vs anchor: a paired bootstrap over the same example ids (the per-example difference is resampled,
  so the example difficulty that both share cancels out).

All bootstraps are seeded and vectorized (one index matrix per chunk), so results are reproducible
and fast at 500 examples × 10k resamples. Quantiles come from scipy.stats.

- Simultaneous bands across the steps of a curve (`simultaneous_band`): one seed, a max-statistic
  bootstrap (items resampled once per replicate for every step, the 95% quantile of the largest
  studentized deviation over steps sets one critical value for all of them); several seeds, the
  per-step t interval at the Bonferroni level 1 − α/(2K) over K steps (too few seeds to bootstrap).
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


@dataclass(frozen=True)
class Band:
    """A band over the K steps of a curve: per-step means and limits, and the critical value used."""

    mean: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    critical: float
    method: str  # "max-t bootstrap" | "bonferroni t"


def resample_weights(n_items: int, n_boot: int, seed: int) -> np.ndarray:
    """(n_boot, n_items) multinomial counts: replicate b takes item i `w[b, i]` times (seeded)."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(n_items, np.full(n_items, 1.0 / n_items), size=n_boot).astype(float)


def max_t_critical(scores: np.ndarray, weights: np.ndarray, conf: float = 0.95) -> np.ndarray:
    """The max-statistic critical value of each study in `scores` (..., items, steps) under the bootstrap
    replicates `weights` (B, items): the `conf` quantile over replicates of max over steps of
    |θ*ₖ − θ̂ₖ| / sd*ₖ (steps whose replicates do not vary are left out of the max). Vectorized over the
    leading axes, so a simulation of thousands of studies is one einsum."""
    scores = np.asarray(scores, dtype=float)
    n = scores.shape[-2]
    theta = scores.mean(axis=-2)                                        # (..., K)
    boot = np.moveaxis(np.tensordot(weights, scores, axes=([1], [-2])), 0, -2) / n   # (..., B, K), one BLAS call
    sd = boot.std(axis=-2, ddof=1)                                      # (..., K)
    dev = np.abs(boot - theta[..., None, :])
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(sd[..., None, :] > 0, dev / sd[..., None, :], 0.0)
    return np.quantile(z.max(axis=-1), conf, axis=-1), sd


def simultaneous_band(scores, n_boot: int = 2000, seed: int = 0, conf: float = 0.95) -> Band:
    """One seed: the max-t bootstrap band over the steps of `scores` (items × steps, the same items at
    every step): θ̂ₖ ± c·sd*ₖ, c the `conf` quantile of the largest studentized deviation over steps."""
    x = np.asarray(scores, dtype=float)
    if x.ndim != 2 or x.shape[0] < 2 or not np.isfinite(x).all():
        raise ValueError(f"simultaneous_band needs a finite items × steps array with >= 2 items, got shape {x.shape}")
    crit, sd = max_t_critical(x, resample_weights(x.shape[0], n_boot, seed), conf)
    mean = x.mean(axis=0)
    return Band(mean, mean - crit * sd, mean + crit * sd, float(crit), "max-t bootstrap")


def bonferroni_band(seed_values, conf: float = 0.95) -> Band:
    """Several seeds: per step the t interval across seeds at level 1 − (1 − conf)/K (`seed_values`:
    seeds × steps)."""
    x = np.asarray(seed_values, dtype=float)
    if x.ndim != 2 or x.shape[0] < 2:
        raise ValueError(f"bonferroni_band needs seeds × steps with >= 2 seeds, got shape {x.shape}")
    k = x.shape[1]
    crit = t_quantile(1 - (1 - conf) / (2 * k), x.shape[0] - 1)
    mean = x.mean(axis=0)
    half = crit * x.std(axis=0, ddof=1) / math.sqrt(x.shape[0])
    return Band(mean, mean - half, mean + half, float(crit), "bonferroni t")
