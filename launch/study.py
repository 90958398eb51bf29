"""`launch study=NAME`: a reference study (recipes/study/NAME.yaml) planned into one list of Jobs and run.

    launch study=NAME [VAR=value ...] [STAGE:key=value ...] [key=value ...] [smoke=true] [dry_run=true]

docs/studies.md says what each token does and how the plan runs, locally and with `launcher=slurm`;
docs/concepts.md ("How a study becomes jobs") the path: the command line parsed once (`parse_study_argv`),
every stage's config resolved once (`resolve_stages`), the plan (`plan_jobs`, nothing written), its preflight
(`preflight.of(plan)`), then its configs written and its runner.
"""
from __future__ import annotations

import json
import re
import shlex
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from omegaconf import OmegaConf

from common import interpreter
from common.cli import ConfigError, apply_overrides, did_you_mean, parse_switch, shown, wants_help
from common.recipes import ALIASES, DEFAULT_CHOICES
from common.schema import LAUNCHER
from common.study import RUNNERS, STUDY_ENV, TRAINING_RUNS, Stage, Study, load_study
from launch import completion, jobs, local, preflight
from launch.compose import verbatim
from launch.errors import LaunchError
from launch.eval_slurm import record_jobs, write_files
from launch.grpo import GRPO
from launch.jobs import Cluster, Job, JobFailed, Needs, Resources
from launch.run import SFT, start_training
from launch.slurm import slurm_option_problems
from launch.sweep import analysis_config, parse_sweep, plan_sweep

# The interpreter kind of a stage that is one job (a training stage's run python.sft= / python.grpo=, its own keys).
STAGE_PYTHON = {"analyze": "eval", "evaluate": "eval", "export": "sft"}
TRAINERS = {"sft": SFT, "sweep": SFT, "grpo": GRPO}   # a training stage's runs: resolved, planned and started by its trainer
_PYTHON_KEYS = tuple(f"python.{k}" for k in interpreter.KINDS)
EXPORT_NEEDS = {"torch": "export", "safetensors": "export", "omegaconf": "the config"}
_KIND = ("launcher", "launcher.kind")   # the keys that name the backend
_LAUNCHER_KEYS = {f"launcher.{k}": k for k in jobs.CLUSTER_KEYS}
# plain keys that also set the stage jobs' cluster settings: launcher.<key> and its shortcuts (partition=, time=, ...)
_STAGE_JOB_KEYS = {**_LAUNCHER_KEYS, **{short: _LAUNCHER_KEYS[full] for short, full in ALIASES.items() if full in _LAUNCHER_KEYS}}
_SLURM_KEYS = {f"slurm.{k}": k for k in jobs.CLUSTER_KEYS}   # a job stage's own cluster settings (STAGE:slurm.<key>=)


@dataclass(frozen=True)
class Arg:
    """One `key=value` a stage's command reads: the command line's (its `STAGE:` taken off, `${vars.X}` substituted) or its file's."""
    key: str
    value: str

    def __str__(self) -> str:
        return f"{self.key}={self.value}"


def _split(tok: str) -> tuple[str | None, Arg] | None:
    """A command-line token `[STAGE:]key=value` as (STAGE or None, its Arg); None when it is not of that form."""
    head, sep, value = tok.partition("=")
    stage, key = head.split(":", 1) if ":" in head else (None, head)
    return (stage, Arg(key.strip(), value.strip())) if sep and head.strip() else None


def _file_args(stage: Stage, without=()) -> list[Arg]:
    """The stage's arguments in its study file, less those referring to a variable of `without` (unfilled slots)."""
    return [Arg(k, shown(v, dotlist=True)) for k, v in stage.args.items() if not set(stage.arg_uses.get(k, ())) & set(without)]


def _last(args: list[Arg], *keys: str) -> str | None:
    """The value of the last of `args` that sets one of `keys` (None: none does)."""
    return next((a.value for a in reversed(args) if a.key in keys), None)


@dataclass
class Request:
    """A study's command line, parsed once: the study (its variables set), the plain arguments (training stages; the
    launcher, cluster and interpreter keys also the other stages'), each stage's own, dry_run, the plan's backend."""
    study: Study
    shared: list[Arg]
    own: dict[str, list[Arg]]
    dry_run: bool
    launcher: str


