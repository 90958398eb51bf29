"""Issue 65 item 6: GRPO on a CPU sets its own thread count and counts its tokens: the rules, without a run.

The run itself (its thread settings whatever the caller left, a line per generation round and per optimizer step
with the numbers, no idle third-party warnings) is checked on tests/test_rl_train.py's real GRPO run
(test_the_trainer_sets_its_threads_prints_numbers_and_no_idle_warnings), so TRL is imported and a trainer built
once for both.
"""
from __future__ import annotations


def test_thread_rule():
    from rl.train import SMALL_MODEL_PARAMS, cpu_threads

    assert cpu_threads(8, 2, SMALL_MODEL_PARAMS) == 4       # a share of the machine per process
    assert cpu_threads(8, 3, None) == 2
    assert cpu_threads(1, 4, 10 ** 9) == 1
    assert cpu_threads(16, 1, SMALL_MODEL_PARAMS - 1) == 1   # a small model: one thread


def test_completion_tokens_counts_trl_s_output_and_never_raises():
    from rl.train import completion_tokens

    assert completion_tokens(([[1, 2], [3]], None)) == 3     # TRL 1.16: (completion id lists, logprobs)
    assert completion_tokens((None, None)) == 0 and completion_tokens(7) == 0
