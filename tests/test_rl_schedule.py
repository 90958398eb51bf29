"""GRPO learning-rate schedules (linear and cosine with warmup) are resumable: a run stopped at a step
boundary (SIGTERM, as a preemption) and resumed by a fresh trainer logs the same per-step lr and loss
as the same run done in one go, and ends on the same adapter and optimizer state, bit for bit.

The oracle for the lr series is transformers' own schedule functions (get_linear_schedule_with_warmup,
get_cosine_schedule_with_warmup, with the Trainer's warmup count ceil(warmup_ratio x steps)), not
project code. Generation is the scripted policy of tests/test_rl_train.py (rl_helpers), so the
rollouts, and with them the losses, are deterministic; sampled rollouts would only be statistically
equal across a resume.
"""
from __future__ import annotations

import json
import math
import os
import signal
from pathlib import Path

import pytest
import torch

from tests.rl_helpers import scripted_segment

pytestmark = pytest.mark.slow
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
STEPS, WARMUP_RATIO, LR = 3, 0.3, 1e-3   # warmup ceil(0.9) = 1 step: lr 0 at step 1, peak at step 2


def _grpo(root: Path, schedule: str):
    from launch.compose import compose_grpo
    from common.schema import run_dir

    cfg = compose_grpo(["task=spa", "model=tiny_base", f"steps={STEPS}", "save_steps=[]", f"runs_root={root}",
                        f"train.lr_schedule={schedule}", f"train.warmup_ratio={WARMUP_RATIO}", f"lr={LR}",
                        "grpo.completions_per_step=4", "grpo.num_generations=2", "grpo.max_turns=12",
                        "grpo.max_completion_length=2048", "grpo.pilot_tasks=3", "logging.wandb=false"]).cfg
    cfg.run_dir = str(run_dir(cfg))
    return cfg


def _metrics(cfg) -> list[dict]:
    return [json.loads(x) for x in (Path(cfg.run_dir) / "metrics.jsonl").read_text().splitlines()]


def _final_state(cfg) -> dict:
    """The final state's LoRA tensors and AdamW moments."""
    from rl.checkpoint import load_state

    st = load_state(Path(cfg.run_dir) / "state" / f"step-{STEPS:06d}")
    moments = {f"optimizer {i}.{k}": v for i, s in st["optimizer"]["state"].items() for k, v in s.items() if torch.is_tensor(v)}
    return {**st["adapter"], **moments}


def _reference_lrs(schedule: str) -> list[float]:
    """The lr of optimizer steps 1..STEPS under transformers' own scheduler."""
    import transformers

    make = {"linear": transformers.get_linear_schedule_with_warmup,
            "cosine": transformers.get_cosine_schedule_with_warmup}[schedule]
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=LR)
    sched = make(opt, math.ceil(WARMUP_RATIO * STEPS), STEPS)
    out = []
    for _ in range(STEPS):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_stopped_and_resumed_run_repeats_the_uninterrupted_lr_and_losses(tmp_path, schedule):
    previous, threads = signal.getsignal(signal.SIGTERM), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        whole = _grpo(tmp_path / "whole", schedule)
        assert scripted_segment(whole, None) == 0
        parts = _grpo(tmp_path / "parts", schedule)
        assert scripted_segment(parts, stop_after=1) == 0
        assert [m["step"] for m in _metrics(parts)] == [1] and not (Path(parts.run_dir) / "DONE").exists()
        assert scripted_segment(parts, None) == 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        torch.set_num_threads(threads)
    a, b = _metrics(whole), _metrics(parts)
    assert [m["step"] for m in a] == [m["step"] for m in b] == list(range(1, STEPS + 1))
    ref = _reference_lrs(schedule)
    assert ref[0] == 0.0 and ref[1] == LR and 0 < ref[2] < LR  # the case is not degenerate
    assert [m["lr"] for m in a] == pytest.approx(ref, rel=1e-12, abs=0)
    assert [m["lr"] for m in b] == [m["lr"] for m in a]  # exactly the uninterrupted run's
    assert [m["loss"] for m in b] == [m["loss"] for m in a]
    assert [m["grad_norm"] for m in b] == [m["grad_norm"] for m in a]
    # Bit for bit (one CPU thread, the same seed): the resumed run shuffles each step's rollouts into the same
    # order (the torch RNG continues where the state left it), so it sums the same gradients in the same order.
    fa, fb = _final_state(whole), _final_state(parts)
    assert fa.keys() == fb.keys()
    assert [k for k in fa if not torch.equal(fb[k], fa[k])] == []
