"""`launch sweep arms=[r2e,search,mixed] seeds=[0,1,2] steps=218 ...`: every arm x seed, each run resolved up front,
trained here one after another (each a normal `launch`) or on Slurm as one job array (task i: run i's config.yaml);
`eval_profile=PROFILE` (plus `analyze.KEY=VALUE`) evaluates the checkpoints once trained (plan_sweep): docs/concepts.md
("Jobs") and docs/how-to/slurm.md say how, locally and on Slurm."""
from __future__ import annotations

import re
import sys
import time
from pathlib import Path

from omegaconf import OmegaConf

from common import interpreter
from common.cli import ConfigError, split_dotlist
from common.recipes import group_choices, load_recipe
from evals.profiles import PROFILES_DIR, profile_names
from launch import local, preflight
from launch.errors import LaunchError
from launch.eval_slurm import plan_dir, runs_plan, write_files
from launch.jobs import Job, JobFailed, backend, dry_run_dir, project_env, watch
from launch.run import SFT, dry_run, finished, kept, start_training, train_runs

ANALYZE = "analyze."   # `analyze.KEY=VALUE`: KEY=VALUE for the sweep's analyze (e.g. analyze.eval.corpus=...)


def parse_sweep(argv: list[str]) -> tuple[list[list[str]], str | None, list[str]]:
    """Every run's argv (each arm x seed, with the other overrides), the `eval_profile=` value or None and the
    `analyze.KEY=VALUE` tokens as KEY=VALUE; a LaunchError naming a bad one."""
    arms, seeds, rest, profile, analyze = None, [0], [], None, []
    for tok, (key, value) in zip(argv, split_dotlist(argv)):
        if key == "eval_profile":
            profile = value.strip() or None
        elif key.startswith(ANALYZE):
            if key in (f"{ANALYZE}slurm.runs", f"{ANALYZE}slurm.runs_after"):
                raise LaunchError(f"{key}= is set by the sweep: its evaluation takes the sweep's own runs")
            if key == f"{ANALYZE}power.pilot":   # (a design question of another dir, not this sweep's evaluation)
                raise LaunchError(f"{key}= would replace the sweep's evaluation by a power report: run `analyze power.pilot=...` on its own")
            analyze.append(f"{key[len(ANALYZE):]}={value}")
        elif key in ("arms", "seeds"):
            parsed = OmegaConf.from_dotlist([f"x={value}"]).x
            if OmegaConf.is_dict(parsed):
                raise LaunchError(f"{key}={value}: expected a list of {key}, not a mapping")
            items = [] if parsed is None else list(parsed) if OmegaConf.is_list(parsed) else [parsed]
            if twice := [x for i, x in enumerate(items) if x in items[:i]]:
                raise LaunchError(f"{key}={value} names {twice[0]} twice: each run dir is trained by one run")
            if key == "arms":
                arms = [str(a) for a in items]
            else:
                if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in items):
                    raise LaunchError(f"seeds must be a list of non-negative integers, got {value!r}")
                seeds = [int(s) for s in items]
        elif key in ("arm", "seed", "run_dir"):
            raise LaunchError(f"{key}= is set per run by the sweep; use arms=[...] / seeds=[...] instead")
        else:
            rest.append(tok)
    if profile is not None and not (PROFILES_DIR / f"{profile}.yaml").is_file():
        raise LaunchError(f"eval_profile={profile}: no recipes/eval/{profile}.yaml; profiles: {', '.join(profile_names())}")
    if analyze and profile is None:
        raise LaunchError(f"{ANALYZE}KEY=VALUE ({', '.join(analyze)}) sets the sweep's evaluation: give eval_profile=PROFILE")
    if not arms:
        raise LaunchError(f"sweep needs arms=[...] (choices: {', '.join(group_choices('arm'))})")
    for arm in arms:   # an unknown one refused as `launch arm=` refuses it
        load_recipe("arm", arm)
    if not seeds:
        raise LaunchError("seeds=[] is empty")
    return [[f"arm={a}", f"seed={s}", *rest] for a in arms for s in seeds], profile, analyze


