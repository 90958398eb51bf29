"""One run of a trainer (`launch_one`, for SFT's here and GRPO's in launch.grpo): compose -> (finished? stop) ->
hardware check -> data -> run dir -> train or submit. Everything that can fail cheaply (bad keys and values, a GPU-only
model on a CPU machine, another run identity than the run dir's, a run dir in use) fails before data prep, which
finishes before config.yaml is written: config.yaml always names a complete dataset."""
from __future__ import annotations

import os
import shlex
import signal
import sys
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from omegaconf import DictConfig, OmegaConf

from common import datafetch, fingerprint, interpreter, layout, lock
from common.cli import flat_keys
from common.io import check_output_dir, free_path, replace_aside, utc_stamp, write_text_atomic
from common.plan import plan_line
from common.schema import TRAINER_SEMANTICS, run_dir
from data_prep import arms
from launch import cache, jobs, local, manifest, paths, preflight
from launch.compose import Composed, compose
from launch.errors import LaunchError
from launch.eval_slurm import write_files
from launch.jobs import Job, JobFailed, Needs, Resources, backend, dry_run_dir
from rl.config import EXCLUDED_KEYS   # both trainers' (a run dir's config.yaml is either's)
from sft import config as sft_config


@dataclass
class Prepared(Composed):
    """A composed run resolved up to (not including) training: its final config and where it lives."""

    run_dir: Path
    nproc: int
    identity: dict | None = None          # the run identity, complete once the data is known
    needs: Needs | None = None            # what the preflight checks of it: asked once, by its first Job


class Trainer:
    """One kind of training run (`SFT` here, `GRPO` in launch.grpo): its `stage`, `keys` (fields) and `module` (run under
    torchrun on config.yaml), and `resolve(argv)` (everything cheap, before any lock or work), `details` (its plan
    lines), `needs(cfg)` ({module: why} to import) and `prepare` (under the run-dir lock; the manifest's `data` record)."""

    def preflight(self, prep: Prepared) -> None:
        """Refuse (an error naming why) what the trainer would refuse at start."""

    def check_finished(self, prep: Prepared) -> None:
        """A finished run's input half of the identity (refused with a LaunchError when it differs)."""

    def placed(self, composed: Composed, rd: Path, nproc: int, identity: dict | None = None) -> Prepared:
        """The run with the values launch derives into config.yaml: output paths absolute (the caller's directory),
        the run dir, the processes per node and, unless set, the logging name `<arm>[-<name>]-s<seed>`."""
        cfg = composed.cfg
        paths.outputs_absolute(cfg, jobs.with_backend_keys(self.keys))
        cfg.run_dir, cfg.launcher.nproc = str(rd), nproc
        if cfg.logging.name is None:
            cfg.logging.name = f"{cfg.arm}-{cfg.name}-s{cfg.seed}" if cfg.name else f"{cfg.arm}-s{cfg.seed}"
        return Prepared(**vars(composed), run_dir=rd, nproc=nproc, identity=identity)

    def describe(self, prep: Prepared) -> str:
        """The plan's lines: the recipes chosen, as the `key=value` words that choose them, and the run dir; then `details`."""
        words = self.command_argv([f"{k}={v}" for k, v in prep.choices.items()])
        return "\n".join([f"[launch] {' '.join(words)} -> {prep.run_dir}", *self.details(prep)])

    def command_argv(self, argv: list[str]) -> list[str]:
        """The launch command's argv as recorded (manifest, sbatch): `stage=` first unless the default (sft)."""
        return list(argv) if self.stage == "sft" else [f"stage={self.stage}", *argv]

    def runner(self, argv: list[str], kind: str, **kw) -> jobs.Runner:
        """The runner of launcher `kind` for the launch or sweep command `argv` (what its scripts say wrote them)."""
        return backend(kind)(shlex.join(["launch", *self.command_argv(argv)]), **kw)

    def job(self, preps: list[Prepared], array: bool = False, logs: str | None = None, kind: str | None = None) -> Job:
        """The training Job `launch` of one run, or `sweep`, an array over several (`logs` its log dir), on the nodes x
        processes the backend (`kind`, default: `launcher.kind`) gives it (Slurm: whole nodes, USR1 warned)."""
        cfg = preps[0].cfg
        runner = backend(kind or cfg.launcher.kind)   # GPUs per node: launcher.gpus_per_node, or here one a process (with CUDA)
        gpus = int(cfg.launcher.gpus_per_node) if runner.where == "nodes" else preps[0].nproc if jobs.cuda_device_count() else 0
        configs = tuple(str(p.run_dir / layout.CONFIG) for p in preps)
        data = [str(p.cfg.model.path if self.stage == "grpo" else p.cfg.data.dir or "dataset: built at launch")
                for p in preps]
        return Job("sweep" if array else "launch", self.module, config=None if array else configs[0],
                   array=configs if array else (), python=interpreter.interpreter(cfg.get("python"), self.stage), torchrun=preps[0].nproc,
                   cluster=runner.cluster(cfg.launcher),
                   resources=Resources(nodes=int(cfg.launcher.nodes), gpus_per_node=gpus),
                   needs=Needs(tuple(dict.fromkeys(data)), self.needs(cfg), each=tuple(map(self.run_needs, preps))),
                   title="dtsft-sweep" if array else f"dtsft-{cfg.logging.name}",
                   logs=logs or str(preps[0].run_dir / "logs"))

    def run_needs(self, prep: Prepared) -> Needs:
        """What the preflight checks of the run (launch.preflight.run_needs), asked once."""
        prep.needs = prep.needs or preflight.run_needs(self, prep)
        return prep.needs


