"""Advisory `fcntl.flock` locks on run-directory files, with messages a user can act on.

A flock belongs to the open file description: the kernel releases it when the holder dies, however
it dies (kill -9 included), so a stale lock file never blocks anyone. The holder writes
`pid <pid> on <host>` into the file so a refusal can name it. `take_run_lock` is the trainers' run lock
(`<run_dir>/.train.lock`), one rule for SFT and GRPO; `manifest_lock` the one every read-modify-write of a run dir's
manifest.json takes (`<run_dir>/.manifest.lock`).
"""
from __future__ import annotations

import errno
import fcntl
import os
import socket
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from common.cli import ConfigError


class LockHeld(ConfigError):
    """Another live process holds the lock (the message names it)."""


def filesystem_of(path: str | Path) -> str:
    """`<type> at <mount point>` of the filesystem holding `path` (from /proc/mounts), or 'unknown'."""
    path = os.path.realpath(path)
    best = ("", "unknown")
    try:
        with open("/proc/mounts", encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3:
                    mount = parts[1].replace("\\040", " ")
                    inside = path == mount or path.startswith(mount.rstrip("/") + "/")
                    if inside and len(mount) >= len(best[0]):
                        best = (mount, parts[2])
    except OSError:
        pass
    return f"{best[1]} at {best[0]}" if best[0] else "unknown"


def holder(path: str | Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8").strip() or "unknown"
    except OSError:
        return "unknown"


def _flock(fd: int, path: Path, what: str, advice: str) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except (BlockingIOError, PermissionError):
        os.close(fd)
        raise LockHeld(f"{path.parent} is in use by {what} (holder: {holder(path)})" + (f"; {advice}" if advice else "")) from None
    except OSError as exc:
        os.close(fd)
        _no_flock(exc, path)
        raise


def _no_flock(exc: OSError, path: Path) -> None:
    """A ConfigError naming the filesystem where `exc` says it has no flock (else nothing: the caller re-raises)."""
    if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
        raise ConfigError(f"{path}: the filesystem ({filesystem_of(path.parent)}) does not support flock "
                          f"({exc.strerror}); put the run directory on a local or flock-capable filesystem "
                          "(e.g. runs_root=... on local disk, or an NFS mount with locking)") from None


def acquire(path: str | Path, what: str, advice: str = "") -> int:
    """Take an exclusive lock on `path` without waiting; return the fd (close it to release).

    Raises LockHeld naming the holder when another process has it; ConfigError naming the
    filesystem when it has no flock. `what` names the usual holder, `advice` what to do.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    _flock(fd, path, what, advice)
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
    return fd


def check_free(path: str | Path, what: str, advice: str = "") -> None:
    """Raise like `acquire` if `path` is locked now; hold nothing afterwards (a check, not a claim)."""
    path = Path(path)
    if not path.parent.is_dir():
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    _flock(fd, path, what, advice)
    os.close(fd)


@contextmanager
def manifest_lock(path: str | Path) -> Iterator[None]:
    """`path`, a run dir's `.manifest.lock` (common.layout.MANIFEST_LOCK), held for one read-modify-write of the run dir's manifest.json: launch's record of a
    launch (a Slurm submission's after the job is queued, when its trainer may be starting) and a trainer's record of
    its base (common.layout.record_base). Waits for another writer's, which holds it for a read and an atomic write
    only: it is taken last (inside `.launch.lock` or `.train.lock`, never the other way round) and nothing is taken
    while it is held, so it cannot deadlock with them."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except (BlockingIOError, PermissionError):
            fcntl.flock(fd, fcntl.LOCK_EX)   # another writer's read-modify-write: wait for it
        except OSError as exc:
            _no_flock(exc, path)
            raise
        yield
    finally:
        os.close(fd)


def take_run_lock(path: Path, rank: int, world: int, error: type[Exception]) -> int | None:
    """The trainers' run lock (sft.train, rl.train): rank 0 takes `path`, `<run_dir>/.train.lock` (fcntl), for
    the whole process; every rank learns whether it got it (an all-reduce when `world` > 1; `error`, the
    trainer's own type, on the ranks that did not try). A second trainer on the run dir — via launch or
    directly — is refused naming the holder; the kernel releases the lock when the holder dies, however it dies."""
    fd, err = None, None
    if rank == 0:
        try:
            fd = acquire(path, "another trainer", "two trainers would interleave metrics.jsonl "
                         "and write the same checkpoints; wait for it to finish or stop it, then resume")
        except ConfigError as exc:
            err = exc
    failed = err is not None
    if world > 1:
        import torch
        import torch.distributed as dist

        flag = torch.tensor([float(failed)])
        dist.all_reduce(flag)
        failed = flag.item() > 0
    if err is not None:
        raise err
    if failed:
        raise error(f"{Path(path).parent}: rank 0 could not take the run-dir lock (see rank 0's error)")
    return fd
