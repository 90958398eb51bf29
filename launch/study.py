"""`launch study=NAME`: run a reference study's stages (recipes/study/NAME.yaml) one after another.

    launch study=NAME [VAR=value ...] [STAGE:key=value ...] [key=value ...] [dry_run=true]

- `VAR=value` sets one of the study's `vars:` (runs_root, data slots, ...);
- `STAGE:key=value` goes to that stage only (e.g. `report:eval.n=2`);
- any other `key=value` goes to every training stage (run: sft, sweep, grpo), e.g. `model=tiny_base`,
  `launcher=slurm`; `dry_run=true` goes to every stage (read by common.cli.parse_switch, the rule of
  every command: true/false, 1/0, yes/no, on/off), never to one;
- `${vars.X}` in any value is the study's variable X (`'reports=${vars.runs_root}/rep'`);
- `smoke=true`: the study file's `cpu_smoke` overrides first (the command line's after them win); a study
  without any refuses it.
A dry run shows a stage whose data slots are not filled as unresolved, after checking every key it is
given as its command would (`check_unfilled_stage`): an unknown key exits 2 there too.
Before the first stage starts, every later stage's settings are checked by its own dry run (output
hidden, refusal shown): a typo in `report:eval.nn=2` stops the study before any training.
Each stage runs in this process through its command's `main` (launch, evaluate, analyze, export-checkpoint:
launch/local.py run_main, nothing of one stage left for the next: environment, working directory, logging), or
as a child process (`python -m evals.cli | launch.analyze | sft.export`) when its interpreter is another
(`python.eval=`, `python.sft=`); an analyze stage is given `study=<file>`
so the report shows the study's reference results beside the measured values. The first stage that
fails stops the study with its exit status; every stage is idempotent (runs resume, analyze evaluates
only what is missing), so the same command continues the study. Each child gets DTSFT_STUDY (the
study's name, file and digest), which run manifests record (an in-process stage: in its environment
for the call).

`launcher=slurm` (or any training stage sent to Slurm: `train:launcher=slurm`) submits the whole
study instead, each stage's jobs depending on the previous
stage's (`--dependency=afterok:...`; an analyze stage `afterany:...`: it runs however the training tasks
ended and lists a failed run as a gap, where afterok would leave it pending forever): a training stage's own launcher submits its jobs (told the
dependency through $DTSFT_SLURM_AFTER; their ids come back through $DTSFT_SLURM_JOBS); an analyze,
evaluate or export stage becomes one job running its command (analyze with `launcher=slurm`, so when
it runs it fans the evaluations out as an array, one task per checkpoint still to evaluate, and
submits the aggregation after it: launch/eval_slurm.py). Scripts, logs and each stage's job ids go to
`<runs_root>/_slurm/study-<UTC time>/` (without a `runs_root` variable: beside the study's `out`, never
inside it); the job ids and one command to watch them are printed. `dry_run=true` prints every script
(dependencies on not yet submitted jobs, an unresolved stage's too, shown as `afterok:<job ids of stage
NAME>`) and each stage's own dry run, and submits and writes nothing.
Before anything runs, launch prints the study's "differs from the reference" lines (`Study.differences`:
every `[chosen: ...]` setting with its reason, then every note).
"""
from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Callable

from common import interpreter
from common.cli import ConfigError, did_you_mean, parse_switch, split_dotlist
from common.interpreter import KINDS
from common.study import RUNNERS, STUDY_ENV, TRAINING_RUNS, Study, load_study, study_variables
from launch import completion
from launch.errors import LaunchError
from launch.local import run_child, run_main

ALL_STAGES = ("dry_run",)  # plain keys that go to every stage, not just the training ones


