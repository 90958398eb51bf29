"""The report half of `analyze`: evaluations on disk -> tidy table -> curves, tables, report.

`write_analysis(cfg, runs=..., jobs=..., ev=..., ...)` reads the eval dirs and writes the report; what to
evaluate, and evaluating it (here or as Slurm jobs), is launch's (`launch.analyze.run_analysis(cfg,
evaluator=None)`, the Python API behind the `analyze` console script), which calls it last.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import DictConfig, ListConfig, OmegaConf

from analysis.aggregate import Points, final_steps, mixed_settings, settings_differences
from analysis.axes import build_axis
from analysis.collect import MEAN_BENCH, SEARCH_R1_BENCHES, add_mean_rows, collect, mean_label, qa_benches
from analysis.discover import ANCHOR_ARM, Run, anchor_eval_dir, discover_runs, read_json_object, replaced_dirs
from analysis.eval_settings import eval_settings
from analysis.figures import FigureInfo, Panel, plot_curves
from analysis.prepost import prepost, size_problems
from analysis.report import MissingPoint, MissingSteps, anchor_text, make_way, missing_count, write_report
from analysis.errors import AnalysisError
from analysis.tables import ENV, Table, agentic_benches, compare_table, main_table, paired_table, table_columns
from common.cards import file_label
from evals.registry import kind_of

DEFAULT_BENCHES = SEARCH_R1_BENCHES + ["search_plan_ood"]
# search_plan_ood's reward components; the harness names them `reward_<component>` (plain names accepted too).

EDGE = 4   # a run's pending checkpoints beyond 2 × EDGE: one missing line per bench, the first and last EDGE shown
FAILED_PREFIX = "evaluation failed: "   # a missing point's reason when its evaluation failed now
BEHAVIOUR = [("mean_tool_calls", "tool calls / episode"), ("format_failure_rate", "no answer found")]

def compare_pairs(value) -> list[tuple[str, str]]:
    """`compare=` as (A, B) pairs; AnalysisError (one line) for anything but a list of two different arm names."""
    pairs = []
    for i, pair in enumerate(OmegaConf.to_container(value) if isinstance(value, (DictConfig, ListConfig)) else value or []):
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(x, str) and x for x in pair)
                and pair[0] != pair[1]):
            raise AnalysisError(f"compare[{i}]={pair!r}: expected a pair of two different arm names, "
                                "e.g. compare=[[r2e,r2e_v5]]")
        pairs.append((pair[0], pair[1]))
    return pairs


@dataclass
class AnalysisResult:
    out: Path
    table: pd.DataFrame
    figures: list[FigureInfo] = field(default_factory=list)
    tables: dict[str, Table] = field(default_factory=dict)
    missing: list[MissingPoint | MissingSteps] = field(default_factory=list)
    evaluated: Any = None   # the evaluations' outcomes (launch.evaluation.EvalReport: jobs, failures)
    report: Path | None = None
    html: Path | None = None  # report.html (analysis.html), next to report.md
    problems: list[str] = field(default_factory=list)  # read problems found after collecting (behaviour)
    allow_failed: bool = False   # `analyze allow_failed=true`: points that failed to evaluate do not fail the command

    @property
    def n_missing(self) -> int:
        return missing_count(self.missing)

    def failed_groups(self) -> dict[str, list[MissingPoint]]:
        """The points that failed to evaluate, grouped by reason."""
        groups: dict[str, list[MissingPoint]] = {}
        for m in self.missing:
            if m.reason.startswith(FAILED_PREFIX):
                groups.setdefault(m.reason[len(FAILED_PREFIX):], []).append(m)
        return groups


def _missing_points(runs: list[Run], table: pd.DataFrame, benches: list[str], ev, anchor_eval: Path, evaluate: bool,
                    nulls: dict | None = None, unread: dict | None = None) -> list[MissingPoint | MissingSteps]:
    have = set(zip(table.arm, table.seed, table.step, table.bench))
    nulls = nulls or {}
    missing = []
    for run in runs:
        pending = run.pending()   # expected, nothing on disk: each step listed when few, else one line per bench
        for bench in benches if len(pending) > 2 * EDGE else ():
            missing.append(MissingSteps(run.arm, run.seed, pending, bench, run.not_checkpointed()))
        for step in sorted({*run.checkpoints, *run.evals, *(pending if len(pending) <= 2 * EDGE else ())}):
            for bench in benches:
                err = ev.failed(run.arm, run.seed, step, bench)   # a failed evaluation: a gap, whatever is on disk
                if (run.arm, run.seed, step, bench) in have and (run.arm, run.seed, step, bench) not in nulls and not err:
                    continue
                if step not in run.checkpoints and step not in run.evals:
                    reason = run.not_checkpointed()
                elif err:
                    reason = f"{FAILED_PREFIX}{err}"
                elif why := nulls.get((run.arm, run.seed, step, bench)):
                    reason = f"no score: {why}"
                elif why := (unread or {}).get((run.arm, run.seed, step)):
                    reason = why
                elif step not in run.checkpoints:
                    reason = "no checkpoint to evaluate and no result"
                else:
                    reason = "not evaluated (evaluate=false)" if not evaluate else "no result"
                missing.append(MissingPoint(run.arm, run.seed, step, bench, reason))
    for bench in benches:
        err = ev.failed(ANCHOR_ARM, 0, 0, bench)
        if (ANCHOR_ARM, 0, 0, bench) not in have or (ANCHOR_ARM, 0, 0, bench) in nulls or err:
            why = nulls.get((ANCHOR_ARM, 0, 0, bench))
            reason = (f"{FAILED_PREFIX}{err}" if err else f"no score: {why}" if why
                      else f"no anchor result in {anchor_eval}")
            missing.append(MissingPoint(ANCHOR_ARM, 0, 0, bench, reason))
    return missing


def without_failed(table: pd.DataFrame, ev) -> pd.DataFrame:
    """`table` less the points whose evaluation failed now: what their eval dir holds is not this analysis' result."""
    if not ev.failures or table.empty:
        return table
    keep = [ev.failed(a, s, t, b) is None for a, s, t, b in zip(table.arm, table.seed, table.step, table.bench)]
    return table[keep].reset_index(drop=True)


