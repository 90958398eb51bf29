"""The preflight: before a command's first job, everything any of its jobs will need, checked at once.

Its input is the plan's `Needs` (launch.jobs, `of(plan)`), filled where each Job is built from the configs the
command resolved once: a training Job's, each run's (`run_needs`, asked once per run); an analysis' (`analyze_needs`:
an analyze command, a sweep's evaluation, a study's analyze stage); a study's evaluate and export stages' (launch/study.py).
Each names the data artefacts it reads, the interpreter it runs with the modules it imports, whether it needs CUDA,
and the directories it writes. `problems` answers one line per thing missing, never touching the network and
creating nothing:

- a data name (common/datafetch.py) is fine when it is in the cache (its digest checked, `datafetch.cached`)
  or pinned (it will be downloaded on first use; whether the source is reachable is not checked); anything
  else (an unpinned entry not pre-filled, a cached file that changed) is a line saying which `fetch-data` to run;
- an SFT run's dataset (`dataset_needs`): none of its inputs is needed when it has one (`data.dir`, or the
  dataset cache holds the arm's dataset under the key the run will ask for: a resumed run's). Otherwise the
  build reads each hub source of the arm's domains (`data.sources.<domain>`, `FORMAT:ID[@REV][#split]`) and the
  decontamination sets (`data.decontam_sets`, data names as above). A hub source is fine online (pinned at the
  run's first launch, downloaded by datasets; never asked here); offline (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE)
  it needs what data_prep/hub.py finds in the local caches: a pin (given, the run's config.yaml's, or the local
  hub cache's main branch) and a copy datasets loads offline; else one line naming the source and what to set;
- an interpreter (named or the one running the command) must answer common/interpreter.py's probe with every
  module its job needs (`check`) and, for a pinned TRL (`grpo.trl`), hold that release;
- CUDA, for a job that needs it here, is asked of its interpreter only where a GPU is visible (an NVIDIA device
  node, not hidden by CUDA_VISIBLE_DEVICES); otherwise, and for jobs that run on Slurm's nodes, one line says it
  was not checked (`notes`): never a reason to refuse;
- an output directory must be writable where it exists, or creatable under its nearest existing parent (a run
  dir holding another run's identity is refused earlier, when the run is resolved: launch.run.check_identity).

A command with problems exits 2 before it writes anything (`gate`); a dry run shows its whole plan first, then
exits 2 (`Refused`).
"""
from __future__ import annotations

import functools
import glob
import os
import subprocess
import sys
from pathlib import Path

from common import datafetch, interpreter
from common.cli import ConfigError
from launch import jobs
from launch.errors import LaunchError
from launch.jobs import Needs

EXIT = 2


class Refused(LaunchError):
    """The preflight's problems were printed (one line each): the command exits 2 (after a dry run's plan)."""

    def __init__(self, count: int, dry_run: bool):
        super().__init__(f"the preflight found {count} problem(s) (above): " + (
            "the dry run showed its plan; exit 2" if dry_run else "nothing was started, submitted or written"))


def of(plan: list[jobs.Job]) -> list[Needs]:
    """What the preflight checks of a plan, in order: each job's needs that name `who` (a training job's: each run's)."""
    return [n for job in plan for n in job.needs.each or (job.needs,) if n.who]


def names_in(value) -> list[str]:
    """The data names (common.datafetch) anywhere in a setting's value (a string, list or mapping)."""
    if isinstance(value, dict):
        return [n for v in value.values() for n in names_in(v)]
    if isinstance(value, (list, tuple)):
        return [n for v in value for n in names_in(v)]
    return [value] if datafetch.is_name(value) else []


