"""`launch study=NAME`: run a reference study's stages (recipes/study/NAME.yaml) one after another.

    launch study=NAME [VAR=value ...] [STAGE:key=value ...] [key=value ...] [dry_run=true]

- `VAR=value` sets one of the study's `vars:` (runs_root, data slots, ...);
- `STAGE:key=value` goes to that stage only (e.g. `report:eval.n=2`);
- any other `key=value` goes to every training stage (run: sft, sweep, grpo), e.g. `model=tiny_base`,
  `launcher=slurm`; `dry_run=true` goes to every stage.
Each stage runs as a child process through its command's module (`python -m launch.cli | evals.cli |
analysis.cli | sft.export`), so launch imports no later stage; an analyze stage is given `study=<file>`
so the report shows the study's reference results beside the measured values. The first stage that
fails stops the study with its exit status; every stage is idempotent (runs resume, analyze evaluates
only what is missing), so the same command continues the study. Each child gets DTSFT_STUDY (the
study's name, file and digest), which run manifests record.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

from common.cli import did_you_mean, split_dotlist
from common.study import RUNNERS, STUDY_ENV, TRAINING_RUNS, Study, load_study, study_variables
from launch.errors import LaunchError

ALL_STAGES = ("dry_run",)  # plain keys that go to every stage, not just the training ones


def parse_study_argv(argv: list[str]) -> tuple[Study, dict[str, list[str]], bool]:
    """(study with the command line's variables, each stage's extra tokens, dry_run)."""
    spec, rest = None, []
    for tok in argv:
        key, _, value = tok.partition("=")
        if key.strip() == "study":
            spec = value.strip()
        else:
            rest.append(tok)
    if not spec:
        raise LaunchError("study=NAME is required (recipes/study/NAME.yaml, or a path to a study file)")
    from omegaconf import OmegaConf

    names_of_vars = study_variables(spec)
    variables, targeted, shared, dry_run = {}, [], [], False
    for tok in rest:
        head, sep, _ = tok.partition("=")
        if not sep or not head.strip():
            raise LaunchError(f"expected key=value or STAGE:key=value, found {tok!r}")
        if ":" in head:
            targeted.append(tok)
            continue
        (key, value), = split_dotlist([tok])
        if key in names_of_vars:
            variables[key] = OmegaConf.from_dotlist([f"v={value}"]).v if value else None
            continue
        if key == "dry_run":
            dry_run = str(value).strip().lower() in ("1", "true", "yes")
        shared.append(tok)
    study = load_study(spec, variables=variables)
    names = [s.name for s in study.stages]
    extra = {s.name: [] for s in study.stages}
    for tok in shared:
        key = tok.partition("=")[0].strip()
        for s in study.stages:
            if key in ALL_STAGES or s.run in TRAINING_RUNS:
                extra[s.name].append(tok)
    for tok in targeted:
        stage, _, kv = tok.partition(":")
        if stage not in extra:
            raise LaunchError(f"{tok}: {stage!r} is not a stage of study {study.name} (stages: {', '.join(names)})."
                              f"{did_you_mean(stage, names)}")
        extra[stage].append(kv)
    return study, extra, dry_run


def stage_command(study: Study, stage, extra: list[str]) -> list[str]:
    module, lead = RUNNERS[stage.run]
    args = stage.argv(extra)
    if stage.run == "analyze" and not any(a.startswith("study=") for a in args):
        args.append(f"study={study.path}")
    return [sys.executable, "-m", module, *lead, *args]


def run_study(argv: list[str]) -> int:
    study, extra, dry_run = parse_study_argv(argv)
    if study.unset() and not dry_run:
        raise LaunchError(f"study {study.name}: set {', '.join(f'{v}=...' for v in study.unset())} "
                          f"(the study's data slots; see {study.path})")
    print(f"study {study.name}: {study.title}\n  file: {study.path} (sha256 {study.sha256[:12]})\n"
          f"  reference hardware: {study.hardware}\n  stages: {' -> '.join(f'{s.name} ({s.run})' for s in study.stages)}")
    from launch.run import REPO

    env = dict(os.environ, **{STUDY_ENV: json.dumps(study.identity())})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    for i, stage in enumerate(study.stages, 1):
        cmd = stage_command(study, stage, extra[stage.name])
        print(f"\n== stage {i}/{len(study.stages)}: {stage.name} ({stage.run})\n$ {shlex.join(['python', *cmd[1:]])}", flush=True)
        if study.unset(stage):
            print(f"(not resolved: set {', '.join(f'{v}=...' for v in study.unset(stage))} to see this stage's config)", flush=True)
            continue
        rc = subprocess.run(cmd, env=env).returncode
        if rc != 0:
            rc = 128 - rc if rc < 0 else rc
            print(f"study {study.name}: stage {stage.name} failed (exit {rc}); the same command continues the study "
                  f"(finished work is kept and skipped)", file=sys.stderr)
            return rc
    print(f"\nstudy {study.name}: {'dry run done' if dry_run else 'all stages done'}")
    return 0
