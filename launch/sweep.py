"""`launch sweep arms=[r2e,search,mixed] seeds=[0,1,2] steps=218 ...`: every arm x seed.

Locally the runs go one after another (each is a normal `launch`, so finished runs are skipped
and interrupted ones resume). On Slurm every unfinished run gets its data and run directory
prepared here, then one job array trains them all: task i runs run i's config.yaml.

`eval_profile=PROFILE` (recipes/eval/PROFILE.yaml) evaluates the sweep's checkpoints with
`analyze runs_root=... profile=PROFILE` (`analyze.KEY=VALUE` adds KEY=VALUE to it, e.g.
`analyze.eval.corpus=wiki.jsonl analyze.slurm.time=04:00:00`): locally once every run has finished. On
Slurm each training task i gets its own evaluation job, `--dependency=afterok:<array>_<i>` (cancelled when
that task fails: `--kill-on-invalid-dep=yes`), that evaluates that run's checkpoints when it starts, and
one aggregation job after all of them (`afterany`) writes the report, a run whose evaluation never ran
listed as gaps: one failed training run no longer holds back the others' evaluation (launch/eval_slurm.py,
`slurm.runs`). The analysis submits those jobs right after the training array (its settings are checked,
by its dry run, before anything is submitted); with every run finished it submits one array task per
checkpoint still to evaluate instead. The analysis runs in this process (launch.analyze.main), or as a
child process `python -m launch.analyze` when its interpreter is another (`python.eval=`).
"""
from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path

from omegaconf import OmegaConf

from common import interpreter
from common.cli import split_dotlist
from common.recipes import group_choices
from launch import local, preflight, slurm
from launch.run import (REPO, SFT, check_finished_data, data_record, describe, dry_run, is_finished, launch_one,
                        lock_run_dir, prepare_run, resolve, slurm_runner, submitted)
from launch.errors import LaunchError

SWEEP_KEYS = ("arms", "seeds")
EVAL_PROFILES = REPO / "recipes" / "eval"   # what `eval_profile=` names (the evals stage reads them: evals.profiles)


def parse_sweep(argv: list[str]) -> tuple[list[str], list[int], list[str]]:
    """Split `arms=[...]` and `seeds=[...]` from the per-run overrides."""
    arms, seeds, rest = None, [0], []
    for tok, (key, value) in zip(argv, split_dotlist(argv)):
        if key in SWEEP_KEYS:
            parsed = OmegaConf.from_dotlist([f"x={value}"]).x
            items = list(parsed) if not isinstance(parsed, (str, int)) else [parsed]
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
    valid = group_choices("arm")
    if not arms:
        raise LaunchError(f"sweep needs arms=[...] (choices: {', '.join(valid)})")
    unknown = [a for a in arms if a not in valid]
    if unknown:
        raise LaunchError(f"unknown arm(s) {unknown}; choices: {', '.join(valid)}")
    if not seeds:
        raise LaunchError("seeds=[] is empty")
    return arms, seeds, rest


def combos(argv: list[str]) -> list[list[str]]:
    arms, seeds, rest = parse_sweep(argv)
    return [[f"arm={a}", f"seed={s}", *rest] for a in arms for s in seeds]


ANALYZE = "analyze."   # `analyze.KEY=VALUE`: KEY=VALUE for the sweep's analyze (e.g. analyze.eval.corpus=...)


def split_eval_profile(argv: list[str]) -> tuple[str | None, list[str], list[str]]:
    """(`eval_profile=` value or None, the `analyze.KEY=VALUE` tokens as KEY=VALUE, the rest of argv);
    an unknown profile, or analyze.* without a profile, is a LaunchError."""
    profile, analyze, rest = None, [], []
    for tok in argv:
        key, sep, value = tok.partition("=")
        if sep and key.strip() == "eval_profile":
            profile = value.strip() or None
        elif sep and key.strip().startswith(ANALYZE):
            analyze.append(f"{key.strip()[len(ANALYZE):]}={value}")
        else:
            rest.append(tok)
    if profile is not None and not (EVAL_PROFILES / f"{profile}.yaml").is_file():
        names = sorted(p.stem for p in EVAL_PROFILES.glob("*.yaml"))
        raise LaunchError(f"eval_profile={profile}: no recipes/eval/{profile}.yaml; profiles: {', '.join(names)}")
    if analyze and profile is None:
        raise LaunchError(f"{ANALYZE}KEY=VALUE ({', '.join(analyze)}) sets the sweep's evaluation: give eval_profile=PROFILE")
    return profile, analyze, rest


def analyze_command(runs_root: str, profile: str, extra: list[str] = (), python: str | None = None) -> list[str]:
    """The sweep's analysis, run by the evaluation interpreter (`python.eval=`, given on to its jobs)."""
    return [python or sys.executable, "-m", "launch.analyze", f"runs_root={runs_root}", f"profile={profile}",
            f"out={Path(runs_root) / '_reports' / profile}", *([f"python.eval={python}"] if python else []), *extra]