def analysis_config(first, profile: str, analyze: list[str]):
    """The sweep's analysis config (LaunchError naming a bad key): the runs under the first run's runs_root evaluated
    with `profile` into <runs_root>/_reports/<profile>, in python.eval, on the training's launcher and cluster
    settings; the `analyze` tokens last, so they win."""
    from launch.analyze import parse_argv

    python = interpreter.named(first.get("python"), "eval")
    cluster = backend(first.launcher.kind).cluster(first.launcher)
    try:
        return parse_argv([f"runs_root={first.runs_root}", f"profile={profile}",
                           f"out={Path(first.runs_root) / '_reports' / profile}",
                           *([f"python.eval={python}"] if python else []), f"launcher={first.launcher.kind}",
                           *(cluster.tokens("slurm.") if cluster else []), *analyze])
    except ConfigError as exc:
        raise as_typed(exc, analyze) from None


def as_typed(exc: Exception, analyze: list[str]) -> LaunchError:
    """The analysis refusing a setting (`exc`), the keys set, suggested or listed named as the sweep takes them."""
    line = re.sub(r"(Did you mean: |Valid keys: )([^?\n]*)", lambda m: m[1] + ", ".join(ANALYZE + k for k in m[2].split(", ")), str(exc))
    for key in {k for k, _ in split_dotlist(analyze)}:
        line = re.sub(rf"(?<![\w.]){re.escape(key)}\b", ANALYZE + key, line)
    return LaunchError(line)


def analysis_job(cfg, where: Path, after: tuple[str, ...] = ("sweep",)) -> tuple[list[Job], dict[Path, str]]:
    """The sweep's analysis Job on `<where>/analyze.yaml`, in python.eval, after the training however it ended (a
    failed run is a gap in the report); and its config, unwritten."""
    path = Path(where) / "analyze.yaml"
    return [Job("analyze", "launch.analyze", config=str(path), python=interpreter.interpreter(cfg.python, "eval"),
                after=after, after_any=bool(after), notes=("the sweep's evaluation and report",),
                needs=preflight.analyze_needs(cfg))], {path: OmegaConf.to_yaml(cfg)}


def run_sweep(argv: list[str]) -> int:
    """`launch sweep ...`: every run resolved, the evaluation and preflight checked first; then trained here or submitted."""
    runs, profile, analyze = parse_sweep(argv)
    preps = [SFT.resolve(run) for run in runs]   # every combination's keys and values checked up front
    first = preps[0].cfg   # the preflight: every run's needs and the evaluation's, before anything (exit 2)
    def refused(exc) -> int:
        print(f"error: {exc}\n[launch] sweep: the evaluation (eval_profile={profile}) was refused (exit 2); nothing "
              "trained", file=sys.stderr, flush=True)
        return 2

    try:   # the evaluation's keys, checked before anything: resolved once
        evaluation = analysis_config(first, profile, analyze) if profile else None
    except LaunchError as exc:
        return refused(exc)
    needs = preflight.of([SFT.job(preps, array=True)]) + ([preflight.analyze_needs(evaluation)] if evaluation else [])
    found = preflight.gate(needs, bool(first.launcher.dry_run))
    try:   # and its values, as the analysis checks them (before anything trains)
        req = evaluation_request(evaluation, preps) if evaluation is not None else None
    except ConfigError as exc:
        return refused(as_typed(exc, analyze))
    if backend(first.launcher.kind).submits:
        rc = _sweep_submit(argv, runs, preps, evaluation, req)
    elif first.launcher.dry_run:   # the plan: one job, each run a task in turn (a finished run skipped when it runs), then the analysis
        rc = dry_run(SFT, preps, ["sweep", *argv],
                     plan=lambda where: plan_sweep(SFT, preps, evaluation, where, first.launcher.kind))
        print(f"[launch] sweep: dry run: {len(runs)} run(s) planned, nothing started")
    elif (rc := train_runs(SFT, list(zip(runs, preps)))) == 0:   # the runs as resolved up front
        print(f"[launch] sweep: all {len(runs)} runs finished")
        if evaluation is not None:
            rc = _analyze_here(evaluation, _sweep_dir(first))
    return rc or preflight.after_plan(found) or 0


def _analyze_here(cfg, where: Path) -> int:
    """The sweep's analysis (`cfg`, written under `where`) run now by the LocalRunner; its exit status."""
    [job], files = analysis_job(cfg, where, after=())
    write_files(files)
    print(f"[launch] sweep: evaluating with profile {cfg.profile}: python -m launch.analyze {job.config}", flush=True)
    try:
        local.LocalRunner(env=project_env()).start(job, None, {})
    except JobFailed as failed:
        return failed.status
    return 0


