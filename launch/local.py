"""The local launcher, LocalRunner: a plan's Jobs (launch/jobs.py) run here, in order; training under `python -m
launch.torchrun --standalone`, teed into `<run_dir>/logs/train-<UTC time>.log` (docs/stages/launch.md)."""
from __future__ import annotations

import contextlib
import importlib
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from typing import Callable

from common.io import free_path, utc_stamp
from launch.jobs import REPO, Job, JobFailed, Runner


def _pump(src, sinks: list, lock: threading.Lock) -> None:
    """Copy a pipe to its sinks chunk by chunk (so tqdm's carriage returns show live)."""
    for chunk in iter(lambda: os.read(src.fileno(), 65536), b""):
        with lock:
            for sink in sinks:
                sink.write(chunk)
                sink.flush()


def run_logged(cmd: list[str], log_dir: Path, cwd: Path, env: dict | None = None,
               stops: list[str] | None = None) -> tuple[int, Path]:
    """Run `cmd`, tee its stdout/stderr into a new `<log_dir>/train-<time>.log`; return (exit code, log). The
    child gets its own process group, so a terminal's Ctrl-C reaches launch alone and is forwarded exactly once
    (torchrun treats a second signal during its shutdown as another stop). `stops`: each forwarded signal's name."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = free_path(log_dir, f"train-{utc_stamp()}", ".log")
    child_env = {"PYTHONUNBUFFERED": "1", **(os.environ if env is None else env)}
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, cwd=cwd, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                process_group=0)
        forward, lock = _install_forwarding(proc, stops), threading.Lock()
        threads = [threading.Thread(target=_pump, args=(pipe, [out, log], lock), daemon=True)
                   for pipe, out in ((proc.stdout, sys.stdout.buffer), (proc.stderr, sys.stderr.buffer))]
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
        with contextlib.suppress(OSError, IndexError, ValueError):   # gone meanwhile, or not a process's
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(stat.parent.name))
    return out


def _install_forwarding(proc: subprocess.Popen, stops: list[str] | None = None):
    """While the trainer runs, send launch's SIGTERM / SIGINT (as SIGTERM) / SIGUSR1 straight to torchrun's workers
    (before they exist: to torchrun): the trainer saves its state and exits 0, then torchrun too. Signalled, torchrun
    would relay SIGTERM, SIGKILL the workers after 30 s and exit 1 with a traceback. Returns a function that restores."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    relay = {signal.SIGTERM: signal.SIGTERM, signal.SIGINT: signal.SIGTERM, signal.SIGUSR1: signal.SIGUSR1}

    def handler(signum, _frame):
        if proc.poll() is not None:
            return
        if stops is not None:
            stops.append(signal.Signals(signum).name)
        print(f"[launch] signal {signal.Signals(signum).name}: asking the trainer to save its state and stop",
              file=sys.stderr, flush=True)
        for pid in child_pids(proc.pid) or [proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, relay[signum])

    previous = {sig: signal.signal(sig, handler) for sig in relay}
    return lambda: [signal.signal(sig, old) for sig, old in previous.items()]


def _loggers() -> dict[str, logging.Logger]:
    known = logging.Logger.manager.loggerDict.items()
    return {"": logging.getLogger(), **{name: lg for name, lg in known if isinstance(lg, logging.Logger)}}


@contextlib.contextmanager
def isolated(env: dict[str, str] | None = None):
    """Run the body with `env` set (None: as is), then restore the environment, working directory and every logger."""
    saved = {name: (list(lg.handlers), lg.level, lg.propagate) for name, lg in _loggers().items()}
    environ = dict(os.environ)
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    with contextlib.chdir(os.getcwd()):
        try:
            yield
        finally:
            os.environ.clear()
            os.environ.update(environ)
            for name, lg in _loggers().items():
                handlers, level, propagate = saved.get(name, ([], logging.NOTSET, True))
                for h in lg.handlers:
                    if h not in handlers:
                        with contextlib.suppress(Exception):
                            h.close()
                lg.handlers[:] = handlers
                lg.setLevel(level)
                lg.propagate = propagate


def run_main(main: Callable[[list[str]], int | None], argv: list[str], *, env: dict[str, str] | None = None) -> int:
    """`main(argv)` in this process, isolated (`env` set for the call only); its exit status as its console script
    would end with (an uncaught exception: 1 and the traceback; `sys.exit(message)`: the message on stderr, 1)."""
    with isolated(env):
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = exc.code
        except Exception:   # a child would print the traceback and exit 1; the caller reports the status
            traceback.print_exc()
            code = 1
        if not (code is None or isinstance(code, int)):
            print(code, file=sys.stderr)
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        return code or 0


def run_child(cmd: list[str], *, env: dict[str, str] | None = None) -> int:
    """`cmd` as a child process; its exit status (killed by signal N: 128 + N)."""
    proc = subprocess.run(cmd, env=env)
    return 128 - proc.returncode if proc.returncode < 0 else proc.returncode


class LocalRunner(Runner):
    """The local backend: a plan run here, job after job (each array task in turn), stopping at the first failure
    (JobFailed). A job of this interpreter without torchrun runs in this process (`run_main`), any other as a child
    (training: under torchrun, from the checkout, through `run_logged`). Its script is those commands."""
    where = "here"

    def _cwd(self, job: Job) -> str:
        return str(REPO) if job.torchrun is not None else self.workdir

    def script(self, job: Job, ids, where: Path) -> str:
        return "\n".join(["#!/bin/bash", f"# job {job.name}: python -m {job.module} CONFIG, each task in turn",
                          "set -euo pipefail", f"cd {shlex.quote(self._cwd(job))}",
                          *(shlex.join(job.command(c)) for c in job.configs)]) + "\n"

    def start(self, job: Job, script: Path, ids) -> str:
        here = job.python == sys.executable and job.torchrun is None
        for config in job.configs:
            if job.logs is not None:
                status, self.logs[job.name] = run_logged(job.command(config), Path(job.logs), cwd=Path(self._cwd(job)),
                                                         env=self.env, stops=self.stops)
            else:
                with contextlib.chdir(self._cwd(job)):
                    status = run_main(importlib.import_module(job.module).main, [config], env=self.env) if here \
                        else run_child(job.command(config), env=self.env)
            if status != 0:
                raise JobFailed(job.name, status)
        return f"local-{job.name}"
