"""CPU benchmark: packed micro-batches vs one sequence per micro-batch under sdpa (not a test;
prints a ratio against the named baseline, the packed step).

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_packing.py [--steps 12]

The demo's setting: data_prep's synthetic r2e arm (the longest trajectories, ~1.2k tokens) on the
tiny tokenizer, the committed tiny base (fp32, sdpa), 4 trajectories per step, micro-batches of up
to 4096 tokens. Each step runs sft.train.forward_backward twice on the same global batch, once
packed (sft.data.plan_step pack=True: best-fit-decreasing, so a micro-batch holds ~3 sequences
behind a dense block-diagonal mask) and once unpacked (pack=False, what the trainer does under
sdpa: sft.data.packs), alternating which goes first; the first 2 steps are warm-up. Also printed:
the largest relative difference of the two losses (the same sum over the same tokens).
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

WARMUP = 2
GBS = 4
CAPACITY = 4096


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=12)
    args = ap.parse_args()

    from common.tiny import TINY_BASE_DIR
    from data_prep.build import build_arm
    from sft import train
    from sft.config import load_config
    from sft.copytask import write_config
    from sft.data import load_train_data, plan_step
    from sft.model import model_config

    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "data"
        build_arm({"kind": "synthetic", "n": GBS * (args.steps + WARMUP), "max_seq_len": CAPACITY}, arm="r2e", seed=0,
                  tokenizer="tiny", out=data_dir, progress=False, num_proc=1)
        cfg = load_config(write_config(Path(tmp) / "run", data_dir, global_batch_size=GBS, max_tokens_per_micro_batch=CAPACITY,
                                       activation_checkpointing=False, **{"model.path": str(TINY_BASE_DIR), "model.init": "pretrained"}))
        dev = torch.device("cpu")
        _, world, owns = train.init_distributed("cpu")
        data = load_train_data(cfg.data_dir, global_batch_size=GBS, max_tokens_per_micro_batch=CAPACITY)
        model, _ = train.prepare_model(cfg, model_config(cfg, "sdpa"), rank=0, device=dev, dtype=torch.float32)
        totals = {True: [0, 0.0], False: [0, 0.0]}
        rows_per_micro, worst = {True: 0, False: 0}, 0.0
        for s in range(args.steps + WARMUP):
            losses = {}
            for pack in ((True, False) if s % 2 else (False, True)):
                plan = plan_step(data, s, rank=0, world=1, global_batch_size=GBS, seed=0, capacity=CAPACITY, pack=pack)
                model.zero_grad(set_to_none=True)
                t0 = time.perf_counter()
                losses[pack], _, n_tok, _ = train.forward_backward(model, plan, device=dev, world=world)
                dt = time.perf_counter() - t0
                rows_per_micro[pack] = max(rows_per_micro[pack], max(len(mb.seq_lens) for mb in plan.micro_batches))
                if s >= WARMUP:
                    totals[pack][0] += n_tok
                    totals[pack][1] += dt
            worst = max(worst, abs(losses[True] - losses[False]) / abs(losses[True]))
        if owns:
            import torch.distributed as dist

            dist.destroy_process_group()
    tps = {k: n / t for k, (n, t) in totals.items()}
    print(f"threads {torch.get_num_threads()}, {args.steps} timed steps of {GBS} synthetic r2e trajectories "
          f"({totals[True][0] / args.steps:.0f} tokens/step)")
    print(f"  baseline  packed (up to {rows_per_micro[True]} sequences per micro-batch): {tps[True]:8.0f} tokens/s forward+backward")
    print(f"  unpacked  one sequence per micro-batch:                {tps[False]:8.0f} tokens/s  "
          f"ratio {tps[False] / tps[True]:.2f}x")
    print(f"  largest relative loss difference packed vs unpacked: {worst:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
