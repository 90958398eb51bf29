"""A scripted policy that replaces only TRL's generation function (`_generate_single_turn`).

The first turn of rollout i: even i replays the environment's genuine solution (envs' `genuine`
planner, run beforehand on a fresh copy of the same task), odd i gives up with a final answer and no
tool call. Later turns (only replaying rollouts still call tools) emit the next genuine call, then
a `Final answer:` turn. Completions are written in the tiny model's own format (think block, then a
Qwen3 `<tool_call>`), tokenized with the trainer's tokenizer, and handed back to TRL's real tool
loop, reward, loss and update code.
"""
from __future__ import annotations

import json
import os
import random
import signal

from envs.search_plan_act import SearchPlanActEnv
from envs.search_plan_act.policies import genuine

GIVE_UP = "I cannot find a way to do this.\n</think>\n\nFinal answer: unknown<|im_end|>"


def genuine_steps(seed: int, split: str = "train"):
    """(the genuine Steps, the env's total reward for them, the task prompt)."""
    env = SearchPlanActEnv()
    prompt = env.reset(seed=seed, split=split)
    steps = genuine(env, env.task.plan, random.Random(seed))
    return steps, env.get_reward(), prompt


def call_text(note: str, name: str, arguments: dict) -> str:
    call = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{note}\n</think>\n\n<tool_call>\n{call}\n</tool_call><|im_end|>"


class _Scripted:
    """TRL's `_generate_single_turn(prompt_ids, ...) -> (completion_ids, logprobs)`, scripted:
    `completion(text, i, turn)` gives rollout i's text for the prompt `text` at assistant turn `turn`."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.prompts_seen: list[list[int]] = []

    def __call__(self, prompt_ids, images, multimodal_fields, num_generations=None, has_tool_images=False):
        # TRL 1.16 passes num_generations (and has_tool_images); 1.9.2 (tests/test_trl_reference.py) neither
        out = []
        for i, ids in enumerate(prompt_ids):
            self.prompts_seen.append(list(ids))
            text = self.tok.decode(ids, skip_special_tokens=False)
            turn = text.count("<|im_start|>assistant") - 1
            out.append(self.tok.encode(self.completion(text, i, turn), add_special_tokens=False))
        return out, None


class ScriptedPolicy(_Scripted):
    def __init__(self, tokenizer, seeds: list[int], split: str = "train"):
        super().__init__(tokenizer)
        self.plans = {}        # task prompt -> the genuine Steps
        self.seed_of = {}      # task prompt -> task seed
        self.expected = {}     # task seed -> the env's total reward for the genuine solution
        for s in seeds:
            steps, total, prompt = genuine_steps(s, split)
            self.plans[prompt] = steps
            self.seed_of[prompt] = s
            self.expected[s] = total

    def completion(self, text: str, i: int, turn: int) -> str:
        steps = next(st for prompt, st in self.plans.items() if prompt in text)
        if turn == 0 and i % 2 == 1:
            return GIVE_UP
        if turn < len(steps):
            return call_text(steps[turn].note, steps[turn].name, dict(steps[turn].arguments))
        return f"All changes are made.\n</think>\n\nFinal answer: {steps[-1].arguments['answer']}<|im_end|>"


class QaScriptedPolicy(_Scripted):
    """task=qa: even rollouts search the question once, then answer with the gold answer; odd
    rollouts make one bad call (an empty query, answered with an error) and then give up."""

    def __init__(self, tokenizer, rows: list[dict]):
        super().__init__(tokenizer)
        self.gold = {r["prompt"][-1]["content"]: r["golden_answers"][0] for r in rows}

    def completion(self, text: str, i: int, turn: int) -> str:
        question = next(q for q in self.gold if q in text)
        if turn == 0 and i % 2 == 1:
            return call_text("Search nothing.", "search", {"query": ""})
        if turn == 1 and "<tool_response>\nError" in text:
            return GIVE_UP
        if turn == 0:
            return call_text("Search the question.", "search", {"query": question})
        return f"The documents say it.\n</think>\n\nFinal answer: {self.gold[question]}<|im_end|>"


def scripted_segment(cfg, stop_after: int | None = None) -> int:
    """One rl.train segment of `cfg` (its train.steps' rows) under the scripted policy; `stop_after`: SIGTERM during
    that step (a preemption: the segment saves a state at the end of it and exits 0)."""
    from rl import train as rt

    seeds = [r["seed"] for r in rt.rows(cfg, 0, int(cfg.train.steps))]

    def before(trainer):
        policy = ScriptedPolicy(trainer.processing_class, seeds)
        sent = []

        def generate(*a, **kw):
            if stop_after is not None and not sent and trainer.state.global_step == stop_after - 1:
                sent.append(True)
                os.kill(os.getpid(), signal.SIGTERM)  # stops at the end of this step
            return policy(*a, **kw)

        trainer._generate_single_turn = generate

    return rt.run(cfg, before_train=before)
