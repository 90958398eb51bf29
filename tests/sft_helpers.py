"""Helpers for the sft tests: rank launching and metrics; the copy-task dataset dir and its resolved
config come from `sft.copytask` (the benchmark uses them too)."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from sft.copytask import make_dataset_dir, write_config  # noqa: F401  (re-exported for the tests)

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, world: int, port: int) -> dict:
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1", WANDB_MODE="offline",
               PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.pop("WANDB_API_KEY", None)
    return env


def launch(args: list[str], world: int = 2, log_dir: Path | None = None) -> list[subprocess.Popen]:
    """Start `world` ranks of `python args...` the way torchrun would (env vars), each in its
    own session so a test can kill -9 them."""
    port = free_port()
    procs = []
    for r in range(world):
        out = open(log_dir / f"rank{r}.log", "ab") if log_dir else subprocess.DEVNULL
        procs.append(subprocess.Popen([sys.executable, *args], cwd=ROOT, env=rank_env(r, world, port),
                                      stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
    return procs


def wait_all(procs, timeout: float = 300) -> list[int]:
    deadline = time.time() + timeout
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(1, deadline - time.time())))
        except subprocess.TimeoutExpired:
            kill_all(procs)
            raise
    return codes


def kill_all(procs, sig=signal.SIGKILL) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, sig)
    for p in procs:
        p.wait()


def run_ranks(config: Path, world: int = 2, timeout: float = 300, extra: list[str] = ()) -> list[int]:
    log_dir = config.parent
    return wait_all(launch(["-m", "sft.train", str(config), *extra], world, log_dir), timeout)


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines() if l.strip()]
