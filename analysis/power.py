"""Design power: how many seeds × items a study needs to see an effect, from a pilot's per-item results.

Variance model (items and seeds random, crossed). The per-item difference of an arm to the anchor,
item i, training seed s:

    d_is = Δ + u_i + v_s + w_is,   Var u = σ²_item, Var v = σ²_seed, Var w = σ²_resid

(u: how much more one item gains than another; v: how much a whole training seed gains more than
another; w: the item × seed rest, including decoding noise). The study's estimate D̄ (the mean over I
items and S seeds) has

    Var D̄ = σ²_item / I + σ²_seed / S + σ²_resid / (I·S)

and is tested two-sided at level α with a t statistic D̄ / SE on the design's Satterthwaite degrees of
freedom (the expected mean squares of the components: items − 1 with one seed), its power from the
noncentral t. The
components are estimated from a pilot by the two-way ANOVA of d (method of moments, negative
estimates set to 0): MS_resid → σ²_resid, (MS_item − MS_resid)/S → σ²_item, (MS_seed − MS_resid)/I →
σ²_seed. σ²_seed rests on seeds − 1 degrees of freedom (2 for a 3-seed pilot: an estimate of 0 is common
when it is not), so designs are sized at its one-sided upper confidence limit (SEED_CONF, 80%):
((S − 1)·MS_seed / χ²_{1−c, S−1} − MS_resid)/I; a design is recommended only when its power at that limit
reaches the target (the one with the fewest seeds × items), and a 1-seed design only when the pilot
measured the seed variance. A pilot with one seed can't separate them: σ²_item is the variance of the per-item
differences (seed and residual parts folded in) and σ²_seed is the assumed `power.seed_sd`² (0 unless
given: then the numbers are optimistic). A pilot that is one evaluation (an anchor alone) has no
difference yet: the arm is assumed to score like the anchor per item with independent outcomes, so
σ²_item = 2·Var(y_i) (no item correlation: conservative) and σ²_seed = `power.seed_sd`². A pilot whose
results do not vary (every item 0: a base model that fails them all) is refused, never sized from an SE
of 0.

Note on the report's paired interval (analysis.aggregate.paired_vs_anchor): it averages each item's
scores over seeds and bootstraps items, so its variance is (σ²_item + σ²_resid/S)/I; it leaves out
σ²_seed/S. It stays as it is (the item-level uncertainty of the evaluated checkpoints), and this power
calculation is the one that counts seeds: with σ²_seed > 0 no number of items alone reaches the power.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from analysis.errors import AnalysisError


SEED_CONF = 0.8   # the one-sided confidence of the seed variance's upper limit
MAX_ITEMS = 1_000_000


class NoVariance(AnalysisError):
    """A pilot whose per-item results do not vary: no design can be sized from it."""


@dataclass(frozen=True)
class Components:
    item: float         # σ²_item
    seed: float         # σ²_seed, the point estimate (or the assumed power.seed_sd²)
    resid: float        # σ²_resid
    how: str            # how they were estimated
    seed_upper: float | None = None   # σ²_seed's upper confidence limit (None: the point value is all there is)
    seed_measured: bool = False       # estimated from >= 2 seeds (else assumed)

    @property
    def seed_limit(self) -> float:
        """The seed variance designs are sized at: its upper limit where measured, else the assumed value."""
        return self.seed if self.seed_upper is None else max(self.seed, self.seed_upper)

    def var(self, items: int, seeds: int, upper: bool = False) -> float:
        seed = self.seed_limit if upper else self.seed
        return self.item / items + seed / seeds + self.resid / (items * seeds)

    def df(self, items, seeds: int):
        """The design's Satterthwaite degrees of freedom for Var D̄ estimated from its mean squares (their
        expectations under the point components): items − 1 with one seed. `items` may be an array."""
        items = np.asarray(items, dtype=float)
        if seeds == 1:
            out = items - 1
        else:
            m_item, m_seed, m_resid = seeds * self.item + self.resid, items * self.seed + self.resid, self.resid
            num = (m_item + m_seed - m_resid) ** 2
            den = m_item ** 2 / (items - 1) + m_seed ** 2 / (seeds - 1) + m_resid ** 2 / ((items - 1) * (seeds - 1))
            out = np.where(den > 0, num / np.where(den > 0, den, 1.0), (items - 1) * seeds)
        return float(out) if out.ndim == 0 else out


def estimate(d, seed_sd: float = 0.0, seed_conf: float = SEED_CONF) -> Components:
    """Variance components of per-item differences `d` (items × seeds) by the two-way ANOVA; with >= 2 seeds
    σ²_seed also gets its one-sided `seed_conf` upper limit from MS_seed's chi-square on seeds − 1 df."""
    from scipy.stats import chi2

    d = np.asarray(d, dtype=float)
    if d.ndim != 2 or d.shape[0] < 2 or not np.isfinite(d).all():
        raise AnalysisError(f"power: need a finite items × seeds array with >= 2 items, got shape {d.shape}")
    n_items, n_seeds = d.shape
    if not d.var() > 0:
        raise NoVariance(f"every per-item difference is {d.flat[0]:+g}: no variance to size a design from")
    if n_seeds == 1:
        return Components(float(d[:, 0].var(ddof=1)), seed_sd ** 2, 0.0,
                          f"one seed: σ²_item = variance of the per-item differences (seed and residual folded in); "
                          f"σ²_seed = power.seed_sd² = {seed_sd ** 2:.3g} (assumed, not measured)")
    grand, rows, cols = d.mean(), d.mean(axis=1), d.mean(axis=0)
    ms_item = n_seeds * ((rows - grand) ** 2).sum() / (n_items - 1)
    ms_seed = n_items * ((cols - grand) ** 2).sum() / (n_seeds - 1)
    resid = d - rows[:, None] - cols[None, :] + grand
    ms_resid = (resid ** 2).sum() / ((n_items - 1) * (n_seeds - 1))
    upper_ms = (n_seeds - 1) * ms_seed / float(chi2.ppf(1 - seed_conf, n_seeds - 1))
    return Components(max(0.0, (ms_item - ms_resid) / n_seeds), max(0.0, (ms_seed - ms_resid) / n_items),
                      float(ms_resid),
                      f"two-way ANOVA over {n_items} items × {n_seeds} seeds (method of moments); σ²_seed's "
                      f"{seed_conf:.0%} upper limit from MS_seed's chi-square on {n_seeds - 1} df",
                      max(0.0, (upper_ms - ms_resid) / n_items), True)


