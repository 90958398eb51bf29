"""The vLLM tier: `launch stage=grpo ... grpo.use_vllm=true` end to end on CPU (torchrun, rl.train, vLLM
generating). A file of its own, apart from tests/test_vllm_grpo.py: the tier deals out whole files to its two
workers (`--dist loadfile`), and the two GRPO runs are its longest tests after the study."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.vllm


def test_launch_grpo_with_vllm_completes_on_cpu(tmp_path):
    """`launch stage=grpo ... grpo.use_vllm=true` end to end (torchrun, rl.train): vLLM generates."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-m", "launch.cli", "stage=grpo", "task=spa", "model=tiny_base", "steps=2",
                        f"runs_root={tmp_path}", "grpo.use_vllm=true", "grpo.completions_per_step=8", "grpo.num_generations=4",
                        "grpo.max_completion_length=32", "grpo.max_turns=2", "grpo.pilot_tasks=3"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    rd = tmp_path / "grpo_spa" / "seed0"
    rows = [json.loads(x) for x in (rd / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in rows] == [1, 2] and (rd / "DONE").is_file()
    assert all(x["vllm_logprob_diff_max"] is not None for x in rows)  # generation ran on vLLM
