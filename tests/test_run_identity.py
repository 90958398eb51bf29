"""Run identity (fast tests): the fingerprint, launch's comparison with the run dir, `name=`,
`resume=never` renaming aside, legacy run dirs, the trainer lock seen from launch.

launch_one runs with an injected stand-in for data_prep and the trainer (no model work); the
end-to-end versions with the real trainer are in test_launch_run.py.
"""
from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from common import fingerprint, layout
from common.cli import ConfigError
from common.layout import TRAIN_LOCK
from sft.config import EXCLUDED_KEYS
from test_launch_cache import FakeDataPrep

BASE = ["model=tiny", "data=synthetic", "steps=4"]


# ---------------------------------------------------------------- common.fingerprint


def test_fingerprint_covers_result_keys_and_excludes_paths_and_resumable_keys():
    from launch.compose import compose

    cfg = compose(BASE).cfg
    fp = fingerprint.identity(cfg, EXCLUDED_KEYS, trainer_semantics=1)["fingerprint"]
    keys = fingerprint.identity_keys(cfg, EXCLUDED_KEYS)
    for key in ("train.lr", "train.lr_schedule", "train.steps", "train.warmup_ratio", "train.betas", "seed",
                "model.path", "data.n", "train.precision", "train.grad_clip", "train.weight_decay"):
        assert key in keys, key
    for key in ("runs_root", "run_dir", "name", "data.dir", "data.cache_root", "logging.wandb", "launcher.nproc",
                "train.state_every", "resume"):
        assert key not in keys, key
    moved = compose([*BASE, "runs_root=/elsewhere", "data.cache_root=/c", "state_every=3", "nproc=2",
                     "logging.wandb=false", "name=v2"]).cfg
    assert fingerprint.identity(moved, EXCLUDED_KEYS, trainer_semantics=1)["fingerprint"] == fp
    for change in ("lr=5e-4", "train.lr_schedule=constant", "steps=5", "seed=1", "train.betas=[0.9,0.95]",
                   "data.synthetic.n_entities=7"):
        other = compose([*BASE, change]).cfg
        assert fingerprint.identity(other, EXCLUDED_KEYS, trainer_semantics=1)["fingerprint"] != fp, change
    assert fingerprint.identity(cfg, EXCLUDED_KEYS, trainer_semantics=2)["fingerprint"] != fp
    assert fingerprint.identity(cfg, EXCLUDED_KEYS, trainer_semantics=1, data_fingerprint="x")["fingerprint"] != fp


def test_fingerprint_diff_names_each_key_old_to_new():
    old = fingerprint.identity({"train": {"lr": 1e-5, "steps": 4}, "seed": 0}, EXCLUDED_KEYS, trainer_semantics=1, data_fingerprint="a")
    new = fingerprint.identity({"train": {"lr": 5e-4, "steps": 4}, "arm": "x"}, EXCLUDED_KEYS, trainer_semantics=2)
    assert fingerprint.fingerprint_diff(old, new) == [
        "arm: '<absent>' -> 'x'", "seed: 0 -> '<absent>'", "train.lr: 1e-05 -> 0.0005", "trainer_semantics: 1 -> 2"]
    assert fingerprint.fingerprint_diff(old, old) == []


def test_an_int_and_the_equal_float_are_one_setting():
    """`weight_decay=0` on the command line is the recipe's `0.0`; a bool is never a number."""
    old = fingerprint.identity({"train": {"weight_decay": 0.0, "grad_clip": 1.0, "betas": [0.9, 1.0]}, "flag": True}, EXCLUDED_KEYS)
    same = fingerprint.identity({"train": {"weight_decay": 0, "grad_clip": 1, "betas": [0.9, 1]}, "flag": True}, EXCLUDED_KEYS)
    assert fingerprint.fingerprint_diff(old, same) == []
    other = fingerprint.identity({"train": {"weight_decay": 0.1, "grad_clip": 1.0, "betas": [0.9, 1.0]}, "flag": 1}, EXCLUDED_KEYS)
    assert fingerprint.fingerprint_diff(old, other) == ["flag: True -> 1", "train.weight_decay: 0.0 -> 0.1"]


# ---------------------------------------------------------------- launch against a run dir


