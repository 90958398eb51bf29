"""rl.vllm_cpu.LogprobGuard (no vLLM needed): the per-step |logprob(vLLM) - logprob(trainer)| check."""
from __future__ import annotations

import logging

import pytest

from rl.errors import RlError
from rl.vllm_cpu import CPU_FP32_MAX_LOGPROB_GAP, GUARD_STEPS, LogprobGuard


def test_strict_guard_refuses_after_consecutive_steps_above_the_bound(caplog):
    g = LogprobGuard(strict=True)
    over = CPU_FP32_MAX_LOGPROB_GAP * 10
    g.check(1, 1e-6, 1e-5)
    for step in range(2, 2 + GUARD_STEPS - 1):
        g.check(step, 1e-3, over)  # warned, allowed
    g.check(10, 1e-6, 1e-5)        # back under the bound: the count restarts
    for step in range(11, 11 + GUARD_STEPS - 1):
        g.check(step, 1e-3, over)
    with pytest.raises(RlError, match=r"step \d+: vLLM's and the trainer's logprobs .* for 2 consecutive steps"):
        g.check(20, 1e-3, over)
    g.check(21, None, None)  # a step without the metric (no vLLM numbers) is no evidence either way


def test_guard_off_cpu_fp32_only_warns(caplog):
    g = LogprobGuard(strict=False)
    with caplog.at_level(logging.WARNING, logger="rl.vllm_cpu"):
        for step in range(1, 6):
            g.check(step, 0.01, 0.5)
    assert sum("bound measured for fp32 on CPU only" in r.getMessage() for r in caplog.records) == 5
