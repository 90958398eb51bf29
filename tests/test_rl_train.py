"""The GRPO train loop on CPU through TRL's real GRPOTrainer, with only the generation function
replaced by a scripted policy (half the rollouts replay the environment's genuine solution, half give
up): TRL's tool loop, the environment reward, the GRPO loss and the LoRA update all run for real.

One session-scoped run of 2 steps, interrupted by SIGTERM during step 1 and resumed by a fresh
trainer, feeds every check: the stop at the step boundary, the resume at the next step, every LoRA B
changing, finite non-zero losses, the expected rewards, and the run directory (verify-checkpoint on
step 0, 1 and 2). The first segment's console output, warnings and the trainer's thread settings feed the checks
of issue 65 item 6 too (the trainer sets its own thread count, prints its progress in numbers, and leaves out
third-party warnings that say nothing a user can act on)."""
from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import signal
import warnings
from pathlib import Path

import pytest
import torch

from tests.rl_helpers import ScriptedPolicy

pytestmark = pytest.mark.slow
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _lora_b(trainer) -> dict[str, torch.Tensor]:
    model = trainer.accelerator.unwrap_model(trainer.model)
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_B" in n}


@pytest.fixture(scope="session")
def grpo_run(tmp_path_factory):
    from trl import GRPOTrainer

    from rl import train as rt
    from launch.compose import compose_grpo
    from common.schema import run_dir

    patch = pytest.MonkeyPatch()
    root = tmp_path_factory.mktemp("grpo")
    cfg = compose_grpo(["task=spa", "model=tiny_base", "steps=2", "save_steps=[1,2]", f"runs_root={root}",
                        "grpo.max_turns=12", "grpo.max_completion_length=2048", "grpo.pilot_tasks=3"]).cfg
    cfg.run_dir = str(run_dir(cfg))
    seeds = [r["seed"] for r in rt.rows(cfg, 0, 2)]
    out: dict = {"cfg": cfg, "rd": Path(cfg.run_dir)}

    def segment(name, sigterm):
        def before(trainer):
            policy = ScriptedPolicy(trainer.processing_class, seeds)
            out[f"{name}_policy"] = policy
            out[f"{name}_b0"] = _lora_b(trainer)
            out[f"{name}_trainer"] = trainer
            out[f"{name}_seen"] = dict(
                threads=torch.get_num_threads(), omp=os.environ.get("OMP_NUM_THREADS"),
                params=trainer.accelerator.unwrap_model(trainer.model).base_model.model.num_parameters(),
                find_unused=trainer.args.ddp_find_unused_parameters,
                callbacks=[type(c).__name__ for c in trainer.callback_handler.callbacks])

            def generate(*a, **kw):
                if sigterm and not policy.prompts_seen:
                    os.kill(os.getpid(), signal.SIGTERM)  # preemption arrives mid-step 1
                return policy(*a, **kw)

            # TRL's own generation function scripted; the project's override around it (the progress counts) runs
            patch.setattr(GRPOTrainer, "_generate_single_turn", lambda self, *a, **kw: generate(*a, **kw))

        # what a caller left behind (OMP_NUM_THREADS=7, three torch threads): the trainer decides anyway
        os.environ["OMP_NUM_THREADS"] = "7"
        torch.set_num_threads(3)
        console = io.StringIO()
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(console):
            warnings.simplefilter("always")
            out[f"{name}_rc"] = rt.run(cfg, before_train=before)
        out[f"{name}_out"], out[f"{name}_warnings"] = console.getvalue(), caught
        out[f"{name}_b1"] = _lora_b(out[f"{name}_trainer"])
        out[f"{name}_metrics"] = [json.loads(x) for x in (Path(cfg.run_dir) / "metrics.jsonl").read_text().splitlines()]
        out[f"{name}_done"] = (Path(cfg.run_dir) / "DONE").is_file()

    previous, threads = signal.getsignal(signal.SIGTERM), torch.get_num_threads()
    env = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "LOCAL_WORLD_SIZE")}
    os.environ.pop("LOCAL_WORLD_SIZE", None)
    try:
        segment("a", sigterm=True)
        segment("b", sigterm=False)
    finally:
        patch.undo()
        signal.signal(signal.SIGTERM, previous)
        torch.set_num_threads(threads)
        for k, v in env.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    return out