def parse_study_argv(argv: list[str]) -> Request:
    """The study's command line, parsed once, each token split once (LaunchError naming a bad token)."""
    given = [(tok, _split(tok)) for tok in argv]
    plain = {p[1].key: p[1].value for _, p in given if p and p[0] is None}   # the last of each key
    if not (spec := plain.get("study")):
        raise LaunchError("study=NAME is required (recipes/study/NAME.yaml, or a path to a study file)")
    study = load_study(spec)
    rest = [(tok, p) for tok, p in given if not (p and p[0] is None and p[1].key in ("study", "smoke"))]
    if "smoke" in plain and parse_switch(plain["smoke"], "smoke"):   # cpu_smoke first: the command line's win
        if not study.cpu_smoke:
            raise LaunchError(f"smoke=true: study {spec} has no cpu_smoke overrides (its file's `cpu_smoke:` is "
                              "empty): it has no run on one CPU to offer")
        rest = [*((tok, _split(tok)) for tok in study.cpu_smoke), *rest]
    variables, targeted, shared, dry_run = {}, [], [], False
    for tok, p in rest:
        if p is None:
            raise LaunchError(f"expected key=value or STAGE:key=value, found {tok!r}")
        stage, arg = p
        if stage is not None:
            if arg.key == "dry_run":
                raise LaunchError(f"{tok}: dry_run goes to every stage; give it without a stage (dry_run=...)")
            targeted.append((tok, stage, arg))
        elif arg.key in study.vars:   # kept unresolved: `${vars.X}` is resolved with the study's variables
            variables[arg.key] = OmegaConf.to_container(apply_overrides(OmegaConf.create({arg.key: None}), [str(arg)]), resolve=False)[arg.key]
        elif arg.key == "dry_run":
            dry_run = parse_switch(arg.value, "dry_run")
        else:
            shared.append((tok, arg))
    study = load_study(spec, variables=variables) if variables else study
    if not any(s.run in TRAINING_RUNS for s in study.stages):
        for tok, arg in shared:
            if arg.key not in (*_STAGE_JOB_KEYS, *(f"python.{STAGE_PYTHON[s.run]}" for s in study.stages), *_KIND):
                raise LaunchError(f"{tok}: a plain key=value goes to the training stages, and study {study.name} has "
                                  f"no training stage; give it to a stage: {study.stages[0].name}:{tok.strip()}")
    own = {s.name: [] for s in study.stages}
    for tok, stage, arg in targeted:
        if stage not in own:
            raise LaunchError(f"{tok}: {stage!r} is not a stage of study {study.name} (stages: {', '.join(own)})."
                              f"{did_you_mean(stage, own)}")
        own[stage].append(replace(arg, value=study.substitute(arg.value, tok)))
    shared = [replace(arg, value=study.substitute(arg.value, tok)) for tok, arg in shared]
    for key, arg in [*((a.key, a) for a in shared), *((f"{s.name}:{a.key}", a) for s in study.stages for a in [*_file_args(s), *own[s.name]])]:
        if arg.key in _KIND:   # each a backend of that name (the key named as typed)
            jobs.backend(arg.value, key)
    default = DEFAULT_CHOICES["launcher"]
    kinds = {s.name: _last([*_file_args(s), *shared, *own[s.name]], *_KIND) or default for s in study.stages if s.run in TRAINING_RUNS}
    launcher = next(iter(kinds.values()), _last(shared, *_KIND) or default)
    if len(set(kinds.values())) > 1:   # one backend per plan: a job run here would not wait for submitted ones
        there = next((v for v in kinds.values() if jobs.backend(v).submits), launcher)
        raise LaunchError(f"study {study.name}: training stages {', '.join(k for k, v in kinds.items() if v == there)} "
                          f"go to {there.capitalize()} but {', '.join(k for k, v in kinds.items() if v != there)} would "
                          f"run here, not after their jobs: give launcher={there} (every training stage) or target each stage")
    for s in (s for s in study.stages if s.run not in TRAINING_RUNS):   # its file's arguments, then the command line's
        for arg in (a for a in [*_file_args(s), *own[s.name]] if a.key in _KIND and a.value != launcher):
            raise LaunchError(f"{s.name}:{arg}: every job of the plan goes to launcher={launcher} (given without a stage or "
                              "to a training stage): give launcher= without a stage")
    return Request(study, shared, own, dry_run, launcher)


def _cluster(args: list[Arg], keys: dict[str, str], base: Cluster = Cluster()) -> Cluster:
    """`base` with the settings `args` make (their `keys`: key -> Cluster field; the last one wins)."""
    made = {}
    for a in (a for a in args if a.key in keys):
        name = keys[a.key]   # its value read as launch reads it (text, unless a list; sbatch: YAML's)
        parsed = OmegaConf.to_container(OmegaConf.from_dotlist([f"x={a.value if name == 'sbatch' else verbatim(a.value)}"]))["x"]
        bad = slurm_option_problems(parsed, a.key) if name == "sbatch" else [LAUNCHER[f"launcher.{name}"].problem(a.key, parsed)]
        if any(bad):
            raise LaunchError("; ".join(filter(None, bad)))
        made[name] = getattr(Cluster.of({name: parsed}), name)   # (setup: a list is its lines)
    return replace(base, **{k: v for k, v in made.items() if v is not None})


