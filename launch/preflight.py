"""The preflight: before a command's first job, everything any of its jobs will need, checked at once.

Its input is one `Needs` per job (or per stage of a study: launch/study.py's `study_needs` derives them from
each stage's settings): the named data artefacts it reads, the interpreter it runs with the modules it
imports, and the directories it writes. `problems` answers one line per thing missing, never touching the
network and creating nothing:

- a data name (common/datafetch.py) is fine when it is in the cache (its digest checked, `datafetch.cached`)
  or pinned (it will be downloaded on first use; whether the source is reachable is not checked); anything
  else (an unpinned entry not pre-filled, a cached file that changed) is a line saying which `fetch-data` to run;
- an interpreter (named or the one running the command) must answer common/interpreter.py's probe with every
  module its job needs (`check`) and, for a pinned TRL (`grpo.trl`), hold that release; CUDA is not probed
  (a GPU may only exist on the node a job runs on), so it is never a reason to refuse;
- an output directory must be writable where it exists, or creatable under its nearest existing parent.

A command with problems exits 2 before it writes anything (a dry run shows its whole plan first).
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from common import datafetch, interpreter

EXIT = 2


@dataclass(frozen=True)
class Needs:
    """What one job (or study stage) needs before it starts."""
    who: str                                   # the job or stage, as lines name it
    data: tuple[str, ...] = ()                 # data names (common.datafetch) it reads
    kind: str | None = None                    # its interpreter's kind (sft | grpo | eval); None: none checked
    python: str | None = None                  # that interpreter (None: the one running this command)
    modules: dict[str, str] = field(default_factory=dict)   # module -> what needs it
    trl: str | None = None                     # a pinned TRL release (grpo.trl)
    outputs: tuple[str, ...] = ()              # directories it writes


def data_problem(name: str) -> str | None:
    """Why data name `name` cannot be had (None: cached and checked, or pinned so it will download)."""
    try:
        entry = datafetch.entry(name)
        if datafetch.cached(name) is not None or entry.pinned:
            return None
    except datafetch.DataError as exc:
        return str(exc).splitlines()[0]
    return (f"{name} is not in the data cache ($DTSFT_DATA={datafetch.data_root()}) and has no pinned source "
            f"({entry.why or 'no public commit'}): run `fetch-data {name} from=DIR` with your copy")


def python_problem(need: Needs) -> str | None:
    """Why `need`'s interpreter cannot run its job (None: it holds every module, and the pinned TRL)."""
    python = need.python or sys.executable
    shown = need.python is None
    why = interpreter.check(need.kind, python, need.modules) if need.modules else None
    if why is None and need.trl not in (None, ""):
        from rl.config import trl_problem

        why = trl_problem(need.trl, interpreter.package_version(python, "trl"), python)
    if why and shown:   # the implicit one: say how to name another
        why += f" (python.{need.kind} not given: the interpreter running this command)"
    return why


def output_problem(path: str) -> str | None:
    """Why directory `path` cannot be written (None: it is a writable dir, or can be made under one)."""
    p = Path(os.path.expanduser(path)).absolute()
    probe = p
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        return f"{path}: {probe} is a file, not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{path}: {probe} is not writable"
    return None


def problems(needs: list[Needs]) -> list[str]:
    """One line per problem of `needs`, each once, in order: `<who>: <why>`."""
    out: list[str] = []
    seen_data: dict[str, str | None] = {}
    for need in needs:
        for name in need.data:
            if name not in seen_data:
                seen_data[name] = data_problem(name)
                if seen_data[name]:
                    out.append(f"{need.who}: {seen_data[name]}")
        if need.kind is not None and (why := python_problem(need)):
            out.append(f"{need.who}: {why}")
        for path in need.outputs:
            if why := output_problem(path):
                out.append(f"{need.who}: {why}")
    return list(dict.fromkeys(out))


def report(lines: list[str], dry_run: bool) -> None:
    """The preflight's lines on stderr, one per problem (a dry run goes on to show its plan)."""
    for line in lines:
        print(f"error: preflight: {line}", file=sys.stderr, flush=True)
    if lines:
        print(f"preflight: {len(lines)} problem(s); " + ("the plan follows, and the dry run exits 2" if dry_run
              else "nothing was started, submitted or written (exit 2)"), file=sys.stderr, flush=True)