def test_sigterm_stops_at_the_step_boundary_and_resume_continues(grpo_run):
    r = grpo_run
    assert r["a_rc"] == 0 and not r["a_done"]
    assert [m["step"] for m in r["a_metrics"]] == [1]
    assert r["a_trainer"].state.global_step == 1  # stopped after step 1 of 2
    assert (r["rd"] / "state" / "step-000001" / "COMPLETE").is_file()
    assert r["b_rc"] == 0 and r["b_done"]
    assert [m["step"] for m in r["b_metrics"]] == [1, 2]
    assert r["b_trainer"].state.global_step == 1  # the resumed segment ran only step 2, not a restart
    from rl import train as rt

    step2 = {row["seed"] for row in rt.rows(r["cfg"], 1, 1)}  # step 2's rows of the run's task stream
    assert {r["b_policy"].seed_of[p] for p in r["b_policy"].plans} >= step2
    seen = {s for s, st in r["b_policy"].seed_of.items()
            if any(s in r["b_policy"].tok.decode(ids) for ids in r["b_policy"].prompts_seen)}
    assert {r["b_policy"].seed_of[p] for p in seen} == step2
    # The resumed trainer started from the saved adapter, not from LoRA's zero init.
    for n, b in r["b_b0"].items():
        assert torch.equal(b, r["a_b1"][n]), n
    from rl.checkpoint import load_state

    final = load_state(r["rd"] / "state" / "step-000002")
    steps = {v for k, v in final["optimizer"]["state"].items() for kk, v in v.items() if kk == "step"}
    assert {float(s) for s in steps} == {2.0}  # AdamW moments carried over the resume


NUM = r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?"


def test_the_trainer_sets_its_threads_prints_numbers_and_no_idle_warnings(grpo_run):
    """Issue 65 item 6, on the first segment (step 1 of 2): its own thread count whatever the caller left, a line
    per generation round and per optimizer step with the numbers, no dict of strings, no warning that says nothing
    actionable."""
    from rl import train as rt

    r, cfg = grpo_run, grpo_run["cfg"]
    for seg in ("a", "b"):
        seen = r[f"{seg}_seen"]
        assert seen["omp"] == str(rt.cpu_threads(rt.available_cpus(), 1, None)), seg
        assert seen["threads"] == rt.cpu_threads(rt.available_cpus(), 1, seen["params"]) == 1, seg
        assert seen["find_unused"] is False and "PrinterCallback" not in seen["callbacks"], seg
    out = r["a_out"]
    assert "1 CPU thread(s) each" in out
    rounds = re.findall(rf"^\[grpo\] round 1 \(step 1/2\): completions=(\d+) reward_mean=({NUM}) reward_std=({NUM}) "
                        rf"gen_s=({NUM}) env_s=({NUM}) score_s=({NUM}) tokens=(\d+) tokens/s=({NUM})$", out, re.M)
    assert len(rounds) == 1, out
    completions, mean, _, gen_s, env_s, *_, tokens, _ = rounds[0]
    assert int(completions) == int(cfg.grpo.completions_per_step) and int(tokens) > 0 and float(env_s) > 0
    assert float(mean) > 0   # half the scripted rollouts replay the genuine solution
    steps = re.findall(rf"^\[grpo\] step 1/2: loss=({NUM}) grad_norm=({NUM}) lr=({NUM}) reward=({NUM}) "
                       rf"step_s=({NUM}) train_s=({NUM})$", out, re.M)
    assert len(steps) == 1 and float(steps[0][3]) == pytest.approx(float(mean), abs=1e-3), out
    assert re.search(r"^\[grpo\] step 2/2: loss=", r["b_out"], re.M), r["b_out"]
    assert "{'loss'" not in out + r["b_out"] and "every advantage is 0" not in out + r["b_out"]
    idle = [f"{w.filename}:{w.lineno}: {w.message}" for seg in ("a", "b") for w in r[f"{seg}_warnings"]
            if "is deprecated and will be removed in v6" in str(w.message)
            or "OMP_NUM_THREADS/MKL_NUM_THREADS unset" in str(w.message)]
    assert not idle, idle


def test_every_lora_b_changes_and_losses_are_finite_nonzero(grpo_run):
    r = grpo_run
    names = list(r["a_b0"])
    assert len(names) == 4 * len(TARGETS) and {n.split(".")[-4] for n in names} == set(TARGETS)
    for seg in ("a", "b"):
        for n in names:
            assert not torch.equal(r[f"{seg}_b0"][n], r[f"{seg}_b1"][n]), f"segment {seg}: {n} unchanged"
    for m in r["b_metrics"]:
        assert math.isfinite(m["loss"]) and m["loss"] != 0.0
        assert m["frac_reward_zero_std"] == 0.0   # each group pairs a replay (reward 1) with a give-up (0)
        assert m["tool_calls_per_rollout"] > 0 and m["tool_failures"] == 0 and m["tool_parse_failures"] == 0
        assert m["tool_errors_per_rollout"] == 0  # the genuine replay makes no bad call


