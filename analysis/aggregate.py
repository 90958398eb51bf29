"""From the tidy table to plotted/tabulated numbers: curves with 95% bands, final/best points, paired deltas.

Every interval comes from one variance model (analysis.variance): items and seeds both random and
crossed, the anchor without seed variance, the estimate's variance from the two-way mean squares and a
t on Satterthwaite df (Wilson's interval on the effective n for one arm's 0/1 score; Tango's score interval for
one seed against the anchor or one seed of another arm on 0/1 scores: analysis.variance.discordant_limits). One seed: the
interval covers the items only and says so. No per-example file: a t across seed means (covers seeds,
the items taken as fixed) for >= 2 seeds, else a bare point. Each interval computed is also recorded in
`Points.records` (written as intervals.csv beside results.csv: its bounds, what it covers and its n).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.collect import MEAN_BENCH, example_metric
from analysis.discover import ANCHOR_ARM, read_json_object
from analysis.stats import t_quantile
from analysis.variance import (COVERS_NONE, COVERS_SEEDS, Estimate, Term, estimate, is_binary)
from common.layout import step_name

NAN_INTERVAL = Estimate(math.nan, math.nan, math.nan, math.nan, math.nan, 0, "", COVERS_NONE, "point")
# A band over K steps: each step's two-sided interval at the Bonferroni level 1 − α/K (α/(2K) in each tail).
INTERVAL_COLUMNS = ["kind", "arm", "vs", "step", "bench", "metric", "estimate", "lo", "hi", "conf", "covers",
                    "n_items", "n_seeds", "df", "method", "note"]


def seed_t(values: np.ndarray, conf: float, n_items: int = 0) -> Estimate:
    """No per-item file: a t interval across the seed means (covers seeds, items taken as fixed)."""
    x = np.asarray(values, float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return NAN_INTERVAL
    mean = float(x.mean())
    if x.size == 1:
        return Estimate(mean, math.nan, math.nan, math.nan, math.nan, n_items, "1", COVERS_NONE, "point",
                        "one seed and no per-item file")
    se = float(x.std(ddof=1)) / math.sqrt(x.size)
    half = t_quantile((1 + conf) / 2, x.size - 1) * se
    return Estimate(mean, mean - half, mean + half, se, float(x.size - 1), n_items, str(x.size), COVERS_SEEDS,
                    "seed t", "no per-item file: items taken as fixed")


@dataclass
class Band:
    """A band over the steps of a curve: per-step means and limits, with what it covers."""

    steps: list[int]
    mean: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    level: float       # each step's confidence level (Bonferroni)
    method: str
    covers: str
    n_items: int
    n_seeds: str


@dataclass
class Points:
    """The tidy table (with `avg` rows) and where each (arm, seed, step)'s examples live."""

    table: pd.DataFrame
    eval_dirs: dict[tuple[str, int, int], Path]
    qa: list[str]  # the benches averaged into `avg`
    conf: float = 0.95
    problems: list[str] = field(default_factory=list)
    # (arm, seed, step, bench) -> why evaluate gave it no score (analysis.collect.Collected.nulls)
    nulls: dict[tuple[str, int, int, str], str] = field(default_factory=dict)
    # Every interval computed, as a row of intervals.csv (INTERVAL_COLUMNS).
    records: dict[tuple, dict] = field(default_factory=dict)
    # (arm, bench, metric) -> why no simultaneous band is drawn (a labelled gap)
    band_gaps: dict[tuple[str, str, str], str] = field(default_factory=dict)
    # Figures and tables ask for the same cells; each interval is computed once.
    _intervals: dict[tuple, Estimate] = field(default_factory=dict, repr=False)
    _n: dict[tuple, int] | None = field(default=None, repr=False)

    def record(self, kind: str, arm: str, vs: str, step, bench: str, metric: str, e: Estimate,
               conf: float | None = None) -> Estimate:
        row = dict(kind=kind, arm=arm, vs=vs, step=step, bench=bench, metric=metric, estimate=e.mean, lo=e.lo,
                   hi=e.hi, conf=self.conf if conf is None else conf, covers=e.covers, n_items=e.n_items,
                   n_seeds=e.n_seeds, df=e.df, method=e.method, note=e.note)
        self.records[(kind, arm, vs, str(step), bench, metric)] = row
        return e

    def intervals_frame(self) -> pd.DataFrame:
        rows = [self.records[k] for k in sorted(self.records)]
        return pd.DataFrame(rows, columns=INTERVAL_COLUMNS)

    def values(self, arm: str, step: int, bench: str, metric: str) -> pd.Series:
        """Seed -> value at one step."""
        t = self.table
        sel = t[(t.arm == arm) & (t.step == step) & (t.bench == bench) & (t.metric == metric)]
        return sel.set_index("seed")["value"].sort_index()

    def summary_n(self, arm: str, seed_steps: list[tuple[int, int]], bench: str, metric: str) -> int:
        """The fewest items one of `arm`'s (seed, step) evaluated, as its summary.json counts them (0: unknown)."""
        t, want = self.table, set(seed_steps)
        sel = t[(t.arm == arm) & (t.bench == bench) & (t.metric == metric)]
        return max(min((int(n) for s, st, n in zip(sel.seed, sel.step, sel.n) if (int(s), int(st)) in want), default=0), 0)

    def no_score(self, arm: str, bench: str) -> str | None:
        """Why `arm` has no score of `bench` where evaluate gave it none (its latest such point; for
        `avg`, the first averaged bench without one), else None."""
        if bench == MEAN_BENCH:
            held = next((b for b in self.qa if self.no_score(arm, b)), None)
            return None if held is None else f"no mean: {held} has no score"
        hits = sorted((step, seed, why) for (a, seed, step, b), why in self.nulls.items() if (a, b) == (arm, bench))
        return f"no score: {hits[-1][2]}" if hits else None

    def unscored(self, arm: str, seed_steps: list[tuple[int, int]], bench: str, metric: str) -> str | None:
        """Why one of `arm`'s (seed, step) has no value of `bench` (the first such), else None."""
        for seed, step in seed_steps:
            if seed in self.values(arm, step, bench, metric).index:
                continue
            if bench == MEAN_BENCH:
                held = next((b for b in self.qa if self.unscored(arm, [(seed, step)], b, metric)), bench)
                why = self.nulls.get((arm, seed, step, held))
                return f"no mean: {held} " + ("has no score" if why else f"not evaluated at {where(arm, seed, step)}")
            why = self.nulls.get((arm, seed, step, bench))
            return f"no score: {why}" if why else f"not evaluated at {where(arm, seed, step)}"
        return None

    def no_examples(self, arm: str, seed: int, step: int, bench: str, metric: str) -> str:
        return f"no per-item {metric}: {where(arm, seed, step)} {bench}.jsonl"

    def examples(self, arm: str, seed: int, step: int, bench: str, metric: str) -> pd.Series | None:
        if self._n is None:   # each point's n as its summary.json counts it: a rows file of another count is not its items
            t = self.table
            self._n = dict(zip(zip(t.arm, t.seed, t.step, t.bench), map(int, t.n)))
        d = self.eval_dirs.get((arm, seed, step))
        return None if d is None else example_metric(d, bench, metric, self.problems, self._n.get((arm, seed, step, bench)))

    def matrix(self, arm: str, seed_steps: list[tuple[int, int]], bench: str, metric: str) -> pd.DataFrame | None:
        """Items × seeds: each (seed, step)'s per-item scores, over the ids every one of them has (None
        when one has no per-item file)."""
        cols = []
        for seed, step in seed_steps:
            ex = self.examples(arm, seed, step, bench, metric)
            if ex is None or ex.empty:
                return None
            cols.append(ex.rename(seed))
        m = pd.concat(cols, axis=1, join="inner")
        return m.loc[sorted(m.index)] if not m.empty else None

    def arm_estimate(self, arm: str, seed_steps: list[tuple[int, int]], bench: str, metric: str,
                     level: float | None = None) -> Estimate | None:
        """One arm's score (the stratified mean of the QA benches for `avg`) under the crossed model, or None
        when a per-item file is missing."""
        strata, binary = [], True
        for b in (self.qa if bench == MEAN_BENCH else [bench]):
            m = self.matrix(arm, seed_steps, b, metric)
            if m is None:
                return None
            strata.append([Term(arm, 1.0, m.to_numpy(float), random_seeds=arm != ANCHOR_ARM)])   # greedy: no seed
            binary = binary and is_binary(m.to_numpy(float))
        return estimate(strata, self.conf, binary=binary and bench != MEAN_BENCH, level=level)

    def interval(self, arm: str, step: int, bench: str, metric: str) -> Estimate:
        key = (arm, step, bench, metric)
        if key not in self._intervals:
            self._intervals[key] = self.record("curve", arm, "", step, bench, metric,
                                               self._interval(arm, step, bench, metric))
        return self._intervals[key]

    def _interval(self, arm: str, step: int, bench: str, metric: str) -> Estimate:
        vals = self.values(arm, step, bench, metric)
        if vals.empty:
            return NAN_INTERVAL
        seed_steps = [(int(s), step) for s in vals.index]
        got = self.arm_estimate(arm, seed_steps, bench, metric)
        return got if got is not None else seed_t(vals.to_numpy(float), self.conf, self.summary_n(arm, seed_steps, bench, metric))

    def simultaneous(self, arm: str, bench: str, metric: str, steps: list[int]) -> Band | None:
        """The simultaneous band over the arm's evaluated `steps`: each step's crossed-model interval at the
        Bonferroni level 1 − α/K (α/(2K) a tail), over the seeds that evaluated every step. None for the QA mean or
        < 2 steps; a step without an interval (one item and one seed, no per-item file) leaves no band
        and its reason in `band_gaps`."""
        if bench == MEAN_BENCH:
            return None
        have = [(s, self.values(arm, s, bench, metric)) for s in steps]
        have = [(s, v) for s, v in have if not v.empty]
        if len(have) < 2:
            return None
        done = [s for s, _ in have]
        seeds = sorted(set.intersection(*(set(v.index) for _, v in have)))
        if not seeds:
            self.band_gaps[(arm, bench, metric)] = "no seed evaluated every step"
            return None
        level = 1 - (1 - self.conf) / len(done)
        per_step = [self.arm_estimate(arm, [(int(sd), s) for sd in seeds], bench, metric, level=level) for s in done]
        missing = next((e for e in per_step if e is None or e.covers == COVERS_NONE), False)
        if missing is not False:
            why = "no per-item file" if missing is None else missing.note
            self.band_gaps[(arm, bench, metric)] = why
            return None
        band = Band(done, np.array([e.mean for e in per_step]), np.array([e.lo for e in per_step]),
                    np.array([e.hi for e in per_step]), level, per_step[0].method, per_step[0].covers,
                    min(e.n_items for e in per_step), per_step[0].n_seeds)
        for s, e in zip(done, per_step):
            self.record("band", arm, "", s, bench, metric, e, conf=level)
        return band