def eval_data(settings: dict, prefix: str) -> tuple[list[str], str | None]:
    """(data names, backend) an analyze (prefix `eval.`) or evaluate (prefix ``) command's evaluations read:
    its profile's, then its own settings'; each bench's item set as evals.benches resolves it."""
    from evals.benches import bench_set
    from evals.profiles import load_profile

    profile = settings.get("profile") or None
    evaluate = load_profile(str(profile))["evaluate"] if profile else {}
    sets_keys = ("sets", f"{prefix}sets")   # an item set counts only for a bench evaluated (below)
    names = names_in({k: v for k, v in evaluate.items() if k != "sets"}) \
        + names_in({k: v for k, v in settings.items() if k not in sets_keys})
    if settings.get(f"{prefix}retriever", evaluate.get("retriever")) != "e5":   # no dense retrieval: no encoder, no index
        names = [n for n in names if not n.startswith(("encoder:", "index:"))]
    backend = settings.get(f"{prefix}backend", evaluate.get("backend"))
    if settings.get("bench_root") or settings.get(f"{prefix}bench_root"):
        return names, backend
    sets = {**(evaluate.get("sets") or {}), **(settings.get(f"{prefix}sets") or settings.get("sets") or {})}
    for bench in settings.get("benches") or evaluate.get("benches") or []:
        try:
            names += [n for n in (bench_set(str(bench), None, sets),) if n]
        except ConfigError:   # the command's own check refuses it, with its reason
            pass
    return names, backend


def run_needs(trainer, prep) -> Needs:
    """What one resolved training run (launch.run.Prepared of `trainer`: SFT's or GRPO's) needs: the data names
    its config reads (an SFT run's `data:` section only where its dataset must be built: `dataset_needs`) and
    the hub sources it reads, its interpreter (python.<stage>=, else this one) with the trainer's modules and a
    pinned TRL, CUDA for a GPU-only model, and its run dir."""
    from omegaconf import OmegaConf

    cfg = prep.cfg
    cuda = jobs.backend(cfg.launcher.kind).where if cfg.model.get("gpu_only") else None
    settings = OmegaConf.to_container(cfg)
    if trainer.stage == "sft":
        names, hub = dataset_needs(cfg, prep.composed.data_arm, prep.run_dir)
        names = names_in({k: v for k, v in settings.items() if k != "data"}) + names
    else:
        names, hub = names_in(settings), []
    return Needs(tuple(dict.fromkeys(names)), trainer.needs(cfg), f"run {prep.run_dir}", trainer.stage,
                 interpreter.named(cfg.get("python"), trainer.stage), cfg.grpo.get("trl") if trainer.stage == "grpo"
                 else None, (str(prep.run_dir),), cuda, tuple(hub))


def analyze_needs(cfg) -> Needs:
    """What an analysis (analyze's merged config) needs: its evaluations' data (profile, eval.* settings, the
    benches' item sets), python.eval= (else this one) with vllm for backend=vllm, CUDA for vLLM, its out dir."""
    from omegaconf import OmegaConf

    if cfg.power.get("pilot"):   # the design-power answer: reads a pilot's results, runs no job
        return Needs(who="analyze")
    settings = {f"eval.{k}": v for k, v in OmegaConf.to_container(cfg.eval).items() if v is not None}
    settings.update(profile=cfg.profile, benches=list(cfg.benches or []))
    names, backend = eval_data(settings, "eval.") if cfg.evaluate and not cfg.get("eval_tasks") else ([], None)
    cuda = jobs.backend(cfg.launcher).where if backend == "vllm" else None
    return Needs(tuple(dict.fromkeys(names)), interpreter.eval_needs(backend), "analyze", "eval",
                 interpreter.named(cfg.python, "eval"), None, (str(cfg.out),), cuda)


