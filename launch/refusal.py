"""A trainer's refusal as a Slurm segment reports it (docs/stages/launch.md; common.layout.record_refusal): `python -m
launch.refusal RUN_DIR LAUNCH_ID`, run after srun, prints `CODE<TAB>MESSAGE` and exits 0 when the trainer of that
launch recorded a refusal, else exits 1 with nothing printed."""
from __future__ import annotations

import sys

from common.layout import trainer_refusal


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m launch.refusal RUN_DIR LAUNCH_ID", file=sys.stderr)
        return 2
    if (refusal := trainer_refusal(argv[0], argv[1])) is None:
        return 1
    print(f"{refusal[0]}\t{' '.join(refusal[1].split())}")   # one line, whatever the message held
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
