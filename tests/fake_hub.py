"""A loopback Hugging Face Hub that serves the tiny base as one repo at several commits (each told apart by a
`variant` key in its config.json) and records every path asked for, with a hub cache holding an older commit as
main: the world of a Hub id whose main moved since it was cached (tests/test_hub_revision.py for evaluate,
tests/test_train_hub_revision.py for the trainers)."""
from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import common.hub
from common.tiny import TINY_BASE_DIR
from tests.test_hub_check_once import hub_at  # noqa: F401 - the fixture

REPO = "someorg/tiny-chat"
A, B, C = ("a" * 40, "b" * 40, "c" * 40)


def commit_files(variant: str) -> dict[str, bytes]:
    """The tiny base's files (no generation_config.json: some repos have none) with config.json marked `variant`."""
    files = {p.name: p.read_bytes() for p in TINY_BASE_DIR.iterdir() if p.name != "generation_config.json"}
    files["config.json"] = json.dumps({**json.loads(files["config.json"]), "variant": variant}).encode()
    return files


class Hub(BaseHTTPRequestHandler):
    """`/REPO/resolve/REV/FILE` of the commits in `commits` (REV: a commit, or main = `main`), and an empty listing of
    any folder (`/api/models/REPO/tree/REV/DIR`: transformers' look for extra chat templates); 404 otherwise (with the
    commit's header for a missing file, as the Hub sends it)."""
    commits: dict[str, dict[str, bytes]] = {}
    main = B
    asked: list[str] = []

    def answer(self, body: bool) -> None:
        self.asked.append(self.path)
        path = self.path.split("?")[0]
        files, listing = path.startswith(f"/{REPO}/resolve/"), path.startswith(f"/api/models/{REPO}/tree/")
        rev, _, name = path.split("/resolve/" if files else "/tree/", 1)[-1].partition("/")
        commit = self.main if rev == "main" else rev
        data = self.commits.get(commit, {}).get(name) if files else b"[]" if listing and commit in self.commits else None
        self.send_response(200 if data is not None else 404)
        if commit in self.commits:
            self.send_header("X-Repo-Commit", commit)
        if data is None:
            self.send_header("X-Error-Code", "EntryNotFound" if commit in self.commits else "RepoNotFound")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def do_HEAD(self):
        self.answer(False)

    def do_GET(self):
        self.answer(True)

    def log_message(self, *args):
        pass


@pytest.fixture
def moved_hub(hub_at, monkeypatch):   # noqa: F811 - the fixture imported above
    """The Hub serving commits A, B and C of REPO with main at B; the hub cache holding A as main."""
    import transformers.utils.hub

    monkeypatch.setattr(transformers.utils.hub, "_hf_api", None)   # (its HfApi keeps the endpoint it was made with)
    monkeypatch.setattr(Hub, "commits", {c: commit_files(c[0]) for c in (A, B, C)})
    monkeypatch.setattr(Hub, "main", B)
    monkeypatch.setattr(Hub, "asked", [])
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    hub_at(f"http://127.0.0.1:{server.server_address[1]}")
    repo = common.hub.hub_cache() / f"models--{REPO.replace('/', '--')}"
    (repo / "snapshots" / A).mkdir(parents=True)
    for name, data in Hub.commits[A].items():
        (repo / "snapshots" / A / name).write_bytes(data)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(A)
    yield Hub
    server.shutdown()
    server.server_close()
