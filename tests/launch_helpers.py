"""Helpers shared by the launch tests: a stand-in Slurm (srun / scontrol on PATH) and a process-tree walk."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

FAKE_SCONTROL = """#!/bin/sh
case "$1" in
  show) echo localhost ;;
  -o) echo "NodeName=$4 Arch=x86_64 CoresPerSocket=1 NodeAddr=127.0.0.1 NodeHostName=localhost" ;;   # -o show node N
  requeue) echo "$2" >> "$FAKE_CLUSTER/requeued.txt" ;;
esac
"""
# Runs the step's command on this machine: drop srun's own --options, exec the rest.
SRUN_EXEC = 'while [ $# -gt 0 ]; do case "$1" in --*) shift ;; *) break ;; esac; done\nexec "$@"\n'


def named_interpreter(path: Path, record: Path | None = None) -> Path:
    """An interpreter at its own path (`python.eval=PATH` in tests): a script exec'ing this one, so that
    every job that runs it is seen by its path; with `record`, each command line it runs is appended there."""
    path.parent.mkdir(parents=True, exist_ok=True)
    log = f'echo "$*" >> "{record}"\n' if record else ""
    path.write_text(f'#!/bin/sh\n{log}exec {sys.executable} "$@"\n')
    path.chmod(0o755)
    return path


def fake_cluster(root: Path, srun_body: str) -> dict:
    """`srun` / `scontrol` stand-ins on PATH plus the environment Slurm gives a batch script.

    `scontrol requeue X` appends X to `<root>/requeued.txt`."""
    bin_dir = root / "fakebin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, body in (("scontrol", FAKE_SCONTROL), ("srun", "#!/bin/sh\n" + srun_body)):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    return dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", FAKE_CLUSTER=str(root),
                SLURM_JOB_ID="77", SLURM_JOB_NODELIST="localhost")


def requeued(root: Path) -> list[str]:
    log = root / "requeued.txt"
    return log.read_text().split() if log.exists() else []


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (torchrun's workers run in their own sessions)."""
    from launch.local import child_pids

    out, todo = [], [pid]
    while todo:
        kids = child_pids(todo.pop())
        out += kids
        todo += kids
    return out


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def wait_until(cond, proc, what: str, timeout: float = 240) -> None:
    """Poll `cond()` while `proc` runs; fail naming `what` if it exits first or time runs out."""
    deadline = time.time() + timeout
    while not cond():
        assert proc.poll() is None, f"exited before {what}: {proc.stdout.read()[-3000:]}"
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
