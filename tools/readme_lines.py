"""Freeze the README's command lines (every line of its fenced code blocks) into tests/data/readme_lines.json.

    python tools/readme_lines.py [README]   # add the code-block lines of README (default README.md) to the fixture
                                            # (none removed; after a merge: `git show main:README.md > /tmp/r.md`)

tests/test_docs_blocks.py checks that each frozen line still appears in README.md or a docs/ page,
or is listed under "dropped" in the fixture with the reason it was dropped.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "data" / "readme_lines.json"
FENCE = re.compile(r"^\s*```")


def code_lines(text: str) -> list[str]:
    """The non-blank lines inside fenced code blocks, stripped, in order, each once."""
    out, inside = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            inside = not inside
            continue
        if inside and line.strip() and line.strip() not in out:
            out.append(line.strip())
    return out


def main(argv: list[str]) -> int:
    data = json.loads(FIXTURE.read_text(encoding="utf-8")) if FIXTURE.is_file() else {"lines": [], "dropped": {}}
    new = [x for x in code_lines(Path(argv[0] if argv else ROOT / "README.md").read_text(encoding="utf-8")) if x not in data["lines"]]
    data["lines"] += new
    FIXTURE.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{len(new)} new line(s); {len(data['lines'])} frozen")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