def parse_study_argv(argv: list[str]) -> tuple[Study, dict[str, list[str]], bool]:
    """(study with the command line's variables, each stage's extra tokens, dry_run).

    `${vars.X}` in a variable or a stage's token is the study's variable X; `dry_run` is read by
    common.cli.parse_switch (the rule of every stage) and goes to every stage, never to one."""
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

    smoke = [t for t in rest if t.partition("=")[0].strip() == "smoke"]
    if smoke:   # the study file's cpu_smoke overrides first, the command line's after them (they win)
        rest = [t for t in rest if t not in smoke]
        if parse_switch(smoke[-1].partition("=")[2], "smoke"):
            overrides = load_study(spec).cpu_smoke
            if not overrides:
                raise LaunchError(f"smoke=true: study {spec} has no cpu_smoke overrides (its file's `cpu_smoke:` is "
                                  "empty): it has no run on one CPU to offer")
            rest = [*overrides, *rest]

    names_of_vars = study_variables(spec)
    variables, targeted, shared, dry_run = {}, [], [], False
    for tok in rest:
        head, sep, _ = tok.partition("=")
        if not sep or not head.strip():
            raise LaunchError(f"expected key=value or STAGE:key=value, found {tok!r}")
        if ":" in head:
            if head.partition(":")[2].strip() in ALL_STAGES:
                raise LaunchError(f"{tok}: {head.partition(':')[2].strip()} goes to every stage; give it without "
                                  f"a stage ({head.partition(':')[2].strip()}=...)")
            targeted.append(tok)
            continue
        (key, value), = split_dotlist([tok])
        if key in names_of_vars:   # kept unresolved: `${vars.X}` is resolved with the study's variables
            variables[key] = OmegaConf.to_container(OmegaConf.from_dotlist([f"v={value}"]), resolve=False)["v"] \
                if value else None
            continue
        if key == "dry_run":
            dry_run = parse_switch(value, "dry_run")
        shared.append(tok)
    study = load_study(spec, variables=variables)
    names = [s.name for s in study.stages]
    extra = {s.name: [] for s in study.stages}
    for tok in shared:
        key = tok.partition("=")[0].strip()
        takers = [s for s in study.stages if key in ALL_STAGES or s.run in TRAINING_RUNS]
        if not takers and key not in (*_STAGE_JOB_KEYS, *_PYTHON_KEYS, "launcher", "launcher.kind"):   # those: the jobs' settings
            raise LaunchError(f"{tok}: a plain key=value goes to the training stages, and study {study.name} has no "
                              f"training stage; give it to a stage: {study.stages[0].name}:{tok.strip()}")
        for s in takers:
            extra[s.name].append(study.substitute(tok, tok))
    for tok in targeted:
        stage, _, kv = tok.partition(":")
        if stage not in extra:
            raise LaunchError(f"{tok}: {stage!r} is not a stage of study {study.name} (stages: {', '.join(names)})."
                              f"{did_you_mean(stage, names)}")
        extra[stage].append(study.substitute(kv, tok))
    return study, extra, dry_run


def _launcher(tokens: list[str]) -> str | None:
    """The launcher a training stage's tokens ask for (the last `launcher=` / `launcher.kind=` wins)."""
    kind = None
    for tok in tokens:
        key, sep, value = tok.partition("=")
        if sep and key.strip() in ("launcher", "launcher.kind"):
            kind = value.strip()
    return kind


# The interpreter kind (common.interpreter) of a stage that is itself a job: a training stage is a launch
# command (its launcher starts the training jobs in `python.sft=` / `python.grpo=`), run by this interpreter.
STAGE_PYTHON = {"analyze": "eval", "evaluate": "eval", "export": "sft"}
_PYTHON_KEYS = tuple(f"python.{k}" for k in KINDS)


def _python_tokens(tokens: list[str]) -> list[str]:
    return [t for t in tokens if t.partition("=")[0].strip().startswith("python.")]


def stage_python(stage, extra: list[str]) -> str | None:
    """The interpreter a non-training stage's command runs: its `python.<kind>=` (the last), None: this one."""
    kind = STAGE_PYTHON.get(stage.run)
    named = [t.partition("=")[2].strip() for t in _python_tokens(extra) if t.partition("=")[0].strip() == f"python.{kind}"]
    return interpreter.named({kind: named[-1]}, kind) if kind and named else None


def stage_command(study: Study, stage, extra: list[str]) -> list[str]:
    """The stage's command line, in its interpreter; an analyze keeps `python.eval=` (for its own jobs),
    an evaluate or export has no such key."""
    module, lead = RUNNERS[stage.run]
    python = stage_python(stage, extra) if stage.run in STAGE_PYTHON else None
    if stage.run in STAGE_PYTHON:
        keep = "python.eval" if stage.run == "analyze" else None
        extra = [t for t in extra if t not in _python_tokens(extra) or t.partition("=")[0].strip() == keep]
    args = stage.argv(extra)
    if stage.run == "analyze" and not any(a.startswith("study=") for a in args):
        args.append(f"study={study.path}")
    return [python or sys.executable, "-m", module, *lead, *args]


