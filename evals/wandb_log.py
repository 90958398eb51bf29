"""evaluate's summary to wandb (`wandb=auto|true|false`, default auto).

For a checkpoint inside a run (`<run_dir>/checkpoints/step-NNNNNN`) whose training logged to wandb
(`<run_dir>/wandb_id`), the summary goes to that same run, resumed under the tags its trainer made it with
(stage sft or grpo, its model), as `eval/<bench>/<metric>` against `eval/step` = NNNNNN (wandb's own step is the
trainer's, which is already further on).
Any other model (the anchor, a hub id) gets one eval run per output directory in the group
`wandb_group` (else $WANDB_RUN_GROUP). `auto` logs only where wandb would upload, i.e. when the
mode resolves to online (common.tracking: the run's logging.mode, WANDB_MODE, logged in); `true`
logs in whatever mode resolves (offline runs wait for `wandb sync`); `false` never.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from omegaconf import OmegaConf

from common import layout
from common.tracking import ID_FILE, init_run, run_spec, run_tags


def summary_row(summary: dict, profile: str | None = None) -> dict:
    """{eval/[<profile>/]<bench>/<metric>: value} for every numeric metric of every bench (a named
    evaluation profile keeps its own keys: its sizes differ from the default profile's)."""
    prefix = f"eval/{profile}" if profile else "eval"
    return {f"{prefix}/{bench}/{k}": v for bench, s in summary.items() for k, v in s.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


def log_summary(cfg, summary: dict, env: dict | None = None) -> str | None:
    """Log `summary` as described above; return where it went (None when not logged)."""
    setting = cfg.get("wandb", "auto")
    if setting is False or setting == "false":
        return None
    run_dir, step = layout.checkpoint_of(str(cfg.ckpt)) or (None, None)
    id_file = run_dir / ID_FILE if run_dir is not None else None
    if id_file is not None and id_file.is_file():
        train = OmegaConf.load(run_dir / layout.CONFIG) if (run_dir / layout.CONFIG).is_file() else OmegaConf.create({})
        logging_cfg = OmegaConf.to_container(train.logging, resolve=True) if "logging" in train else {}
        # the tags its trainer made the run with (wandb sets a resumed run's tags to these): sft.metrics tags the
        # model's path when it has no name, rl.train stage grpo
        grpo = train.get("stage") == "grpo"
        name = OmegaConf.select(train, "model.name", default=None)
        model = name if grpo else name or OmegaConf.select(train, "model.path", default=None)
        spec = run_spec(logging_cfg, name=str(logging_cfg.get("name") or run_dir.name),
                        runs_root=OmegaConf.select(train, "runs_root", default=None),
                        tags=run_tags(arm=str(train.get("arm", "?")), seed=int(train.get("seed", 0)), model=str(model),
                                      stage="grpo" if grpo else "sft"),
                        env=env)
        run_id, where = id_file.read_text().strip(), run_dir
    else:
        spec = run_spec({"group": cfg.get("wandb_group")}, name=f"eval-{Path(str(cfg.out)).name}", runs_root=None,
                        tags=["stage:eval", f"prompt:{cfg.prompt}"], job_type="eval", env=env)
        run_id = hashlib.sha256(str(Path(str(cfg.out)).resolve()).encode()).hexdigest()[:12]
        where = Path(str(cfg.out))
    if spec.mode == "disabled" or (setting == "auto" and spec.mode != "online"):
        return None
    run = init_run(spec, run_dir=where, run_id=run_id)
    try:
        run.define_metric("eval/step")
        run.define_metric("eval/*", step_metric="eval/step")
        row = summary_row(summary, cfg.get("profile"))
        if step is not None:
            row["eval/step"] = step
        run.log(row)
    finally:
        run.finish()
    return f"wandb {spec.mode} run {run_id} ({spec.project}{'/' + spec.group if spec.group else ''})"
