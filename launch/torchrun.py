"""`python -m launch.torchrun ARGS...`: torch's own torchrun (`torch.distributed.run.main`) in this
process, except that a failed worker is one `[torchrun]` line on stderr instead of a traceback and a
ChildFailedError block, and the exit code is the worker's (2 for a trainer's refusal, 3 for non-finite
gradients, 128 + N for a worker killed by signal N) instead of 1 (docs/stages/launch.md, "Slurm")."""
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