def where(arm: str, seed: int, step: int) -> str:
    """A checkpoint as the report's missing points name it (`A/seed1/step-000020`; the anchor: `anchor`)."""
    return ANCHOR_ARM if arm == ANCHOR_ARM else f"{arm}/seed{seed}/{step_name(step)}"


def metric_rows(table: pd.DataFrame, bench: str, metric: str) -> pd.DataFrame:
    return table[(table.bench == bench) & (table.metric == metric)]


def curve(points: Points, arm: str, bench: str, metric: str, steps: list[int]) -> pd.DataFrame:
    """mean/lo/hi per step for one arm; steps without data are NaN rows (drawn as gaps)."""
    rows = []
    for step in steps:
        iv = points.interval(arm, step, bench, metric)
        rows.append(dict(step=step, mean=iv.mean, lo=iv.lo, hi=iv.hi, n=iv.n_items, n_seeds=iv.n_seeds,
                         method=iv.method, covers=iv.covers))
    return pd.DataFrame(rows, columns=["step", "mean", "lo", "hi", "n", "n_seeds", "method", "covers"])


def anchor_value(points: Points, bench: str, metric: str) -> Estimate:
    return points.interval(ANCHOR_ARM, 0, bench, metric)


@dataclass
class Selected:
    interval: Estimate
    steps: list[int]  # the step(s) the value comes from (one per seed for "final")


