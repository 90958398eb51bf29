"""A Hub id's evaluation identity names the revision that is loaded. The user's hub cache holds the repo at commit A
(refs/main = A, as a download of some months ago left it); the Hub's main has moved on to B since (a new tokenizer,
chat template or weights). The identity (evals.identity.checkpoint_identity) and evaluate's loader
(evals.backends.HFBackend, its tokenizer included) must agree on the commit; offline, both are the cached A. The Hub
is a loopback server of the test's own that serves the tiny base at several commits, each told apart by a `variant`
key in its config.json, and records every path asked for."""
from __future__ import annotations

import hashlib
import json
import shutil
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


def loaded(**kw) -> str:
    """The variant of the model evaluate's HF backend loads for REPO, after its tokenizer loaded (both at one commit)."""
    from evals.backends import HFBackend

    backend = HFBackend(REPO, device="cpu", **kw)
    assert backend.tokenizer.chat_template
    return backend.model.config.variant


def test_the_identity_names_the_commit_of_main_that_is_loaded(moved_hub):
    from evals.identity import checkpoint_identity

    assert checkpoint_identity(REPO) == {"kind": "hub", "repo": REPO, "revision": B}
    assert loaded() == "b"


def test_the_hub_moving_between_identity_and_load_changes_neither(moved_hub):
    from evals.identity import checkpoint_identity

    assert checkpoint_identity(REPO)["revision"] == B
    moved_hub.main = C   # pushed meanwhile: this process keeps loading the commit its identity names
    assert loaded() == "b" and checkpoint_identity(REPO)["revision"] == B
    assert not [p for p in moved_hub.asked if f"/resolve/{C}/" in p]


def test_offline_both_are_the_cached_copy_and_nothing_is_asked(moved_hub, monkeypatch):
    from evals.identity import checkpoint_identity

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert checkpoint_identity(REPO)["revision"] == A
    assert loaded() == "a" and moved_hub.asked == []


def test_a_hub_that_cannot_answer_is_the_cached_copy(moved_hub, hub_at):   # noqa: F811 - the fixture imported above
    from evals.identity import checkpoint_identity

    with __import__("socket").socket() as closed:   # a port nobody listens on: refused at once
        closed.bind(("127.0.0.1", 0))
        hub_at(f"http://127.0.0.1:{closed.getsockname()[1]}")
    assert checkpoint_identity(REPO)["revision"] == A
    assert loaded() == "a"


def test_an_uncached_repo_the_hub_cannot_send_is_one_line(moved_hub, monkeypatch):
    from evals.errors import EvalError
    from evals.identity import checkpoint_identity

    shutil.rmtree(common.hub.hub_cache())
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert checkpoint_identity(REPO)["revision"] is None
    with pytest.raises(EvalError, match=rf"^ckpt={REPO}: not in the local Hugging Face cache .* and HF_HUB_OFFLINE=1$"):
        loaded()


def test_an_identity_taken_by_another_process_is_the_commit_evaluate_loads(moved_hub, tmp_path):
    """evaluate given the identity a plan or a data_parallel shard's parent took (at B) loads B, though this process's
    Hub now names C, and meta.json records B."""
    from evals.identity import checkpoint_identity
    from evals.run import evaluate
    from tests.test_evals_loop import make_world

    taken = checkpoint_identity(REPO)
    common.hub._ANSWERS.clear()   # another process: nothing asked yet
    moved_hub.main, moved_hub.asked[:] = C, []
    corpus, bench_root = make_world(tmp_path, n=1)
    evaluate({"ckpt": REPO, "benches": ["synthqa"], "n": 1, "bench_root": str(bench_root), "corpus": str(corpus),
              "index_dir": str(tmp_path / "idx"), "out": str(tmp_path / "out"), "max_new_tokens": 4, "max_turns": 1,
              "max_model_len": 512, "progress": False, "device": "cpu"}, ckpt_id=taken)
    assert json.loads((tmp_path / "out" / "meta.json").read_text())["checkpoint_identity"]["revision"] == B
    assert [p for p in moved_hub.asked if f"/resolve/{B}/model.safetensors" in p]
    assert not [p for p in moved_hub.asked if f"/resolve/{C}/" in p or "/resolve/main/" in p]


def test_vllms_engine_is_given_the_commit_of_the_model_and_its_tokenizer(moved_hub, monkeypatch):
    """backend=vllm's engine arguments (LLM's and AsyncEngineArgs'), built without vLLM: the model's and the tokenizer's
    revision are the identity's commit; a local dir's none."""
    from evals.backends import VLLMBackend
    from evals.identity import checkpoint_identity

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")   # (what engine_kwargs sets on a CPU host: undone after)
    engine = object.__new__(VLLMBackend)
    engine.seed, engine.settings = 0, {"dtype": "float32", "enforce_eager": True, "prefix_caching": True}
    assert checkpoint_identity(REPO)["revision"] == B
    moved_hub.main = C
    args = engine.engine_kwargs(REPO, None, 512, 1, "auto")
    assert (args["model"], args["revision"], args["tokenizer"], args["tokenizer_revision"]) == (REPO, B, REPO, B)
    args = engine.engine_kwargs(str(TINY_BASE_DIR), None, 512, 1, "auto")
    assert args["revision"] is None and args["tokenizer_revision"] is None
