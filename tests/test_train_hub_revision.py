"""The SFT trainer loads a Hub-id base at one commit and records it. The hub cache holds REPO at A, the Hub's main is
at B (tests/fake_hub.py's loopback Hub): a start loads B, model and tokenizer, and the run records B (the run dir's
manifest.json, each state's meta.json, DONE); a resume after main moved on to C loads the B its start recorded, and
says that main moved."""
from __future__ import annotations

import json
import logging
import shutil

import common.hub
from tests import fake_hub
import pytest

from tests.fake_hub import A, B, C, REPO
from tests.sft_helpers import make_dataset_dir, write_config
from tests.test_hub_check_once import hub_at  # noqa: F401 - the fixture

moved_hub = fake_hub.moved_hub   # the fixture: REPO on a loopback Hub, main at B, the hub cache's copy at A

BASE = {"model.path": {"repo": REPO, "revision": B}, "model.tokenizer": {"repo": REPO, "revision": B}}


def start(tmp_path, **keys):
    """A 2-step run of the tiny base served as REPO, a state after step 1; the run dir has a launch's manifest.json."""
    data = make_dataset_dir(tmp_path / "data", n=16)
    run_dir = tmp_path / "run"
    config = write_config(run_dir, data, steps=2, save_steps=[], state_every=1, activation_checkpointing=False,
                          **{"model.path": REPO, "model.tokenizer": REPO, "model.init": "pretrained", **keys})
    (run_dir / "manifest.json").write_text(json.dumps({"run_dir": str(run_dir), "launches": [{}]}))
    return config, run_dir


def variant(run_dir) -> str:
    return json.loads((run_dir / "checkpoints" / "step-000002" / "config.json").read_text())["variant"]


def test_a_start_loads_the_hubs_main_and_records_its_commit(moved_hub, tmp_path):
    from sft import train

    config, run_dir = start(tmp_path)
    assert train.main(config) == 0
    assert variant(run_dir) == "b"
    weights = [p for p in moved_hub.asked if p.endswith("/model.safetensors")]
    assert weights and all(f"/resolve/{B}/" in p for p in weights)   # read at the commit resolved, not at main
    assert len([p for p in moved_hub.asked if "/resolve/main/" in p]) == 1   # (the one check that resolved it)
    assert json.loads((run_dir / "manifest.json").read_text())["base"] == BASE
    assert json.loads((run_dir / "state" / "step-000001" / "meta.json").read_text())["base"] == BASE
    assert json.loads((run_dir / "DONE").read_text())["base"] == BASE
    from common.cards import checkpoint_card

    assert f"| base model revision | {B} | manifest.json base |" in checkpoint_card(run_dir / "checkpoints" / "step-000002")


def test_a_resume_after_main_moved_loads_the_commit_its_start_recorded(moved_hub, tmp_path, capsys):
    from sft import train

    config, run_dir = start(tmp_path)
    assert train.main(config) == 0
    identity = json.loads((run_dir / "DONE").read_text())["identity"]
    (run_dir / "DONE").unlink()   # as if stopped after step 1's state: resume=auto takes it
    common.hub._ANSWERS.clear()   # another process: nothing asked yet
    moved_hub.main, moved_hub.asked[:] = C, []
    capsys.readouterr()
    assert train.main(config) == 0   # (its log lines: to stderr, the trainer's own logging setup)
    moved = [line for line in capsys.readouterr().err.splitlines() if "main" in line and C in line]
    assert variant(run_dir) == "b"
    assert not [p for p in moved_hub.asked if f"/resolve/{C}/" in p]
    done = json.loads((run_dir / "DONE").read_text())
    assert done["base"] == BASE and done["identity"] == identity
    assert json.loads((run_dir / "manifest.json").read_text())["base"] == BASE
    assert len(moved) == 1 and B in moved[0], moved


def drop_base(state):
    """`state` as a trainer wrote it before the base commits were recorded: no `base` in its meta.json."""
    from sft.checkpoint import write_state_sums

    meta = json.loads((state / "meta.json").read_text())
    del meta["base"]
    (state / "meta.json").write_text(json.dumps(meta))
    write_state_sums(state)


def test_a_resume_of_a_state_that_records_no_base_says_which_commit_it_loads(moved_hub, tmp_path, capsys):
    """A state saved before the trainers recorded their base: the resume loads the commit resolved now (main, at C),
    says so in one line naming the state, and records C from then on."""
    from sft import train

    config, run_dir = start(tmp_path)
    assert train.main(config) == 0
    (run_dir / "DONE").unlink()
    state = run_dir / "state" / "step-000001"
    drop_base(state)
    common.hub._ANSWERS.clear()
    moved_hub.main = C
    capsys.readouterr()
    assert train.main(config) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if "records no base commit" in line]
    assert len(said) == 1 and str(state) in said[0] and f"model.path={REPO} at {C}" in said[0], said
    assert f"model.tokenizer={REPO} at {C}" in said[0]
    assert variant(run_dir) == "c"
    now = {key: {"repo": REPO, "revision": C} for key in BASE}
    assert json.loads((run_dir / "DONE").read_text())["base"] == now
    assert json.loads((run_dir / "manifest.json").read_text())["base"] == now


