"""`launch stage=grpo task=spa|qa model=<recipe> ...`: the GRPO trainer (`GRPO`, a launch.run.Trainer started by
launch.run.launch_one like SFT's): its composition (launch.compose.compose_grpo), its run identity (rl.config: the
input files by content), the world-size note, and a preflight: what rl.train would refuse at start (a retriever that
does not answer; for task=spa, the adversarial pilot). No dataset: the manifest records the starting model."""
from __future__ import annotations

import sys

from omegaconf import OmegaConf

from common import interpreter
from rl import config as rl_config
from common.fields import Default, help_table, plain
from common.cli import run_cli, wants_help
from common.recipes import RECIPES, RL_ALIASES
from launch import run
from launch.compose import GRPO_SELECTORS, compose_grpo
from launch.errors import LaunchError
from launch.jobs import backend, with_backend_keys

USAGE = """launch stage=grpo task=spa|qa [model=<recipe>] [launcher=local|slurm] [recipe=my.yaml] [key=value ...]
(also: python -m launch.grpo ...)

GRPO with LoRA (rl/): composition the keys' defaults (rl/config.py GRPO) <-
grpo/task/<task>.yaml <- model/<model>.yaml <- launcher/<launcher>.yaml <- grpo/model/<model>.yaml <-
recipe=FILE (your own; it may not set task/arm/stage) <- key=value. The run dir is
<runs_root>/grpo_<task>/[<name>/]seed<seed>; an SFT checkpoint as model.path needs name=<variant>.
Paths you give (model.path, grpo.prompts_file, grpo.corpus, resume=PATH, recipe=) are relative to this
directory and recorded absolute; the prompts file and corpus enter the run identity by content."""


def grpo_keys(argv: list[str] = ()) -> dict:
    """Every GRPO key (rl.config.GRPO, the launcher backends'), its default as composed for the task= / model= / launcher= in
    argv (else the defaults) and its help."""
    composed = compose_grpo([a for a in argv if a.split("=", 1)[0] in GRPO_SELECTORS])
    return {k: Default(f, plain(OmegaConf.select(composed.cfg, k))) for k, f in with_backend_keys(rl_config.GRPO).items()
            if k != "stage"}


def help_text(argv: list[str]) -> str:
    """GRPO's own keys, defaults and descriptions (for the task= / model= / launcher= given in argv, else the defaults)."""
    chosen = [a for a in argv if a.split("=", 1)[0] in GRPO_SELECTORS] or [f"{k}={v}" for k, v in GRPO_SELECTORS.items()]
    return "\n".join([USAGE, "", f"Keys for {' '.join(chosen)} (key=default  description; any key: key.sub=value):",
                      help_table(grpo_keys(argv)), "",
                      "Shortcuts: " + ", ".join(f"{a} -> {f}" for a, f in RL_ALIASES.items())])


def start_record(cfg) -> dict:
    """What the run starts from (manifest `data` entry): the model and, for an SFT start, its run."""
    return {"task": str(cfg.task), "start_model": str(cfg.model.path), "parent": rl_config.parent_run(str(cfg.model.path))}


class GRPOTrainer(run.Trainer):
    """GRPO (this module's doc): composed by compose_grpo, checked by rl.train's preflight, trained by rl.train."""

    stage, module, keys, needs = "grpo", "rl.train", rl_config.GRPO, staticmethod(interpreter.grpo_needs)

    def resolve(self, argv: list[str]) -> run.Prepared:
        """Compose; check the hardware and the world size (rl.config.placement); refuse another run identity than the run dir's."""
        composed = compose_grpo(argv)
        nproc = run.local_nproc(composed)   # the world: nproc x launcher.nodes (1 where the backend runs here: launch.compose)
        rd, want = rl_config.placement(composed.cfg, nproc * int(composed.cfg.launcher.nodes))
        return self.placed(composed, rd, nproc, run.check_identity(rd, composed.cfg, want=want))

    def details(self, prep: run.Prepared) -> list[str]:
        """Steps and checkpoints; a note when the world size is not the GPU count the model's GRPO recipe states (the
        reference's), saying how the batch is kept."""
        cfg, g, world = prep.cfg, prep.cfg.grpo, prep.nproc * int(prep.cfg.launcher.nodes)
        path = RECIPES / "grpo" / "model" / f"{prep.choices['model']}.yaml"
        stated = OmegaConf.select(OmegaConf.load(path), "launcher.gpus_per_node") if path.is_file() else None
        note = [] if stated is None or int(stated) == world else [
            f"[launch] note: recipes/grpo/model/{path.name} states {int(stated)} GPUs (the reference's); this run has {world} "
            f"process(es) (launcher.gpus_per_node / nproc / nodes). The effective batch is kept: grpo.completions_per_step="
            f"{g.completions_per_step} completions per optimizer step = {int(g.completions_per_step) // (world * int(g.grad_accum))} "
            f"per process x {world} process(es) x grpo.grad_accum={g.grad_accum}; the group size (num_generations="
            f"{g.num_generations}) is unchanged"]
        return [f"[launch] {cfg.train.steps} GRPO steps of {cfg.grpo.completions_per_step} completions, "
                f"checkpoints at {rl_config.planned_saves(cfg)} (+ step 0 = the starting model)", *note]

    def prepare(self, prep: run.Prepared) -> dict:
        """Under the run-dir lock: config.yaml; the manifest's `data` record is the starting model."""
        run.write_config(prep)
        return start_record(prep.cfg)

    def preflight(self, prep: run.Prepared) -> None:
        """rl.train's own preflight (task=spa: the adversarial pilot) here, its refusal a LaunchError (exit 2)."""
        from rl.train import preflight as trainer_preflight

        cfg = prep.cfg
        if table := trainer_preflight(cfg, probe_retriever=backend(cfg.launcher.kind).where == "here"):
            raise LaunchError(f"refusing to train task=spa: a reward hack comes within the required margin of genuine "
                              f"play (adversarial pilot, {cfg.grpo.pilot_tasks} tasks)\n{table}")


GRPO = GRPOTrainer()


def cli(argv: list[str]) -> int:
    if wants_help(argv):
        print(help_text([a for a in argv if "=" in a]))
        return 0
    return run.launch_one(GRPO, argv)


def main(argv: list[str] | None = None) -> int:
    """`python -m launch.grpo ...` (what `launch stage=grpo ...` runs)."""
    return run_cli(cli, argv)


if __name__ == "__main__":
    sys.exit(main())
