"""Hub sources are pinned: `ID@REV` reaches the loader, the data manifest and the cache key; launch
pins unpinned ones once (the resolver is stubbed: it is the network boundary) into config.yaml,
and a later launch of the run reuses that pin without the hub. `datasets.load_dataset` is stubbed."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from data_prep import build, synthetic
from data_prep.readers import SourceError, parse_source


@pytest.fixture
def fake_hub(monkeypatch):
    """datasets.load_dataset -> synthetic R2E-Gym rows; records (id, split, revision) per call."""
    import datasets

    calls = []
    rows = synthetic.code_rows(6, 0, synthetic.config_from({}))

    def load_dataset(path, split=None, **kw):
        calls.append((path, split, kw.get("revision")))
        return list(rows)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return calls


def test_parse_revision():
    src = parse_source("r2e-gym:org/ds@0a1b2c#train.success")
    assert (src.location, src.revision, src.split) == ("org/ds", "0a1b2c", "train.success")
    assert src.identity()["revision"] == "0a1b2c"
    plain = parse_source("r2e-gym:org/ds")
    assert plain.revision is None and "revision" not in plain.identity()
    with pytest.raises(SourceError, match="HUB_ID@REVISION"):
        parse_source("r2e-gym:org/ds@")


def test_revision_reaches_loader_manifest_and_cache_key(fake_hub, tmp_path):
    cfg = {"kind": "hub", "n": 4, "sources": {"code": ["r2e-gym:org/ds@abc123"], "search": []}}
    m = build.build_arm(cfg, arm="r2e", seed=0, tokenizer="tiny", out=tmp_path / "a", progress=False, num_proc=1)
    assert fake_hub == [("org/ds", "train", "abc123")]
    (src,) = m["sources"]
    assert (src["spec"], src["hub_id"], src["revision"]) == ("r2e-gym:org/ds@abc123", "org/ds", "abc123")
    on_disk = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert on_disk["sources"][0]["revision"] == "abc123"

    def key(rev):
        return build.cache_key({**cfg, "sources": {"code": [f"r2e-gym:org/ds@{rev}"], "search": []}},
                               arm="r2e", seed=0, tokenizer="tiny")

    assert key("abc123") == m["cache_key"] != key("def456")


def test_launch_pins_once_and_reuses_the_pin(fake_hub, tmp_path, monkeypatch):
    from data_prep import hub
    from launch import manifest as launch_manifest
    from launch.run import SFT

    from common import datafetch
    from tests.conftest import shared_path

    monkeypatch.setenv("DTSFT_DATA", str(tmp_path / "data"))   # data=hub decontaminates against the cached sets
    datafetch.prefill(shared_path("benchmarks"))
    asked = []
    monkeypatch.setattr(hub, "resolve_revision", lambda hub_id: asked.append(hub_id) or "sha111")
    argv = ["arm=r2e", "model=tiny", "data=hub", "n=4", "data.sources.code=[r2e-gym:org/ds]", f"runs_root={tmp_path}"]
    prep = SFT.resolve(argv)
    data = SFT.prepare(prep)   # as launch does: data, identity, config.yaml, then manifest.json
    launch_manifest.write_manifest(prep.run_dir, argv=argv, choices=prep.choices, launcher={"kind": "local"},
                                   data=data, identity=prep.identity)
    assert asked == ["org/ds"] and fake_hub == [("org/ds", "train", "sha111")]
    saved = OmegaConf.load(prep.run_dir / "config.yaml")
    assert list(saved.data.sources.code) == ["r2e-gym:org/ds@sha111"]
    data_manifest = json.loads((Path(data["dir"]) / "manifest.json").read_text())
    assert data_manifest["sources"][0]["revision"] == "sha111"

    def offline(hub_id):
        raise OSError("no network")

    monkeypatch.setattr(hub, "resolve_revision", offline)   # a requeue / relaunch on an offline node
    again = SFT.resolve(argv)
    reused = SFT.dataset(again)
    assert list(again.cfg.data.sources.code) == ["r2e-gym:org/ds@sha111"]
    assert reused["dir"] == data["dir"] and reused["reused"] and len(fake_hub) == 1

    other = SFT.resolve([*argv[:-1], f"runs_root={tmp_path / 'fresh'}"])   # a new run, offline: a clear error
    from common.cli import ConfigError

    with pytest.raises(ConfigError, match="no network"):
        SFT.dataset(other)