@dataclass
class Resolved:
    """One stage resolved: a training stage's runs and launch argvs, a sweep's evaluation (analyze config), or the
    stage's one config, its interpreter, cluster settings and needs; the data slots it still lacks (a dry run's)."""
    stage: Stage
    preps: list = field(default_factory=list)
    argv: list = field(default_factory=list)
    evaluation: object = None
    cfg: object = None
    python: str | None = None
    cluster: Cluster | None = None
    needs: Needs | None = None
    unset: list[str] = field(default_factory=list)


def resolve_stages(req: Request) -> list[Resolved]:
    """Every stage's config resolved once, every key checked (one line naming the stage). Unfilled data slots (a dry
    run): those arguments left out, an unknown key still refused. A job stage's `python.<its kind>=` is its interpreter;
    its config's checks, cluster settings and needs are its job's (analyze: its evaluations' too)."""
    study = req.study
    if study.unset() and not req.dry_run:
        raise LaunchError(f"study {study.name}: set {', '.join(f'{v}=...' for v in study.unset())} "
                          f"(the study's data slots; see {study.path})")
    cluster = _cluster([*req.shared, *(a for s in study.stages if s.run in TRAINING_RUNS for a in req.own[s.name])],
                       _STAGE_JOB_KEYS)
    out = []
    for stage in study.stages:
        r, own, who = Resolved(stage, unset=study.unset(stage)), req.own[stage.name], f"stage {stage.name} ({stage.run})"
        if stage.run not in TRAINING_RUNS:
            kind = STAGE_PYTHON[stage.run]
            for a in (a for a in own if a.key.startswith("python.") and a.key != f"python.{kind}"):
                raise LaunchError(f"{stage.name}:{a}: " + (f"{who} runs in python.{kind}" if a.key in
                                  _PYTHON_KEYS else f"{a.key} is not an interpreter key ({', '.join(_PYTHON_KEYS)})."
                                  f"{did_you_mean(a.key, list(_PYTHON_KEYS))}"))
            r.python = interpreter.named({kind: _last([*req.shared, *own], f"python.{kind}")}, kind)
            own = [a for a in own if stage.run == "analyze" or not a.key.startswith("python.")]   # analyze's: its evaluations' too
        file = _file_args(stage, r.unset)   # the study file's arguments, then the command line's (they win)
        try:
            if stage.run in TRAINING_RUNS:   # its runs as `launch` / `launch sweep` resolves them
                args = [*map(str, [*file, *req.shared, *own]), *(["dry_run=true"] if req.dry_run else [])]
                r.argv, profile, analyze = parse_sweep(args) if stage.run == "sweep" else ([args], None, [])
                r.preps = [TRAINERS[stage.run].resolve(a) for a in r.argv]
                r.evaluation = analysis_config(r.preps[0].cfg, profile, analyze) if profile else None
            elif stage.run == "analyze":   # with the plain cluster settings, python.eval= and study=, checked as the analysis checks them
                from launch.analyze import parse_argv, request

                cfg = parse_argv([*map(str, file), *(cluster.tokens("slurm.") if jobs.backend(req.launcher).submits else []),
                                  *(str(a) for a in req.shared if a.key == "python.eval"), *map(str, own),
                                  *([] if any(a.key == "study" for a in [*file, *own]) else [f"study={study.path}"]),
                                  f"launcher={req.launcher}", "dry_run=false"])
                with local.isolated():   # (planned: the earlier stages' run dirs; None while one is unresolved)
                    request(cfg, planned=None if any(s.unset for s in out) else [p.run_dir for s in out for p in s.preps])
                r.cfg, r.cluster, r.needs = cfg, Cluster.of(cfg.slurm), replace(preflight.analyze_needs(cfg), who=who)
            else:   # evaluate, export: the plain cluster settings, then the stage's own `slurm.<key>=` (no config key)
                args = [*file, *own]
                for a in (a for a in args if a.key.startswith("slurm.") and a.key not in _SLURM_KEYS):
                    raise LaunchError(f"{stage.name}:{a}: {a.key} is not a cluster setting of the stage's job "
                                      f"({', '.join(_SLURM_KEYS)}).{did_you_mean(a.key, list(_SLURM_KEYS))}")
                r.cluster = _cluster(args, _SLURM_KEYS, cluster)
                rest = [str(a) for a in args if not a.key.startswith("slurm.")]
                if stage.run == "evaluate":
                    from evals.config import from_argv

                    r.cfg = from_argv(rest, suggest=_SLURM_KEYS)
                    settings = {k: v for k, v in OmegaConf.to_container(r.cfg).items() if k != "profile"}   # (the profile's are merged in)
                    r.needs = preflight.eval_needs(settings, who, r.python, r.cfg.out, req.launcher)
                else:
                    from sft.export import DEFAULTS, checked

                    r.cfg = checked(apply_overrides(OmegaConf.create(DEFAULTS), rest, suggest=_SLURM_KEYS),
                                    f"stage {stage.name}: ckpt= and out= are required")
                    r.needs = Needs(tuple(dict.fromkeys(preflight.names_in(OmegaConf.to_container(r.cfg)))), EXPORT_NEEDS, who,
                                    "sft", r.python, None, (str(r.cfg.out),))
        except ConfigError as exc:
            if (why := _refusal(str(exc), study, stage, r.unset)) is not None:
                raise LaunchError(f"study {study.name}: stage {stage.name} refuses its settings: {why}") from None
        out.append(r)
    return out


