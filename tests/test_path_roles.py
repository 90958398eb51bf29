"""Path resolution from the fields' PATH role (issue #60): launch makes absolute, against the caller's
directory, exactly the keys whose field carries the role (common.fields.path_keys over sft.config's / rl.config's
tables), each by its kind role; no key list is written anywhere else."""
from __future__ import annotations

import dataclasses

from common import fields
from rl import config as rl_config
from sft import config as sft_config

SFT = ["model=tiny", "data=synthetic", "steps=1"]


def _as(monkeypatch, key: str, *roles: str) -> None:
    """`key`'s field, given `roles` besides its own, in both trainers' tables (nothing else edited)."""
    f = sft_config.SFT[key]
    changed = dataclasses.replace(f, roles=f.roles | set(roles))
    monkeypatch.setitem(sft_config.SFT, key, changed)
    monkeypatch.setitem(rl_config.GRPO, key, changed)


def test_a_key_given_the_path_role_is_resolved_against_the_callers_dir(tmp_path, monkeypatch):
    from launch import run
    from launch.compose import compose, compose_grpo

    monkeypatch.chdir(tmp_path)
    given = ["logging.name=sub/x", "logging.tags=[a,b/c]"]
    plain = compose([*SFT, *given]).cfg
    assert plain.logging.name == "sub/x" and list(plain.logging.tags) == ["a", "b/c"]   # not paths: as given
    _as(monkeypatch, "logging.name", fields.PATH)
    _as(monkeypatch, "logging.tags", fields.PATH, fields.PATHS)
    for cfg in (compose([*SFT, *given]).cfg, compose_grpo(["task=spa", "model=tiny_base", *given]).cfg):
        assert cfg.logging.name == str(tmp_path / "sub" / "x")
        assert list(cfg.logging.tags) == [str(tmp_path / "a"), str(tmp_path / "b" / "c")]
    # an OUTPUT path: left as given when composed (the key pages show the defaults), absolute once the run is resolved
    _as(monkeypatch, "logging.name", fields.PATH, fields.OUTPUT)
    assert compose([*SFT, *given]).cfg.logging.name == "sub/x"
    monkeypatch.setattr("launch.jobs.cuda_device_count", lambda: 0)   # (a CPU box)
    assert run.SFT.resolve([*SFT, *given, "runs_root=R"]).cfg.logging.name == str((tmp_path / "sub" / "x").resolve())


def test_every_path_field_of_launch_is_resolved_data_heldout_included(tmp_path, monkeypatch):
    """data.heldout has had the PATH role since it was defined; the hand-written key list left it out, so a
    relative held-out dir stayed relative in config.yaml and the manifest."""
    from launch.compose import compose

    monkeypatch.chdir(tmp_path)
    cfg = compose([*SFT, "data.heldout=runs/_heldout", "data.decontam=[d.jsonl]"]).cfg
    assert cfg.data.heldout == str(tmp_path / "runs" / "_heldout")
    assert list(cfg.data.decontam) == [str(tmp_path / "d.jsonl")]
    assert set(fields.path_keys(sft_config.SFT)) >= {"data.heldout", "model.path", "resume", "runs_root"}
