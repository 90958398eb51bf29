"""Gradient of one global batch through the trainer's own code (for the equivalence test).

`python tests/sft_grad_worker.py CONFIG OUT CAP [CAP ...]` under 2 ranks, or
`global_batch_grads(...)` in-process for a world of one: for each micro-batch token
budget CAP (`<n>`: packed; `<n>u`: one sequence per micro-batch, a pack budget of 1 token), zero the
grads, run sft.train.forward_backward on step 0's global batch and record the full
(unsharded) gradients and the loss.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sft import train  # noqa: E402
from sft.config import load_config  # noqa: E402
from sft.data import load_train_data, plan_step  # noqa: E402
from sft.model import model_config  # noqa: E402


def global_batch_grads(config_path, capacities) -> dict:
    cfg = load_config(config_path)
    device = torch.device("cpu")
    rank, world, owns = train.init_distributed("cpu")
    try:
        budgets = {str(c): int(str(c).rstrip("u")) for c in capacities}
        data = load_train_data(cfg.data_dir, global_batch_size=cfg.train.global_batch_size, max_tokens_per_micro_batch=max(budgets.values()))
        conf = model_config(cfg, "sdpa")
        model, _ = train.prepare_model(cfg, conf, rank=rank, device=device, dtype=torch.float32)
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        out = {}
        for cap, budget in budgets.items():
            model.zero_grad(set_to_none=True)
            plan = plan_step(data, 0, rank=rank, world=world, global_batch_size=cfg.train.global_batch_size, seed=cfg.seed,
                             capacity=budget, budget=1 if cap.endswith("u") else None)
            loss, n_train, _, _ = train.forward_backward(model, plan, device=device, world=world)
            with FSDP.summon_full_params(model, with_grads=True):
                grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
            out[cap] = {"loss": loss, "n_trainable": n_train, "n_micro": len(plan.micro_batches), "grads": grads,
                        "rows_per_micro": max(len(mb.seq_lens) for mb in plan.micro_batches)}
        return out
    finally:
        if owns:
            dist.destroy_process_group()


if __name__ == "__main__":
    config, dest, *caps = sys.argv[1:]
    result = global_batch_grads(config, caps)
    if int(os.environ.get("RANK", "0")) == 0:  # the group is gone by now; torchrun-style env says who we are
        torch.save(result, dest)