def partial_line(result: "AnalysisResult") -> str | None:
    """The report's first line when any expected point failed to evaluate (None: none did)."""
    failed = [m for ms in result.failed_groups().values() for m in ms]
    return f"PARTIAL: {len(failed)} expected point(s) failed to evaluate (listed under Missing points)" if failed else None


def _panels(table: pd.DataFrame, qa: list[str], metric: str) -> list[Panel]:
    panels = [Panel(b, metric, b, metric.upper()) for b in qa]
    if len(qa) >= 2:
        panels.append(Panel(MEAN_BENCH, metric, mean_label(qa), metric.upper()))
    for bench in agentic_benches(table.bench):
        m = kind_of(bench).headline
        panels.append(Panel(bench, m, f"{bench} ({m})" if m != metric else bench, m))
    return panels


def component_panels(table: pd.DataFrame, bench: str) -> list[Panel]:
    """One panel per part of an environment bench's headline metric (its kind's `components`: the
    metric `<headline>_<part>`, or `<part>`), then the headline itself."""
    headline = kind_of(bench).headline
    have = set(table.loc[table.bench == bench, "metric"])
    panels = []
    for comp in kind_of(bench).components:
        name = next((m for m in (f"{headline}_{comp}", comp) if m in have), None)
        if name:
            panels.append(Panel(bench, name, comp, comp))
    if headline in have:
        panels.append(Panel(bench, headline, f"total {headline}", headline))
    return panels


def _behaviour_panels(table: pd.DataFrame, qa: list[str]) -> list[Panel]:
    """Tool use and answer format per bench: they move long before EM does (and show *how* an arm transfers)."""
    panels = []
    for bench in qa + agentic_benches(table.bench):
        have = set(table.loc[table.bench == bench, "metric"])
        panels += [Panel(bench, m, f"{bench}\n{label}", label) for m, label in BEHAVIOUR if m in have]
    return panels


