"""`python -m envs.search_plan_act pilot|export|show [key=value ...]`: `pilot` prints the policy x reward-component
means (exit 1 if the ordering fails), `export` writes genuine-policy episodes as canonical records for data_prep
(`canonical:PATH`), `show` prints one genuine episode's messages."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from omegaconf import OmegaConf

from common import fields
from common.cli import apply_overrides, run_cli, wants_help
from common.io import replace_aside
from envs.errors import EnvsError

SPLIT = fields.choice("the task split: train, or ood (the held-out one: other facts, relations and templates, more hops)", "train", ("train", "ood"))
SEED = fields.count("the seed the task seeds are drawn from (show: the one task's seed)", 0, (), lo=0)
KNOB = "pin every task's {} to this (null: the split's own)"
KEYS = {  # every key of each command: its --help, its rule
    "pilot": {"split": SPLIT, "tasks": fields.count("policy x component means over this many tasks", 200, ()), "seed": SEED,
              "hops": fields.count(KNOB.format("hops"), None, (), null=True),
              "writes": fields.count(KNOB.format("writes"), None, (), null=True),
              "distractors": fields.count(KNOB.format("distractors"), None, (), lo=0, null=True)},
    "export": {"out": fields.field("the canonical .jsonl file to write (required)", None, rule=fields.Test(
                   lambda v: v is None or isinstance(v, str) and not Path(v).is_dir(), "a file path (not a directory)")),
               "n": fields.count("genuine-policy episodes to write", 100, (), lo=0), "seed": SEED, "split": SPLIT,
               "overwrite": fields.flag("an existing out is refused; true renames it aside (<out>.replaced-<UTC time>)", False, ())},
    "show": {"seed": SEED, "split": SPLIT},
}


def main(argv: list[str]) -> int:
    if not argv or wants_help(argv) or argv[0] not in KEYS:
        if argv and not wants_help(argv):
            raise EnvsError(f"unknown command {argv[0]!r}; expected one of {list(KEYS)}")
        shown = [argv[0]] if argv and argv[0] in KEYS else list(KEYS)
        print(__doc__ + "".join(f"\n\n{c} keys (key=default  description):\n" + fields.help_table(KEYS[c])
                                for c in shown))
        return 0
    cmd, rest = argv[0], argv[1:]
    cfg = apply_overrides(OmegaConf.create(fields.defaults(KEYS[cmd])), rest)
    if bad := fields.problems(KEYS[cmd], cfg):
        raise EnvsError("; ".join(bad))
    if cmd == "pilot":
        from .pilot import run_pilot

        from .spec import get_spec, resolve_difficulty

        knobs = {k: cfg[k] for k in ("hops", "writes", "distractors") if cfg[k] is not None}
        try:
            resolve_difficulty(get_spec(cfg.split), **knobs)   # knobs no task can be built with: one line, exit 2
        except ValueError as exc:
            raise EnvsError(str(exc)) from None
        result = run_pilot(cfg.split, cfg.tasks, cfg.seed, **knobs)
        print(result.table())
        return 0 if result.ok else 1
    if cmd == "export":
        from .export import export_trajectories

        if not cfg.out:
            raise EnvsError("export needs out=PATH")
        if Path(cfg.out).exists():
            if not cfg.overwrite:
                raise EnvsError(f"out={cfg.out} exists; pass overwrite=true to rename it aside (<out>.replaced-<UTC time>)")
            print(f"overwrite=true: {cfg.out} renamed to {replace_aside(Path(cfg.out)).name}")
        print(f"wrote {export_trajectories(cfg.out, cfg.n, cfg.seed, cfg.split)} {cfg.split} trajectories to {cfg.out}")
        return 0
    from .export import episode_record

    print(json.dumps(episode_record(cfg.seed, cfg.split)["messages"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
