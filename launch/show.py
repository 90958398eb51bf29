"""`launch show <the launch's arguments>`: every composed key as `key = value    # origin` (the default,
a group recipe, the user's `recipe=PATH` or `command line (lr=3e-4)`); nothing is built or written.
"""
from __future__ import annotations

from omegaconf import OmegaConf

from common.cli import flat_keys
from launch.compose import compose
from launch.paths import origin_of


def render(argv: list[str]) -> str:
    composed = compose(argv)
    cfg = composed.cfg
    rows = []
    for key in flat_keys(cfg):
        value = OmegaConf.select(cfg, key)
        if OmegaConf.is_config(value):
            value = OmegaConf.to_container(value, resolve=True)
        rows.append((f"{key} = {value!r}", origin_of(key, composed.origins)))
    width = min(max(len(r[0]) for r in rows), 70)
    choices = " ".join(f"{g}={c}" for g, c in composed.choices.items())
    lines = [f"# launch show {' '.join(argv)}".rstrip(), f"# {choices}"]
    lines += [f"{text:<{width}}  # {origin}" for text, origin in rows]
    return "\n".join(lines)


def show_main(argv: list[str]) -> int:
    print(render(argv))
    return 0
