"""The study's published numbers beside the measured ones (`analyze study=NAME`).

One table, `tables/reference.md|tex`: per `reference_results` entry of the study file, what the
reference reported (labelled "reported", never given an interval) and, where the entry names an
`arm` (and `step`), the value measured here at that point: the mean over seeds of the tidy table's
rows, shown only when it measures what the published number measured. That is: every run of the
arm trained the model the study's stage names for it (the anchor: the model the study's analyze
stage names), the point has every bench the published value covers (`avg`: each QA bench of the
study's profile, the Search-R1 seven), each at its `reference_sizes` n (else the entry's `n`), in
the same metric. Otherwise the cell says why not ("not comparable: tiny_base, 2 of 7 benches,
n=2"). Nothing here feeds a measured cell, a figure or a CI: the other tables are computed without
the study file, so editing `reference_results` changes only this table.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from analysis.collect import MEAN_BENCH, env_benches
from analysis.discover import ANCHOR_ARM, Run
from analysis.tables import DASH, Column, Table
from common.benchmarks import canonical_bench_key
from common.cli import ConfigError
from common.study import TRAINING_RUNS, ReferenceResult, Study, StudyError


@dataclass(frozen=True)
class Expected:
    """What a measured point must share with the published numbers of the study."""
    models: dict[str, str | None]                          # arm -> the model the study names for it
    benches: list[str] = field(default_factory=list)      # what `avg` covers: the profile's QA benches
    sizes: dict[str, int] = field(default_factory=dict)   # bench -> its reference size


def _stage_arms(stage) -> list[str]:
    from common.recipes import DEFAULT_CHOICES

    if stage.run == "sweep":
        arms = stage.args.get("arms") or []
        return [str(a) for a in (arms if isinstance(arms, list) else [arms])]
    if stage.run == "grpo":
        return [f"grpo_{stage.args.get('task')}"]
    return [str(stage.args.get("arm") or DEFAULT_CHOICES["arm"])]


def _stage_model(stage) -> str | None:
    """The model path a training stage trains: its `model.path`, else its model recipe's."""
    from common.recipes import DEFAULT_CHOICES, load_recipe

    if stage.args.get("model.path") is not None:
        return str(stage.args["model.path"])
    path = load_recipe("model", str(stage.args.get("model") or DEFAULT_CHOICES["model"])).get("model", {}).get("path")
    return None if path is None else str(path)


def expected(study: Study) -> Expected:
    """The study's own settings (the file as written, not the command line's overrides)."""
    models: dict[str, str | None] = {}
    benches, sizes = [], {}
    for stage in study.stages:
        if stage.run in TRAINING_RUNS:
            try:
                model = _stage_model(stage)
            except ConfigError as exc:   # a model recipe the study names that does not exist
                raise StudyError(f"{study.path}: stage {stage.name}: {exc}") from None
            for arm in _stage_arms(stage):
                models.setdefault(arm, model)
        elif stage.run == "analyze":
            if stage.args.get("anchor") is not None:
                models.setdefault(ANCHOR_ARM, str(stage.args["anchor"]))
            if stage.args.get("profile") and not benches:
                from evals.profiles import load_profile

                profile = load_profile(str(stage.args["profile"]))
                sizes = dict(profile["reference_sizes"])
                benches = [b for b in (canonical_bench_key(str(b)) for b in profile["evaluate"].get("benches") or [])
                           if b not in env_benches()]
    return Expected(models=models, benches=benches, sizes=sizes)


def measured_models(runs: list[Run], anchor: str | None) -> dict[str, list[tuple[str | None, str]]]:
    """arm -> (model path, label) of each of its runs (config.yaml's model.path and model.name); the
    anchor's is `anchor` as analyze was given it."""
    out: dict[str, list[tuple[str | None, str]]] = {}
    for run in runs:
        model = (run.config or {}).get("model") or {}
        path = None if model.get("path") is None else str(model["path"])
        out.setdefault(run.arm, []).append((path, str(model.get("name") or path or "unknown model")))
    if anchor is not None:
        out[ANCHOR_ARM] = [(str(anchor), str(anchor))]
    return out


def _fmt(v: float | None) -> str:
    return DASH if v is None else f"{v:.3f}"


def reported_cell(r: ReferenceResult) -> str:
    if r.value is not None:
        text = _fmt(r.value)
    elif r.pre is not None and r.post is not None:
        text = f"{_fmt(r.pre)} → {_fmt(r.post)}"
    else:
        text = DASH
    return text + (f" ({r.note})" if r.note else "")


def _measured_at(table: pd.DataFrame, arm: str, step: int, bench: str, metric: str) -> tuple[float, int, int] | None:
    """(mean over seeds, seeds, n per seed) of one point, or None when the analysis has none."""
    rows = table[(table.arm == arm) & (table.step == step) & (table.bench == bench) & (table.metric == metric)]
    if rows.empty:
        return None
    return float(rows.value.mean()), int(rows.seed.nunique()), int(rows.n.max())


