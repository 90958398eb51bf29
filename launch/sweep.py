"""`launch sweep arms=[r2e,search,mixed] seeds=[0,1,2] steps=218 ...`: every arm x seed.

Locally the runs go one after another (each is a normal `launch`, so finished runs are skipped
and interrupted ones resume). On Slurm every unfinished run gets its data and run directory
prepared here, then one job array trains them all: task i runs run i's config.yaml.
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


def run_sweep(argv: list[str], **cache_kw) -> int:
    runs = combos(argv)
    preps = [resolve(run) for run in runs]   # every combination's keys and values checked up front
    if preps[0].cfg.launcher.kind == "slurm":
        return _sweep_slurm(argv, runs, preps, **cache_kw)
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
    return 0


def _sweep_slurm(argv, runs, preps, **cache_kw) -> int:
    todo = []
    for run, prep in zip(runs, preps):
        if is_finished(prep.run_dir):
            if not prep.cfg.launcher.dry_run:
                check_finished_data(prep, **cache_kw)
            print(f"[launch] {prep.run_dir} is finished; skipped")
            continue
        print(describe(prep))
        todo.append((run, prep))
    if not todo:
        print("[launch] sweep: every run is finished; nothing to submit")
        return 0
    first = todo[0][1]
    root = Path(first.cfg.runs_root) / "_sweeps" / time.strftime("sweep-%Y%m%dT%H%M%SZ", time.gmtime())
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
    return 0
