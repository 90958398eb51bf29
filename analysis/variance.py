"""One variance model for every interval the report prints (docs/stages/analyze.md, "What the intervals mean").

The design is crossed: the same items are scored by every seed of every arm; seeds are drawn independently
per arm; the anchor (greedy decoding of the base model) has no seed. A score is modelled as

    y[arm, item, seed] = mu[arm] + a[arm, item] + b[arm, seed] + e[arm, item, seed]

with items and seeds both random. The estimand of an interval is a linear contrast of arm means over the
item *population* and the seed *population* (one arm: its expected score; arm − anchor; arm − arm), and
its estimate the same contrast of the observed grand means. Its variance, in the mean squares of each
arm's two-way (items × seeds) layout (Searle, Casella & McCulloch 1992, "Variance Components", ch. 4), is

    V = Σ_b w_b² s²(d_b) / n_b  +  Σ_k c_k² s²(Y_k) / S_k

d_b[i] = Σ_k c_k · (arm k's mean of item i over its seeds) in bench b (weight w_b of a stratified mean;
one bench otherwise); Y_k[s] = arm k's weighted mean of seed s, S_k its seeds. The first term's
expectation is the item variance plus the residual over S_k, the second's the seed variance plus the
residual over n·S_k: the residual enters twice (MS_res/(n·S), small for hundreds of items), which keeps
every coefficient positive. The unbiased combination subtracts MS_res, and Satterthwaite's df is a poor
approximation with a negative coefficient (Gaylor & Hopper 1969, Technometrics 11:691–706): in the
simulation study it covered 0.93–0.94 where this one covers 0.94–0.95. The interval is
estimate ± t_{df} · √V with df from Satterthwaite (1946, "An approximate distribution of estimates of
variance components", Biometrics Bulletin 2:110–114): df = V² / Σ (term² / its df), df n_b − 1 per item
term and S_k − 1 per seed term.

An arm with one seed cannot show its seed variance: the interval then covers the items only (`covers` =
"items", the report says seed variance is unknown). For the score of one arm that is 0/1 per item, the
interval is Wilson's score interval on the effective sample size p̂(1 − p̂)/V̂ (Korn & Graubard 1998,
"Confidence intervals for proportions with small expected number of positive counts estimated from
survey data", Survey Methodology 24:193–201), so it keeps its coverage near 0 and 1 where the t interval
collapses (at p̂ = 0 it is n items' Wilson interval). One seed of an arm against the anchor, or against one
seed of another arm, on 0/1 scores (each item gained, lost or unchanged) gets Tango's score interval for
paired proportions instead of the t (`discordant_limits`; the t over few changed items covered 0.87 at 95%
in simulation); so do an arm's seeds that agree on every item, counted as one seed. Over strata (the compare
table's Avg. of benches) the same contrast gets the stratified score interval (`discordant_limits` with weights;
the t covered as little as 0.82 there). A band over K steps takes
each step's interval at the Bonferroni level 1 − α/K (α/(2K) in each tail).

Every function takes arrays with any leading (replicate) axes, so bench/bench_coverage.py and the tests
run thousands of simulated studies in one call.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

COVERS_BOTH = "items+seeds"
COVERS_ITEMS = "items"
COVERS_SEEDS = "seeds"   # a t across seed means when no per-item file exists: the items taken as fixed
COVERS_NONE = "none"     # a bare point


@dataclass(frozen=True)
class Term:
    """One arm's scores in one stratum: `scores` (..., items, seeds), items aligned across the terms of a
    stratum; `key` names the arm (its seeds are the same seeds in every stratum); `random_seeds=False`
    for the anchor (one column, no seed variance)."""

    key: str
    coef: float
    scores: np.ndarray
    random_seeds: bool = True


@dataclass(frozen=True)
class Estimate:
    """A contrast's estimate and interval under the crossed model, with what it covers."""

    mean: float
    lo: float
    hi: float
    se: float
    df: float
    n_items: int
    n_seeds: str      # seeds per random arm, e.g. "3" or "3/2" (A/B), "" for none
    covers: str       # COVERS_BOTH | COVERS_ITEMS | COVERS_SEEDS | COVERS_NONE
    method: str       # "crossed t" | "crossed wilson" | "(stratified) Tango score" | "exact discordant" | "seed t" | "point"
    note: str = ""    # e.g. "seed variance unknown (one seed)"

    @property
    def delta(self) -> float:
        return self.mean

    @property
    def n(self) -> int:
        return self.n_items


def t_ppf(p, df) -> np.ndarray:
    from scipy.stats import t

    return t.ppf(p, df)


@dataclass
class Parts:
    """The estimate, its variance and Satterthwaite df, vectorised over leading axes."""

    est: np.ndarray
    var: np.ndarray
    df: np.ndarray
    n_items: int
    seeds: dict[str, int]
    seeds_unknown: bool