def requested_identity(cfg: DictConfig, data_fingerprint: str | None = None, semantics: int | None = None) -> dict:
    """The run identity of `cfg` (common.fingerprint), with the trainer's semantics version and the data fingerprint."""
    data = {"data_fingerprint": data_fingerprint} if data_fingerprint is not None else {}
    return fingerprint.identity(cfg, EXCLUDED_KEYS, trainer_semantics=semantics or TRAINER_SEMANTICS, **data)


def recorded_identity(rd: Path) -> dict | None:
    """The identity a run dir belongs to: `manifest.json`'s `identity`, or (made before identity was recorded) one
    computed from its `config.yaml` with `LEGACY_TRAINER_SEMANTICS`. None for a fresh dir."""
    try:
        if isinstance((man := manifest.read(rd)).get("identity"), dict):
            return man["identity"]
        if (rd / layout.CONFIG).is_file():   # (else a fresh dir: None)
            return requested_identity(OmegaConf.load(rd / layout.CONFIG), (man.get("data") or {}).get("fingerprint") or None,
                                      fingerprint.LEGACY_TRAINER_SEMANTICS)
    except Exception as exc:  # unreadable JSON / YAML: the run dir's identity is unknown, say which file
        raise LaunchError(f"{rd}: cannot read the run's identity from manifest.json / config.yaml ({exc}); "
                          "fix or move that run dir, or use name=... / run_dir=... for this run") from None


SEMANTICS = {"trainer_semantics:": "common.schema.TRAINER_SEMANTICS", "reward_semantics:": "rl.envs.REWARD_SEMANTICS"}


def check_identity(rd: Path, cfg: DictConfig, data_fingerprint: str | None = None, want: dict | None = None) -> dict:
    """Refuse (LaunchError) a request whose identity (`want`, default: requested_identity) differs from the run dir's; return it."""
    want = want or requested_identity(cfg, data_fingerprint)
    have = recorded_identity(rd)
    diff = fingerprint.fingerprint_diff(have, want) if have is not None and cfg.resume != "never" else []
    if diff:
        where = (f"name=<variant> trains it as a separate run in {Path(cfg.runs_root).expanduser()}/{cfg.arm}/<variant>/"
                 f"seed{cfg.seed}" if not cfg.run_dir else "run_dir=<another dir> trains it as a separate run")
        why = "".join(f"; the code changed what this config means ({v})" for k, v in SEMANTICS.items() if any(d.startswith(k) for d in diff))
        raise LaunchError(
            f"{rd} holds a run of a different configuration{why}; refusing to resume or report it as this one. "
            "Differences (run dir -> requested):\n  " + "\n  ".join(diff) +
            f"\nTwo ways out: {where}, or resume=never starts over here (the old run dir is renamed to "
            f"{rd.name}.replaced-<UTC time> beside it, nothing is deleted).")
    return want


