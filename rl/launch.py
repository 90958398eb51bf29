"""`launch stage=grpo task=spa|qa model=<recipe> ...`: the GRPO run, with SFT's launchers.

Same order as an SFT launch (launch.run): compose and check everything cheap first (keys, values, a
GPU-only model on a CPU machine, resume=never over a started run, the adversarial pilot for
task=spa), then lock the run directory, write config.yaml and manifest.json, and start
`torchrun ... -m rl.train <run_dir>/config.yaml` here or submit the same sbatch script SFT uses
(its trainer module switched to rl.train). There is no dataset to build: the environment is the data.
"""
from __future__ import annotations

import os
import shlex
import sys

from omegaconf import OmegaConf

from common import keydoc, layout
from common.cli import run_cli, wants_help
from launch import local, manifest, run, slurm
from common.recipes import RECIPES, RL_ALIASES
from launch.run import REPO, Prepared, is_finished, lock_run_dir, write_config
from rl.config import SELECTORS, compose_grpo, hardware_note, parent_run, planned_saves, run_dir, run_identity, world_problem
from rl.errors import RlError

MODULE = "rl.train"

USAGE = """launch stage=grpo task=spa|qa [model=<recipe>] [launcher=local|slurm] [recipe=my.yaml] [key=value ...]
(also: python -m rl.launch ...)

GRPO with LoRA (rl/): composition recipes/base.yaml (its data section dropped) <- grpo/base.yaml <-
grpo/task/<task>.yaml <- model/<model>.yaml <- grpo/model/<model>.yaml <- launcher/<launcher>.yaml <-
recipe=FILE (your own; it may not set task/arm/stage) <- key=value. The run dir is
<runs_root>/grpo_<task>/[<name>/]seed<seed>; an SFT checkpoint as model.path needs name=<variant>.
Paths you give (model.path, grpo.prompts_file, grpo.corpus, resume=PATH, recipe=) are relative to this
directory and recorded absolute; the prompts file and corpus enter the run identity by content."""


def grpo_keys(argv: list[str] = ()) -> list[keydoc.Key]:
    """Every GRPO key, its default as composed for the task= / model= / launcher= in argv (else the defaults)
    and its description: the comment on its line in the recipes, the GRPO recipe's over base.yaml's."""
    sel = [a for a in argv if a.split("=", 1)[0] in ("task", "model", "launcher")]
    composed = compose_grpo(sel)
    docs = {}
    for path in (RECIPES / "base.yaml", RECIPES / "grpo" / "base.yaml", RECIPES / "grpo" / "task" / f"{composed.cfg.task}.yaml"):
        docs.update(keydoc.yaml_comments(path.read_text(encoding="utf-8")))
    return [k for k in keydoc.from_config(composed.cfg, docs) if k.name not in ("arm", "stage")]


def help_text(argv: list[str]) -> str:
    """GRPO's own keys, defaults and descriptions (for the task= / model= / launcher= given in argv, else the defaults)."""
    sel = [a for a in argv if a.split("=", 1)[0] in ("task", "model", "launcher")]
    chosen = " ".join(sel) or " ".join(f"{k}={v}" for k, v in SELECTORS.items())
    lines = [USAGE, "", f"Keys for {chosen} (key=default  description; any key: key.sub=value):",
             keydoc.help_table(grpo_keys(sel))]
    lines += ["", "Shortcuts: " + ", ".join(f"{a} -> {f}" for a, f in RL_ALIASES.items())]
    return "\n".join(lines)


def resolve(argv: list[str], gpus: int | None = None) -> Prepared:
    """Compose, refuse a request whose run identity (common.fingerprint over every config key:
    task, LoRA, GRPO settings, env split; the input files by content) differs from the run dir's,
    check the hardware and the world size, fill the derived values."""
    composed = compose_grpo(argv)
    cfg = composed.cfg
    rd = run_dir(cfg)
    identity = run.check_identity(rd, cfg, want=run_identity(cfg))
    if cfg.launcher.kind == "local" and not cfg.launcher.dry_run:
        local.check_hardware(cfg, composed.choices["model"], gpus)
    nproc = local.resolve_nproc(cfg, gpus)
    world = nproc * (int(cfg.launcher.nodes) if cfg.launcher.kind == "slurm" else 1)
    problem = world_problem(cfg, world)
    if problem:
        raise RlError(f"invalid config:\n  {problem}")
    cfg.run_dir = str(rd)
    cfg.runs_root = str(os.path.abspath(os.path.expanduser(str(cfg.runs_root))))
    cfg.launcher.nproc = nproc
    if cfg.logging.name is None:
        cfg.logging.name = f"{cfg.arm}-{cfg.name}-s{cfg.seed}" if cfg.name else f"{cfg.arm}-s{cfg.seed}"
    prep = Prepared(composed=composed, run_dir=rd, nproc=nproc)
    prep.identity = identity
    return prep


