"""One run of a trainer: compose -> (finished? stop) -> hardware check -> data -> run dir -> train or submit.

`launch_one(trainer, argv)` is that path for every `Trainer` (SFT's here, GRPO's in launch.grpo; the table
of them, by `stage=`, in launch.cli): its methods say how a request is composed and resolved (its run
identity), what it prints, what it refuses before any work (preflight), what it prepares under the
run-dir lock and which module torchrun runs.

The order matters: everything that can fail cheaply (bad keys and values, a GPU-only model on a
CPU machine, a request whose run identity differs from the run dir's, a run dir in use) fails
before data prep, and data prep finishes before the run directory's config.yaml is written, so
config.yaml always names a complete dataset. The data half of the identity (the dataset's content
fingerprint) is compared once the dataset is known.
"""
from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import time
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from omegaconf import DictConfig, OmegaConf

from common import datafetch, fingerprint, interpreter, layout, lock
from common.io import check_output_dir, replace_aside
from common.layout import LAUNCH_LOCK, TRAIN_LOCK
from common.schema import TRAINER_SEMANTICS
from launch import cache, jobs, local, manifest, paths, preflight
from launch.compose import Composed, compose, planned_saves, planned_steps, run_dir
from launch.errors import LaunchError
from launch.jobs import Job, JobFailed, Needs, Resources, Torchrun, backend, dry_run_dir
from launch.refusal import trainer_refusal
from rl.config import EXCLUDED_KEYS   # both trainers' (a run dir's config.yaml is either's)
from sft import config as sft_config

REPO = jobs.REPO   # the checkout


@dataclass
class Prepared:
    """A run resolved up to (not including) training: its final config and where it lives."""

    composed: Composed
    run_dir: Path
    nproc: int
    data: cache.CachedData | None = None
    identity: dict | None = None          # the run identity, complete once the data is known
    needs: Needs | None = None            # what the preflight checks of it: asked once, by its first Job

    @property
    def cfg(self) -> DictConfig:
        return self.composed.cfg