def local_nproc(composed: Composed) -> int:
    """Processes per node: `launcher.nproc`, or auto = one a GPU (here's, or launcher.gpus_per_node; 1 without), after refusing,
    for a run that would train here (not a dry run), a GPU-only model without CUDA or more processes than GPUs."""
    cfg, nproc = composed.cfg, composed.cfg.launcher.nproc
    gpus = jobs.cuda_device_count() if backend(cfg.launcher.kind).where == "here" else None   # (elsewhere: launcher.gpus_per_node)
    if gpus is not None and not cfg.launcher.dry_run:
        if cfg.model.gpu_only and gpus == 0:
            raise LaunchError(f"model={composed.choices['model']} is GPU-only (model.gpu_only=true) and this machine has no "
                              "CUDA GPU. For a CPU run use model=tiny (e.g. `launch arm=r2e steps=218 model=tiny data=synthetic`), "
                              "or launcher=slurm to submit to GPU nodes.")
        if gpus > 0 and nproc != "auto" and int(nproc) > gpus:
            raise LaunchError(f"launcher.nproc={nproc} but this machine has only {gpus} GPU(s)")
    return int(nproc) if nproc != "auto" else (int(cfg.launcher.gpus_per_node) if gpus is None else gpus) or 1


def write_config(prep: Prepared) -> None:
    """Write `<run_dir>/config.yaml`; a changed config on re-launch keeps the old one beside it."""
    rd = prep.run_dir
    rd.mkdir(parents=True, exist_ok=True)
    path, text = rd / layout.CONFIG, OmegaConf.to_yaml(prep.cfg)
    if path.is_file() and (old := path.read_text(encoding="utf-8")) != text:
        kept = free_path(rd, f"config.{utc_stamp()}", ".yaml")   # two changes in one second: both kept
        kept.write_text(old, encoding="utf-8")
        was = OmegaConf.create(old)
        sel = lambda c, k: OmegaConf.select(c, k, default="<absent>")  # noqa: E731
        print(f"[launch] config changed since the last launch; previous config kept as {kept.name}:\n"
              + "\n".join(f"  {k}: {sel(was, k)!r} -> {sel(prep.cfg, k)!r}" for k in
                          sorted(set(flat_keys(was)) | set(flat_keys(prep.cfg))) if sel(was, k) != sel(prep.cfg, k)))
    write_text_atomic(path, text)


@contextmanager
def lock_run_dir(rd: Path):
    """Hold `<run_dir>/.launch.lock` for the block, after checking (without taking it) that no trainer holds
    `.train.lock` (the trainer's rank 0 takes that itself, whoever started it); fail naming the holder."""
    fd = lock.acquire(rd / layout.LAUNCH_LOCK, "another launch", "wait for it to finish or stop it, then re-run to resume")
    try:
        lock.check_free(rd / layout.TRAIN_LOCK, "a running trainer", "wait for it to finish or stop it, then re-run to resume")
        yield
    finally:
        os.close(fd)