def _route_python(study: Study, extra: dict[str, list[str]], argv: list[str]) -> None:
    """`python.<kind>=` on the command line reaches every stage (a training stage has the keys; each other
    stage runs in its kind's interpreter: STAGE_PYTHON), before the stage's own (`STAGE:python.eval=` wins);
    each named interpreter is asked for what its stage needs before anything starts (LaunchError)."""
    from launch.sweep import check_eval_python

    shared = _python_tokens([t for t in argv if ":" not in t.partition("=")[0]])
    for stage in study.stages:
        if stage.run in TRAINING_RUNS:
            continue
        for tok in _python_tokens(extra[stage.name]):
            key = tok.partition("=")[0].strip()
            if key not in _PYTHON_KEYS:
                raise LaunchError(f"{stage.name}:{tok}: {key} is not an interpreter key ({', '.join(_PYTHON_KEYS)})."
                                  f"{did_you_mean(key, list(_PYTHON_KEYS))}")
        extra[stage.name] = shared + extra[stage.name]
        python = stage_python(stage, extra[stage.name])
        if python is None:
            continue
        if STAGE_PYTHON[stage.run] == "eval":
            check_eval_python(python, stage.argv(extra[stage.name]))
        elif why := interpreter.check("sft", python, {"torch": "export", "safetensors": "export", "omegaconf": "the config"}):
            raise LaunchError(why)


def _settings(tokens: list[str]) -> dict:
    """A stage's tokens as one mapping (the last of a key wins; values parsed as the command parses them)."""
    from omegaconf import OmegaConf

    out = {}
    for tok in tokens:
        key, sep, value = tok.partition("=")
        if not sep:
            continue
        try:
            out[key.strip()] = OmegaConf.to_container(OmegaConf.from_dotlist([f"v={value}"]), resolve=False)["v"]
        except Exception:   # a value the stage's own check refuses, with its reason
            out[key.strip()] = value
    return out


def _training_needs(stage, tokens: list[str]) -> tuple[dict[str, str], str | None, list[str]]:
    """(modules, pinned TRL, data names) of a training stage's runs, from its first run's resolved config."""
    from omegaconf import OmegaConf

    from launch.preflight import names_in

    args = [t for t in tokens if t.partition("=")[0].strip() not in ALL_STAGES
            and not t.partition("=")[0].strip().startswith("python.")]
    try:
        if stage.run == "grpo":
            from launch.compose import compose_grpo

            cfg = compose_grpo(args).cfg
            return interpreter.grpo_needs(cfg), cfg.grpo.get("trl"), names_in(OmegaConf.to_container(cfg))
        from launch.compose import compose
        from launch.sweep import combos, split_eval_profile

        cfg = compose(combos(split_eval_profile(args)[2])[0] if stage.run == "sweep" else args).cfg
        return interpreter.sft_needs(cfg), None, names_in(OmegaConf.to_container(cfg))
    except (ConfigError, LaunchError):   # the stage's own check refuses its settings, with the reason
        return {}, None, []


EXPORT_NEEDS = {"torch": "export", "safetensors": "export", "omegaconf": "the config"}


def study_needs(study: Study, extra: dict[str, list[str]]) -> list:
    """Each stage's needs (launch.preflight.Needs) from its settings (a data slot not filled yet left out):
    the data names it and its profile read, its interpreter (named, or this one) with the modules its jobs
    import, and the directories it writes."""
    from launch.preflight import Needs, eval_data, names_in

    out = []
    for stage in study.stages:
        tokens = stage.argv_without(study.unset(stage)) + list(extra[stage.name])
        settings = _settings(tokens)
        who = f"stage {stage.name} ({stage.run})"
        if stage.run in TRAINING_RUNS:
            kind = "grpo" if stage.run == "grpo" else "sft"
            modules, trl, names = _training_needs(stage, tokens)
            python = settings.get(f"python.{kind}")
            out.append(Needs(who, tuple(dict.fromkeys(names + names_in(settings))), kind,
                             interpreter.named({kind: python}, kind), modules, trl,
                             tuple(str(settings[k]) for k in ("runs_root",) if settings.get(k))))
            continue
        kind = STAGE_PYTHON[stage.run]
        names, backend = eval_data(settings, "eval." if stage.run == "analyze" else "") \
            if stage.run in ("analyze", "evaluate") else (names_in(settings), None)
        modules = EXPORT_NEEDS if kind == "sft" else interpreter.eval_needs(backend)
        outs = tuple(str(settings[k]) for k in ("out",) if settings.get(k))
        out.append(Needs(who, tuple(dict.fromkeys(names)), kind, stage_python(stage, extra[stage.name]),
                         modules, None, outs))
    return out