def _last(tokens: list[str], *keys: str) -> str | None:
    found = None
    for tok in tokens:
        key, sep, value = tok.partition("=")
        if sep and key.strip() in keys:
            found = value.strip()
    return found


def check_eval_python(python: str | None, tokens: list[str]) -> None:
    """Refuse (LaunchError, one line) a named evaluation interpreter lacking what the analyze / evaluate
    command `tokens` needs (vllm for backend=vllm, from its tokens or its profile), before it is run
    (an interpreter without the project's requirements could not even refuse by itself)."""
    if python is None:
        return
    backend = _last(tokens, "backend", "eval.backend")
    profile = _last(tokens, "profile")
    if backend is None and profile and (EVAL_PROFILES / f"{profile}.yaml").is_file():
        backend = OmegaConf.select(OmegaConf.load(EVAL_PROFILES / f"{profile}.yaml"), "evaluate.backend")
    why = interpreter.check("eval", python, interpreter.eval_needs(backend))
    if why:
        raise LaunchError(why)


def _child_env() -> dict[str, str]:
    """The analysis' environment: the project importable, and its jobs already checked by the sweep's preflight."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
                **{preflight.CHECKED_ENV: "1"})


def _run_analyze(cmd: list[str], quiet: bool = False) -> int:
    """The analysis (analyze_command): in this process when its interpreter is this one, else a child process
    (`python.eval=`); its exit status either way (a signal: 128 + N)."""
    if cmd[0] == sys.executable and cmd[1:3] == ["-m", "launch.analyze"]:
        from launch.analyze import main

        return local.run_main(main, cmd[3:], env=_child_env(), quiet=quiet)
    return local.run_child(cmd, env=_child_env(), quiet=quiet)


def run_sweep(argv: list[str], **cache_kw) -> int:
    profile, analyze, argv = split_eval_profile(argv)
    runs = combos(argv)
    preps = [resolve(run) for run in runs]   # every combination's keys and values checked up front
    first = preps[0].cfg   # the preflight: every run's needs and the evaluation's, before anything (exit 2)
    from launch.analyze import parse_argv

    try:   # the evaluation's keys, checked before anything (as its dry run did)
        evaluation = parse_argv(analyze_command(str(first.runs_root), profile, [*analyze, f"launcher={first.launcher.kind}"],
                                                interpreter.named(first.get("python"), "eval"))[3:]) if profile else None
    except LaunchError as exc:
        print(f"error: {exc}\n[launch] sweep: the evaluation (eval_profile={profile}) was refused (exit 2); nothing "
              "trained", file=sys.stderr, flush=True)
        return 2
    found = preflight.gate(preflight.sweep_needs(SFT, preps, evaluation), bool(first.launcher.dry_run))
    return _run_sweep(argv, runs, preps, profile, analyze, **cache_kw) or preflight.after_plan(found) or 0


def _run_sweep(argv, runs, preps, profile, analyze, **cache_kw) -> int:
    if preps[0].cfg.launcher.kind == "slurm":
        return _sweep_slurm(argv, runs, preps, profile=profile, analyze=analyze, **cache_kw)
    dry = bool(preps[0].cfg.launcher.dry_run)
    python = interpreter.named(preps[0].cfg.get("python"), "eval")
    evaluation = analyze_command(str(preps[0].cfg.runs_root), profile, analyze, python) if profile else None
    if evaluation:   # the evaluation's settings, checked by its dry run before the first run trains
        check_eval_python(python, evaluation[3:])
        rc = _run_analyze([*evaluation, "dry_run=true"], quiet=True)
        if rc != 0:
            print(f"[launch] sweep: the evaluation (eval_profile={profile}) was refused (exit {rc}, above); "
                  "nothing trained", file=sys.stderr, flush=True)
            return rc
    if dry:   # the plan: one job, each run a task in turn (a finished run is skipped when it runs)
        rc = dry_run(SFT, preps, ["sweep", *argv], array=True)
        print(f"[launch] sweep: dry run: {len(runs)} run(s) planned, nothing started"
              + (f"; then: {shlex.join(['analyze', *evaluation[3:]])}" if evaluation else ""))
        return rc
    failed = []
    for i, (run, prep) in enumerate(zip(runs, preps), 1):
        print(f"[launch] sweep run {i}/{len(runs)}: {' '.join(run[:2])}", flush=True)
        rc = launch_one(SFT, run, prep, checked=True, **cache_kw)   # the run as resolved up front: composed once
        if rc != 0:
            failed.append((run[:2], rc))
            if rc in (130, 143):   # interrupted: stop the sweep, don't start the next run
                break
    if failed:
        print("[launch] sweep: failed runs: " + "; ".join(f"{' '.join(r)} (exit {rc})" for r, rc in failed))
        return 1
    print(f"[launch] sweep: all {len(runs)} runs finished")
    if evaluation:
        print(f"[launch] sweep: evaluating with profile {profile}: {shlex.join(['analyze', *evaluation[3:]])}", flush=True)
        return _run_analyze(evaluation)
    return 0


def evaluation_command(first, profile: str, analyze: list[str], runs: list[tuple[str, str | None]] | None,
                       dry: bool) -> list[str]:
    """`analyze ... launcher=slurm` for the sweep: with `runs` ((run dir, dependency) pairs) one evaluation
    job per run, each after its training task, then the aggregation (launch/eval_slurm.py `slurm.runs`);
    without, one array task per checkpoint still to evaluate. The training launcher's cluster settings
    (slurm.CLUSTER_KEYS) go to those jobs; `analyze.KEY=VALUE` tokens last, so they win (analyze.slurm.time=...)."""
    same = slurm.Cluster.of(first.cfg.launcher).tokens("slurm.")
    chain = [f"slurm.runs={slurm.dotlist_value([r for r, _ in runs])}",
             f"slurm.runs_after={slurm.dotlist_value([a for _, a in runs])}"] if runs else []
    return analyze_command(str(first.cfg.runs_root), profile,
                           ["launcher=slurm", *same, *chain, *analyze, *(["dry_run=true"] if dry else [])],
                           interpreter.named(first.cfg.get("python"), "eval"))


def _sweep_slurm(argv, runs, preps, profile: str | None = None, analyze: list[str] = (), **cache_kw) -> int:
    todo, finished, dry = [], [], bool(preps[0].cfg.launcher.dry_run)
    for run, prep in zip(runs, preps):
        if is_finished(prep.run_dir):
            if not dry:
                check_finished_data(prep, **cache_kw)
            print(f"[launch] {prep.run_dir} is finished; skipped")
            finished.append(str(prep.run_dir))
            continue
        todo.append((run, prep))
    for _, prep in todo if not dry else ():   # every named interpreter asked before anything is submitted
        print(describe(prep))
        SFT.check_python(prep)
    if profile:
        check_eval_python(interpreter.named(preps[0].cfg.get("python"), "eval"),
                          evaluation_command(preps[0], profile, analyze, None, True)[3:])
    root = Path(preps[0].cfg.runs_root) / "_sweeps" / time.strftime("sweep-%Y%m%dT%H%M%SZ", time.gmtime())
    if not todo:
        print("[launch] sweep: every run is finished; nothing to train", flush=True)
        if profile:   # what is left to evaluate: one array task per checkpoint, then the aggregation
            return _run_analyze(evaluation_command(preps[0], profile, analyze, None, dry))
        return 0
    first = todo[0][1]

    def chained(array_job: str, dry: bool) -> list[str]:
        # run i waits for training task i only; a finished run (nothing to train) waits for nothing
        pairs = [(str(p.run_dir), f"afterok:{array_job}_{i}") for i, (_, p) in enumerate(todo)]
        return evaluation_command(first, profile, analyze, pairs + [(d, None) for d in finished], dry)

    if dry:
        rc = dry_run(SFT, [p for _, p in todo], ["sweep", *argv], array=True, logs=str(root))
        return _run_analyze(chained("<sweep array job id>", True)) if profile and rc == 0 else rc
    if profile:   # the evaluation's settings, checked before anything is submitted (its dry run)
        rc = _run_analyze(chained("<sweep array job id>", True), quiet=True)
        if rc != 0:
            print(f"[launch] sweep: the evaluation (eval_profile={profile}) was refused (exit {rc}, above); "
                  "nothing submitted", file=sys.stderr, flush=True)
            return rc
    for _, prep in todo:
        lock = lock_run_dir(prep.run_dir)
        try:
            slurm.check_not_queued(prep.run_dir)
            prepare_run(prep, **cache_kw)
        finally:
            os.close(lock)
    root.mkdir(parents=True, exist_ok=True)
    job = SFT.job([p for _, p in todo], array=True, logs=str(root))   # their data is known now
    path = root / f"{job.name}.sbatch"
    array = slurm_runner(SFT, ["sweep", *argv]).run([job], root)[job.name]
    for i, (argv_i, prep) in enumerate(todo):
        submitted(prep, argv_i, job, path, f"{array}_{i}", data_record(prep.data))
    print(f"[launch] submitted {len(todo)} runs as Slurm job array {array} ({path})", flush=True)
    if profile:
        rc = _run_analyze(chained(array, False))
        if rc != 0:
            print(f"[launch] sweep: the training array {array} is submitted, its evaluation failed to submit (exit {rc}, "
                  f"above); run: {shlex.join(['analyze', *chained(array, False)[3:]])}", file=sys.stderr, flush=True)
        return rc
    return 0
