"""From the tidy table to plotted/tabulated numbers: curves with 95% bands, final/best points, paired deltas.

The rule for every interval (stats.py): >= 2 seeds -> t-interval across seeds; one seed -> bootstrap over
the examples of that eval (for the QA mean: each bench resampled on its own, then averaged, i.e. a
stratified bootstrap); no per-example file -> a bare point.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.collect import MEAN_BENCH, example_metric
from analysis.discover import ANCHOR_ARM
from analysis.stats import (Band, Interval, PairedResult, bonferroni_band, bootstrap_means, paired_bootstrap,
                            percentile_limits, simultaneous_band, t_interval)

NAN_INTERVAL = Interval(math.nan, math.nan, math.nan, 0, "point")


@dataclass
class Points:
    """The tidy table (with `avg` rows) and where each (arm, seed, step)'s examples live."""

    table: pd.DataFrame
    eval_dirs: dict[tuple[str, int, int], Path]
    qa: list[str]  # the benches averaged into `avg`
    n_boot: int = 2000
    boot_seed: int = 0
    conf: float = 0.95
    problems: list[str] = field(default_factory=list)
    # (arm, seed, step, bench) -> why evaluate gave it no score (analysis.collect.Collected.nulls)
    nulls: dict[tuple[str, int, int, str], str] = field(default_factory=dict)
    # Figures and tables ask for the same cells; each bootstrap is computed once.
    _intervals: dict[tuple, Interval] = field(default_factory=dict, repr=False)

    def values(self, arm: str, step: int, bench: str, metric: str) -> pd.Series:
        """Seed -> value at one step."""
        t = self.table
        sel = t[(t.arm == arm) & (t.step == step) & (t.bench == bench) & (t.metric == metric)]
        return sel.set_index("seed")["value"].sort_index()

    def no_score(self, arm: str, bench: str) -> str | None:
        """Why `arm` has no score of `bench` where evaluate gave it none (its latest such point; for
        `avg`, the first averaged bench without one), else None."""
        if bench == MEAN_BENCH:
            held = next((b for b in self.qa if self.no_score(arm, b)), None)
            return None if held is None else f"no mean: {held} has no score"
        hits = sorted((step, seed, why) for (a, seed, step, b), why in self.nulls.items() if (a, b) == (arm, bench))
        return f"no score: {hits[-1][2]}" if hits else None

    def examples(self, arm: str, seed: int, step: int, bench: str, metric: str) -> pd.Series | None:
        d = self.eval_dirs.get((arm, seed, step))
        return None if d is None else example_metric(d, bench, metric, self.problems)

    def _boot_one_seed(self, arm: str, seed: int, step: int, bench: str, metric: str) -> np.ndarray | None:
        benches = self.qa if bench == MEAN_BENCH else [bench]
        boots = []
        for b in benches:
            ex = self.examples(arm, seed, step, b, metric)
            if ex is None or ex.empty:
                return None
            boots.append(bootstrap_means(ex.to_numpy(), self.n_boot, self.boot_seed))
        return np.mean(boots, axis=0)

    def interval(self, arm: str, step: int, bench: str, metric: str) -> Interval:
        key = (arm, step, bench, metric)
        if key not in self._intervals:
            self._intervals[key] = self._interval(arm, step, bench, metric)
        return self._intervals[key]

    def _interval(self, arm: str, step: int, bench: str, metric: str) -> Interval:
        vals = self.values(arm, step, bench, metric)
        if vals.empty:
            return NAN_INTERVAL
        if len(vals) >= 2:
            return t_interval(vals.to_numpy(), self.conf)
        mean = float(vals.iloc[0])
        boot = self._boot_one_seed(arm, int(vals.index[0]), step, bench, metric)
        if boot is None:
            return Interval(mean, math.nan, math.nan, 1, "point")
        lo, hi = percentile_limits(boot, self.conf)
        return Interval(mean, lo, hi, 1, "bootstrap")


    def simultaneous(self, arm: str, bench: str, metric: str, steps: list[int]) -> tuple[list[int], Band] | None:
        """The simultaneous band over the arm's evaluated `steps` (analysis.stats): one seed, the max-t
        bootstrap over the items every step shares (None unless every step evaluated the same ids);
        the same >= 2 seeds at every step, the Bonferroni t band. None for the QA mean or < 2 steps."""
        if bench == MEAN_BENCH:
            return None
        have = [(s, self.values(arm, s, bench, metric)) for s in steps]
        have = [(s, v) for s, v in have if not v.empty]
        if len(have) < 2 or len({tuple(v.index) for _, v in have}) != 1:
            return None
        done = [s for s, _ in have]
        seeds = list(have[0][1].index)
        if len(seeds) >= 2:
            return done, bonferroni_band(np.array([v.to_numpy(float) for _, v in have]).T, self.conf)
        per_step = [self.examples(arm, int(seeds[0]), s, bench, metric) for s in done]
        if any(e is None or e.empty for e in per_step) or len({frozenset(e.index) for e in per_step}) != 1:
            return None
        ids = sorted(per_step[0].index)
        x = np.array([e.loc[ids].to_numpy(float) for e in per_step]).T
        return done, simultaneous_band(x, self.n_boot, self.boot_seed, self.conf)