def _stage_main(module: str, launch: Callable[[list[str]], int]) -> Callable[[list[str]], int]:
    """The `main(argv)` of a stage's command module (common.study.RUNNERS), as its console script runs it."""
    if module == "launch.cli":
        return launch
    if module == "launch.analyze":
        from launch.analyze import main
        return main
    if module == "evals.cli":
        from evals.cli import main
        return main
    if module == "sft.export":
        from sft.export import export_main
        return export_main
    raise LaunchError(f"no stage command module {module!r}")


def check_unfilled_stage(study: Study, stage, extra: list[str]) -> None:
    """A stage whose data slots are not filled yet (a dry run cannot resolve it): every key it is given,
    the study's and the command line's, checked as its command checks them (the arguments holding an
    unfilled slot left out); LaunchError naming the stage and the key. A value refused there is not: with
    its slots left out the stage is incomplete (grpo task=qa without its prompts file); it is checked once
    they are filled."""
    from omegaconf import OmegaConf

    from common.cli import apply_overrides

    args = [t for t in stage.argv_without(study.unset(stage)) + list(extra)
            if t.partition("=")[0].strip() not in ALL_STAGES and not t.partition("=")[0].strip().startswith("python.")]
    try:
        if stage.run in ("sft", "sweep"):
            from launch.compose import compose
            from launch.sweep import combos, split_eval_profile

            compose(combos(split_eval_profile(args)[2])[0] if stage.run == "sweep" else args)
        elif stage.run == "grpo":
            from launch.compose import compose_grpo

            compose_grpo(args)
        elif stage.run == "analyze":
            from launch.analyze import parse_argv

            parse_argv(args)
        elif stage.run == "evaluate":
            from evals.config import base_config

            apply_overrides(base_config(), args)
        else:
            from sft.export import DEFAULTS

            apply_overrides(OmegaConf.create(DEFAULTS), args)
    except ConfigError as exc:
        if "unknown key" in str(exc) or "unknown evaluate key" in str(exc):
            raise LaunchError(f"study {study.name}: stage {stage.name} refuses its settings: {exc}".splitlines()[0]) from None


def run_stage(cmd: list[str], env: dict, launch: Callable[[list[str]], int], quiet: bool = False) -> int:
    """A stage's command (stage_command): in this process with `env` when its interpreter is this one, else a
    child process; its exit status either way."""
    if cmd[0] == sys.executable and cmd[1] == "-m":
        return run_main(_stage_main(cmd[2], launch), cmd[3:], env=env, quiet=quiet)
    return run_child(cmd, env=env, quiet=quiet)


def _check_stages(study: Study, stages: list, extra: dict[str, list[str]], env: dict, on_slurm: bool,
                  launch: Callable[[list[str]], int]) -> int:
    """Each of `stages`' settings checked by its own dry run (its output not shown, its refusal is)
    before the study starts anything: a typo in a later stage's key stops the study up front."""
    for stage in stages:
        cmd = stage_command(study, stage, extra[stage.name]) + (["launcher=slurm"] if on_slurm and stage.run == "analyze" else [])
        rc = run_stage([*cmd, "dry_run=true"], env, launch, quiet=True)
        if rc != 0:
            print(f"study {study.name}: stage {stage.name} refuses its settings (exit {rc}, above; its dry run: "
                  f"{shlex.join(['python', *cmd[1:], 'dry_run=true'])}); nothing started", file=sys.stderr, flush=True)
            return rc
    return 0