def from_one_evaluation(y, seed_sd: float = 0.0) -> Components:
    y = np.asarray(y, dtype=float)
    if y.size < 2:
        raise AnalysisError("power: a one-evaluation pilot needs >= 2 items")
    if not y.var() > 0:
        raise NoVariance(f"every item scored {y.flat[0]:g}: no variance to size a design from (a pilot whose "
                         "items all score the same, e.g. a base model that fails every item)")
    return Components(2 * float(y.var(ddof=1)), seed_sd ** 2, 0.0,
                      "one evaluation: the arm assumed to score like it per item, independently: σ²_item = 2·Var(y); "
                      f"σ²_seed = power.seed_sd² = {seed_sd ** 2:.3g} (assumed, not measured)")


def power(effect: float, se, alpha: float = 0.05, df=None):
    """Two-sided power to detect `effect` with standard error `se`: a z test (df None), else a t test on `df`
    degrees of freedom (the noncentral t; the normal beyond 10⁴ df). A standard error of 0 is an error, never
    power 1. `se` and `df` may be arrays (then an array)."""
    from scipy.stats import nct, norm, t

    se_arr = np.atleast_1d(np.asarray(se, dtype=float))
    if not (se_arr > 0).all():
        raise ValueError(f"power: standard error {se!r}: a design without variance has no power to compute")
    ncp = abs(effect) / se_arr
    z = norm.isf(alpha / 2)
    out = norm.sf(z - ncp) + norm.cdf(-z - ncp)
    if df is not None:
        dfs = np.broadcast_to(np.atleast_1d(np.asarray(df, dtype=float)), ncp.shape)
        small = dfs <= 1e4
        if small.any():
            crit = t.isf(alpha / 2, dfs[small])
            d, n = dfs[small], ncp[small]
            exact = nct.sf(crit, d, n) + nct.cdf(-crit, d, n)
            shifted = t.sf(crit - n, d) + t.cdf(-crit - n, d)   # where scipy's noncentral t gives NaN (large ncp)
            out[small] = np.where(np.isfinite(exact), exact, shifted)
    return float(out[0]) if np.ndim(se) == 0 and np.ndim(df) == 0 else out


