"""`python -m launch.eval_jobs CONFIG`: one evaluation job of `analyze launcher=slurm` (launch.eval_slurm.run_task),
on its own config file (one checkpoint's evaluation, or a run's checkpoints found when it starts)."""
from __future__ import annotations

import sys
from pathlib import Path

from analysis.errors import AnalysisError
from common.cli import run_cli
from launch.eval_slurm import run_task


def _main(argv: list[str]) -> int:
    if len(argv) != 1 or "=" in argv[0]:
        raise AnalysisError("usage: python -m launch.eval_jobs CONFIG (an evaluation job's config, written by "
                            "analyze launcher=slurm)")
    return run_task(Path(argv[0]))


def main(argv: list[str] | None = None) -> int:
    return run_cli(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
