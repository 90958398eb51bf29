"""One rule for the file and directory paths a run's config names (docs/stages/launch.md, "Paths"); which keys
are paths, and of what kind, is their fields' PATH role (common.fields.path_keys)."""
from __future__ import annotations

import os
import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from common import datafetch
from common.fields import OUTPUT, path_keys, plain
from common.tiny import ALIASES, OLD_SPELLINGS
from data_prep.readers import LOCAL_SUFFIXES, spec_parts
from launch.jobs import REPO

SHIPPED = "recipes/"                 # the origin label of a shipped recipe layer (launch.compose)
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def _abs(value: str, base: Path) -> str:
    return os.path.normpath(base / os.path.expanduser(value))   # an absolute path stays itself


def _source(spec: str, base: Path) -> str:
    fmt, loc, revision, split, share = spec_parts(spec, lambda p: (base / os.path.expanduser(p)).exists())
    loc += revision   # data-prep's grammar; a local path has no revision (its `@` is its name's)
    expanded = os.path.expanduser(loc)
    local = loc and (os.path.isabs(expanded) or (base / expanded).exists() or loc.startswith(".") or loc.endswith((*LOCAL_SUFFIXES, ".yaml")))
    return f"{fmt}:{_abs(loc, base)}{split}{share}" if local else spec   # (malformed: launch.compose.validate names it)


def absolute(kind: str, value, base: Path, shipped: bool = False):
    """`value` of a key of `kind` with its local paths absolute against `base` (see the module doc)."""
    if value is None or value == "" or isinstance(value, bool):
        return value
    if kind in ("paths", "sources"):
        if isinstance(value, (str, int, float)):
            return value   # not a list: validation names it
        one = _source if kind == "sources" else _abs
        return [one(v, base) if isinstance(v, str) else v for v in value]
    if not isinstance(value, str) or (kind == "state" and value in ("auto", "never")) \
            or (datafetch.is_name(value) and not (base / os.path.expanduser(value)).exists()):
        return value   # a fetch-data name (corpus:wiki18, index:wiki18_e5_flat, encoder:e5-base-v2): read through the cache
    if kind == "model" and (value in (*ALIASES, *OLD_SPELLINGS) or value.startswith(("http://", "https://"))):
        return value   # an embedded model (common.tiny: resolved by name, never a directory here) or a URL
    expanded = os.path.expanduser(value)
    if kind == "model" and not (os.path.isabs(expanded) or (base / expanded).exists()) and (shipped or HUB_ID.fullmatch(value)):
        return value   # a hub id (a shipped recipe names only hub ids and embedded models)
    return _abs(value, base)   # a local path (a model's that does not exist: refused later as a missing path, not a repo dir)


def origin_of(key: str, origins: dict[str, str]) -> str:
    """The layer that set `key`, or the sub-tree above it (`model.config` set as a whole)."""
    parts = key.split(".")
    heads = (".".join(parts[:i]) for i in range(len(parts), 0, -1))
    return next((origins[h] for h in heads if h in origins), f"{SHIPPED}base.yaml")


def make_absolute(cfg: DictConfig, table: dict, origins: dict[str, str]) -> None:
    """Rewrite every input path key of `cfg` (in place; the keys of `table` with the PATH role, outputs aside)
    absolute by the rule of the layer that set it: a shipped recipe's against the repo, else the current directory."""
    for key, kind in path_keys(table).items():
        if kind == OUTPUT:
            continue
        value = plain(OmegaConf.select(cfg, key, default=None))
        shipped = origin_of(key, origins).startswith(SHIPPED)
        new = absolute(kind, value, REPO if shipped else Path.cwd(), shipped)
        if new != value:
            OmegaConf.update(cfg, key, new, merge=False)


def outputs_absolute(cfg: DictConfig, table: dict) -> None:
    """The OUTPUT-role keys of `table` in `cfg` made absolute in place, against the caller's directory, whoever set them."""
    for key, kind in path_keys(table).items():
        value = OmegaConf.select(cfg, key, default=None)
        if kind == OUTPUT and value:
            OmegaConf.update(cfg, key, str(Path(str(value)).expanduser().resolve()), merge=False)
