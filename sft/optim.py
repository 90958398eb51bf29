"""AdamW + warmup/decay schedule, and the non-finite gradient guard."""
from __future__ import annotations

import math

import torch


class NonFiniteError(RuntimeError):
    """Too many consecutive optimizer steps had a non-finite gradient norm."""


def param_groups(model, weight_decay: float) -> list[dict]:
    """Decay matrices only; norms and biases are exempt. Decided by name, because with
    FSDP use_orig_params a rank's view of a parameter may be an empty shard."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if ("norm" in name or name.endswith(".bias")) else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model, *, lr: float, betas, eps: float, weight_decay: float):
    # The default multi-tensor (foreach) AdamW: with FSDP use_orig_params a rank may hold
    # empty views of some parameters, which the foreach path is long proven on.
    return torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=tuple(betas), eps=eps)


def warmup_steps(total: int, ratio: float) -> int:
    """Warmup steps as transformers' Trainer counts them: ceil(ratio x total)."""
    return math.ceil(ratio * total)


def lr_factor(step: int, *, total: int, warmup: int, schedule: str, min_ratio: float) -> float:
    """Multiplier of the peak LR for 0-based optimizer step `step`: transformers'
    `get_{cosine,linear,constant}_schedule_with_warmup` lambda (with `min_ratio`, as its
    `get_cosine_with_min_lr_schedule_with_warmup(min_lr_rate=)`). Wrapped in LambdaLR, optimizer
    step k (1-based) uses lr_factor(k - 1): step 1 runs at lr 0, as in the reference trainers."""
    if step < warmup:
        return step / warmup
    if schedule == "constant":
        return 1.0
    span = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / span)
    if schedule == "linear":
        shape = 1.0 - progress
    else:
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    return min_ratio + (1.0 - min_ratio) * shape


def build_scheduler(optimizer, *, total: int, warmup_ratio: float, schedule: str, min_ratio: float):
    warm = warmup_steps(total, warmup_ratio)
    fn = lambda s: lr_factor(s, total=total, warmup=warm, schedule=schedule, min_ratio=min_ratio)  # noqa: E731
    return torch.optim.lr_scheduler.LambdaLR(optimizer, fn)


class NonFiniteGuard:
    """Counts consecutive non-finite gradient norms; raises after `limit` in a row."""

    def __init__(self, limit: int, consecutive: int = 0):
        self.limit, self.consecutive = limit, consecutive

    def check(self, grad_norm: float, step: int) -> bool:
        """True if the step may be applied; False to skip it."""
        if math.isfinite(grad_norm):
            self.consecutive = 0
            return True
        self.consecutive += 1
        if self.consecutive >= self.limit:
            raise NonFiniteError(
                f"step {step}: gradient norm {grad_norm} is non-finite for {self.consecutive} consecutive steps "
                f"(train.max_consecutive_nonfinite={self.limit}); stopping. Lower train.lr or inspect the data."
            )
        return False
