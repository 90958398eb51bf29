"""GRPO records the commit its Hub-id base was taken at as SFT does (tests/test_train_hub_revision.py): the starting
snapshot (`checkpoints/step-000000`, which every segment loads) is taken at the Hub's main when the run starts, and
`base` is in the run dir's manifest.json, each state's meta.json and DONE; a resume after the Hub's main moved loads
the snapshot, never the new main, and records the same commit. A state saved before GRPO recorded its base says so
in one line when resumed, naming what the run loads."""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

import common.hub
from tests import fake_hub
from tests.fake_hub import B, C, REPO
from tests.rl_helpers import scripted_segment
from tests.test_hub_check_once import hub_at  # noqa: F401 - the fixture

moved_hub = fake_hub.moved_hub   # the fixture: REPO on a loopback Hub, main at B, the hub cache's copy at A
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
BASE = {"model.path": {"repo": REPO, "revision": B}}


def _cfg(root: Path, model_path: str = REPO):
    from common.schema import run_dir
    from launch.compose import compose_grpo

    cfg = compose_grpo(["task=spa", "model=tiny_base", f"model.path={model_path}", "steps=2", "save_steps=[]",
                        "train.state_every=1", f"runs_root={root}", "grpo.completions_per_step=4",
                        "grpo.num_generations=2", "grpo.max_turns=12", "grpo.max_completion_length=2048",
                        "grpo.pilot_tasks=3", "logging.wandb=false"]).cfg
    cfg.run_dir = str(run_dir(cfg))
    return cfg


def _json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.mark.slow
def test_grpo_records_its_base_in_states_and_done_and_a_resume_holds_it(moved_hub, tmp_path):
    cfg = _cfg(tmp_path)
    rd = Path(cfg.run_dir)
    rd.mkdir(parents=True)
    (rd / "manifest.json").write_text(json.dumps({"run_dir": str(rd), "launches": [{}]}))   # a launch's
    from omegaconf import OmegaConf

    OmegaConf.save(cfg, rd / "config.yaml")   # (launch's too: the checkpoint card reads it)
    assert scripted_segment(cfg, stop_after=1) == 0
    assert not (rd / "DONE").exists()
    assert _json(rd / "checkpoints" / "step-000000" / "config.json")["variant"] == "b"
    assert _json(rd / "manifest.json")["base"] == BASE
    assert _json(rd / "state" / "step-000001" / "meta.json")["base"] == BASE
    common.hub._ANSWERS.clear()   # another process: nothing asked yet
    moved_hub.main, moved_hub.asked[:] = C, []
    assert scripted_segment(cfg, stop_after=None) == 0
    assert not moved_hub.asked   # the snapshot is loaded, not the Hub
    assert _json(rd / "DONE")["base"] == BASE
    assert _json(rd / "state" / "step-000002" / "meta.json")["base"] == BASE
    assert _json(rd / "manifest.json")["base"] == BASE
    from common.cards import checkpoint_card

    assert f"| base model revision | {B} | manifest.json base |" in checkpoint_card(rd / "checkpoints" / "step-000002")


def _old_run(tmp_path, manifest_base: dict | None) -> tuple[Path, Path]:
    """A run dir whose state step-000001 was saved before GRPO recorded its base; its manifest.json `base`."""
    rd, state = tmp_path / "run", tmp_path / "run" / "state" / "step-000001"
    state.mkdir(parents=True)
    (rd / "manifest.json").write_text(json.dumps({"launches": [{}], **({"base": manifest_base} if manifest_base else {})}))
    return rd, state


@pytest.mark.parametrize("manifest_base, returned, what", [
    (BASE, BASE, f"of model.path={REPO} at {B} (the run dir's manifest.json base)"),
    (None, None, f"of model.path={REPO} at a commit nothing in the run dir records")])
def test_a_resumed_state_without_a_base_record_is_one_line(tmp_path, caplog, manifest_base, returned, what):
    """What it loads: the starting snapshot, of the commit manifest.json records, or of one nothing records."""
    from rl.train import recorded_base

    rd, state = _old_run(tmp_path, manifest_base)
    with caplog.at_level(logging.WARNING, logger="rl.train"):
        assert recorded_base(rd, REPO, {"step": 1}, state) == returned
    assert [r.getMessage() for r in caplog.records] == [
        f"{state} records no base commit (saved before GRPO recorded it): this resumed run loads "
        f"{rd / 'checkpoints' / 'step-000000'}, the starting snapshot its first start took, {what}"]


def test_a_recorded_base_or_a_local_model_says_nothing(tmp_path, caplog):
    from rl.train import recorded_base, start_base

    rd, state = _old_run(tmp_path, None)
    with caplog.at_level(logging.WARNING, logger="rl.train"):
        assert recorded_base(rd, REPO, {"step": 1, "base": BASE}, state) == BASE
        assert recorded_base(rd, "tiny_base", {"step": 1}, state) == {}   # a local dir: no commit to name
        assert recorded_base(rd, REPO, None, None) is None   # no state resumed (a start's snapshot, no state yet)
    assert not caplog.records
    assert start_base({"source": "/models/x", "files": 3, "reflinked": 0}) == {}
    assert start_base({"source": REPO, "revision": B, "files": None, "reflinked": 0}) == BASE
    assert start_base({"source": REPO, "revision": "main", "files": None, "reflinked": 0}) is None
