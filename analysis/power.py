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
when it is not), so designs are sized at its one-sided upper confidence limit (SEED_CONF, 90%):
((S − 1)·MS_seed / χ²_{1−c, S−1} − MS_resid)/I, with the t on the design's df in that case too. A design is
recommended only when its power at that limit reaches the target (the one with the fewest seeds × items
within power.max_seeds; when none is, the report says so, with the fewest seeds that can and the fewest
evaluations beyond the limit), never with one seed: a 1-seed study cannot measure its own seed variance, so
its report's intervals cover the items only (analysis.variance) and the t test sized here is not the one it
runs. It is the cheapest design only where the limit comes out small, and then it is the fragile one: in
400 simulated 3-seed pilots, 31 of the 37 1-seed designs missed the target at σ_seed 1 EM point, 21 of 21
at 1.65.

Why 90%: on 2 df the limit is MS_seed × 9.5 (80%: × 4.5); an 80% limit is below the truth in 20% of pilots
by construction, and a design sized there misses the target by more than the t's margin in most of them.
Against known truth (tests/test_analysis_power.py, bench/bench_power.py: 3-seed pilots of 500 items, σ_seed
1–3.4 EM points) the 90% limit's designs reach true power >= 0.75 in 92–100% of pilots at ~1.85× the
items the truth needs at the same seeds; the price is seeds: a 3-seed pilot cannot rule out a large seed
variance, so the designs run many seeds (a pilot with 5 seeds brings the factor to 3.8).

A pilot with one seed can't separate them: σ²_item is the variance of the per-item
differences (seed and residual parts folded in) and σ²_seed is the assumed `power.seed_sd`² (0 unless
given: then the numbers are optimistic). A pilot that is one evaluation (an anchor alone) has no
difference yet: the arm is assumed to score like the anchor per item with independent outcomes, so
σ²_item = 2·Var(y_i) (no item correlation: conservative) and σ²_seed = `power.seed_sd`². A pilot whose
results do not vary (every item 0: a base model that fails them all) is refused, never sized from an SE
of 0.

The report's intervals (analysis.variance) use the same crossed model, so a design sized here is tested
there with the seed variance counted: with σ²_seed > 0 no number of items alone reaches the power.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from analysis.errors import AnalysisError


SEED_CONF = 0.9   # the one-sided confidence of the seed variance's upper limit
MAX_ITEMS = 1_000_000
SEED_CEILING = 1000   # how far `advise` looks for a design when power.max_seeds has none
MIN_SEEDS = 2         # a recommended design's fewest seeds (one seed cannot measure the study's seed variance)


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
    seed_df: int = 0                  # MS_seed's degrees of freedom (seeds − 1; 0: not measured)

    @property
    def seed_limit(self) -> float:
        """The seed variance designs are sized at: its upper limit where measured, else the assumed value."""
        return self.seed if self.seed_upper is None else max(self.seed, self.seed_upper)

    def var(self, items: int, seeds: int, upper: bool = False) -> float:
        seed = self.seed_limit if upper else self.seed
        return self.item / items + seed / seeds + self.resid / (items * seeds)

    def df(self, items, seeds: int, upper: bool = False):
        """The design's Satterthwaite degrees of freedom for Var D̄ estimated from its mean squares (their
        expectations under the components; `upper`: the seed variance at its upper limit, the case designs
        are sized for): items − 1 with one seed. `items` may be an array."""
        items = np.asarray(items, dtype=float)
        seed = self.seed_limit if upper else self.seed
        if seeds == 1:
            out = items - 1
        else:
            m_item, m_seed, m_resid = seeds * self.item + self.resid, items * seed + self.resid, self.resid
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
                      max(0.0, (upper_ms - ms_resid) / n_items), True, n_seeds - 1)


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
    from scipy import special

    se_arr = np.atleast_1d(np.asarray(se, dtype=float))
    if not (se_arr > 0).all():
        raise ValueError(f"power: standard error {se!r}: a design without variance has no power to compute")
    ncp = abs(effect) / se_arr
    z = special.ndtri(1 - alpha / 2)
    out = special.ndtr(ncp - z) + special.ndtr(-z - ncp)
    if df is not None:
        dfs = np.broadcast_to(np.atleast_1d(np.asarray(df, dtype=float)), ncp.shape)
        small = dfs <= 1e4
        if small.any():
            d, n = dfs[small], ncp[small]
            crit = special.stdtrit(d, 1 - alpha / 2)
            exact = 1 - special.nctdtr(d, n, crit) + special.nctdtr(d, n, -crit)
            shifted = special.stdtr(d, n - crit) + special.stdtr(d, -crit - n)   # where the noncentral t gives NaN
            out[small] = np.where(np.isfinite(exact), exact, shifted)
    return float(out[0]) if np.ndim(se) == 0 and np.ndim(df) == 0 else out