@contextmanager
def prepared(trainer: Trainer, prep: Prepared, runner: type[jobs.Runner] | jobs.Runner):
    """resume=never: an existing run dir renamed aside (`<dir>.replaced-<UTC time>`, nothing deleted; any other
    non-empty `run_dir=` refused: common.io.check_output_dir). Then under the run dir's lock (held for the block): a
    run still queued refused, the trainer's inputs and config.yaml; yields the manifest's `data` record."""
    rd = prep.run_dir
    if prep.cfg.resume == "never" and rd.exists() and any(p.name not in (layout.LAUNCH_LOCK, layout.TRAIN_LOCK) for p in rd.iterdir()):
        check_output_dir(rd, overwrite=True, marker=layout.CONFIG, what="run_dir")
        with lock_run_dir(rd):  # never rename a run dir a launch or a trainer is using
            aside = replace_aside(rd)
        print(f"[launch] resume=never: the previous run in {rd} was renamed to {aside}", flush=True)
    with lock_run_dir(rd):
        runner.check_not_queued(rd)
        yield trainer.prepare(prep)


def finished(prep: Prepared) -> bool:
    """Whether a launch keeps the run as finished (DONE; not resume=never), not retraining it."""
    return (prep.run_dir / layout.DONE).is_file() and prep.cfg.resume != "never"


def kept(trainer: Trainer, prep: Prepared) -> bool:
    """True for a `finished` run: kept, not retrained, its identity checked unless a dry run."""
    if not finished(prep):
        return False
    if not prep.cfg.launcher.dry_run:
        trainer.check_finished(prep)
    print(f"[launch] {prep.run_dir} is finished (DONE exists); not retraining. Checkpoints: "
          f"{', '.join(d.name for _, d in layout.step_dirs(layout.checkpoints_dir(prep.run_dir))) or 'none'}")
    return True


def launch_one(trainer: Trainer, argv: list[str]) -> int:
    """`launch [stage=...] key=value ...` for one run of `trainer`; the exit code."""
    prep = trainer.resolve(argv)   # a request of another fingerprint than the run dir's is refused here
    if kept(trainer, prep):
        return 0
    if (need := trainer.run_needs(prep)).python is not None and (why := preflight.python_problem(need)):
        raise LaunchError(why)   # a named interpreter lacking what the run needs: its one line, before anything (a dry run's too)
    found = preflight.gate(preflight.of([trainer.job([prep])]), bool(prep.cfg.launcher.dry_run))
    if prep.cfg.launcher.dry_run:
        return dry_run(trainer, [prep], argv) or preflight.after_plan(found) or 0
    print(trainer.describe(prep))
    runner = trainer.runner(argv, prep.cfg.launcher.kind)
    if not runner.submits:
        return train_here(trainer, argv, prep)
    job = trainer.job([prep])   # as `<run dir>/launch<suffix>` (Slurm: launch.sbatch), its submission in manifest.json
    script = prep.run_dir / f"{job.name}{runner.suffix}"
    job_id = start_training(runner, {job.name: (trainer, [(argv, prep)])})(job, script, {})
    print(f"[launch] submitted {script} as {prep.cfg.launcher.kind.capitalize()} job {job_id}")
    return 0


def train_here(trainer: Trainer, argv: list[str], prep: Prepared) -> int:
    """One run trained here, prepared and recorded first, under a launch id the trainer tags its refusal with;
    report_end's exit code (a refusal by the trainer's preflight: its line, exit 2)."""
    try:
        trainer.preflight(prep)
    except LaunchError as exc:   # (one run of several: the others still run)
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    launch_id, stops, rd = uuid.uuid4().hex, [], prep.run_dir
    here = trainer.runner(argv, prep.cfg.launcher.kind, env={**os.environ, layout.LAUNCH_ID_ENV: launch_id}, stops=stops)
    with prepared(trainer, prep, here) as data:
        job = trainer.job([prep])
        cmd = shlex.join(here.task_command(job, str(job.config)))
        record(prep, trainer.command_argv(argv), data, nproc=prep.nproc, command=cmd)
        resuming = any((rd / sub).is_dir() and any((rd / sub).iterdir()) for sub in (layout.STATES, layout.CHECKPOINTS))
        print(f"[launch] {'resuming' if resuming else 'starting'}: {cmd}", flush=True)
        try:
            here.start(job, None, {})
            rc = 0
        except JobFailed as failed:
            rc = failed.status
    return report_end(rd, rc, here.logs[job.name], launch_id, stopped_by=stops[0] if stops else None)


