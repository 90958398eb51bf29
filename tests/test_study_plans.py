"""The structured golden plans (tests/snapshots/plans/): every study file's dry run, local and on Slurm, with
a stand-in file for every data slot, recorded by tests/plan_capture.py (the jobs' modules, interpreters,
resolved values, dependencies and resources, normalised). A plan that changes on purpose changes its golden
file in the same commit, with the reason (`python -m tests.plan_capture` rewrites them)."""
from __future__ import annotations

import difflib

import pytest

from tests.plan_capture import GOLDEN, LAUNCHERS, STUDY_FILES, dump, golden_name, plans


@pytest.fixture(scope="module")
def current_plans(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        data = tmp_path_factory.mktemp("data")
        mp.setenv("DTSFT_DATA", str(data))
        mp.setenv("DTSFT_DATA_ENDPOINT", "http://127.0.0.1:9")
        mp.setenv("WANDB_MODE", "disabled")
        return plans(mp, tmp_path_factory.mktemp("cwd"))


def test_every_study_file_has_a_golden_plan():
    assert sorted(p.name for p in GOLDEN.glob("*.yaml")) == sorted(golden_name(s, k) for s in STUDY_FILES for k in LAUNCHERS)


@pytest.mark.parametrize("name", [golden_name(s, k) for s in STUDY_FILES for k in LAUNCHERS])
def test_the_plan_is_the_golden_one(current_plans, name):
    want, got = (GOLDEN / name).read_text(encoding="utf-8"), dump(current_plans[name])
    assert got == want, f"{name} differs from its golden plan:\n" + "".join(
        difflib.unified_diff(want.splitlines(True), got.splitlines(True), "golden", "now", n=2))
