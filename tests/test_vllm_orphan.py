"""The vLLM tier: `evaluate backend=vllm` killed with SIGKILL (the OOM killer, a forced stop) leaves no
engine process behind. vLLM's `VLLM::EngineCore` is a child of evaluate that nothing in vLLM stops when
its parent dies (it would keep its memory, on a GPU the device, through the documented rerun);
evals.reaper's watcher stops it."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evals.reaper import descendants, start_time
from tests.conftest import ROOT, installed_or_skip

pytestmark = pytest.mark.vllm


def _running(pid: int, started: str | None) -> bool:
    """Whether `pid` still runs as the process that started at `started` (a zombie holds nothing but its pid)."""
    return started is not None and start_time(pid) == started


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_sigkill_of_evaluate_leaves_no_engine_process(tmp_path):
    installed_or_skip("vllm")
    # search_plan_ood: enough episodes (64, up to 24 turns each) that the engine is busy when evaluate is killed
    args = [f"ckpt={ROOT / 'common' / 'tiny_base'}", "benches=[search_plan_ood]", "n=64", "max_model_len=4096",
            "max_new_tokens=256", "dtype=float32", "backend=vllm", "progress=false", "wandb=false",
            f"out={tmp_path / 'out'}"]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"), "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "evals.cli", *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    held: dict[int, str | None] = {}
    try:
        deadline = time.monotonic() + 420
        while time.monotonic() < deadline and proc.poll() is None:
            held = {p: start_time(p) for p in descendants(proc.pid)}
            if any("EngineCore" in _name(p) for p in held) and (tmp_path / "out" / "search_plan_ood.jsonl").exists():
                break   # the engine is up and episodes are finishing
            time.sleep(0.5)
        if proc.poll() is not None:
            pytest.fail(f"evaluate ended before it could be killed:\n{proc.stdout.read().decode(errors='replace')[-4000:]}")
        assert any("EngineCore" in _name(p) for p in held), f"no engine process under evaluate: {held}"
        held = {p: start_time(p) for p in descendants(proc.pid)}
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(_running(p, t) for p, t in held.items()):
            time.sleep(0.5)
        left = {p: _name(p) for p, t in held.items() if _running(p, t)}
        assert not left, f"processes of the killed evaluate still running: {left}"
    finally:
        for p, t in held.items():
            if _running(p, t):
                os.kill(p, signal.SIGKILL)   # never leave an engine behind, whatever the outcome
        if proc.poll() is None:
            proc.kill()
