"""launch end to end on this CPU with the real data_prep and trainer:
`launch arm=r2e steps=4 model=tiny data=synthetic save_steps=[2,4]` -> checkpoints that load with
transformers; a re-launch of a finished run does not retrain; a second run reuses the cached
dataset; a run killed with SIGKILL mid-training resumes when the same command is run again.

The data is kept small (n, short synthetic code trajectories) so the whole file stays within the
launch test budget; the code path is the embedded default's.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from launch.jobs import REPO
from launch_helpers import SRUN_EXEC, descendants, fake_cluster, requeued, signal_all, wait_until

pytestmark = pytest.mark.slow

SMALL = ["n=24", "data.synthetic.code_turns=[1,2]", "data.synthetic.long_fraction=0.0",
         "data.synthetic.n_entities=20", "data.synthetic.code_obs_lines=[1,3]"]


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="offline", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    env.pop("RANK", None)
    return env


def _launch(*argv: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launch.cli", *argv], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def launch_here(monkeypatch, capfd):
    """launch in this process (launch.cli.main, what `python -m launch.cli` runs) -> (exit code, stdout, stderr): for
    the launches that only report or refuse a run, which start no trainer (a process start-up would be most of it)."""
    from launch.cli import main

    for key, value in _env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.chdir(REPO)

    def run(*argv: str) -> tuple[int, str, str]:
        capfd.readouterr()
        code = main(list(argv))
        return (code, *capfd.readouterr())
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("launch_runs")


@pytest.fixture(scope="module")
def first_run(runs):
    argv = ["arm=r2e", "steps=4", "model=tiny", "data=synthetic", "save_steps=[2,4]", f"runs_root={runs}", *SMALL]
    proc = _launch(*argv)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return argv, proc


def test_tiny_run_writes_loadable_checkpoints(runs, first_run):
    from transformers import AutoModelForCausalLM

    from common.io import check_sha256sums

    _, proc = first_run
    rd = runs / "r2e" / "seed0"
    assert (rd / "DONE").is_file()
    assert sorted(p.name for p in (rd / "checkpoints").iterdir()) == ["step-000002", "step-000004"]
    for ckpt in (rd / "checkpoints").iterdir():
        assert check_sha256sums(ckpt) == []
        model = AutoModelForCausalLM.from_pretrained(ckpt)
        assert model.config.hidden_size == 128
    steps = [json.loads(line)["step"] for line in (rd / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    man = json.loads((rd / "manifest.json").read_text())
    assert man["data"]["fingerprint"] and man["data"]["reused"] is False and man["git"]["commit"]
    logs = list((rd / "logs").glob("train-*.log"))
    assert len(logs) == 1 and "training finished" in logs[0].read_text()
    assert "building the r2e dataset" in proc.stdout


def test_finished_run_is_reported_not_retrained(runs, first_run, launch_here):
    argv, _ = first_run
    code, out, _ = launch_here(*argv)
    assert code == 0 and "is finished (DONE exists); not retraining" in out
    assert len(list((runs / "r2e" / "seed0" / "logs").glob("train-*.log"))) == 1


def test_finished_run_with_another_lr_is_refused_and_a_named_variant_trains(runs, first_run, launch_here):
    """Run identity: the finished run is not handed back for another lr; name= trains it separately."""
    argv, _ = first_run
    code, out, err = launch_here(*argv, "lr=5e-4")
    assert code == 2 and "train.lr: 0.002 -> 0.0005" in err, out + err
    assert "name=<variant>" in err and "resume=never" in err and "Traceback" not in err
    assert "not retraining" not in out
    variant = _launch(*argv, "lr=5e-4", "name=lr5e-4")
    assert variant.returncode == 0, variant.stdout[-3000:] + variant.stderr[-3000:]
    vd = runs / "r2e" / "lr5e-4" / "seed0"
    assert (vd / "DONE").is_file() and (vd / "checkpoints" / "step-000004").is_dir()
    assert json.loads((vd / "manifest.json").read_text())["identity"]["keys"]["train.lr"] == 5e-4
    assert json.loads((runs / "r2e" / "seed0" / "manifest.json").read_text())["identity"]["keys"]["train.lr"] == 2e-3


def test_killed_run_resumes_and_reuses_the_cached_dataset(runs, first_run, launch_here, capfd):
    data_dirs = [p for p in (runs / "_data").iterdir() if not p.name.startswith(".")]
    rd = runs / "killed"
    argv = ["arm=r2e", "steps=6", "model=tiny", "data=synthetic", "state_every=2", "save_steps=[6]",
            f"run_dir={rd}", f"runs_root={runs}", *SMALL]
    proc = subprocess.Popen([sys.executable, "-m", "launch.cli", *argv], cwd=REPO, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        wait_until(lambda: list(rd.glob("state/step-*/COMPLETE")), proc, "a resumable state")
        signal_all([*descendants(proc.pid), proc.pid], signal.SIGKILL)   # kill -9 launch, torchrun, trainer
        out = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "reusing cached dataset" in out, out[-3000:]
    assert not (rd / "DONE").exists(), "the run finished before it could be killed"
    assert [p for p in (runs / "_data").iterdir() if not p.name.startswith(".")] == data_dirs

    # Relaunched (or the trainer started directly) with another lr / schedule / steps: refused, exit 2,
    # before any data or model work; the run is untouched and still resumes with its own config.
    metrics_before = (rd / "metrics.jsonl").read_bytes()
    code, out, err = launch_here(*argv, "lr=1e-4", "train.lr_schedule=constant", "steps=7")
    assert code == 2, out[-2000:] + err[-2000:]
    for line in ("train.lr: 0.002 -> 0.0001", "train.lr_schedule: 'cosine' -> 'constant'", "train.steps: 6 -> 7"):
        assert line in err
    assert "dataset" not in out
    from sft.train import cli as sft_train   # what `python -m sft.train` runs; it refuses before any process group or model
    code = sft_train([str(rd / "config.yaml"), "train.lr=1e-4"])
    err = capfd.readouterr().err
    assert code == 2 and "train.lr: 0.002 -> 0.0001" in err, err[-2000:]
    assert "Traceback" not in err and (rd / "metrics.jsonl").read_bytes() == metrics_before

    again = _launch(*argv)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert (rd / "DONE").is_file() and (rd / "checkpoints" / "step-000006").is_dir()
    assert "resuming:" in again.stdout
    last_log = sorted((rd / "logs").glob("train-*.log"))[-1].read_text()
    assert "resumed from" in last_log
    steps = [json.loads(line)["step"] for line in (rd / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 6 and steps.count(1) == 1, "the resumed segment continues, not restarts"
    man = json.loads((rd / "manifest.json").read_text())
    assert len(man["launches"]) == 2 and all(e["data"]["reused"] for e in man["launches"])


def test_sigterm_to_launch_stops_the_trainer_with_a_resumable_state(runs, first_run):
    rd = runs / "terminated"
    # far more steps than can run before the SIGTERM below, whatever the machine's load: the test decides when it ends
    argv = ["arm=r2e", "steps=1000000", "model=tiny", "data=synthetic", "state_every=100", f"run_dir={rd}",
            f"runs_root={runs}", *SMALL]
    proc = subprocess.Popen([sys.executable, "-m", "launch.cli", *argv], cwd=REPO, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    metrics = rd / "metrics.jsonl"
    try:
        wait_until(lambda: metrics.exists() and metrics.read_text().strip(), proc, "the first training step")
        # A second trainer started directly beside the live launch is refused by the trainer's own lock.
        second = subprocess.run([sys.executable, "-m", "sft.train", str(rd / "config.yaml")], cwd=REPO, env=_env(),
                                capture_output=True, text=True, timeout=120)
        assert proc.poll() is None, "the launch ended before the second trainer was tried"
        assert second.returncode == 2 and "in use by another trainer (holder: pid" in second.stderr, second.stderr[-2000:]
        proc.send_signal(signal.SIGTERM)   # launch alone: it must reach the trainer
        out = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            signal_all([*descendants(proc.pid), proc.pid], signal.SIGKILL)
    assert proc.returncode == 0, out[-3000:]
    assert "stopped (exit 0); re-run the same command to resume" in out
    assert list(rd.glob("state/step-*/COMPLETE")) and not (rd / "DONE").exists()


def test_slurm_segment_stops_on_usr1_requeues_and_the_next_segment_resumes(runs, first_run, tmp_path):
    """The generated sbatch script, run by bash with stand-in srun/scontrol on this machine: the real
    torchrun (c10d rendezvous) and trainer; SIGUSR1 to the step's processes as Slurm sends it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text("#!/bin/sh\necho 77\n")
    (bin_dir / "sbatch").chmod(0o755)
    rd = runs / "slurm"
    env = dict(_env(), PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    argv = ["arm=r2e", "steps=6", "model=tiny", "data=synthetic", "launcher=slurm", "nproc=1", "state_every=100",
            "save_steps=[6]", f"run_dir={rd}", f"runs_root={runs}", *SMALL]
    sub = subprocess.run([sys.executable, "-m", "launch.cli", *argv], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=300)
    assert sub.returncode == 0 and "Slurm job 77" in sub.stdout, sub.stdout + sub.stderr
    script = rd / "launch.sbatch"
    port = str(29700 + os.getpid() % 200)
    senv = dict(fake_cluster(tmp_path, SRUN_EXEC), **{k: v for k, v in _env().items() if k != "PATH"},
                DTSFT_RDZV_PORT=port)
    seg = subprocess.Popen(["bash", str(script)], env=senv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, start_new_session=True)
    metrics = rd / "metrics.jsonl"
    try:
        wait_until(lambda: metrics.exists() and metrics.read_text().strip(), seg, "the first training step")
        # Slurm signals every process of the job step (torchrun and the trainer), not the batch shell.
        signal_all(descendants(seg.pid), signal.SIGUSR1)
        out = seg.communicate(timeout=180)[0]
    finally:
        if seg.poll() is None:
            signal_all([*descendants(seg.pid), seg.pid], signal.SIGKILL)
    assert seg.returncode == 0, out[-3000:]
    assert not (rd / "DONE").exists() and list(rd.glob("state/step-*/COMPLETE")), out[-3000:]
    assert requeued(tmp_path) == ["77"] and "requeueing 77" in out

    # A requeued segment that finds another run identity (config.yaml edited between segments) fails
    # (the trainer exits 2) and is not requeued; with the config restored the next segment resumes.
    config = rd / "config.yaml"
    original = config.read_text()
    config.write_text(original.replace("lr: 0.002", "lr: 0.0001"))
    bad = subprocess.run(["bash", str(script)], env=senv, capture_output=True, text=True, timeout=300)
    config.write_text(original)
    # torchrun reports a worker's exit 2 as its own exit 1; the segment exits with the trainer's 2 (its refusal)
    assert bad.returncode == 2 and "train.lr: 0.002 -> 0.0001" in bad.stdout + bad.stderr, bad.stdout[-3000:]
    assert "error: " in bad.stderr and "train.lr: 0.002 -> 0.0001" in bad.stderr.split("error: ")[-1]
    assert "not requeueing" in bad.stdout and requeued(tmp_path) == ["77"]

    again = subprocess.run(["bash", str(script)], env=senv, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert (rd / "DONE").is_file() and (rd / "checkpoints" / "step-000006").is_dir()
    assert "resumed from" in again.stdout + again.stderr
    assert requeued(tmp_path) == ["77"], "a finished segment must not requeue"
