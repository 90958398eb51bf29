"""Issue 65 item 6: GRPO on a CPU sets its own thread count, shows its progress in numbers, and leaves out
third-party warnings that say nothing a user can act on.

One real 1-step GRPO segment on the tiny base in this process (TRL's GRPOTrainer, the environment, the loss and
the LoRA update), with only TRL's generation function scripted (tests/rl_helpers.py), wrapped by the project's
trainer class as the real one is.
"""
from __future__ import annotations

import os
import re
import warnings

import pytest
import torch

from tests.rl_helpers import ScriptedPolicy

NUM = r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?"


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


@pytest.mark.slow   # ~28 s of CPU alone, most of it importing TRL and building the trainer
def test_one_grpo_step_on_cpu_sets_threads_prints_numbers_and_no_idle_warnings(tmp_path, monkeypatch, capsys):
    from trl import GRPOTrainer

    from launch.compose import compose_grpo
    from rl import train as rt
    from rl.config import run_dir

    cfg = compose_grpo(["task=spa", "model=tiny_base", "steps=1", "save_steps=[1]", f"runs_root={tmp_path}",
                        "grpo.max_turns=12", "grpo.max_completion_length=2048", "grpo.pilot_tasks=3"]).cfg
    cfg.run_dir = str(run_dir(cfg))
    seeds = [r["seed"] for r in rt.rows(cfg, 0, 1)]
    seen: dict = {}

    def before(trainer):
        policy = ScriptedPolicy(trainer.processing_class, seeds)
        # TRL's own generation function scripted; the project's override around it still runs
        monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", lambda self, *a, **kw: policy(*a, **kw))
        seen.update(threads=torch.get_num_threads(), omp=os.environ.get("OMP_NUM_THREADS"),
                    params=trainer.accelerator.unwrap_model(trainer.model).base_model.model.num_parameters(),
                    find_unused=trainer.args.ddp_find_unused_parameters,
                    callbacks=[type(c).__name__ for c in trainer.callback_handler.callbacks])

    monkeypatch.setenv("OMP_NUM_THREADS", "7")   # what a caller left behind: the trainer decides anyway
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert rt.run(cfg, before_train=before) == 0
    finally:
        torch.set_num_threads(threads)
    assert seen["omp"] == str(rt.cpu_threads(rt.available_cpus(), 1, None))
    assert seen["threads"] == rt.cpu_threads(rt.available_cpus(), 1, seen["params"]) == 1
    assert seen["find_unused"] is False and "PrinterCallback" not in seen["callbacks"]
    out = capsys.readouterr().out
    assert "1 CPU thread(s) each" in out
    rounds = re.findall(rf"^\[grpo\] round 1 \(step 1/1\): completions=(\d+) reward_mean=({NUM}) reward_std=({NUM}) "
                        rf"gen_s=({NUM}) env_s=({NUM}) score_s=({NUM}) tokens=(\d+) tokens/s=({NUM})$", out, re.M)
    assert len(rounds) == 1, out
    completions, mean, _, gen_s, env_s, *_, tokens, _ = rounds[0]
    assert int(completions) == int(cfg.grpo.completions_per_step) and int(tokens) > 0 and float(env_s) > 0
    assert float(mean) > 0   # half the scripted rollouts replay the genuine solution
    steps = re.findall(rf"^\[grpo\] step 1/1: loss=({NUM}) grad_norm=({NUM}) lr=({NUM}) reward=({NUM}) "
                       rf"step_s=({NUM}) train_s=({NUM})$", out, re.M)
    assert len(steps) == 1 and float(steps[0][3]) == pytest.approx(float(mean), abs=1e-3), out
    assert "{'loss'" not in out
    idle = [f"{w.filename}:{w.lineno}: {w.message}" for w in caught if "is deprecated and will be removed in v6" in str(w.message)
            or "OMP_NUM_THREADS/MKL_NUM_THREADS unset" in str(w.message)]
    assert not idle, idle
