"""The run-directory layout (DESIGN.md), defined once: `<runs_root>/<arm>/[<name>/]seed<seed>/`.

`name=` adds a level for variants of an arm (another configuration of the same arm), so a run dir
always holds one run identity; analysis labels a variant `<arm>/<name>` and never pools it with the
unnamed arm. Directories renamed aside by `resume=never` / `overwrite=true`
(`<dir>.replaced-<UTC time>`, common.io.replace_aside) are kept but are not runs.
"""
from __future__ import annotations

import re
from pathlib import Path

from common.io import REPLACED_MARK

# The trainer's run-dir lock (fcntl, held by the training process's rank 0 for its whole life; SFT and
# RL trainers take it, launch only checks it) and launch's own lock.
TRAIN_LOCK = ".train.lock"
LAUNCH_LOCK = ".launch.lock"
SEED_DIR = re.compile(r"^seed(\d+)$")
# Letters, digits, `_` and `-`, starting with a letter or digit: no dots (so never `.replaced-`),
# no path separators; `seed<N>` is taken by the seed level.
VARIANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")


def variant_name_problem(name) -> str | None:
    """Why `name` cannot be a variant name, or None when it can (None itself: no variant)."""
    if name is None:
        return None
    if not isinstance(name, str) or not VARIANT_NAME.match(name):
        return "a name of letters, digits, '_' and '-' (starting with a letter or digit), or null"
    if SEED_DIR.match(name):
        return "a name that is not seed<N> (that level holds the seeds)"
    return None


def run_dir_path(runs_root: str | Path, arm: str, seed: int, name: str | None = None) -> Path:
    root = Path(runs_root).expanduser() / str(arm)
    return (root / name if name else root) / f"seed{seed}"


def variant_label(arm: str, name: str | None) -> str:
    return f"{arm}/{name}" if name else arm


def is_replaced(path: str | Path) -> bool:
    return REPLACED_MARK in Path(path).name


def eval_subdir(profile: str | None = None) -> Path:
    """A run's evaluations: `eval/` for the default profile, `eval/<profile>/` for a named one
    (`evaluate profile=NAME`), so two profiles of one checkpoint never share a directory."""
    return Path("eval") / profile if profile else Path("eval")
