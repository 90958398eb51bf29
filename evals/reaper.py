"""Parent-death cleanup of the engine processes a backend starts.

vLLM runs its engine core in a child process (`VLLM::EngineCore`: always under AsyncLLM, the async
driver's engine; under LLM when multiprocessing is on, the CUDA default), and nothing in vLLM stops it
when its parent dies without shutting it down (SIGKILL, the OOM killer, a forced stop): it keeps its
memory, and on a GPU the device, through the rerun that resumes the evaluation. `guard()`, called just
before a backend starts its engine, starts a small watcher process (`python -m evals.reaper PID`) that
notes the processes below PID every `POLL_S` seconds; once PID is gone (the watcher is reparented) it
stops the ones last noted that still run (SIGTERM, vLLM's own graceful shutdown; SIGKILL after
`GRACE_S`) and exits. Given a notes file (`guard(notes=PATH)`), the watcher writes the pids of each scan
there (one per line, replaced atomically), so a caller can see what it holds. The backend's `close()` shuts its engine down, then ends the watcher
(`Guard.stop()`). A pid is identified with its start time (`/proc/<pid>/stat`), so a reused pid is never
signalled. Linux only (/proc); elsewhere a no-op.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

POLL_S = 0.5
GRACE_S = 10.0


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first), None when there is no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot), None when it is gone or a zombie."""
    fields = _stat(pid)
    return None if fields is None or fields[0] in ("Z", "X") else fields[19]


def descendants(pid: int | None = None) -> set[int]:
    """Every process below `pid` (this process by default), from /proc; empty where there is none."""
    pid = os.getpid() if pid is None else pid
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            parents[int(entry.name)] = int(fields[1])
    out, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - out
        out |= frontier
    return out


class Guard:
    """The watcher of one engine's life (`guard`)."""

    def __init__(self, proc: subprocess.Popen | None):
        self.proc = proc

    def stop(self) -> None:
        """End the watcher (the engine was shut down)."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def guard(notes: Path | None = None) -> Guard:
    """Start the watcher of this process's descendants (see the module doc), before the engine starts,
    so a death while it loads is covered too; `Guard.stop()` once the engine is shut down. `notes`: a
    file the watcher writes each scan's pids to."""
    if not Path("/proc").is_dir():
        return Guard(None)
    proc = subprocess.Popen([sys.executable, "-m", "evals.reaper", str(os.getpid()), *([str(notes)] if notes else [])],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, close_fds=True)
    return Guard(proc)


def _alive(marked: dict[int, str]) -> list[int]:
    return [p for p, t in marked.items() if start_time(p) == t]


def reap(marked: dict[int, str], grace_s: float = GRACE_S) -> None:
    """SIGTERM each process of `marked` (pid -> start time) still running as itself, SIGKILL what is left after `grace_s`."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 0.0)):
        for p in _alive(marked):
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while _alive(marked) and time.monotonic() < deadline:
            time.sleep(POLL_S)


def _write_notes(notes: Path, marked: dict[int, str]) -> None:
    tmp = notes.with_name(f".{notes.name}.tmp")
    tmp.write_text("".join(f"{p}\n" for p in sorted(marked)))
    os.replace(tmp, notes)


def watch(parent: int, notes: Path | None = None) -> None:
    """Note `parent`'s descendants (but this watcher) every POLL_S until `parent` is gone (this watcher
    reparented), then reap the last ones noted. A scan counts only if `parent` still lived after it: the
    kernel reparents all its children at once when it dies, so a scan that overlapped its death finds none."""
    marked: dict[int, str] = {}
    while True:
        seen = {p: t for p in descendants(parent) - {os.getpid()} if (t := start_time(p)) is not None}
        if os.getppid() != parent:
            break
        marked = seen
        if notes is not None:
            _write_notes(notes, marked)
        time.sleep(POLL_S)
    reap(marked)


def _bad_arguments(argv: list[str]) -> str | None:
    if not 1 <= len(argv) <= 2:
        return "expected PID [NOTES]"
    if not argv[0].isdigit():
        return f"PID {argv[0]!r} is not a process id"
    if len(argv) > 1 and not (folder := Path(argv[1]).absolute().parent).is_dir():
        return f"NOTES {argv[1]}: {folder} is not a directory"
    return None


def main(argv: list[str]) -> int:
    if why := _bad_arguments(argv):
        print(f"evals.reaper: {why}; usage: python -m evals.reaper PID [NOTES] (an internal helper: evals' backends start it "
              "to stop PID's engine processes once PID is gone, NOTES a file it writes their pids to)", file=sys.stderr)
        return 2
    # the terminal's Ctrl-C and hang-up reach the whole process group: evaluate then shuts its engine
    # down itself; the watcher stays for the case where it cannot
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    watch(int(argv[0]), Path(argv[1]) if len(argv) > 1 else None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
