"""The recipe vocabulary both launches, both trainers' config checks and the analysis share: where the
shipped recipes live (`RECIPES`), their groups and default choices (`GROUPS`, `DEFAULT_CHOICES`;
`group_choices`, `load_recipe`), the everyday top-level shortcuts of the command line (`ALIASES`;
GRPO's subset `RL_ALIASES`) and the keys kept verbatim as strings (`STRING_KEYS`). launch.compose
composes SFT and GRPO configs with it; rl.config validates with it; analysis.reference reads a study's
model recipes through it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from omegaconf import DictConfig, OmegaConf

from common.cli import ConfigError, did_you_mean

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
GROUPS = ("arm", "model", "data", "launcher")
DEFAULT_CHOICES = {"arm": "r2e", "model": "qwen3_4b_thinking_2507", "data": "hub", "launcher": "local"}

# Everyday top-level names -> the full key they set.
ALIASES = {
    "steps": "train.steps",
    "epochs": "train.epochs",
    "n": "data.n",
    "save_steps": "train.save_steps",
    "state_every": "train.state_every",
    "lr": "train.lr",
    "nproc": "launcher.nproc",
    "dry_run": "launcher.dry_run",
    "nodes": "launcher.nodes",
    "gpus_per_node": "launcher.gpus_per_node",
    "partition": "launcher.partition",
    "time": "launcher.time",
    "account": "launcher.account",
    "qos": "launcher.qos",
}
# Values kept verbatim as strings: YAML would read `time=24:00:00` as the base-60 integer 86400,
# which Slurm would take as minutes.
STRING_KEYS = ("launcher.time", "launcher.partition", "launcher.account", "launcher.qos", "launcher.setup")
# GRPO has no data section and no epochs: those shortcuts are not GRPO keys.
RL_ALIASES = {k: v for k, v in ALIASES.items() if not v.startswith("data.") and v.split(".")[-1] != "epochs"}


def group_choices(group: str, recipes: Path = RECIPES) -> list[str]:
    return sorted(p.stem for p in (recipes / group).glob("*.yaml"))


def load_recipe(group: str, name: str, recipes: Path = RECIPES, more: Iterable[str] = ()) -> DictConfig:
    """recipes/GROUP/NAME.yaml; an unknown NAME is refused naming the choices (the recipes and `more`, e.g. the backends)."""
    path, choices = recipes / group / f"{name}.yaml", sorted({*group_choices(group, recipes), *more})
    if name not in choices:   # (a path such as ../model/tiny is no recipe of this group)
        raise ConfigError(f"unknown {group} {name!r}; choices: {', '.join(choices) or '(none)'} (recipes in {recipes / group})"
                          + (f".{hint}" if (hint := did_you_mean(name, choices)) else ""))
    cfg = OmegaConf.load(path)
    if not isinstance(cfg, DictConfig):
        raise ConfigError(f"{path}: a recipe must be a YAML mapping")
    return cfg
