"""The pre-vs-post table (`tables/prepost.md|tex`): each run's value before and after training, per bench.

    pre    RL runs (a run with its own evaluated step 0, i.e. `checkpoints/step-000000` is the starting
           model): that step-0 evaluation, under the same prompt as the later steps. SFT arms: the
           anchor (the base model with the `anchor_nudge` prompt).
    post   the run's last evaluated step with a score for the bench (its final evaluated step unless the cell
           names that step and why it has none there), with the `conf` CI of post − pre over the same item ids: 0/1 scores
           (EM) get Tango's score interval for paired proportions (analysis.stats.tango_limits: a paired t over
           few discordant 0/1 items covered as little as 0.87 at 95% in simulation), other values the crossed model of
           the other paired tables (analysis.variance) with one post seed and pre seedless, a paired t over the
           items; differences that never vary, one item included: 0/1 scores get the exact bounds of
           analysis.variance.exact_bounds, other values no CI, never a zero-width one. The `interval` column
           names the one each row got.
    best   the step (> 0) with the highest value, labelled "selected on test": chosen on the very
           items it is reported on, so optimistic, and given without a CI.

Pairing needs the same evaluation: the two evaluations' recorded identities (meta.json, evals.identity)
are compared key by key, and every difference other than the expected ones (`EXPECTED_DIFFERENCES`:
an RL run's pre and post differ only in the checkpoint; an SFT arm's pre is the anchor, so the
checkpoint and prompt=anchor_nudge differ by design) is listed as a problem and the pair gets no CI;
so does a pair without a recorded identity. Then identical item ids are required; when pre and post
evaluated different items the CI is not computed and the mismatch is listed as a problem, never
silently intersected. `size_problems` lists every evaluation whose item count differs from its
profile's reference size (`recipes/eval/*.yaml`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.collect import example_metric, no_score_reason, qa_label
from analysis.discover import Run, read_json_object
from analysis.stats import PairedResult, tango_limits
from analysis.tables import DASH, Column, Table, dash
from analysis.variance import Term, crossed_parts, exact_bounds, is_binary, limits
from common.fingerprint import fingerprint_diff
from evals.registry import kind_of

QA_METRICS = ("em", "f1")
LABELS = {"em": "EM", "f1": "F1"}   # any other metric is shown by its name
COLUMNS = ["bench (context mode)", "metric", "pre", "post (last scored step)", "Δ post − pre [{conf:.0%} CI]", "n", "interval",
           "best (selected on test)"]


# The evaluation-identity keys (prefixes of evals.identity's flat keys) in which pre and post differ by
# design, per kind of pre: any other difference makes the pair incomparable (a problem, no CI).
EXPECTED_DIFFERENCES = {
    "step 0": ("checkpoint.",),                       # an RL run: its starting checkpoint, same settings
    "anchor": ("checkpoint.", "evaluate.prompt"),     # an SFT arm: the base model, prompt=anchor_nudge
}


def unexpected_differences(pre: dict, post: dict, pre_source: str) -> list[str]:
    """`key: pre -> post` for every identity key (flat `keys` maps) that differs beyond the expected ones."""
    expected = EXPECTED_DIFFERENCES[pre_source]

    def kept(keys: dict) -> dict:
        return {k: v for k, v in keys.items() if not k.startswith(expected)}

    return fingerprint_diff(kept(pre), kept(post))


def bench_metrics(bench: str) -> tuple[str, ...]:
    headline = kind_of(bench).headline   # an environment bench: its one metric (evals.registry)
    return (headline,) if headline else QA_METRICS


@dataclass
class PrePostRow:
    run: str
    bench: str
    metric: str
    pre_source: str  # "step 0" | "anchor"
    pre: float
    post: float
    post_step: int
    paired: PairedResult | None
    best: float
    best_step: int
    final: tuple[int, str] | None = None   # (the run's final step, why it has no value) where post is an earlier step
    why: str | None = None   # why `paired` is None: the Δ cell's reason (also listed among the problems)


@dataclass
class PrePost:
    rows: list[PrePostRow] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    conf: float = 0.95

    def table(self) -> Table:
        caption = ("Pre vs post training per run. pre: the run's own step-0 evaluation (RL runs: the starting "
                   "checkpoint, same prompt as later steps) or, for SFT arms, the anchor (base model, "
                   "anchor_nudge prompt). post: the run's last evaluated step with a score for the bench, its final evaluated "
                   f"step unless the cell says why that one has none; Δ with a {self.conf:.0%} CI over identical "
                   "item ids, its method in the interval column: Tango score = the score interval for paired proportions of "
                   "Tango (1998) (0/1 scores), paired t = a paired t over the items (other values), exact = exact bounds "
                   "for 0/1 differences that never vary. best: the best step, selected on the test items (optimistic, "
                   "no CI).")
        table = Table(caption, [Column("", "", c.format(conf=self.conf), "") for c in COLUMNS], row_header="Run")
        for r in self.rows:
            delta = dash(r.why) if r.paired is None else f"{r.paired.delta:+.3f} [{r.paired.lo:+.3f}, {r.paired.hi:+.3f}]"
            n, method = (DASH, DASH) if r.paired is None else (str(r.paired.n), r.paired.method)
            pre = f"{r.pre:.3f} ({'anchor' if r.pre_source == 'anchor' else 'step 0'})"
            post = f"{r.post:.3f} @{r.post_step}" + (f" (not the final step {r.final[0]}: {r.final[1]})" if r.final else "")
            table.rows.append((r.run, [qa_label(r.bench), LABELS.get(r.metric, r.metric), pre, post,
                                       delta, n, method, f"{r.best:.3f} @{r.best_step}"]))
        return table


def _summary_value(eval_dir: Path, bench: str, metric: str, problems: list[str]) -> tuple[float | None, str]:
    """The bench's `metric` in summary.json, or None and why: the bench is not in it, has no score
    (analysis.collect.no_score_reason: e.g. none of its items generated a token, its 0 no score of the model's)
    or its value is not a number."""
    summary = read_json_object(eval_dir / "summary.json", problems) or {}
    if not isinstance(entry := summary.get(bench), dict):
        return None, "not evaluated there"
    if why := no_score_reason(entry):
        return None, why
    value = entry.get(metric)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return (float(value), "") if ok else (None, f"no {metric} value there")


def _summary_n(eval_dir: Path, bench: str) -> int | None:
    n = ((read_json_object(eval_dir / "summary.json", []) or {}).get(bench) or {}).get("n")
    return n if isinstance(n, int) and not isinstance(n, bool) else None


def size_problems(eval_dirs: dict[str, Path], reference_sizes: dict[str, int]) -> list[str]:
    """One line per (evaluation, bench) whose evaluated n differs from the reference size."""
    problems = []
    for label, d in eval_dirs.items():
        for bench, size in reference_sizes.items():
            n = _summary_n(d, bench)
            if n is not None and n != size:
                problems.append(f"{label} × {bench}: evaluated {n} items, the reference size is {size} ({d})")
    return problems


def _identity_keys(eval_dir: Path, bench: str) -> dict | None:
    """The flat identity keys meta.json records for `bench` (None when it records none)."""
    record = ((read_json_object(eval_dir / "meta.json", []) or {}).get("identities") or {}).get(bench)
    keys = record.get("keys") if isinstance(record, dict) else None
    return keys if isinstance(keys, dict) else None


def identity_problem(pre_dir: Path, post_dir: Path, bench: str, pre_source: str) -> str | None:
    """Why pre and post of `bench` are not one evaluation of two checkpoints (None when they are)."""
    pre, post = _identity_keys(pre_dir, bench), _identity_keys(post_dir, bench)
    if pre is None or post is None:
        where = ", ".join(str(d / "meta.json") for d, k in ((pre_dir, pre), (post_dir, post)) if k is None)
        return f"no recorded evaluation identity ({where}): not paired"
    diff = unexpected_differences(pre, post, pre_source)
    if diff:
        return f"pre and post were evaluated under different settings ({'; '.join(diff)}): not paired"
    return None


def paired_prepost(pre: pd.Series, post: pd.Series, conf: float) -> tuple[PairedResult | None, str | None]:
    """post − pre over identical item ids (ordered by id) with its interval (paired_limits; exact bounds where no
    difference varies), or (None, why) when the id sets differ or no interval can be formed."""
    only_pre, only_post = set(pre.index) - set(post.index), set(post.index) - set(pre.index)
    if only_pre or only_post:
        return None, (f"item ids differ (pre n={len(pre)}, post n={len(post)}; {len(only_pre)} only in pre, "
                      f"{len(only_post)} only in post): not paired")
    ids = sorted(pre.index)
    a, b = post.loc[ids].to_numpy(float), pre.loc[ids].to_numpy(float)
    d = a - b
    if d.size and np.ptp(d) < 1e-12:   # differences that never vary: no variance to scale a t by
        bounds = exact_bounds([[Term("post", 1.0, a[:, None]), Term("pre", -1.0, b[:, None])]], [1.0], conf)
        if bounds is None:
            return None, f"every item differs by the same amount ({float(d.mean()):+.3f}): no variance, no CI"
        return PairedResult(float(d.mean()), *bounds, int(d.size), "exact"), None
    lo, hi = paired_limits(a, b, conf)
    return PairedResult(float(d.mean()), float(lo), float(hi), int(d.size), "Tango score" if is_binary(a, b) else "paired t"), None


def paired_limits(post: np.ndarray, pre: np.ndarray, conf: float) -> tuple[np.ndarray, np.ndarray]:
    """The `conf` interval of the mean of post − pre over the items (the last axis; any leading axes). Every value 0
    or 1: Tango's score interval for paired proportions (analysis.stats.tango_limits). Else the crossed model of the
    other paired tables with one post seed and pre seedless, i.e. a paired t on n − 1 df."""
    if is_binary(post, pre):
        return tango_limits((post > pre).sum(axis=-1), (post < pre).sum(axis=-1), np.shape(post)[-1], conf)
    terms = [Term("post", 1.0, post[..., None], random_seeds=False), Term("pre", -1.0, pre[..., None], random_seeds=False)]
    return limits(crossed_parts([terms]), conf)


def prepost(runs: list[Run], anchor_dir: Path | None, benches: list[str], *, conf: float = 0.95) -> PrePost:
    out = PrePost(conf=conf)
    for run in runs:
        label = f"{run.arm}/seed{run.seed}"
        later = sorted(s for s in run.evals if s > 0)
        if not later:
            continue
        own_start = 0 in run.evals
        pre_dir = run.evals[0] if own_start else anchor_dir
        if pre_dir is None or not (pre_dir / "summary.json").is_file():
            out.problems.append(f"{label}: no pre value (no step-0 evaluation and no anchor evaluation)")
            continue
        for bench in benches:
            for metric in bench_metrics(bench):
                values = {s: _summary_value(run.evals[s], bench, metric, out.problems) for s in later}
                series = {s: v for s, (v, _) in values.items() if v is not None}
                pre, _ = _summary_value(pre_dir, bench, metric, out.problems)
                if not series or pre is None:
                    continue
                post_step = max(series)   # the final step where it has a value; else the last one that has, said so
                final = None if post_step == later[-1] else (later[-1], values[later[-1]][1])
                best_step = min(series, key=lambda s: (-series[s], s))
                where = f"{label} × {bench} ({metric})"
                source = "step 0" if own_start else "anchor"
                paired, why = None, None
                pre_ex = example_metric(pre_dir, bench, metric, out.problems)
                post_ex = example_metric(run.evals[post_step], bench, metric, out.problems)
                if pre_ex is None or post_ex is None:
                    why = "no per-example results to pair, no CI"
                elif not (why := identity_problem(pre_dir, run.evals[post_step], bench, source)):
                    paired, why = paired_prepost(pre_ex, post_ex, conf)
                if why:
                    out.problems.append(f"{where}: {why}")
                out.rows.append(PrePostRow(label, bench, metric, source, pre, series[post_step], post_step, paired,
                                           series[best_step], best_step, final, why))
    return out

