"""`launch sweep arms=[r2e,search,mixed] seeds=[0,1,2] steps=218 ...`: every arm x seed.

Locally the runs go one after another (each is a normal `launch`, so finished runs are skipped
and interrupted ones resume). On Slurm every unfinished run gets its data and run directory
prepared here, then one job array trains them all: task i runs run i's config.yaml.

`eval_profile=PROFILE` (recipes/eval/PROFILE.yaml) evaluates the sweep's checkpoints afterwards with
`analyze runs_root=... profile=PROFILE`: locally once every run has finished; on Slurm as a job that
waits for the training array (`--dependency=afterok:<array>`) and then runs `analyze ... launcher=slurm`,
which submits one evaluation array task per checkpoint still to evaluate and the aggregation after it.
launch never imports the analysis: the job (or the local child process) runs `python -m analysis.cli`.
"""
from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path

from omegaconf import OmegaConf

from common.cli import split_dotlist
from launch import manifest, slurm
from launch.compose import group_choices
from launch.run import (REPO, check_finished_data, data_record, describe, is_finished, launch_one, lock_run_dir,
                        prepare_run, resolve)
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


def split_eval_profile(argv: list[str]) -> tuple[str | None, list[str]]:
    """(`eval_profile=` value or None, argv without it); an unknown profile is a LaunchError."""
    profile, rest = None, []
    for tok in argv:
        key, sep, value = tok.partition("=")
        if sep and key.strip() == "eval_profile":
            profile = value.strip() or None
        else:
            rest.append(tok)
    if profile is not None and not (EVAL_PROFILES / f"{profile}.yaml").is_file():
        names = sorted(p.stem for p in EVAL_PROFILES.glob("*.yaml"))
        raise LaunchError(f"eval_profile={profile}: no recipes/eval/{profile}.yaml; profiles: {', '.join(names)}")
    return profile, rest


def analyze_command(runs_root: str, profile: str, slurm_fanout: bool) -> list[str]:
    return [sys.executable, "-m", "analysis.cli", f"runs_root={runs_root}", f"profile={profile}",
            f"out={Path(runs_root) / '_reports' / profile}", *(["launcher=slurm"] if slurm_fanout else [])]


def run_sweep(argv: list[str], **cache_kw) -> int:
    profile, argv = split_eval_profile(argv)
    runs = combos(argv)
    preps = [resolve(run) for run in runs]   # every combination's keys and values checked up front
    if preps[0].cfg.launcher.kind == "slurm":
        return _sweep_slurm(argv, runs, preps, profile=profile, **cache_kw)
    failed = []
    for i, run in enumerate(runs, 1):
        print(f"[launch] sweep run {i}/{len(runs)}: {' '.join(run[:2])}", flush=True)
        rc = launch_one(run, **cache_kw)
        if rc != 0:
            failed.append((run[:2], rc))
            if rc in (130, 143):   # interrupted: stop the sweep, don't start the next run
                break
    if failed:
        print("[launch] sweep: failed runs: " + "; ".join(f"{' '.join(r)} (exit {rc})" for r, rc in failed))
        return 1
    print(f"[launch] sweep: all {len(runs)} runs finished")
    if profile and not preps[0].cfg.launcher.dry_run:
        import subprocess

        cmd = analyze_command(str(preps[0].cfg.runs_root), profile, slurm_fanout=False)
        print(f"[launch] sweep: evaluating with profile {profile}: {shlex.join(['analyze', *cmd[3:]])}", flush=True)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
        rc = subprocess.run(cmd, env=env).returncode
        return 128 - rc if rc < 0 else rc
    return 0


def _submit_evaluation(first, root: Path, profile: str, array_job: str | None, dry: bool) -> None:
    """The job that, once the training array has succeeded, plans and submits the sweep's evaluation."""
    after = f"afterok:{array_job}" if array_job else None
    spec = slurm.SlurmSpec(job_name="dtsft-sweep-eval", nodes=1, gpus_per_node=0, nproc_per_node=1,
                           output=str(root / "evaluate-%j.out"), exclusive=False, signal=False,
                           partition=None if first.cfg.launcher.partition is None else str(first.cfg.launcher.partition),
                           account=None if first.cfg.launcher.account is None else str(first.cfg.launcher.account),
                           setup=first.cfg.launcher.get("setup"), **({"dependency": after} if after else {}))
    cmd = analyze_command(str(first.cfg.runs_root), profile, slurm_fanout=True)
    env = {k: os.environ[k] for k in (slurm.JOBS_ENV,) if os.environ.get(k)}
    script = slurm.render_stage_script(spec, os.getcwd(), str(REPO), f"launch sweep eval_profile={profile} (evaluation)",
                                       cmd, env)
    path = root / "evaluate.sbatch"
    if dry:
        print(f"# {path} (not written: dry_run=true)\n{script}")
        return
    root.mkdir(parents=True, exist_ok=True)
    path.write_text(script, encoding="utf-8")
    job = slurm.submit(path)
    print(f"[launch] submitted the evaluation (profile {profile}) as Slurm job {job}"
          + (f", after the training array {array_job} succeeds" if array_job else "")
          + f"; watch: squeue -j {','.join(j for j in (array_job, job) if j)}")


def _sweep_slurm(argv, runs, preps, profile: str | None = None, **cache_kw) -> int:
    todo = []
    for run, prep in zip(runs, preps):
        if is_finished(prep.run_dir):
            if not prep.cfg.launcher.dry_run:
                check_finished_data(prep, **cache_kw)
            print(f"[launch] {prep.run_dir} is finished; skipped")
            continue
        print(describe(prep))
        todo.append((run, prep))
    root = Path(preps[0].cfg.runs_root) / "_sweeps" / time.strftime("sweep-%Y%m%dT%H%M%SZ", time.gmtime())
    if not todo:
        print("[launch] sweep: every run is finished; nothing to train")
        if profile:
            _submit_evaluation(preps[0], root, profile, None, bool(preps[0].cfg.launcher.dry_run))
        return 0
    first = todo[0][1]
    spec = slurm.spec_from_config(first.cfg, job_name="dtsft-sweep", output=str(root / "slurm-%A_%a.out"),
                                  nproc=first.nproc)
    command = shlex.join(["launch", "sweep", *argv])
    dry = bool(first.cfg.launcher.dry_run)
    if not dry:
        for _, prep in todo:
            lock = lock_run_dir(prep.run_dir)
            try:
                slurm.check_not_queued(prep.run_dir)
                prepare_run(prep, **cache_kw)
            finally:
                os.close(lock)
    script = slurm.render_array_script(spec, [str(p.run_dir) for _, p in todo], str(REPO), sys.executable, command)
    if dry:
        print(f"# {root / 'sweep.sbatch'} (not written: dry_run=true)\n{script}")
        if profile:
            _submit_evaluation(first, root, profile, "<sweep array job id>", dry)
        return 0
    root.mkdir(parents=True, exist_ok=True)
    path = root / "sweep.sbatch"
    path.write_text(script, encoding="utf-8")
    job = slurm.submit(path)
    for i, (run, prep) in enumerate(todo):
        launcher = {"kind": "slurm", "nodes": spec.nodes, "gpus_per_node": spec.gpus_per_node,
                    "script": str(path), "job_id": f"{job}_{i}"}
        manifest.write_manifest(prep.run_dir, argv=run, choices=prep.composed.choices, launcher=launcher,
                                data=data_record(prep.data), identity=prep.identity)
    print(f"[launch] submitted {len(todo)} runs as Slurm job array {job} ({path})")
    if profile:
        _submit_evaluation(first, root, profile, job, dry)
    return 0
