"""bench/gpu_acceptance.py cannot rot: its CPU `--smoke` mode runs the same checks at tiny shapes
(sdpa packing vs unpacked, the trainer's loss normalization vs an oracle, gloo FSDP world 2 vs
world 1 and the bf16 checkpoint, the speed loop), and the checks must catch the bugs they guard."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_acceptance.py"

from bench import gpu_acceptance as ga  # noqa: E402


def _run(tmp_path, *extra):
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(out), *extra],
                          check=False, capture_output=True, text=True, timeout=900)
    return proc, (json.loads(out.read_text()) if out.exists() else None)


@pytest.mark.slow
def test_smoke_run_reports_every_check(tmp_path):
    proc, report = _run(tmp_path, "--steps", "1")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    checks = report["checks"]
    assert list(checks) == list(ga.CHECKS)
    for name in ("packing", "liger", "fsdp"):
        c = checks[name]
        assert c["status"] == "pass", c
        assert c["comparisons"] and all(c_["ok"] and isinstance(c_["measured"], float) and c_["tolerance"] for c_ in c["comparisons"])
    assert checks["vllm"]["status"] == "skip" and "not installed" in checks["vllm"]["reason"]  # the vLLM tier runs it
    # what needs CUDA is skipped with a reason; the rest reports numbers
    assert "flash-attn" in checks["packing"]["skipped_parts"]["flash_attention_2"]
    assert "CUDA" in checks["liger"]["skipped_parts"]["liger on vs off"]
    fsdp = [c["what"] for c in checks["fsdp"]["comparisons"]]
    assert any(w.startswith("world 2 (gloo) fp32 vs fp32 world 1: max per-step loss") for w in fsdp)
    assert any(w.startswith("world 2 (gloo) fp32 vs fp32 world 1: first step's gradient norm") for w in fsdp)
    assert any("checkpoint vs master weights cast to bf16" in w for w in fsdp)
    speed = checks["speed"]
    assert speed["status"] == "pass", speed
    assert speed["measured"]["trainer step, liger off"]["tokens_per_s_per_gpu"] > 0
    assert speed["measured"]["trainer step, liger off"]["mfu"] is None and "MFU" in speed["skipped_parts"]
    assert report["tolerances"] == ga.TOLERANCES["fp32"] and "step_flops" in report["flop_formula"]
    # dense retrieval without CUDA: the CPU fallback (encoder on the CPU, faiss-cpu, said), against the CPU path
    # and Search-R1's own ids and vectors (tests/data/search_r1_e5)
    dense = checks["dense"]
    assert dense["status"] == "pass", dense
    assert dense["measured"]["search"] == "faiss-cpu" and dense["measured"]["encoder"] == "cpu (float32) vs cpu (float32)"
    assert dense["measured"]["top-3 ids equal, device vs CPU (queries)"] == "24/24"
    assert dense["measured"]["passage vectors max abs diff, CPU vs Search-R1's"] <= 1e-5
    assert {"top-1 ids differing, device vs CPU path (count)", "top-3 ids of the CPU path differing from Search-R1's "
            "server's (count)"} <= {c["what"] for c in dense["comparisons"]}
    assert "PASS  packing" in proc.stdout and "SKIP  vllm" in proc.stdout  # the readable summary


def test_crashed_check_is_reported_and_fails_the_run(tmp_path):
    """A rerun with --only: the earlier report is kept aside, the checks not rerun are carried
    over, and a check whose process dies is an error that fails the run."""
    earlier = {"started": "2026-01-01T00:00:00Z",
               "checks": {"packing": {"check": "packing", "status": "pass"}, "speed": {"check": "speed", "status": "fail"}}}
    (tmp_path / "report.json").write_text(json.dumps(earlier))
    proc, report = _run(tmp_path, "--only", "packing", "--check-timeout", "0.5")
    assert proc.returncode == 1  # packing crashed now; speed's earlier failure is not this run's
    assert report["checks"]["packing"]["status"] == "error"
    assert "killed after --check-timeout" in report["checks"]["packing"]["error"]
    assert report["checks"]["speed"] == {**earlier["checks"]["speed"], "from_earlier_run": "2026-01-01T00:00:00Z"}
    assert list(report["checks"]) == ["packing", "speed"]
    aside = list(tmp_path.glob("report.json.replaced-*"))
    assert len(aside) == 1 and json.loads(aside[0].read_text()) == earlier


def test_bad_only_is_a_usage_error(tmp_path):
    proc, report = _run(tmp_path, "--only", "packing,nope")
    assert proc.returncode == 2 and report is None
    assert "unknown check(s) nope" in proc.stderr and "Traceback" not in proc.stderr


def _ctx():
    import torch

    return ga.Ctx(ga.parse_args(["--smoke"]), torch.device("cpu"))


def test_packing_check_catches_a_leaking_pack(monkeypatch):
    """Mutation: position_ids that do not restart per sequence make the packed run attend across
    sequences; the packing check must fail on both the losses and the leak test."""
    import numpy as np

    import sft.data

    good = sft.data.collate

    def leaky(rows):
        mb = good(rows)
        mb.position_ids = sft.data.torch.from_numpy(np.arange(mb.num_tokens)).unsqueeze(0)
        return mb

    res = ga.Result("packing", "fp32")
    ga.check_packing(_ctx(), res)
    assert res.d["status"] == "pass"
    monkeypatch.setattr(sft.data, "collate", leaky)
    res = ga.Result("packing", "fp32")
    ga.check_packing(_ctx(), res)
    failed = [c["what"] for c in res.d["comparisons"] if not c["ok"]]
    assert res.d["status"] == "fail"
    assert any("per-token loss" in w for w in failed) and any("sequence A changes" in w for w in failed)


def test_result_fails_on_nan_and_on_a_control_without_difference():
    res = ga.Result("x", "fp32")
    res.compare("a", 0.5, 1.0)
    assert res.d["status"] == "pass"
    res.compare("nan", float("nan"), 1.0)
    assert res.d["status"] == "fail"
    res = ga.Result("x", "fp32")
    res.compare("control", 0.0, 1e-5, above=True)
    assert res.d["status"] == "fail" and res.d["comparisons"][0]["tolerance"] == "> 1e-05"


@pytest.mark.vllm
def test_smoke_vllm_check_measures_on_cpu(tmp_path):
    """In the vLLM environment the vllm check runs on CPU (fp32): measured values, not a skip."""
    proc, report = _run(tmp_path, "--only", "vllm")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    c = report["checks"]["vllm"]
    assert c["status"] == "pass", c
    assert c["measured"]["greedy generations identical (hf generate vs vLLM)"] == "6/6"
    whats = {x["what"]: x["measured"] for x in c["comparisons"]}
    assert whats["fp32: greedy generations differing, hf generate vs vLLM (count)"] == 0.0
    assert whats["fp32: evaluate rows differing, backend=hf vs backend=vllm (count)"] == 0.0
    assert whats["fp32: evaluate rows differing, driver=async vs driver=lockstep (count)"] == 0.0
    rates = c["measured"]["episode scheduling, 16 episodes: generated tok/s"]
    assert set(rates) == {"lockstep_all", "async", "saturated"} and all(v > 0 for v in rates.values())
    assert not c["skipped_parts"], c["skipped_parts"]


def test_dense_check_catches_a_device_path_that_differs(monkeypatch):
    """The dense check's comparison can fail: the device path's queries encoded without their `query: `
    prefix (the CPU path's with it) change its top-k ids. (Its passing run, on the CPU with faiss-cpu: the
    smoke test above.)"""
    pytest.importorskip("faiss")
    from evals import dense

    real = dense.E5Encoder.encode
    queries_encoded = []

    def second_path_differs(self, texts, is_query):   # the CPU path encodes its queries first, the device path second
        if is_query:
            queries_encoded.append(1)
        monkeypatch.setattr(dense, "QUERY_PREFIX", "" if len(queries_encoded) == 2 and is_query else "query: ")
        return real(self, texts, is_query)

    monkeypatch.setattr(dense.E5Encoder, "encode", second_path_differs)
    res = ga.Result("dense", "fp32")
    ga.check_dense(_ctx(), res)
    failed = {c["what"] for c in res.d["comparisons"] if not c["ok"]}
    assert res.d["status"] == "fail" and "top-3 ids differing, device vs CPU path (count)" in failed
    assert "top-3 ids of the CPU path differing from Search-R1's server's (count)" not in failed   # the CPU path is right
    assert res.d["measured"]["query vectors max abs diff, device vs CPU"] > 0