def record(prep: Prepared, argv: list[str], data: dict, **launcher) -> int:
    """This launch (launcher.kind and `launcher`) in the run's manifest.json, with the run identity; its index in `launches`."""
    return len(manifest.write_manifest(prep.run_dir, argv=argv, choices=prep.choices, data=data, identity=prep.identity,
                                       launcher={"kind": prep.cfg.launcher.kind, **launcher},
                                       python=interpreter.interpreters(prep.cfg.get("python")),
                                       trains=prep.cfg.get("stage", "sft"))["launches"]) - 1


def report_end(rd: Path, rc: int, log: Path, launch_id: str | None = None, stopped_by: str | None = None) -> int:
    """The closing line of a local launch; the exit code (a refusal the trainer recorded under `launch_id`, None:
    outside launch, printed as its one line with the trainer's code). A trainer exiting 0 without DONE stopped at a
    signal (`stopped_by`) with its state saved: STOPPED, exit 0; without a resumable state: FAILED, exit 1."""
    resumable, done = layout.latest_complete_state(layout.states_dir(rd)) is not None, (rd / layout.DONE).is_file()
    refusal = layout.trainer_refusal(rd, launch_id)
    if rc == 0 and not done:
        if resumable:   # (a signal sent to the trainer itself, not through launch: no `stopped_by`)
            layout.record_end(rd, layout.STOPPED, f"stopped{f' by {stopped_by}' if stopped_by else ''} with its "
                              "state saved: re-run the same command to resume", "launch (local)", launch=launch_id)
        elif refusal is None:
            print(f"error: the trainer exited 0 without writing {layout.DONE} or a resumable state"
                  f"{f' after {stopped_by}' if stopped_by else ''} (see its log {log})", file=sys.stderr, flush=True)
            layout.record_end(rd, layout.FAILED, "the trainer exited 0 without writing DONE or a resumable state",
                              "launch (local)", launch=launch_id, code=0)
            rc = 1
    if rc != 0 and refusal is not None:
        rc = refusal[0]
        print(f"error: {refusal[1]}", file=sys.stderr, flush=True)
    elif rc != 0 and not done:
        # the trainer's own FAILED record (this launch's) says more; else one here (an OOM kill, SIGKILL, ...).
        # A refusal wrote its own (none when another trainer holds the run: that one has not failed).
        rec = layout.end_record(rd)
        if not (rec and rec["state"] == "failed" and rec.get("launch") == launch_id):
            killed = (f" (killed by {signal.Signals(rc - 128).name}{': out of memory?' if rc - 128 == signal.SIGKILL else ''})"
                      if rc - 128 in set(signal.Signals) else "")   # 128 + N: killed by signal N (local.run_logged, launch.torchrun)
            layout.record_end(rd, layout.FAILED, f"the training processes exited with code {rc}{killed}",
                              "launch (local)", launch=launch_id, code=rc)
    state = "finished" if done else f"stopped (exit {rc})" + (
        "; re-run the same command to resume" if resumable else " before any resumable state was written")
    print(f"[launch] {rd}: {state}; log {log}", flush=True)
    return rc