def _refusal(text: str, study: Study, stage: Stage, unset: list[str]) -> str | None:
    """A stage's refusal `text` on one line (its first, then the problems listed below it); an unknown key close to one
    of the study's own keys (`smokez=true`: smoke; a variable): that one suggested, not the stage's. None: each problem
    (a line or `; `-part) names a key left out until its data slot (`unset`) is filled, checked once the slot is."""
    keys = [k for k, uses in stage.arg_uses.items() if set(uses) & set(unset)]
    problems = [p for p in re.split(r"\n|; ", text) if p.strip() and not p.rstrip().endswith(":")]
    if unset and "unknown" not in text and problems and all(any(re.search(rf"(?<![\w.]){re.escape(k)}\b", p) for k in keys)
                                                            for p in problems):
        return None
    first, *more = text.splitlines()
    line = f"{first} {'; '.join(m.strip() for m in more if m.startswith('  '))}".strip()
    unknown = re.search(r"unknown (?:\w+ )?key '([^']+)'", line)
    ours = did_you_mean(unknown.group(1), ["smoke", "dry_run", *study.vars]) if unknown else ""
    return re.sub(r" Did you mean: [^?]*\?", "", line) + ours if ours else line


def plan_jobs(req: Request, stages: list[Resolved], where: Path) -> tuple[list[Job], dict[Path, str]]:
    """The study's plan, nothing written: each stage's jobs, after the latest earlier stage that has jobs (submitted,
    an all-finished training stage has none), and their configs under `where` (path -> text)."""
    plan, files, before, submits = [], {}, (), jobs.backend(req.launcher).submits

    def write(path: Path, text: str) -> str:
        files[path] = text
        return str(path)

    for r in stages:
        stage = r.stage
        after = {"after": before, "after_any": stage.run == "analyze"}
        module = RUNNERS[stage.run]
        if r.unset:   # a dry run: its place in the order, not resolved (every other stage is, or refused)
            unresolved = f"not resolved: set {', '.join(f'{v}=...' for v in r.unset)}"
            stage_jobs = [Job(stage.name, module, config=write(where / f"{stage.name}.unresolved", f"# {unresolved}\n"),
                              **after, notes=(unresolved,))]
        elif stage.run in TRAINING_RUNS:   # as launch / launch sweep plans it (a sweep's evaluation: its configs under where/STAGE)
            for i, p in enumerate(r.preps):
                write(where / f"{stage.name}-{i}.config.yaml", OmegaConf.to_yaml(p.cfg))
            sweep = stage.run == "sweep"
            stage_jobs, more = plan_sweep(TRAINERS[stage.run], r.preps, r.evaluation, where / stage.name, req.launcher,
                                          str(where) if sweep else None, array=sweep)
            files.update(more)
            # `<stage>.<name>`; its training job (none when every run is finished): the stage's own, after the previous stage
            rename = {**{j.name: f"{stage.name}.{j.name}" for j in stage_jobs}, "sweep": stage.name, "launch": stage.name}
            stage_jobs = [replace(j, name=rename[j.name], after=before if rename[j.name] == stage.name else
                                  tuple(rename.get(a, a) for a in j.after)) for j in stage_jobs]
            if r.evaluation is not None:   # its last job carries the analysis's needs
                needs = replace(preflight.analyze_needs(r.evaluation), who=f"stage {stage.name} (its evaluation)")
                stage_jobs[-1] = replace(stage_jobs[-1], needs=replace(stage_jobs[-1].needs, each=(needs,)))
        else:
            cfg = OmegaConf.merge(r.cfg, {"slurm": {"jobs_file": str(where / "jobs.json")}}) \
                if submits and stage.run == "analyze" else r.cfg   # an analyze job's submissions join jobs.json
            config = write(where / f"{stage.name}.yaml", OmegaConf.to_yaml(cfg))
            if stage.run in completion.COMPLETION:   # judged by its completion record, not its exit 0
                config, module = write(where / f"{stage.name}.check.json", completion.check_config(
                    stage.run, r.cfg.out, where / f"{stage.name}.FAILED", module, config, r.python)), completion.MODULE
            gpus = int(r.cfg.data_parallel or 1) * int(r.cfg.tensor_parallel_size or 1) if stage.run == "evaluate" else 0
            stage_jobs = [Job(stage.name, module, config=config, python=r.python or sys.executable, **after,
                              cluster=r.cluster if submits else None, resources=Resources(gpus_per_node=gpus),
                              needs=r.needs, title=f"dtsft-{req.study.name}-{stage.name}",
                              notes=(f"stage {stage.name} ({stage.run})",))]
        before = tuple(j.name for j in stage_jobs) or before
        plan += stage_jobs
    return plan, files


