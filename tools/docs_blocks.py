"""The docs' runnable blocks and README's activation line, as text: the one parser tests/test_docs_blocks.py
and tools/newcomer_walk.py share.

A runnable block is a plain ```bash fence on the line right after the marker `<!-- runnable: cpu -->`; the
activation line is the one README.md's set-up gives to put the console scripts on PATH (`. .venv/bin/activate`).
Standard library only.
"""
from __future__ import annotations

import re

MARKER = "<!-- runnable: cpu -->"
BLOCK = re.compile(r"^<!-- runnable: cpu -->[ \t]*\n```bash[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
ACTIVATE = re.compile(r"^(\. \.venv/bin/activate)(?=\s|$)", re.M)


def cpu_blocks(text: str) -> list[tuple[int, str]]:
    """(line number of the marker, body) of each runnable block."""
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in BLOCK.finditer(text)]


def activation_line(readme_text: str) -> str | None:
    """README's line that activates .venv, None when its set-up gives none."""
    m = ACTIVATE.search(readme_text)
    return m.group(1) if m else None


def setup_command(readme_text: str, target: str) -> str | None:
    """The command of README's set-up line `make TARGET   # ...` (its comment dropped), None when there is none."""
    m = re.search(rf"^(make {re.escape(target)})[ \t]*(?:#.*)?$", readme_text, re.M)
    return m.group(1) if m else None