def standardized_mde(target: float = 0.8, alpha: float = 0.05, df: float | None = None) -> float:
    """δ with power(δ·se, se) = target: the minimum detectable effect in units of the SE."""
    from scipy.optimize import brentq

    return float(brentq(lambda x: power(x, 1.0, alpha, df) - target, 1e-9, 200.0))


def mde(c: Components, items: int, seeds: int, target: float = 0.8, alpha: float = 0.05) -> float:
    """The design's minimum detectable effect: t on its df, the seed variance at its upper limit."""
    return standardized_mde(target, alpha, c.df(items, seeds, upper=True)) * math.sqrt(c.var(items, seeds, upper=True))


def design_power(c: Components, effect: float, items, seeds: int, alpha: float = 0.05):
    """Power of `items` × `seeds` at `effect` with the seed variance at its upper limit: t on the design's df
    in that case (`items` may be an array)."""
    items = np.asarray(items, dtype=float)
    se = np.sqrt(c.item / items + c.seed_limit / seeds + c.resid / (items * seeds))
    df = c.df(items, seeds, upper=True)
    return power(effect, se, alpha, df) if se.ndim else power(effect, float(se), alpha, float(df))


@functools.lru_cache(maxsize=64)
def _z_multiplier(target: float, alpha: float) -> float:
    """δ with the two-sided z test's power at δ·se = target (the known-variance bound of `standardized_mde`)."""
    return standardized_mde(target, alpha, None)


def items_lower_bound(c: Components, effect: float, seeds, target: float = 0.8, alpha: float = 0.05,
                      k: float | None = None):
    """The items a known-variance z test at the seed variance's upper limit needs at `seeds` (an array): no
    t test on a finite df needs fewer (inf: the seed part alone is too large)."""
    seeds = np.asarray(seeds, dtype=float)
    room = (effect / (k or _z_multiplier(target, alpha))) ** 2 - c.seed_limit / seeds
    with np.errstate(divide="ignore", invalid="ignore"):
        need = (c.item + c.resid / seeds) / room
    return np.where(room > 0, np.maximum(2.0, np.ceil(need - 1e-9)), np.inf)


def items_needed(c: Components, effect: float, seeds: int, target: float = 0.8, alpha: float = 0.05) -> int | None:
    """The fewest items (<= MAX_ITEMS) whose `design_power` reaches `target` at `seeds` seeds (None: none does;
    the seed part alone too large). From the z bound (`items_lower_bound`: no fewer can reach it) up a
    geometric grid (steps of 10%) to its first success, then the first success inside that step (the t's df
    shrinks as items grow, so power need not rise with items over a wide range; within 10% it does)."""
    start = float(items_lower_bound(c, effect, seeds, target, alpha))
    if not start <= MAX_ITEMS:
        return None
    below, edge = int(start) - 1, int(start)
    while edge <= MAX_ITEMS:
        grid = np.unique(np.minimum(np.ceil(edge * 1.1 ** np.arange(12)), MAX_ITEMS).astype(int))
        hits = np.flatnonzero(design_power(c, effect, grid, seeds, alpha) >= target)
        if hits.size:
            below, hit = (int(grid[hits[0] - 1]) if hits[0] else below), int(grid[hits[0]])
            while hit - below > 1:   # the first success in (below, hit]: 64 counts a round
                counts = np.unique(np.ceil(np.linspace(below + 1, hit, 64)).astype(int))
                ok = design_power(c, effect, counts, seeds, alpha) >= target
                first = int(np.flatnonzero(ok)[0]) if ok.any() else len(counts) - 1
                below, hit = (int(counts[first - 1]) if first else below), int(counts[first])
            return hit
        below, edge = int(grid[-1]), int(grid[-1]) + 1
    return None