def standardized_mde(target: float = 0.8, alpha: float = 0.05, df: float | None = None) -> float:
    """δ with power(δ·se, se) = target: the minimum detectable effect in units of the SE."""
    from scipy.optimize import brentq

    return float(brentq(lambda x: power(x, 1.0, alpha, df) - target, 1e-9, 200.0))


def mde(c: Components, items: int, seeds: int, target: float = 0.8, alpha: float = 0.05) -> float:
    """The design's minimum detectable effect: t on its df, the seed variance at its upper limit."""
    return standardized_mde(target, alpha, c.df(items, seeds)) * math.sqrt(c.var(items, seeds, upper=True))


def design_power(c: Components, effect: float, items, seeds: int, alpha: float = 0.05):
    """Power of `items` × `seeds` at `effect`: t on the design's df, the seed variance at its upper limit
    (`items` may be an array)."""
    items = np.asarray(items, dtype=float)
    se = np.sqrt(c.item / items + c.seed_limit / seeds + c.resid / (items * seeds))
    return power(effect, se if se.ndim else float(se), alpha, c.df(items, seeds) if se.ndim else float(c.df(items, seeds)))


def items_needed(c: Components, effect: float, seeds: int, target: float = 0.8, alpha: float = 0.05) -> int | None:
    """The fewest items (<= MAX_ITEMS) whose `design_power` reaches `target` at `seeds` seeds (None: none does;
    the seed part alone too large). A log grid, then every count below its first success (the t's df shrinks
    as items grow, so power need not rise with items everywhere)."""
    grid = np.unique(np.geomspace(2, MAX_ITEMS, 160).astype(int))
    hits = np.flatnonzero(design_power(c, effect, grid, seeds, alpha) >= target)
    if not hits.size:
        return None
    k = hits[0]
    if k == 0:
        return int(grid[0])
    below = np.arange(grid[k - 1] + 1, grid[k] + 1)
    if below.size > 4000:   # thin the counts (rounding up by < 0.02%)
        below = np.unique(np.ceil(np.linspace(below[0], below[-1], 4000)).astype(int))
    return int(below[np.flatnonzero(design_power(c, effect, below, seeds, alpha) >= target)[0]])


def recommend(c: Components, effect: float, max_seeds: int, target: float = 0.8,
              alpha: float = 0.05) -> tuple[int, int] | None:
    """(seeds, items): the design with the fewest evaluations (seeds × items) whose power at the seed variance's
    upper limit reaches `target`; 1-seed designs only where the pilot measured the seed variance. None: none
    within max_seeds."""
    options = [(s * n, s, n) for s in range(1 if c.seed_measured else 2, max_seeds + 1)
               if (n := items_needed(c, effect, s, target, alpha)) is not None]
    return min(options)[1:] if options else None


@dataclass
class Pilot:
    label: str
    bench: str
    scores: np.ndarray          # items × seeds differences (or items × 1 scores of one evaluation)
    one_evaluation: bool


def _series(eval_dir: Path, bench: str, metric: str):
    from analysis.collect import example_metric

    problems: list[str] = []
    s = example_metric(eval_dir, bench, metric, problems)
    if problems:
        raise AnalysisError(f"power: {problems[0]}")
    return s


def read_pilots(pilot: Path, benches: list[str] | None, metric: str, profile: str | None, anchor_dir: Path | None) -> list[Pilot]:
    """The pilot's per-item results: one evaluation dir (has summary.json), or a runs root whose arms'
    final evaluations are paired with its anchor over the item ids every seed and the anchor share."""
    from analysis.discover import discover_runs, read_json_object
    from common import layout

    if (pilot / "summary.json").is_file():
        summary = read_json_object(pilot / "summary.json", []) or {}
        out = []
        for bench in benches or sorted(summary):
            s = _series(pilot, bench, metric)
            if s is not None and len(s) >= 2:
                out.append(Pilot(str(pilot), bench, s.sort_index().to_numpy(float)[:, None], True))
        return out
    if not pilot.is_dir():
        raise AnalysisError(f"power.pilot={pilot}: no such directory (an eval dir with summary.json, or a runs root)")
    anchor = layout.eval_dir(anchor_dir or pilot / "_anchor", 0, profile)
    runs = discover_runs(pilot, profile)
    if not runs or not (anchor / "summary.json").is_file():
        raise AnalysisError(f"power.pilot={pilot}: not an eval dir, and not a runs root with runs and an anchor "
                            f"evaluation ({anchor})")
    summary = read_json_object(anchor / "summary.json", []) or {}
    out = []
    for arm in sorted({r.arm for r in runs}):
        finals = [r.evals[max(r.evals)] for r in runs if r.arm == arm and r.evals]
        for bench in benches or sorted(summary):
            base = _series(anchor, bench, metric)
            per_seed = [_series(d, bench, metric) for d in finals]
            if base is None or not per_seed or any(s is None for s in per_seed):
                continue
            ids = sorted(set(base.index).intersection(*(set(s.index) for s in per_seed)))
            if len(ids) < 2:
                continue
            d = np.stack([s.loc[ids].to_numpy(float) - base.loc[ids].to_numpy(float) for s in per_seed], axis=1)
            out.append(Pilot(f"{arm} − anchor", bench, d, False))
    return out