def run_study(argv: list[str], launch: Callable[[list[str]], int]) -> int:
    """The study's stages; `launch` is the `launch` command's main (launch.cli), what a training stage runs."""
    study, extra, dry_run = parse_study_argv(argv)
    # Slurm when any training stage is sent there (`launcher=slurm` for all of them, or `train:launcher=slurm`):
    # the stages after it must wait for its jobs, not run at once on untrained runs.
    kinds = {s.name: _launcher(s.argv(extra[s.name])) or "local" for s in study.stages if s.run in TRAINING_RUNS}
    on_slurm = "slurm" in kinds.values() or _launcher([t for t in argv if ":" not in t.partition("=")[0]]) == "slurm"
    if on_slurm and set(kinds.values()) != {"slurm"} and kinds:   # a local one would run at once, not after the jobs
        raise LaunchError(f"study {study.name}: training stages {', '.join(k for k, v in kinds.items() if v == 'slurm')} "
                          f"go to Slurm but {', '.join(k for k, v in kinds.items() if v != 'slurm')} would run here, "
                          "not after their jobs: give launcher=slurm (every training stage) or target each stage")
    if study.unset() and not dry_run:
        raise LaunchError(f"study {study.name}: set {', '.join(f'{v}=...' for v in study.unset())} "
                          f"(the study's data slots; see {study.path})")
    own = _route_cluster(study, extra, argv) if on_slurm else {}
    _route_python(study, extra, argv)
    hardware = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in study.hardware.items())   # key=value, not a dict
    print(f"study {study.name}: {study.title}\n  file: {study.path} (sha256 {study.sha256[:12]})\n"
          f"  reference hardware: {hardware}\n  stages: {' -> '.join(f'{s.name} ({s.run})' for s in study.stages)}",
          flush=True)
    print(f"  differs from the reference ({len(study.differences())}: each chosen setting, then what is not reproduced):\n"
          + "".join(f"    - {line}\n" for line in study.differences()), end="", flush=True)
    # the preflight: everything any stage's jobs will need, before anything is started, submitted or written
    from launch import preflight

    problems = preflight.problems(study_needs(study, extra))
    preflight.report(problems, dry_run)
    if problems and not dry_run:
        return preflight.EXIT
    from launch.run import REPO

    env = dict(os.environ, **{STUDY_ENV: json.dumps(study.identity())})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    if not dry_run:   # a dry run shows each stage's own dry run anyway
        # the first stage checks its own keys before it does anything, unless it is a job submitted as it is
        first_checks_itself = study.stages[0].run in TRAINING_RUNS or not on_slurm
        rc = _check_stages(study, study.stages[1 if first_checks_itself else 0:], extra, env, on_slurm, launch)
        if rc != 0:
            return rc
    if on_slurm:
        rc = _submit_study(study, extra, dry_run, env, own, launch)
        if rc == 0 and problems:
            print(f"study {study.name}: the preflight found {len(problems)} problem(s) (above): exit {preflight.EXIT}",
                  file=sys.stderr)
            return preflight.EXIT
        return rc
    for i, stage in enumerate(study.stages, 1):
        cmd = stage_command(study, stage, extra[stage.name])
        print(f"\n== stage {i}/{len(study.stages)}: {stage.name} ({stage.run})\n$ {shlex.join(['python', *cmd[1:]])}", flush=True)
        if study.unset(stage):
            check_unfilled_stage(study, stage, extra[stage.name])
            print(f"(not resolved: set {', '.join(f'{v}=...' for v in study.unset(stage))} to see this stage's config)", flush=True)
            continue
        record = completion.record_of(stage.run, cmd[3:])
        before = completion.fingerprint(record) if record else None
        rc = run_stage(cmd, env, launch)
        if rc == 0 and not dry_run and record and (why := completion.not_completed(record, before)):   # exit 0 is not the work done: its record is
            print(f"error: study {study.name}: stage {stage.name} exited 0 but {why}", file=sys.stderr)
            rc = 1
        if rc != 0:
            print(f"study {study.name}: stage {stage.name} failed (exit {rc}); the same command continues the study "
                  f"(finished work is kept and skipped)", file=sys.stderr)
            return rc
    print(f"\nstudy {study.name}: {'dry run done' if dry_run else 'all stages done'}")
    if problems:
        print(f"study {study.name}: the preflight found {len(problems)} problem(s) (above): exit {preflight.EXIT}",
              file=sys.stderr)
        return preflight.EXIT
    return 0


def _cluster_keys() -> dict[str, str]:
    """The command line's cluster settings (`launcher.<key>` and its shortcuts: partition=, time=, ...) -> key."""
    from common.recipes import ALIASES
    from launch.slurm import CLUSTER_KEYS

    keys = {f"launcher.{k}": k for k in CLUSTER_KEYS}
    return {**keys, **{short: keys[full] for short, full in ALIASES.items() if full in keys}}