def final_steps(points: Points, arm: str, benches: list[str]) -> list[tuple[int, int]]:
    """(seed, its final checkpoint) of `arm`: the last step at which the seed evaluated any of `benches`, so
    that a row's cells (its Avg. too) all come from one checkpoint per seed."""
    own = points.table[(points.table.arm == arm) & points.table.bench.isin(benches)]
    last: dict[int, int] = {}
    for seed, step in [*zip(own.seed, own.step), *((sd, st) for (a, sd, st, b) in points.nulls if a == arm and b in benches)]:
        last[int(seed)] = max(int(step), last.get(int(seed), int(step)))
    return sorted(last.items())


def final_point(points: Points, arm: str, bench: str, metric: str,
                last: list[tuple[int, int]] | None = None) -> Selected | str | None:
    """The seeds at their final checkpoint (`last`, else each seed's last step evaluated on `bench`) and
    their items under the crossed model; why not (str) when one of them has no value of `bench`."""
    last = last or final_steps(points, arm, [bench])
    if not last:
        return None
    if why := points.unscored(arm, last, bench, metric):
        return why
    steps = sorted({t for _, t in last})
    if len(steps) == 1:
        return Selected(points.interval(arm, steps[0], bench, metric), steps)
    got = points.arm_estimate(arm, last, bench, metric)
    if got is None:
        vals = [points.values(arm, t, bench, metric).get(s, math.nan) for s, t in last]
        got = seed_t(np.array(vals, float), points.conf, points.summary_n(arm, last, bench, metric))
    return Selected(points.record("final", arm, "", "/".join(map(str, steps)), bench, metric, got), steps)


