"""One training plan (common.plan): the trainer, launch and analysis agree on the save points,
including epoch-end saves and `train.steps: null` (all four arm recipes use it)."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from analysis.discover import Run
from common.plan import plan_line, planned, save_points, schedule
from launch.compose import compose
from sft.config import load_config

CASES = [  # (train overrides, data.n, expected total, expected saves)
    ({"steps": None, "epochs": 2, "global_batch_size": 16, "save_steps": [50, 100], "save_epoch_ends": True}, 3500, 436, [50, 100, 218, 436]),
    ({"steps": None, "epochs": 1, "global_batch_size": 16, "save_steps": [50, 300], "save_epoch_ends": False}, 3500, 218, [50, 218]),
    ({"steps": 10, "epochs": 1, "global_batch_size": 4, "save_steps": [3, 10, 20], "save_epoch_ends": True}, 16, 10, [3, 4, 8, 10]),
    ({"steps": 5, "epochs": 1, "global_batch_size": 8, "save_steps": [], "save_epoch_ends": True}, 4, 5, [5]),
]


@pytest.mark.parametrize("train,n,total,saves", CASES)
def test_launch_sft_and_analysis_plan_the_same_saves(tmp_path, train, n, total, saves):
    from sft.copytask import write_config

    # launch: the composed recipe with these keys
    value = lambda v: "null" if v is None else ("[" + ",".join(map(str, v)) + "]" if isinstance(v, list) else v)  # noqa: E731
    cfg = compose(["model=tiny", "data=synthetic", f"n={n}", *(f"train.{k}={value(v)}" for k, v in train.items())]).cfg
    assert planned(cfg) == (total, saves)
    # sft: the trainer's own config reading, for a dataset of n trajectories
    path = write_config(tmp_path / "run", tmp_path / "data", **train)
    t = load_config(path).train
    per_epoch, steps = schedule(steps=t.steps, epochs=t.epochs, n_examples=n, global_batch_size=t.global_batch_size)
    assert steps == total and save_points(save_steps=t.save_steps, save_epoch_ends=t.save_epoch_ends, per_epoch=per_epoch,
                                          total=steps) == saves
    # analysis: a run dir's resolved config.yaml, read as analysis reads it
    run = Run(arm="search", seed=0, path=tmp_path, config=OmegaConf.to_container(cfg, resolve=True))
    assert run.expected_steps() == saves
    assert run.steps == saves


def test_the_rule():
    assert schedule(steps=None, epochs=3, n_examples=10, global_batch_size=4) == (2, 6)
    assert save_points(save_steps=[1, 7], save_epoch_ends=True, per_epoch=2, total=6) == [1, 2, 4, 6]
    assert save_points(save_steps=[0], save_epoch_ends=False, per_epoch=0, total=0) == []
    assert planned({"train": {"steps": None, "epochs": 1, "global_batch_size": 2, "save_steps": [], "save_epoch_ends": True},
                    "data": {"n": 5}}, n_examples=9) == (4, [4])
    # a launch plan's line: short lists whole; a billion steps saved at every step elided, counted without listing them
    train = {"steps": None, "epochs": 2, "global_batch_size": 16, "save_steps": [50, 100], "save_epoch_ends": True}
    assert plan_line({"train": train, "data": {"n": 3500}}) == "436 optimizer steps (for n=3500), 4 checkpoint(s) at [50, 100, 218, 436]"
    huge = {"train": {**train, "steps": 10**9 + 1, "global_batch_size": 1, "save_steps": [7, 10**9 + 1]}, "data": {"n": 1}}
    assert plan_line(huge, edge=2) == f"{10**9 + 1} optimizer steps (for n=1), {10**9 + 1} checkpoint(s) at [1, 2, ..., {10**9}, {10**9 + 1}]"


def test_analysis_without_a_plan_expects_only_what_exists(tmp_path):
    assert Run(arm="a", seed=0, path=tmp_path, config=None).expected_steps() == []
    assert Run(arm="a", seed=0, path=tmp_path, config={"train": {"steps": "x"}}).expected_steps() == []