def run_study(argv: list[str]) -> int:
    if wants_help(argv):   # its usage (this module's doc)
        print(__doc__.strip())
        return 0
    req = parse_study_argv(argv)
    study = req.study
    stages = resolve_stages(req)
    print(f"study {study.name}: {study.title}\n  file: {study.path} (sha256 {study.sha256[:12]})\n  reference hardware: "
          + " ".join(f"{k}={shlex.quote(str(v))}" for k, v in study.hardware.items()), flush=True)   # key=value, not a dict
    # `_slurm/` / `_local/` (configs, scripts, logs, job ids) under runs_root, else beside (never inside) `out`, an export's own
    v = study.vars
    ledger = Path(str(v["runs_root"])) if v.get("runs_root") else Path(str(v["out"])).parent if v.get("out") else Path(".")
    where = jobs.dry_run_dir("study") if req.dry_run else \
        (ledger / f"_{req.launcher}" / time.strftime("study-%Y%m%dT%H%M%SZ", time.gmtime())).resolve()
    plan, files = plan_jobs(req, stages, where)
    if not req.dry_run and preflight.gate(preflight.of(plan), False, counted=True):   # before anything is written
        return preflight.EXIT
    write_files(files)   # (the runner makes `where` itself)
    env = jobs.project_env(**{STUDY_ENV: json.dumps({"name": study.name, "path": str(study.path), "sha256": study.sha256})})
    training = {r.stage.name: (TRAINERS[r.stage.run], list(zip(r.argv, r.preps))) for r in stages if r.preps}   # its training stages
    runner = jobs.backend(req.launcher)(shlex.join(["launch", *argv]), env=env)
    if req.dry_run:
        runner.run(plan, where, dry_run=True)
        for r in (r for r in stages if r.unset):
            print(f"  stage {r.stage.name}: (not resolved: set {', '.join(f'{v}=...' for v in r.unset)} to see its config)")
        found = preflight.gate(preflight.of(plan), True, counted=True)
    print(f"  differs from the reference ({len(study.differences())}: each chosen setting, then what is not reproduced):\n"
          + "".join(f"    - {line}\n" for line in study.differences()), end="", flush=True)
    if req.dry_run:
        print(f"study {study.name}: dry run done ({req.launcher}: {len(plan)} job(s) planned, nothing started)")
        return preflight.EXIT if found else 0
    print(f"# the plan: {len(plan)} job(s), in order\n{jobs.table(plan)}\n  configs and scripts: {where}", flush=True)
    try:
        ids = runner.run(plan, where, start=start_training(runner, training))
    except JobFailed as failed:
        print(f"study {study.name}: stage {failed.job.split('.')[0]} failed (exit {failed.status}); the same command "
              "continues the study (finished work is kept and skipped)", file=sys.stderr)
        return failed.status
    if not runner.submits:
        print(f"\nstudy {study.name}: all stages done")
        return 0
    record_jobs(where / "jobs.json", ids)
    print(f"\nstudy {study.name}: submitted " + "; ".join(f"{k}: {v}" for k, v in ids.items())
          + f"\n  scripts, logs and job ids: {where}"
          + f"\n  {jobs.watch(ids.values())}"
          + "\n  an analyze job submits its evaluations and aggregation when it runs (their ids join jobs.json)")
    return 0
