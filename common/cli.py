"""The command-line convention shared by every dtsft CLI.

Every command takes omegaconf dotlist overrides (`key=value`, lists as `[a,b]`)
applied on top of a defaults config. Unknown keys are errors that name the key,
list the valid ones and suggest the closest match.
"""
from __future__ import annotations

import difflib
import json
import re
import sys
from pathlib import Path
from typing import Any, Iterable

import yaml
from omegaconf import DictConfig, OmegaConf


class ConfigError(ValueError):
    """A bad key or value on the command line or in a recipe."""


def shown(value: Any, dotlist: bool = False, item: bool = False) -> str:
    """A value as it is typed on the command line (YAML: null, true, [a, b], {k: v}); `dotlist`: as an omegaconf
    dotlist value, without spaces but a mapping's colon's, which YAML needs ([a,b], {k: v})."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if dotlist and isinstance(value, str):   # a text the dotlist reads otherwise ('5', 'x # y', an `item`'s 'a, b'): JSON-quoted
        try:
            read = OmegaConf.to_container(OmegaConf.from_dotlist([f"v=[{value}]" if item else f"v={value}"]), resolve=False)["v"]
            kept = read == ([value] if item else value)
        except Exception:   # omegaconf raises several types for a bad value
            kept = False
        return value if kept else json.dumps(value, ensure_ascii=False)
    space = "" if dotlist else " "
    if isinstance(value, (list, tuple)):
        return "[" + f",{space}".join(shown(x, dotlist, True) for x in value) + "]"
    if isinstance(value, dict):
        return "{" + f",{space}".join(f"{k}: {shown(x, dotlist, True)}" for k, x in value.items()) + "}"
    return str(value)


def flat_keys(cfg: DictConfig, prefix: str = "") -> list[str]:
    """All leaf keys of `cfg` in dotted form (`train.lr`, ...)."""
    keys: list[str] = []
    for k in cfg.keys():
        node = cfg._get_node(k)
        full = f"{prefix}{k}"
        if isinstance(node, DictConfig) and not node._is_none() and len(node) > 0:
            keys.extend(flat_keys(node, full + "."))
        else:
            keys.append(full)
    return keys


def did_you_mean(key: str, valid: Iterable[str]) -> str:
    valid = list(valid)
    # A key given without its section (max_new_tokens for eval.max_new_tokens) is that key; else match the
    # full key, and the last component against the last components.
    leaf = key.rsplit(".", 1)[-1]
    close = [v for v in valid if v != key and v.rsplit(".", 1)[-1] == leaf][:3]
    close = close or difflib.get_close_matches(key, valid, n=3, cutoff=0.6)
    if not close:
        tails = {v.rsplit(".", 1)[-1]: v for v in valid}
        close = [tails[t] for t in difflib.get_close_matches(key.rsplit(".", 1)[-1], list(tails), n=3, cutoff=0.6)]
    return f" Did you mean: {', '.join(close)}?" if close else ""


class KeySpace:
    """The keys a config accepts: its leaf keys, any sub-tree they sit in (`sources.code`), and
    anything under `open_prefixes` (free-form sections such as `model.config.`)."""

    def __init__(self, base: DictConfig, open_prefixes: tuple[str, ...] = ()):
        self.leaves = set(flat_keys(base))
        self.subtrees = {k.rsplit(".", i)[0] for k in self.leaves for i in range(1, k.count(".") + 1)}
        self.open_prefixes = open_prefixes

    def __contains__(self, key: str) -> bool:
        return key in self.leaves or key in self.subtrees or any(key.startswith(p) for p in self.open_prefixes)


def split_dotlist(argv: list[str]) -> list[tuple[str, str]]:
    """Split `key=value` tokens; anything else is an error naming the token."""
    pairs = []
    for tok in argv:
        if "=" not in tok or tok.startswith("="):
            raise ConfigError(f"expected key=value, got {tok!r}")
        k, v = tok.split("=", 1)
        pairs.append((k.strip(), v))
    return pairs


# YAML 1.1's base-60 numbers (24:00:00 would read as 86400): a value of this form is kept as its text (a Slurm time).
_BASE60 = re.compile(r"[-+]?\d[\d_]*(?::[0-5]?\d)+(?:\.[\d_]*)?")
SWITCH_WORDS = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}
SWITCHES = ("dry_run",)   # keys (the last part of a dotted key: launch's launcher.dry_run) read by parse_switch


def parse_switch(value, key: str) -> bool:
    """A true/false switch as every command reads it (`dry_run`): true/false, 1/0, yes/no, on/off in any
    case (a bool is itself); anything else is a ConfigError naming `key`, so a misspelt switch never
    silently means one thing to one command and another to the next."""
    if isinstance(value, bool):
        return value
    word = str(value).strip().strip("'\"").lower()
    if word not in SWITCH_WORDS:
        raise ConfigError(f"{key}={value}: expected true or false (also 1/0, yes/no, on/off)")
    return SWITCH_WORDS[word]


def merge(cfg: DictConfig, layer: DictConfig, where: str = "", keys: Iterable[str] = ()) -> DictConfig:
    """`cfg` <- `layer`, in place (both are the caller's own copies: `layer` is used up, nothing deep-copied); a mapping
    given where `cfg` holds a list, or the reverse, is one line naming the key (of `keys`, else of the layer's leaf keys)."""
    try:
        return OmegaConf.unsafe_merge(cfg, layer)
    except TypeError:   # omegaconf's "Cannot merge incompatible container types"
        for key in keys or flat_keys(layer):
            if OmegaConf.is_config(base := OmegaConf.select(cfg, key)) and OmegaConf.is_list(base) != OmegaConf.is_list(got := OmegaConf.select(layer, key)):
                want = ("a list", "a mapping") if OmegaConf.is_list(base) else ("a mapping", "a list")
                raise ConfigError(f"{where}{key}={shown(OmegaConf.to_container(got), dotlist=True)}: expected {want[0]}, not {want[1]}") from None
        raise


def load_mapping(path, error: type[Exception], not_yaml: str, not_mapping: str, missing: str = "no such file",
                 hint: str = "") -> DictConfig:
    """The mapping YAML file `path` holds, else one line as `error`: `PATH: {missing}{hint}` (or a directory),
    `PATH: {not_yaml} (the parser's words)` or `PATH: {not_mapping}`."""
    if not Path(path).is_file():
        raise error(f"{path}: {'a directory, not a config file' if Path(path).is_dir() else missing}{hint}")
    try:
        cfg = OmegaConf.load(path)
    except Exception as exc:   # omegaconf and yaml raise several types for a torn file; theirs span lines
        raise error(f"{path}: {not_yaml} ({' '.join(str(exc).split())})") from None
    if not isinstance(cfg, DictConfig):
        raise error(f"{path}: {not_mapping}")
    return cfg


def base60_problem(path) -> str | None:
    """`FILE:LINE: ...` for an unquoted value of YAML file `path` that YAML 1.1 reads as a base-60 number (24:00:00 as
    86400: as a Slurm time, 60 days), asking for quotes; None when there is none (or no YAML: its reader says why)."""
    try:
        todo = [yaml.compose(Path(path).read_text(encoding="utf-8"), Loader=yaml.SafeLoader)]
    except (OSError, ValueError, yaml.YAMLError):
        return None
    while todo:
        node = todo.pop()
        if isinstance(node, yaml.ScalarNode) and not node.style and ":" in node.value and node.tag.endswith(("int", "float")):
            return f"{path}:{node.start_mark.line + 1}: YAML reads {node.value} as a base-60 number: quote it ('{node.value}')"
        todo += [n for item in node.value for n in (item if isinstance(item, tuple) else (item,))] if isinstance(node, yaml.CollectionNode) else []
    return None


def apply_overrides(
    base: DictConfig,
    argv: list[str],
    aliases: dict[str, str] | None = None,
    open_prefixes: tuple[str, ...] = (),
    suggest: Iterable[str] = (),
    in_place: bool = False,
) -> DictConfig:
    """Apply dotlist overrides to `base` (a copy of it; `in_place`: `base` itself), rejecting keys `base` doesn't have.

    `aliases` maps short top-level names to their full key (e.g. `lr` -> `train.lr`).
    Keys under `open_prefixes` (e.g. free-form `model.config.`) may be new; `suggest`: further keys an
    unknown one may be a misspelling of (the keys of an open section that another command defines).
    """
    aliases = aliases or {}
    known = KeySpace(base, open_prefixes)
    cfg = base if in_place else base.copy()
    for given, value in split_dotlist(argv):
        key = aliases.get(given, given)
        if key not in known:
            shown = sorted(known.leaves | set(aliases))
            raise ConfigError(
                f"unknown key {key!r}.{did_you_mean(key, [*shown, *suggest])}\nValid keys: {', '.join(shown)}"
            )
        if key.rsplit(".", 1)[-1] in SWITCHES:
            value = str(parse_switch(value, given)).lower()
        elif _BASE60.fullmatch(value.strip()):
            value = f"'{value.strip()}'"
        try:
            parsed = OmegaConf.from_dotlist([f"{key}={value}"])
        except Exception as exc:  # omegaconf raises several types for bad values
            raise ConfigError(f"bad value for {key!r}: {value!r} ({exc})") from exc
        cfg = merge(cfg, parsed, keys=[key])
        if key in known.subtrees and key not in known.leaves and not isinstance(OmegaConf.select(parsed, key), DictConfig):
            keys = sorted(k for k in known.leaves if k.startswith(f"{key}."))
            raise ConfigError(f"{given}={value}: {key} is a section: give {key}.KEY=VALUE ({', '.join(keys)})")
    return cfg


def wants_help(argv: list[str]) -> bool:
    return any(a in ("-h", "--help", "help") for a in argv)


def run_cli(main_fn, argv: list[str] | None = None) -> int:
    """Run `main_fn(argv)`, turning ConfigError into a one-line message + exit 2."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        return int(main_fn(argv) or 0)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
