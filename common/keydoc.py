"""Every command-line key's default and one-line description, said once, where the key is defined.

Two kinds of definition, one shape:
- a recipe YAML file (recipes/base.yaml, recipes/grpo/base.yaml): a key's description is the comment
  on its line, continued on comment-only lines whose `#` sits in the same column;
- a Python table `{dotted.key: (default, description)}` in a stage's config module, or
  `{dotted.key: Field}` (common.fields: the default and help of a typed field); `defaults` turns either
  into the nested defaults dict the CLI parses against.

Both give a list of `Key`; each CLI's `--help` prints `help_table(keys)` and the docs' key reference
pages are `markdown_table(keys)` (tools/docs_keys.py writes them; a test checks they are fresh).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from common.cli import flat_keys

_KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w-]*):(?P<rest>.*)$")


@dataclass(frozen=True)
class Key:
    name: str
    default: Any
    doc: str


def shown(value: Any) -> str:
    """A default as it is typed on the command line (YAML scalars: null, true, [a, b])."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, dict)):
        return json.dumps(value).replace('"', "")
    return str(value)


def _split_comment(rest: str) -> tuple[str, str | None, int]:
    """(value text, comment or None, comment's offset in `rest`) of what follows `key:`; a `#` inside quotes is text."""
    quote = None
    for i, ch in enumerate(rest):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or rest[i - 1] in " \t"):
            return rest[:i].strip(), rest[i + 1:].strip(), i
    return rest.strip(), None, -1


def yaml_comments(text: str) -> dict[str, str]:
    """dotted key -> the comment on its line (+ continuation lines), for block-style YAML mappings."""
    docs: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    last, last_col = None, -1
    for line in text.splitlines():
        stripped = line.lstrip(" ")
        if not stripped:
            continue
        if stripped.startswith("#"):
            col = len(line) - len(stripped)
            if last is not None and col == last_col:
                docs[last] = f"{docs[last]} {stripped[1:].strip()}".strip()
            else:
                last = None
            continue
        m = _KEY_LINE.match(line)
        if not m:
            last = None
            continue
        indent = len(m["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        full = ".".join([k for _, k in stack] + [m["key"]])
        value, comment, offset = _split_comment(m["rest"])
        if not value:
            stack.append((indent, m["key"]))
        if comment is not None:
            docs[full] = comment
            last, last_col = full, len(line) - len(m["rest"]) + offset
        else:
            last = None
    return docs


def from_yaml(path: Path, drop: tuple[str, ...] = ()) -> list[Key]:
    """The leaf keys of recipe `path` (minus those under `drop` prefixes), with defaults and line comments."""
    return from_config(OmegaConf.load(path), yaml_comments(Path(path).read_text(encoding="utf-8")), drop)


def from_config(cfg, docs: dict[str, str], drop: tuple[str, ...] = ()) -> list[Key]:
    """The leaf keys of a composed config (minus those under `drop` prefixes), described by `docs`."""
    keys = []
    for name in flat_keys(cfg):
        if name.startswith(drop) or name.startswith("_"):
            continue
        value = OmegaConf.select(cfg, name)
        value = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
        keys.append(Key(name, value, docs.get(name, "")))
    return keys


def _entry(entry) -> tuple[Any, str]:
    """(default, description) of a table entry: a pair, or a common.fields Field / Passed."""
    return entry if isinstance(entry, tuple) else (entry.default, entry.help)


def from_table(table: dict[str, Any]) -> list[Key]:
    return [Key(name, *_entry(entry)) for name, entry in table.items()]


def defaults(table: dict[str, Any]) -> dict[str, Any]:
    """The nested defaults dict of a `{dotted.key: (default, description) or Field}` table."""
    out: dict[str, Any] = {}
    for name, entry in table.items():
        default = _entry(entry)[0]
        node = out
        *parents, leaf = name.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = default
    return out


def help_table(keys: list[Key], indent: str = "  ") -> str:
    """`key = default  description` lines, aligned, for a CLI's --help."""
    left = [f"{k.name}={shown(k.default)}" for k in keys]
    width = min(max((len(x) for x in left), default=0), 44)
    return "\n".join(f"{indent}{x:<{width}}  {k.doc}".rstrip() for x, k in zip(left, keys))


def markdown_table(keys: list[Key]) -> str:
    rows = ["| key | default | description |", "| --- | --- | --- |"]
    for k in keys:
        doc = k.doc.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "&#124;")
        rows.append(f"| `{k.name}` | `{shown(k.default)}` | {doc} |")
    return "\n".join(rows)
