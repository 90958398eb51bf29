"""A stage's command run in this process, as its console script would run it in a child process.

Sweeps and studies call each stage's `main(argv)` here (`run_main`) instead of `python -m MODULE`, unless
the stage's interpreter is not this one (`python.eval=` / `python.sft=`, common.interpreter): then it stays
a child process (`run_child`). Both give the same exit status: the command's return value, a SystemExit's
code (a message in it printed to stderr, status 1, as Python does), 1 and the traceback for an uncaught
exception. Nothing leaks into the next stage: the environment (`env=` is set for the call only), the
working directory and the logging handlers and levels are restored afterwards (a handler the stage added
is closed); `quiet=True` hides its stdout (not stderr, where refusals go), as `stdout=DEVNULL` does.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys
import traceback
from typing import Callable


def _loggers() -> dict[str, logging.Logger]:
    found = {"": logging.getLogger()}
    found.update((name, lg) for name, lg in logging.Logger.manager.loggerDict.items() if isinstance(lg, logging.Logger))
    return found


@contextlib.contextmanager
def isolated(env: dict[str, str] | None = None):
    """Run the body with `env` set (None: the environment as it is) and restore the environment, the working
    directory and every logger's handlers, level and propagation afterwards."""
    environ, cwd = dict(os.environ), os.getcwd()
    saved = {name: (list(lg.handlers), lg.level, lg.propagate) for name, lg in _loggers().items()}
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(environ)
        os.chdir(cwd)
        for name, lg in _loggers().items():
            handlers, level, propagate = saved.get(name, ([], logging.NOTSET, True))
            for h in lg.handlers:
                if h not in handlers:
                    with contextlib.suppress(Exception):
                        h.close()
            lg.handlers[:] = handlers
            lg.setLevel(level)
            lg.propagate = propagate


def exit_status(code) -> int:
    """The status `sys.exit(code)` ends a process with (a message: printed to stderr, status 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr, flush=True)
    return 1


def run_main(main: Callable[[list[str]], int | None], argv: list[str], *, env: dict[str, str] | None = None,
             quiet: bool = False) -> int:
    """`main(argv)` in this process, isolated; its exit status as its console script would end with."""
    out = io.StringIO() if quiet else None
    with isolated(env), (contextlib.redirect_stdout(out) if quiet else contextlib.nullcontext()):
        try:
            return exit_status(main(list(argv)))
        except SystemExit as exc:
            return exit_status(exc.code)
        except Exception:   # a child would print the traceback and exit 1; the study / sweep reports the status
            traceback.print_exc()
            return 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()


def run_child(cmd: list[str], *, env: dict[str, str] | None = None, quiet: bool = False) -> int:
    """`cmd` as a child process; its exit status (killed by signal N: 128 + N)."""
    proc = subprocess.run(cmd, env=env, **({"stdout": subprocess.DEVNULL} if quiet else {}))
    return 128 - proc.returncode if proc.returncode < 0 else proc.returncode
