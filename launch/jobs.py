"""Jobs: every unit of work is a module run on one resolved config file, `python -m MODULE CONFIG` (docs/concepts.md,
"Jobs"). A plan is an ordered list of Jobs; a `Runner` (a launcher backend, `BACKENDS`) runs it, or (`dry_run`) writes it."""
from __future__ import annotations

import json
import os
import pkgutil
import re
import sys
import tempfile
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Mapping

from common.cli import did_you_mean
from common.fields import IDENTITY, Field, plain
from common.interpreter import gpus_visible
from launch.errors import LaunchError

REPO = Path(__file__).resolve().parents[1]   # the checkout: what a training job runs from

# The cluster settings that are one #SBATCH option each (their own keys; `launcher.sbatch` may not repeat them).
CLUSTER_OPTIONS = ("partition", "time", "account", "qos")


@dataclass(frozen=True)
class Cluster:
    """The cluster settings every submitted job carries (`launcher.<key>`, analyze's `slurm.<key>`); null / empty: the cluster's defaults."""
    partition: str | None = None
    time: str | None = None
    account: str | None = None
    qos: str | None = None
    sbatch: tuple[str, ...] = ()
    setup: str | None = None
    backend: Mapping[str, Any] = field(default_factory=dict)   # the backend's own settings by name (Runner.keys: launcher.<name>)

    @classmethod
    def of(cls, section, keys: Iterable[str] = ()) -> "Cluster":
        """From a config section holding the keys (`cfg.launcher`, analyze's `cfg.slurm`; absent = unset) and a backend's `keys`."""
        get = section.get
        return cls(**{k: None if get(k) in (None, "") else str(get(k)) for k in CLUSTER_OPTIONS},
                   sbatch=tuple(get("sbatch") or ()),
                   setup=setup if isinstance(setup := get("setup"), str) or setup is None else "\n".join(setup),   # a list: its lines
                   backend={(n := k.removeprefix("launcher.")): plain(get(n)) for k in keys})

    def tokens(self, prefix: str) -> list[str]:
        """`PREFIX<key>=value` for each setting made, each value quoted (JSON, which YAML reads: options, paths and
        setup's lines arrive verbatim): what hands them to another command (analyze's `slurm.`)."""
        return [f"{prefix}{k}={json.dumps(v, separators=(',', ':'))}" for k in CLUSTER_KEYS if (v := getattr(self, k)) not in (None, ())]


CLUSTER_KEYS = tuple(f.name for f in fields(Cluster) if f.name != "backend")


@dataclass(frozen=True)
class Resources:
    nodes: int = 1
    gpus_per_node: int = 0
    signal: str | None = None       # the --signal warning before the time limit (B:USR1@120: to an evaluation task's batch shell)
    at_once: int | None = None      # an array: tasks running at once (null: no cap)


@dataclass(frozen=True)
class Needs:
    """What a job reads before it starts (the plan table's column: data artefacts, modules its interpreter must
    import) and, where it names `who`, what the preflight (launch/preflight.py) checks of it."""
    data: tuple[str, ...] = ()                 # paths, cache ids or data names it reads
    modules: Mapping[str, str] | tuple[str, ...] = ()   # what its interpreter must import (module -> what needs it)
    who: str = ""                              # the job or stage, as the preflight's lines name it ("": not checked)
    kind: str | None = None                    # its interpreter's kind (sft | grpo | eval); None: none checked
    python: str | None = None                  # that interpreter (None: the one running the command)
    trl: str | None = None                     # a pinned TRL release (grpo.trl)
    outputs: tuple[str, ...] = ()              # directories it writes
    cuda: str | None = None                    # where it needs CUDA: "here" | "nodes" (the backend's) | None
    hub: tuple[tuple[str, str], ...] = ()      # (data.sources key, spec) of the hub sources it reads
    datasets: tuple[str, ...] = ()             # built datasets it reads (an SFT run's data.dir): each a data_prep dir
    each: tuple["Needs", ...] = ()             # a training job's: each run's, checked (each line names its run)


