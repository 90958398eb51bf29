"""One run: compose -> (finished? stop) -> hardware check -> data -> run dir -> train or submit.

The order matters: everything that can fail cheaply (bad keys and values, a GPU-only model on a
CPU machine, resume=never over an existing run) fails before data prep, and data prep finishes
before the run directory's config.yaml is written, so config.yaml always names a complete dataset.
"""
from __future__ import annotations

import fcntl
import os
import shlex
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from common.cli import ConfigError
from launch import cache, local, manifest, slurm
from launch.compose import Composed, compose, planned_saves, planned_steps, run_dir

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Prepared:
    """A run resolved up to (not including) training: its final config and where it lives."""

    composed: Composed
    run_dir: Path
    nproc: int
    data: cache.CachedData | None = None

    @property
    def cfg(self) -> DictConfig:
        return self.composed.cfg


def is_finished(rd: Path) -> bool:
    return (rd / "DONE").is_file()


def has_started(rd: Path) -> bool:
    return any((rd / sub).is_dir() and any((rd / sub).iterdir()) for sub in ("state", "checkpoints"))


def resolve(argv: list[str], gpus: int | None = None) -> Prepared:
    """Compose and check everything that doesn't need data; fill the derived config values."""
    composed = compose(argv)
    cfg = composed.cfg
    rd = run_dir(cfg)
    if cfg.resume == "never" and has_started(rd):
        raise ConfigError(f"resume=never but {rd} already holds a run (state/ or checkpoints/); "
                          "use resume=auto to continue it or run_dir=... for a new one")
    if cfg.launcher.kind == "local" and not cfg.launcher.dry_run:
        local.check_hardware(cfg, composed.choices["model"], gpus)
    nproc = local.resolve_nproc(cfg, gpus)
    cfg.run_dir = str(rd)
    cfg.runs_root = str(Path(cfg.runs_root).expanduser().resolve())
    cfg.launcher.nproc = nproc
    if cfg.logging.name is None:
        cfg.logging.name = f"{cfg.arm}-s{cfg.seed}"
    return Prepared(composed=composed, run_dir=rd, nproc=nproc)


def prepare_data(prep: Prepared, **cache_kw) -> cache.CachedData:
    cache.pin_hub_sources(prep.cfg, prep.composed.data_arm, prep.run_dir, log=cache_kw.get("log", print))
    data = cache.ensure_dataset(prep.cfg, prep.composed.data_arm, **cache_kw)
    prep.cfg.data.dir = str(data.dir)
    prep.data = data
    return data


def data_record(data: cache.CachedData) -> dict:
    return {"dir": str(data.dir), "cache_key": data.key, "fingerprint": data.fingerprint, "reused": data.reused}


def write_config(prep: Prepared) -> Path:
    """Write `<run_dir>/config.yaml`; a changed config on re-launch keeps the old one beside it."""
    rd = prep.run_dir
    rd.mkdir(parents=True, exist_ok=True)
    path = rd / "config.yaml"
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
    """Take `<run_dir>/.launch.lock` (flock) or fail naming the holder; return the locked fd.

    The fd is handed to torchrun, so the lock is held until the trainer is gone even if launch
    itself is killed: two trainers never write one run directory at the same time.
    """
    rd.mkdir(parents=True, exist_ok=True)
    path = rd / ".launch.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = path.read_text(encoding="utf-8").strip() or "unknown"
        os.close(fd)
        raise ConfigError(f"{rd} is in use by another launch or its still-running trainer (holder: {holder}); "
                          "wait for it to finish or stop it, then re-run to resume") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
    return fd


def describe(prep: Prepared) -> str:
    cfg = prep.cfg
    saves = planned_saves(cfg)
    return (f"[launch] {prep.composed.choices} -> {prep.run_dir}\n"
            f"[launch] {planned_steps(cfg)} optimizer steps (for n={cfg.data.n}), checkpoints at {saves}")


