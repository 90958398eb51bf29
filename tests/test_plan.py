"""One training plan (common.plan): the trainer, launch and analysis agree on the save points,
including epoch-end saves and `train.steps: null` (all four arm recipes use it)."""
from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from analysis.discover import Run
from common.plan import late_saves, plan_line, planned, save_points, schedule, train_plan
from launch.compose import compose
from sft.config import load_config

CASES = [  # (train overrides, data.n, expected total, expected saves)
    ({"steps": None, "epochs": 2, "global_batch_size": 16, "save_steps": [50, 100], "save_epoch_ends": True}, 3500, 436, [50, 100, 218, 436]),
    ({"steps": None, "epochs": 1, "global_batch_size": 16, "save_steps": [50, 200], "save_epoch_ends": False}, 3500, 218, [50, 200, 218]),
    ({"steps": 10, "epochs": 1, "global_batch_size": 4, "save_steps": [3, 10], "save_epoch_ends": True}, 16, 10, [3, 4, 8, 10]),
    ({"steps": 5, "epochs": 1, "global_batch_size": 8, "save_steps": [], "save_epoch_ends": True}, 4, 5, [5]),
]


@pytest.mark.parametrize("train,n,total,saves", CASES)
def test_launch_sft_and_analysis_plan_the_same_saves(tmp_path, train, n, total, saves):
    from sft.copytask import write_config

    # launch: the composed recipe with these keys
    value = lambda v: "null" if v is None else ("[" + ",".join(map(str, v)) + "]" if isinstance(v, list) else v)  # noqa: E731
    cfg = compose(["model=tiny", "data=synthetic", f"n={n}", *(f"train.{k}={value(v)}" for k, v in train.items())]).cfg
    assert (planned(cfg)[0], list(planned(cfg)[1])) == (total, saves)
    assert plan_line(cfg) == f"{total} optimizer steps (for n={n}), {len(saves)} checkpoint(s) at {saves}"   # the dry run's line
    # sft: the trainer's own config reading and plan (sft.train.run), for a dataset of n trajectories
    path = write_config(tmp_path / "run", tmp_path / "data", **train)
    per_epoch, steps, points = train_plan(load_config(path).train, n)
    assert steps == total and list(points) == saves and [s for s in range(total + 2) if s in points] == saves
    # analysis: a run dir's resolved config.yaml, read as analysis reads it
    run = Run(arm="search", seed=0, path=tmp_path, config=OmegaConf.to_container(cfg, resolve=True))
    assert list(run.expected_steps()) == saves
    assert list(run.pending()) == saves and run.steps == sorted({saves[0], saves[-1]})   # a curve's: a gap from the first to the last


def test_a_huge_plan_is_never_listed(tmp_path):
    """steps=10**8 at 1 or 2 steps per epoch, saved at every epoch end: the trainer's membership test, the dry run's
    line and analysis' expected steps agree without listing the steps (listing them: minutes, then out of memory)."""
    from sft.copytask import write_config

    big, probes = 10**8, (0, 1, 2, 3, 5, 6, 10**8 - 1, 10**8, 10**8 + 5)
    for n, oracle, count, head, shown in ((1, lambda s: 0 < s <= big, big, [1, 2, 3], f"[1, 2, ..., {big - 1}, {big}]"),
                                          (2, lambda s: 0 < s <= big and (s % 2 == 0 or s == 3), big // 2 + 1, [2, 3, 4], f"[2, 3, ..., {big - 2}, {big}]")):
        train = {"steps": big, "epochs": 1, "global_batch_size": 1, "save_steps": [3, big + 5], "save_epoch_ends": True}
        _, total, points = train_plan(load_config(write_config(tmp_path / f"run{n}", tmp_path / "data", **train)).train, n)   # the trainer's
        expected = Run(arm="a", seed=0, path=tmp_path, config={"train": train, "data": {"n": n}}).expected_steps()   # analysis'
        for saved in (points, expected):
            assert (total, len(saved), list(itertools.islice(saved, 3))) == (big, count, head)
            assert [s for s in probes if s in saved] == [s for s in probes if oracle(s)]
        assert plan_line({"train": train, "data": {"n": n}}, edge=2) == f"{big} optimizer steps (for n={n}), {count} checkpoint(s) at {shown}"


def test_the_rule():
    assert schedule(steps=None, epochs=3, n_examples=10, global_batch_size=4) == (2, 6)
    assert save_points(save_steps=[1, 7], save_epoch_ends=True, per_epoch=2, total=6) == [1, 2, 4, 6]
    assert save_points(save_steps=[0], save_epoch_ends=False, per_epoch=0, total=0) == []
    total, points = planned({"train": {"steps": None, "epochs": 1, "global_batch_size": 2, "save_steps": [], "save_epoch_ends": True},
                             "data": {"n": 5}}, n_examples=9)
    assert (total, list(points)) == (4, [4])
    # a requested save step past the last (launch refuses it, the trainer names it); the key's default, a cadence, is cut there
    t = {"steps": None, "epochs": 2, "global_batch_size": 4, "save_steps": [3, 7, 9]}
    assert late_saves(t, 17) == ["train.save_steps: 9 is past the run's last step 8 (train.epochs=2 x floor(data.n=17 / "
                                 "train.global_batch_size=4) steps): no checkpoint would be written there; drop it or train longer"]
    assert late_saves(t, 17, {"train.save_steps": SimpleNamespace(default=[9, 7, 3])}) == late_saves(t, None) == late_saves(t, 20) == []
    assert late_saves({**t, "steps": 5}, None)[0].startswith("train.save_steps: 7, 9 are past the run's last step 5 (train.steps=5)")
    assert late_saves({"steps": 2, "save_steps": [1, 2]}, None) == []   # GRPO's section: no epochs
    # a launch plan's line: short lists whole; a billion steps saved at every step elided, counted without listing them
    train = {"steps": None, "epochs": 2, "global_batch_size": 16, "save_steps": [50, 100], "save_epoch_ends": True}
    assert plan_line({"train": train, "data": {"n": 3500}}) == "436 optimizer steps (for n=3500), 4 checkpoint(s) at [50, 100, 218, 436]"
    huge = {"train": {**train, "steps": 10**9 + 1, "global_batch_size": 1, "save_steps": [7, 10**9 + 1]}, "data": {"n": 1}}
    assert plan_line(huge, edge=2) == f"{10**9 + 1} optimizer steps (for n=1), {10**9 + 1} checkpoint(s) at [1, 2, ..., {10**9}, {10**9 + 1}]"


def test_analysis_without_a_plan_expects_only_what_exists(tmp_path):
    for config in (None, {"train": {"steps": "x"}}, {"train": "x", "data": {"n": 1}}):
        assert list(Run(arm="a", seed=0, path=tmp_path, config=config).expected_steps()) == []