@dataclass(frozen=True)
class Job:
    name: str                        # unique in its plan: its script, log and dependency name
    module: str                      # run as `python -m MODULE CONFIG`
    config: str | None = None        # its one resolved config file
    array: tuple[str, ...] = ()      # or: an array, one config file per task
    python: str = sys.executable     # python.sft / python.grpo / python.eval; the launching one by default
    torchrun: int | None = None      # training: under torchrun, this many processes on each of its nodes
    resources: Resources = Resources()
    cluster: Cluster | None = None   # partition, account, qos, time, sbatch, setup (null: the cluster's defaults)
    needs: Needs = Needs()
    after: tuple[str, ...] = ()      # names of earlier jobs of the plan it runs after
    after_any: bool = False          # after them however they ended (an aggregation: a failed one is a gap)
    after_task: int | None = None    # after that task only of the array job in `after` (a run's evaluation: its training)
    waits: str | None = None         # a dependency outside the plan, in sbatch's syntax (e.g. afterok:4242_0)
    notes: tuple[str, ...] = field(default=(), compare=False)   # what each task does, one line per task
    title: str | None = None         # the name the cluster shows (null: dtsft-<name>); a training run: its logging name
    logs: str | None = None          # where its logs go (training: <run dir>/logs, teed there locally); null: the plan's dir

    def __post_init__(self):
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", self.name):
            raise ValueError(f"job name {self.name!r}: letters, digits, '_', '.', '-' only")
        if (self.config is None) == (not self.array):
            raise ValueError(f"job {self.name}: give one config file or an array of them, not both or neither")

    @property
    def configs(self) -> tuple[str, ...]:
        return self.array or (str(self.config),)

    def command(self, config: str) -> list[str]:
        """The command line of one task: `PYTHON -m MODULE CONFIG`, a training job's under torchrun on this node alone."""
        if self.torchrun is None:
            return [self.python, "-m", self.module, str(config)]
        if self.resources.nodes != 1:
            raise LaunchError(f"job {self.name}: torchrun over {self.resources.nodes} nodes needs a multi-node runner")
        return [self.python, "-m", "launch.torchrun", "--standalone", "--nnodes=1", f"--nproc_per_node={self.torchrun}", "-m",
                self.module, str(config)]


class JobFailed(Exception):
    """A job that ran and failed: the plan stops, with its exit status."""

    def __init__(self, job: str, status: int):
        super().__init__(f"job {job} failed with exit status {status}")
        self.job, self.status = job, status


def cuda_device_count() -> int:
    """The CUDA devices this machine's torch sees (0 without torch or CUDA); torch is imported only where a GPU may be."""
    if not gpus_visible():
        return 0
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


class Runner(ABC):
    """A launcher backend: how a plan's jobs run, and what `launcher.kind` means to the commands that plan them (they
    ask it, never its name); one file, found by being there (`BACKENDS`). `script(job, ids, where)`: the text the job
    runs (dependencies from `ids`, each started job's id by name; logs under `where`); it writes nothing. `start(job,
    script, ids)`: start or submit it; its id. A job run here that fails raises JobFailed; a failed submission,
    LaunchError. `Backend(command, env=, stops=)`: the command that planned the jobs (what its scripts say wrote them),
    the jobs' environment (None: this one); a backend running jobs here names each signal it forwards in `stops` and
    keeps each job's log file in `logs`. A non-training job runs in the directory the backend was made in (`workdir`);
    training runs from the checkout, REPO."""
    suffix = ".sh"
    submits = False    # `start` submits a job that runs later, elsewhere, with the cluster settings (else: runs it to its end)
    where = "nodes"    # "here": this machine's GPUs (1 node, 1 process without CUDA); "nodes": launcher.nodes x launcher.gpus_per_node
    requeues = False   # a stopped job is requeued and resumes by itself (resume=never refused)
    keys: dict[str, Field] = {}   # its own settings: `launcher.<name>` Fields outside run identity (with_backend_keys), carried by its jobs

    def __init__(self, command: str = "launch", env: dict[str, str] | None = None, stops: list[str] | None = None):
        self.command, self.workdir, self.env, self.stops, self.logs = command, os.getcwd(), env, stops, {}

    @classmethod
    def cluster(cls, launcher) -> Cluster | None:
        """The cluster settings its jobs carry: a submitting backend's, with its own `keys`' values (None: none)."""
        return Cluster.of(launcher, cls.keys) if cls.submits or cls.keys else None

    @staticmethod
    def check_not_queued(run_dir: Path) -> None:
        """Refuse a run still queued or running."""

    def task_command(self, job: Job, config: str) -> list[str]:
        """What one task runs on its first node, as a launch records it."""
        return job.command(config)

    @abstractmethod
    def script(self, job: Job, ids: Mapping[str, str], where: Path) -> str: ...

    @abstractmethod
    def start(self, job: Job, script: Path, ids: Mapping[str, str]) -> str: ...

    def run(self, plan: list[Job], where: Path, dry_run: bool = False, start=None) -> dict[str, str]:
        """Each job's script written to `where/<name><suffix>` and started (by `start`, default: `self.start`), in order;
        each job's id by name. `dry_run`: only the scripts (ids `<job id of NAME>`), then the plan on one screen; nothing
        is started."""
        seen: set[str] = set()
        for job in plan:   # each name once, each `after` an earlier job of the plan
            if job.name in seen:
                raise LaunchError(f"plan: two jobs are named {job.name}")
            if unknown := [a for a in job.after if a not in seen]:
                raise LaunchError(f"plan: job {job.name} runs after {unknown}, which is no earlier job of the plan")
            seen.add(job.name)
        where.mkdir(parents=True, exist_ok=True)
        ids = {job.name: f"<job id of {job.name}>" for job in plan} if dry_run else {}
        for job in plan:
            path = where / f"{job.name}{self.suffix}"
            path.write_text(self.script(job, ids, where), encoding="utf-8")
            if not dry_run:
                ids[job.name] = (start or self.start)(job, path, ids)
        if dry_run:
            print(f"# the plan: {len(plan)} job(s), in order\n{table(plan)}")
            print(f"[dry run] every job's config and script is written under {where} (nothing started: dry_run=true)", flush=True)
        return ids


