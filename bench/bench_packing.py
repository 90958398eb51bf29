"""CPU benchmark: how many tokens a micro-batch should pack under sdpa (not a test; prints ratios
against the named baseline, packing up to the full capacity).

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_packing.py [--steps 12]

Under sdpa a pack is attended through a dense block-diagonal mask, so packing trades fewer forward
passes against quadratic attention over the whole pack. Two datasets at the two ends:
  long   data_prep's synthetic r2e arm (the demo's longest trajectories, ~1.2k tokens) on the tiny
         tokenizer and the committed tiny base, 4 trajectories per step (the demo's setting);
  short  the copy task (sft.copytask, ~64-token sequences) on the tiny random model, 32 per step.
For each, micro-batches of up to 4096 tokens, and three pack budgets (sft.data.plan_step `budget`):
4096 (baseline: pack to the capacity), 512 (the trainer's under sdpa: sft.data.pack_budget) and 1 (one
sequence per micro-batch). Each step runs sft.train.forward_backward once per budget on the same global
batch, rotating the order; the first 2 steps are warm-up. Also printed: the largest relative
difference of a step's loss between budgets (the same sum over the same tokens).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from sft.data import SDPA_PACK_TOKENS  # noqa: E402

WARMUP = 2
CAPACITY = 4096
BUDGETS = (CAPACITY, SDPA_PACK_TOKENS, 1)


def measure(cfg_path: Path, steps: int) -> tuple[dict, float, int]:
    """({budget: tokens/s}, largest relative loss difference, most sequences in one micro-batch per budget)."""
    from sft import train
    from sft.config import load_config
    from sft.data import load_train_data, plan_step
    from sft.model import model_config

    cfg = load_config(cfg_path)
    gbs, dev = cfg.train.global_batch_size, torch.device("cpu")
    _, world, owns = train.init_distributed("cpu")
    data = load_train_data(cfg.data_dir, global_batch_size=gbs, max_tokens_per_micro_batch=CAPACITY)
    model, _ = train.prepare_model(cfg, model_config(cfg, "sdpa"), rank=0, device=dev, dtype=torch.float32)
    totals = {b: [0, 0.0] for b in BUDGETS}
    worst, rows = 0.0, {b: 0 for b in BUDGETS}
    for s in range(steps + WARMUP):
        losses = {}
        k = s % len(BUDGETS)
        for budget in BUDGETS[k:] + BUDGETS[:k]:
            plan = plan_step(data, s, rank=0, world=1, global_batch_size=gbs, seed=0, capacity=CAPACITY, budget=budget)
            model.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            losses[budget], _, n_tok, _ = train.forward_backward(model, plan, device=dev, world=world)
            dt = time.perf_counter() - t0
            rows[budget] = max(rows[budget], max(len(mb.seq_lens) for mb in plan.micro_batches))
            if s >= WARMUP:
                totals[budget][0] += n_tok
                totals[budget][1] += dt
        worst = max(worst, max(abs(v - losses[CAPACITY]) / abs(losses[CAPACITY]) for v in losses.values()))
    if owns:
        import torch.distributed as dist

        dist.destroy_process_group()
    return {b: n / t for b, (n, t) in totals.items()}, worst, rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=12)
    args = ap.parse_args()

    from common.tiny import TINY_BASE_DIR
    from data_prep.build import build_arm
    from sft.copytask import make_dataset_dir, write_config

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        long_dir = tmp / "long"
        build_arm({"kind": "synthetic", "n": 4 * (args.steps + WARMUP), "max_seq_len": CAPACITY}, arm="r2e", seed=0,
                  tokenizer="tiny", out=long_dir, progress=False, num_proc=1)
        short_dir = make_dataset_dir(tmp / "short", n=32 * (args.steps + WARMUP))
        common = dict(max_tokens_per_micro_batch=CAPACITY, activation_checkpointing=False)
        setups = {
            "long (synthetic r2e, 4 per step)": write_config(tmp / "run_long", long_dir, global_batch_size=4, **common,
                                                             **{"model.path": str(TINY_BASE_DIR), "model.init": "pretrained"}),
            "short (copy task, 32 per step)": write_config(tmp / "run_short", short_dir, global_batch_size=32, **common),
        }
        results = {name: measure(path, args.steps) for name, path in setups.items()}
    print(f"\nthreads {torch.get_num_threads()}, {args.steps} timed steps each, sdpa, fp32, micro-batch capacity {CAPACITY}")
    for name, (tps, worst, rows) in results.items():
        base = tps[CAPACITY]
        print(f"{name}")
        for b in BUDGETS:
            label = {CAPACITY: "baseline: pack to the capacity", SDPA_PACK_TOKENS: f"pack <= {SDPA_PACK_TOKENS} (the trainer)",
                     1: "one sequence each"}[b]
            print(f"  budget {b:>4} {label:<31} up to {rows[b]:>2} per micro-batch: {tps[b]:7.0f} tokens/s  {tps[b] / base:.2f}x")
        print(f"  largest relative loss difference between budgets: {worst:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