def metric_rows(table: pd.DataFrame, bench: str, metric: str) -> pd.DataFrame:
    return table[(table.bench == bench) & (table.metric == metric)]


def curve(points: Points, arm: str, bench: str, metric: str, steps: list[int]) -> pd.DataFrame:
    """mean/lo/hi per step for one arm; steps without data are NaN rows (drawn as gaps)."""
    rows = []
    for step in steps:
        iv = points.interval(arm, step, bench, metric)
        rows.append(dict(step=step, mean=iv.mean, lo=iv.lo, hi=iv.hi, n=iv.n, method=iv.method))
    return pd.DataFrame(rows, columns=["step", "mean", "lo", "hi", "n", "method"])


def anchor_value(points: Points, bench: str, metric: str) -> Interval:
    return points.interval(ANCHOR_ARM, 0, bench, metric)


@dataclass
class Selected:
    interval: Interval
    steps: list[int]  # the step(s) the value comes from (one per seed for "final")


def final_point(points: Points, arm: str, bench: str, metric: str) -> Selected | None:
    """Each seed's last evaluated step, aggregated across seeds (bootstrap when one seed)."""
    rows = metric_rows(points.table, bench, metric)
    rows = rows[rows.arm == arm]
    if rows.empty:
        return None
    last = rows.loc[rows.groupby("seed").step.idxmax()]
    steps = sorted(set(last.step.astype(int)))
    if len(last) >= 2:
        return Selected(t_interval(last.value.to_numpy(), points.conf), steps)
    return Selected(points.interval(arm, steps[0], bench, metric), steps)


def best_point(points: Points, arm: str, bench: str, metric: str) -> Selected | None:
    """The step with the highest seed-mean (earliest on ties). Chosen on the eval set: optimistic."""
    rows = metric_rows(points.table, bench, metric)
    rows = rows[rows.arm == arm]
    if rows.empty:
        return None
    means = rows.groupby("step").value.mean().sort_index()
    step = int(means.idxmax())
    return Selected(points.interval(arm, step, bench, metric), [step])


@dataclass
class Paired:
    result: PairedResult
    steps: list[int]
    dropped: int  # examples not shared by every seed and the anchor


