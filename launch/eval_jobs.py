"""`python -m launch.eval_jobs CONFIG`: one evaluation job of `analyze launcher=slurm` (launch/eval_slurm.py),
on its own config file (one checkpoint's evaluation, or a run's checkpoints found when it starts). An
array task runs the config its index picks (the script's CONFIGS list)."""
from __future__ import annotations

import sys
from pathlib import Path

from analysis.errors import AnalysisError
from launch.eval_slurm import run_task


def _main(argv: list[str]) -> int:
    if len(argv) != 1 or "=" in argv[0]:
        raise AnalysisError("usage: python -m launch.eval_jobs CONFIG (an evaluation job's config, written by "
                            "analyze launcher=slurm)")
    return run_task(Path(argv[0]))


def main(argv: list[str] | None = None) -> int:
    from common.cli import run_cli

    return run_cli(_main, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
