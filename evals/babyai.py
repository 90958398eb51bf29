"""Bench `babyai`: the model plays envs.babyai_text through its own chat template (no tools).

One step = one fresh prompt: a system message with the rules and the six actions, and a user
message with the instruction, the last `HISTORY` (observation, action) pairs and the current
observation. The reply's action is read by `parse_action`:

    last_line     the last non-empty line of the reply (after any `</think>`), stripped of markup,
                  quotes, a trailing full stop and an `Action:`-style label, is one of the six
    last_mention  otherwise the action string that occurs last anywhere in the reply
    none          no action string at all: an invalid action (the environment does `go forward`
                  and says so in the next observation; it is counted)

Episodes end on success, at the step limit (the level's, or `babyai_max_steps` when lower) or when
the prompt no longer fits `max_model_len` (`context_limit`, scored as a failure). Per-episode
metrics: `return` (1 − 0.9·steps/limit on success, else 0), `success`, `invalid_action_rate`
(invalid / steps); the summary averages them over episodes and adds `mean_steps` and a per-task
breakdown. Decoding is greedy (the backend's), so a rerun plays the same games.
"""
from __future__ import annotations

import re
from collections import Counter

from common.benchmarks import BenchError, BenchItem
from evals.agent import generate_round, render
from evals.extract import split_reasoning
from evals.metrics import mean

HISTORY = 16  # BALROG's history length (observations/actions shown before the current one)
METRICS = ("return", "success", "invalid_action_rate")
_LABEL = re.compile(r"^(?:final\s+answer|next\s+action|action|answer)\s*[:\-]\s*", re.I)
_STRIP = " \t*`'\"_.!>#[]()"


def _env():
    try:
        import envs.babyai_text as babyai_text
    except ImportError as exc:
        raise BenchError(
            f"bench babyai needs minigrid, gymnasium and pygame-ce (pip install -e '.[babyai]'): {exc}"
        ) from exc
    return babyai_text


def parse_action(reply: str, actions) -> tuple[str | None, str]:
    """(action, rule) from one reply's content (`rule` is last_line | last_mention | none)."""
    lines = [ln for ln in reply.splitlines() if ln.strip()]
    if lines:
        last = _LABEL.sub("", lines[-1].strip().strip(_STRIP)).strip(_STRIP).lower()
        last = " ".join(last.split())
        if last in actions:
            return last, "last_line"
    low = " ".join(reply.lower().split())
    best, where = None, -1
    for action in actions:
        for m in re.finditer(rf"(?<![a-z]){re.escape(action)}(?![a-z])", low):
            if m.end() > where:
                best, where = action, m.end()
    return (best, "last_mention") if best else (None, "none")


def system_prompt(actions) -> str:
    return (
        "You are playing a text game in a grid world. You get an instruction to carry out, then at each "
        "step a description of what you see, relative to you (left/right and forward, in steps), and "
        "what you carry. Walls and closed doors block the way; you pick up or toggle the object right "
        "in front of you and drop what you carry there.\n"
        f"Available actions: {', '.join(actions)}.\n"
        "You may think first, but end your reply with exactly one action on its own line."
    )


def step_messages(instruction: str, history: list[tuple[str, str]], observation: str, actions) -> list[dict]:
    parts = [f"Instruction: {instruction}", ""]
    if history:
        parts.append(f"Previous steps (oldest first, at most {HISTORY}):")
        for obs, act in history[-HISTORY:]:
            parts += [f"Observation:\n{obs}", f"Action: {act}"]
        parts.append("")
    parts += [f"Current observation:\n{observation}", "", "What is your next action?"]
    return [{"role": "system", "content": system_prompt(actions)}, {"role": "user", "content": "\n".join(parts)}]


def items(n: int | None, seed: int) -> list[BenchItem]:
    """The fixed episodes (n <= 0: the reference 50)."""
    bt = _env()
    rows = bt.make_eval_items(n if n and n > 0 else bt.EVAL_SIZE, seed)
    return [BenchItem(r["id"], "", [], extra=dict(r)) for r in rows]


class _Game:
    def __init__(self, item: BenchItem, max_steps: int | None):
        bt = _env()
        self.item, self.env = item, bt.BabyAITextEnv(max_steps=max_steps)
        self.observation = self.env.reset(seed=item.extra["seed"], task=item.extra["task"])
        self.history: list[tuple[str, str]] = []
        self.transcript: list[dict] = []
        self.stop_reason: str | None = None
        self.generated_tokens = 0


def play(chunk: list[BenchItem], backend, *, max_steps: int | None, max_new_tokens: int, max_model_len: int) -> list[dict]:
    """Play `chunk`'s episodes in lockstep (one batched generate per step); one row per episode."""
    actions = _env().ACTIONS
    games = [_Game(it, max_steps) for it in chunk]
    active = list(games)
    def prompt_of(g: _Game) -> str:
        return render(backend.tokenizer, step_messages(g.env.instruction, g.history, g.observation, actions), [])

    while active:
        for g, gen, _ in generate_round(backend, active, prompt_of, max_model_len=max_model_len,
                                        max_new_tokens=max_new_tokens):
            g.generated_tokens += gen.num_tokens
            _, content = split_reasoning(gen.text)
            action, rule = parse_action(content, actions)
            sent = action if action else (content.strip().splitlines() or [""])[-1][:80]
            before = g.observation
            g.observation, _, done = g.env.step(sent)
            g.history.append((before, action or sent))
            g.transcript.append({"observation": before, "reply": gen.text, "finish_reason": gen.finish_reason,
                                 "action": action, "rule": rule})
            if done:
                g.stop_reason = "success" if g.env.success else "step_limit"
        active = [g for g in active if g.stop_reason is None]
    return [_row(g) for g in games]


def _row(g: _Game) -> dict:
    env, steps = g.env, g.env.steps
    return {
        "id": g.item.id, "task": env.task, "seed": env.seed, "instruction": env.instruction,
        "transcript": g.transcript, "final_observation": g.observation,
        "actions": [t["action"] or _env().FALLBACK_ACTION for t in g.transcript],
        "invalid_actions": env.invalid_actions, "steps": steps, "limit": env.limit,
        "success": bool(env.success), "return": float(env.episode_return), "stop_reason": g.stop_reason,
        "action_rules": dict(Counter(t["rule"] for t in g.transcript)), "generated_tokens": g.generated_tokens,
        "metrics": {"return": float(env.episode_return), "success": float(env.success),
                    "invalid_action_rate": env.invalid_actions / steps if steps else 0.0},
    }


def _means(rows: list[dict]) -> dict:
    out = {k: mean(r["metrics"][k] for r in rows) for k in METRICS}
    out.update(mean_steps=mean(r["steps"] for r in rows), n=len(rows))
    return out


def summarize(rows: list[dict]) -> dict:
    """Bench means (`return`, `success`, `invalid_action_rate` in [0, 1]), `mean_steps`, per task."""
    summary = _means(rows)
    tasks = sorted({r["task"] for r in rows}, key=[r["task"] for r in rows].index)
    summary["per_task"] = {t: _means([r for r in rows if r["task"] == t]) for t in tasks}
    summary["stop_reasons"] = dict(sorted(Counter(r["stop_reason"] for r in rows).items()))
    summary["action_rules"] = dict(sorted(sum((Counter(r["action_rules"]) for r in rows), Counter()).items()))
    summary["mean_generated_tokens"] = mean(r["generated_tokens"] for r in rows)
    return summary