def dry_run(trainer: Trainer, preps: list[Prepared], argv: list[str],
            plan: Callable[[Path], tuple[list[Job], dict[Path, str]]] | None = None) -> int:
    """The plan (its jobs' configs and scripts under a new temporary directory), then each run's lines, resolved
    config and the command here or the script submitted (GRPO: every backend's). `plan(where)`: the jobs, the training
    job first (a sweep's: an array, its logs' dir its scripts'), and their configs. Nothing else is written or started."""
    first, kind = preps[0], preps[0].cfg.launcher.kind
    for cfg, arm in [(p.cfg, p.data_arm) for p in preps if not p.cfg.data.dir] if trainer.stage == "sft" else ():
        try:   # an SFT run's dataset dir, where the cache would hold it; never waiting on the hub (a tokenizer cached here or none)
            with datafetch.no_network():
                cfg.data.dir = str(cache.cache_root(cfg) / cache.dataset_key(cfg, arm))
        except Exception as exc:  # the key may need data_prep, local source files or a tokenizer not cached here
            print(f"[launch] (dataset cache key not computable here: {exc})")
    where = dry_run_dir("launch")
    (job, *after), files = plan(where) if plan else ([trainer.job(preps)], {})
    array = bool(job.array)
    write_files({**{where / f"{job.name}{f'-{i}' if array else ''}.config.yaml": OmegaConf.to_yaml(prep.cfg)
                    for i, prep in enumerate(preps)}, **files})
    trainer.runner(argv, kind).run([job, *after], where, dry_run=True)
    for prep in preps:
        print(trainer.describe(prep))
        if backend(kind).where == "here" and prep.cfg.model.gpu_only and jobs.cuda_device_count() == 0:
            print(f"[launch] note: model={prep.choices['model']} is GPU-only and this machine has no "
                  "CUDA GPU; without dry_run this fails (use model=tiny on CPU)")
    if not array:   # (a sweep's array: its script when submitted; run here, every task's command is in the one written)
        print(f"# resolved config.yaml\n{OmegaConf.to_yaml(first.cfg)}")
    for other in jobs.BACKENDS if trainer.stage == "grpo" else [kind]:   # GRPO (never an array): every backend's script
        runner = trainer.runner(argv, other)
        if runner.submits or trainer.stage == "grpo":
            try:   # (another backend's that this config cannot make, e.g. without its own settings: why; `kind`'s is made above)
                text = runner.script(trainer.job(preps, array, job.logs, other), {}, where)
            except LaunchError as exc:
                text = f"(none: {exc})"
            print(f"# {f'launcher={other}: ' if trainer.stage == 'grpo' else ''}{Path(job.logs if array else first.run_dir) / job.name}"
                  f"{runner.suffix} (not written: dry_run=true)\n{text}")
        elif not array:
            print(f"# command\n{shlex.join(runner.task_command(job, str(job.config)))}")
    return 0


def train_runs(trainer: Trainer, runs: list) -> int:
    """Runs ((argv, prep) each) here, one after another as `launch` runs each; the exit status: one run's own; of
    several, 1 when one failed (the others still run; the failed listed), or an interrupt's (130 / 143), which stops them."""
    failed = []
    for i, (argv, prep) in enumerate(runs, 1):
        if len(runs) > 1:
            print(f"[launch] sweep run {i}/{len(runs)}: {' '.join(argv[:2])}", flush=True)
        if kept(trainer, prep):   # (a named interpreter: checked by the preflight before any run)
            continue
        print(trainer.describe(prep))
        rc = train_here(trainer, argv, prep)
        if rc in (130, 143) or len(runs) == 1:
            return rc
        failed += [(argv[:2], rc)] if rc else []
    if failed:
        print("[launch] sweep: failed runs: " + "; ".join(f"{' '.join(r)} (exit {rc})" for r, rc in failed))
    return 1 if failed else 0