class Trainer(ABC):
    """One kind of training job of launch's table (`SFTTrainer` here, `GRPOTrainer` in launch.grpo; by `stage=`
    in launch.cli): how `launch_one` resolves, shows, checks, prepares and starts it. A subclass names its
    `stage` and `module` (what torchrun runs: `python -m <module> <run_dir>/config.yaml`, in the interpreter
    `python.<stage>=` names, common.interpreter: its Job is `job`) and implements the abstract methods."""

    stage: str
    module: str

    @abstractmethod
    def resolve(self, argv: list[str]) -> Prepared:
        """Compose, refuse another run identity, check the hardware, fill the derived values: everything
        cheap, before any lock or work."""

    @abstractmethod
    def describe(self, prep: Prepared) -> str:
        """The plan's lines (a dry run prints them under its table of Jobs)."""

    @abstractmethod
    def prepare(self, prep: Prepared, **cache_kw) -> dict:
        """Under the run-dir lock: the run's inputs and config.yaml; the manifest's `data` record."""

    @abstractmethod
    def needs(self, cfg: DictConfig) -> dict[str, str]:
        """{module: why}: what this trainer's interpreter must import (asked before anything starts)."""

    def preflight(self, prep: Prepared) -> int | None:
        """What the trainer would refuse at start: an exit code stops the launch (None: nothing to refuse)."""
        return None

    def check_finished(self, prep: Prepared, **cache_kw) -> None:
        """A finished run's input half of the identity (refused with a LaunchError when it differs)."""
        return None

    def command_argv(self, argv: list[str]) -> list[str]:
        """The launch command's argv as recorded (manifest, sbatch): `stage=` first unless the default (sft)."""
        return list(argv) if self.stage == "sft" else [f"stage={self.stage}", *argv]

    def python(self, prep: Prepared) -> str:
        """The interpreter this trainer's jobs run (`python.<stage>=`, else the one running launch)."""
        return interpreter.interpreter(prep.cfg.get("python"), self.stage)

    def job(self, preps: list[Prepared], array: bool = False, logs: str | None = None, kind: str | None = None) -> Job:
        """The training Job `launch` of one run, or `sweep`, an array over several (`logs` its log dir): `module`
        under torchrun over the nodes x processes the launcher backend (`kind`, default: `launcher.kind`) gives it
        on each run's config.yaml, in its interpreter, needing its data (`data.dir`; GRPO: the starting model) and
        the modules that interpreter must import (each run's as the preflight checks them: launch.preflight.run_needs,
        asked once per run); whole nodes with the USR1 warning where the backend has nodes."""
        cfg = preps[0].cfg
        runner = backend(kind or cfg.launcher.kind)
        nodes, gpus = runner.nodes(cfg.launcher), runner.gpus(cfg.launcher, preps[0].nproc)
        configs = tuple(str(p.run_dir / layout.CONFIG) for p in preps)
        data = [str(p.cfg.model.path if self.stage == "grpo" else p.cfg.data.dir or "dataset: built at launch")
                for p in preps]
        for p in preps:
            p.needs = p.needs or preflight.run_needs(self, p)
        return Job("sweep" if array else "launch", self.module, config=None if array else configs[0],
                   array=configs if array else (), python=self.python(preps[0]), wrapper=Torchrun(nodes, preps[0].nproc),
                   cluster=runner.cluster(cfg.launcher),
                   resources=Resources(nodes=nodes, gpus_per_node=gpus, exclusive=True, signal=True),
                   needs=Needs(tuple(dict.fromkeys(data)), self.needs(cfg), each=tuple(p.needs for p in preps)),
                   title="dtsft-sweep" if array else f"dtsft-{cfg.logging.name}",
                   logs=logs or str(preps[0].run_dir / "logs"))

    def check_python(self, prep: Prepared) -> None:
        """Refuse (LaunchError, one line) a named interpreter lacking what the run needs."""
        if interpreter.named(prep.cfg.get("python"), self.stage) is not None:
            why = interpreter.check(self.stage, self.python(prep), self.needs(prep.cfg))
            if why:
                raise LaunchError(why)
            want = prep.cfg.grpo.get("trl") if self.stage == "grpo" else None
            if want is not None:   # a pinned TRL (grpo.trl): the named interpreter must hold that release
                from rl.config import trl_problem

                why = trl_problem(want, interpreter.package_version(self.python(prep), "trl"), self.python(prep))
                if why:
                    raise LaunchError(f"python.grpo: {why}")


def is_finished(rd: Path) -> bool:
    return (rd / layout.DONE).is_file()


def has_started(rd: Path) -> bool:
    return any((rd / sub).is_dir() and any((rd / sub).iterdir()) for sub in (layout.STATES, layout.CHECKPOINTS))


def requested_identity(cfg: DictConfig, data_fingerprint: str | None = None) -> dict:
    """The run identity of `cfg` (common.fingerprint), with the trainer's semantics version and,
    once the dataset is built, its content fingerprint."""
    extra = {"trainer_semantics": TRAINER_SEMANTICS}
    if data_fingerprint is not None:
        extra["data_fingerprint"] = data_fingerprint
    return fingerprint.identity(cfg, EXCLUDED_KEYS, **extra)


def recorded_identity(rd: Path) -> dict | None:
    """The identity a run dir belongs to: `manifest.json`'s `identity`, or — for a run dir made
    before identity was recorded — one computed from its `config.yaml` (trainer semantics
    `LEGACY_TRAINER_SEMANTICS`, data fingerprint from the manifest). None for a fresh dir."""
    man_path, cfg_path = rd / "manifest.json", rd / layout.CONFIG
    try:
        man = json.loads(man_path.read_text(encoding="utf-8")) if man_path.is_file() else {}
        if isinstance(man.get("identity"), dict):
            return man["identity"]
        if not cfg_path.is_file():
            return None
        extra = {"trainer_semantics": fingerprint.LEGACY_TRAINER_SEMANTICS}
        data_fp = (man.get("data") or {}).get("fingerprint")
        if data_fp:
            extra["data_fingerprint"] = data_fp
        return fingerprint.identity(OmegaConf.load(cfg_path), EXCLUDED_KEYS, **extra)
    except Exception as exc:  # unreadable JSON / YAML: the run dir's identity is unknown, say which file
        raise LaunchError(f"{rd}: cannot read the run's identity from manifest.json / config.yaml ({exc}); "
                          "fix or move that run dir, or use name=... / run_dir=... for this run") from None