@pytest.fixture
def staged(tmp_path, monkeypatch):
    """launch_one with stand-in data prep and a stand-in trainer that records each start and
    finishes the run (writes DONE) unless told to stop early."""
    from launch import local, run

    fake, started = FakeDataPrep().install(monkeypatch), []

    def fake_trainer(cmd, log_dir, cwd, env=None, pass_fds=(), stops=None):
        rd = Path(cmd[-1]).parent
        started.append(rd)
        log_dir.mkdir(parents=True, exist_ok=True)
        if not (rd / "STOP_EARLY").exists():
            (rd / "DONE").write_text("{}")
        else:   # stopped early as a real trainer stops (SIGTERM): a complete resumable state, no DONE
            state = layout.states_dir(rd) / layout.step_name(1)
            state.mkdir(parents=True, exist_ok=True)
            (state / layout.STATE_META).write_text("{}")
            (state / layout.COMPLETE).write_text("")
        return 0, log_dir / "train.log"

    monkeypatch.setattr(local, "run_logged", fake_trainer)
    monkeypatch.setattr("launch.jobs.cuda_device_count", lambda: 0)

    def go(*argv):
        return run.launch_one(run.SFT, [*BASE, f"runs_root={tmp_path}", *argv])

    return go, started, fake, tmp_path


def test_finished_run_with_changed_lr_is_refused_and_name_trains_a_variant(staged, capsys):
    go, started, _, root = staged
    assert go() == 0 and len(started) == 1
    rd = root / "r2e" / "seed0"
    capsys.readouterr()
    with pytest.raises(ConfigError) as err:
        go("lr=5e-4")
    msg = str(err.value)
    assert "train.lr: 0.002 -> 0.0005" in msg and "name=<variant>" in msg and "resume=never" in msg
    assert len(started) == 1 and "not retraining" not in capsys.readouterr().out
    # The same request as a named variant: a separate run dir, trained.
    assert go("lr=5e-4", "name=lr5e-4") == 0
    assert started[-1] == (root / "r2e" / "lr5e-4" / "seed0").resolve()
    cfg = OmegaConf.load(started[-1] / "config.yaml")
    assert cfg.train.lr == 5e-4 and cfg.name == "lr5e-4" and cfg.logging.name == "r2e-lr5e-4-s0"
    # Both still report as finished with their own request.
    assert go() == 0 and go("lr=5e-4", "name=lr5e-4") == 0 and len(started) == 2
    assert json.loads((rd / "manifest.json").read_text())["identity"]["keys"]["train.lr"] == 2e-3


def test_relaunch_with_an_int_for_a_recipe_float_is_the_same_run(staged, capsys):
    go, started, _, root = staged
    assert go() == 0 and len(started) == 1
    assert go("train.weight_decay=0", "train.grad_clip=1") == 0 and len(started) == 1  # finished: not retrained
    assert "not retraining" in capsys.readouterr().out
    with pytest.raises(ConfigError, match=r"train.weight_decay: 0.0 -> 0.1"):
        go("train.weight_decay=0.1")


def test_unfinished_run_with_changed_schedule_is_refused_before_data_prep(staged):
    go, started, fake, root = staged
    rd = root / "r2e" / "seed0"
    rd.mkdir(parents=True)
    (rd / "STOP_EARLY").write_text("")
    assert go() == 0 and not (rd / "DONE").exists() and fake.builds == ["r2e"]
    for change, key in (("lr=1e-4", "train.lr"), ("train.lr_schedule=constant", "train.lr_schedule"),
                        ("steps=9", "train.steps")):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            go(change)
    assert fake.builds == ["r2e"] and len(started) == 1, "refused before data prep and training"
    assert go("state_every=3") == 0 and len(started) == 2, "a resumable key may change"


def test_resume_never_renames_the_old_run_aside(staged):
    go, started, _, root = staged
    assert go() == 0
    rd = root / "r2e" / "seed0"
    (rd / "checkpoints" / "step-000004").mkdir(parents=True)
    assert go("lr=5e-4", "resume=never") == 0 and len(started) == 2
    aside = [p for p in (root / "r2e").iterdir() if p.name.startswith("seed0.replaced-")]
    assert len(aside) == 1 and (aside[0] / "checkpoints" / "step-000004").is_dir()
    assert json.loads((aside[0] / "manifest.json").read_text())["identity"]["keys"]["train.lr"] == 2e-3
    assert json.loads((rd / "manifest.json").read_text())["identity"]["keys"]["train.lr"] == 5e-4
    assert go("lr=5e-4") == 0 and len(started) == 2, "the new run is finished under the new identity"


def test_resume_never_renames_only_a_run_dir(staged):
    """`run_dir=` at a directory that is not a run dir (no config.yaml): resume=never refuses and
    moves nothing; a dir holding only lock files counts as empty."""
    go, started, _, root = staged
    mine = root / "my_project"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not an output of this command .*no config.yaml.*notes.txt"):
        go(f"run_dir={mine}", "resume=never")
    assert (mine / "notes.txt").read_text() == "mine" and sorted(p.name for p in root.iterdir()) == ["my_project"]
    assert started == []


