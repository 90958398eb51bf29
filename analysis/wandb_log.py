"""`analyze wandb=auto|true|false`: the tidy results table to one analysis run of the study's group.

The run is named `analysis-<out dir name>`, in the group training runs default to (the last
component of `runs_root`, else `$WANDB_RUN_GROUP`), id fixed per output directory so re-running
the analysis updates one run. `auto` (default) logs only when the mode resolves to online
(`WANDB_MODE`, logged in; common.tracking), `true` in any mode, `false` never. Per-checkpoint
summaries go to each training run through evaluate (`eval.wandb=...`).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from common.tracking import init_run, run_spec


def log_results(table, *, runs_root: str, out: Path, setting="auto", env: dict | None = None) -> str | None:
    if setting is False or setting == "false" or table is None or len(table) == 0:
        return None
    spec = run_spec({}, name=f"analysis-{Path(out).name}", runs_root=runs_root, tags=["stage:analysis"],
                    job_type="analysis", env=env)
    if spec.mode == "disabled" or (setting == "auto" and spec.mode != "online"):
        return None
    import wandb

    run_id = hashlib.sha256(str(Path(out).resolve()).encode()).hexdigest()[:12]
    run = init_run(spec, run_dir=Path(out), run_id=run_id)
    try:
        run.log({"results": wandb.Table(dataframe=table.reset_index(drop=True))})
    finally:
        run.finish()
    return f"wandb {spec.mode} run {run_id} ({spec.project}/{spec.group})"
