"""One schema for the trainer's keys (sft.config): the intended accept/reject values of every
numeric key, checked through both real readers (launch's `validate`, sft's `from_dictconfig`); both
readers call the schema (changing a rule changes both); a run configured before the schema refactor
keeps its fingerprint, so it resumes."""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from common import fields, fingerprint
from common.cli import ConfigError
from launch.compose import compose, validate
from sft.config import EXCLUDED_KEYS, TRAINER, from_dictconfig

DATA = Path(__file__).with_name("data")
TINY = 1e-9
# key -> (accepted values, rejected values): the intended rule, written out by hand.
TABLE = {
    "seed": ([0, 1, 7], [-1, 0.5, True, None]),
    "train.global_batch_size": ([1, 2], [0, -1, 1.5, None, True]),
    "train.max_tokens_per_micro_batch": ([2, 3], [1, 0, -1, None]),
    "train.lr": ([TINY, 1, 0.5, 3], [0, -TINY, -1, None, math.nan, math.inf, "x"]),
    "train.eps": ([TINY, 1, 1e-8], [0, -TINY, -1, None, math.inf]),
    "train.weight_decay": ([0, TINY, 1, 0.1], [-TINY, -1, None]),
    "train.warmup_ratio": ([0, 0.5, 1 - TINY], [1, 1 + TINY, -TINY, -1, None]),
    "train.min_lr_ratio": ([0, 1, 0.5], [1 + TINY, -TINY, -1, None]),
    "train.grad_clip": ([None, TINY, 1], [0, -TINY, -1]),
    "train.steps": ([None, 1, 2], [0, -1, 1.5]),
    "train.epochs": ([1, 2], [0, -1, 1.5, None]),
    "train.state_every": ([1, 2], [0, -1, None]),
    "train.max_consecutive_nonfinite": ([1, 2], [0, -1, None]),
    "train.log_every": ([1, 2], [0, -1, None]),
    "train.peak_tflops": (["auto", None, TINY, 1, 989], [0, -TINY, -1, "fast"]),
}
CASES = [(k, v, True) for k, (ok, _) in TABLE.items() for v in ok] + [(k, v, False) for k, (_, no) in TABLE.items() for v in no]


def test_the_table_covers_every_numeric_key():
    assert set(TABLE) == {k for k, f in TRAINER.items() if isinstance(f.rule, fields.Number)}


@pytest.fixture(scope="module")
def base_cfg(tmp_path_factory):
    cfg = compose(["model=tiny", "data=synthetic"]).cfg
    tmp = tmp_path_factory.mktemp("schema")
    cfg.run_dir, cfg.data.dir = str(tmp / "run"), str(tmp / "data")
    return cfg


def _with(cfg, key, value):
    out = cfg.copy()
    OmegaConf.update(out, key, value, merge=False)
    return out


def _launch_accepts(cfg, key: str | None = None) -> bool:
    """Launch finds nothing wrong with `key` (any key when None); a cross-key check such as
    max_seq_len <= max_tokens_per_micro_batch is not the key's own rule."""
    try:
        validate(cfg)
        return True
    except ConfigError as exc:
        return key is not None and not any(line.strip().startswith(f"{key} ") for line in str(exc).splitlines())


def _sft_accepts(cfg) -> bool:
    try:
        from_dictconfig(cfg)
        return True
    except ConfigError:
        return False


@pytest.mark.parametrize("key,value,accepted", CASES, ids=[f"{k}={v!r}" for k, v, _ in CASES])
def test_intended_values_through_launch_and_sft(base_cfg, key, value, accepted):
    assert (TRAINER[key].must(key, value) is None) is accepted
    cfg = _with(base_cfg, key, value)
    assert _launch_accepts(cfg, key) is accepted, f"launch: {key}={value!r}"
    assert _sft_accepts(cfg) is accepted, f"sft: {key}={value!r}"