_STAGE_JOB_KEYS = _cluster_keys()   # plain keys that also set the stage jobs' cluster settings


def cluster_from_tokens(tokens: list[str], keys: dict[str, str], base=None):
    """`base` (launch.slurm.Cluster) with the settings `tokens` make (their `keys`; the last one wins)."""
    from omegaconf import OmegaConf

    from launch.slurm import Cluster

    made = {}
    for tok in tokens:
        key, _, value = tok.partition("=")
        if key.strip() not in keys:
            continue
        name, value = keys[key.strip()], value.strip()
        parsed = OmegaConf.to_container(OmegaConf.from_dotlist([f"x={value}"]))["x"] \
            if name == "sbatch" or value[:1] in ("'", '"') or value == "null" else value
        made[name] = tuple(parsed or ()) if name == "sbatch" else (None if parsed in (None, "") else str(parsed))
    return (base or Cluster()).over(**made)


def _stage_gpus(stage, args: list[str]) -> int:
    """GPUs of a stage's own job: an evaluate stage's engines (data_parallel x tensor_parallel_size); an
    analyze job only plans and submits (its array tasks get their GPUs), an export needs none."""
    if stage.run != "evaluate":
        return 0
    kv = dict(a.split("=", 1) for a in args if "=" in a)
    try:
        return int(kv.get("data_parallel", 1)) * int(kv.get("tensor_parallel_size", 1))
    except ValueError:
        raise LaunchError(f"stage {stage.name}: data_parallel / tensor_parallel_size must be integers") from None


def _ledger_root(study: Study) -> Path:
    """Where `_slurm/` (the study's scripts, logs, job ids) goes: under the study's runs_root, else beside
    (never inside) its `out`, which a stage (an export) must find holding only what it wrote."""
    if study.vars.get("runs_root"):
        return Path(str(study.vars["runs_root"]))
    if study.vars.get("out"):
        return Path(str(study.vars["out"])).parent
    return Path(".")


def _route_cluster(study: Study, extra: dict[str, list[str]], argv: list[str]) -> dict:
    """One set of cluster settings for every job of a Slurm study: the command line's (`partition=`,
    `account=`, `qos=`, `time=`, `launcher.sbatch=`, `launcher.setup=`, also given to a training stage) reach
    each analyze stage as its `slurm.<key>=` (its evaluation jobs and aggregation), before the stage's own
    tokens, so that `STAGE:slurm.<key>=` overrides them. Returns each non-training stage's job settings
    (launch.slurm.Cluster): those, then the stage's own `slurm.<key>=` (taken out of an evaluate or export
    stage's command, which has no such key)."""
    from launch.slurm import CLUSTER_KEYS

    shared = [t for t in argv if ":" not in t.partition("=")[0]]
    cluster = cluster_from_tokens(shared + [t for s in study.stages if s.run in TRAINING_RUNS for t in extra[s.name]],
                                  _STAGE_JOB_KEYS)
    own_keys = {f"slurm.{k}": k for k in CLUSTER_KEYS}
    jobs = {}
    for stage in study.stages:
        if stage.run in TRAINING_RUNS:
            continue
        mine = [t for t in extra[stage.name] if t.partition("=")[0].strip().startswith("slurm.")]
        if stage.run == "analyze":
            extra[stage.name] = cluster.tokens("slurm.") + extra[stage.name]
        else:
            for tok in mine:
                key = tok.partition("=")[0].strip()
                if key not in own_keys:
                    raise LaunchError(f"{stage.name}:{tok}: {key} is not a cluster setting of the stage's job "
                                      f"({', '.join(own_keys)}).{did_you_mean(key, list(own_keys))}")
            extra[stage.name] = [t for t in extra[stage.name] if t not in mine]
        jobs[stage.name] = cluster_from_tokens(mine, own_keys, cluster)
    return jobs