def test_rewards_are_the_environment_s_for_replay_and_give_up(grpo_run):
    r = grpo_run
    expected = r["a_policy"].expected
    assert set(expected.values()) == {1.0}  # the genuine solution earns the full reward
    for step in (1, 2):
        rows = [json.loads(x) for x in (r["rd"] / "rollouts" / f"step-{step:06d}.jsonl").read_text().splitlines()]
        assert len(rows) == 4
        for i, row in enumerate(rows):
            want = expected[row["row"]["seed"]] if i % 2 == 0 else 0.0
            assert row["rewards"]["SearchPlanActEnv"] == pytest.approx(want), (step, i)
            assert row["reward"] == pytest.approx(want)
            if i % 2 == 0:
                assert [c["name"] for c in row["tool_calls"]][-1] == "finish"
        m = r["b_metrics"][step - 1]
        assert m["reward"] == pytest.approx(0.5) and m["reward_total"] == pytest.approx(0.5)
        assert m["reward_outcome"] == pytest.approx(0.5) and m["reward_stop"] == pytest.approx(0.5)


def test_run_dir_checkpoints_verify(grpo_run):
    from sft.verify import verify_checkpoint

    rd = grpo_run["rd"]
    assert rd.parts[-2:] == ("grpo_spa", "seed0")
    own = (Path(__file__).resolve().parents[1] / "common" / "tiny_base" / "chat_template.jinja").read_text()
    for step in (0, 1, 2):
        d = rd / "checkpoints" / f"step-{step:06d}"
        assert verify_checkpoint(d) == [], d
        assert (d / "chat_template.jinja").read_text() == own
    for step in (1, 2):
        ad = json.loads((rd / "checkpoints" / f"step-{step:06d}" / "adapter" / "adapter_config.json").read_text())
        assert (ad["r"], ad["lora_alpha"], sorted(ad["target_modules"])) == (32, 64, sorted(TARGETS))
    assert json.loads((rd / "DONE").read_text())["step"] == 2


def test_finished_run_of_another_config_is_refused(grpo_run):
    from common.cli import ConfigError
    from rl import train as rt

    cfg = grpo_run["cfg"].copy()
    assert rt.run(cfg) == 0  # the same config: reported as finished
    cfg.grpo.temperature = 0.5
    with pytest.raises(ConfigError, match="grpo.temperature: 1.0 -> 0.5"):
        rt.run(cfg)


def test_launch_two_cpu_ranks_share_one_trainer(tmp_path):
    """`launch stage=grpo ... nproc=2` on CPU: torchrun's two ranks form one accelerate world (TRL
    gathers their rollouts), not two single-process trainers writing the same run dir."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1", WANDB_MODE="offline", HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, "-m", "launch.cli", "stage=grpo", "task=spa", "model=tiny_base", "steps=1",
                          f"runs_root={tmp_path}", "nproc=2", "grpo.max_completion_length=32", "grpo.pilot_tasks=3"],
                         cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "2 process(es)" in out.stdout and out.stdout.count("[rl.train] starting step 1") == 1
    rd = tmp_path / "grpo_spa" / "seed0"
    rows = [json.loads(x) for x in (rd / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]
    assert sorted(p.name for p in (rd / "state" / "step-000001" / "rng").iterdir()) == [
        "rank-00000.safetensors", "rank-00001.safetensors"]
    assert (rd / "DONE").is_file() and (rd / "checkpoints" / "step-000001" / "SHA256SUMS").is_file()
    # The run dir belongs to one identity: another GRPO setting is refused (exit 2, the key named).
    from launch.cli import main

    assert main(["stage=grpo", "task=spa", "model=tiny_base", "steps=1", f"runs_root={tmp_path}", "nproc=2",
                 "grpo.max_completion_length=32", "grpo.pilot_tasks=3", "dry_run=true"]) == 0
    assert main(["stage=grpo", "task=spa", "model=tiny_base", "steps=1", f"runs_root={tmp_path}", "nproc=2",
                 "grpo.max_completion_length=64", "grpo.pilot_tasks=3", "dry_run=true"]) == 2