def test_betas_and_choices(base_cfg):
    for betas, ok in (([0, 0.999], True), ([0.9, 0.95], True), ([1, 0.9], False), ([0.9, -0.1], False),
                      ([0.9], False), ([0.9, 0.99, 0.9], False)):
        cfg = _with(base_cfg, "train.betas", betas)
        assert (_launch_accepts(cfg), _sft_accepts(cfg)) == (ok, ok), betas
    for key, good, bad in (("model.attn_implementation", "eager", "flash"), ("train.precision", "bf16", "fp16"),
                           ("train.lr_schedule", "linear", "cosin"), ("model.liger", True, "yes"), ("model.liger", "false", 0),
                           ("logging.mode", "offline", "quiet"), ("model.init", "random", "zeros")):
        assert _launch_accepts(_with(base_cfg, key, good)) and _sft_accepts(_with(base_cfg, key, good))
        assert not _launch_accepts(_with(base_cfg, key, bad)) and not _sft_accepts(_with(base_cfg, key, bad))


@pytest.mark.parametrize("key,good,bad", [("data.max_seq_len", 16, 15), ("data.n", 1, 0),
                                          ("data.history_reasoning", "reject", "sometimes"), ("data.strict", True, "yes")])
def test_data_keys_launch_and_data_prep_agree(base_cfg, key, good, bad):
    """Launch checks the data keys with data_prep's own rule (was: max_seq_len > 0 vs >= 16)."""
    from data_prep.config import resolve

    for value, ok in ((good, True), (bad, False)):
        cfg = _with(base_cfg, key, value)
        assert _launch_accepts(cfg, key) is ok, (key, value)
        try:
            resolve(cfg.data)
            assert ok, (key, value)
        except ConfigError:
            assert not ok, (key, value)


def test_launch_and_sft_both_read_the_one_schema(base_cfg, monkeypatch):
    """Tightening one rule in sft.config changes what both readers accept."""
    cfg = _with(base_cfg, "train.lr", 0.5)
    assert _launch_accepts(cfg) and _sft_accepts(cfg)
    tighter = dataclasses.replace(TRAINER["train.lr"].rule, lo=1.0)
    monkeypatch.setitem(TRAINER, "train.lr", dataclasses.replace(TRAINER["train.lr"], rule=tighter))
    assert not _launch_accepts(cfg)
    assert not _sft_accepts(cfg)
    with pytest.raises(ConfigError, match="train.lr must be a number > 1"):
        compose(["model=tiny", "data=synthetic", "lr=0.5"])


def test_a_run_configured_before_the_schema_keeps_its_fingerprint():
    """tests/data/pre_schema_*: the resolved config and identity recorded by the code before issue 18
    (launch compose + common.fingerprint at main 2c5b919). The same request composes to the same
    config today, and both launch's and the trainer's identity of it are the recorded one, so a run
    dir made then is resumed, not refused."""
    recorded = json.loads((DATA / "pre_schema_identity.json").read_text())
    old = OmegaConf.load(DATA / "pre_schema_config.yaml")
    now = compose(recorded["argv"]).cfg
    now.run_dir, now.data.dir = old.run_dir, old.data.dir
    # Keys added since (issue 38's launcher.qos, the interpreters, issue 64's model.license, ...): each changes no
    # result (no IDENTITY role: excluded from the fingerprint) or is at its field's as-before value (left out of
    # it); every other key is as recorded. The identity below is of the full config.
    flat, was = fingerprint._flatten(OmegaConf.to_container(now)), fingerprint._flatten(OmegaConf.to_container(old))
    added = {k: v for k, v in flat.items() if k not in was}
    assert {"launcher.qos", "python.sft", "model.license"} <= set(added)
    assert set(added) & set(fingerprint.identity_keys(now, EXCLUDED_KEYS)) == set()
    assert {k: v for k, v in flat.items() if k not in added} == was
    extra = {"trainer_semantics": recorded["identity"]["trainer_semantics"],
             "data_fingerprint": recorded["identity"]["data_fingerprint"]}
    assert fingerprint.identity(now, EXCLUDED_KEYS, **extra) == recorded["identity"]
    del old.train["log_every"]   # a key without the IDENTITY role an older config.yaml lacks: read at its default
    trainer = from_dictconfig(old)   # the trainer reads the old file and fingerprints its raw config
    assert fingerprint.identity(trainer.raw, EXCLUDED_KEYS, **extra) == recorded["identity"]
    assert trainer.train.log_every == 1
