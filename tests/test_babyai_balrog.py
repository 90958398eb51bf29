"""envs.babyai_text against BALROG's own code: levels, observations, prompts, parser, rewards.

The reference data (tests/data/balrog_babyai) was recorded by tools/balrog_reference/
make_reference.py from BALROG and its minigrid fork at the commits in tools/balrog_reference/
COMMITS.md: every replay below must match it byte for byte.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

pytest.importorskip("minigrid", reason="the babyai extra (minigrid, gymnasium, pygame-ce) is not installed")

from envs.babyai_text import ACTIONS, FALLBACK_ACTION, INVALID_NOTICE, TASKS, BabyAITextEnv, History, filter_reply  # noqa: E402
from envs.babyai_text.env import make_eval_items  # noqa: E402

DATA = Path(__file__).parent / "data" / "balrog_babyai"


def _load(name: str) -> list[dict]:
    with gzip.open(DATA / f"{name}.json.gz", "rb") as f:
        return json.loads(f.read().decode("utf-8"))


LEVELS = _load("levels")
EPISODES = _load("episodes")


def _grid_hex(env) -> str:
    return bytes(env._level.grid.encode().astype("uint8").ravel().tolist()).hex()


def test_reference_covers_every_task_and_the_fixed_items():
    assert {lv["task"] for lv in LEVELS} == set(TASKS) == {ep["task"] for ep in EPISODES}
    recorded = {(lv["task"], lv["seed"]) for lv in LEVELS}
    assert {(it["task"], it["seed"]) for it in make_eval_items(50, 0)} <= recorded
    replies = {s["raw_reply"] for ep in EPISODES for s in ep["steps"]}
    assert {"jump", " go forward.", "Go forward", "**pick up**", ""} <= replies
    assert max(len(ep["steps"]) for ep in EPISODES) > 2 * 16
    assert any(ep["episode_return"] > 0 for ep in EPISODES) and any(s["truncated"] for ep in EPISODES for s in ep["steps"])


@pytest.mark.parametrize("task", TASKS)
def test_levels_seed_for_seed(task):
    """Mission, step limit, the full grid, the start pose and the first observation, per seed."""
    env = BabyAITextEnv()
    for lv in (lv for lv in LEVELS if lv["task"] == task):
        obs = env.reset(seed=lv["seed"], task=task)
        got = {"mission": env.instruction, "max_steps": env.limit, "grid": _grid_hex(env),
               "grid_shape": [env._level.width, env._level.height], "observation": obs,
               "agent_pos": [int(v) for v in env._level.agent_pos], "agent_dir": int(env._level.agent_dir)}
        assert got == {k: lv[k] for k in got}, (task, lv["seed"])


@pytest.mark.parametrize("k", range(len(EPISODES)), ids=[f"{e['task']}-{e['seed']}" for e in EPISODES])
def test_episode_replay(k):
    """BALROG's naive-agent episodes replayed through BabyAITextEnv and History: the messages of
    every step (roles and text), the filtered reply, the executed action, reward, done, return."""
    ep = EPISODES[k]
    env = BabyAITextEnv(max_steps=ep["max_steps_per_episode"])
    obs = env.reset(seed=ep["seed"], task=ep["task"])
    assert (env.instruction, obs) == (ep["mission"], ep["observation"])
    history, previous = History(env.instruction), None
    for t, ref in enumerate(ep["steps"]):
        if previous is not None:
            history.add_reply(previous)
        history.add_observation(obs)
        assert history.messages() == ref["messages"], f"step {t}"
        previous = filter_reply(ref["raw_reply"])
        assert previous == ref["filtered_reply"], f"step {t}"
        assert (previous if previous in ACTIONS else FALLBACK_ACTION) == ref["executed"], f"step {t}"
        obs, reward, done = env.step(previous)
        shown = ref["description"] if previous in ACTIONS else INVALID_NOTICE + ref["description"]
        assert (obs, reward, env.terminated or env.truncated) == (shown, ref["reward"], ref["done"]), f"step {t}"
        assert done == (t == len(ep["steps"]) - 1), f"step {t}"
    assert (env.steps, env.episode_return, env.progression) == (ep["num_steps"], ep["episode_return"], ep["progression"])


def test_evaluate_defaults_are_balrogs():
    """The bench's history window and decoding defaults are BALROG's (its config.yaml, via the protocol data)."""
    from envs.babyai_text import PROTOCOL
    from evals.babyai import HISTORY
    from evals.config import DEFAULTS

    assert HISTORY == PROTOCOL["max_text_history"] == 16
    assert (DEFAULTS["babyai_temperature"], DEFAULTS["babyai_max_new_tokens"]) == (PROTOCOL["temperature"], PROTOCOL["max_tokens"])
    assert PROTOCOL["instruction_role"] == "user" and PROTOCOL["num_dists"] == 0