def paired_vs_anchor(points: Points, arm: str, bench: str, metric: str) -> Paired | None:
    """Final checkpoint of `arm` minus the anchor, paired over shared example ids.

    With several seeds the arm's per-example score is its mean over seeds (each seed's final step),
    so the bootstrap resamples examples, the unit the anchor shares with the arm.
    """
    if bench == MEAN_BENCH:
        return None
    anchor = points.examples(ANCHOR_ARM, 0, 0, bench, metric)
    rows = metric_rows(points.table, bench, metric)
    rows = rows[rows.arm == arm]
    if anchor is None or rows.empty:
        return None
    last = rows.loc[rows.groupby("seed").step.idxmax()]
    per_seed = []
    for seed, step in zip(last.seed.astype(int), last.step.astype(int)):
        ex = points.examples(arm, seed, step, bench, metric)
        if ex is None:
            return None
        per_seed.append(ex)
    arm_scores = pd.concat(per_seed, axis=1, join="inner").mean(axis=1)
    ids = arm_scores.index.intersection(anchor.index)
    total = len(arm_scores.index.union(anchor.index))
    if len(ids) == 0:
        return None
    res = paired_bootstrap(arm_scores.loc[ids].to_numpy(), anchor.loc[ids].to_numpy(),
                           points.n_boot, points.boot_seed, points.conf)
    return Paired(res, sorted(set(last.step.astype(int))), total - len(ids))


@dataclass
class ArmsPaired:
    """Arm `a` minus arm `b` at one step: per-example differences over the seeds both evaluated there."""

    result: PairedResult
    seeds: list[int]
    dropped: int  # examples not evaluated in every shared seed of both arms


def _seed_differences(points: Points, a: str, b: str, step: int, bench: str, metric: str,
                      seeds: list[int]) -> tuple[pd.Series, int] | None:
    """Per example id: mean over `seeds` of a's score minus b's (seed s of a beside seed s of b)."""
    diffs, ids_all = [], None
    for seed in seeds:
        ea = points.examples(a, seed, step, bench, metric)
        eb = points.examples(b, seed, step, bench, metric)
        if ea is None or eb is None:
            return None
        union = ea.index.union(eb.index)
        ids_all = union if ids_all is None else ids_all.union(union)
        shared = ea.index.intersection(eb.index)
        diffs.append(ea.loc[shared] - eb.loc[shared])
    mean = pd.concat(diffs, axis=1, join="inner").mean(axis=1)
    return mean, len(ids_all) - len(mean)


def paired_arms(points: Points, a: str, b: str, step: int, bench: str, metric: str) -> ArmsPaired | None:
    """`a` − `b` at `step`, paired over the same examples and the same seeds (seed s of one arm beside
    seed s of the other: the same data order and initialization), the per-example difference averaged
    over those seeds, with a paired-bootstrap CI over examples. For the QA mean (`avg`) each bench's
    differences are resampled on their own and the bench means averaged (a stratified bootstrap).
    None when no seed evaluated `step` in both arms or a seed's per-example file is missing."""
    seeds = sorted(set(points.values(a, step, bench, metric).index) & set(points.values(b, step, bench, metric).index))
    if not seeds:
        return None
    if bench != MEAN_BENCH:
        found = _seed_differences(points, a, b, step, bench, metric, seeds)
        if found is None or found[0].empty:
            return None
        d, dropped = found
        res = paired_bootstrap(d.to_numpy(), np.zeros(len(d)), points.n_boot, points.boot_seed, points.conf)
        return ArmsPaired(res, seeds, dropped)
    deltas, boots, n, dropped = [], [], 0, 0
    for qa_bench in points.qa:
        found = _seed_differences(points, a, b, step, qa_bench, metric, seeds)
        if found is None or found[0].dropna().empty:
            return None
        d = found[0].dropna().to_numpy()
        deltas.append(float(d.mean()))
        boots.append(bootstrap_means(d, points.n_boot, points.boot_seed))
        n, dropped = n + d.size, dropped + found[1]
    boot = np.mean(boots, axis=0)
    lo, hi = percentile_limits(boot, points.conf)
    return ArmsPaired(PairedResult(float(np.mean(deltas)), lo, hi, n, float((boot <= 0).mean())),
                      seeds, dropped)