def recommend(c: Components, effect: float, max_seeds: int = SEED_CEILING, target: float = 0.8,
              alpha: float = 0.05) -> tuple[int, int] | None:
    """(seeds, items): the design with the fewest evaluations (seeds × items) whose power at the seed variance's
    upper limit reaches `target`, within `max_seeds`, with >= MIN_SEEDS seeds. None: none within max_seeds.
    Branch and bound: seed counts in the order of the evaluations their z bound needs, until that bound
    exceeds the best design found (no t design beats its z bound)."""
    seeds = np.arange(MIN_SEEDS, max_seeds + 1)
    if not seeds.size:
        return None
    bound = seeds * items_lower_bound(c, effect, seeds, target, alpha)
    best = None
    for i in np.argsort(bound, kind="stable"):
        if not math.isfinite(bound[i]) or (best is not None and bound[i] >= best[0]):
            break
        s = int(seeds[i])
        n = items_needed(c, effect, s, target, alpha)
        if n is not None and (best is None or (s * n, s) < best[:2]):
            best = (s * n, s, n)
    return best[1:] if best else None


def fewest_seeds(c: Components, effect: float, target: float = 0.8, alpha: float = 0.05,
                 max_seeds: int = SEED_CEILING) -> int | None:
    """The fewest seeds at which some number of items reaches `target` (None: none within max_seeds). More
    seeds never hurt (a smaller seed part, more df), so a bisection between the z bound's fewest and
    max_seeds (what it returns always reaches)."""
    seeds = np.arange(MIN_SEEDS, max_seeds + 1)
    finite = seeds[np.isfinite(items_lower_bound(c, effect, seeds, target, alpha))]
    if not finite.size or items_needed(c, effect, int(finite[-1]), target, alpha) is None:
        return None
    lo, hi = int(finite[0]) - 1, int(finite[-1])   # lo: reaches nowhere (or below the range), hi: reaches
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if items_needed(c, effect, mid, target, alpha) is not None else (mid, hi)
    return hi


@dataclass(frozen=True)
class Advice:
    """What the tool recommends for one pilot: `design` (seeds, items) is the fewest evaluations within
    power.max_seeds when `within`, else the fewest within SEED_CEILING (a study that must run more seeds than
    asked for); then `fewest_seeds` (seeds, items): the fewest seeds any item count reaches the target with."""

    design: tuple[int, int] | None
    within: bool
    fewest_seeds: tuple[int, int] | None = None


def advise(c: Components, effect: float, max_seeds: int, target: float = 0.8, alpha: float = 0.05) -> Advice:
    """The recommended design: the fewest evaluations within `max_seeds`; when none reaches the target there,
    the fewest within SEED_CEILING, with the fewest seeds that can."""
    design = recommend(c, effect, max_seeds, target, alpha)
    if design is not None:
        return Advice(design, True, None)
    design = recommend(c, effect, SEED_CEILING, target, alpha)
    if design is None:
        return Advice(None, False, None)
    k = fewest_seeds(c, effect, target, alpha, design[0])   # the design's seeds reach: never None
    return Advice(design, False, (k, items_needed(c, effect, k, target, alpha)))


