"""A Hub id's evaluation identity names the revision that is loaded. The user's hub cache holds the repo at commit A
(refs/main = A, as a download of some months ago left it); the Hub's main has moved on to B since (a new tokenizer,
chat template or weights). The identity (evals.identity.checkpoint_identity) and evaluate's loader
(evals.backends.HFBackend, its tokenizer included) must agree on the commit; offline, both are the cached A. The Hub
is tests/fake_hub.py's loopback server."""
from __future__ import annotations

import json
import shutil

import pytest

import common.hub
from common.tiny import TINY_BASE_DIR
from tests import fake_hub
from tests.fake_hub import A, B, C, REPO
from tests.test_hub_check_once import hub_at  # noqa: F401 - the fixture

moved_hub = fake_hub.moved_hub   # the fixture: REPO on a loopback Hub, main at B, the hub cache's copy at A


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


def test_a_commit_held_from_another_process_still_asks_whether_the_hub_answers(moved_hub, hub_at):   # noqa: F811
    """evaluate given the identity another process took (analyze's plan on a login node), run where the Hub refuses
    connections and HF_HUB_OFFLINE is unset (many clusters' compute nodes): the held commit is read from the cache at
    once (local_files_only), not through huggingface_hub's retries of every file (seen: holding the commit marked the
    Hub as answering, so local_only said False)."""
    from evals.identity import checkpoint_identity

    taken = checkpoint_identity(REPO)
    assert loaded() == "b"   # (B's files in the cache now, as the plan's node left them)
    common.hub._ANSWERS.clear()   # another process: nothing asked yet
    with __import__("socket").socket() as closed:   # a port nobody listens on: refused at once
        closed.bind(("127.0.0.1", 0))
        hub_at(f"http://127.0.0.1:{closed.getsockname()[1]}")
    common.hub.hold(REPO, taken["revision"])
    assert common.hub.local_only(REPO, "ckpt") is True
    assert common.hub.hub_revision(REPO) == B


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
