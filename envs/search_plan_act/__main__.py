"""`python -m envs.search_plan_act pilot [split=train|ood] [tasks=200] [seed=0]`
`python -m envs.search_plan_act export out=PATH [n=100] [seed=0] [split=train] [overwrite=false]`
    (an existing out is refused; overwrite=true renames it aside to <out>.replaced-<UTC time>)
`python -m envs.search_plan_act show [seed=0] [split=train]`  (prints one genuine episode)"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from omegaconf import OmegaConf

from common.cli import apply_overrides, parse_switch, require_int, run_cli, wants_help
from common.io import replace_aside
from envs.errors import EnvsError

DEFAULTS = {
    "pilot": {"split": "train", "tasks": 200, "seed": 0, "hops": None, "writes": None, "distractors": None},
    "export": {"out": None, "n": 100, "seed": 0, "split": "train", "overwrite": False},
    "show": {"seed": 0, "split": "train"},
}


def main(argv: list[str]) -> int:
    if not argv or wants_help(argv) or argv[0] not in DEFAULTS:
        print(__doc__)
        if argv and not wants_help(argv):
            raise EnvsError(f"unknown command {argv[0]!r}; expected one of {list(DEFAULTS)}")
        return 0
    cmd, rest = argv[0], argv[1:]
    cfg = apply_overrides(OmegaConf.create(DEFAULTS[cmd]), rest)
    if cfg.get("split") not in ("train", "ood"):
        raise EnvsError(f"split must be train or ood, got {cfg.split!r}")
    if cmd == "pilot":
        from .pilot import run_pilot

        knobs = {k: require_int(cfg[k], k, 0) for k in ("hops", "writes", "distractors") if cfg[k] is not None}
        result = run_pilot(cfg.split, require_int(cfg.tasks, "tasks", 1), require_int(cfg.seed, "seed", 0), **knobs)
        print(result.table())
        return 0 if result.ok else 1
    if cmd == "export":
        from .export import export_trajectories

        if not cfg.out:
            raise EnvsError("export needs out=PATH")
        out, overwrite = Path(cfg.out), parse_switch(cfg.overwrite, "overwrite")
        if out.is_dir():
            raise EnvsError(f"out={out} is a directory; expected the path of a .jsonl file")
        if out.exists():
            if not overwrite:
                raise EnvsError(f"out={out} exists; pass overwrite=true to rename it aside (<out>.replaced-<UTC time>)")
            print(f"overwrite=true: {out} renamed to {replace_aside(out).name}")
        n = export_trajectories(cfg.out, require_int(cfg.n, "n", 1), require_int(cfg.seed, "seed", 0), cfg.split)
        print(f"wrote {n} {cfg.split} trajectories to {cfg.out}")
        return 0
    from .export import episode_record

    print(json.dumps(episode_record(require_int(cfg.seed, "seed", 0), cfg.split)["messages"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
