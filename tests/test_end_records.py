"""End records (common.layout FAILED / REQUEUED): a run that failed is told from one still training and from
one requeued. Who writes them: the trainers (an exception: rank 0, atomically), the Slurm batch script (a
training step that exits non-zero or is killed, launcher.setup ending the job, a requeue; run here with the
stand-in srun/scontrol of launch_helpers), a local launch (a trainer killed outright); analyze reads them."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from launch_helpers import fake_cluster
from launch_helpers import requeued as requeued_jobs
from test_analysis_helpers import make_run, write_eval

from common import layout
from launch.analyze import run_analysis


# ------------------------------------------------------------------ the Slurm batch script's records
def _script(rd: Path, setup: str = "") -> str:
    from launch import slurm

    from launch.jobs import Job, Resources

    job = Job("t", "sft.train", config=str(rd / "config.yaml"), torchrun=1, cluster=slurm.Cluster(setup=setup),
              resources=Resources(gpus_per_node=1), logs="/dev")
    return slurm.SlurmRunner("launch").script(job, {}, rd)


# what the trainer writes for its own exception (common.layout.record_end under $DTSFT_LAUNCH_ID)
TRAINER_FAILED = ('printf \'{"state": "failed", "reason": "RuntimeError: boom", "by": "sft.train", '
                  '"launch": "%s"}\' "$DTSFT_LAUNCH_ID" > "$RUN_DIR_/FAILED"; exit 1\n')
# a refusal because another trainer holds the run (launch.refusal's record, no FAILED): that run has not failed
HELD = ('mkdir -p "$RUN_DIR_/logs"; printf \'{"code": 2, "error": "run is in use by another trainer", "launch": "%s"}\' '
        '"$DTSFT_LAUNCH_ID" > "$RUN_DIR_/logs/trainer-exit.json"; exit 1\n')
SCONTROL_NO_REQUEUE = '#!/bin/sh\ncase "$1" in requeue) echo "Requested operation is disabled" >&2; exit 1 ;; esac\n'


@pytest.mark.parametrize("case, srun_body, setup, rc, record, reason", [
    # the step killed outright (the OOM killer's SIGKILL): Python wrote nothing, the script says how it ended
    ("killed", "kill -9 $$\n", "", 137, "FAILED", "the training step exited with code 137 (killed by SIGKILL"),
    ("crashed", "exit 3\n", "", 3, "FAILED", "the training step exited with code 3"),
    # the trainer recorded its own reason for this segment: kept, not replaced by the script's
    ("trainer's own", TRAINER_FAILED, "", 1, "FAILED", "RuntimeError: boom"),
    # launcher.setup ends the job before training (the Slurm tier's planted failure)
    ("setup", "echo should-not-run\n", 'echo "planted"; exit 3', 3, "FAILED",
     "the job ended (exit 3) before training started"),
    ("stopped early", "exit 0\n", "", 0, "REQUEUED", "requeued to resume"),
    ("requeue refused", "exit 0\n", "", 0, "FAILED", "and scontrol requeue 77 failed"),
    ("finished", 'touch "$RUN_DIR_/DONE"; exit 0\n', "", 0, None, None),
    ("held by another trainer", HELD, "", 2, None, None),
])
def test_the_batch_script_records_how_a_segment_ended(tmp_path, case, srun_body, setup, rc, record, reason):
    rd = tmp_path / "run"
    rd.mkdir()
    # an earlier segment's record: stale once this segment starts
    layout.record_end(rd, layout.REQUEUED if record == "FAILED" else layout.FAILED, "an earlier segment", "slurm")
    script = tmp_path / "launch.sbatch"
    script.write_text(_script(rd, setup))
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    env = dict(fake_cluster(tmp_path, srun_body), RUN_DIR_=str(rd))
    if case == "requeue refused":
        (tmp_path / "fakebin" / "scontrol").write_text(SCONTROL_NO_REQUEUE)
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == rc, proc.stdout + proc.stderr
    assert "should-not-run" not in proc.stdout
    got = layout.end_record(rd)
    if record is None:
        assert got is None and not list(rd.glob(".*.tmp-*"))
        return
    assert got is not None, proc.stdout + proc.stderr
    assert got["state"] == record.lower() and reason in got["reason"], got
    assert not (rd / ("REQUEUED" if record == "FAILED" else "FAILED")).exists()   # one record at a time
    raw = json.loads((rd / record).read_text())   # JSON by its own reader, not only ours
    assert raw["launch"] == "slurm-77-0" and (raw["by"] == "sft.train") == (case == "trainer's own")
    assert requeued_jobs(tmp_path) == (["77"] if case == "stopped early" else [])


# ------------------------------------------------------------------ analyze tells them apart
def test_analyze_tells_a_failed_run_from_one_still_training_and_one_requeued(tmp_path):
    """Three runs that each have step 10 and expect step 20: one failed, one requeued, one still training."""
    root = tmp_path / "runs"
    for arm in ("failed", "requeued", "training"):
        make_run(root, arm, 0, [10], evaluated={10: {"nq": 0.5}}, horizon=20, save_steps=[10, 20], done=False)
    layout.record_end(root / "failed" / "seed0", layout.FAILED, "the training step exited with code 137\n(killed by "
                      "SIGKILL: out of memory?)", "slurm batch script")
    layout.record_end(root / "requeued" / "seed0", layout.REQUEUED, "stopped before the end; Slurm job 5_1 requeued "
                      "to resume", "slurm batch script")
    write_eval(root / "_anchor" / "eval" / "step-000000", {"nq": 0.1})
    out = tmp_path / "rep"
    res = run_analysis({"runs_root": str(root), "out": str(out), "benches": ["nq"], "evaluate": False})
    lines = [m.line() for m in res.missing]
    assert lines == [
        "failed/seed0/step-000020 × nq: failed: the training step exited with code 137 (killed by SIGKILL: out of "
        "memory?)",
        "requeued/seed0/step-000020 × nq: requeued: stopped before the end; Slurm job 5_1 requeued to resume",
        "training/seed0/step-000020 × nq: not checkpointed yet (run still training)"]
    report = (out / "report.md").read_text()
    assert all(line in report for line in lines)
    assert "| failed | 0 | failed |" in report and "| requeued | 0 | requeued |" in report
    assert "| training | 0 | not finished |" in report
    # DONE wins over a stale record (the run finished after it was written)
    from analysis.discover import discover_runs

    (root / "failed" / "seed0" / "DONE").write_text("")
    failed = next(r for r in discover_runs(root) if r.arm == "failed")
    assert failed.status() == "done" and failed.not_checkpointed() == "checkpoint missing although the run is done"


def test_an_unreadable_end_record_is_a_problem_not_a_crash(tmp_path):
    root = tmp_path / "runs"
    rd = make_run(root, "r2e", 0, [10], horizon=20, save_steps=[10, 20], done=False)
    (rd / "FAILED").write_text("{half")
    from analysis.discover import discover_runs

    run, = discover_runs(root)
    assert run.end is None and any("FAILED: unreadable JSON" in p for p in run.problems), run.problems
    assert run.not_checkpointed() == "not checkpointed yet (run still training)"


# ------------------------------------------------------------------ the trainers
@pytest.fixture(scope="module")
def sft_data(tmp_path_factory):
    from sft.copytask import make_dataset_dir

    return make_dataset_dir(tmp_path_factory.mktemp("sftdata") / "ds", n=8)


def test_the_sft_trainer_records_its_failure_and_clears_a_stale_record_when_it_starts(tmp_path, sft_data, monkeypatch):
    import sft.train
    from common import lock
    from sft.copytask import write_config

    rd = tmp_path / "run"
    # 1. a bad input before any training: FAILED with the error's line (the stale REQUEUED goes)
    cfg = write_config(rd, tmp_path / "no-such-data")
    layout.record_end(rd, layout.REQUEUED, "an earlier segment", "slurm")
    assert sft.train.cli([str(cfg)]) == 2
    rec = layout.end_record(rd)
    assert rec["state"] == "failed" and "no-such-data" in rec["reason"] and rec["by"] == "sft.train" and rec["code"] == 2
    assert not (rd / layout.REQUEUED).exists()
    # 2. a crash once the run is held: the stale record is gone when training starts, the crash recorded
    cfg = write_config(rd, sft_data)
    seen = {}

    def crash(*a, **kw):
        seen["at start"] = layout.end_record(rd)
        raise RuntimeError("boom at the model")

    monkeypatch.setattr(sft.train, "select_attn_implementation", crash)
    with pytest.raises(RuntimeError, match="boom"):
        sft.train.cli([str(cfg)])
    assert seen == {"at start": None}
    rec = layout.end_record(rd)
    assert rec["state"] == "failed" and rec["reason"] == "RuntimeError: boom at the model", rec
    # 3. refused because another trainer holds the run: that one has not failed; nothing is written
    (rd / layout.FAILED).unlink()
    fd = lock.acquire(rd / layout.TRAIN_LOCK, "a test")
    try:
        assert sft.train.cli([str(cfg)]) == 2
    finally:
        import os

        os.close(fd)
    assert layout.end_record(rd) is None


def test_a_local_launch_records_a_trainer_killed_outright(tmp_path):
    """torchrun killed by SIGKILL (what the OOM killer does): no Python ran to say so; launch records it,
    unless the trainer of this launch recorded its own failure."""
    from launch.run import report_end

    rd = tmp_path / "run"
    rd.mkdir()
    log = rd / "train.log"
    assert report_end(rd, 137, log, "L1") == 137   # run_logged's (and launch.torchrun's) code: 128 + N (seen failing: no "killed by")
    rec = layout.end_record(rd)
    assert rec["state"] == "failed" and "exited with code 137 (killed by SIGKILL: out of memory?)" in rec["reason"] and rec["launch"] == "L1"
    layout.record_end(rd, layout.FAILED, "RuntimeError: boom", "sft.train", launch="L2")
    report_end(rd, 1, log, "L2")
    assert layout.end_record(rd)["reason"] == "RuntimeError: boom"
    # a refusal because another trainer holds the run: not a failure of the run (the trainer wrote no FAILED)
    layout.clear_end(rd)
    (rd / "logs").mkdir()
    (rd / "logs" / layout.TRAINER_EXIT).write_text(json.dumps({"code": 2, "error": "in use by another trainer",
                                                               "launch": "L3"}))
    assert report_end(rd, 1, log, "L3") == 2
    assert layout.end_record(rd) is None


def test_the_grpo_trainer_records_its_pilot_guard_refusal(tmp_path, monkeypatch):
    """rl.train's refusal without an exception (the pilot guard: a reward hack within the margin) is recorded too."""
    from omegaconf import OmegaConf

    from envs.search_plan_act import pilot
    from launch.compose import compose_grpo
    from rl import train as rt
    from common.schema import run_dir

    cfg = compose_grpo(["task=spa", "model=tiny_base", f"runs_root={tmp_path}", "grpo.pilot_tasks=3"]).cfg
    cfg.run_dir = str(run_dir(cfg))
    Path(cfg.run_dir).mkdir(parents=True)
    OmegaConf.save(cfg, Path(cfg.run_dir) / "config.yaml")
    monkeypatch.setattr(pilot, "MIN_MARGIN", 0.99)   # as if a hack came within the margin
    assert rt.main([str(Path(cfg.run_dir) / "config.yaml")]) == 2
    rec = layout.end_record(cfg.run_dir)
    assert rec["state"] == "failed" and "the pilot guard" in rec["reason"] and rec["by"] == "rl.train", rec
