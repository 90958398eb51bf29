"""The docs' key tables and each CLI's --help come from one source per key (common.fields).

- every key of every command has a one-line description;
- docs/keys/*.md are what tools/docs_keys.py writes from the sources now (a changed default or
  description without regenerating fails here);
- each command's --help prints every key with the same default and description as its page.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import docs_keys  # noqa: E402


def _page_rows(text: str) -> list[tuple[str, str, str]]:
    rows = []
    for line in text.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows.append((cells[0].strip("`"), cells[1].strip("`"), cells[2]))
    return rows


def test_every_key_has_a_description():
    for name, text in docs_keys.pages().items():
        missing = [k for k, _, doc in _page_rows(text) if not doc]
        assert not missing, f"{name}: keys without a description: {missing}"


def test_generated_key_pages_are_fresh():
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "docs_keys.py"), "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_fresh_check_catches_a_changed_default(tmp_path, monkeypatch):
    """A field's default edited without regenerating makes the committed page stale."""
    import dataclasses

    from sft.config import SFT

    page = (ROOT / "docs" / "keys" / "launch.md").read_text(encoding="utf-8")
    assert "| `train.lr` | `1e-05` |" in page
    monkeypatch.setitem(SFT, "train.lr", dataclasses.replace(SFT["train.lr"], default=2.0e-5))
    assert docs_keys.pages()["launch.md"] != page


CLIS = {
    "launch.md": ["-m", "launch.cli"],
    "grpo.md": ["-m", "launch.cli", "stage=grpo"],
    "data-prep.md": ["-m", "data_prep.cli"],
    "evaluate.md": ["-m", "evals.cli"],
    "analyze.md": ["-m", "launch.analyze"],
    "export-checkpoint.md": ["-c", "import sys; from sft.export import export_main; sys.exit(export_main())"],
    "verify-checkpoint.md": ["-c", "import sys; from sft.verify import verify_main; sys.exit(verify_main())"],
    "serve-retriever.md": ["-c", "import sys; from evals.server import main; sys.exit(main())"],
    "fetch-data.md": ["-m", "common.datafetch"],
}


@pytest.mark.parametrize("page", sorted(CLIS))
def test_help_shows_the_pages_keys_defaults_and_descriptions(page):
    out = subprocess.run([sys.executable, *CLIS[page], "--help"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    help_lines = [" ".join(line.split()) for line in out.stdout.splitlines()]
    text = (ROOT / "docs" / "keys" / page).read_text(encoding="utf-8")
    for key, default, doc in _page_rows(text):
        doc = doc.replace("&#124;", "|").replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
        want = " ".join(f"{key}={default} {doc}".split())
        assert any(line == want for line in help_lines), f"{page}: --help lacks {want!r}"