def best_point(points: Points, arm: str, bench: str, metric: str) -> Selected | str | None:
    """The step with the highest seed-mean (earliest on ties) among the steps every seed of `arm` evaluated
    (a step fewer seeds reached is no mean of the same seeds); why not (str) when there is none. Chosen on
    the eval set: optimistic."""
    rows = metric_rows(points.table, bench, metric)
    rows = rows[rows.arm == arm]
    if rows.empty:
        return None
    n_seeds = rows.groupby("step").seed.nunique()
    rows = rows[rows.step.isin(n_seeds.index[n_seeds == rows.seed.nunique()])]
    if rows.empty:
        return "no step every seed evaluated"
    means = rows.groupby("step").value.mean().sort_index()
    step = int(means.idxmax())
    return Selected(points.interval(arm, step, bench, metric), [step])


@dataclass
class Paired:
    result: Estimate
    steps: list[int]
    dropped: int  # items not evaluated by every seed and the anchor (left out of the pairing)
    dropped_ids: list[str] = field(default_factory=list)


def _series_ids(series: list[pd.Series]) -> set:
    return set().union(*(set(s.index) for s in series)) if series else set()


def paired_vs_anchor(points: Points, arm: str, bench: str, metric: str,
                     last: list[tuple[int, int]] | None = None) -> Paired | str | None:
    """Final checkpoint of `arm` (`last`, else each seed's last step evaluated on `bench`) minus the anchor
    over the item ids both have, under the crossed model: items random and shared, the arm's seeds random,
    the anchor seedless. None for the QA mean or no evaluation of `arm`; why not (str) when one is missing, which
    intervals.csv records too (no bounds, the reason as its note: a model card's cell says what the table's does)."""
    last = last or final_steps(points, arm, [bench])
    if bench == MEAN_BENCH or not last:
        return None
    got = _paired_vs_anchor(points, arm, bench, metric, last)
    if isinstance(got, str):
        steps = "/".join(map(str, sorted({t for _, t in last})))
        points.record("vs_anchor", arm, ANCHOR_ARM, steps, bench, metric, replace(NAN_INTERVAL, note=got))
    return got


