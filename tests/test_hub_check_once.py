"""The Hub check before a load (common.hub) asks the Hub once per process for one repo: a trainer's start checks
`model.tokenizer`, then `model.path` for its config, its weights and its generation config, often one repo id.
Against a Hub that accepts connections and never answers, each check waited for huggingface_hub's timeout (10 s):
~40 s before a cached copy loaded. The Hubs here are loopback servers of the test's own: a silent one (a listening
socket nobody accepts on; the requests wait in the kernel and are counted after the checks, so nothing races) and
one that answers 404 to everything (a Hub that answers: the repo lacks the file)."""
from __future__ import annotations

import re
import shutil
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import huggingface_hub.constants as hub_constants
import pytest

import common.hub
from common.tiny import TINY_BASE_DIR

REQUEST_LINE = re.compile(rb"^[A-Z]+ /\S* HTTP/1\.[01]\r$", re.M)


@pytest.fixture
def hub_at(monkeypatch, tmp_path):
    """Point huggingface_hub at a loopback endpoint as HF_ENDPOINT does at its import, with a 1 s request timeout
    (HF_HUB_ETAG_TIMEOUT's), online, without telemetry (the first request of a process would fetch huggingface_hub's
    agent registry from the endpoint first), and a hub cache of this test's own."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub_constants, "HF_HUB_ETAG_TIMEOUT", 1)
    monkeypatch.setattr(hub_constants, "HF_HUB_DISABLE_TELEMETRY", True)   # (its agent registry's own request, 3 s)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))

    def point(url: str) -> None:
        monkeypatch.setattr(hub_constants, "ENDPOINT", url)
        monkeypatch.setattr(hub_constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")
    return point


@pytest.fixture
def silent_hub(hub_at):
    """A Hub that accepts connections (the kernel's backlog) and never answers; `.requests()` takes the connections
    made so far out of the backlog and counts the HTTP requests they carry."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(64)
        hub_at(f"http://127.0.0.1:{srv.getsockname()[1]}")

        def requests() -> int:
            srv.setblocking(False)
            seen = 0
            while True:
                try:
                    conn, _ = srv.accept()
                except BlockingIOError:
                    return seen
                with conn:
                    conn.setblocking(False)
                    data = b""
                    while True:
                        try:
                            chunk = conn.recv(65536)
                        except BlockingIOError:
                            break
                        if not chunk:
                            break
                        data += chunk
                    seen += len(REQUEST_LINE.findall(data))
        yield SimpleNamespace(requests=requests)


def cache_tiny_base(repo_id: str) -> None:
    """A copy of the tiny base in the hub cache under `repo_id`, as a download leaves it (no generation_config.json)."""
    repo = common.hub.hub_cache() / f"models--{repo_id.replace('/', '--')}"
    shutil.copytree(TINY_BASE_DIR, repo / "snapshots" / ("0" * 40), ignore=shutil.ignore_patterns("generation_config.json"))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)


def test_a_trainer_start_asks_a_silent_hub_once(silent_hub):
    """The SFT trainer's start checks of one cached repo (its tokenizer, config and generation config; build_model's
    weights are one more check of the same kind, left out: their first load takes ~20 s on a busy CPU): one request,
    then the cached copy; an uncached repo's failure is remembered (its next check is the same line, no request)."""
    from sft.checkpoint import generation_config_for
    from sft.errors import SftError
    from sft.model import load_tokenizer, model_config

    cache_tiny_base("nobody/cached-model")
    cfg = SimpleNamespace(seed=0, model=SimpleNamespace(path="nobody/cached-model", config={}, init="pretrained"))
    assert len(load_tokenizer(cfg.model.path)) == 4096
    conf = model_config(cfg, "sdpa")
    assert generation_config_for(cfg.model.path, conf).eos_token_id == [conf.eos_token_id]
    assert silent_hub.requests() == 1
    lines = []
    for _ in range(3):
        with pytest.raises(SftError, match=r"^model\.path=nobody/no-model: not in the local Hugging Face cache .* and the "
                                           r"Hugging Face Hub is unreachable \(ReadTimeout") as err:
            model_config(SimpleNamespace(seed=0, model=SimpleNamespace(path="nobody/no-model", config={})), "sdpa")
        lines.append(str(err.value))
    assert len(set(lines)) == 1 and silent_hub.requests() == 1


class NotFound(BaseHTTPRequestHandler):
    """Every request: 404 (the repo has no such file), counted before the answer is sent."""
    asked: list[str] = []

    def do_HEAD(self):
        self.asked.append(self.path)
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD

    def log_message(self, *args):
        pass


def test_a_hub_that_answers_is_asked_once_per_repo(hub_at, monkeypatch):
    """Reachable is remembered per repo (whatever file each check names); another repo, revision or endpoint asks
    again; HF_HUB_OFFLINE=1 asks nothing."""
    monkeypatch.setattr(NotFound, "asked", [])
    server = ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        hub_at(f"http://127.0.0.1:{server.server_address[1]}")
        for filename in ("tokenizer_config.json", "config.json", "config.json", "generation_config.json"):
            assert common.hub.local_only("nobody/some-model", "model.path", filename=filename) is False
        assert NotFound.asked == ["/nobody/some-model/resolve/main/tokenizer_config.json"]
        assert common.hub.hub_unreachable("nobody/other-model", "config.json") is None
        assert common.hub.hub_unreachable("nobody/some-model", "config.json", revision="v1") is None
        assert len(NotFound.asked) == 3
        hub_at(f"http://localhost:{server.server_address[1]}")   # the same server under another endpoint
        assert common.hub.hub_unreachable("nobody/some-model", "config.json") is None
        assert len(NotFound.asked) == 4
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        assert common.hub.hub_unreachable("nobody/third-model") == "HF_HUB_OFFLINE=1"
        assert len(NotFound.asked) == 4
    finally:
        server.shutdown()
        server.server_close()
