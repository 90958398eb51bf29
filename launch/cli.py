"""`launch`: recipe -> data -> training, on this machine or a Slurm cluster.

    launch arm=r2e steps=218 [model=...] [data=hub|synthetic] [seed=0] [nproc=N]
           [launcher=local|slurm] [dry_run=true] [runs_root=runs] [key.sub=value ...]
    launch sweep arms=[r2e,search,mixed] seeds=[0,1,2] steps=218 [eval_profile=PROFILE] ...
    launch show arm=r2e model=tiny [recipe=my.yaml] ...   # the composed recipe, each value's origin
    launch arm=r2e recipe=path/to/my.yaml ...             # your own recipe file, merged after the groups
    launch stage=grpo task=spa|qa [model=...] [model.path=<SFT checkpoint> name=...] steps=250 ...
           (GRPO with LoRA, rl/; the default stage is sft; `launch stage=grpo --help` lists its keys)
    launch study=NAME [VAR=value] [STAGE:key=value] [key=value] [dry_run=true]
           (a reference study's stages in order, recipes/study/NAME.yaml; launch/study.py)
"""
from __future__ import annotations

import sys

from omegaconf import OmegaConf

from common.cli import flat_keys, run_cli, wants_help
from common.fields import help_table, plain
from common.recipes import ALIASES, DEFAULT_CHOICES, GROUPS, group_choices
from launch.compose import compose
from launch.jobs import BACKENDS, with_backend_keys
from launch import grpo
from launch.errors import LaunchError
from launch.paths import origin_of
from launch.run import SFT, launch_one
from launch.study import run_study
from launch.sweep import run_sweep
from sft import config as sft_config

# stage= -> the trainer launch.run.launch_one starts (sft, the default: launch.run; grpo: launch.grpo)
TRAINERS = {t.stage: t for t in (SFT, grpo.GRPO)}


def help_text() -> str:
    return "\n".join([
        __doc__.strip(), "", "Recipe groups (recipes/<group>/<choice>.yaml, merged in this order on the defaults):",
        *(f"  {group}=  {' | '.join(sorted({*group_choices(group), *(BACKENDS if group == 'launcher' else ())}))}"
          f"   (default: {DEFAULT_CHOICES[group]})" for group in GROUPS),   # a backend needs no recipe
        "", "Top-level shortcuts:", *(f"  {short:<14} -> {full} (default {sft_config.SFT[full].default!r})" for short, full in ALIASES.items()),
        "", "Keys (sft/config.py SFT: key=default  description; the group recipes may change a default):",
        help_table(with_backend_keys(sft_config.SFT)),
        "", "GRPO: `launch stage=grpo --help` lists its keys.",
        "", "Masks: data.history_reasoning=exact (default) trains every token as the model generated it, in its",
        "own context; keep_as_rendered and data.thoughts=drop are INEXACT (counted in the dataset manifest).",
        "data=hub decontaminates against the 7 benches' reference item sets, data.decontam_sets ([]: off).",
        "", "Sweeps: `launch sweep arms=[...] seeds=[...] <overrides>` runs every arm x seed (local: one after",
        "another; launcher=slurm: one job array), skipping finished runs. eval_profile=PROFILE evaluates the",
        "checkpoints with analyze profile=PROFILE (analyze.KEY=VALUE adds KEY=VALUE to it): locally after the",
        "last run; launcher=slurm: one evaluation job per run after its own training task (afterok:<array>_<i>),",
        "then the report job after all of them (afterany: a run never evaluated is a gap; launch/sweep.py).",
        "Run directory: <runs_root>/<arm>/[<name>/]seed<seed>/ (config.yaml, manifest.json, logs/, metrics.jsonl,",
        "checkpoints/step-NNNNNN/, state/). Re-running the same command resumes (resume=auto); a run with",
        "DONE is reported as finished. A request whose run identity (every result-changing key, the data",
        "content, the trainer semantics) differs from the run dir's is refused: use name=<variant> for a",
        "separate run, or resume=never to rename the old run dir aside and start over.",
    ])


def show(argv: list[str]) -> int:
    """`launch show <the launch's arguments>`: every composed key as `key = value    # origin` (the default, a group
    recipe, the user's `recipe=PATH` or `command line (lr=3e-4)`); nothing is built or written."""
    composed = compose(argv)
    rows = [(f"{key} = {plain(OmegaConf.select(composed.cfg, key))!r}", origin_of(key, composed.origins))
            for key in flat_keys(composed.cfg)]
    width = min(max(len(r[0]) for r in rows), 70)
    print("\n".join([f"# launch show {' '.join(argv)}".rstrip(), "# " + " ".join(f"{g}={c}" for g, c in composed.choices.items()),
                     *(f"{text:<{width}}  # {origin}" for text, origin in rows)]))
    return 0


# `launch NAME ...`: a subcommand, the first token (SFT arms only: the GRPO stage has none), given the rest of the line
COMMANDS = {"show": show, "sweep": run_sweep}
# `launch KEY=VALUE ...`: a command chosen by a key anywhere on the line, given the whole command line
KEYED = {"study": run_study}


def launch_main(argv: list[str]) -> int:
    keys = {tok.partition("=")[0].strip() for tok in argv}
    if keyed := [command for name, command in KEYED.items() if name in keys]:
        return keyed[0](argv)
    given = [tok for tok in argv if "=" in tok and tok.partition("=")[0].strip() == "stage"]   # default sft: SFT commands unchanged
    stage, argv = given[-1].partition("=")[2].strip() if given else "sft", [tok for tok in argv if tok not in given]
    if stage not in TRAINERS:
        raise LaunchError(f"stage={stage!r} is not a stage; choices: {', '.join(TRAINERS)}")
    command = COMMANDS.get(argv[0]) if argv else None
    if stage == "grpo" and command is not None:
        raise LaunchError(f"launch {argv[0]} is for SFT arms; for GRPO use `launch stage=grpo ... dry_run=true`")
    if wants_help(argv):   # each trainer's own keys
        print(help_text() if stage == "sft" else grpo.help_text(argv))
        return 0
    return command(argv[1:]) if command is not None else launch_one(TRAINERS[stage], argv)


def main(argv: list[str] | None = None) -> int:
    return run_cli(launch_main, argv)


if __name__ == "__main__":
    sys.exit(main())