@dataclass
class Pilot:
    label: str
    bench: str
    scores: np.ndarray          # items × seeds differences (or items × 1 scores of one evaluation)
    one_evaluation: bool
    at: str = ""                # which checkpoint each seed's differences come from
    why: str = ""               # why the pair is not computed (no scores then)


def _series(eval_dir: Path, bench: str, metric: str):
    """The per-item `metric` of `bench` in `eval_dir` (None: no rows); a bench its summary.json gives no score
    (analysis.collect.no_score_reason, e.g. none of its items generated a token) is refused, naming why."""
    from analysis.collect import eval_no_score, example_metric

    if why := eval_no_score(eval_dir, bench):
        raise AnalysisError(f"power: {eval_dir} {bench}: no score: {why}")
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
        finals = [(r.seed, max(r.evals), r.evals[max(r.evals)]) for r in runs if r.arm == arm and r.evals]
        label, at = f"{arm} − anchor", final_steps_text([(seed, step) for seed, step, _ in finals])
        for bench in benches or sorted(summary):
            base = _series(anchor, bench, metric)
            per_seed = [_series(d, bench, metric) for _, _, d in finals]
            if base is None or all(s is None for s in per_seed):   # the bench not evaluated in this metric: no pair
                continue
            if lost := next(((seed, step) for (seed, step, _), s in zip(finals, per_seed) if s is None), None):
                out.append(Pilot(label, bench, np.empty((0, 0)), False, why=f"no per-item {metric} of {bench} at "
                                 f"{arm}/seed{lost[0]}/{layout.step_name(lost[1])} (its final evaluation)"))
                continue
            ids = sorted(set(base.index).intersection(*(set(s.index) for s in per_seed)))
            if len(ids) < 2:
                out.append(Pilot(label, bench, np.empty((0, 0)), False, why=f"{len(ids)} item id(s) shared by every "
                                 "seed's final evaluation and the anchor: no variance to estimate"))
                continue
            d = np.stack([s.loc[ids].to_numpy(float) - base.loc[ids].to_numpy(float) for s in per_seed], axis=1)
            out.append(Pilot(label, bench, d, False, at=at))
    return out


def final_steps_text(finals: list[tuple[int, int]]) -> str:
    """`step 20` when every seed ends there, else `seed0, seed1 at step 20, seed2 at step 10` (seed order)."""
    by_step: dict[int, list[int]] = {}
    for seed, step in sorted(finals):
        by_step.setdefault(step, []).append(seed)
    if len(by_step) == 1:
        return f"step {next(iter(by_step))}"
    return ", ".join(f"{', '.join(f'seed{s}' for s in seeds)} at step {step}" for step, seeds in by_step.items())


def _listing(needed: dict[int, int | None]) -> list[str]:
    """"S seed(s): N items" per seed count; a run of counts where no item count reaches the target in one entry."""
    out, run = [], []
    for s, n in [*needed.items(), (None, 0)]:
        if s is not None and n is None:
            run.append(s)
            continue
        if run:
            out.append(f"{run[0]}{'' if len(run) == 1 else f'–{run[-1]}'} seed(s): unreachable (σ²_seed/S at its "
                       "upper limit, with the t on the design's df)")
            run = []
        if s is not None:
            out.append(f"{s} seed(s): {n} items")
    return out


def _advice_line(a: Advice, max_seeds: int) -> str:
    if a.within:
        return (f"{a.design[0]} seed(s) × {a.design[1]} items (the fewest evaluations reaching the target at the "
                "seed variance's upper limit)")
    if a.design is None:
        return f"no design within {max_seeds} seeds, nor within {SEED_CEILING}"
    k, n = a.fewest_seeds
    return (f"no design within {max_seeds} seeds: needs >= {k} seeds ({k} seed(s) × {n} items); the fewest evaluations: "
            f"{a.design[0]} seed(s) × {a.design[1]} items (raise power.max_seeds to list them; a pilot with more "
            "seeds narrows σ_seed's upper limit)")


