"""What the sbatch scripts of `analyze launcher=slurm` run (launch/eval_slurm.py):

    python -m launch.eval_jobs task PLAN_DIR INDEX     # one array task: evaluate one checkpoint's pending benches
    python -m launch.eval_jobs run PLAN_DIR INDEX      # one run's job (slurm.runs): evaluate its checkpoints
    python -m launch.eval_jobs aggregate PLAN_DIR      # the aggregation job: the analysis on PLAN_DIR/analyze.yaml
"""
from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import OmegaConf

from analysis.errors import AnalysisError
from launch.analyze import print_result, run_analysis
from launch.eval_slurm import CONFIG, run_run, run_task


def aggregate(plan: Path) -> int:
    path = Path(plan) / CONFIG
    if not path.is_file():
        raise AnalysisError(f"{path}: no such file (the plan dir of an `analyze launcher=slurm` submission)")
    return print_result(run_analysis(OmegaConf.load(path)))


def _main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "task" and argv[2].isdigit():
        return run_task(Path(argv[1]), int(argv[2]))
    if len(argv) == 3 and argv[0] == "run" and argv[2].isdigit():
        return run_run(Path(argv[1]), int(argv[2]))
    if len(argv) == 2 and argv[0] == "aggregate":
        return aggregate(Path(argv[1]))
    raise AnalysisError("usage: python -m launch.eval_jobs task PLAN_DIR INDEX | run PLAN_DIR INDEX | "
                        "aggregate PLAN_DIR")


def main(argv: list[str] | None = None) -> int:
    from common.cli import run_cli

    return run_cli(_main, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())

