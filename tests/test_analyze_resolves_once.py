"""`analyze` of one checkpoint on one bench resolves the evaluate config once and computes the checkpoint's
identity once (issue #60 "Done when"), counted by spies around the functions that do it; the evaluation
itself is real (the tiny base on a five-question bench, HF backend, BM25, CPU)."""
from __future__ import annotations

import json
import shutil

import pytest

from common.io import write_jsonl

pytest.importorskip("evals.run", reason="needs the evals harness (evals.run.evaluate)")


def test_one_checkpoint_on_one_bench_resolves_once(tmp_path, monkeypatch):
    import evals.config
    import evals.identity
    import evals.run
    from common.tiny import TINY_BASE_DIR
    from launch.analyze import run_analysis

    bench_root = tmp_path / "benches"
    (bench_root / "synthqa").mkdir(parents=True)
    write_jsonl(tmp_path / "corpus.jsonl", ({"id": str(i), "contents": f'"P{i}"\nThe capital of P{i} is C{i}.'}
                                            for i in range(5)))
    write_jsonl(bench_root / "synthqa" / "test.jsonl", ({"id": f"q{i}", "question": f"What is the capital of P{i}?",
                                                         "golden_answers": [f"C{i}"]} for i in range(5)))
    ckpt = tmp_path / "runs" / "r2e" / "seed0" / "checkpoints" / "step-000001"
    shutil.copytree(TINY_BASE_DIR, ckpt)
    calls = {"resolve": 0, "checkpoint_identity": 0}

    def counted(name, fn):
        def spy(*a, **kw):
            calls[name] += 1
            return fn(*a, **kw)
        return spy

    resolve = counted("resolve", evals.config.resolve)
    identity = counted("checkpoint_identity", evals.identity.checkpoint_identity)
    for module in (evals.config, evals.run):   # evals.run holds its own names of both
        monkeypatch.setattr(module, "resolve", resolve)
    for module in (evals.identity, evals.run):
        monkeypatch.setattr(module, "checkpoint_identity", identity)
    cfg = {"runs_root": str(tmp_path / "runs"), "out": str(tmp_path / "reports"), "benches": ["synthqa"],
           "eval": {"n": 1, "corpus": str(tmp_path / "corpus.jsonl"), "bench_root": str(bench_root), "max_turns": 1,
                    "max_model_len": 512, "max_new_tokens": 4, "progress": False, "index_dir": str(tmp_path / "idx"),
                    "wandb": False}}
    res = run_analysis(cfg)
    assert not res.evaluated.failures and len(res.evaluated.jobs) == 1
    summary = json.loads((ckpt.parents[1] / "eval" / "step-000001" / "summary.json").read_text())
    assert set(summary) == {"synthqa"}
    assert calls == {"resolve": 1, "checkpoint_identity": 1}
