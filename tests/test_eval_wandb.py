"""evaluate's summary reaches wandb: the checkpoint's own training run (same id, resumed) or a
group-level eval run for a model outside a run dir. Real offline wandb runs (no network)."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from evals.wandb_log import log_summary, summary_row

SUMMARY = {"nq": {"em": 0.25, "f1": 0.5, "n": 4, "source": "x.jsonl"}, "search_plan_ood": {"reward": 0.125, "n": 2}}


def _wandb_file(root: Path, run_id: str, key: bytes) -> bytes:
    """The offline run's record file once it holds `key` (wandb's service writes it just after finish())."""
    (f,) = root.glob(f"wandb/offline-run-*-{run_id}/run-{run_id}.wandb")
    deadline = time.monotonic() + 60
    while key not in f.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.2)
    return f.read_bytes()


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))   # no netrc: not logged in
    rd = tmp_path / "study" / "r2e" / "seed0"
    rd.mkdir(parents=True)
    (rd / "wandb_id").write_text("abcd1234\n")
    OmegaConf.save(OmegaConf.create({"arm": "r2e", "seed": 0, "runs_root": str(tmp_path / "study"),
                                     "model": {"name": "tiny"},
                                     "logging": {"mode": "offline", "project": "p", "name": "r2e-s0"}}),
                   rd / "config.yaml")
    return rd


def _cfg(ckpt, out, **kw):
    return OmegaConf.create({"ckpt": str(ckpt), "out": str(out), "prompt": "tool_agent", "wandb": "auto",
                             "wandb_group": None, **kw})


def test_summary_row():
    assert summary_row(SUMMARY) == {"eval/nq/em": 0.25, "eval/nq/f1": 0.5, "eval/nq/n": 4,
                                    "eval/search_plan_ood/reward": 0.125, "eval/search_plan_ood/n": 2}
    assert summary_row(SUMMARY, "rl_ood")["eval/rl_ood/nq/em"] == 0.25  # a profile keeps its own keys


def test_checkpoint_of_a_run_logs_to_that_run(run_dir):
    ckpt = run_dir / "checkpoints" / "step-000004"
    cfg = _cfg(ckpt, run_dir / "eval" / "step-000004")
    assert log_summary(cfg, SUMMARY) is None          # auto: offline would not upload -> not logged
    assert not (run_dir / "wandb").exists()
    note = log_summary(_cfg(ckpt, cfg.out, wandb=True), SUMMARY)
    assert note.startswith("wandb offline run abcd1234 (p/study)")
    data = _wandb_file(run_dir, "abcd1234", b"eval/search_plan_ood/reward")   # the training run id, resumed
    for key in (b"eval/nq/em", b"eval/search_plan_ood/reward", b"eval/step"):
        assert key in data
    assert log_summary(_cfg(ckpt, cfg.out, wandb=False), SUMMARY) is None


def test_a_grpo_checkpoint_logs_to_its_run_under_the_tags_its_trainer_gave_it(run_dir):
    """The evaluation resumes the training run with the tags that run was made with (rl.train: stage:grpo; sft:
    the model's path when it has no name); seen: a GRPO run re-tagged stage:sft and model:? by its evaluation."""
    cfg = OmegaConf.load(run_dir / "config.yaml")
    cfg.stage, cfg.model = "grpo", {"name": "qwen3_4b", "path": "/ckpts/sft/step-000100"}
    OmegaConf.save(cfg, run_dir / "config.yaml")
    ckpt = run_dir / "checkpoints" / "step-000004"
    assert log_summary(_cfg(ckpt, run_dir / "eval" / "step-000004", wandb=True), SUMMARY)
    data = _wandb_file(run_dir, "abcd1234", b"eval/search_plan_ood/reward")
    assert b"stage:grpo" in data and b"model:qwen3_4b" in data and b"stage:sft" not in data
    # an SFT run whose model has no name: its trainer tagged the model's path (sft.metrics)
    cfg.stage, cfg.model = "sft", {"name": None, "path": "Qwen/Qwen3-4B"}
    OmegaConf.save(cfg, run_dir / "config.yaml")
    (run_dir / "wandb_id").write_text("efgh5678\n")
    assert log_summary(_cfg(ckpt, run_dir / "eval" / "step-000004", wandb=True), SUMMARY)
    data = _wandb_file(run_dir, "efgh5678", b"eval/search_plan_ood/reward")
    assert b"stage:sft" in data and b"model:Qwen/Qwen3-4B" in data and b"model:?" not in data


def test_model_outside_a_run_gets_a_group_eval_run(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    out = tmp_path / "reports" / "anchor"
    note = log_summary(_cfg("Qwen/Qwen3-4B", out, wandb=True, wandb_group="study"), SUMMARY)
    run_id = note.split()[3]
    assert note.endswith("(dtsft/study)") and len(run_id) == 12
    assert b"eval/nq/f1" in _wandb_file(out, run_id, b"eval/nq/f1")
    assert not (out / "wandb_id").exists()
    again = log_summary(_cfg("Qwen/Qwen3-4B", out, wandb=True, wandb_group="study"), SUMMARY)
    assert again.split()[3] == run_id                   # one eval run per output directory


def test_analysis_table_to_the_study_group(tmp_path, monkeypatch):
    import pandas as pd

    from analysis.wandb_log import log_results

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    table = pd.DataFrame({"arm": ["r2e", "search"], "seed": [0, 0], "step": [4, 4], "bench": ["nq", "nq"],
                          "metric": ["em", "em"], "value": [0.25, 0.5], "n": [4, 4]})
    out = tmp_path / "reports"
    assert log_results(table, runs_root=str(tmp_path / "study"), out=out) is None   # auto, offline: not logged
    note = log_results(table, runs_root=str(tmp_path / "study"), out=out, setting=True)
    assert note.endswith("(dtsft/study)")
    (media,) = out.glob("wandb/offline-run-*/files/media/table/results_*.table.json")
    import json

    data = json.loads(media.read_text())
    assert data["columns"] == list(table.columns) and [r[5] for r in data["data"]] == [0.25, 0.5]