def report(pilots: list[Pilot], *, effect: float, target: float, alpha: float, seed_sd: float, max_seeds: int,
           items: int | None = None, seeds: int | None = None, seed_conf: float = SEED_CONF) -> str:
    """The printed answer: per pilot × bench, the components (σ_seed with its upper limit), the current design's
    MDE and power, the items needed for each number of seeds and the recommended design. A pilot without
    variance is named and left out; when every one is, an error."""
    from scipy.stats import chi2

    if not pilots:
        raise AnalysisError("power: the pilot has no per-item results for the benches asked for")
    lines = [f"design power: two-sided t test at alpha={alpha} on the design's Satterthwaite df, target power "
             f"{target:.0%}, target effect {effect:+.3f}; the seed variance at its {seed_conf:.0%} upper limit "
             "where measured (>= 2 seeds), else the assumed power.seed_sd",
             "variance model: d_is = Δ + u_i + v_s + w_is; Var D̄ = σ²_item/I + σ²_seed/S + σ²_resid/(I·S) "
             "(analysis/power.py)", ""]
    refused = []
    for p in pilots:
        if p.why:
            refused.append(f"{p.label} × {p.bench}: not computed: {p.why}")
            lines += [refused[-1], ""]
            continue
        head = f"{p.label} × {p.bench}: {p.scores.shape[0]} items × {p.scores.shape[1]} seed(s)"
        try:
            c = from_one_evaluation(p.scores[:, 0], seed_sd) if p.one_evaluation else estimate(p.scores, seed_sd, seed_conf)
        except NoVariance as exc:
            refused.append(f"{head}: not computed: {exc}")
            lines += [refused[-1], ""]
            continue
        n_items, n_seeds = items or p.scores.shape[0], seeds or p.scores.shape[1]
        se = math.sqrt(c.var(n_items, n_seeds, upper=True))
        seed_line = (f"σ_seed {math.sqrt(c.seed):.4f} ({seed_conf:.0%} upper limit {math.sqrt(c.seed_limit):.4f}: "
                     f"MS_seed × {c.seed_df / float(chi2.ppf(1 - seed_conf, c.seed_df)):.1f} on {c.seed_df} df; a "
                     "pilot with more seeds narrows it)" if c.seed_measured
                     else f"σ_seed {math.sqrt(c.seed):.4f} (assumed, not measured)")
        one = items_needed(c, effect, 1, target, alpha) if c.seed_measured else None
        listing = [f"1 seed(s): not recommended ({'' if one is None else f'{one} items at the upper limit, but '}"
                   "a 1-seed study cannot measure its own seed variance: its intervals cover the items only)"]
        listing += _listing({s: items_needed(c, effect, s, target, alpha) for s in range(MIN_SEEDS, max_seeds + 1)})
        advice = advise(c, effect, max_seeds, target, alpha)
        lines += [head + ("" if p.one_evaluation else f", observed Δ {p.scores.mean():+.4f}")
                  + (f" (each seed at its final evaluation: {p.at})" if p.at else ""),
                  f"  σ_item {math.sqrt(c.item):.4f}, {seed_line}, σ_resid {math.sqrt(c.resid):.4f} ({c.how})",
                  f"  design {n_seeds} seed(s) × {n_items} items: SE {se:.4f} (df {c.df(n_items, n_seeds, True):.1f}), "
                  f"minimum detectable effect {mde(c, n_items, n_seeds, target, alpha):.4f}, power at {effect:+.3f}: "
                  f"{design_power(c, effect, n_items, n_seeds, alpha):.3f}",
                  f"  items needed for {target:.0%} power at {effect:+.3f}: " + "; ".join(listing),
                  "  recommended: " + _advice_line(advice, max_seeds), ""]
    if len(refused) == len(pilots):
        raise AnalysisError("power: " + "; ".join(refused))
    return "\n".join(lines)