def _arm_steps(runs: list[Run]) -> dict[str, list[int]]:
    steps: dict[str, set[int]] = {}
    for r in runs:
        steps.setdefault(r.arm, set()).update(r.steps)
    return {a: sorted(s) for a, s in steps.items()}


def add_behaviour(result: AnalysisResult, table_paths: dict, runs: list[Run], anchor_eval: Path, qa: list[str],
                  out: Path, *, conf: float = 0.95) -> None:
    """The behaviour decomposition's tables (transitions, decomposition, stages), figure and per-checkpoint CSVs."""
    from analysis import behaviour

    have_anchor = (anchor_eval / "summary.json").is_file()
    dec = behaviour.decompose_runs(runs, anchor_eval if have_anchor else None, qa, conf=conf)
    anchor, ids = {}, {}
    for bench in qa if have_anchor else []:
        if (b := behaviour.load_behaviour(anchor_eval, bench, "anchor", dec)) is not None:
            anchor[bench], ids[bench] = b, behaviour.identity_label(anchor_eval, bench)
    result.problems += dec.problems
    if not dec.points and not anchor and not dec.skipped and not dec.transitions:
        return
    main, stages = behaviour.decomposition_tables(dec, anchor, ids)
    for name, t in (("transitions", behaviour.transition_table(dec, conf)), ("decomposition", main),
                    ("behaviour_stages", stages)):
        result.tables[name] = t
        table_paths[name] = t.write(out / "tables" / name)
    table_paths["transitions"].append(behaviour.write_transitions_csv(dec, out / "tables" / "transitions.csv"))
    table_paths["decomposition"].append(behaviour.write_csv(dec, out / "tables" / "decomposition_points.csv"))
    if dec.transitions:
        result.figures.append(behaviour.plot_decomposition(dec, out / "figures" / "decomposition", conf,
                                                               Counter(r.arm for r in runs)))


def add_teacher_forced(result: AnalysisResult, table_paths: dict, table: pd.DataFrame, eval_dirs: dict, axis,
                       out: Path, runs: list[Run] = ()) -> None:
    """The teacher-forced curves (analysis.tf_curves): a figure, a table and the points as CSV; each run's line
    has a gap at each of its curve steps (`runs`) without a loss."""
    from analysis import tf_curves

    curves = tf_curves.collect_tf(table, eval_dirs)
    result.problems += curves.problems
    if not curves.points:
        return
    result.tables["teacher_forced"] = tf_curves.tf_table(curves)
    table_paths["teacher_forced"] = result.tables["teacher_forced"].write(out / "tables" / "teacher_forced")
    table_paths["teacher_forced"].append(tf_curves.write_points(curves, out / "tables" / "teacher_forced_points.csv"))
    result.figures.append(tf_curves.plot_tf(curves, out / "figures" / "teacher_forced", axis,
                                                {(r.arm, r.seed): r.steps for r in runs}))


def check_compare_settings(points: Points, pairs: list[tuple[str, str]], benches: list[str],
                           allow: bool) -> dict[tuple[str, str], str]:
    """Refuse (AnalysisError, exit 2) a compared pair whose evaluations differ in a result-changing setting
    (meta.json identities, the checkpoint aside) unless `allow`; the caption's word on each pair's settings."""
    notes = {}
    for a, b in pairs:
        diff = settings_differences(points, a, b, benches)
        if diff and not allow:
            raise AnalysisError(f"compare=[[{a},{b}]]: the arms were evaluated under different settings "
                                f"({'; '.join(diff)}); compare_allow_settings=true compares them anyway")
        notes[(a, b)] = f"evaluated under different settings (allowed): {'; '.join(diff)}" if diff else ""
    return notes


