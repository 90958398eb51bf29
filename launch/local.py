"""The local launcher: `torchrun --standalone --nproc_per_node N -m sft.train <run_dir>/config.yaml`
(torchrun as `python -m launch.torchrun`: a failed worker in one line, with its own exit code).

The trainer's stdout and stderr pass through to this terminal and are also written, as they
arrive, to `<run_dir>/logs/train-<UTC time>.log` (one file per launch, so a resumed run keeps
the log of every segment). SIGTERM / SIGINT (Ctrl-C) / SIGUSR1 sent to launch reach the trainer
processes, which save a resumable state and exit 0; launch exits with the trainer's exit code.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from omegaconf import DictConfig

from launch.errors import LaunchError


def cuda_device_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


def resolve_nproc(cfg: DictConfig, gpus: int | None = None) -> int:
    """Processes per node: `launcher.nproc`, or auto = the GPUs here (gloo: 1 process on CPU).

    On Slurm, auto means `launcher.gpus_per_node` (1 process on a CPU-only partition: gpus_per_node=0).
    """
    nproc = cfg.launcher.nproc
    if nproc != "auto":
        return int(nproc)
    if cfg.launcher.kind == "slurm":
        return int(cfg.launcher.gpus_per_node) or 1
    gpus = cuda_device_count() if gpus is None else gpus
    return gpus if gpus > 0 else 1


def check_hardware(cfg: DictConfig, model_choice: str, gpus: int | None = None) -> None:
    """A GPU-only model recipe on a machine without CUDA fails here, before any data prep."""
    gpus = cuda_device_count() if gpus is None else gpus
    if cfg.model.gpu_only and gpus == 0:
        raise LaunchError(
            f"model={model_choice} is GPU-only (model.gpu_only=true) and this machine has no CUDA GPU. "
            "For a CPU run use model=tiny (e.g. `launch arm=r2e steps=218 model=tiny data=synthetic`), "
            "or launcher=slurm to submit to GPU nodes."
        )
    nproc = cfg.launcher.nproc
    if gpus > 0 and nproc != "auto" and int(nproc) > gpus:
        raise LaunchError(f"launcher.nproc={nproc} but this machine has only {gpus} GPU(s)")


def torchrun_command(config_path: str | Path, nproc: int, python: str = sys.executable,
                     module: str = "sft.train") -> list[str]:
    """The single-node torchrun command (launch.torchrun); `--standalone` picks a free rendezvous port.
    `module` is the trainer (`sft.train`, or `rl.train` for stage=grpo)."""
    return [
        python, "-m", "launch.torchrun",
        "--standalone", "--nnodes=1", f"--nproc_per_node={nproc}",
        "-m", module, str(config_path),
    ]


def _pump(src, sinks: list, lock: threading.Lock) -> None:
    """Copy a pipe to its sinks chunk by chunk (so tqdm's carriage returns show live)."""
    fd = src.fileno()
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        with lock:
            for sink in sinks:
                sink.write(chunk)
                sink.flush()


def run_logged(cmd: list[str], log_dir: Path, cwd: Path, env: dict | None = None,
               pass_fds: tuple[int, ...] = (), stops: list[str] | None = None) -> tuple[int, Path]:
    """Run `cmd`, tee its stdout/stderr into `<log_dir>/train-<time>.log`; return (exit code, log).

    The child gets its own process group, so a terminal's Ctrl-C reaches launch alone and is
    forwarded exactly once (torchrun treats a second signal during its shutdown as another stop).
    `pass_fds`: descriptors the child inherits (none by default; the trainer takes its own run-dir lock).
    `stops`: the name of each signal forwarded to the trainer is appended there.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"train-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.log"
    n = 1
    while log_path.exists():
        log_path = log_dir / f"{log_path.stem.split('.')[0]}.{n}.log"
        n += 1
    child_env = dict(os.environ if env is None else env)
    child_env.setdefault("PYTHONUNBUFFERED", "1")
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, cwd=cwd, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                process_group=0, pass_fds=pass_fds)
        forward = _install_forwarding(proc, stops)
        lock = threading.Lock()
        threads = [
            threading.Thread(target=_pump, args=(proc.stdout, [sys.stdout.buffer, log], lock), daemon=True),
            threading.Thread(target=_pump, args=(proc.stderr, [sys.stderr.buffer, log], lock), daemon=True),
        ]
        for t in threads:
            t.start()
        try:
            rc = proc.wait()
        finally:
            for t in threads:
                t.join(timeout=10)
            forward()
    return (128 - rc if rc < 0 else rc), log_path


def child_pids(pid: int) -> list[int]:
    """Direct children of `pid`, from /proc (empty where /proc is unavailable)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid:
            out.append(int(stat.parent.name))
    return out


def _install_forwarding(proc: subprocess.Popen, stops: list[str] | None = None):
    """While the trainer runs, send launch's SIGTERM / SIGINT / SIGUSR1 to the trainer processes.

    They go straight to torchrun's workers (SIGINT as SIGTERM): the trainer saves a resumable state
    at the next step boundary and exits 0, torchrun then exits 0 too. Signalling torchrun instead
    would make it relay SIGTERM, SIGKILL the workers after 30 s and exit 1 with a traceback.
    Before the workers exist the signal goes to torchrun. Returns a function that restores.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    relay = {signal.SIGTERM: signal.SIGTERM, signal.SIGINT: signal.SIGTERM, signal.SIGUSR1: signal.SIGUSR1}
    previous = {}

    def handler(signum, _frame):
        if proc.poll() is not None:
            return
        if stops is not None:
            stops.append(signal.Signals(signum).name)
        targets = child_pids(proc.pid) or [proc.pid]
        print(f"[launch] signal {signal.Signals(signum).name}: asking the trainer to save its state and stop",
              file=sys.stderr, flush=True)
        for pid in targets:
            try:
                os.kill(pid, relay[signum])
            except ProcessLookupError:
                pass

    for sig in relay:
        previous[sig] = signal.signal(sig, handler)

    def restore():
        for sig, old in previous.items():
            signal.signal(sig, old)

    return restore
