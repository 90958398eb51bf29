"""The preflight (`gate`): before a command's first job, everything any of its jobs will need (the plan's `Needs`, from
the configs the command resolved once), checked at once: one line per thing missing (data, hub sources, interpreters
and their modules, CUDA, output directories; docs/prerequisites.md), never touching the network and creating nothing."""
from __future__ import annotations

import os
import sys
from contextlib import suppress
from pathlib import Path

from omegaconf import OmegaConf

from common import datafetch, interpreter
from common.cli import ConfigError
from common.interpreter import gpus_visible   # only where one is does it ask an interpreter whether its torch sees CUDA
from data_prep import arms, hub
from data_prep.readers import SourceError, parse_source
from launch import cache, jobs
from launch.errors import LaunchError
from launch.jobs import Needs

EXIT = 2


def of(plan: list[jobs.Job]) -> list[Needs]:
    """What the preflight checks of a plan, in order: each job's needs that name `who` (a training job's: each run's)."""
    return [n for job in plan for n in job.needs.each or (job.needs,) if n.who]


def names_in(value) -> list[str]:
    """The data names (common.datafetch) anywhere in a setting's value (a string, list or mapping)."""
    if isinstance(value, (dict, list, tuple)):
        return [n for v in (value.values() if isinstance(value, dict) else value) for n in names_in(v)]
    return [value] if datafetch.is_name(value) else []


def eval_needs(settings: dict, who: str, python: str | None, out, launcher: str) -> Needs:
    """What an evaluation needs: the data it reads (its profile's, then its settings': an evaluate config, or
    analyze's `eval.*` with its profile and benches; each bench's item set as evals.benches resolves it), its
    interpreter (None: this one) with vllm for backend=vllm, CUDA for vLLM where `launcher` runs it, `out`."""
    from evals.benches import bench_set
    from evals.profiles import load_profile

    evaluate = load_profile(str(settings["profile"]))["evaluate"] if settings.get("profile") else {}
    names = names_in([{k: v for k, v in d.items() if k != "sets"} for d in (evaluate, settings)])   # a set: below
    if settings.get("retriever", evaluate.get("retriever")) != "e5":   # no dense retrieval: no encoder, no index
        names = [n for n in names if not n.startswith(("encoder:", "index:"))]
    backend = settings.get("backend", evaluate.get("backend"))
    sets = {**(evaluate.get("sets") or {}), **(settings.get("sets") or {})}
    for bench in [] if settings.get("bench_root") else settings.get("benches") or evaluate.get("benches") or []:
        with suppress(ConfigError):   # the command's own check refuses it, with its reason
            names += [n for n in (bench_set(str(bench), None, sets),) if n]
    return Needs(tuple(dict.fromkeys(names)), interpreter.eval_needs(backend), who, "eval", python, None, (str(out),),
                 jobs.backend(launcher).where if backend == "vllm" else None)


def run_needs(trainer, prep) -> Needs:
    """What one resolved training run (launch.run.Prepared of `trainer`: SFT's or GRPO's) needs; an SFT run's
    `data:` section only where its dataset must be built (`dataset_needs`)."""
    cfg, sft = prep.cfg, trainer.stage == "sft"
    cuda = jobs.backend(cfg.launcher.kind).where if cfg.model.get("gpu_only") else None
    writes = [str(cache.cache_root(cfg))] if sft and cfg.data.cache_root and not cfg.data.dir else []   # (runs_root's: the run dir's)
    names, hubs = dataset_needs(cfg, prep.data_arm, prep.run_dir) if sft else ([], [])
    names = names_in({k: v for k, v in OmegaConf.to_container(cfg).items() if k != "data" or not sft}) + names
    return Needs(tuple(dict.fromkeys(names)), trainer.needs(cfg), f"run {prep.run_dir}", trainer.stage,
                 interpreter.named(cfg.get("python"), trainer.stage), None if sft else cfg.grpo.get("trl"),
                 (str(prep.run_dir), *writes), cuda, tuple(hubs), (str(cfg.data.dir),) if sft and cfg.data.dir else ())


