"""The `analyze` pipeline: discover -> evaluate what is new -> tidy table -> curves, tables, report.

`run_analysis(cfg, evaluator=None)` is the Python API behind the `analyze` console script.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import DictConfig, ListConfig, OmegaConf

from analysis.aggregate import Points
from analysis.collect import (ENV_BENCH_METRIC, MEAN_BENCH, SEARCH_R1_BENCHES, add_mean_rows, collect,
                              mean_label, qa_benches)
from analysis.discover import ANCHOR_ARM, Run, discover_runs, read_json_object, replaced_dirs
from analysis.evaluation import (EvalReport, Evaluator, anchor_eval_dir, check_anchor_identity, check_settings,
                                 check_templates, harness, plan, run_jobs)
from analysis.figures import FigureInfo, Panel, plot_curves
from analysis.prepost import prepost, size_problems
from analysis.report import MissingPoint, write_report
from analysis.errors import AnalysisError
from analysis.tables import Table, agentic_benches, compare_table, main_table, paired_table, table_columns
from common import datafetch, keydoc
from common.cli import did_you_mean
from common.benchmarks import BenchError, canonical_bench_key
from common.tiny import resolve_model_path

DEFAULT_BENCHES = SEARCH_R1_BENCHES + ["search_plan_ood"]
# search_plan_ood's reward components; the harness names them `reward_<component>` (plain names accepted too).
OOD_COMPONENTS = ["outcome", "grounding", "stop"]

BEHAVIOUR = [("mean_tool_calls", "tool calls / episode"), ("format_failure_rate", "no answer found")]

KEYS: dict[str, tuple[Any, str]] = {  # key: (default, description): `analyze --help` and docs/keys/analyze.md
    "runs_root": ("runs", "the study: runs discovered as <runs_root>/<arm>/[<name>/]seed<seed>/"),
    "out": ("reports", "where results, figures, tables and report.md go"),
    "benches": (None, "null -> the profile's benches, or the Search-R1 seven + search_plan_ood"),
    "profile": (None, "evaluation profile (recipes/eval/<profile>.yaml): reads/writes eval/<profile>/ dirs"),
    "evaluate": (True, "false: only aggregate the evaluations already on disk"),
    "anchor": (None, "base model dir or hub id, evaluated once with prompt=anchor_nudge as step 0"),
    "anchor_dir": (None, "null -> <runs_root>/_anchor"),
    "metrics": (["em", "f1"], "QA metrics tabulated and plotted"),
    "n_boot": (2000, "bootstrap resamples of the confidence intervals"),
    "boot_seed": (0, "seed of the bootstrap"),
    "conf": (0.95, "confidence level of the intervals"),
    "dry_run": (False, "true: print the plan (runs, checkpoints, evaluations to run) and exit"),
    "compare": ([], "pairs of arms compared step by step, e.g. [[r2e, r2e_v5]]: per step both were evaluated at, "
                    "A − B paired over the same examples and seeds (tables/compare_<A>_vs_<B>_<metric>.*)"),
    "study": (None, "a study file (name or path): its reference_results shown beside ours (tables/reference.*)"),
    "launcher": ("local", "local: evaluate here | slurm: a job array (one task per checkpoint to evaluate) + an aggregation job"),
    "slurm.gpus_per_task": (None, "launcher=slurm: GPUs per array task; null -> eval.data_parallel (x tensor_parallel_size "
                                  "with backend=vllm), 1 by default"),
    "slurm.concurrency": (None, "launcher=slurm: array tasks running at once (--array=0-N%K); null: no cap"),
    "slurm.partition": (None, "launcher=slurm: --partition (null: the cluster's default)"),
    "slurm.time": (None, "launcher=slurm: --time of each task, e.g. \"04:00:00\" (null: the partition's)"),
    "slurm.account": (None, "launcher=slurm: --account"),
    "slurm.qos": (None, "launcher=slurm: --qos"),
    "slurm.sbatch": ([], "launcher=slurm: further sbatch options, e.g. [--constraint=h100]"),
    "slurm.setup": (None, "launcher=slurm: shell run before each job's command (module load, activate)"),
    "python.eval": (None, "the interpreter of the evaluation and aggregation jobs (launcher=slurm), asked first for what "
                          "they need (vllm for backend=vllm); null: this one"),
    "slurm.after": (None, "launcher=slurm: a dependency the array waits for, e.g. afterok:4242 (a training job)"),
    "slurm.runs": (None, "launcher=slurm: one evaluation job per run dir listed (launch sweep eval_profile= passes its "
                         "runs), each planning its run's checkpoints when it starts, then the aggregation (afterany)"),
    "slurm.runs_after": (None, "with slurm.runs: each run's job's dependency, in order (e.g. afterok:5001_0, task 0 of "
                               "training array 5001; null: none); one that can never be met cancels the job"),
    "eval_tasks": (None, "set by the aggregation job: the tasks.json of a Slurm evaluation array; evaluate nothing, "
                         "report its failed tasks as gaps"),
    "wandb": ("auto", "the results table to the study's wandb group (analysis.wandb_log); auto: when online"),
    # Passed to the evals harness as its own config keys (also as plain n=, seed=, ...); null: the harness's default.
    "eval.n": (None, "evaluate's n (items per bench)"),
    "eval.seed": (None, "evaluate's seed"),
    "eval.backend": (None, "evaluate's backend: hf | vllm"),
    "eval.retriever": (None, "evaluate's retriever: bm25 | http"),
    "eval.corpus": (None, "evaluate's corpus (retriever=bm25)"),
    "eval.retriever_url": (None, "evaluate's retriever_url (retriever=http)"),
    "eval.topk": (None, "evaluate's topk"),
    "eval.bench_root": (None, "evaluate's bench_root (your own files)"),
    "eval.sets": (None, "evaluate's sets: per-bench named item set, e.g. {nq: 'nq:hub'} (docs/data.md)"),
    "eval.max_turns": (None, "evaluate's max_turns"),
    "eval.max_model_len": (None, "evaluate's max_model_len"),
    "eval.prompt": ("tool_agent", "evaluate's prompt for the runs' checkpoints (the anchor takes anchor_nudge)"),
}
DEFAULTS: dict[str, Any] = keydoc.defaults(KEYS)
ALIASES = {k: f"eval.{k}" for k in DEFAULTS["eval"]}


def default_config() -> DictConfig:
    return OmegaConf.create(DEFAULTS)


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
    missing: list[MissingPoint] = field(default_factory=list)
    evaluated: EvalReport = field(default_factory=EvalReport)
    report: Path | None = None
    html: Path | None = None  # report.html (analysis.html), next to report.md


def _missing_points(runs: list[Run], table: pd.DataFrame, benches: list[str], ev: EvalReport,
                    anchor_eval: Path, evaluate: bool, nulls: dict | None = None) -> list[MissingPoint]:
    have = set(zip(table.arm, table.seed, table.step, table.bench))
    nulls = nulls or {}
    missing = []
    for run in runs:
        for step in run.steps:
            for bench in benches:
                if (run.arm, run.seed, step, bench) in have and (run.arm, run.seed, step, bench) not in nulls:
                    continue
                if why := nulls.get((run.arm, run.seed, step, bench)):
                    reason = f"no score: {why}"
                elif step not in run.checkpoints and step not in run.evals:
                    reason = "checkpoint missing although the run is done" if run.done else "not checkpointed yet (run still training)"
                elif err := ev.failed(run.arm, run.seed, step, bench):
                    reason = f"evaluation failed: {err}"
                elif step not in run.checkpoints:
                    reason = "no checkpoint to evaluate and no result"
                else:
                    reason = "not evaluated (evaluate=false)" if not evaluate else "no result"
                missing.append(MissingPoint(run.arm, run.seed, step, bench, reason))
    for bench in benches:
        if (ANCHOR_ARM, 0, 0, bench) not in have or (ANCHOR_ARM, 0, 0, bench) in nulls:
            err = ev.failed(ANCHOR_ARM, 0, 0, bench)
            why = nulls.get((ANCHOR_ARM, 0, 0, bench))
            reason = (f"no score: {why}" if why else f"evaluation failed: {err}" if err
                      else f"no anchor result in {anchor_eval}")
            missing.append(MissingPoint(ANCHOR_ARM, 0, 0, bench, reason))
    return missing


def _panels(table: pd.DataFrame, qa: list[str], metric: str) -> list[Panel]:
    panels = [Panel(b, metric, b, metric.upper()) for b in qa]
    if len(qa) >= 2:
        panels.append(Panel(MEAN_BENCH, metric, mean_label(qa), metric.upper()))
    for bench in agentic_benches(table.bench):
        m = ENV_BENCH_METRIC[bench]
        panels.append(Panel(bench, m, f"{bench} ({m})" if m != metric else bench, m))
    return panels


def _ood_panels(table: pd.DataFrame) -> list[Panel]:
    have = set(table.loc[table.bench == "search_plan_ood", "metric"])
    panels = []
    for comp in OOD_COMPONENTS:
        name = next((m for m in (f"reward_{comp}", comp) if m in have), None)
        if name:
            panels.append(Panel("search_plan_ood", name, comp, comp))
    total = next((m for m in ("reward", "total") if m in have), None)
    if total:
        panels.append(Panel("search_plan_ood", total, "total reward", "reward"))
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


def describe_plan(runs: list[Run], jobs, cfg: DictConfig) -> str:
    lines = [f"runs under {cfg.runs_root}: {len(runs)}"]
    lines += [f"  {r.arm}/seed{r.seed}: checkpoints {sorted(r.checkpoints)}, evaluated {sorted(r.evals)}"
              f"{'' if r.done else ' (not finished)'}" for r in runs]
    lines.append(f"evaluations to run: {len(jobs)}")
    for j in jobs:
        lines.append(f"  {j.label}: {j.benches} (prompt={j.prompt}) -> {j.out}")
        lines += [f"    {b}: held under another evaluation identity ({'; '.join(d)}): re-evaluated, the old "
                  "results renamed aside" for b, d in j.stale.items()]
    lines.append(f"outputs -> {cfg.out}/{{results.parquet, results.csv, figures/, tables/, report.md, report.html, report_data/}}")
    return "\n".join(lines)


def check_python(cfg: DictConfig, eval_opts: dict, profile: str | None) -> None:
    """Refuse a named `python.eval=` lacking what its jobs need (common.interpreter), before any work."""
    from common import interpreter

    python = interpreter.named(cfg.python, "eval")
    if python is None:
        return
    backend = eval_opts.get("backend")
    if backend is None and profile:
        from evals.profiles import load_profile

        backend = load_profile(profile)["evaluate"].get("backend")
    why = interpreter.check("eval", python, interpreter.eval_needs(backend))
    if why:
        raise AnalysisError(why)


def run_analysis(cfg: DictConfig | dict, evaluator: Evaluator | None = None) -> AnalysisResult | None:
    """Run the whole analysis; returns None for `dry_run=true` (the plan is printed)."""
    cfg = OmegaConf.merge(default_config(), cfg if isinstance(cfg, DictConfig) else OmegaConf.create(cfg))
    root, out = Path(cfg.runs_root), Path(cfg.out)
    profile = cfg.profile or None
    reference_sizes, benches = {}, list(DEFAULT_BENCHES)
    if profile:
        from evals.profiles import load_profile  # recipes/eval/<profile>.yaml (ConfigError when unknown)

        loaded = load_profile(profile)
        reference_sizes = loaded["reference_sizes"]
        benches = list(loaded["evaluate"].get("benches") or benches)
    benches = list(cfg.benches) if cfg.benches else benches
    try:  # one name per (bench, context mode), as evaluate writes it: musique@open is musique
        benches = [canonical_bench_key(str(b)) for b in benches]
    except BenchError as exc:
        raise AnalysisError(f"benches: {exc}") from None
    anchor = None if cfg.anchor in (None, "") else resolve_model_path(str(cfg.anchor))   # tiny-base: the embedded dir
    if anchor is not None and Path(anchor).exists():  # a local dir: one spelling, so re-use is recognized
        anchor = str(Path(anchor).resolve())
    anchor_dir = Path(cfg.anchor_dir) if cfg.anchor_dir else root / "_anchor"
    check_anchor_identity(anchor_dir, anchor)
    eval_opts = {k: v for k, v in OmegaConf.to_container(cfg.eval).items() if v is not None and k != "prompt"}
    if profile:
        eval_opts["profile"] = profile
    anchor_eval = anchor_eval_dir(anchor_dir, profile)
    study = None
    if cfg.study:
        from common.study import load_study  # a bad study file is a one-line error before any evaluation

        from analysis.reference import expected

        study = load_study(str(cfg.study))
        expected(study)   # its stages' model recipes and profile (what its numbers are compared by), read up front
    from analysis.slurm import check_launcher, submit_analysis, submit_runs, tasks_report

    check_launcher(cfg)
    check_python(cfg, eval_opts, profile)
    pairs = compare_pairs(cfg.compare)
    h = harness(evaluator) if cfg.evaluate and not cfg.eval_tasks else None
    resolved = None
    if h is not None:  # every evaluate call would refuse these: refused before any work, also under dry_run
        resolved = check_settings(h, {**eval_opts, "prompt": cfg.eval.prompt}, benches)
    if cfg.launcher == "slurm" and cfg.slurm.runs is not None and not cfg.eval_tasks:
        submit_runs(cfg, eval_opts, benches, anchor, anchor_dir, profile)   # each run's job plans its own checkpoints
        return None
    runs = discover_runs(root, profile)
    with datafetch.no_network() if cfg.dry_run else nullcontext():   # a plan never waits on the hub
        jobs = plan(runs, benches, anchor, anchor_dir, cfg.eval.prompt, profile, h=h, eval_opts=eval_opts) if h else []
    if h is not None:
        check_templates(h, jobs, eval_opts)
    if cfg.dry_run:
        print(describe_plan(runs, jobs, cfg))
        if isinstance(resolved, DictConfig):   # what each evaluation runs with (ckpt, out, prompt: its own)
            print("# resolved evaluate config of every evaluation (ckpt, out and prompt: each one's own)\n"
                  + OmegaConf.to_yaml(resolved).rstrip())
    if cfg.launcher == "slurm" and jobs:   # the evaluations go to a job array; its aggregation job writes the report
        submit_analysis(cfg, jobs, eval_opts, anchor_dir)
        return None
    if cfg.dry_run:
        return None
    if cfg.eval_tasks:   # the aggregation after a Slurm array: its outcomes are this analysis's evaluations
        ev = tasks_report(Path(cfg.eval_tasks))
        jobs = ev.jobs
    else:
        ev = run_jobs(jobs, h, eval_opts, anchor_dir) if jobs else EvalReport()
    runs = discover_runs(root, profile) if jobs else runs
    collected = collect(runs, anchor_eval, benches)
    table = collected.table
    out.mkdir(parents=True, exist_ok=True)
    results = [out / "results.parquet", out / "results.csv"]
    table.to_parquet(results[0], index=False)
    table.to_csv(results[1], index=False)

    qa = qa_benches(table, also=[b for (_, _, _, b) in collected.nulls])
    eval_dirs = {(r.arm, r.seed, s): d for r in runs for s, d in r.evals.items()}
    eval_dirs[(ANCHOR_ARM, 0, 0)] = anchor_eval
    points = Points(add_mean_rows(table, qa), eval_dirs, qa, cfg.n_boot, cfg.boot_seed, cfg.conf,
                    problems=list(collected.problems), nulls=collected.nulls)
    arms = sorted({r.arm for r in runs})
    steps = _arm_steps(runs)
    result = AnalysisResult(out=out, table=table, evaluated=ev)
    for metric in cfg.metrics:
        panels = _panels(table, qa, metric)
        if panels:
            result.figures.append(plot_curves(points, panels, arms, steps, out / "figures" / f"curves_{metric}"))
    if "search_plan_ood" in agentic_benches(table.bench):
        panels = _ood_panels(table)
        result.figures.append(plot_curves(points, panels, arms, steps, out / "figures" / "search_plan_ood_components"))
    behaviour = _behaviour_panels(table, qa)
    if behaviour:
        result.figures.append(plot_curves(points, behaviour, arms, steps, out / "figures" / "behaviour"))
    table_paths: dict[str, list[Path]] = {}
    for metric in cfg.metrics:
        cols = table_columns(qa, len(qa) >= 2, agentic_benches(table.bench), metric)
        for name, t in ((f"main_{metric}", main_table(points, arms, cols, metric)),
                        (f"paired_{metric}", paired_table(points, arms, cols, metric))):
            result.tables[name] = t
            table_paths[name] = t.write(out / "tables" / name)
        for a, b in pairs:
            for arm in (a, b):
                if arm not in arms and metric == cfg.metrics[0]:
                    points.problems.append(f"compare: no run of arm {arm!r} under {root} (arms: {', '.join(arms) or 'none'})"
                                           f".{did_you_mean(arm, arms)}")
            name = f"compare_{a}_vs_{b}_{metric}"
            result.tables[name] = compare_table(points, a, b, cols, metric)
            table_paths[name] = result.tables[name].write(out / "tables" / name)
    pp = prepost(runs, anchor_eval if (anchor_eval / "summary.json").is_file() else None, benches,
                 n_boot=cfg.n_boot, seed=cfg.boot_seed, conf=cfg.conf)
    labelled = {f"{r.arm}/seed{r.seed}/{d.name}": d for r in runs for d in r.evals.values()}
    pp.problems += size_problems({**labelled, f"{ANCHOR_ARM}/{anchor_eval.name}": anchor_eval}, reference_sizes)
    if pp.rows:
        result.tables["prepost"] = pp.table()
        table_paths["prepost"] = result.tables["prepost"].write(out / "tables" / "prepost")
    if study is not None and study.reference_results:
        from analysis.reference import reference_table

        given = None if cfg.anchor in (None, "") else str(cfg.anchor)   # as spelled; else the one anchor_dir holds
        anchor_model = given or (read_json_object(anchor_dir / "anchor.json", []) or {}).get("model")
        result.tables["reference"] = reference_table(study, add_mean_rows(table, qa), runs, anchor_model)
        table_paths["reference"] = result.tables["reference"].write(out / "tables" / "reference")
    result.missing = _missing_points(runs, table, benches, ev, anchor_eval, bool(cfg.evaluate), collected.nulls)
    problems = sorted(set(points.problems + pp.problems + [p for r in runs for p in r.problems]))
    settings = {"runs_root": cfg.runs_root, "profile": profile, "benches": benches, "n_boot": cfg.n_boot,
                **({"study": f"{study.name} (sha256 {study.sha256[:12]})"} if study else {}),
                "boot_seed": cfg.boot_seed,
                "conf": cfg.conf, "evaluated_now": len(jobs), "failed": len(ev.failures)}
    result.report = write_report(out, runs=runs, figures=result.figures, tables=result.tables,
                                 table_paths=table_paths, results_paths=results, anchor=anchor,
                                 anchor_dir=anchor_dir, missing=result.missing, problems=problems,
                                 settings=settings, ignored=replaced_dirs(root))
    from analysis.html import write_html

    result.html = write_html(out, runs=runs, figures=result.figures, tables=result.tables, missing=result.missing,
                             problems=problems, settings=settings, benches=benches,
                             anchor_eval=anchor_eval if (anchor_eval / "summary.json").is_file() else None)
    from analysis.wandb_log import log_results

    logged = log_results(table, runs_root=str(cfg.runs_root), out=out, setting=cfg.wandb)
    if logged:
        print(f"[analyze] results table logged to {logged}", flush=True)
    return result