def test_only_a_resume_of_a_state_without_a_record_says_it(moved_hub, tmp_path, caplog):
    """The line is for a resumed state without `base`: a fresh start, or a state that records its commits (an empty
    record too: a base that is no Hub id), says nothing of it."""
    from sft.config import load_config
    from sft.model import base_commits

    config, _ = start(tmp_path)
    cfg = load_config(config)
    state = tmp_path / "run" / "state" / "step-000001"
    with caplog.at_level(logging.WARNING, logger="sft.model"):
        assert base_commits(cfg, None, rank=0, world=1) == BASE
        assert base_commits(cfg, BASE, rank=0, world=1, resumed=state) == BASE
        assert not caplog.records
        common.hub._ANSWERS.clear()
        assert base_commits(cfg, None, rank=0, world=1, resumed=state) == BASE
    assert [r.getMessage() for r in caplog.records] == [
        f"{state} records no base commit (saved before the trainer recorded them): this resumed run loads "
        f"model.path={REPO} at {B}, model.tokenizer={REPO} at {B}, resolved now; the run's start may have loaded another"]


def test_an_offline_resume_whose_commit_is_not_cached_is_one_line(moved_hub, tmp_path, monkeypatch, caplog):
    """Offline, a resume loads the commit its state records from the hub cache (B, the cache's main at A); one the cache
    lacks (C) is one line."""
    from sft.config import load_config
    from sft.errors import SftError
    from sft.model import base_commits

    config, _ = start(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = load_config(config)
    assert base_commits(cfg, None, rank=0, world=1) == {key: {"repo": REPO, "revision": A} for key in BASE}
    common.hub._ANSWERS.clear()
    recorded = {key: {"repo": REPO, "revision": C} for key in BASE}
    snapshots = common.hub.hub_cache() / f"models--{REPO.replace('/', '--')}" / "snapshots"
    shutil.copytree(snapshots / A, snapshots / B)   # B cached too (main still A): B loads, nothing said of main
    common.hub._ANSWERS.clear()
    with caplog.at_level(logging.WARNING, logger="sft.model"):
        assert base_commits(cfg, {key: {"repo": REPO, "revision": B} for key in BASE}, rank=0, world=1) == BASE
    assert not caplog.records   # (seen: "the Hub's main is at A now", the cache's copy taken for the Hub's main)
    common.hub._ANSWERS.clear()
    with pytest.raises(SftError, match=rf"^model.path={REPO}: commit {C}, the one this resumed run started from, is not "
                                       r"in the local Hugging Face cache \(.*\) and HF_HUB_OFFLINE=1$"):
        base_commits(cfg, recorded, rank=0, world=1)
    assert moved_hub.asked == []


def test_grpos_starting_snapshot_is_taken_at_one_commit_and_recorded(moved_hub, tmp_path):
    from rl.checkpoint import write_start_checkpoint

    info = write_start_checkpoint(REPO, tmp_path / "step-000000")
    assert info["revision"] == B
    assert json.loads((tmp_path / "step-000000" / "config.json").read_text())["variant"] == "b"
    assert [p for p in moved_hub.asked if p.endswith(f"/resolve/{B}/model.safetensors")]
    assert not [p for p in moved_hub.asked if p.endswith("/resolve/main/model.safetensors")]


def test_a_start_while_the_hub_cannot_answer_is_the_cached_copy_at_once(moved_hub, hub_at, tmp_path):  # noqa: F811
    """A Hub that refuses connections: the cached A is loaded and recorded, nothing asked of the Hub again after the
    one check (huggingface_hub would retry each file the cache lacks, with backoff)."""
    import socket
    import time

    from sft import train

    with socket.socket() as closed:   # a port nobody listens on: refused at once
        closed.bind(("127.0.0.1", 0))
        hub_at(f"http://127.0.0.1:{closed.getsockname()[1]}")
    config, run_dir = start(tmp_path)
    t0 = time.monotonic()
    assert train.main(config) == 0
    assert variant(run_dir) == "a"
    assert json.loads((run_dir / "DONE").read_text())["base"] == {key: {"repo": REPO, "revision": A} for key in BASE}
    assert time.monotonic() - t0 < 20
