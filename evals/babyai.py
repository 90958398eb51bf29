"""Bench `babyai`: the model plays envs.babyai_text under BALROG's protocol (its `naive` agent).

Per step the model gets BALROG's messages (envs.babyai_text.prompt: the instruction prompt as a
user message, up to 16 past observations as `Observation:` user messages with the model's past
filtered replies as assistant messages, then `Current Observation:` and the closing instruction),
rendered by its own chat template. The reply is read as a vLLM server with a reasoning parser
returns it to BALROG's OpenAI client (its `message.content`, balrog/client.py): the content after the
template's reasoning block (evals.toolcalls.split_turn, as QA and GRPO read a turn: the text after the
last `</think>`; without one, all of it, unless the generation prompt opened `<think>` (Thinking-2507's
template): then the reply is all reasoning, no content, as vLLM's qwen3 parser with thinking on), then
BALROG's rule (`filter_reply`: stripped, only letters, whitespace and colons kept, an exact case-sensitive
match with one of the six actions); anything else executes `go forward` and the next observation starts
with BALROG's notice.

Decoding is BALROG's default: temperature 1.0 (`babyai_temperature`; 0 = greedy), at most 8192 new
tokens (`babyai_max_new_tokens`). Sampling never depends on the batch: request (episode, sample,
step) samples with its own seed, `request_seed` of the item id, its level seed, the sample index
and the step, so another batch size, a resumed run or another checkpoint draws the same random
numbers for the same step. `babyai_samples=k` plays every episode k times with k independent
streams (rows `<id>_sNN`; k=1 keeps the plain ids).

Episodes end as BALROG's loop does (success, the level's step limit, or `babyai_max_steps` steps,
which does not change the reward scale), or when the prompt no longer fits `max_model_len`
(`context_limit`, a failure). Per row: `return` (the sum of minigrid's rewards, 1 − 0.9·steps/limit
on success), `success`, `progression` (BALROG's: 1 once a reward was earned), `invalid_action_rate`
(invalid / steps), and the transcript: per step the messages sent, the raw reply, its content, the
filtered reply, the executed action, the observation, reward and done. The summary averages them
over rows, adds a 95% percentile bootstrap interval of the mean return over episodes
(`return_ci95`; an episode's samples are averaged first), `mean_steps` and a per-task breakdown.
"""
from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass

from common.benchmarks import BenchError, BenchItem
from evals.metrics import NULL_REASON, mean
from evals.scheduler import Episodes
from evals.toolcalls import split_turn
from evals.results import null_means, with_prompt_too_long

HISTORY = 16  # BALROG's max_text_history (checked against its protocol data in tests)
METRICS = ("return", "success", "progression", "invalid_action_rate")
BOOT_N, BOOT_SEED = 2000, 0


def _env():
    try:
        import envs.babyai_text as babyai_text
    except ImportError as exc:
        raise BenchError(
            f"bench babyai needs minigrid, gymnasium and pygame-ce (pip install -e '.[babyai]'): {exc}"
        ) from exc
    return babyai_text


def items(n: int | None, seed: int, samples: int = 1) -> list[BenchItem]:
    """The fixed episodes (n <= 0: the reference 50), each `samples` times."""
    bt = _env()
    rows = bt.make_eval_items(n if n and n > 0 else bt.EVAL_SIZE, seed)
    out = []
    for r in rows:
        for k in range(int(samples)):
            rid = r["id"] if samples == 1 else f"{r['id']}_s{k:02d}"
            out.append(BenchItem(rid, "", [], extra={**r, "episode": r["id"], "sample": k}))
    return out


def request_seed(episode: str, level_seed: int, sample: int, step: int) -> int:
    """The sampling seed of one request: a function of the episode and the step only."""
    digest = hashlib.sha256(f"babyai|{episode}|{level_seed}|{sample}|{step}".encode()).digest()
    return int.from_bytes(digest[:4], "big") >> 1


class _Game:
    def __init__(self, item: BenchItem, max_steps: int | None):
        bt = _env()
        self.item, self.env = item, bt.BabyAITextEnv(max_steps=max_steps)
        self.observation = self.env.reset(seed=item.extra["seed"], task=item.extra["task"])
        self.history = bt.History(self.env.instruction)
        self.previous: str | None = None  # the last filtered reply (BALROG's prev_action)
        self.messages: list[dict] = []
        self.transcript: list[dict] = []
        self.stop_reason: str | None = None
        self.refused_prompt: dict | None = None   # the prompt that did not fit (evals.scheduler.Table.generate)
        self.generated_tokens = 0

    def next_prompt(self) -> None:
        if self.previous is not None:
            self.history.add_reply(self.previous)
        self.history.add_observation(self.observation)
        self.messages = self.history.messages()

    def seed(self) -> int:
        x = self.item.extra
        return request_seed(x.get("episode", self.item.id), x["seed"], x.get("sample", 0), self.env.steps)


