"""launch's dataset cache (against a stand-in for data_prep.build, monkeypatched) and the run manifest."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from common.cli import ConfigError
from data_prep.arms import ArmError
from data_prep.build import StrictError
from launch import cache
from launch.compose import compose
from launch.manifest import write_manifest


class FakeDataPrep:
    """Same signatures as data_prep.build.{build_arm, cache_key}; counts the builds."""

    def __init__(self):
        self.builds: list[str] = []

    def key(self, data_cfg, *, arm, seed, tokenizer):
        blob = json.dumps([OmegaConf.to_container(data_cfg), arm, seed, tokenizer], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()

    def build(self, data_cfg, *, arm, seed, tokenizer, out, final):
        self.builds.append(arm)
        assert Path(out).is_dir() and not any(Path(out).iterdir()), "builds into a fresh temp dir"
        assert data_cfg.dir is None and data_cfg.cache_root is None, "location keys never reach the key"
        manifest = {"fingerprint": f"fp-{arm}-{seed}-{data_cfg.n}", "arm": arm}
        (Path(out) / "manifest.json").write_text(json.dumps(manifest))
        (Path(out) / "rejected.jsonl").write_text("")
        return manifest

    def install(self, monkeypatch, build=None):
        """Stand in for data_prep.build's `cache_key` and `build_arm` (or `build`), which launch.cache imports when called."""
        monkeypatch.setattr("data_prep.build.cache_key", self.key)
        monkeypatch.setattr("data_prep.build.build_arm", build or self.build)
        return self


def _cfg(tmp_path, *extra):
    return compose(["model=tiny", "data=synthetic", f"runs_root={tmp_path}", *extra]).cfg


def test_second_launch_reuses_and_changed_input_rebuilds(tmp_path, monkeypatch):
    fake = FakeDataPrep().install(monkeypatch)
    first = cache.ensure_dataset(_cfg(tmp_path), "r2e")
    assert not first["reused"] and Path(first["dir"]).parent == tmp_path.resolve() / "_data"
    assert first["fingerprint"] == "fp-r2e-0-3500" and (Path(first["dir"]) / "rejected.jsonl").is_file()
    again = cache.ensure_dataset(_cfg(tmp_path), "r2e")
    assert again["reused"] and again["dir"] == first["dir"] and fake.builds == ["r2e"]
    changed = cache.ensure_dataset(_cfg(tmp_path, "n=64"), "r2e")
    assert not changed["reused"] and changed["dir"] != first["dir"] and len(fake.builds) == 2
    # The data location keys are not part of the key: another cache_root, same key.
    other = cache.ensure_dataset(_cfg(tmp_path, f"data.cache_root={tmp_path / 'c2'}"), "r2e")
    assert other["cache_key"] == first["cache_key"] and Path(other["dir"]).parent == (tmp_path / "c2").resolve()


def test_a_cached_dataset_names_its_generated_sources_where_they_lie(tmp_path):
    """data=synthetic writes its raw files into the build's temp dir: the manifest (and the model cards that quote it)
    names them under the cached dataset's own dir (seen failing: `<key>.tmp-<host>-<pid>/raw/...`, the cache's temp dir),
    its files relative to that dir."""
    built = cache.ensure_dataset(_cfg(tmp_path, "n=4"), "r2e")
    sources = json.loads((Path(built["dir"]) / "manifest.json").read_text())["sources"]
    paths = [f["path"] for s in sources for f in s["files"]]
    assert paths and all(not Path(p).is_absolute() and (Path(built["dir"]) / p).is_file() for p in paths), paths   # the dir's own
    assert all(".tmp-" not in s["spec"] for s in sources), sources


