"""A stage's completion record: exit 0 is not the work done, the record the stage writes last is.

An export stage is done when its `out` holds `export_info.json` written by this run, an evaluate stage when
its `out` holds a `summary.json` written by this run (a training stage's record is each run's DONE, which
launch and the training job's batch script check themselves). A record that was there before the stage
ran (an earlier export, an earlier evaluation) does not count: the file must be new or rewritten.

A study's export or evaluate job is this check (launch/study.py): the job runs

    python -m launch.completion CHECK.json      (its record, its FAILED record, its command: write_check)

here or on its Slurm node: it runs the command and, when that exits 0 without (re)writing the record, prints
why, writes the end record FAILED (JSON: state, reason, code, job, time) and exits 1, so that Slurm records the job FAILED and nothing
that waits for it (afterok) starts; a non-zero exit is passed on, with its FAILED record too. A FAILED left
by an earlier run of the job (a requeue) is removed when the job starts.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# a stage kind's completion record, in its out= dir
COMPLETION = {"export": "export_info.json", "evaluate": "summary.json"}
# what the job passes on to its command (the batch step's signals: scancel, a preemption notice)
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


MODULE = "launch.completion"   # a checked job: python -m launch.completion CHECK.json


def write_check(path: Path, run: str, out, failed: Path, module: str, config: str, python: str | None = None) -> str:
    """The config of a job of stage kind `run` judged by its completion record (in `out`): `python -m MODULE CONFIG`
    run by `python` (None: the one running the check), its FAILED end record at `failed`. Returns its path."""
    from common.io import write_json

    write_json(Path(path), {"record": str(Path(str(out)) / COMPLETION[run]), "failed": str(failed),
                            "command": [python or sys.executable, "-m", module, str(config)]})
    return str(path)


def fingerprint(path: Path) -> tuple[int, ...] | None:
    """What tells a rewritten file from the one that was there (None: no file): no clock is compared, so a
    node's clock that differs from the file server's cannot fail a job that wrote its record."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) if os.path.isfile(path) else None


def not_completed(record: Path, before: tuple[int, ...] | None) -> str | None:
    """Why a stage that exited 0 did not complete (`before`: the record's fingerprint before it ran), or None."""
    now = fingerprint(record)
    if now is None:
        return f"wrote no {record} (its completion record)"
    if now == before:
        return f"did not write {record} (its completion record): the one there is from before it ran"
    return None


def _record_failed(failed: Path, reason: str, code: int, cmd: list[str]) -> None:
    from common.io import write_json

    failed.parent.mkdir(parents=True, exist_ok=True)
    write_json(failed, {"state": "failed", "reason": reason, "by": "launch.completion", "code": code,
                        "job": os.environ.get("SLURM_JOB_ID"), "command": cmd,
                        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})


def run_checked(record: Path, failed: Path, cmd: list[str]) -> int:
    """`cmd` run to its end, then judged by `record` (module docstring); its exit status."""
    failed.unlink(missing_ok=True)   # an earlier run's (a requeued job): this one runs
    before = fingerprint(record)
    name = cmd[2] if len(cmd) > 2 and cmd[1] == "-m" else cmd[0]
    try:
        child = subprocess.Popen(cmd)
    except OSError as exc:
        why = f"{name} could not be started: {exc.strerror or exc}"
        print(f"error: {why}", file=sys.stderr, flush=True)
        _record_failed(failed, why, 127, cmd)
        return 127
    # the job's own signals reach its command, as if it were the batch step (until it ends: then they are ours)
    previous = {sig: signal.signal(sig, lambda signum, _frame: child.send_signal(signum)) for sig in FORWARDED}
    try:
        rc = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    rc = 128 - rc if rc < 0 else rc
    if rc != 0:
        _record_failed(failed, f"{name} exited with code {rc}", rc, cmd)
        return rc
    if why := not_completed(record, before):
        why = f"{name} exited 0 but {why}"
        print(f"error: {why}; recorded in {failed}", file=sys.stderr, flush=True)
        _record_failed(failed, why, 1, cmd)
        return 1
    return 0


def main(argv: list[str]) -> int:
    """`python -m launch.completion CHECK.json` (write_check's config)."""
    if len(argv) != 1:
        print("usage: python -m launch.completion CHECK.json", file=sys.stderr)
        return 2
    from common.io import read_json_object

    check = read_json_object(Path(argv[0]))
    return run_checked(Path(check["record"]), Path(check["failed"]), list(check["command"]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
