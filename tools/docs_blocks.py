"""The docs' runnable blocks and README's activation line, as text: the one parser tests/test_docs_blocks.py
and tools/newcomer_walk.py share.

A runnable block is a plain ```bash fence on the line right after the marker `<!-- runnable: cpu -->`; the
block must exit 0. A block marked `<!-- runnable: cpu, stops-at: preflight -->` is a GPU study's dry run shown
on a CPU: it runs the same way and must stop at the study's preflight (launch/preflight.py), that is exit 2
with each of its lines `error: preflight: ...` and its count line printed, and no other error. The activation
line is the one README.md's set-up gives to put the console scripts on PATH (`. .venv/bin/activate`).
Standard library only.
"""
from __future__ import annotations

import re

MARKER = "<!-- runnable: cpu -->"
STOPS = {"preflight"}   # the places a runnable block may be expected to stop at
MARKER_RE = re.compile(r"^<!-- runnable: cpu(?:, stops-at: (?P<stop>[a-z-]+))? -->$")
BLOCK = re.compile(r"^<!-- runnable: cpu(?:, stops-at: (?P<stop>[a-z-]+))? -->[ \t]*\n```bash[ \t]*\n(?P<body>.*?)^```[ \t]*$",
                   re.M | re.S)
ACTIVATE = re.compile(r"^(\. \.venv/bin/activate)(?=\s|$)", re.M)


def is_marker(line: str) -> bool:
    """Whether `line` (stripped) is a runnable block's marker, with or without its `stops-at:`."""
    return bool(MARKER_RE.match(line.strip()))


def cpu_blocks(text: str) -> list[tuple[int, str, str | None]]:
    """(line number of the marker, body, where it is expected to stop: None for exit 0) of each runnable block."""
    return [(text.count("\n", 0, m.start()) + 1, m["body"], m["stop"]) for m in BLOCK.finditer(text)]


def outcome_problem(stop: str | None, returncode: int, stderr: str) -> str | None:
    """Why a runnable block's run is not what its marker expects (None: it is)."""
    if stop is None:
        return None if returncode == 0 else f"exit {returncode}"
    if stop not in STOPS:
        return f"stops-at: {stop} is not a place a block may stop at ({', '.join(sorted(STOPS))})"
    errors = [x for x in stderr.splitlines() if x.startswith("error:")]
    lines = [x for x in errors if x.startswith("error: preflight: ")]
    count = re.search(r"^preflight: (\d+) problem\(s\)", stderr, re.M)
    if returncode != 2 or not lines or not count or int(count[1]) != len(lines) or len(errors) != len(lines):
        return (f"exit {returncode}, {len(lines)} preflight line(s) of {len(errors)} error line(s), "
                f"count line {'`' + count[0] + '`' if count else 'absent'}: expected to stop at the preflight "
                "(exit 2, its lines and its count, no other error)")
    return None


def activation_line(readme_text: str) -> str | None:
    """README's line that activates .venv, None when its set-up gives none."""
    m = ACTIVATE.search(readme_text)
    return m.group(1) if m else None


def setup_command(readme_text: str, target: str) -> str | None:
    """The command of README's set-up line `make TARGET   # ...` (its comment dropped), None when there is none."""
    m = re.search(rf"^(make {re.escape(target)})[ \t]*(?:#.*)?$", readme_text, re.M)
    return m.group(1) if m else None
