"""The read-only guard (tests/shared_guard.py): a test that writes into a shared artefact is an error
naming the test and the files; a test that only reads passes."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.shared_guard import SharedArtefacts

ROOT = Path(__file__).resolve().parents[1]


def test_changes_are_reported_once_and_a_same_content_rewrite_is_not_a_change(tmp_path):
    art = tmp_path / "model"
    art.mkdir()
    (art / "a.bin").write_bytes(b"weights")
    (art / "b.json").write_text("{}")
    guard = SharedArtefacts()
    guard.register(art, "model")
    assert guard.check({"model"}) == []
    (art / "b.json").write_text("{}")            # touched, same bytes
    assert guard.check({"model"}) == []
    (art / "a.bin").write_bytes(b"WEIGHTS")
    (art / "c.txt").write_text("new")
    (art / "b.json").unlink()
    assert guard.check({"other"}) == [] and guard.check(None) == []   # only the fixture's users are checked
    [found] = guard.check({"model"})
    assert found == f"{art}: removed b.json; added c.txt; rewrote a.bin"
    assert guard.check({"model"}) == []           # reported once


INNER = '''
import pytest

@pytest.fixture(scope="session")
def built(tmp_path_factory, shared_artefacts):
    d = tmp_path_factory.mktemp("built")
    (d / "data.txt").write_text("original")
    return shared_artefacts.register(d, "built")

@pytest.fixture(scope="session")
def everyones(tmp_path_factory, shared_artefacts):
    d = tmp_path_factory.mktemp("everyones")
    (d / "x.txt").write_text("x")
    return shared_artefacts.register(d)

def test_reads(built):
    assert (built / "data.txt").read_text() == "original"

def test_writes(built):
    (built / "data.txt").write_text("changed")

def test_reads_after(built):
    assert (built / "data.txt").read_text() == "changed"

def test_writes_a_module_level_artefact(everyones):
    (everyones / "y.txt").write_text("y")
'''


def test_a_write_into_a_shared_artefact_fails_the_test_that_wrote(tmp_path):
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(INNER))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.shared_guard", "-p", "no:cacheprovider",
                           str(tmp_path / "test_inner.py")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "ERROR at teardown of test_writes " in out and "test_inner.py::test_writes wrote into a read-only shared artefact" in out, out
    assert "rewrote data.txt" in out, out
    assert "test_inner.py wrote into a read-only shared artefact" in out and "added y.txt" in out, out
    assert "4 passed, 2 errors" in out, out