def sbatch_script(prep: Prepared, argv: list[str]) -> str:
    cfg = prep.cfg
    spec = slurm.spec_from_config(cfg, job_name=f"dtsft-{cfg.logging.name}",
                                  output=str(prep.run_dir / "logs" / "slurm-%j.out"), nproc=prep.nproc)
    return slurm.render_run_script(spec, str(prep.run_dir), str(REPO), sys.executable,
                                   shlex.join(["launch", "stage=grpo", *argv]), module=MODULE)


def pilot_refusal(cfg) -> str | None:
    if cfg.task != "spa":
        return None
    from rl.train import pilot_guard

    return pilot_guard(cfg)


def start_record(cfg) -> dict:
    """What the run starts from (manifest `data` entry): the model and, for an SFT start, its run."""
    return {"task": str(cfg.task), "start_model": str(cfg.model.path), "parent": parent_run(str(cfg.model.path))}


def launch_grpo(argv: list[str]) -> int:
    prep = resolve(argv)
    cfg, rd = prep.cfg, prep.run_dir
    if is_finished(rd) and cfg.resume != "never":
        print(f"[launch] {rd} is finished (DONE exists); not retraining. Checkpoints: "
              f"{', '.join(d.name for _, d in layout.step_dirs(layout.checkpoints_dir(rd))) or 'none'}")
        return 0
    print(f"[launch] stage=grpo {prep.composed.choices} -> {rd}\n"
          f"[launch] {cfg.train.steps} GRPO steps of {cfg.grpo.completions_per_step} completions, "
          f"checkpoints at {planned_saves(cfg)} (+ step 0 = the starting model)")
    note = hardware_note(prep.composed, prep.nproc * (int(cfg.launcher.nodes) if cfg.launcher.kind == "slurm" else 1))
    if note:
        print(f"[launch] note: {note}")
    if cfg.launcher.dry_run:
        print("# resolved config.yaml")
        print(OmegaConf.to_yaml(cfg))
        print("# local command (launcher=local)")
        print(shlex.join(local.torchrun_command(rd / layout.CONFIG, prep.nproc, module=MODULE)))
        print(f"# Slurm script (launcher=slurm; {rd / 'launch.sbatch'}, not written: dry_run=true)")
        print(sbatch_script(prep, argv))
        return 0
    from rl.train import preflight

    preflight(cfg, probe_retriever=cfg.launcher.kind == "local")  # what the trainer would refuse at start
    table = pilot_refusal(cfg)
    if table:
        print(f"error: refusing to train task=spa: a reward hack comes within the required margin of genuine "
              f"play (adversarial pilot, {cfg.grpo.pilot_tasks} tasks)\n{table}", file=sys.stderr)
        return 2
    if cfg.resume == "never":
        run.start_over(rd)
    held = lock_run_dir(rd)
    try:
        if cfg.launcher.kind == "slurm":
            slurm.check_not_queued(rd)
        config_path = write_config(prep)
        if cfg.launcher.kind == "slurm":
            path = rd / "launch.sbatch"
            path.write_text(sbatch_script(prep, argv), encoding="utf-8")
            (rd / "logs").mkdir(exist_ok=True)
            job = slurm.submit(path)
            launcher = {"kind": "slurm", "nodes": cfg.launcher.nodes, "gpus_per_node": cfg.launcher.gpus_per_node,
                        "script": str(path), "job_id": job}
            manifest.write_manifest(rd, argv=["stage=grpo", *argv], choices=prep.composed.choices, launcher=launcher,
                                    data=start_record(cfg), identity=prep.identity)
            print(f"[launch] submitted {path} as Slurm job {job}")
            return 0
        cmd = local.torchrun_command(config_path, prep.nproc, module=MODULE)
        rc, log, launch_id = run.train_here(prep, ["stage=grpo", *argv], cmd, start_record(cfg))
    finally:
        os.close(held)
    return run.report_end(rd, rc, log, launch_id)


def cli(argv: list[str]) -> int:
    if wants_help(argv):
        print(help_text([a for a in argv if "=" in a]))
        return 0
    return launch_grpo(argv)


def main(argv: list[str] | None = None) -> int:
    """`python -m rl.launch ...` (what `launch stage=grpo ...` runs)."""
    return run_cli(cli, argv)


if __name__ == "__main__":
    sys.exit(main())