def write_analysis(cfg: DictConfig, *, runs: list[Run], jobs: list, ev, benches: list[str], anchor: str | None,
                   anchor_dir: Path, profile: str | None, reference_sizes: dict, study=None) -> AnalysisResult:
    """The report of an analysis whose evaluations are done: `runs` as discovered before them, `jobs` the
    evaluations run now (or by a Slurm array) and `ev` their outcomes (launch.evaluation.EvalReport: its
    failures are listed as gaps); `cfg` is the `analyze` config (launch.analyze), already resolved."""
    root, out = Path(cfg.runs_root), Path(cfg.out)
    anchor_eval = anchor_eval_dir(anchor_dir, profile)
    pairs = compare_pairs(cfg.compare)
    runs = discover_runs(root, profile) if jobs else runs
    collected = collect(runs, anchor_eval, benches)
    table = collected.table = without_failed(collected.table, ev)
    found = {*table.bench, *(b for (_, _, _, b) in collected.nulls)}
    if not cfg.evaluate and cfg.benches and (none := [b for b in benches if b not in found]):
        raise AnalysisError(f"benches: {none[0]} has no evaluation under {root} nor in {anchor_dir} (evaluate=false only "
                            "reads the evaluations on disk)")
    out.mkdir(parents=True, exist_ok=True)
    make_way(out)
    results = [out / "results.parquet", out / "results.csv"]
    table.to_parquet(results[0], index=False)
    table.to_csv(results[1], index=False)

    qa = qa_benches(table, also=[b for (_, _, _, b) in collected.nulls])
    eval_dirs = {(r.arm, r.seed, s): d for r in runs for s, d in r.evals.items()}
    eval_dirs[(ANCHOR_ARM, 0, 0)] = anchor_eval
    points = Points(add_mean_rows(table, qa), eval_dirs, qa, cfg.conf,
                    problems=list(collected.problems), nulls=collected.nulls)
    arms = sorted({r.arm for r in runs})
    steps = _arm_steps(runs)
    settings_note = check_compare_settings(points, pairs, benches, bool(cfg.get("compare_allow_settings", False)))
    result = AnalysisResult(out=out, table=table, evaluated=ev, allow_failed=bool(cfg.get("allow_failed")))
    axis = build_axis(str(cfg.axis), runs)
    result.problems += axis.problems + mixed_settings(points, benches)
    # EM/F1 (`metrics`) are the QA benches'; a report without one writes its tables and curves once, as ENV, or
    # none without an environment bench either (teacher-forced benches only: their own table and figure)
    metrics = list(cfg.metrics) if qa else [ENV] if agentic_benches(table.bench) else []
    result.problems += [f"compare=[[{a},{b}]]: no QA or environment bench to compare the arms on" for a, b in pairs if not metrics]
    for metric in metrics:
        panels = _panels(table, qa, metric)
        if panels:
            result.figures.append(plot_curves(points, panels, arms, steps, out / "figures" / f"curves_{metric}",
                                              axis=axis))
    for bench in agentic_benches(table.bench):   # a kind with parts of its headline: a figure of them
        if kind_of(bench).components:
            result.figures.append(plot_curves(points, component_panels(table, bench), arms, steps,
                                              out / "figures" / f"{bench}_components", axis=axis))
    behaviour = _behaviour_panels(table, qa)
    if behaviour:
        result.figures.append(plot_curves(points, behaviour, arms, steps, out / "figures" / "behaviour", axis=axis))
    table_paths: dict[str, list[Path]] = {}
    row = [c.bench for c in table_columns(qa, len(qa) >= 2, agentic_benches(table.bench), "em")]
    finals = {arm: final_steps(points, arm, row) for arm in arms}   # the paired tables' final rows (and report.html's)
    for metric in metrics:
        cols = table_columns(qa, len(qa) >= 2, agentic_benches(table.bench), metric)
        for name, t in ((f"main_{metric}", main_table(points, arms, cols, metric)),
                        (f"paired_{metric}", paired_table(points, arms, cols, metric))):
            result.tables[name] = t
            table_paths[name] = t.write(out / "tables" / name)
        for a, b in pairs:   # (an arm no run has: refused by launch.analyze)
            name = f"compare_{file_label(a)}_vs_{file_label(b)}_{metric}"   # a variant's `/` no subdirectory
            name = next(n for k in range(1, len(pairs) + 2) if (n := name + (f"-{k}" if k > 1 else "")) not in result.tables)
            result.tables[name] = compare_table(points, a, b, cols, metric, settings_note.get((a, b), ""))
            table_paths[name] = result.tables[name].write(out / "tables" / name)
    episodic = [b for b in benches if not kind_of(b).scores]   # benches with episodes (transcripts, EM pre/post)
    pp = prepost(runs, anchor_eval if (anchor_eval / "summary.json").is_file() else None, episodic, conf=cfg.conf)
    labelled = {f"{r.arm}/seed{r.seed}/{d.name}": d for r in runs for d in r.evals.values()}
    pp.problems += size_problems({**labelled, f"{ANCHOR_ARM}/{anchor_eval.name}": anchor_eval}, reference_sizes)
    if pp.rows:
        result.tables["prepost"] = pp.table()
        table_paths["prepost"] = result.tables["prepost"].write(out / "tables" / "prepost")
    if qa:  # format vs capability (analysis.behaviour): the rows evaluate wrote, per checkpoint and bench
        add_behaviour(result, table_paths, runs, anchor_eval, qa, out, conf=cfg.conf)
    if any(kind_of(b).scores for b in benches):   # teacher-forced losses on the held-out sets, per span kind
        add_teacher_forced(result, table_paths, table, eval_dirs, axis, out, runs)
    if study is not None and study.reference_results:
        from analysis.reference import reference_table

        given = None if cfg.anchor in (None, "") else str(cfg.anchor)   # as spelled; else the one anchor_dir holds
        anchor_model = given or (read_json_object(anchor_dir / "anchor.json", []) or {}).get("model")
        result.tables["reference"] = reference_table(study, add_mean_rows(table, qa), runs, anchor_model)
        table_paths["reference"] = result.tables["reference"].write(out / "tables" / "reference")
    intervals = out / "intervals.csv"   # every interval drawn or tabulated: bounds, what it covers, n
    points.intervals_frame().to_csv(intervals, index=False)
    result.missing = _missing_points(runs, table, benches, ev, anchor_eval, bool(cfg.evaluate), collected.nulls, collected.unread)
    problems = sorted(set(points.problems + pp.problems + result.problems + [p for r in runs for p in r.problems]))
    settings = {"runs_root": cfg.runs_root, "profile": profile or "none (evaluations in eval/)", "benches": benches,
                **({"study": f"{study.name} (sha256 {study.sha256[:12]})"} if study else {}),
                "conf": cfg.conf, "evaluated_now": len(jobs), "failed": len(ev.failures),
                "axis": cfg.axis if cfg.axis == "step" else f"{cfg.axis} ({axis.label}, from metrics.jsonl)"}
    evaluated_under = eval_settings(points, benches).lines()   # the settings the numbers were made under (meta.json)
    ignored = replaced_dirs(root)
    result.report = write_report(out, runs=runs, figures=result.figures, tables=result.tables,
                                 table_paths=table_paths, results_paths=results, anchor=anchor,
                                 anchor_dir=anchor_dir, missing=result.missing, problems=problems,
                                 settings=settings, ignored=ignored, intervals=intervals,
                                 partial=partial_line(result), evaluated_under=evaluated_under,
                                 too_long=collected.too_long)
    from analysis.html import write_html

    result.html = write_html(out, runs=runs, figures=result.figures, tables=result.tables, missing=result.missing,
                             problems=problems, settings=settings, benches=episodic,
                             anchor_eval=anchor_eval if (anchor_eval / "summary.json").is_file() else None,
                             partial=partial_line(result), finals=finals, unscored=points.unscored,
                             evaluated_under=evaluated_under, anchor_line=anchor_text(anchor, anchor_dir),
                             ignored=ignored)
    from analysis.wandb_log import log_results

    logged = log_results(table, runs_root=str(cfg.runs_root), out=out, setting=cfg.wandb)
    if logged:
        print(f"[analyze] results table logged to {logged}", flush=True)
    return result