def crossed_parts(strata: list[list[Term]], weights: list[float] | None = None) -> Parts:
    """The estimate Σ_b w_b Σ_k c_k ȳ_bk, its variance under the crossed model and the Satterthwaite df."""
    weights = list(weights) if weights is not None else [1.0 / len(strata)] * len(strata)
    est, item_var, denom = 0.0, 0.0, 0.0
    seed_mean: dict[str, object] = {}    # arm -> weighted per-seed means (..., S)
    coefs: dict[str, float] = {}
    n_items = 0
    for w, terms in zip(weights, strata):
        d = 0.0
        for term in terms:
            y = np.asarray(term.scores, dtype=float)
            est = est + w * term.coef * y.mean(axis=(-2, -1))
            d = d + term.coef * y.mean(axis=-1)
            if term.random_seeds:
                coefs[term.key] = term.coef
                seed_mean[term.key] = seed_mean.get(term.key, 0.0) + w * y.mean(axis=-2)
        n = np.shape(d)[-1]
        n_items += n
        with np.errstate(invalid="ignore", divide="ignore"):
            part = w * w * np.var(d, axis=-1, ddof=1) / n if n >= 2 else np.full(np.shape(d)[:-1], np.nan)
        item_var = item_var + part
        denom = denom + (part ** 2 / (n - 1) if n >= 2 else np.nan)
    var = item_var
    seeds = {k: int(np.shape(m)[-1]) for k, m in seed_mean.items()}
    for key, m in seed_mean.items():
        s = seeds[key]
        if s < 2:
            continue
        part = coefs[key] ** 2 * np.var(m, axis=-1, ddof=1) / s
        var = var + part
        denom = denom + part ** 2 / (s - 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        df = np.where(denom > 0, var ** 2 / np.where(denom > 0, denom, 1.0), n_items - len(strata))
    return Parts(np.asarray(est, float), np.asarray(var, float), np.asarray(df, float), n_items, seeds,
                 any(v < 2 for v in seeds.values()))


def wilson(p, m, crit) -> tuple[np.ndarray, np.ndarray]:
    """Wilson's score interval for a proportion `p` on (effective) sample size `m` at critical value `crit`."""
    p, m, c2 = np.asarray(p, float), np.asarray(m, float), np.asarray(crit, float) ** 2
    centre = (p + c2 / (2 * m)) / (1 + c2 / m)
    half = np.sqrt(c2) / (1 + c2 / m) * np.sqrt(p * (1 - p) / m + c2 / (4 * m * m))
    return centre - half, centre + half


def limits(parts: Parts, level: float, binary: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Two-sided limits at confidence `level` (vectorised): t on Satterthwaite df, or for a 0/1 score of one
    arm Wilson's interval on the effective sample size p̂(1 − p̂)/V̂ (n items where p̂ is 0 or 1)."""
    df = np.maximum(parts.df, 1.0)
    crit = t_ppf(1 - (1 - level) / 2, df)
    se = np.sqrt(np.maximum(parts.var, 0.0))
    lo, hi = parts.est - crit * se, parts.est + crit * se
    if binary:
        p = np.clip(parts.est, 0.0, 1.0)
        pq = p * (1 - p)
        with np.errstate(divide="ignore", invalid="ignore"):
            m = np.where((pq > 0) & (parts.var > 0), pq / np.where(parts.var > 0, parts.var, 1.0),
                         parts.n_items)
        lo, hi = wilson(p, np.maximum(m, 1.0), crit)
    return lo, hi


def _seeds_text(seeds: dict[str, int]) -> str:
    return "/".join(str(v) for v in seeds.values())


def estimate(strata: list[list[Term]], conf: float, *, weights: list[float] | None = None, binary: bool = False,
             level: float | None = None) -> Estimate:
    """One interval (no leading axes): the crossed-model estimate with its interval at `level` (default
    `conf`; a band passes its Bonferroni level) and what it covers."""
    parts = crossed_parts(strata, weights)
    mean = float(parts.est)
    seeds = _seeds_text(parts.seeds)
    covers = COVERS_ITEMS if (parts.seeds_unknown or not parts.seeds) else COVERS_BOTH
    note = "seed variance unknown (one seed)" if parts.seeds_unknown else ""
    if not math.isfinite(float(parts.var)):
        why = "one item: no item variance" if parts.n_items < 2 * len(strata) else "no variance"
        return Estimate(mean, math.nan, math.nan, math.nan, math.nan, parts.n_items, seeds, COVERS_NONE, "point",
                        why)
    level = conf if level is None else level
    terms = [t for stratum in strata for t in stratum]
    if float(parts.var) < 1e-24 and len(terms) >= 2:
        # every item differs by the same amount (to rounding): no variance to scale a t by; 0/1 scores get exact bounds
        got = exact_bounds(strata, weights or [1 / len(strata)] * len(strata), level)
        if got is None:
            return Estimate(mean, math.nan, math.nan, 0.0, math.nan, parts.n_items, seeds, COVERS_NONE, "point",
                            "no variance: every item differs by the same amount")
        return Estimate(mean, got[0], got[1], 0.0, math.nan, parts.n_items, seeds, covers, "exact discordant",
                        note or "every item differs by the same 0, +1 or -1: exact bounds")
    d = one_seed_differences(strata)
    lo, hi = limits(parts, level, binary) if d is None else discordant_limits(d[0] if len(d) == 1 else d, level, weights)
    if alike := list(dict.fromkeys(f"{t.key}'s {s} seeds" for t in terms if d is not None and (s := np.shape(t.scores)[-1]) > 1)):
        note = "; ".join(filter(None, [note, f"{' and '.join(alike)} agree on every item: one seed for the interval"]))
    method = ("crossed wilson" if binary else "crossed t") if d is None else "Tango score" if len(d) == 1 else "stratified Tango score"
    return Estimate(mean, float(lo), float(hi), float(np.sqrt(max(float(parts.var), 0.0))), float(parts.df),
                    parts.n_items, seeds, covers, method, note)


def one_seed_differences(strata: list[list[Term]]) -> list[np.ndarray] | None:
    """Each stratum's per-item differences (..., items) of one column minus another on 0/1 scores: one seed of an arm
    minus the seedless anchor (the pre/post situation) or minus one seed of another arm, whose interval is Tango's
    (`discordant_limits`; over strata, the compare table's Avg., its stratified form); None for any other contrast
    (seeds of an arm that differ, other values). Seeds that agree on every item (greedy evaluations that ignore the
    seed) show no seed variance and count as one: the crossed t, its seed part 0, covered 0.87–0.91 at 95% there."""
    out = []
    for terms in strata:
        ys = [np.asarray(t.scores, float) for t in terms]
        if sorted(t.coef for t in terms) != [-1.0, 1.0] or any(np.ptp(y, axis=-1).any() for y in ys) or not is_binary(*ys):
            return None
        out.append(sum(t.coef * y[..., 0] for t, y in zip(terms, ys)))
    return out


def discordant_limits(d, level: float, weights: list[float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Tango's score interval (analysis.stats.tango_limits) for the mean of per-item differences in {-1, 0, +1}
    (the last axis): P(+1) − P(-1) of a trinomial, from the counts of +1 (gained) and -1 (lost). A list of such
    arrays (strata) with `weights` (default equal): the stratified score interval of Σ_b w_b Δ_b
    (analysis.stats.stratified_tango_limits)."""
    from analysis.stats import stratified_tango_limits, tango_limits

    if not isinstance(d, list):
        d = np.asarray(d, float)
        return tango_limits((d > 0).sum(axis=-1), (d < 0).sum(axis=-1), d.shape[-1], level)
    weights = [1.0 / len(d)] * len(d) if weights is None else weights
    count = lambda sign: np.stack([(np.sign(x) == sign).sum(axis=-1) for x in d], axis=-1)   # noqa: E731
    return stratified_tango_limits(count(1), count(-1), [np.shape(x)[-1] for x in d], weights, level)


def exact_bounds(strata: list[list[Term]], weights: list[float], level: float) -> tuple[float, float] | None:
    """Bounds of a 0/1 contrast whose items all differ by the same c (0, +1 or -1) in each stratum, each
    score the same in every seed, else None. No item of n departs from c, so the rate of those that do is
    at most u = 1 − ((1 − level)/2)^(1/n) (Clopper–Pearson's limit for 0 events) and Δ lies in [−u, u] for
    c = 0, in [1 − 2u, 1] for c = +1 (Δ ≥ 2·P(+1) − 1) and in [−1, −1 + 2u] for c = −1."""
    lo = hi = 0.0
    for w, terms in zip(weights, strata):
        ys = [np.asarray(t.scores, float) for t in terms]
        if not is_binary(*ys) or any(np.ptp(y, axis=-1).any() for y in ys):
            return None
        d = sum(t.coef * y[:, 0] for t, y in zip(terms, ys))
        c = float(d[0])
        if c not in (-1.0, 0.0, 1.0):
            return None
        u = (1 - ((1 - level) / 2) ** (1 / len(d))) * (1 + abs(c))
        lo, hi = lo + w * max(-1.0, c - u), hi + w * min(1.0, c + u)
    return lo, hi


def is_binary(*arrays) -> bool:
    """Every finite value of every array is 0 or 1 (a score Wilson's interval applies to)."""
    return all(np.isin(np.asarray(a, float), (0.0, 1.0)).all() for a in arrays)
