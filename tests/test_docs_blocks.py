"""The docs' own commands, run from their text: the one place README/docs commands are tested.

- Every runnable block in README.md or docs/**/*.md (a plain ```bash fence on the line right after the
  marker `<!-- runnable: cpu -->`, which renders as code on the site and on GitHub and is hidden there) is
  executed, the blocks of one page in order in one scratch directory (a later block may read what an
  earlier one wrote), with bash -euo pipefail and a timeout: a renamed key or a changed default fails here.
  tools/check_site.py (run by `make docs`) checks that each of them renders as code on the built site.
- Every line of the README's code blocks as frozen before the docs move (tests/data/readme_lines.json)
  still appears in the README or a docs page, or is listed as dropped with its reason.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
MARKER = "<!-- runnable: cpu -->"
BLOCK = re.compile(r"^<!-- runnable: cpu -->[ \t]*\n```bash[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
TIMEOUT_S = 300


def cpu_blocks(text: str) -> list[tuple[int, str]]:
    """(line number of the marker, body) of each runnable block."""
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in BLOCK.finditer(text)]


def run_block(body: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
               WANDB_MODE="disabled", PYTHONPATH=str(ROOT))
    return subprocess.run(["bash", "-euo", "pipefail", "-c", body], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S)


def _pages_with_blocks() -> list[Path]:
    return [p for p in PAGES if cpu_blocks(p.read_text(encoding="utf-8"))]


def test_there_are_runnable_blocks():
    assert {p.name for p in _pages_with_blocks()} >= {"getting-started.md", "data-prep.md", "launch.md"}


@pytest.mark.parametrize("page", _pages_with_blocks(), ids=lambda p: str(p.relative_to(ROOT)))
def test_cpu_blocks_run(page, tmp_path):
    for line, body in cpu_blocks(page.read_text(encoding="utf-8")):
        proc = run_block(body, tmp_path)
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
        assert proc.returncode == 0, f"{page.relative_to(ROOT)}:{line}: exit {proc.returncode}\n" + "\n".join(tail)


def test_a_block_with_a_renamed_key_fails(tmp_path):
    """The runner reports a broken command: one key renamed in an otherwise good block."""
    text = f"{MARKER}\n```bash\ndata-prep arm=mixed tokenizer=tiny out=m data=synthetic nn=8\n```\n"
    [(line, body)] = cpu_blocks(text)
    proc = run_block(body, tmp_path)
    assert line == 1 and proc.returncode == 2 and "unknown key 'nn'" in proc.stderr


def test_frozen_readme_lines_are_kept_or_dropped_with_a_reason():
    fixture = json.loads((ROOT / "tests" / "data" / "readme_lines.json").read_text(encoding="utf-8"))
    corpus = "\n".join(" ".join(line.split()) for p in PAGES for line in p.read_text(encoding="utf-8").splitlines())
    dropped = fixture["dropped"]
    assert all(reason.strip() for reason in dropped.values()), "a dropped line needs its reason"
    lost = [x for x in fixture["lines"] if x not in dropped and " ".join(x.split()) not in corpus]
    assert not lost, "README command lines in no page and not dropped with a reason:\n" + "\n".join(lost)