@dataclass
class GameRules:
    """How a bench's BabyAI games are played: the step cap, decoding, chat-template arguments, whether the
    generation prompt opens a think block (evals.toolcalls.opens_think)."""
    max_steps: int | None
    max_new_tokens: int
    temperature: float = 0.0
    template_kwargs: dict | None = None
    opens_think: bool = False

    def start(self, item: BenchItem) -> "_Game":
        return _Game(item, self.max_steps)

    def row(self, g: "_Game") -> dict:
        return _row(g, self.temperature, self.max_new_tokens)

    def episodes(self) -> Episodes:
        """How the registry plays these games (evals.scheduler.Episodes; no tool round)."""
        return Episodes(start=self.start, play=lambda g, table: play_game(g, table, self),
                        row=lambda g, item: self.row(g))


async def play_game(g: _Game, table, rules: GameRules) -> _Game:
    """Play one BabyAI game to its end on `table` (evals.scheduler.Table): per step BALROG's messages,
    one generation (sampled with the step's own seed, or greedy), the filtered reply executed."""
    bt = _env()
    while g.stop_reason is None:
        g.next_prompt()
        seed = g.seed() if rules.temperature > 0 else None
        turn = await table.generate(g, g.messages, [], max_new_tokens=rules.max_new_tokens,
                                    template_kwargs=rules.template_kwargs,
                                    temperature=rules.temperature if seed is not None else 0.0, seed=seed)
        if turn is None:   # context_limit
            break
        gen = turn[0]
        g.generated_tokens += gen.num_tokens
        _, content = split_turn(gen.text, rules.opens_think)
        filtered = bt.filter_reply(content)
        g.observation, reward, done = g.env.step(filtered)
        g.previous = filtered
        g.transcript.append({
            "messages": g.messages, "reply": gen.text, "finish_reason": gen.finish_reason, "seed": seed,
            "content": content, "filtered": filtered, "valid": filtered in bt.ACTIONS,
            "action": filtered if filtered in bt.ACTIONS else bt.FALLBACK_ACTION,
            "observation": g.observation, "reward": reward, "done": done,
        })
        if done:
            g.stop_reason = "success" if g.env.success else "step_limit"
    return g


def _row(g: _Game, temperature: float, max_new_tokens: int) -> dict:
    env, steps = g.env, g.env.steps
    x = g.item.extra
    return {
        "id": g.item.id, "episode": x.get("episode", g.item.id), "sample": x.get("sample", 0),
        "task": env.task, "seed": env.seed, "instruction": env.instruction,
        "transcript": g.transcript, "actions": [t["action"] for t in g.transcript],
        "invalid_actions": env.invalid_actions, "steps": steps, "limit": env.limit, "level_limit": env.level_limit,
        "success": bool(env.success), "return": float(env.episode_return), "progression": float(env.progression),
        "stop_reason": g.stop_reason, "generated_tokens": g.generated_tokens,
        "decoding": {"temperature": float(temperature), "max_new_tokens": int(max_new_tokens)},
        "metrics": {"return": float(env.episode_return), "success": float(env.success),
                    "progression": float(env.progression),
                    "invalid_action_rate": env.invalid_actions / steps if steps else 0.0},
        **({"refused_prompt": g.refused_prompt} if g.refused_prompt else {}),
    }


def _means(rows: list[dict]) -> dict:
    out = {k: mean(r["metrics"][k] for r in rows) for k in METRICS}
    out.update(mean_steps=mean(r["steps"] for r in rows), n=len(rows))
    return out


def bootstrap_interval(values: list[float], n_boot: int = BOOT_N, seed: int = BOOT_SEED) -> list[float]:
    """95% percentile bootstrap interval of the mean of `values` (seeded: the same values, the same interval)."""
    import numpy as np

    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return [0.0, 0.0]
    idx = np.random.default_rng(seed).integers(0, x.size, size=(n_boot, x.size))
    lo, hi = np.quantile(x[idx].mean(axis=1), [0.025, 0.975])
    return [float(lo), float(hi)]


def summarize(rows: list[dict]) -> dict:
    """Bench means (`return`, `success`, `progression`, `invalid_action_rate` in [0, 1]), `return_ci95`
    over episodes, `mean_steps`, `samples` per episode, per task."""
    summary = _means(rows)
    episodes: dict[str, list[float]] = {}
    for r in rows:
        episodes.setdefault(r.get("episode", r["id"]), []).append(r["metrics"]["return"])
    summary["return_ci95"] = bootstrap_interval([sum(v) / len(v) for v in episodes.values()])
    summary["samples"] = max(len(v) for v in episodes.values()) if episodes else 0
    tasks = sorted({r["task"] for r in rows}, key=[r["task"] for r in rows].index)
    summary["per_task"] = {t: _means([r for r in rows if r["task"] == t]) for t in tasks}
    summary["stop_reasons"] = dict(sorted(Counter(r["stop_reason"] for r in rows).items()))
    summary["mean_generated_tokens"] = mean(r["generated_tokens"] for r in rows)
    means = [*METRICS, "mean_steps", "mean_generated_tokens", "return_ci95"]
    if not rows:   # a mean over zero episodes is no number (evals.results.null_means)
        return null_means(summary, [*means, "samples"], "no items to score")
    summary = with_prompt_too_long(summary, rows, means)
    if summary.get(NULL_REASON):   # no game took a step: its tasks' means are no number either
        for task in summary["per_task"].values():
            task.update({k: None for k in (*METRICS, "mean_steps")})
    return summary
