"""Multi-node training, as far as one box allows: two torchrun agents (`--nnodes=2`, one rank each) joining a
c10d rendezvous on loopback, started as launch/slurm.py's batch script starts one per node
(`python -m launch.torchrun --nnodes=N --nproc_per_node=P --rdzv_backend=c10d --rdzv_endpoint=HOST:PORT
--rdzv_id=ID -m sft.train CONFIG`), train exactly as one agent with two ranks: the same losses, step by
step (metrics.jsonl), and the same checkpoint bytes (its SHA256SUMS). The oracle is the single-node run."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from sft_helpers import ROOT, free_port, make_dataset_dir, rank_env, write_config

pytestmark = pytest.mark.slow   # four trainer processes and three torchrun agents

STEPS = 2


def _agents(config: Path, nodes: int, nproc: int, rdzv_id: str) -> list[int]:
    """`nodes` torchrun agents of `nproc` ranks each, on one c10d rendezvous at a free loopback port;
    their exit codes. Each agent's output goes to `agent<i>.log` beside the config."""
    endpoint = f"127.0.0.1:{free_port()}"
    env = rank_env(0, 1, 0)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k)   # an agent sets these for its workers
    cmd = [sys.executable, "-m", "launch.torchrun", f"--nnodes={nodes}", f"--nproc_per_node={nproc}",
           "--rdzv_backend=c10d", f"--rdzv_endpoint={endpoint}", f"--rdzv_id={rdzv_id}", "-m", "sft.train", str(config)]
    procs = []
    for i in range(nodes):
        with open(config.parent / f"agent{i}.log", "wb") as log:
            procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))   # its workers in its group
    try:
        return [p.wait(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:   # a hung rendezvous: the agent and its workers
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def _losses(run_dir: Path) -> list[tuple[int, float, float, int]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [(r["step"], r["loss"], r["grad_norm"], r["trainable_tokens"]) for r in rows]


def _checkpoint_sums(run_dir: Path) -> str:
    [step] = sorted((run_dir / "checkpoints").iterdir())
    return (step / "SHA256SUMS").read_text()


def test_two_agents_one_rank_each_train_as_one_agent_with_two_ranks(tmp_path):
    data = make_dataset_dir(tmp_path / "data", n=16)
    runs = {}
    for name, nodes, nproc in (("one_agent", 1, 2), ("two_agents", 2, 1)):
        rd = tmp_path / name
        # no warmup: step 1 updates the weights, so step 2's loss already follows a distributed update
        config = write_config(rd, data, steps=STEPS, save_steps=[STEPS], state_every=1000, warmup_ratio=0.0)
        codes = _agents(config, nodes, nproc, rdzv_id=f"dtsft-{name}")
        logs = "\n".join((rd / f"agent{i}.log").read_text(errors="replace")[-2000:] for i in range(nodes))
        assert codes == [0] * nodes, logs
        assert (rd / "DONE").is_file(), logs
        runs[name] = rd
    one, two = runs["one_agent"], runs["two_agents"]
    assert len(_losses(one)) == STEPS
    assert _losses(two) == _losses(one)
    assert _checkpoint_sums(two) == _checkpoint_sums(one)