# The launcher backends by name (`launcher.kind`, analyze's `launcher`): "module:Runner class", imported when asked for;
# each file launch/<kind>.py defining `class <Kind>Runner(` (its text read: listing them imports none).
BACKENDS = {p.stem: f"launch.{p.stem}:{p.stem.capitalize()}Runner" for p in sorted(Path(__file__).parent.glob("*.py"))
            if re.search(rf"^class {p.stem.capitalize()}Runner\(", p.read_text(encoding="utf-8"), re.M)}


def backend(kind: str, key: str = "launcher") -> type[Runner]:
    """The Runner class of launcher `kind` (LaunchError naming `key` as typed and the backends, with a "did you mean")."""
    if kind not in BACKENDS:
        raise LaunchError(f"{key}={kind!r}: expected one of {', '.join(BACKENDS)}.{did_you_mean(str(kind), list(BACKENDS))}")
    return pkgutil.resolve_name(BACKENDS[kind])


def with_backend_keys(table: dict) -> dict:
    """`table` (a command's keys; {}: none) with every backend's own fields (Runner.keys) after its last `launcher.` key,
    each a `launcher.<name>` key outside run identity (which the trainers compute from config.yaml without launch/)."""
    own = {k: f for kind in BACKENDS for k, f in backend(kind).keys.items() if k not in table}
    if bad := [k for k, f in own.items() if not k.startswith("launcher.") or IDENTITY in f.roles]:
        raise LaunchError(f"{bad[0]}: a launcher backend's own key (Runner.keys) must be a launcher.<name> key outside run identity")
    at, items = max((i for i, k in enumerate(table) if k.startswith("launcher.")), default=-1) + 1, list(table.items())
    return dict(items[:at] + list(own.items()) + items[at:])


def project_env(**more: str) -> dict[str, str]:
    """This environment with `more` and the checkout first on PYTHONPATH: what a job run from elsewhere imports."""
    return dict(os.environ, **more, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))


def watch(ids: Iterable[str]) -> str:
    """How to follow submitted jobs `ids`: the squeue line, and sacct's for when they are done."""
    return "watch: squeue -j {0}   (when done: sacct -j {0})".format(",".join(ids))


def dry_run_dir(kind: str) -> Path:
    """A new directory for a dry run's configs and scripts, in the system's temporary directory (never the checkout)."""
    return Path(tempfile.mkdtemp(prefix=f"dtsft-dry-run-{kind}-"))


def table(plan: list[Job]) -> str:
    """The plan on one screen: job, module, after, interpreter, resources, needs."""
    rows = [("job", "module", "after", "interpreter", "resources", "needs")]
    for job in plan:
        after = ",".join(f"{a}[{job.after_task}]" if job.after_task is not None else a for a in job.after) or "-"
        after = f"{'any' if job.after_any else 'ok'}:{after}" if job.after else after
        after += f" + {job.waits}" if job.waits else ""
        needs = ", ".join([*job.needs.data, *(f"import {m}" for m in job.needs.modules)]) or "-"
        r = job.resources
        made = [f"{len(job.array)} tasks" + (f" ({r.at_once} at once)" if r.at_once else "")] if job.array else []
        made.append(f"{r.nodes} node(s) x {r.gpus_per_node} GPU(s)" if r.gpus_per_node else f"{r.nodes} node(s), no GPU")
        made += [f"torchrun {r.nodes}x{job.torchrun}"] if job.torchrun is not None else []
        made += [f"time {job.cluster.time}"] if job.cluster is not None and job.cluster.time else []
        rows.append((job.name, job.module, after, job.python, ", ".join(made), needs))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows)