def launch_pins(cfg, data_arm: str, run_dir: Path | None = None):
    """A copy of SFT config `cfg` with the hub sources of its arm's domains pinned as its launch will pin them
    without the hub (launch.cache.pin_hub_sources): the run dir's config.yaml's pins (launch.cache.with_run_pins),
    else, offline, the commit the local hub cache holds; online an unpinned one stays so (the hub pins it at
    launch). A domain whose specs do not parse is left as written (source_problem says why)."""
    from data_prep import arms, hub
    from data_prep.readers import SourceError
    from launch.cache import with_run_pins

    out = (with_run_pins(cfg, run_dir) if run_dir is not None else cfg).copy()
    offline = hub.hub_offline()
    for domain in arms.quotas(data_arm, int(cfg.data.n)):
        try:
            out.data.sources[domain] = hub.pin_specs(list(out.data.sources.get(domain) or []), resolve=lambda i: (
                hub.cached_revision(i) if offline else None))[0]
        except SourceError:
            pass
    return out


def hub_sources(cfg, data_arm: str) -> list[tuple[str, str]]:
    """(key, spec) of each source of `cfg`'s arm's domains that is no local file (a spec that does not parse
    included: source_problem says why)."""
    from data_prep import arms
    from data_prep.readers import SourceError, parse_source

    out = []
    for domain in arms.quotas(data_arm, int(cfg.data.n)):
        for spec in list(cfg.data.sources.get(domain) or []):
            try:
                if parse_source(spec).is_local:
                    continue
            except SourceError:
                pass
            out.append((f"data.sources.{domain}", str(spec)))
    return out


def source_problem(key: str, spec: str) -> str | None:
    """Why hub source `spec` (given for `key`, pinned as `launch_pins` pins it) cannot be read by a launch
    here (None: it can, or it will be downloaded). Online nothing is asked; offline it must be pinned and in
    the local datasets cache (data_prep.hub.offline_problem)."""
    from data_prep import hub
    from data_prep.readers import SourceError, parse_source

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


def dataset_needs(cfg, data_arm: str, run_dir: Path | None = None) -> tuple[list[str], list[tuple[str, str]]]:
    """(data names, hub sources) an SFT run's dataset step reads: none with `data.dir` or with its dataset in
    the cache (launch.cache: the arm's key as the launch will ask for it, computed without the hub, and only
    when some input is missing here); else the `data:` section's names (the decontamination sets) and the hub
    sources of the arm's domains, pinned as the launch will pin them (`launch_pins`)."""
    from omegaconf import OmegaConf

    if cfg.data.dir:
        return [], []
    pinned = launch_pins(cfg, data_arm, run_dir)
    names, sources = names_in(OmegaConf.to_container(cfg.data)), hub_sources(pinned, data_arm)
    if any(data_problem(n) for n in names) or any(source_problem(k, s) for k, s in sources):
        if dataset_cached(pinned, data_arm):
            return [], []
    return names, sources


def dataset_cached(cfg, data_arm: str) -> bool:
    """Whether the dataset cache holds the arm's dataset under the key `cfg` (pinned: `launch_pins`) asks for;
    False when that key cannot be computed here (a tokenizer not in the local cache, a source that does not
    parse: the launch could not compute it either)."""
    from launch import cache

    try:
        root = cache.cache_root(cfg)
        if not root.is_dir() or not any(p.is_dir() and not p.name.startswith(".") for p in root.iterdir()):
            return False   # no dataset at all: no key to compute (it loads the tokenizer)
        with datafetch.no_network():
            return (root / cache.dataset_key(cfg, data_arm)).is_dir()
    except Exception:  # noqa: BLE001 - the key needs a tokenizer, files or data_prep's code not available here
        return False


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
    """Why `need`'s interpreter cannot run its job (None: it holds every module, and the pinned TRL)."""
    python = need.python or sys.executable
    shown = need.python is None
    why = interpreter.check(need.kind, python, need.modules) if need.modules else None
    if why is None and need.trl not in (None, ""):
        from rl.config import trl_problem

        why = trl_problem(need.trl, interpreter.package_version(python, "trl"), python)
    if why and shown:   # the implicit one: say how to name another
        why += f" (python.{need.kind} not given: the interpreter running this command)"
    return why