def test_failed_build_leaves_nothing_that_looks_complete(tmp_path, monkeypatch):
    fake = FakeDataPrep()

    def ensure(cfg, build):
        fake.install(monkeypatch, build)
        return cache.ensure_dataset(cfg, "r2e")

    def crash(data_cfg, *, out, **kw):
        (Path(out) / "manifest.json").write_text("{}")
        raise RuntimeError("disk full")

    cfg = _cfg(tmp_path)
    with pytest.raises(RuntimeError, match="disk full"):
        ensure(cfg, crash)
    root = tmp_path / "_data"
    assert [p.name for p in root.iterdir() if not p.name.startswith(".")] == []
    built = ensure(cfg, fake.build)
    assert not built["reused"] and fake.builds == ["r2e"]

    def offline(data_cfg, *, out, **kw):
        raise ConnectionError("Couldn't reach 'R2E-Gym/R2EGym-SFT-Trajectories' on the Hub")

    def too_few(data_cfg, *, out, **kw):
        raise ArmError("arm 'r2e' needs 3500 code records, found 12")

    def rejected(data_cfg, *, out, **kw):
        raise StrictError("strict=true and 3 record(s) were rejected")

    def bug(data_cfg, *, out, **kw):
        raise ValueError("a bug in data_prep, not bad input")

    with pytest.raises(ConfigError, match="Couldn't reach .* runs offline"):
        ensure(_cfg(tmp_path, "data=hub", "n=7"), offline)
    with pytest.raises(ConfigError, match="data prep for arm 'r2e' failed: .*found 12"):
        ensure(_cfg(tmp_path, "n=8"), too_few)
    # matched by type (data_prep's DataPrepError hierarchy), not by class name; a bug keeps its traceback
    with pytest.raises(ConfigError, match="data prep for arm 'r2e' failed: strict=true"):
        ensure(_cfg(tmp_path, "n=9"), rejected)
    with pytest.raises(ValueError, match="a bug") as info:
        ensure(_cfg(tmp_path, "n=10"), bug)
    assert not isinstance(info.value, ConfigError)

    def no_manifest(data_cfg, *, out, **kw):
        return {}

    with pytest.raises(ConfigError, match="wrote no manifest.json"):
        ensure(_cfg(tmp_path, "n=5"), no_manifest)


def test_explicit_data_dir_is_used_as_is(tmp_path):
    d = tmp_path / "mydata"
    d.mkdir()
    with pytest.raises(ConfigError, match="manifest.json missing"):
        cache.ensure_dataset(_cfg(tmp_path, f"data.dir={d}"), "r2e")
    (f := tmp_path / "a_file").write_text("")   # a file, not a directory (seen failing: NotADirectoryError traceback)
    with pytest.raises(ConfigError, match=f"{f}: not a data_prep dataset directory"):
        cache.ensure_dataset(_cfg(tmp_path, f"data.dir={f}"), "r2e")
    cfg = _cfg(tmp_path, f"data.dir={d}")
    for text in (b"[]", b"\xff{"):   # seen failing: an AttributeError / UnicodeDecodeError traceback at launch
        (d / "manifest.json").write_bytes(text)
        with pytest.raises(ConfigError, match=f"^{d / 'manifest.json'}: unreadable manifest"):
            cache.ensure_dataset(cfg, "r2e")
    (d / "manifest.json").write_text(json.dumps({"fingerprint": "abc"}))
    got = cache.ensure_dataset(cfg, "r2e")
    assert got == {"dir": str(d.resolve()), "cache_key": None, "fingerprint": "abc", "reused": True}


def test_explicit_data_dir_whose_manifest_names_no_fingerprint_is_known_by_its_rows(tmp_path):
    """A data.dir whose manifest.json names no fingerprint (seen failing: recorded as None, so launch's identity
    held no data and a relaunch over rewritten rows went on) is known by its rows' content, the digest the trainer
    computes for it; a dir whose rows cannot be read is refused naming it."""
    from sft.copytask import make_dataset_dir
    from sft.data import load_train_data

    d = make_dataset_dir(tmp_path / "mine", n=8)
    (d / "manifest.json").write_text(json.dumps({"n": 8}))
    got = cache.ensure_dataset(_cfg(tmp_path, f"data.dir={d}"), "r2e")
    assert got["fingerprint"] == load_train_data(d, global_batch_size=1, max_tokens_per_micro_batch=256).fingerprint
    (empty := tmp_path / "empty").mkdir()
    (empty / "manifest.json").write_text("{}")
    with pytest.raises(ConfigError, match=f"^{empty}: its manifest.json names no fingerprint and its rows cannot be read"):
        cache.ensure_dataset(_cfg(tmp_path, f"data.dir={empty}"), "r2e")


