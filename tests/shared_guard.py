"""The read-only guard for artefacts shared between tests (a pytest plugin: tests/conftest.py loads it).

Artefacts that many tests read and none may change: the committed tiny base and tokenizer, the test
data and snapshots, `../shared`, and the session-built fixtures registered with `shared.register`
(e.g. `tiny_model_dir`). A test that wrote into one would change what every later test reads (and,
under `pytest -n 2`, what the other worker is reading right now), so the write is caught where it
happens: a registered artefact is checked after every test that requested its fixture, the repository's
data dirs after every test module; a change is an error naming the test, the artefact and the files.

Running as root, file modes protect nothing, hence digests: a snapshot is each file's size, mtime and
sha256 (the names included, so an added or removed file counts); a check re-hashes only a file whose
size or mtime moved, so an untouched artefact costs a few `stat` calls.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("DTSFT_SHARED", ROOT.parent / "shared"))
# The repository's data that tests read in place (never a tmp copy).
REPO_ARTEFACTS = ("common/tiny_base", "common/tiny_tokenizer", "tests/data", "tests/snapshots")


def _files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    return sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def snapshot(root: Path) -> dict[str, tuple[int, int, str]]:
    """{relative name: (size, mtime_ns, sha256)} of every file under `root` (or of `root` itself)."""
    out = {}
    for p in _files(root):
        st = p.stat()
        out[str(p.relative_to(root)) if p != root else p.name] = (st.st_size, st.st_mtime_ns, _sha256(p))
    return out


def changes(root: Path, before: dict[str, tuple[int, int, str]]) -> list[str]:
    """What differs under `root` from `before`: added, removed and rewritten files, one line each."""
    now = {str(p.relative_to(root)) if p != root else p.name: p for p in _files(root)} if root.exists() else {}
    lines = [f"removed {name}" for name in sorted(set(before) - set(now))]
    lines += [f"added {name}" for name in sorted(set(now) - set(before))]
    for name in sorted(set(now) & set(before)):
        size, mtime, digest = before[name]
        st = now[name].stat()
        if (st.st_size, st.st_mtime_ns) != (size, mtime) and _sha256(now[name]) != digest:
            lines.append(f"rewrote {name}")
    return lines


class SharedArtefacts:
    """Artefacts under watch: `register(path, fixture)` snapshots one; `check(fixtures)` reports changes."""

    def __init__(self):
        self._watched: dict[Path, tuple[str | None, dict]] = {}

    def register(self, path: str | Path, fixture: str | None = None) -> Path:
        """Watch `path` (a dir or a file) from now on; `fixture`: the fixture whose users are checked
        after each test (None: checked after each test module). Returns the path."""
        path = Path(path)
        self._watched[path] = (fixture, snapshot(path))
        return path

    def check(self, fixtures: set[str] | None) -> list[str]:
        """Changes to the artefacts of `fixtures` (None: the module-level ones). A changed artefact is
        snapshotted again, so one write is reported once."""
        found = []
        for path, (fixture, before) in list(self._watched.items()):
            if (fixture is None) if fixtures is None else (fixture in fixtures):
                lines = changes(path, before)
                if lines:
                    found.append(f"{path}: " + "; ".join(lines[:10]) + (f"; ... {len(lines) - 10} more" if len(lines) > 10 else ""))
                    self._watched[path] = (fixture, snapshot(path))
        return found


_SHARED_ARTEFACTS = SharedArtefacts()


@pytest.fixture(scope="session")
def shared_artefacts() -> SharedArtefacts:
    """The guard: a session fixture that builds a read-only artefact registers it here."""
    return _SHARED_ARTEFACTS


@pytest.fixture(scope="session", autouse=True)
def _watch_repo_artefacts(shared_artefacts):
    for rel in REPO_ARTEFACTS:
        if (ROOT / rel).exists():
            shared_artefacts.register(ROOT / rel)
    if SHARED.is_dir():
        shared_artefacts.register(SHARED)


@pytest.fixture(scope="module", autouse=True)
def _repo_artefacts_unchanged(request, shared_artefacts):
    yield
    found = shared_artefacts.check(None)
    if found:
        pytest.fail(f"{request.node.nodeid} wrote into a read-only shared artefact (tests read it in place):\n"
                    + "\n".join(found), pytrace=False)


@pytest.fixture(autouse=True)
def _fixture_artefacts_unchanged(request, shared_artefacts):
    yield
    found = shared_artefacts.check(set(request.fixturenames))
    if found:
        pytest.fail(f"{request.node.nodeid} wrote into a read-only shared artefact (other tests read it; "
                    "a test that writes needs its own copy):\n" + "\n".join(found), pytrace=False)
