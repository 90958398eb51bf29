"""The vLLM tier: the asynchronous driver writes the lockstep driver's greedy rows on the tiny base
under vLLM's CPU build (one AsyncLLM engine, bamboogle, search_plan_ood and babyai;
tests/vllm_driver_worker.py, in a subprocess)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, shared_path

pytestmark = pytest.mark.vllm


def test_async_driver_rows_equal_lockstep_rows_on_vllm(tmp_path):
    bench_root = shared_path("benchmarks")
    result = tmp_path / "result.json"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"), "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "vllm_driver_worker.py"), str(tmp_path), str(result),
                        str(bench_root)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    assert "Error" not in r.stderr.replace("FutureWarning", ""), r.stderr[-3000:]   # the engine closed cleanly
    res = json.loads(result.read_text())
    for bench in res["benches"]:
        lock = sorted((json.loads(x) for x in open(tmp_path / "lockstep" / f"{bench}.jsonl")), key=lambda r: r["id"])
        asy = sorted((json.loads(x) for x in open(tmp_path / "async" / f"{bench}.jsonl")), key=lambda r: r["id"])
        assert len(lock) == len(asy) > 0, bench
        for a, b in zip(lock, asy):
            assert a == b, f"{bench} item {a['id']}: driver=async wrote another row than driver=lockstep"
    summaries = [json.loads((tmp_path / d / "summary.json").read_text()) for d in ("lockstep", "async")]
    assert summaries[0] == summaries[1]
    # later turns re-send the conversation so far: vLLM's prefix cache finds it under both drivers
    for driver, s in res["prefix_cache"].items():
        assert s["prefix_queries"] > 0 and s["prefix_hits"] > 0, (driver, s)