def _paired_vs_anchor(points: Points, arm: str, bench: str, metric: str, last: list[tuple[int, int]]) -> Paired | str:
    if why := points.unscored(arm, last, bench, metric):
        return why
    if points.values(ANCHOR_ARM, 0, bench, metric).empty:
        return f"the anchor: {(points.no_score(ANCHOR_ARM, bench) or 'not evaluated')}"
    if diff := anchor_differences(points, arm, bench, last):
        return f"the anchor was evaluated under other settings ({'; '.join(diff)}): not paired"
    anchor = points.examples(ANCHOR_ARM, 0, 0, bench, metric)
    per_seed = [points.examples(arm, s, t, bench, metric) for s, t in last]
    if missing := next(((a, s, t) for (a, s, t), e in zip([(ANCHOR_ARM, 0, 0), *((arm, s, t) for s, t in last)],
                                                          [anchor, *per_seed]) if e is None or e.empty), None):
        return points.no_examples(*missing, bench, metric)
    m = pd.concat([e.rename(s) for e, (s, _) in zip(per_seed, last)], axis=1, join="inner")
    ids = sorted(m.index.intersection(anchor.index))
    dropped = sorted(map(str, _series_ids(per_seed + [anchor]) - set(ids)))
    if not ids:
        return "no item id shared by every seed and the anchor"
    terms = [Term(arm, 1.0, m.loc[ids].to_numpy(float)),
             Term(ANCHOR_ARM, -1.0, anchor.loc[ids].to_numpy(float)[:, None], random_seeds=False)]
    steps = sorted({t for _, t in last})
    est = estimate([terms], points.conf)
    points.record("vs_anchor", arm, ANCHOR_ARM, "/".join(map(str, steps)), bench, metric, est)
    return Paired(est, steps, len(dropped), dropped)


@dataclass
class ArmsPaired:
    """Arm `a` minus arm `b` at one step over the items both evaluated (every seed of each arm)."""

    result: Estimate
    seeds: dict[str, list[int]]   # each arm's seeds
    dropped: int  # items left out: not evaluated by every seed of both arms
    dropped_ids: list[str] = field(default_factory=list)


def paired_arms(points: Points, a: str, b: str, step: int, bench: str, metric: str) -> ArmsPaired | str:
    """`a` − `b` at `step` under the crossed model: the same items (ids every seed of both arms evaluated),
    each arm's seeds drawn on their own (seed s of a is not paired with seed s of b), so the interval
    covers items and both arms' seeds ("items" only when an arm has one seed; one seed each on 0/1 scores: Tango's
    score interval). For the QA mean (`avg`) the benches are strata of equal weight. Why not (str) when an arm has no seed at `step` or a per-item
    file is missing."""
    seeds = {arm: sorted(int(s) for s in points.values(arm, step, bench, metric).index) for arm in (a, b)}
    if lost := next((arm for arm in (a, b) if not seeds[arm]), None):
        return f"{lost}: not evaluated at step {step}"
    strata, dropped = [], []
    for qa_bench in (points.qa if bench == MEAN_BENCH else [bench]):
        per = {arm: [points.examples(arm, s, step, qa_bench, metric) for s in seeds[arm]] for arm in (a, b)}
        if missing := next(((arm, s) for arm in (a, b) for e, s in zip(per[arm], seeds[arm]) if e is None or e.empty), None):
            return points.no_examples(*missing, step, qa_bench, metric)
        ma, mb = (pd.concat([e.rename(s) for e, s in zip(per[arm], seeds[arm])], axis=1, join="inner") for arm in (a, b))
        ids = sorted(ma.index.intersection(mb.index))
        if not ids:
            return f"no item id of {qa_bench} evaluated by every seed of both arms"
        prefix = f"{qa_bench}:" if bench == MEAN_BENCH else ""
        dropped += [prefix + str(i) for i in sorted(map(str, _series_ids(per[a] + per[b]) - set(ids)))]
        strata.append([Term(a, 1.0, ma.loc[ids].to_numpy(float)), Term(b, -1.0, mb.loc[ids].to_numpy(float))])
    est = estimate(strata, points.conf)
    points.record("compare", a, b, step, bench, metric, est)
    return ArmsPaired(est, seeds, len(dropped), dropped)


# Identity keys in which two arms' evaluations differ by design (the checkpoint evaluated).
CHECKPOINT_KEYS = ("checkpoint.",)


def _settings(eval_dir: Path, bench: str) -> dict | None:
    """The result-changing settings meta.json records for `bench` (its identity keys but the checkpoint's)."""
    record = ((read_json_object(eval_dir / "meta.json", []) or {}).get("identities") or {}).get(bench)
    keys = record.get("keys") if isinstance(record, dict) else None
    return {k: v for k, v in keys.items() if not k.startswith(CHECKPOINT_KEYS)} if isinstance(keys, dict) else None


