"""Issue 60 step 3 / issue 65 item 7: a launch's or sweep's `dry_run=true` starts with its plan of Jobs on one
screen (job, module, after, interpreter, resources, needs) and writes each run's resolved config and the job's
script under a temporary directory it names: never into the working directory or the runs root."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml

from common.fields import field
from launch import jobs
from launch.cli import main
from launch.errors import LaunchError
from launch.local import LocalRunner


def _plan(out: str) -> tuple[list[str], Path]:
    """The plan block a dry run starts with (up to its `[dry run]` line) and the directory that line names."""
    lines = out.splitlines()
    end = next(i for i, line in enumerate(lines) if line.startswith("[dry run]"))
    return lines[:end + 1], Path(re.search(r"written under (\S+) \(nothing started", lines[end])[1])


@pytest.mark.parametrize("launcher", ["local", "slurm"])
def test_a_three_run_sweeps_dry_run_starts_with_its_plan_on_one_screen(tmp_path, monkeypatch, capsys, launcher):
    cwd, runs = tmp_path / "cwd", tmp_path / "runs"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    assert main(["sweep", "arms=[r2e,search,mixed]", "seeds=[0]", "model=tiny", "data=synthetic", "steps=4",
                 f"launcher={launcher}", "gpus_per_node=2", "dry_run=true", f"runs_root={runs}"]) == 0
    out = capsys.readouterr().out
    plan, where = _plan(out)
    assert len(plan) <= 40 and plan[0] == "# the plan: 1 job(s), in order", "\n".join(plan)
    assert plan[1].split() == ["job", "module", "after", "interpreter", "resources", "needs"]
    row = plan[2]
    assert row.split()[:4] == ["sweep", "sft.train", "-", sys.executable]
    gpus = "1 node(s) x 2 GPU(s), torchrun 1x2" if launcher == "slurm" else "1 node(s), no GPU, torchrun 1x1"
    assert f"3 tasks, {gpus}" in row and "import torch" in row
    assert str(runs / "_data") in row   # what it reads: the arms' datasets, in the cache
    # written under the directory it names: each run's resolved config and the one job's script
    configs = [yaml.safe_load((where / f"sweep-{i}.config.yaml").read_text()) for i in range(3)]
    assert [(c["arm"], c["run_dir"]) for c in configs] == [(a, str(runs / a / "seed0")) for a in ("r2e", "search", "mixed")]
    assert len({c["data"]["dir"] for c in configs}) == 3, "each run's dataset its own arm's (seen failing: all r2e's)"
    script = (where / ("sweep.sbatch" if launcher == "slurm" else "sweep.sh")).read_text()
    assert [str(runs / a / "seed0") in script for a in ("r2e", "search", "mixed")] == [True] * 3
    assert ("#SBATCH --array=0-2" in script) == (launcher == "slurm")
    assert list(cwd.iterdir()) == [] and not runs.exists() and not where.is_relative_to(cwd)


class PickyRunner(LocalRunner):
    """A backend (as launch/<kind>.py would be) that plans no job without its own setting launcher.hosts."""
    keys = {"launcher.hosts": field("picky: its hosts", [], ())}

    @classmethod
    def cluster(cls, launcher):
        if not launcher.hosts:
            raise LaunchError("launcher=picky needs launcher.hosts")
        return super().cluster(launcher)


def test_a_launchs_dry_run_starts_with_its_one_job(tmp_path, monkeypatch, capsys):
    """(GRPO's shows every backend's script; one it cannot make, why.)"""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(jobs.BACKENDS, "picky", f"{__name__}:PickyRunner")
    assert main(["stage=grpo", "task=spa", "model=tiny_base", "steps=2", "dry_run=true", f"runs_root={tmp_path / 'r'}"]) == 0
    out = capsys.readouterr().out
    assert f"# launcher=picky: {tmp_path}/r/grpo_spa/seed0/launch.sh (not written: dry_run=true)\n(none: launcher=picky needs " \
           "launcher.hosts)\n" in out and "# launcher=slurm: " in out
    plan, where = _plan(out)
    assert len(plan) == 4 and plan[2].split()[:4] == ["launch", "rl.train", "-", sys.executable], "\n".join(plan)
    assert "1 node(s), no GPU, torchrun 1x1" in plan[2] and "import peft" in plan[2]
    config = yaml.safe_load((where / "launch.config.yaml").read_text())
    assert config["stage"] == "grpo" and config["launcher"]["hosts"] == [], "a backend's own key: in the GRPO config too"
    assert "-m rl.train" in (where / "launch.sh").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == []
