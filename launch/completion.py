"""`python -m launch.completion CHECK.json` (check_config's) runs a stage's command, its signals forwarded: a non-zero
exit is passed on, an exit 0 that did not write its completion record (docs/studies.md) is exit 1 (Slurm: FAILED,
nothing afterok starts); either way with the FAILED end record, which the job's next run (a requeue) removes."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from common.io import json_text, read_json_object, write_json

# a stage kind's completion record, written or rewritten in its out= dir by the run
COMPLETION = {"export": "export_info.json", "evaluate": "summary.json"}
# what the job passes on to its command (the batch step's signals: scancel, a preemption notice)
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
MODULE = "launch.completion"   # a checked job: python -m launch.completion CHECK.json


def check_config(run: str, out, failed: Path, module: str, config: str, python: str | None = None) -> str:
    """The config (its JSON text) of a job of stage kind `run` judged by its completion record (in `out`): `python
    -m MODULE CONFIG` run by `python` (None: the one running the check), its FAILED end record at `failed`."""
    return json_text({"record": str(Path(str(out)) / COMPLETION[run]), "failed": str(failed),
                      "command": [python or sys.executable, "-m", module, str(config)]})


def fingerprint(path: Path) -> tuple[int, ...] | None:
    """What tells a rewritten file from the one that was there (None: no file): no clock is compared, so a
    node's clock that differs from the file server's cannot fail a job that wrote its record."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) if os.path.isfile(path) else None


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m launch.completion CHECK.json", file=sys.stderr)
        return 2
    try:
        check = read_json_object(Path(argv[0]))
        record, failed, cmd = Path(check["record"]), Path(check["failed"]), check["command"]
        if not (isinstance(cmd, list) and cmd and all(isinstance(c, str) for c in cmd)):
            raise ValueError(f"command {cmd!r}: expected a non-empty list of strings")
        failed.unlink(missing_ok=True)   # an earlier run's (a requeued job): this one runs
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"error: {argv[0]}: not a checked job's config ({exc})", file=sys.stderr)
        return 2
    before = fingerprint(record)
    name = cmd[2] if len(cmd) > 2 and cmd[1] == "-m" else cmd[0]
    try:
        child = subprocess.Popen(cmd)
    except OSError as exc:
        rc, why = 127, f"{name} could not be started: {exc.strerror or exc}"
        print(f"error: {why}", file=sys.stderr, flush=True)
    else:
        # the job's own signals reach its command, as if it were the batch step (until it ends: then they are ours)
        previous = {sig: signal.signal(sig, lambda signum, _frame: child.send_signal(signum)) for sig in FORWARDED}
        try:
            rc = child.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        rc = 128 - rc if rc < 0 else rc
        why = f"{name} exited with code {rc}" if rc else None
        if not rc and ((now := fingerprint(record)) is None or now == before):
            rc, why = 1, f"{name} exited 0 but " + (f"wrote no {record} (its completion record)" if now is None else
                                                     f"did not write {record} (its completion record): the one there is "
                                                     "from before it ran")
            print(f"error: {why}; recorded in {failed}", file=sys.stderr, flush=True)
    if why is not None:
        failed.parent.mkdir(parents=True, exist_ok=True)
        write_json(failed, {"state": "failed", "reason": why, "by": MODULE, "code": rc, "job": os.environ.get("SLURM_JOB_ID"),
                            "command": cmd, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