def test_launch_fills_data_dir_and_writes_config_and_manifest(tmp_path, monkeypatch):
    """launch_one up to the trainer, with the trainer replaced by a stand-in that records its argv."""
    from launch import local, run

    fake = FakeDataPrep().install(monkeypatch)
    seen = {}

    def fake_run(cmd, log_dir, cwd, env=None, pass_fds=(), stops=None):
        seen["cmd"] = cmd
        log_dir.mkdir(parents=True, exist_ok=True)
        return 3, log_dir / "train.log"

    monkeypatch.setattr(local, "run_logged", fake_run)
    monkeypatch.setattr("launch.jobs.cuda_device_count", lambda: 0)   # the CPU path, also on a GPU machine
    argv = ["arm=r2e_v5", "model=tiny", "data=synthetic", "steps=4", f"runs_root={tmp_path}"]
    assert run.launch_one(run.SFT, argv) == 3, "exit code mirrors training"
    rd = tmp_path / "r2e_v5" / "seed0"
    cfg = OmegaConf.load(rd / "config.yaml")
    assert cfg.run_dir == str(rd.resolve()) and Path(cfg.data.dir).parent == (tmp_path / "_data").resolve()
    assert cfg.logging.name == "r2e_v5-s0" and cfg.launcher.nproc == 1 and cfg.data.epilogue is False
    assert fake.builds == ["r2e"], "r2e_v5 builds r2e data (without the epilogue)"
    assert seen["cmd"][-3:] == ["-m", "sft.train", str(rd.resolve() / "config.yaml")]
    assert "--nproc_per_node=1" in seen["cmd"]
    man = json.loads((rd / "manifest.json").read_text())
    assert man["data"]["fingerprint"] == "fp-r2e-0-3500" and man["data"]["reused"] is False
    assert man["command"].startswith("launch arm=r2e_v5") and man["recipes"]["arm"] == "r2e_v5"
    assert set(man["packages"]) >= {"python", "torch", "transformers", "datasets"}
    assert man["packages"]["torch"] and man["hardware"]["cpu_count"] >= 1
    assert "commit" in man["git"] and "dirty" in man["git"]
    assert man["identity"]["data_fingerprint"] == "fp-r2e-0-3500" and man["identity"]["keys"]["train.steps"] == 4
    # A second launch appends, keeps the original, reuses the data; a changed config (a key that may
    # change on resume) is kept aside.
    assert run.launch_one(run.SFT, [*argv, "state_every=7"]) == 3
    man2 = json.loads((rd / "manifest.json").read_text())
    assert len(man2["launches"]) == 2 and man2["created"] == man["created"] and man2["launches"][1]["data"]["reused"]
    assert len(list(rd.glob("config.*.yaml"))) == 1 and OmegaConf.load(rd / "config.yaml").train.state_every == 7
    assert man2["identity"] == man["identity"]
    # two more changes within one second: each previous config kept (seen failing: the second overwrote the first)
    monkeypatch.setattr(run, "utc_stamp", lambda: "19990101T000000Z")
    for every in (8, 9):
        run.write_config(SimpleNamespace(run_dir=rd, cfg=OmegaConf.merge(cfg, {"train": {"state_every": every}})))
    assert sorted(OmegaConf.load(p).train.state_every for p in rd.glob("config.19990101T000000Z*.yaml")) == [7, 8]


def test_a_run_dir_in_use_is_refused(tmp_path):
    from launch import run

    with run.lock_run_dir(tmp_path / "r2e" / "seed0"), \
            pytest.raises(ConfigError, match=f"in use by another launch.*pid {__import__('os').getpid()}"):
        run.launch_one(run.SFT, ["model=tiny", "data=synthetic", f"runs_root={tmp_path}"])


def test_local_sweep_runs_every_combination_and_skips_finished(tmp_path, monkeypatch, capsys):
    from launch import local, sweep

    fake, ran = FakeDataPrep().install(monkeypatch), []

    def fake_run(cmd, log_dir, cwd, env=None, pass_fds=(), stops=None):
        rd = Path(cmd[-1]).parent
        ran.append(rd.relative_to(tmp_path).as_posix())
        (rd / "DONE").write_text("")
        return 0, log_dir / "train.log"

    monkeypatch.setattr(local, "run_logged", fake_run)
    (tmp_path / "search" / "seed1").mkdir(parents=True)
    (tmp_path / "search" / "seed1" / "DONE").write_text("")
    argv = ["arms=[r2e,search]", "seeds=[0,1]", "model=tiny", "data=synthetic", "steps=4", f"runs_root={tmp_path}"]
    assert sweep.run_sweep(argv) == 0
    assert ran == ["r2e/seed0", "r2e/seed1", "search/seed0"]
    assert "search/seed1 is finished" in capsys.readouterr().out
    assert sorted(fake.builds) == ["r2e", "r2e", "search"], "one dataset per arm x seed"
    for bad, msg in ((["seeds=[0]", "model=tiny"], "sweep needs arms="),   # an unknown arm: as `launch arm=` (seen failing: "unknown arm(s)")
                     (["arms=[r2e,serch]"], r"^unknown arm 'serch'; choices: mixed, r2e, r2e_v5, search \(recipes in .*\)\. Did you mean: search\?$"),
                     (["arms=[r2e]", "seed=1"], "set per run by the sweep"),
                     (["arms=[r2e]", "seeds=[x]"], "non-negative integers"), (["arms=null"], "sweep needs arms="),
                     # seen failing: a float (seeds=1.5, arms=1.5) was a TypeError traceback
                     (["arms=[r2e]", "seeds=1.5"], r"^seeds must be .* got '1\.5'$"), (["arms=1.5"], r"^unknown arm '1\.5'"),
                     (["arms=[r2e]", "seeds="], r"seeds=\[\] is empty"), (["arms=[r2e,search,r2e]"], "names r2e twice"),
                     (["arms=[r2e]", "seeds=[1,0,1]"], r"seeds=\[1,0,1\] names 1 twice"),
                     # seen failing: seeds={} said "seeds=[] is empty", arms={r2e: 1} ran r2e, analyze.slurm.runs was replaced
                     (["arms=[r2e]", "seeds={}"], r"^seeds=\{\}: expected a list of seeds, not a mapping$"),
                     (["arms={r2e: 1}"], "expected a list of arms, not a mapping"),
                     (["arms=[r2e]", "analyze.slurm.runs=[x]"], r"^analyze\.slurm\.runs= is set by the sweep"),   # were two runs of one run dir
                     # seen failing: the sweep's evaluation became a power report of another dir, its dry run exit 0
                     (["arms=[r2e]", "eval_profile=multihop_qa", "analyze.power.pilot=x"], r"^analyze\.power\.pilot= .*on its own")):
        with pytest.raises(ConfigError, match=msg):
            sweep.run_sweep(bad)