def analyze_needs(cfg) -> Needs:
    """What an analysis (analyze's merged config) needs: `eval_needs` of its evaluations, with python.eval=."""
    if cfg.power.get("pilot"):   # the design-power answer: reads a pilot's results, runs no job
        return Needs(who="analyze")
    settings = {k: v for k, v in OmegaConf.to_container(cfg.eval).items() if v is not None}
    settings.update(profile=cfg.profile, benches=list(cfg.benches or []))
    return eval_needs(settings if cfg.evaluate and not cfg.get("eval_tasks") else {}, "analyze",
                      interpreter.named(cfg.python, "eval"), cfg.out, cfg.launcher)


def source_problem(key: str, spec: str) -> str | None:
    """Why hub source `spec` (of `key`) cannot be read by a launch here (None: it can, or it will be downloaded).
    Online nothing is asked; offline it must be pinned and in the local datasets cache (data_prep.hub.offline_problem)."""
    try:
        src = parse_source(spec)
    except SourceError as exc:
        return f"{key}: {exc}"
    if src.is_local:
        return None
    if src.revision is None and hub.hub_offline():
        return (f"{key}: hub dataset {src.location} cannot be pinned: {hub.offline_var()} is set and the local "
                f"hub cache ($HF_HUB_CACHE={hub.hub_cache()}) holds no commit of it: pin it as "
                f"{src.location}@<commit>, or launch once where the hub is reachable")
    var = hub.datasets_offline()
    if var and (why := hub.offline_problem(src.location, src.split)):
        return (f"{key}: hub dataset {src.location}#{src.split}: {why}, and {var} is set: unset {var} to "
                f"download it at launch, or give your copy (data.sources.{key.rpartition('.')[2]}=[FORMAT:FILE]) "
                "or a built dataset (data.dir=DIR)")
    return None


def dataset_needs(cfg, data_arm: str, run_dir: Path) -> tuple[list[str], list[tuple[str, str]]]:
    """(data names, hub sources) an SFT run's dataset step reads: none with `data.dir` or with its dataset in the
    cache (its key computed without the hub, and only when some input is missing here); else the `data:` section's
    names and each hub source of the arm's domains, pinned as its launch will pin them without the hub (the run dir's
    pins, else, offline, the local hub cache's commit). A spec that does not parse is listed as written."""
    if cfg.data.dir:
        return [], []
    pinned, sources = cache.with_run_pins(cfg, run_dir).copy(), []
    offline = hub.hub_offline()
    for domain in arms.quotas(data_arm, int(cfg.data.n)):
        with suppress(SourceError):
            pinned.data.sources[domain] = hub.pin_specs(list(pinned.data.sources.get(domain) or []), resolve=lambda i: (
                hub.cached_revision(i) if offline else None))[0]
        for spec in list(pinned.data.sources.get(domain) or []):
            with suppress(SourceError):
                if parse_source(spec).is_local:
                    continue
            sources.append((f"data.sources.{domain}", str(spec)))
    names = names_in(OmegaConf.to_container(cfg.data))
    if any(data_problem(n) for n in names) or any(source_problem(k, s) for k, s in sources):
        with suppress(Exception):   # the key loads the tokenizer (not when nothing is cached), files, data_prep: may fail here
            root = cache.cache_root(pinned)
            if root.is_dir() and any(p.is_dir() and not p.name.startswith(".") for p in root.iterdir()):
                with datafetch.no_network():
                    if (root / cache.dataset_key(pinned, data_arm)).is_dir():
                        return [], []
    return names, sources


