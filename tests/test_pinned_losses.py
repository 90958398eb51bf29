"""Pinned regression run: a fixed tiny CPU run through the real pipeline (data_prep's synthetic mixed
arm: render, masks, tokenization; then `sft.train`: packing, loss normalization, schedule, AdamW) must
reproduce the stored per-step values of tests/data/pinned_losses.json: tokens and trainable tokens
exactly (data and masks), lr (schedule) and loss / gradient norm to 1e-5 relative (the run is
deterministic on CPU; the tolerance only absorbs a different CPU's summation order).

A deliberate change of data, masks, schedule or loss fails here with a per-step diff; regenerate with
`DTSFT_REGEN_PINNED=1 python -m pytest tests/test_pinned_losses.py` and say why in the commit.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

PINNED = Path(__file__).with_name("data") / "pinned_losses.json"
STEPS = 4
KEYS_EXACT = ("step", "tokens", "trainable_tokens")
KEYS_CLOSE = ("loss", "grad_norm", "lr")


def run_pinned(tmp: Path) -> list[dict]:
    from common.layout import METRICS
    from data_prep.build import build_arm
    from sft import train
    from sft.copytask import write_config

    data = tmp / "data"
    build_arm({"kind": "synthetic", "n": 8, "max_seq_len": 4096}, arm="mixed", seed=0, tokenizer="tiny", out=data,
              progress=False, num_proc=1)
    cfg = write_config(tmp / "run", data, steps=STEPS, global_batch_size=2, max_tokens_per_micro_batch=4096,
                       save_steps=[], state_every=10**6, warmup_ratio=0.25, lr=2e-3, activation_checkpointing=False)
    assert train.cli([str(cfg)]) == 0
    rows = [json.loads(line) for line in (tmp / "run" / METRICS).read_text().splitlines() if line.strip()]
    return [{k: r[k] for k in KEYS_EXACT + KEYS_CLOSE} for r in rows[:STEPS]]


def test_first_losses_equal_the_pinned_values(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    got = run_pinned(tmp_path)
    if os.environ.get("DTSFT_REGEN_PINNED") == "1":
        PINNED.write_text(json.dumps({"steps": got}, indent=1) + "\n")
        pytest.skip(f"regenerated {PINNED}")
    want = json.loads(PINNED.read_text())["steps"]
    assert len(got) == len(want) == STEPS
    diffs = []
    for g, w in zip(got, want):
        diffs += [f"step {w['step']} {k}: got {g[k]} want {w[k]}" for k in KEYS_EXACT if g[k] != w[k]]
        diffs += [f"step {w['step']} {k}: got {g[k]!r} want {w[k]!r}" for k in KEYS_CLOSE
                  if g[k] != pytest.approx(w[k], rel=1e-5, abs=1e-12)]
    assert diffs == []