def identity_refusal(rd: Path, cfg: DictConfig, diff: list[str]) -> LaunchError:
    """The exit-2 message for a request whose fingerprint differs from the run dir's."""
    where = (f"name=<variant> trains it as a separate run in {Path(cfg.runs_root).expanduser()}/{cfg.arm}/<variant>/"
             f"seed{cfg.seed}" if not cfg.run_dir else "run_dir=<another dir> trains it as a separate run")
    why = ("; the code changed what this config means (common.schema.TRAINER_SEMANTICS)"
           if any(d.startswith("trainer_semantics:") for d in diff) else "")
    return LaunchError(
        f"{rd} holds a run of a different configuration{why}; refusing to resume or report it as this one. "
        "Differences (run dir -> requested):\n  " + "\n  ".join(diff) +
        f"\nTwo ways out: {where}, or resume=never starts over here (the old run dir is renamed to "
        f"{rd.name}.replaced-<UTC time> beside it, nothing is deleted).")


def check_identity(rd: Path, cfg: DictConfig, data_fingerprint: str | None = None, want: dict | None = None) -> dict:
    """Refuse (LaunchError) a request whose identity (`want`, default `requested_identity`) differs
    from the run dir's; return the request's."""
    want = want or requested_identity(cfg, data_fingerprint)
    have = recorded_identity(rd)
    if have is not None and cfg.resume != "never":
        diff = fingerprint.fingerprint_diff(have, want)
        if diff:
            raise identity_refusal(rd, cfg, diff)
    return want


def resolve(argv: list[str], gpus: int | None = None) -> Prepared:
    """Compose and check everything that doesn't need data; fill the derived config values."""
    composed = compose(argv)
    cfg = composed.cfg
    rd = run_dir(cfg)
    check_identity(rd, cache.with_run_pins(cfg, rd))
    nproc = local_nproc(composed, gpus)
    paths.outputs_absolute(cfg, sft_config.SFT)   # runs_root, data.cache_root: the caller's directory
    fill_derived(cfg, rd, nproc)
    return Prepared(composed=composed, run_dir=rd, nproc=nproc)


def local_nproc(composed: Composed, gpus: int | None = None) -> int:
    """Processes per node: `launcher.nproc`, or auto = what the launcher backend gives (jobs.Runner.nproc: the
    GPUs here, 1 without CUDA; a backend with nodes: `launcher.gpus_per_node`, 1 on a CPU-only node), after
    refusing a GPU-only model on a machine without CUDA for a run that would train here (a dry run only notes it)."""
    cfg = composed.cfg
    runner = backend(cfg.launcher.kind)
    if runner.where == "here" and not cfg.launcher.dry_run:
        local.check_hardware(cfg, composed.choices["model"], gpus)
    return int(cfg.launcher.nproc) if cfg.launcher.nproc != "auto" else runner.nproc(cfg.launcher, gpus)


def fill_derived(cfg: DictConfig, rd: Path, nproc: int) -> None:
    """The values launch derives into config.yaml for every trainer: the run dir, the processes per
    node and, unless set, the logging name `<arm>[-<name>]-s<seed>`."""
    cfg.run_dir = str(rd)
    cfg.launcher.nproc = nproc
    if cfg.logging.name is None:
        cfg.logging.name = f"{cfg.arm}-{cfg.name}-s{cfg.seed}" if cfg.name else f"{cfg.arm}-s{cfg.seed}"


def prepare_data(prep: Prepared, **cache_kw) -> cache.CachedData:
    cache.pin_hub_sources(prep.cfg, prep.composed.data_arm, prep.run_dir, log=cache_kw.get("log", print))
    data = cache.ensure_dataset(prep.cfg, prep.composed.data_arm, **cache_kw)
    prep.cfg.data.dir = str(data.dir)
    prep.data = data
    return data


