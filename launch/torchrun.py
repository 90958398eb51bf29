"""torchrun, with a failed worker reported in one line and with that worker's own exit code.

    python -m launch.torchrun ARGS...    # what launch runs: `python -m torch.distributed.run ARGS...`

It is torch's own torchrun (`torch.distributed.run.main`) in this process, so rendezvous, signals and
worker restarts are torchrun's. The difference is a failed worker: torchrun raises ChildFailedError (a
Python traceback plus a 20-line block above the worker's own message) and exits 1 whatever the worker's
code. Here the first failure is one `[torchrun]` line on stderr, and the exit code is the worker's:
2 for a trainer's refusal, 3 for non-finite gradients, 128 + N for a worker killed by signal N.
"""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from torch.distributed import run
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    try:
        run.main(argv)
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        code = int(failure.exitcode)
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        more = f"; its error file: {failure.error_file}" if failure.error_file and "N/A" not in str(failure.error_file) else ""
        print(f"[torchrun] {exc.name}: rank {rank} (pid {failure.pid}) {how}{more}", file=sys.stderr, flush=True)
        return 128 - code if code < 0 else (code or 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