def launch_one(argv: list[str], **cache_kw) -> int:
    """`launch key=value ...` for one run; returns the exit code (the trainer's for local runs)."""
    prep = resolve(argv)
    cfg, rd = prep.cfg, prep.run_dir
    if is_finished(rd) and cfg.resume != "never":
        print(f"[launch] {rd} is finished (DONE exists); not retraining. Checkpoints: "
              f"{', '.join(sorted(p.name for p in (rd / 'checkpoints').glob('step-*'))) or 'none'}")
        return 0
    print(describe(prep))
    if cfg.launcher.dry_run:
        return dry_run(prep, argv)
    lock = lock_run_dir(rd)
    try:
        if cfg.launcher.kind == "slurm":
            slurm.check_not_queued(rd)
        prepare_data(prep, **cache_kw)
        config_path = write_config(prep)
        if cfg.launcher.kind == "slurm":
            return submit_slurm(prep, argv)
        cmd = local.torchrun_command(config_path, prep.nproc)
        launcher = {"kind": "local", "nproc": prep.nproc, "command": shlex.join(cmd)}
        manifest.write_manifest(rd, argv=argv, choices=prep.composed.choices, launcher=launcher,
                                data=data_record(prep.data))
        print(f"[launch] {'resuming' if has_started(rd) else 'starting'}: {shlex.join(cmd)}", flush=True)
        rc, log = local.run_logged(cmd, rd / "logs", cwd=REPO, pass_fds=(lock,))
    finally:
        os.close(lock)
    state = "finished" if is_finished(rd) else f"stopped (exit {rc}); re-run the same command to resume"
    print(f"[launch] {rd}: {state}; log {log}", flush=True)
    return rc


def submit_slurm(prep: Prepared, argv: list[str]) -> int:
    rd = prep.run_dir
    script = render_sbatch(prep, argv)
    path = rd / "launch.sbatch"
    path.write_text(script, encoding="utf-8")
    (rd / "logs").mkdir(exist_ok=True)
    job = slurm.submit(path)
    launcher = {"kind": "slurm", "nodes": prep.cfg.launcher.nodes, "gpus_per_node": prep.cfg.launcher.gpus_per_node,
                "script": str(path), "job_id": job}
    manifest.write_manifest(rd, argv=argv, choices=prep.composed.choices, launcher=launcher,
                            data=data_record(prep.data))
    print(f"[launch] submitted {path} as Slurm job {job}")
    return 0


def render_sbatch(prep: Prepared, argv: list[str], repo: str | None = None, python: str | None = None) -> str:
    cfg = prep.cfg
    spec = slurm.spec_from_config(cfg, job_name=f"dtsft-{cfg.logging.name}",
                                  output=str(prep.run_dir / "logs" / "slurm-%j.out"), nproc=prep.nproc)
    return slurm.render_run_script(spec, str(prep.run_dir), repo or str(REPO), python or sys.executable,
                                   shlex.join(["launch", *argv]))


def dry_run(prep: Prepared, argv: list[str]) -> int:
    """Print the resolved config and the command that would run; build and write nothing."""
    cfg = prep.cfg
    try:
        key = cache.dataset_key(cfg, prep.composed.data_arm) if not cfg.data.dir else None
        if key:
            cfg.data.dir = str(cache.cache_root(cfg) / key)
    except Exception as exc:  # the key may need data_prep or local source files
        print(f"[launch] (dataset cache key not computable here: {exc})")
    print("# resolved config.yaml")
    print(OmegaConf.to_yaml(cfg))
    config_path = prep.run_dir / "config.yaml"
    if cfg.launcher.kind == "slurm":
        print(f"# {prep.run_dir / 'launch.sbatch'} (not written: dry_run=true)")
        print(render_sbatch(prep, argv))
    else:
        if cfg.model.gpu_only and local.cuda_device_count() == 0:
            print(f"[launch] note: model={prep.composed.choices['model']} is GPU-only and this machine has no "
                  "CUDA GPU; without dry_run this fails (use model=tiny on CPU)")
        print("# command")
        print(shlex.join(local.torchrun_command(config_path, prep.nproc)))
    return 0
