"""Genuine-policy episodes as canonical trajectories (data_prep/schema.py) and eval rows.

Each exported record is a real episode: every assistant turn carries one tool call the genuine
policy made, every tool message carries the environment's actual response, and the last
assistant turn is `Final answer: <answer>` (terminator "final_answer", domain "search").
"""
from __future__ import annotations

import json
import random
from functools import lru_cache
from pathlib import Path

from tqdm import tqdm

from data_prep.schema import make_record, tool_call

from .env import TOOL_NAMES, SearchPlanActEnv
from .goals import episode_seeds
from .policies import genuine
from .spec import get_spec

SOURCE = "search-plan-act"


@lru_cache(maxsize=1)
def _schemas_json() -> str:
    from transformers.utils import get_json_schema

    env = SearchPlanActEnv()
    return json.dumps([get_json_schema(getattr(env, name)) for name in TOOL_NAMES])


def tool_schemas() -> list[dict]:
    """OpenAI-style specs of the five tools, derived from the tool methods' type hints and
    Google-style docstrings with `transformers.utils.get_json_schema` (what TRL renders)."""
    return json.loads(_schemas_json())


def episode_record(task_seed: int, split: str = "train") -> dict:
    """Run the genuine policy on one task and return the canonical record."""
    env = SearchPlanActEnv()
    prompt = env.reset(seed=task_seed, split=split)
    steps = genuine(env, env.task.plan, random.Random(task_seed))
    trace = env.transcript()
    if len(trace) != len(steps):
        raise RuntimeError(f"task {task_seed}: {len(steps)} policy steps but {len(trace)} logged calls")
    messages: list[dict] = [{"role": "user", "content": prompt}]
    for k, (step, call) in enumerate(zip(steps, trace)):
        cid = f"call_{k}"
        messages.append({"role": "assistant", "content": step.note,
                         "tool_calls": [tool_call(step.name, dict(step.arguments), cid)]})
        messages.append({"role": "tool", "content": call["response"], "tool_call_id": cid, "name": step.name})
    total = env.get_reward()
    if total < 1.0:
        raise RuntimeError(f"genuine policy scored {total:.3f} < 1 on {split} task {task_seed}: {env.reward_components()}")
    answer = steps[-1].arguments["answer"]
    messages.append({"role": "assistant", "content": f"Final answer: {answer}"})
    return make_record(
        id=f"{SOURCE}-{split}-{task_seed}", source=SOURCE, domain="search", messages=messages,
        tools=tool_schemas(), task=prompt, answer=env.task.answer, terminator="final_answer",
    )


def export_trajectories(path, n: int, seed: int, split: str = "train") -> int:
    """Write `n` genuine-policy episodes as canonical jsonl to `path`; returns the count written.

    Only episodes the genuine policy solves fully (total reward 1.0) are exported; any other
    outcome would be a bug in the env or the policy, so it raises rather than writing bad labels."""
    get_spec(split)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    written = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for s in tqdm(episode_seeds(seed, n, split), desc=f"export {split}", disable=n < 50):
            rec = episode_record(s, split)
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            written += 1
    tmp.replace(path)
    return written


def make_eval_items(n: int, seed: int, split: str = "ood") -> list[dict]:
    """Rows for the `search_plan_ood` bench loader: {"id", "seed", "split", "question"} where
    `question` is the prompt `reset(seed=..., split=...)` returns."""
    get_spec(split)
    env = SearchPlanActEnv()
    rows = []
    for s in episode_seeds(seed, n, f"eval-{split}"):
        rows.append({"id": f"{SOURCE}-{split}-{s}", "seed": s, "split": split,
                     "question": env.reset(seed=s, split=split)})
    return rows