def _measured_text(point: tuple[float, int, int] | None, bench: str = "") -> tuple[str, str]:
    """(value, detail); an `avg` point's n is its benches' sum, so its detail says each is at its reference n."""
    if point is None:
        return DASH, ""
    n = "each bench at its reference n" if bench == MEAN_BENCH else f"n={point[2]}"
    return f"{point[0]:.3f}", f"{n}, {point[1]} seed(s)"


def _point_problems(r: ReferenceResult, table: pd.DataFrame, exp: Expected, step: int) -> list[str] | None:
    """Why the point (r.arm, step) does not measure what `r` published ([] when it does); None: no such point."""
    covered = (exp.benches or None) if r.bench == MEAN_BENCH else [r.bench]
    rows = table[(table.arm == r.arm) & (table.step == step) & (table.metric == r.metric)]
    if covered is None:   # `avg` with no profile in the study: what it covers is unknown
        return None if rows[rows.bench == MEAN_BENCH].empty else ["the study names no profile for the benches avg covers"]
    have = rows[rows.bench.isin(covered)]
    if have.empty and rows[rows.bench == r.bench].empty:
        return None
    why = []
    benches = min(int(have[have.seed == seed].bench.nunique()) for seed in rows.seed.unique())   # every seed's
    if benches != len(covered):
        why.append(f"{benches} of {len(covered)} benches")
    wrong = sorted({int(n) for b, n in zip(have.bench, have.n)
                    if exp.sizes.get(b, r.n if r.bench != MEAN_BENCH else None) not in (None, int(n))})
    if wrong:
        why.append("n=" + "/".join(str(n) for n in wrong))
    return why


def _model_problem(r: ReferenceResult, exp: Expected, models: dict[str, list[tuple[str | None, str]]]) -> list[str]:
    want = exp.models.get(r.arm)
    if want is None:
        return [f"the study names no model for arm {r.arm}"]
    if not models.get(r.arm):
        return [f"the model of arm {r.arm} is not recorded"]
    labels = sorted({label for path, label in models.get(r.arm, []) if path != want})
    return [", ".join(labels)] if labels else []


def measured_cell(r: ReferenceResult, table: pd.DataFrame, exp: Expected | None = None,
                  models: dict[str, list[tuple[str | None, str]]] | None = None) -> str:
    if r.arm is None or table.empty:
        return DASH
    exp = exp or Expected(models={})
    if r.value is not None:
        if r.step is None:
            return DASH
        points = {r.step: _measured_at(table, r.arm, r.step, r.bench, r.metric)}
    else:
        steps = sorted(table[table.arm == r.arm].step.unique())
        if not steps:
            return DASH
        last = int(steps[-1])
        points = {step: _measured_at(table, r.arm, step, r.bench, r.metric) for step in dict.fromkeys((0, last))}
    found = {step: why for step in points if (why := _point_problems(r, table, exp, step)) is not None}
    if not found:
        return DASH
    why = _model_problem(r, exp, models or {}) + list(dict.fromkeys(w for ws in found.values() for w in ws))
    if why:
        return "not comparable: " + ", ".join(why)
    if r.value is not None:
        text, detail = _measured_text(points[r.step], r.bench)
        return text if text == DASH else f"{text} ({detail})"
    pre, post = points[0], (points[max(points)] if max(points) != 0 else None)
    if pre is None and post is None:
        return DASH
    return f"{_measured_text(pre)[0]} → {_measured_text(post)[0]} @{max(points)} ({_measured_text(post or pre, r.bench)[1]})"


def reference_table(study: Study, table: pd.DataFrame, runs: list[Run] = (), anchor: str | None = None) -> Table:
    """`table`: the tidy table with its `avg` rows; `runs` and `anchor` (as analyze was given it): what was measured."""
    cols = [Column(bench="", metric="", label=label, group="") for label in
            ("Bench", "Metric", "n reported", "Reported by the reference", "Measured here")]
    t = Table(caption=f"Reported by the reference (study {study.name}, {study.path.name} sha256 {study.sha256[:12]}): "
                      f"published numbers, not measured here and never part of an interval; beside them the mean "
                      f"over seeds measured by this analysis at the same arm and step, only where it measures the "
                      f"same thing (the study's model, every bench the published value covers, each at its "
                      f"reference size, the same metric; else the cell says why not; {DASH}: no such point).",
              columns=cols, row_header="Reference system")
    exp, models = expected(study), measured_models(list(runs), anchor)
    for r in study.reference_results:
        t.rows.append((r.system, [r.bench, r.metric, DASH if r.n is None else str(r.n), reported_cell(r),
                                  measured_cell(r, table, exp, models)]))
    return t