def report(pilots: list[Pilot], *, effect: float, target: float, alpha: float, seed_sd: float, max_seeds: int,
           items: int | None = None, seeds: int | None = None, seed_conf: float = SEED_CONF) -> str:
    """The printed answer: per pilot × bench, the components (σ_seed with its upper limit), the current design's
    MDE and power, the items needed for each number of seeds and the recommended design. A pilot without
    variance is named and left out; when every one is, an error."""
    if not pilots:
        raise AnalysisError("power: the pilot has no per-item results for the benches asked for")
    lines = [f"design power: two-sided t test at alpha={alpha} on the design's Satterthwaite df, target power "
             f"{target:.0%}, target effect {effect:+.3f}; the seed variance at its {seed_conf:.0%} upper limit "
             "where measured (>= 2 seeds), else the assumed power.seed_sd",
             "variance model: d_is = Δ + u_i + v_s + w_is; Var D̄ = σ²_item/I + σ²_seed/S + σ²_resid/(I·S) "
             "(analysis/power.py)", ""]
    refused = []
    for p in pilots:
        head = f"{p.label} × {p.bench}: {p.scores.shape[0]} items × {p.scores.shape[1]} seed(s)"
        try:
            c = from_one_evaluation(p.scores[:, 0], seed_sd) if p.one_evaluation else estimate(p.scores, seed_sd, seed_conf)
        except NoVariance as exc:
            refused.append(f"{head}: not computed: {exc}")
            lines += [refused[-1], ""]
            continue
        n_items, n_seeds = items or p.scores.shape[0], seeds or p.scores.shape[1]
        se = math.sqrt(c.var(n_items, n_seeds, upper=True))
        seed_line = (f"σ_seed {math.sqrt(c.seed):.4f} (upper limit {math.sqrt(c.seed_limit):.4f})" if c.seed_measured
                     else f"σ_seed {math.sqrt(c.seed):.4f} (assumed, not measured)")
        listing = []
        for s in range(1, max_seeds + 1):
            n = items_needed(c, effect, s, target, alpha)
            if s == 1 and not c.seed_measured:
                listing.append("1 seed(s): not recommended (seed variance not measured: a pilot with >= 2 seeds "
                               "measures it)")
            else:
                listing.append(f"{s} seed(s): {n} items" if n is not None else
                               f"{s} seed(s): unreachable (σ²_seed/S at its upper limit, with the t on the design's df)")
        best = recommend(c, effect, max_seeds, target, alpha)
        lines += [head + ("" if p.one_evaluation else f", observed Δ {p.scores.mean():+.4f}"),
                  f"  σ_item {math.sqrt(c.item):.4f}, {seed_line}, σ_resid {math.sqrt(c.resid):.4f} ({c.how})",
                  f"  design {n_seeds} seed(s) × {n_items} items: SE {se:.4f} (df {c.df(n_items, n_seeds):.1f}), "
                  f"minimum detectable effect {mde(c, n_items, n_seeds, target, alpha):.4f}, power at {effect:+.3f}: "
                  f"{design_power(c, effect, n_items, n_seeds, alpha):.3f}",
                  f"  items needed for {target:.0%} power at {effect:+.3f}: " + "; ".join(listing),
                  "  recommended: " + (f"{best[0]} seed(s) × {best[1]} items (the fewest evaluations reaching the "
                                       "target at the seed variance's upper limit)" if best else
                                       f"none within {max_seeds} seeds"), ""]
    if len(refused) == len(pilots):
        raise AnalysisError("power: " + "; ".join(refused))
    return "\n".join(lines)
