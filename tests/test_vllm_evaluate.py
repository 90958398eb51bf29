"""The vLLM tier: `evaluate backend=vllm` (vLLM's CPU build, fp32, greedy) writes the rows
`backend=hf` writes, message for message, on a bamboogle sample, a search_plan_ood sample and a
short babyai run. The engine runs in a subprocess (`python -m evals.cli`: vLLM spawns its engine
process, which needs the `__main__` guard)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, shared_path

pytestmark = pytest.mark.vllm

BENCHES = ("bamboogle", "search_plan_ood", "babyai")


def run_evaluate(out: Path, backend: str, bench_root: Path, *extra: str) -> subprocess.CompletedProcess:
    args = [f"ckpt={ROOT / 'common' / 'tiny_base'}", f"benches=[{','.join(BENCHES)}]", "n=4",
            "bench_n={search_plan_ood: 2, babyai: 1}", "babyai_max_steps=4", "ood_max_turns=4", "max_turns=3",
            f"bench_root={bench_root}", f"corpus={bench_root / 'corpus' / 'wiki18_example_10.jsonl'}",
            f"index_dir={out.parent / 'idx'}", "max_model_len=4096", "max_new_tokens=64", "babyai_max_new_tokens=64",
            "babyai_temperature=0",  # greedy: sampled babyai rows are the backend's own (the two samplers differ)
            "dtype=float32", f"backend={backend}", "progress=false", "wandb=false", f"out={out}", *extra]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"), "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": "1"}  # one thread each: on a busy 2-core box OpenMP's spinning threads cost more than they bring
    return subprocess.run([sys.executable, "-m", "evals.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)


def rows(out: Path, bench: str) -> list[dict]:
    # the identity digest differs (vLLM's engine settings are part of it); everything else must not.
    # By id: backend=vllm runs the async driver, which appends rows in the order episodes finish.
    return sorted(({k: v for k, v in json.loads(line).items() if k != "identity"} for line in open(out / f"{bench}.jsonl")),
                  key=lambda r: r["id"])


@pytest.fixture(scope="module")
def outs(tmp_path_factory) -> dict[str, Path]:
    """The same evaluation under backend=vllm and backend=hf (one process each)."""
    tmp_path, bench_root = tmp_path_factory.mktemp("vllm_eval"), shared_path("benchmarks")
    outs = {}
    for backend in ("vllm", "hf"):
        outs[backend] = tmp_path / backend
        r = run_evaluate(outs[backend], backend, bench_root)
        assert r.returncode == 0, f"backend={backend}:\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
        if backend == "vllm":
            assert "exited unexpectedly" not in r.stderr, r.stderr[-3000:]  # the engine was shut down, not killed
    return outs


def test_evaluate_vllm_rows_equal_hf_rows(outs):
    for bench in BENCHES:
        hf, vl = rows(outs["hf"], bench), rows(outs["vllm"], bench)
        assert len(hf) == len(vl) > 0, bench
        for a, b in zip(hf, vl):
            assert a == b, f"{bench} item {a.get('id')}: backend=vllm wrote another row than backend=hf"
    meta = json.loads((outs["vllm"] / "meta.json").read_text())
    keys = meta["identities"]["bamboogle"]["keys"]
    assert (keys["evaluate.dtype"], keys["evaluate.enforce_eager"]) == ("float32", True)


def test_vllm_data_parallel_2_writes_the_rows_of_one_engine(outs, tmp_path):
    """Two engine processes (on CPU they share the host; VLLM_CPU_KVCACHE_SPACE each), each a shard of the
    items: the merged rows, summary and identities are data_parallel=1's (rows carry the same identity)."""
    out = tmp_path / "dp2"
    r = run_evaluate(out, "vllm", shared_path("benchmarks"), "data_parallel=2")
    assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    assert r.stdout.count("[evaluate] shard ") == 2 and not (out / "_shards").exists()
    for bench in BENCHES:
        # by id: one engine under the async driver appends rows as episodes finish, the merge writes item order
        one = {json.loads(line)["id"]: line for line in (outs["vllm"] / f"{bench}.jsonl").read_text().splitlines()}
        two = {json.loads(line)["id"]: line for line in (out / f"{bench}.jsonl").read_text().splitlines()}
        assert two == one, f"{bench}: data_parallel=2 wrote other rows"
    assert json.loads((out / "summary.json").read_text()) == json.loads((outs["vllm"] / "summary.json").read_text())
    metas = [json.loads((p / "meta.json").read_text()) for p in (out, outs["vllm"])]
    assert metas[0]["identities"] == metas[1]["identities"]
