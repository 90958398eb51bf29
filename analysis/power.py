"""Design power: how many seeds × items a study needs to see an effect, from a pilot's per-item results.

Variance model (items and seeds random, crossed). The per-item difference of an arm to the anchor,
item i, training seed s:

    d_is = Δ + u_i + v_s + w_is,   Var u = σ²_item, Var v = σ²_seed, Var w = σ²_resid

(u: how much more one item gains than another; v: how much a whole training seed gains more than
another; w: the item × seed rest, including decoding noise). The study's estimate D̄ (the mean over I
items and S seeds) has

    Var D̄ = σ²_item / I + σ²_seed / S + σ²_resid / (I·S)

and is tested two-sided at level α with a z statistic D̄ / SE (statsmodels' `normal_power`). The
components are estimated from a pilot by the two-way ANOVA of d (method of moments, negative
estimates set to 0): MS_resid → σ²_resid, (MS_item − MS_resid)/S → σ²_item, (MS_seed − MS_resid)/I →
σ²_seed. A pilot with one seed can't separate them: σ²_item is the variance of the per-item
differences (seed and residual parts folded in) and σ²_seed is the assumed `power.seed_sd`² (0 unless
given: then the numbers are optimistic). A pilot that is one evaluation (an anchor alone) has no
difference yet: the arm is assumed to score like the anchor per item with independent outcomes, so
σ²_item = 2·Var(y_i) (no item correlation: conservative) and σ²_seed = `power.seed_sd`².

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


@dataclass(frozen=True)
class Components:
    item: float    # σ²_item
    seed: float    # σ²_seed
    resid: float   # σ²_resid
    how: str       # how they were estimated

    def var(self, items: int, seeds: int) -> float:
        return self.item / items + self.seed / seeds + self.resid / (items * seeds)


def estimate(d, seed_sd: float = 0.0) -> Components:
    """Variance components of per-item differences `d` (items × seeds) by the two-way ANOVA."""
    d = np.asarray(d, dtype=float)
    if d.ndim != 2 or d.shape[0] < 2 or not np.isfinite(d).all():
        raise AnalysisError(f"power: need a finite items × seeds array with >= 2 items, got shape {d.shape}")
    n_items, n_seeds = d.shape
    if n_seeds == 1:
        return Components(float(d[:, 0].var(ddof=1)), seed_sd ** 2, 0.0,
                          f"one seed: σ²_item = variance of the per-item differences (seed and residual folded in); "
                          f"σ²_seed = power.seed_sd² = {seed_sd ** 2:.3g} (assumed)")
    grand, rows, cols = d.mean(), d.mean(axis=1), d.mean(axis=0)
    ms_item = n_seeds * ((rows - grand) ** 2).sum() / (n_items - 1)
    ms_seed = n_items * ((cols - grand) ** 2).sum() / (n_seeds - 1)
    resid = d - rows[:, None] - cols[None, :] + grand
    ms_resid = (resid ** 2).sum() / ((n_items - 1) * (n_seeds - 1))
    return Components(max(0.0, (ms_item - ms_resid) / n_seeds), max(0.0, (ms_seed - ms_resid) / n_items), float(ms_resid),
                      f"two-way ANOVA over {n_items} items × {n_seeds} seeds (method of moments)")


def from_one_evaluation(y, seed_sd: float = 0.0) -> Components:
    y = np.asarray(y, dtype=float)
    if y.size < 2:
        raise AnalysisError("power: a one-evaluation pilot needs >= 2 items")
    return Components(2 * float(y.var(ddof=1)), seed_sd ** 2, 0.0,
                      "one evaluation: the arm assumed to score like it per item, independently: σ²_item = 2·Var(y); "
                      f"σ²_seed = power.seed_sd² = {seed_sd ** 2:.3g} (assumed)")


def power(effect: float, se: float, alpha: float = 0.05) -> float:
    """Two-sided z-test power to detect `effect` with standard error `se`."""
    from statsmodels.stats.power import normal_power

    if se <= 0:
        return 1.0 if effect else alpha
    return float(normal_power(abs(effect) / se, nobs=1, alpha=alpha, alternative="two-sided"))


def standardized_mde(target: float = 0.8, alpha: float = 0.05) -> float:
    """δ with power(δ·se, se) = target: the minimum detectable effect in units of the SE."""
    from scipy.optimize import brentq

    return float(brentq(lambda x: power(x, 1.0, alpha) - target, 1e-9, 50.0))


def mde(c: Components, items: int, seeds: int, target: float = 0.8, alpha: float = 0.05) -> float:
    return standardized_mde(target, alpha) * math.sqrt(c.var(items, seeds))


def items_needed(c: Components, effect: float, seeds: int, target: float = 0.8, alpha: float = 0.05) -> int | None:
    """The fewest items giving `target` power at `seeds` seeds (None: unreachable, the seed part alone is too big)."""
    room = (abs(effect) / standardized_mde(target, alpha)) ** 2 - c.seed / seeds
    if room <= 0:
        return None
    return max(2, math.ceil((c.item + c.resid / seeds) / room - 1e-9))


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
           items: int | None = None, seeds: int | None = None) -> str:
    """The printed answer: per pilot × bench, the components, the current design's MDE and power, and the
    items needed for each number of seeds."""
    if not pilots:
        raise AnalysisError("power: the pilot has no per-item results for the benches asked for")
    k = standardized_mde(target, alpha)
    lines = [f"design power: two-sided z-test at alpha={alpha}, target power {target:.0%}, target effect {effect:+.3f} "
             f"(MDE = {k:.3f} × SE)",
             "variance model: d_is = Δ + u_i + v_s + w_is; Var D̄ = σ²_item/I + σ²_seed/S + σ²_resid/(I·S) "
             "(analysis/power.py)", ""]
    for p in pilots:
        c = from_one_evaluation(p.scores[:, 0], seed_sd) if p.one_evaluation else estimate(p.scores, seed_sd)
        n_items, n_seeds = items or p.scores.shape[0], seeds or p.scores.shape[1]
        se = math.sqrt(c.var(n_items, n_seeds))
        lines += [f"{p.label} × {p.bench}: {p.scores.shape[0]} items × {p.scores.shape[1]} seed(s)"
                  + ("" if p.one_evaluation else f", observed Δ {p.scores.mean():+.4f}"),
                  f"  σ_item {math.sqrt(c.item):.4f}, σ_seed {math.sqrt(c.seed):.4f}, σ_resid {math.sqrt(c.resid):.4f} ({c.how})",
                  f"  design {n_seeds} seed(s) × {n_items} items: SE {se:.4f}, minimum detectable effect {k * se:.4f}, "
                  f"power at {effect:+.3f}: {power(effect, se, alpha):.3f}",
                  f"  items needed for {target:.0%} power at {effect:+.3f}: " + "; ".join(
                      f"{s} seed(s): {n} items" if n is not None else f"{s} seed(s): unreachable (σ²_seed/S alone too large)"
                      for s in range(1, max_seeds + 1) for n in [items_needed(c, effect, s, target, alpha)]), ""]
    return "\n".join(lines)
