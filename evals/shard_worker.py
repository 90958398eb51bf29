"""One shard of `evaluate data_parallel=N` (evals.parallel): `python -m evals.shard_worker REQUEST.yaml`
evaluates the request (its `shard=I/N`, `out=` its own dir) in this process."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from omegaconf import OmegaConf

from evals.errors import EvalError


def _main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_file():
        raise EvalError("usage: python -m evals.shard_worker SHARD_DIR/request.yaml (started by data_parallel=N)")
    from evals.parallel import CHECKPOINT_IDENTITY
    from evals.run import evaluate

    given = Path(argv[0]).parent / CHECKPOINT_IDENTITY   # hashed once, by the parent (evals.parallel)
    evaluate(OmegaConf.load(argv[0]), ckpt_id=json.loads(given.read_text(encoding="utf-8")) if given.is_file() else None)
    return 0


if __name__ == "__main__":   # vLLM spawns its engine process: the guard keeps it from re-running this
    from common.cli import run_cli

    sys.exit(run_cli(_main, sys.argv[1:]))