def _sweep_dir(cfg) -> Path:
    """Where a sweep's scripts, logs and analysis config go: <runs_root>/_sweeps/sweep-<UTC time>/."""
    return Path(cfg.runs_root) / "_sweeps" / time.strftime("sweep-%Y%m%dT%H%M%SZ", time.gmtime())


def evaluation_request(evaluation, preps: list):
    """The sweep's analysis resolved and checked as the analysis checks it (AnalysisError / ConfigError naming a
    setting); on a submitting launcher as one evaluation job per run (slurm.runs), which plan_sweep plans."""
    from launch.analyze import request

    per_run = {"slurm": {"runs": [str(p.run_dir) for p in preps], "runs_after": None}} if backend(evaluation.launcher).submits else {}
    with local.isolated():   # (its checks may set up logging: nothing leaks into the sweep)
        return request(OmegaConf.merge(evaluation, per_run), planned=[p.run_dir for p in preps])


def plan_sweep(trainer, preps: list, evaluation, evals: Path, kind: str, logs: str | None = None, array: bool = True,
               req=None) -> tuple[list[Job], dict[Path, str]]:
    """The jobs training `preps` (`array`: one job `sweep`; submitted, a finished run kept: none when all are), then
    their `evaluation` (analyze's config, or None; `req`: its evaluation_request), its configs under `evals` (unwritten):
    here the analysis; submitted, one job per run after its training task (launch.eval_slurm.runs_plan), then the report."""
    submits = backend(kind).submits
    todo = [p for p in preps if not (submits and finished(p))]
    training = [trainer.job(todo, array, logs, kind)] if todo else []
    if evaluation is None:
        return training, {}
    if not submits:
        more, files = analysis_job(evaluation, evals)   # (here every run is trained: a finished one skipped when it runs)
    else:
        runs = [str(p.run_dir) for p in [*todo, *(p for p in preps if finished(p))]]
        more, files = runs_plan(req or evaluation_request(evaluation, preps), evals, runs,
                                [("sweep", i) for i in range(len(todo))] + [None] * (len(runs) - len(todo)))
    return training + more, files


def _sweep_submit(argv, runs, preps, evaluation, req) -> int:
    """A submitting launcher's sweep: unfinished runs prepared here, one array job trains them, its evaluation after."""
    kind, dry = preps[0].cfg.launcher.kind, bool(preps[0].cfg.launcher.dry_run)
    todo = [(run, prep) for run, prep in zip(runs, preps) if not kept(SFT, prep)]
    for _, prep in todo if not dry else ():   # (every interpreter: asked by the preflight, before anything is submitted)
        print(SFT.describe(prep))
    root = _sweep_dir(preps[0].cfg)
    if not todo:
        print("[launch] sweep: every run is finished; nothing to train", flush=True)
        # what is left to evaluate: one array task per checkpoint, then the aggregation (analyze, run here)
        return 0 if req is None else _analyze_here(OmegaConf.merge(req.cfg, {"dry_run": dry, "slurm": {"runs": None}}),
                                                   dry_run_dir("sweep") if dry else root)
    if dry:
        return dry_run(SFT, [p for _, p in todo], ["sweep", *argv],
                       plan=lambda where: plan_sweep(SFT, preps, evaluation, where, kind, str(root), req=req))
    plan, files = plan_sweep(SFT, preps, evaluation, plan_dir(req.cfg, "runs") if req else root, kind, str(root), req=req)
    write_files(files)   # (root: made by the runner, with the scripts)
    job, runner = plan[0], SFT.runner(["sweep", *argv], kind)
    ids = runner.run(plan, root, start=start_training(runner, {job.name: (SFT, todo)}))
    print(f"[launch] submitted {len(todo)} runs as Slurm job array {ids[job.name]} ({root / job.name}{runner.suffix})", flush=True)
    if req is not None:
        print("[launch] sweep: each run's evaluation job after its training task, then the report: "
              + ", ".join(f"{j.name} {ids[j.name]}" for j in plan[1:])
              + f"; scripts in {root}\n[launch] {watch(ids[j.name] for j in plan)}", flush=True)
    return 0
