"""`evaluate data_parallel=N` (evals.parallel) on the tiny model, backend=hf on CPU: N shard processes,
their rows merged in item order, give the very rows, summary and identities of data_parallel=1; a shard
killed mid-way is resumed from its own rows by the same command."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, shared_path

pytest.importorskip("envs.search_plan_act")


def _args(out: Path, **extra) -> list[str]:
    bench_root = shared_path("benchmarks")
    keys = {"ckpt": ROOT / "common" / "tiny_base", "benches": "[bamboogle,search_plan_ood]", "n": 3,
            "bench_n": "{search_plan_ood:3}", "max_turns": 2, "ood_max_turns": 2, "max_model_len": 2048,
            "max_new_tokens": 16, "dtype": "float32", "backend": "hf", "progress": "false", "wandb": "false",
            "bench_root": bench_root, "corpus": bench_root / "corpus" / "wiki18_example_10.jsonl",
            "index_dir": out.parent / "idx", "out": out, **extra}
    return [f"{k}={v}" for k, v in keys.items()]


def _evaluate(out: Path, **extra) -> None:
    from common.cli import apply_overrides
    from evals.config import base_config
    from evals.run import evaluate

    evaluate(apply_overrides(base_config(), _args(out, **extra)))


def _same(a: Path, b: Path) -> None:
    for bench in ("bamboogle", "search_plan_ood"):
        rows_a, rows_b = (p / f"{bench}.jsonl" for p in (a, b))
        assert rows_a.read_text().splitlines() == rows_b.read_text().splitlines(), f"{bench}: other rows or order"
    assert json.loads((a / "summary.json").read_text()) == json.loads((b / "summary.json").read_text())
    meta_a, meta_b = (json.loads((p / "meta.json").read_text()) for p in (a, b))
    for key in ("identities", "bench_items", "checkpoint_identity", "tool_style", "search7_mean"):
        assert meta_a[key] == meta_b[key], key


@pytest.mark.slow
def test_two_shards_killed_and_resumed_write_the_rows_of_one_process(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")   # N torch processes on a few shared cores
    single = tmp_path / "dp1"
    _evaluate(single)
    out = tmp_path / "dp2"
    env = dict(os.environ, PYTHONPATH=str(ROOT), WANDB_MODE="disabled")
    proc = subprocess.Popen([sys.executable, "-m", "evals.cli", *_args(out, data_parallel=2, batch_size=1)], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pids = {}
    while len(pids) < 2:   # "[evaluate] shard I/N (pid P, ...)": the shard processes
        line = proc.stdout.readline()
        assert line, "evaluate exited before starting its shards"
        if line.startswith("[evaluate] shard "):
            pids[int(line.split()[2].split("/")[0])] = int(line.split("(pid ")[1].split(",")[0])
    first = out / "_shards" / "shard-1-of-2" / "bamboogle.jsonl"
    deadline = time.time() + 240
    while not (first.is_file() and first.read_text().strip()):
        assert time.time() < deadline and proc.poll() is None, "shard 1 wrote no row"
        time.sleep(0.2)
    os.kill(pids[1], signal.SIGKILL)   # killed after its first row, with items left
    rest = proc.communicate(timeout=300)[0]
    assert proc.returncode == 2 and "shard 1/2 exited -9" in rest, rest[-3000:]
    assert not (out / "summary.json").exists()
    _evaluate(out, data_parallel=2, batch_size=1)   # the same command again: each shard resumes from its rows
    _same(single, out)
    assert not (out / "_shards").exists(), "the shards' rows are in out; their scratch dirs are gone"
    from evals.run import to_evaluate

    assert to_evaluate({"ckpt": str(ROOT / "common" / "tiny_base"), "out": str(out), "benches": ["search_plan_ood"],
                        "bench_n": {"search_plan_ood": 3}, "max_turns": 2, "ood_max_turns": 2, "max_model_len": 2048,
                        "max_new_tokens": 16, "dtype": "float32"}) == {}, "data_parallel=1 finds nothing left to do"
