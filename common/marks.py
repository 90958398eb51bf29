"""Source marks (`MARK_GRAMMAR`, docs/studies.md): the comment that says where a setting of a shipped YAML file
comes from, a study's arguments and the recipes' settings alike: `[ref: NAME "quote"]` (a reference states it) or
`[chosen: reason]` (ours). `file_marks` reads a file's marks; tests/test_marks.py checks every quote against its reference."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from common.cli import ConfigError, did_you_mean

# The published reference descriptions a `[ref: NAME "quote"]` mark cites: short name -> the stem of the
# file holding its verbatim text (the tests check every quote against those texts; no code path reads them).
REFERENCES = {
    "spa-qwen3": "000_22b5f0c70c8f1d9b",        # Qwen3-4B GRPO on search_plan_act
    "browsecomp": "001_c801f41fe641ead1",       # Qwen3-4B BrowseComp worker RL checkpoint 129 (its export)
    "spa-llama": "002_4ccbda37e769810e",        # Llama-3.1-8B-Instruct GRPO on search_plan_act
    "dual-terminator": "003_cb6b241bff573a7e",  # dual-terminator SFT of Qwen3-4B-Thinking-2507
    "multihop": "004_6d4cea1d81f9c1b7",         # Qwen3-4B multi-hop QA, SFT then GRPO
}
MARK_GRAMMAR = '[ref: <reference> "<verbatim quote>"] or [chosen: <reason>]'
_MARK = re.compile(r'\[ref:[ \t]*(?P<ref>[\w-]+)[ \t]+"(?P<quote>[^"]+)"[ \t]*\]'
                   r"|\[chosen:[ \t]*(?P<reason>[^\]]*[^\]\s])[ \t]*\]")
_MARK_START = re.compile(r"\[(?:ref|chosen)\b")


class MarkError(ConfigError):
    """A malformed or misplaced source mark; the message names the file and line."""


def _last_line(node) -> int:
    """The last line (0-based) holding part of a YAML node: a flow collection ends at its bracket, a
    block one with its last child, a block scalar (`|`) on the line before its end mark."""
    if isinstance(node, yaml.ScalarNode):
        end = node.end_mark
        return end.line - 1 if end.column == 0 and end.line > node.start_mark.line else end.line
    if node.flow_style or not node.value:
        return node.end_mark.line
    children = node.value if isinstance(node, yaml.SequenceNode) else [n for kv in node.value for n in kv]
    return max(_last_line(c) for c in children)


@dataclass(frozen=True)
class Mark:
    """One source mark (`MARK_GRAMMAR`) on line `line` (1-based) of a file."""
    line: int
    kind: str                    # "ref" | "chosen"
    text: str                    # the verbatim quote (ref) or the reason (chosen)
    reference: str | None = None  # ref: a key of REFERENCES


@dataclass(frozen=True)
class MarkedSetting:
    """A setting of a YAML file and the marks on the lines it spans (its key's line to its value's end)."""
    key: str       # dotted (train.save_steps); a study's stage argument is STAGE:key (train:task)
    value: object  # as YAML reads it, unresolved (${vars.X} kept)
    marks: tuple[Mark, ...]


def line_marks(text: str, where: str, line: int) -> list[Mark]:
    """The marks on one line of file `where`; anything opening like a mark (`[ref`, `[chosen`) that is not
    one of the grammar, or a `[ref: NAME ...]` naming no reference, is refused with the file and line."""
    marks, end = [], 0
    for start in _MARK_START.finditer(text):
        if start.start() < end:
            continue   # inside the quote or reason of a mark already read
        m = _MARK.match(text, start.start())
        if m is None:
            close = text.find("]", start.start())
            found = text[start.start():close + 1 if close >= 0 else None].strip()
            raise MarkError(f"{where}:{line}: {found!r} is not a source mark: write {MARK_GRAMMAR} (a bare "
                             "[ref] or [chosen] says neither which reference states the value nor why it was chosen)")
        if m.group("ref") is not None and m.group("ref") not in REFERENCES:
            raise MarkError(f"{where}:{line}: [ref: {m.group('ref')} ...] names no reference; references: "
                             f"{', '.join(REFERENCES)}.{did_you_mean(m.group('ref'), REFERENCES)}")
        marks.append(Mark(line, "ref" if m.group("ref") else "chosen", m.group("quote") or m.group("reason"), m.group("ref")))
        end = m.end()
    return marks


def _settings(node, prefix: str = ""):
    """(key, first line, last line, value node) of every setting: each entry of a block mapping whose value
    is not itself a block mapping, and each argument of a study's stages (block or flow style)."""
    for k, v in node.value if isinstance(node, yaml.MappingNode) else []:
        key = f"{prefix}{k.value}"
        if key == "stages" and isinstance(v, yaml.SequenceNode):
            for stage in v.value:
                entries = stage.value if isinstance(stage, yaml.MappingNode) else []
                parts = {kn.value: vn for kn, vn in entries if isinstance(kn, yaml.ScalarNode)}
                args = parts.get("args")
                for ak, av in args.value if isinstance(args, yaml.MappingNode) else []:
                    yield f"{getattr(parts.get('name'), 'value', '?')}:{ak.value}", ak.start_mark.line, _last_line(av), av
        elif isinstance(v, yaml.MappingNode) and not v.flow_style and v.value:
            yield from _settings(v, f"{key}.")
        else:
            yield key, k.start_mark.line, _last_line(v), v


def file_marks(path: Path) -> tuple[list[MarkedSetting], list[str]]:
    """Every marked setting of a YAML file (a study or a recipe), in file order, and its stage argument lines (key to value's
    end) that hold more than a comment and no mark. A mark goes with the setting whose key is on its line, else with the
    one whose value spans it; one on a line holding no setting is refused (in prose it says nothing checkable)."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    try:
        settings = list(_settings(yaml.compose(text, Loader=yaml.SafeLoader)))
    except yaml.YAMLError:   # not readable YAML: no settings (load_study names the error)
        settings = []
    found: dict[int, list[Mark]] = {}
    for i, line in enumerate(lines):
        if marks := line_marks(line, str(path), i + 1):
            owner = next((s for s in settings if s[1] == i), None) or next((s for s in settings if s[1] <= i <= s[2]), None)
            if owner is None:
                raise MarkError(f"{path}:{i + 1}: a source mark on a line that holds no setting; marks go on the "
                                 f"setting's own line ({MARK_GRAMMAR})")
            found.setdefault(settings.index(owner), []).extend(marks)
    marked = [MarkedSetting(settings[n][0], yaml.SafeLoader("").construct_document(settings[n][3]), tuple(found[n]))
              for n in sorted(found)]
    bad: dict[int, str] = {}
    keys_on: dict[int, list[str]] = {}
    for key, first, last, _ in (s for s in settings if ":" in s[0]):
        keys_on.setdefault(first, []).append(key.partition(":")[2])
        for i in range(first, max(first, last) + 1):
            stripped = lines[i].strip()
            if stripped and not stripped.startswith("#") and not _MARK.search(lines[i]):
                bad.setdefault(i, f"line {i + 1}: {stripped}")
    for i, keys in keys_on.items():
        if len(keys) > 1 and i not in bad:
            bad[i] = (f"line {i + 1}: {len(keys)} arguments ({', '.join(keys)}) share one line, and one mark "
                      "cannot say where each comes from: put each on its own line")
    return marked, [bad[i] for i in sorted(bad)]