def data_problem(name: str) -> str | None:
    """Why data name `name` cannot be had (None: cached and checked, or pinned so it will download)."""
    try:
        entry = datafetch.entry(name)
        if datafetch.cached(name) is not None or entry.pinned:
            return None
    except datafetch.DataError as exc:
        return str(exc).splitlines()[0]
    return (f"{name} is not in the data cache ($DTSFT_DATA={datafetch.data_root()}) and has no pinned source "
            f"({entry.why or 'no public commit'}): run `fetch-data {name} from=DIR` with your copy")


def python_problem(need: Needs) -> str | None:
    """Why `need`'s interpreter cannot run its job (None: it holds every module, and the pinned TRL; a named one's
    TRL line starts `python.KIND:`)."""
    python = need.python or sys.executable
    why = interpreter.check(need.kind, python, need.modules) if need.modules else None
    if why is None and need.trl not in (None, ""):
        why = interpreter.trl_problem(need.trl, interpreter.package_version(python, "trl"), python)
        if why and need.python is not None:
            why = f"python.{need.kind}: {why}"
    if why and need.python is None:   # the implicit one: say how to name another
        why += f" (python.{need.kind} not given: the interpreter running this command)"
    return why


def problems(needs: list[Needs]) -> list[str]:
    """One line per problem of `needs`, each once, in order: `<who>: <why>` (a data name or hub source is
    asked once, its line naming the first job that reads it)."""
    out, seen = [], {}
    for need in needs:
        whys = [seen.setdefault(name, data_problem(name)) for name in need.data if name not in seen]
        whys += [seen.setdefault(spec, source_problem(key, spec)) for key, spec in need.hub if spec not in seen]
        if need.kind is not None:
            whys.append(python_problem(need) or (interpreter.cuda_problem(need.python or sys.executable)
                                                 if need.cuda == "here" and gpus_visible() else None))
        for path in need.outputs:   # a writable directory, or one that can be made under the nearest that exists (at worst: /)
            full = Path(os.path.expanduser(path)).absolute()
            probe = next(p for p in (full, *full.parents) if p.exists())
            whys.append(None if probe.is_dir() and os.access(probe, os.W_OK | os.X_OK) else
                        f"{path}: {probe} is {'not writable' if probe.is_dir() else 'a file, not a directory'}")
        for path in need.datasets:   # a built dataset (data.dir) whose manifest reads
            try:
                cache.read_manifest(Path(path))
            except LaunchError as exc:
                whys.append(f"data.dir: {exc}")
        out += [f"{need.who}: {why}" for why in whys if why]
    return list(dict.fromkeys(out))


def gate(needs: list[Needs], dry_run: bool, counted: bool = False) -> list[str]:
    """The preflight of a command's jobs: what it leaves unchecked (stdout), its problems (stderr, one line each; `counted`,
    a study's: then their count, and it stops itself). A real run with problems stops here (exit 2, nothing written); a
    dry run gets them back, shows its plan, then `after_plan` stops it. The jobs themselves ask nothing more."""
    where = {n.cuda for n in needs if n.cuda}
    if "nodes" in where:
        print("preflight: CUDA unchecked for the jobs that run on Slurm's nodes (checked by each job where it runs)", flush=True)
    if "here" in where and not gpus_visible():
        print("preflight: CUDA unchecked: no GPU is visible on this machine (a job that needs one refuses at its start)",
              flush=True)
    found = problems(needs)
    for line in found:
        print(f"error: preflight: {line}", file=sys.stderr, flush=True)
    if found and counted:
        print(f"preflight: {len(found)} problem(s); " + ("the dry run showed its plan and exits 2" if dry_run
              else "nothing was started, submitted or written (exit 2)"), file=sys.stderr, flush=True)
    elif found and not dry_run:
        raise LaunchError(f"the preflight found {len(found)} problem(s) (above): nothing was started, submitted or written")
    return found


def after_plan(found: list[str]) -> None:
    if found:
        raise LaunchError(f"the preflight found {len(found)} problem(s) (above): the dry run showed its plan; exit 2")
