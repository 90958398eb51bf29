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


def test_tool_counts_are_the_step_s_over_every_process():
    """metrics.jsonl's tool_parse_failures and tool_errors_per_rollout count every process's rollouts (as TRL's
    gathered tool_calls_per_rollout), not the main process's alone: two ranks' counts, gathered as accelerate does."""
    import torch

    from rl.train import step_tool_counts, tool_counts

    bad_call = {"role": "assistant", "content": "", "tool_call_errors": ["not JSON"]}
    error = {"role": "tool", "name": "search", "content": "Error: query is empty."}
    failed = {"role": "tool", "name": "nope", "content": "{'error': 'Tool nope not found.'}"}
    fine = {"role": "tool", "name": "search", "content": "No results."}
    rank0 = [[bad_call], [fine]]                  # rank 0: 1 parse failure, no error answer, 2 rollouts
    rank1 = [[error, failed], [error], [bad_call]]  # rank 1: 1 parse failure, 3 error answers, 3 rollouts
    assert tool_counts(rank0) == [1.0, 0.0, 2.0] and tool_counts(rank1) == [1.0, 3.0, 3.0]

    def gather(t):   # accelerate's gather of a 1-d tensor: every rank's, concatenated in rank order
        return torch.cat([t, torch.tensor(tool_counts(rank1), device=t.device)])

    assert step_tool_counts(tool_counts(rank0), gather, "cpu") == (2, 3 / 5)
    assert step_tool_counts(tool_counts(rank0), lambda t: t, "cpu") == (1, 0.0)   # one process


def test_non_finite_lora_weights_stop_the_run_with_exit_3(tmp_path, monkeypatch, capsys):
    """A non-finite loss or gradient that reached the LoRA weights stops the run before that step's checkpoint and
    state are written (exit 3, FAILED, as sft.train's guard), not a finished run of NaN checkpoints."""
    import json

    import pytest
    import torch

    from rl import train as rt
    from sft.optim import NonFiniteError

    model = torch.nn.Linear(2, 2)
    model.bias.requires_grad_(False)
    rt.check_finite(model, 3)   # finite: nothing to say
    with torch.no_grad():
        model.bias[0] = float("nan")   # not trained: not checked
        rt.check_finite(model, 3)
        model.weight[1, 0] = float("inf")
    with pytest.raises(NonFiniteError, match=r"^step 3: 1 trained weight tensor\(s\) are not finite \(weight\)"):
        rt.check_finite(model, 3)

    rd = tmp_path / "run"
    rd.mkdir()
    (tmp_path / "config.yaml").write_text(f"run_dir: {rd}\n")

    def run(cfg, **_):
        raise NonFiniteError("step 3: 1 trained weight tensor(s) are not finite")

    monkeypatch.setattr(rt, "run", run)
    assert rt.main([str(tmp_path / "config.yaml")]) == 3
    assert capsys.readouterr().err.startswith("error: step 3: 1 trained weight tensor(s) are not finite")
    assert json.loads((rd / "FAILED").read_text())["code"] == 3
