"""A study's dry run checks every key it is given against every stage, also a stage whose data slots are
not filled yet (issue #62 item 10), and `smoke=true` runs the study file's own cpu_smoke overrides
(issue #65 item 5); dry runs only, in-process."""
from __future__ import annotations

from pathlib import Path

import pytest

from launch.cli import main


@pytest.fixture
def here(tmp_path, tmp_path_factory, monkeypatch):
    """An empty working directory; the GPU environment's modules and the unpinned sets a user pre-fills
    given as stand-ins (tests/plan_capture.py), so the studies' preflight passes."""
    from tests.plan_capture import gpu_env_stand_in, unpinned_stand_ins

    outside = tmp_path_factory.mktemp("stand_ins")
    monkeypatch.setenv("DTSFT_DATA", str(outside / "data"))
    monkeypatch.setenv("DTSFT_DATA_ENDPOINT", "http://127.0.0.1:9")
    gpu_env_stand_in(outside, monkeypatch)
    unpinned_stand_ins(outside)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    return tmp_path


def test_an_unknown_key_for_a_stage_with_an_unfilled_slot_is_refused(here, capsys):
    # train (the sweep) waits for nq_rollouts=...: its keys are checked all the same
    assert main(["study=dual_terminator_sft", "smokez=true", "dry_run=true"]) == 2
    err = capsys.readouterr().err
    assert "stage train" in err and "'smokez'" in err and "Did you mean: smoke?" in err
    assert main(["study=qwen3_4b_multihop_sft_grpo", "grpo:grpo.temperatur=0.5", "dry_run=true"]) == 2
    assert "stage grpo" in capsys.readouterr().err
    # a stage's several problems, each named on its one line (it ended at "invalid config:", naming none)
    assert main(["study=qwen3_4b_spa_grpo", "train:grpo.temperature=-1", "train:steps=0", "dry_run=true"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: study qwen3_4b_spa_grpo: stage train refuses its settings: invalid config: train.steps must be a positive "
        "integer, got 0; grpo.temperature must be a positive number, got -1"]
    # an export stage's values are checked by its keys' rules (seen failing: exit 0)
    assert main(["study=browsecomp_worker_export", "checkpoint=ckpt", "tokenizer=tok", "export:dtype=5", "dry_run=true"]) == 2
    assert "stage export refuses its settings: dtype=5: expected bf16" in capsys.readouterr().err
    # ... also while the stage's data slots are unfilled: only a problem naming a key left out for a slot waits
    assert main(["study=browsecomp_worker_export", "export:dtype=5", "dry_run=true"]) == 2
    assert "stage export refuses its settings: dtype=5: expected bf16" in capsys.readouterr().err
    assert main(["study=qwen3_4b_multihop_sft_grpo", "grpo:grpo.temperature=-1", "dry_run=true"]) == 2
    assert "stage grpo refuses its settings" in capsys.readouterr().err
    # a report comparing an arm no stage trains (nor runs_root holds): seen failing, refused only after the training
    assert main(["study=qwen3_4b_spa_grpo", "report:compare=[[grpo_spa,bogus]]", "dry_run=true"]) == 2
    assert "stage report refuses its settings: compare: no run of arm 'bogus' under" in capsys.readouterr().err
    # the same dry runs without the typos: the unfilled slots are named, nothing refused
    assert main(["study=qwen3_4b_multihop_sft_grpo", "dry_run=true"]) == 0
    assert capsys.readouterr().out.count("(not resolved: set hotpotqa_") == 2
    assert not any(here.iterdir())


def test_smoke_runs_the_studys_cpu_smoke_overrides(here, capsys):
    import re

    import yaml

    from common.study import load_study

    assert main(["study=dual_terminator_sft", "smoke=true", "report:eval.n=3", "dry_run=true"]) == 0
    out = capsys.readouterr().out
    smoke = load_study("dual_terminator_sft").cpu_smoke
    assert "model=tiny_base" in smoke and "train:steps=2" in smoke and "report:eval.n=2" in smoke
    where = Path(re.findall(r"config and script is written under (\S+) \(nothing started", out)[-1])
    # train:seeds=[0] train:arms=[r2e]: one run planned (the sweep's job: one task)
    run = yaml.safe_load((where / "train-0.config.yaml").read_text())
    assert not (where / "train-1.config.yaml").exists() and run["run_dir"].endswith("r2e/seed0")
    assert run["model"]["path"] == "tiny_base" and run["train"]["steps"] == 2
    assert yaml.safe_load((where / "report.yaml").read_text())["eval"]["n"] == 3   # the command line's, last
    assert not any(here.iterdir())
    assert main(["study=browsecomp_worker_export", "smoke=true", "dry_run=true"]) == 2
    assert "browsecomp_worker_export has no cpu_smoke overrides" in capsys.readouterr().err