def prepare_run(prep: Prepared, **cache_kw) -> Path:
    """Data (cached), then the data half of the identity check, then `config.yaml`; returns its path."""
    data = prepare_data(prep, **cache_kw)
    prep.identity = check_identity(prep.run_dir, prep.cfg, data.fingerprint)
    return write_config(prep)


def check_finished_data(prep: Prepared, **cache_kw) -> None:
    """The data half of the identity for a finished run: same config, but is it the same dataset?

    When the dataset's cache key is the one the run recorded, it is (cheap: no data prep). When it
    differs (a source file, the tokenizer or data_prep's code changed), the dataset is prepared
    (cached by its key) and its content fingerprint compared: a data_prep code edit that leaves the
    data identical is the same run; different data is refused like any other difference."""
    rd = prep.run_dir
    have = recorded_identity(rd)
    if not have or not have.get("data_fingerprint"):
        return   # nothing recorded to compare with
    if not prep.cfg.data.dir:   # (an explicit data.dir: prepare_data only reads its manifest)
        man_path = rd / "manifest.json"
        man = json.loads(man_path.read_text(encoding="utf-8")) if man_path.is_file() else {}
        recorded_key = (man.get("data") or {}).get("cache_key")
        if recorded_key is not None and recorded_key == cache.dataset_key(cache.with_run_pins(prep.cfg, rd),
                                                                           prep.composed.data_arm, cache_kw.get("key_fn")):
            return
        print(f"[launch] {rd} is finished; its dataset inputs changed since (cache key): checking the data content")
    prepare_data(prep, **cache_kw)
    check_identity(rd, prep.cfg, prep.data.fingerprint)


def data_record(data: cache.CachedData) -> dict:
    return {"dir": str(data.dir), "cache_key": data.key, "fingerprint": data.fingerprint, "reused": data.reused}