def anchor_differences(points: Points, arm: str, bench: str, last: list[tuple[int, int]]) -> list[str]:
    """`key: the anchor's value -> the arm's` for each result-changing setting in which the anchor's evaluation of `bench`
    differs from one of `arm`'s at `last` (unrecorded identities: none), but the prompt (anchor_nudge by design) and the n
    (the pair is over the ids both have, the others counted as dropped)."""
    from common.fingerprint import fingerprint_diff

    def kept(d: Path | None) -> dict | None:
        keys = None if d is None else _settings(d, bench)
        return None if keys is None else {k: v for k, v in keys.items() if k not in ("evaluate.prompt", "bench.n")}

    anchor = kept(points.eval_dirs.get((ANCHOR_ARM, 0, 0)))
    found = [k for s, t in last if (k := kept(points.eval_dirs.get((arm, s, t)))) is not None] if anchor is not None else []
    return sorted({d for k in found for d in fingerprint_diff(anchor, k)})


def recorded_settings(points: Points, bench: str) -> list[tuple[str, dict]]:
    """(where, settings) of every evaluation of `bench` whose meta.json records its identity, in point order."""
    return [(where(a, s, t), k) for (a, s, t), d in sorted(points.eval_dirs.items()) if (k := _settings(d, bench)) is not None]


def values_seen(held: list[tuple[str, dict]], key: str) -> list[tuple[object, list[str]]]:
    """Each value of `key` among `held` (compared by value: 1 == 1.0; `unset` where one lacks it), as first recorded,
    with where it was recorded, in the order first seen."""
    seen: dict[str, tuple[object, list[str]]] = {}
    for at, k in held:
        v = k.get(key, "unset")
        seen.setdefault(by_value(v), (v, []))[1].append(at)
    return list(seen.values())


def by_value(v) -> str:
    """A recorded setting's value as compared: an int as the equal float (1 == 1.0), a bool as itself."""
    return repr(float(v) if isinstance(v, int) and not isinstance(v, bool) else v)


def seen_text(seen: list[tuple[object, list[str]]]) -> str:
    """`512 at anchor and 2 more, 1024 at r2e/seed1/step-000010`: each value with where it was first seen."""
    return ", ".join(f"{v} at {ats[0]}" + (f" and {len(ats) - 1} more" if len(ats) > 1 else "") for v, ats in seen)


def mixed_settings(points: Points, benches: list[str]) -> list[str]:
    """One line per bench whose evaluations (every point's and the anchor's, as meta.json records them) differ in a
    result-changing setting other than the checkpoint (and the anchor's prompt, anchor_nudge by design): each value
    with where it was first seen and how many more share it. Unrecorded identities are not compared."""
    out = []
    for bench in benches:
        held = recorded_settings(points, bench)
        parts = []
        for key in sorted({key for _, k in held for key in k}):
            among = [(at, k) for at, k in held if at != ANCHOR_ARM] if key == "evaluate.prompt" else held
            if len(seen := values_seen(among, key)) > 1:
                parts.append(f"{key}: " + seen_text(seen))
        if parts:
            out.append(f"{bench}: its evaluations differ in settings ({'; '.join(parts)}): the report's numbers of {bench} "
                       "mix them (evaluate=true re-evaluates every point under one)")
    return out


def settings_differences(points: Points, a: str, b: str, benches: list[str]) -> list[str]:
    """`bench: key: A's value -> B's value` for each result-changing setting in which an evaluation of `a`
    differs from one of `b` (meta.json identities; evaluations that record none are not compared)."""
    from common.fingerprint import fingerprint_diff

    out: list[str] = []
    for bench in benches:
        found = {arm: [k for (x, _, _), d in sorted(points.eval_dirs.items()) if x == arm
                       if (k := _settings(d, bench)) is not None] for arm in (a, b)}
        if found[a] and found[b]:
            seen = set()
            for ka in found[a]:
                for kb in found[b]:
                    seen.update(fingerprint_diff(ka, kb))
            out += [f"{bench}: {d}" for d in sorted(seen)]
    return out