def gpus_visible() -> bool:
    """Whether this machine shows an NVIDIA GPU to its processes (a device node, not hidden by
    CUDA_VISIBLE_DEVICES): only then is an interpreter asked whether its torch sees CUDA."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", "unset").strip() in ("", "-1"):
        return False
    return bool(glob.glob("/dev/nvidia[0-9]*"))


@functools.lru_cache(maxsize=None)
def cuda_problem(python: str) -> str | None:
    """Why `python`'s torch cannot use a GPU here (None: torch.cuda.is_available() is true in it)."""
    ask = "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)"
    try:
        proc = subprocess.run([python, "-c", ask], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{python} could not be asked for CUDA ({exc.__class__.__name__})"
    if proc.returncode == 3:
        return f"{python}: torch sees no CUDA GPU although this machine shows one (a CPU-only torch?)"
    if proc.returncode:
        return f"{python} could not be asked for CUDA (exit {proc.returncode}: " \
               f"{(proc.stderr.strip().splitlines() or ['no output'])[-1]})"
    return None


def notes(needs: list[Needs]) -> list[str]:
    """The lines saying what was not checked: CUDA of jobs that run elsewhere, or here without a visible GPU."""
    where = {n.cuda for n in needs if n.cuda}
    out = []
    if "nodes" in where:
        out.append("CUDA unchecked for the jobs that run on Slurm's nodes (checked by each job where it runs)")
    if "here" in where and not gpus_visible():
        out.append("CUDA unchecked: no GPU is visible on this machine (a job that needs one refuses at its start)")
    return out


def output_problem(path: str) -> str | None:
    """Why directory `path` cannot be written (None: it is a writable dir, or can be made under one)."""
    p = Path(os.path.expanduser(path)).absolute()
    probe = p
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        return f"{path}: {probe} is a file, not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{path}: {probe} is not writable"
    return None


def problems(needs: list[Needs]) -> list[str]:
    """One line per problem of `needs`, each once, in order: `<who>: <why>`."""
    out: list[str] = []
    seen_data: dict[str, str | None] = {}
    for need in needs:
        for name in need.data:
            if name not in seen_data:
                seen_data[name] = data_problem(name)
                if seen_data[name]:
                    out.append(f"{need.who}: {seen_data[name]}")
        for key, spec in need.hub:
            if spec not in seen_data:
                seen_data[spec] = source_problem(key, spec)
                if seen_data[spec]:
                    out.append(f"{need.who}: {seen_data[spec]}")
        if need.kind is not None and (why := python_problem(need)):
            out.append(f"{need.who}: {why}")
        elif need.cuda == "here" and need.kind is not None and gpus_visible() and \
                (why := cuda_problem(need.python or sys.executable)):
            out.append(f"{need.who}: {why}")
        for path in need.outputs:
            if why := output_problem(path):
                out.append(f"{need.who}: {why}")
    return list(dict.fromkeys(out))


def gate(needs: list[Needs], dry_run: bool, counted: bool = False) -> list[str]:
    """The preflight of a command's jobs: its notes (stdout) and problems (stderr, one line each; `counted`, a
    study's: then their count, and it stops itself); a real run with problems stops here (Refused: exit 2, nothing
    written). Returns the problems: a dry run shows its plan, then `after_plan` stops it. (A study's or a sweep's
    jobs are checked once, by the command that plans them: the jobs themselves, run on their resolved configs,
    ask nothing more.)"""
    for line in notes(needs):
        print(f"preflight: {line}", flush=True)
    found = problems(needs)
    for line in found:
        print(f"error: preflight: {line}", file=sys.stderr, flush=True)
    if found and counted:
        print(f"preflight: {len(found)} problem(s); " + ("the dry run showed its plan and exits 2" if dry_run
              else "nothing was started, submitted or written (exit 2)"), file=sys.stderr, flush=True)
    elif found and not dry_run:
        raise Refused(len(found), dry_run)
    return found


def after_plan(found: list[str]) -> None:
    """A dry run whose preflight found problems exits 2 once its plan is shown."""
    if found:
        raise Refused(len(found), True)
