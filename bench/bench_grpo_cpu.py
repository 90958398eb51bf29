"""The documented CPU GRPO run against a plain TRL GRPOTrainer, per phase (issue 65 item 6).

    documented  `launch stage=grpo task=spa model=tiny_base steps=2 save_steps=[1,2] runs_root=R`, as a user runs it
                (OMP_NUM_THREADS unset: the trainer picks its threads), in its own process; its phases are summed
                from its `[grpo] round` / `[grpo] step` lines (docs/glossary.md, "Columns")
    plain_trl   `trl.GRPOTrainer` itself (not the project's subclass) on the same tiny base, LoRA, GRPO settings
                (rl.train.grpo_args), tokenizer template, environment, reward functions and task rows, with
                torch's default threads and TRL's own logging; its phases timed by wrapping the same TRL methods
                on the instance (generation, the tool loop, the reward functions, the round, the step)

Phases: gen (generating tokens), env (tool calls and reward functions), score (the rest of a round: log-probs
and advantages), train (a step less its round: loss, backward, update); wall is the whole process, imports,
model load and checkpoint writes included. Arms are interleaved (repeat r starts with arm r mod 2); prints a
row per run, then the last line exactly `documented/plain_trl wall W train T` (ratios of the medians).

    nice .venv/bin/python bench/bench_grpo_cpu.py [repeats=1]
"""
from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("gen", "env", "score", "train")
STEPS = 2


def documented(tmp: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    t0 = time.perf_counter()
    proc = subprocess.run([str(Path(sys.executable).with_name("launch")), "stage=grpo", "task=spa", "model=tiny_base",
                           f"steps={STEPS}", "save_steps=[1,2]", f"runs_root={tmp / 'R'}"], cwd=tmp, env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"documented run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    num = r"(-?\d+(?:\.\d+)?)"
    rounds = re.findall(rf"^\[grpo\] round .* gen_s={num} env_s={num} score_s={num} ", proc.stdout, re.M)
    steps = re.findall(rf"^\[grpo\] step .* train_s={num}$", proc.stdout, re.M)
    threads = re.search(r"(\d+) CPU thread\(s\) each", proc.stdout)
    return {"wall": wall, "gen": sum(float(r[0]) for r in rounds), "env": sum(float(r[1]) for r in rounds),
            "score": sum(float(r[2]) for r in rounds), "train": sum(float(s) for s in steps),
            "threads": int(threads.group(1)) if threads else None, "steps": len(steps)}


def plain_trl_child(out: Path) -> None:
    """In a fresh process: a plain trl.GRPOTrainer on the documented run's model, data and settings."""
    t_start = time.perf_counter()
    import torch
    from datasets import Dataset
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback, set_seed
    from trl import GRPOTrainer

    from common.tiny import resolve_model_path
    from launch.compose import compose_grpo
    from rl import chat
    from common.interpreter import installed_trl
    from rl.envs import environment_for, reward_funcs_for
    from rl.train import grpo_args, lora_config, rows

    cfg = compose_grpo(["task=spa", "model=tiny_base", f"steps={STEPS}", f"runs_root={out}"]).cfg
    path = resolve_model_path(str(cfg.model.path))
    tok = AutoTokenizer.from_pretrained(path)
    chat.install(tok, enable_thinking=cfg.grpo.enable_thinking)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    set_seed(int(cfg.seed))
    model = get_peft_model(model, lora_config(cfg))
    funcs, weights = reward_funcs_for("spa")
    args = grpo_args(cfg, out / "trl", STEPS)
    args.reward_weights = weights
    trainer = GRPOTrainer(model=model, processing_class=tok, args=args, reward_funcs=funcs,
                          train_dataset=Dataset.from_list(rows(cfg, 0, STEPS)),
                          environment_factory=environment_for("spa", trl_version=installed_trl()))
    t = dict.fromkeys(("gen", "tool", "gen_in_tool", "reward", "round", "step"), 0.0)

    def timed(name, fn, inside_tool=False):
        def wrapper(*a, **kw):
            t0, g0 = time.perf_counter(), t["gen"]
            try:
                return fn(*a, **kw)
            finally:
                t[name] += time.perf_counter() - t0
                if name == "tool":
                    t["gen_in_tool"] += t["gen"] - g0
        return wrapper

    for name, method in (("gen", "_generate_single_turn"), ("tool", "_tool_call_loop"), ("reward", "_calculate_rewards"),
                         ("round", "_generate_and_score_completions")):
        setattr(trainer, method, timed(name, getattr(trainer, method)))

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *a, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **kw):
            t["step"] += time.perf_counter() - self.t0

    trainer.add_callback(StepTimer())
    trainer.train()
    env = t["tool"] - t["gen_in_tool"] + t["reward"]
    result = {"gen": t["gen"], "env": env, "score": t["round"] - t["gen"] - env, "train": t["step"] - t["round"],
              "threads": torch.get_num_threads(), "steps": int(trainer.state.global_step),
              "in_process": time.perf_counter() - t_start}
    (out / "result.json").write_text(json.dumps(result))


def plain_trl(tmp: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["PYTHONPATH"] = str(ROOT)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--plain-trl-child", str(tmp)], cwd=tmp, env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"plain TRL run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return {"wall": wall, **json.loads((tmp / "result.json").read_text())}


def main(argv: list[str]) -> int:
    if argv[:1] == ["--plain-trl-child"]:
        plain_trl_child(Path(argv[1]))
        return 0
    repeats = int(dict(a.split("=", 1) for a in argv).get("repeats", 1))
    arms = {"documented": documented, "plain_trl": plain_trl}
    runs: dict[str, list[dict]] = {a: [] for a in arms}
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {os.cpu_count()} CPUs", flush=True)
    print(f"{'arm':<12}{'wall s':>9}" + "".join(f"{p + ' s':>9}" for p in PHASES) + f"{'threads':>9}{'steps':>7}")
    for r in range(repeats):
        order = list(arms) if r % 2 == 0 else list(arms)[::-1]
        for arm in order:
            with tempfile.TemporaryDirectory(prefix=f"bench_grpo_{arm}_") as tmp:
                res = arms[arm](Path(tmp))
            runs[arm].append(res)
            print(f"{arm:<12}{res['wall']:>9.1f}" + "".join(f"{res[p]:>9.1f}" for p in PHASES)
                  + f"{res['threads']!s:>9}{res['steps']:>7}", flush=True)
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    med = {a: {k: statistics.median(x[k] for x in runs[a]) for k in ("wall", *PHASES)} for a in arms}
    print(f"documented/plain_trl wall {med['documented']['wall'] / med['plain_trl']['wall']:.2f} "
          f"train {med['documented']['train'] / med['plain_trl']['train']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