def _submit_study(study: Study, extra: dict[str, list[str]], dry_run: bool, env: dict, own: dict,
                  launch: Callable[[list[str]], int]) -> int:
    from launch import slurm
    from launch.run import REPO

    ledger = (_ledger_root(study) / "_slurm" / time.strftime("study-%Y%m%dT%H%M%SZ", time.gmtime())).resolve()
    if not dry_run:
        ledger.mkdir(parents=True, exist_ok=True)
    waits, submitted = [], {}
    for i, stage in enumerate(study.stages, 1):
        # What this stage waits for: the last stage that submitted jobs. An analyze stage runs once they have
        # ended, however they ended (afterany), and lists a run whose training failed as a gap (afterok would
        # leave it pending forever); any other stage needs them to have succeeded (afterok): a training stage
        # after another, an export of a model that must exist.
        after = (("afterany:" if stage.run == "analyze" else "afterok:") + ":".join(waits)) if waits else None
        cmd = stage_command(study, stage, extra[stage.name])
        if stage.run == "analyze":
            cmd.append("launcher=slurm")   # its evaluations: a job array, then the aggregation
        print(f"\n== stage {i}/{len(study.stages)}: {stage.name} ({stage.run})\n$ {shlex.join(['python', *cmd[1:]])}"
              f"\n[study] waits for: {after or 'nothing'}", flush=True)
        if study.unset(stage):   # (a dry run only): its jobs are still what the next stage waits for
            check_unfilled_stage(study, stage, extra[stage.name])
            print(f"(not resolved: set {', '.join(f'{v}=...' for v in study.unset(stage))} to see this stage's config)", flush=True)
            submitted[stage.name] = waits = [f"<job ids of stage {stage.name}>"]
            continue
        jobs_file = ledger / f"{stage.name}.jobs"
        stage_env = {k: v for k, v in env.items() if k != slurm.AFTER_ENV}
        stage_env[slurm.JOBS_ENV] = str(jobs_file)
        if after:
            stage_env[slurm.AFTER_ENV] = after
        if stage.run in TRAINING_RUNS or dry_run:   # a training launcher submits its own jobs; a dry run shows each stage's plan
            rc = run_stage(cmd, stage_env, launch)
            if rc != 0:
                print(f"study {study.name}: stage {stage.name} failed (exit {rc}); nothing after it was submitted",
                      file=sys.stderr)
                return rc
        if stage.run not in TRAINING_RUNS:
            job_argv = [a for a in cmd if a.partition("=")[0].strip() not in ALL_STAGES]   # the job runs for real
            # exit 0 is not the job done: on its node, after it ran, its completion record is checked (FAILED if not)
            job_argv = completion.wrap(stage.run, job_argv, ledger / f"{stage.name}.FAILED")
            spec = slurm.SlurmSpec.of(own[stage.name], job_name=f"dtsft-{study.name}-{stage.name}", nodes=1,
                                      gpus_per_node=_stage_gpus(stage, job_argv), nproc_per_node=1,
                                      output=str(ledger / f"{stage.name}-%j.out"), exclusive=False, signal=False,
                                      dependency=after)
            job_env = {key: stage_env[key] for key in (STUDY_ENV, slurm.JOBS_ENV)}
            script = slurm.render_stage_script(spec, os.getcwd(), str(REPO), f"launch study={study.name} (stage {stage.name})",
                                               job_argv, job_env)
            path = ledger / f"{stage.name}.sbatch"
            if dry_run:
                print(f"# {path} (not written: dry_run=true)\n{script}", flush=True)
            else:
                path.write_text(script, encoding="utf-8")
                with open(jobs_file, "a", encoding="utf-8") as fh:
                    fh.write(slurm.submit(path) + "\n")
        ids = jobs_file.read_text().split() if jobs_file.is_file() else []
        if dry_run:
            ids = [f"<job ids of stage {stage.name}>"]
        if ids:
            submitted[stage.name] = waits = ids
        print(f"[study] stage {stage.name}: " + (f"Slurm job(s) {', '.join(ids)}" if ids else "nothing submitted (done)"),
              flush=True)
    every = [j for ids in submitted.values() for j in ids]
    if dry_run:
        print(f"\nstudy {study.name}: dry run done (launcher=slurm: {len(submitted)} stage(s) would be submitted)")
        return 0
    print(f"\nstudy {study.name}: submitted " + "; ".join(f"{k}: {', '.join(v)}" for k, v in submitted.items())
          + f"\n  scripts, logs and job ids: {ledger}"
          + (f"\n  watch: squeue -j {','.join(every)}   (when done: sacct -j {','.join(every)})" if every else "")
          + "\n  an analyze job appends its evaluation array's and aggregation's ids to its <stage>.jobs file when it runs")
    return 0