def start_training(inner: jobs.Runner, runs: dict) -> Callable[[Job, Path, dict], str]:
    """`inner.start` (a backend's runner's; what jobs.Runner.run calls), except that the training jobs (`runs`: job name ->
    (trainer, [(argv, prep)])) run as `launch` runs them: here, `train_runs`; submitted, each unfinished run preflighted
    and `prepared` just before, its submission recorded in its manifest (an array: task i)."""
    def start(job: Job, script: Path, ids) -> str:
        if job.name not in runs:
            return inner.start(job, script, ids)
        trainer, todo = runs[job.name]
        with local.isolated(inner.env):
            if not inner.submits:
                if status := train_runs(trainer, todo):
                    raise JobFailed(job.name, status)
                return f"local-{job.name}"
            todo = [(argv, prep) for argv, prep in todo if not kept(trainer, prep)]
            data = []
            for _, prep in todo:
                trainer.preflight(prep)
                with prepared(trainer, prep, inner) as record_data:
                    data.append(record_data)
            # (written again now: a single launch's script lies in its run dir, which resume=never renamed aside)
            Path(job.logs).mkdir(parents=True, exist_ok=True)
            script.write_text(inner.script(job, ids, script.parent), encoding="utf-8")
            # recorded before sbatch: the job may start, and its trainer record its base in the manifest, before sbatch returns
            entries = [record(prep, trainer.command_argv(argv), record_data, nodes=job.resources.nodes,
                              gpus_per_node=job.resources.gpus_per_node, script=str(script))
                       for (argv, prep), record_data in zip(todo, data)]
            try:
                job_id = inner.start(job, script, ids)
            except BaseException as exc:   # an interrupt too: sbatch may have queued the job before it
                why = str(exc) if isinstance(exc, Exception) else f"interrupted ({type(exc).__name__}): the job may be queued"
                for (_, prep), entry in zip(todo, entries):
                    manifest.add_to_launch(prep.run_dir, entry, submit_error=why)
                raise
            for i, ((_, prep), entry) in enumerate(zip(todo, entries)):
                manifest.add_to_launch(prep.run_dir, entry, job_id=f"{job_id}_{i}" if job.array else job_id)
        return job_id
    return start


class SFTTrainer(Trainer):
    """SFT: composed by launch.compose.compose, its dataset built (cached) before config.yaml, trained by sft.train."""

    stage, module, keys, needs = "sft", "sft.train", sft_config.SFT, staticmethod(interpreter.sft_needs)

    def resolve(self, argv: list[str]) -> Prepared:
        composed = compose(argv)
        rd = run_dir(composed.cfg)
        check_identity(rd, cache.with_run_pins(composed.cfg, rd))
        return self.placed(composed, rd, local_nproc(composed))

    def details(self, prep: Prepared) -> list[str]:
        return [f"[launch] {plan_line(prep.cfg)}"]

    def dataset(self, prep: Prepared) -> dict:
        """The run's dataset (its arm's hub sources pinned, then built or reused by its cache key), its dir set as `data.dir`."""
        if not prep.cfg.data.dir:
            cache.pin_sources(prep.cfg, arms.quotas(prep.data_arm, int(prep.cfg.data.n)), prep.run_dir, True)
        data = cache.ensure_dataset(prep.cfg, prep.data_arm)
        prep.cfg.data.dir = data["dir"]
        return data

    def prepare(self, prep: Prepared) -> dict:
        """The dataset (cached), the data half of the identity, config.yaml; the manifest's `data` record: the dataset."""
        data = self.dataset(prep)
        prep.identity = check_identity(prep.run_dir, prep.cfg, data["fingerprint"])
        write_config(prep)
        return data

    def check_finished(self, prep: Prepared) -> None:
        """Is a finished run's dataset still the one it trained on? Yes when its cache key is the recorded one (no data
        prep); else the dataset is prepared and its content fingerprint compared (a data_prep edit leaving the data
        identical is the same run; different data is refused like any other difference)."""
        rd = prep.run_dir
        if not (recorded_identity(rd) or {}).get("data_fingerprint"):
            return   # nothing recorded to compare with
        if not prep.cfg.data.dir:   # (an explicit data.dir: the dataset step only reads its manifest)
            key = (manifest.read(rd).get("data") or {}).get("cache_key")
            if key is not None and key == cache.dataset_key(cache.with_run_pins(prep.cfg, rd), prep.data_arm):
                return
            print(f"[launch] {rd} is finished; its dataset inputs changed since (cache key): checking the data content")
        check_identity(rd, prep.cfg, self.dataset(prep)["fingerprint"])


SFT = SFTTrainer()