def test_manifest_git_state_sees_a_dirty_checkout(tmp_path):
    import subprocess

    from launch.manifest import git_state

    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "f.txt").write_text("a")
    subprocess.run(["git", "-C", str(repo), "add", "f.txt"], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "x"], check=True)
    clean = git_state(repo)
    assert len(clean["commit"]) == 40 and clean["dirty"] is False
    (repo / "f.txt").write_text("b")
    assert git_state(repo)["dirty"] is True
    assert git_state(tmp_path / "nowhere")["commit"] is None
    write_manifest(tmp_path, argv=["x=1"], choices={}, launcher={}, data={})
    assert json.loads((tmp_path / "manifest.json").read_text())["command"] == "launch x=1"


def test_a_local_sweep_checks_its_analysis_first_and_its_dry_run_trains_nothing(tmp_path, monkeypatch, capfd,
                                                                                 prefilled):
    """Issue 34 items 6 and 14: a typo in `analyze.*` stops the sweep before its first run (also in a dry
    run); a dry run says it planned the runs, not that they finished."""
    from launch import local, sweep

    fake, ran = FakeDataPrep().install(monkeypatch), []
    monkeypatch.setattr(local, "run_logged", lambda cmd, *a, **k: ran.append(cmd) or (0, tmp_path / "train.log"))
    argv = ["arms=[r2e]", "model=tiny", "data=synthetic", "steps=4", f"runs_root={tmp_path}", "eval_profile=rl_ood"]
    for extra in ([], ["dry_run=true"]):
        assert sweep.run_sweep([*argv, "analyze.eval.nn=2", *extra]) == 2
        assert "error: analyze.eval.nn: unknown evaluate key 'nn'" in capfd.readouterr().err   # named as typed (was eval.nn)
        assert ran == [] and fake.builds == [] and not (tmp_path / "r2e").exists()
    # seen failing: a traceback (the preflight read benches=5 before its rule), a suggestion the sweep refuses
    for bad, said in (("analyze.benches=5", "error: analyze.benches=5: expected null or a list of bench names"),
                      ("analyze.eval.max_new_tokenz=2", "Did you mean: analyze.eval.max_new_tokens, analyze.eval.babyai_")):
        assert sweep.run_sweep([*argv, bad, "dry_run=true"]) == 2
        assert said in capfd.readouterr().err and ran == [] and fake.builds == []
    assert sweep.run_sweep([*argv, "dry_run=true"]) == 0
    out = capfd.readouterr().out
    assert "runs finished" not in out and "[launch] sweep: dry run: 1 run(s) planned, nothing started" in out
    assert ran == [] and not (tmp_path / "r2e").exists() and not (tmp_path / "_reports").exists()


def test_a_sweep_dry_run_with_a_missing_interpreter_shows_its_plan_and_says_the_problem_once(tmp_path, monkeypatch, capfd):
    """The preflight reports a named interpreter that cannot run (one line per run); the dry run then shows its whole
    plan and exits 2 (launch.preflight.gate). Seen failing: the dry run stopped at its first run with the problem
    again, unprefixed, and planned nothing more."""
    from launch.cli import main

    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "nowhere" / "python"
    assert main(["sweep", "arms=[r2e,search]", "model=tiny", "data=synthetic", f"python.sft={missing}", "dry_run=true",
                 f"runs_root={tmp_path / 'R'}"]) == 2
    said = capfd.readouterr()
    assert [line.split(": python.sft=")[0] for line in said.err.splitlines() if f"python.sft={missing}" in line] == \
        [f"error: preflight: run {tmp_path / 'R' / arm / 'seed0'}" for arm in ("r2e", "search")], said.err
    assert "the dry run showed its plan; exit 2" in said.err
    assert "[launch] sweep: dry run: 2 run(s) planned, nothing started" in said.out
    assert not (tmp_path / "R").exists()