def write_config(prep: Prepared) -> Path:
    """Write `<run_dir>/config.yaml`; a changed config on re-launch keeps the old one beside it."""
    rd = prep.run_dir
    rd.mkdir(parents=True, exist_ok=True)
    path = rd / layout.CONFIG
    text = OmegaConf.to_yaml(prep.cfg)
    if path.is_file():
        old = path.read_text(encoding="utf-8")
        if old != text:
            kept = rd / f"config.{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.yaml"
            kept.write_text(old, encoding="utf-8")
            print(f"[launch] config changed since the last launch; previous config kept as {kept.name}:\n"
                  + "\n".join(f"  {line}" for line in _changed_keys(OmegaConf.create(old), prep.cfg)))
    tmp = path.with_name("config.yaml.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path


def _changed_keys(old: DictConfig, new: DictConfig) -> list[str]:
    from common.cli import flat_keys

    keys = sorted(set(flat_keys(old)) | set(flat_keys(new)))
    sel = lambda c, k: OmegaConf.select(c, k, default="<absent>")  # noqa: E731
    return [f"{k}: {sel(old, k)!r} -> {sel(new, k)!r}" for k in keys if sel(old, k) != sel(new, k)]


def lock_run_dir(rd: Path) -> int:
    """Take `<run_dir>/.launch.lock` for as long as this launch lives, and check (without taking
    it) that no trainer holds `<run_dir>/.train.lock`; fail naming the holder. Return the fd.

    The trainer owns its lock (sft.train): it is taken by the trainer's rank 0 itself, so it
    guards a run dir whoever started the trainer (launch, Slurm, or `python -m sft.train`).
    """
    fd = lock.acquire(rd / LAUNCH_LOCK, "another launch", "wait for it to finish or stop it, then re-run to resume")
    try:
        lock.check_free(rd / TRAIN_LOCK, "a running trainer", "wait for it to finish or stop it, then re-run to resume")
    except BaseException:
        os.close(fd)
        raise
    return fd


def start_over(rd: Path) -> Path | None:
    """resume=never: rename an existing run dir aside (`<dir>.replaced-<UTC time>`); nothing is deleted.
    Only a run dir (one holding config.yaml) is renamed: `run_dir=` pointing at any other non-empty
    directory is refused (common.io.check_output_dir's rule)."""
    if not rd.exists() or not any(p.name not in (LAUNCH_LOCK, TRAIN_LOCK) for p in rd.iterdir()):
        return None
    check_output_dir(rd, overwrite=True, marker=layout.CONFIG, what="run_dir")
    held = lock_run_dir(rd)  # never rename a run dir a launch or a trainer is using
    try:
        aside = replace_aside(rd)
    finally:
        os.close(held)
    print(f"[launch] resume=never: the previous run in {rd} was renamed to {aside}", flush=True)
    return aside


def choices_line(choices: dict) -> str:
    """The recipes a run was composed from, as the `key=value` words that choose them."""
    return " ".join(f"{k}={v}" for k, v in choices.items())


def describe(prep: Prepared) -> str:
    cfg = prep.cfg
    saves = planned_saves(cfg)
    return (f"[launch] {choices_line(prep.composed.choices)} -> {prep.run_dir}\n"
            f"[launch] {planned_steps(cfg)} optimizer steps (for n={cfg.data.n}), checkpoints at {saves}")


def launch_one(trainer: Trainer, argv: list[str], prep: Prepared | None = None, checked: bool = False,
               **cache_kw) -> int:
    """`launch [stage=...] key=value ...` for one run of `trainer`; returns the exit code (the trainer's
    for local runs). `prep`: the run as `trainer.resolve(argv)` already resolved it (a sweep resolves
    every run up front: it is composed once), else resolved here. `checked`: the caller (a sweep) ran this
    run's preflight with its others. `cache_kw` reach SFT's data step (launch.cache: a stand-in builder in tests)."""
    if prep is None:
        prep = trainer.resolve(argv)   # a request of another fingerprint than the run dir's is refused here
    cfg, rd = prep.cfg, prep.run_dir
    if is_finished(rd) and cfg.resume != "never":
        if not cfg.launcher.dry_run:
            trainer.check_finished(prep, **cache_kw)
        print(f"[launch] {rd} is finished (DONE exists); not retraining. Checkpoints: "
              f"{', '.join(d.name for _, d in layout.step_dirs(layout.checkpoints_dir(rd))) or 'none'}")
        return 0
    trainer.check_python(prep)   # a named interpreter: its one line, before anything (a dry run's too)
    found = [] if checked else preflight.gate(preflight.of([trainer.job([prep])]), bool(cfg.launcher.dry_run))
    if cfg.launcher.dry_run:
        return dry_run(trainer, [prep], argv) or preflight.after_plan(found) or 0
    print(trainer.describe(prep))
    refused = trainer.preflight(prep)
    if refused is not None:
        return refused
    if cfg.resume == "never":
        start_over(rd)
    held = lock_run_dir(rd)
    try:
        backend(cfg.launcher.kind).check_not_queued(rd)
        data = trainer.prepare(prep, **cache_kw)
        job = trainer.job([prep])
        if backend(cfg.launcher.kind).submits:
            return submit(trainer, prep, argv, job, data)
        stops: list[str] = []
        rc, log, launch_id = train_here(prep, trainer.command_argv(argv), job, data, stops)
    finally:
        os.close(held)
    return report_end(rd, rc, log, launch_id, stopped_by=stops[0] if stops else None)


def train_here(prep: Prepared, argv: list[str], job: Job, data: dict,
               stops: list[str] | None = None) -> tuple[int, Path, str]:
    """Record this launch (and the run identity) in manifest.json, then run the training Job here (LocalRunner:
    its output teed into `<run dir>/logs`, launch's signals forwarded); (exit code, log file, this launch's id:
    the trainer tags a refusal it records with it, so another process's refusal in the same run dir is never
    taken for this one's)."""
    launch_id, rd = uuid.uuid4().hex, prep.run_dir
    runner = runner_of(prep.cfg.launcher.kind, argv, env={**os.environ, layout.LAUNCH_ID_ENV: launch_id}, stops=stops)
    cmd = runner.task_command(job, str(job.config))
    launcher = {"kind": prep.cfg.launcher.kind, "nproc": prep.nproc, "command": shlex.join(cmd)}
    manifest.write_manifest(rd, argv=argv, choices=prep.composed.choices, launcher=launcher, data=data,
                            identity=prep.identity, python=interpreter.interpreters(prep.cfg.get("python")))
    print(f"[launch] {'resuming' if has_started(rd) else 'starting'}: {shlex.join(cmd)}", flush=True)
    try:
        runner.start(job, None, {})
        return 0, runner.logs[job.name], launch_id
    except JobFailed as failed:
        return failed.status, runner.logs[job.name], launch_id


_SIGNALS = {int(s) for s in signal.Signals}


def report_end(rd: Path, rc: int, log: Path, launch_id: str | None = None, stopped_by: str | None = None) -> int:
    """The closing line of a local launch; the exit code (a failed trainer's refusal recorded in
    `logs/trainer-exit.json` under `launch_id` — None: by a trainer run outside launch — is printed
    as its one line, with the trainer's code). "re-run to resume" is said only when a resumable state exists.
    A trainer that exits 0 without DONE stopped at a signal (`stopped_by`: the one launch forwarded) with its
    state saved (a STOPPED record, exit 0); without a resumable state it did not do its work: a FAILED
    record, exit 1."""
    resumable = layout.latest_complete_state(layout.states_dir(rd)) is not None
    if rc == 0 and not is_finished(rd):
        if resumable:   # (a signal sent to the trainer itself, not through launch: no `stopped_by`)
            layout.record_end(rd, layout.STOPPED, f"stopped{f' by {stopped_by}' if stopped_by else ''} with its "
                              "state saved: re-run the same command to resume", "launch (local)", launch=launch_id)
        elif trainer_refusal(rd, launch_id) is None:
            print(f"error: the trainer exited 0 without writing {layout.DONE} or a resumable state"
                  f"{f' after {stopped_by}' if stopped_by else ''} (see its log {log})", file=sys.stderr, flush=True)
            layout.record_end(rd, layout.FAILED, "the trainer exited 0 without writing DONE or a resumable state",
                              "launch (local)", launch=launch_id, code=0)
            rc = 1
    refusal = trainer_refusal(rd, launch_id) if rc != 0 else None
    if refusal is not None:
        rc = refusal[0]
        print(f"error: {refusal[1]}", file=sys.stderr, flush=True)
    if rc != 0 and refusal is None and not is_finished(rd):
        # the trainer's own FAILED record (this launch's) says more; else one here (an OOM kill, SIGKILL, ...).
        # A refusal wrote its own (none when another trainer holds the run: that one has not failed).
        rec = layout.end_record(rd)
        if not (rec and rec["state"] == "failed" and rec.get("launch") == launch_id):
            killed = (f" (killed by {signal.Signals(-rc).name}{': out of memory?' if -rc == signal.SIGKILL else ''})"
                      if rc < 0 and -rc in _SIGNALS else "")
            layout.record_end(rd, layout.FAILED, f"the training processes exited with code {rc}{killed}",
                              "launch (local)", launch=launch_id, code=rc)
    if is_finished(rd):
        state = "finished"
    elif layout.latest_complete_state(layout.states_dir(rd)) is not None:
        state = f"stopped (exit {rc}); re-run the same command to resume"
    else:
        state = f"stopped (exit {rc}) before any resumable state was written"
    print(f"[launch] {rd}: {state}; log {log}", flush=True)
    return rc


def runner_of(kind: str, argv: list[str], **kw) -> jobs.Runner:
    """The runner of launcher `kind` for the launch or sweep command `argv` as recorded (what its scripts say
    wrote them: Trainer.command_argv)."""
    return backend(kind)(shlex.join(["launch", *argv]), **kw)


def submit(trainer: Trainer, prep: Prepared, argv: list[str], job: Job, data: dict) -> int:
    """The training Job as `<run dir>/launch<suffix>` (Slurm: launch.sbatch), submitted; the launch recorded in
    manifest.json."""
    rd = prep.run_dir
    (rd / "logs").mkdir(exist_ok=True)
    runner = runner_of(prep.cfg.launcher.kind, trainer.command_argv(argv))
    ids, script = runner.run([job], rd), rd / f"{job.name}{runner.suffix}"
    submitted(prep, trainer.command_argv(argv), job, script, ids[job.name], data)
    print(f"[launch] submitted {script} as {prep.cfg.launcher.kind.capitalize()} job {ids[job.name]}")
    return 0


def submitted(prep: Prepared, argv: list[str], job: Job, script: Path, job_id: str, data: dict) -> None:
    """A run's submission (`job_id`: its job, or its task of a sweep's array) recorded in its manifest.json."""
    launcher = {"kind": prep.cfg.launcher.kind, "nodes": job.resources.nodes, "gpus_per_node": job.resources.gpus_per_node,
                "script": str(script), "job_id": job_id}
    manifest.write_manifest(prep.run_dir, argv=argv, choices=prep.composed.choices, launcher=launcher, data=data,
                            identity=prep.identity, python=interpreter.interpreters(prep.cfg.get("python")))


def dry_run(trainer: Trainer, preps: list[Prepared], argv: list[str], array: bool = False, logs: str | None = None,
            then: Callable[[Path], list[Job]] | None = None) -> int:
    """The plan first (its table of Jobs; each run's resolved config and the job's script written under a new
    temporary directory it names), then each run's lines and resolved config and what would run: the
    command here, or the script a submitting backend submits (GRPO: every backend's script). A sweep's: one job, an `array` over its runs, its logs
    and script in its own dir (`logs`; by default the run dir's); `then(where)`: the jobs planned after the training
    (a sweep's evaluation), their configs written under `where`. Nothing else is written; nothing starts.
    An SFT run's dataset dir is where the cache would hold it, when its key is computable here without the hub."""
    first, kind = preps[0], preps[0].cfg.launcher.kind
    for cfg in [p.cfg for p in preps if not p.cfg.data.dir] if trainer.stage == "sft" else ():
        try:
            with datafetch.no_network():   # a plan never waits on the hub: the tokenizer from the local cache or not at all
                cfg.data.dir = str(cache.cache_root(cfg) / cache.dataset_key(cfg, first.composed.data_arm))
        except Exception as exc:  # the key may need data_prep, local source files or a tokenizer not cached here
            print(f"[launch] (dataset cache key not computable here: {exc})")
    job, where = trainer.job(preps, array, logs), dry_run_dir("launch")
    for i, prep in enumerate(preps):
        (where / f"{job.name}{f'-{i}' if array else ''}.config.yaml").write_text(OmegaConf.to_yaml(prep.cfg))
    runner = runner_of(kind, trainer.command_argv(argv))
    jobs.dry_run([job, *(then(where) if then else [])], runner, where)
    script = (where / f"{job.name}{runner.suffix}").read_text(encoding="utf-8")
    for prep in preps:
        print(trainer.describe(prep))
        trainer.check_python(prep)
        if runner.where == "here" and prep.cfg.model.gpu_only and jobs.cuda_device_count() == 0:
            print(f"[launch] note: model={prep.composed.choices['model']} is GPU-only and this machine has no "
                  "CUDA GPU; without dry_run this fails (use model=tiny on CPU)")
    sbatch = Path(logs or first.run_dir) / f"{job.name}{runner.suffix}"
    if array:   # a sweep: its array's script when submitted (run here: every task's command is in the one written)
        if runner.submits:
            print(f"# {sbatch} (not written: dry_run=true)\n{script}")
        return 0
    print(f"# resolved config.yaml\n{OmegaConf.to_yaml(first.cfg)}")
    if trainer.stage == "grpo":   # every launcher backend's script, each as launcher=KIND would write it
        for other in jobs.BACKENDS:
            mine = runner_of(other, trainer.command_argv(argv))
            print(f"# launcher={other}: {sbatch.with_suffix(mine.suffix)} (not written: dry_run=true)\n"
                  + (script if other == kind else mine.script(trainer.job(preps, kind=other), {}, where)))
    elif runner.submits:
        print(f"# {sbatch} (not written: dry_run=true)\n{script}")
    else:
        print(f"# command\n{shlex.join(runner.task_command(job, str(job.config)))}")
    return 0


def train_runs(trainer: Trainer, runs: list, **cache_kw) -> int:
    """Runs ((argv, prep) each), here, one after another as `launch` runs each (launch_one on the run resolved up
    front; of several, each announced by its first two keys: arm and seed); the exit status: one run's own; of
    several, 1 when one failed (the others run all the same; the failed ones listed), an interrupt's (130 / 143),
    which stops them."""
    failed = []
    for i, (argv, prep) in enumerate(runs, 1):
        if len(runs) > 1:
            print(f"[launch] sweep run {i}/{len(runs)}: {' '.join(argv[:2])}", flush=True)
        rc = launch_one(trainer, argv, prep, checked=True, **cache_kw)
        if rc in (130, 143) or len(runs) == 1:
            return rc
        failed += [(argv[:2], rc)] if rc else []
    if failed:
        print("[launch] sweep: failed runs: " + "; ".join(f"{' '.join(r)} (exit {rc})" for r, rc in failed))
    return 1 if failed else 0


class Training(jobs.Runner):
    """A plan on a launcher backend's runner (`inner`) whose training jobs (`runs`: job name -> (trainer, its runs,
    (argv, prep) each)) run as `launch` runs them, in the runner's environment: run here, one after another
    (`train_runs`); submitted, prepared just before (what the trainer would refuse at start, resume=never's rename,
    then data and config.yaml under each run dir's lock; a finished run kept, its identity checked) and each run's
    submission recorded in its manifest (an array: task i). `cache_kw` reach the data step (launch.cache)."""

    def __init__(self, inner: jobs.Runner, runs: dict, **cache_kw):
        self.inner, self.runs, self.cache_kw, self.suffix = inner, runs, cache_kw, inner.suffix

    def script(self, job: Job, ids, where: Path) -> str:
        return self.inner.script(job, ids, where)

    def start(self, job: Job, script: Path, ids) -> str:
        if job.name not in self.runs:
            return self.inner.start(job, script, ids)
        trainer, runs = self.runs[job.name]
        with local.isolated(self.inner.env):
            if not self.inner.submits:
                if status := train_runs(trainer, runs, **self.cache_kw):
                    raise JobFailed(job.name, status)
                return f"local-{job.name}"
            todo, data = [], []
            for argv, prep in runs:   # as launch_one: a finished run is kept, its identity checked
                if is_finished(prep.run_dir) and prep.cfg.resume != "never":
                    trainer.check_finished(prep, **self.cache_kw)
                else:
                    todo.append((argv, prep))
            for _, prep in todo:
                if (refused := trainer.preflight(prep)) is not None:
                    raise LaunchError(f"{job.name}: {prep.run_dir}: refused by the trainer's own checks (exit {refused})")
                if prep.cfg.resume == "never":   # overwrite: the old run renamed aside, nothing deleted
                    start_over(prep.run_dir)
                held = lock_run_dir(prep.run_dir)
                try:
                    self.inner.check_not_queued(prep.run_dir)
                    data.append(trainer.prepare(prep, **self.cache_kw))
                finally:
                    os.close(held)
            job_id = self.inner.start(job, script, ids)
            for i, ((argv, prep), record) in enumerate(zip(todo, data)):
                submitted(prep, trainer.command_argv(argv), job, script, f"{job_id}_{i}" if job.array else job_id, record)
        return job_id


class SFTTrainer(Trainer):
    """SFT: composed by launch.compose.compose, its dataset built (cached) before config.yaml, trained by sft.train."""

    stage, module = "sft", "sft.train"

    def resolve(self, argv: list[str]) -> Prepared:
        return resolve(argv)

    def describe(self, prep: Prepared) -> str:
        return describe(prep)

    def prepare(self, prep: Prepared, **cache_kw) -> dict:
        """The dataset (cached), the data half of the identity, config.yaml; the manifest's `data` record: the dataset."""
        prepare_run(prep, **cache_kw)
        return data_record(prep.data)

    def needs(self, cfg: DictConfig) -> dict[str, str]:
        return interpreter.sft_needs(cfg)

    def check_finished(self, prep: Prepared, **cache_kw) -> None:
        """Is a finished run's dataset still the one it trained on (check_finished_data)."""
        check_finished_data(prep, **cache_kw)


SFT = SFTTrainer()