def test_changed_data_content_is_refused_for_an_unfinished_run(staged):
    go, started, fake, root = staged
    rd = root / "r2e" / "seed0"
    rd.mkdir(parents=True)
    (rd / "STOP_EARLY").write_text("")
    assert go() == 0
    man = json.loads((rd / "manifest.json").read_text())
    from common.schema import TRAINER_SEMANTICS

    man["identity"] = fingerprint.identity(OmegaConf.load(rd / "config.yaml"), EXCLUDED_KEYS, trainer_semantics=TRAINER_SEMANTICS,
                                           data_fingerprint="fp-of-other-data")
    (rd / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(ConfigError, match="data_fingerprint: 'fp-of-other-data' -> 'fp-r2e-0-3500'"):
        go()
    assert len(started) == 1


def test_legacy_run_dir_gets_an_identity_from_its_config(staged, monkeypatch):
    """A run dir made before identity was recorded (no `identity` in manifest.json)."""
    from launch import run

    go, started, _, root = staged
    monkeypatch.setattr(run, "TRAINER_SEMANTICS", fingerprint.LEGACY_TRAINER_SEMANTICS)  # made by the legacy code
    assert go() == 0
    rd = root / "r2e" / "seed0"
    man = json.loads((rd / "manifest.json").read_text())
    recorded = man.pop("identity")
    (rd / "manifest.json").write_text(json.dumps(man))
    from launch.run import recorded_identity

    assert recorded_identity(rd) == recorded, "computed from config.yaml + the manifest's data fingerprint"
    with pytest.raises(ConfigError, match="train.lr"):
        go("lr=5e-4")
    assert go() == 0 and len(started) == 1


def test_trainer_semantics_bump_is_refused_with_its_reason(staged, monkeypatch):
    from launch import run

    go, started, _, _ = staged
    monkeypatch.setattr(run, "TRAINER_SEMANTICS", 1)
    assert go() == 0
    monkeypatch.setattr(run, "TRAINER_SEMANTICS", 2)
    with pytest.raises(ConfigError, match=r"code changed what this config means.*\n.*trainer_semantics: 1 -> 2"):
        go()


def test_bad_variant_names_are_refused():
    from launch.compose import compose

    for bad in ("seed3", "a/b", ".x", "x.replaced-1"):
        with pytest.raises(ConfigError, match="name must be"):
            compose([*BASE, f"name={bad}"])


def test_launch_refuses_a_run_dir_whose_trainer_holds_the_lock(staged):
    """A live trainer (any process holding <run_dir>/.train.lock) stops launch before data prep."""
    from common import lock

    go, started, fake, root = staged
    rd = root / "r2e" / "seed0"
    fd = lock.acquire(rd / TRAIN_LOCK, "test")
    try:
        with pytest.raises(ConfigError, match=f"in use by a running trainer.*pid {os.getpid()}"):
            go()
    finally:
        os.close(fd)
    assert fake.builds == [] and started == []
    assert go() == 0, "released by the holder: launch proceeds (and does not keep the trainer's lock)"
    lock.check_free(rd / TRAIN_LOCK, "x")


def test_filesystem_without_flock_fails_clearly(tmp_path, monkeypatch):
    import fcntl

    from common import lock

    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    with pytest.raises(ConfigError, match=r"filesystem \(\w+ at /.*\) does not support flock"):
        lock.acquire(tmp_path / "run" / TRAIN_LOCK, "x")


# ---------------------------------------------------------------- the trainer (sft.train), no model work


@pytest.fixture(scope="module")
def copy_data(tmp_path_factory):
    from sft_helpers import make_dataset_dir

    return make_dataset_dir(tmp_path_factory.mktemp("identity_data") / "ds", n=16)


def _no_model(monkeypatch):
    from sft import train

    monkeypatch.setattr(train, "prepare_model", lambda *a, **k: pytest.fail("the model was built"))
    monkeypatch.setattr(train.ckpt, "load_state", lambda *a, **k: pytest.fail("the state was loaded"))
    return train


def test_trainer_refuses_a_state_of_another_config_before_any_model_work(tmp_path, copy_data, monkeypatch, capsys):
    """An unfinished run whose config.yaml changed (lr, schedule, steps): exit 2 naming each key,
    from the state's meta.json alone."""
    from sft.config import load_config
    from sft.data import load_train_data
    from sft_helpers import write_config

    train = _no_model(monkeypatch)
    run_dir = tmp_path / "run"
    old = load_config(write_config(run_dir, copy_data))
    data = load_train_data(copy_data, global_batch_size=8, max_tokens_per_micro_batch=256)
    state = run_dir / "state" / "step-000002"
    state.mkdir(parents=True)
    (state / "meta.json").write_text(json.dumps({"step": 2, "n": data.n, "identity": train.run_identity(old, data)}))
    (state / "COMPLETE").write_text("2\n")
    cfg = write_config(run_dir, copy_data, lr=1e-4, lr_schedule="constant", steps=9)
    assert train.cli([str(cfg)]) == 2
    err = capsys.readouterr().err
    for line in ("train.lr: 0.003 -> 0.0001", "train.lr_schedule: 'cosine' -> 'constant'", "train.steps: 6 -> 9"):
        assert line in err
    assert "Traceback" not in err and not (run_dir / TRAIN_LOCK).exists()


def test_second_trainer_on_a_run_dir_is_refused_naming_the_holder(tmp_path, copy_data, monkeypatch, capsys):
    from common import lock
    from sft_helpers import write_config

    train = _no_model(monkeypatch)
    cfg = write_config(tmp_path / "run", copy_data)
    fd = lock.acquire(tmp_path / "run" / TRAIN_LOCK, "test")   # another open file: another holder
    try:
        assert train.cli([str(cfg)]) == 2
    finally:
        os.close(fd)
    err = capsys.readouterr().err
    assert "in use by another trainer" in err and f"pid {os.getpid()}" in err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


class VersionedData(FakeDataPrep):
    """A stand-in data_prep whose inputs (`source`) and code version (`code`) enter the cache key;
    the content fingerprint depends on the source only, as data_prep's does."""

    source, code = "v1", "c1"

    def key(self, data_cfg, *, arm, seed, tokenizer):
        return super().key(data_cfg, arm=arm, seed=seed, tokenizer=tokenizer) + self.source + self.code

    def build(self, data_cfg, *, arm, seed, tokenizer, out, final):
        manifest = super().build(data_cfg, arm=arm, seed=seed, tokenizer=tokenizer, out=out, final=final)
        manifest["fingerprint"] += "-" + self.source
        (Path(out) / "manifest.json").write_text(json.dumps(manifest))
        return manifest


def test_finished_run_with_same_config_but_other_data_is_refused(staged, capsys, monkeypatch):
    go, started = staged[:2]
    data = VersionedData().install(monkeypatch)

    assert go() == 0 and len(data.builds) == 1
    assert go() == 0 and len(data.builds) == 1, "same cache key: reported without data prep"
    data.code = "c2"   # a data_prep code edit that leaves the data identical: still the same run
    assert go() == 0 and len(data.builds) == 2 and len(started) == 1
    assert "not retraining" in capsys.readouterr().out
    data.source = "v2"   # a source file changed: another dataset
    with pytest.raises(ConfigError, match="data_fingerprint: 'fp-r2e-0-3500-v1' -> 'fp-r2e-0-3500-v2'"):
        go()
    assert len(started) == 1


def test_trainer_on_a_finished_run_of_another_config_refuses(tmp_path, copy_data, monkeypatch, capsys):
    """`python -m sft.train config.yaml train.lr=...` on a finished run does not report it as done."""
    from sft.config import load_config
    from sft.data import load_train_data
    from sft_helpers import write_config

    train = _no_model(monkeypatch)
    cfg = write_config(tmp_path / "run", copy_data)
    data = load_train_data(copy_data, global_batch_size=8, max_tokens_per_micro_batch=256)
    (tmp_path / "run" / "DONE").write_text(json.dumps({"step": 6, "identity": train.run_identity(load_config(cfg), data)}))
    assert train.cli([str(cfg), "train.state_every=5"]) == 0, "a resumable key: still this finished run"
    assert train.cli([str(cfg), "train.lr=1e-4"]) == 2
    assert "train.lr: 0.003 -> 0.0001" in capsys.readouterr().err


def test_pinned_hub_sources_are_the_same_run_on_relaunch(staged, monkeypatch, capsys):
    """launch pins a hub source into config.yaml on the first launch; the next launch of the same
    (unpinned) command is the same run, and only the keys really changed are named."""
    from data_prep import hub

    go, started, fake, root = staged
    monkeypatch.setattr(hub, "resolve_revision", lambda hub_id: "sha111")
    monkeypatch.delenv("HF_HUB_OFFLINE")   # the stubbed resolver is the hub, reachable (the preflight asks nothing)
    argv = ["data=hub", "data.sources.code=[r2e-gym:org/ds]"]
    assert go(*argv) == 0 and len(started) == 1
    rd = root / "r2e" / "seed0"
    assert json.loads((rd / "manifest.json").read_text())["identity"]["keys"]["data.sources.code"] == [
        "r2e-gym:org/ds@sha111"]
    monkeypatch.setattr(hub, "resolve_revision", lambda hub_id: pytest.fail("the run's pin is reused"))
    capsys.readouterr()
    assert go(*argv) == 0 and len(started) == 1 and "not retraining" in capsys.readouterr().out
    with pytest.raises(ConfigError) as err:
        go(*argv, "lr=5e-4")
    assert "train.lr" in str(err.value) and "data.sources" not in str(err.value)
