"""A command's keys as text, from its `{dotted.key: Field}` table (common.fields): the nested defaults the CLI parses
against and a CLI's `--help` lines (tools/docs_keys.py writes the same as docs/keys/*.md pages)."""
from __future__ import annotations

import json
from typing import Any

from omegaconf import OmegaConf


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


def defaults(table: dict[str, Any]) -> dict[str, Any]:
    """The nested defaults dict of a `{dotted.key: Field}` table."""
    out: dict[str, Any] = {}
    for name, entry in table.items():
        *parents, leaf = name.split(".")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = entry.default
    return out


def help_table(table: dict[str, Any], indent: str = "  ") -> str:
    """`key=default  description` lines of a `{dotted.key: Field}` table (a Field or Default each), aligned, for a CLI's --help."""
    left = [f"{name}={shown(entry.default)}" for name, entry in table.items()]
    width = min(max((len(x) for x in left), default=0), 44)
    return "\n".join(f"{indent}{x:<{width}}  {entry.help}".rstrip() for x, entry in zip(left, table.values()))

