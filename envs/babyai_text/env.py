"""`BabyAITextEnv`: one BALROG BabyAI level as a text game (see the package docstring for the rules)."""
from __future__ import annotations

import contextlib
import io
import random

from envs.babyai_text.describe import describe_view
from envs.babyai_text.levels import STEP_LIMITS, TASKS, TextLevel
from envs.babyai_text.prompt import ACTIONS, FALLBACK_ACTION, INVALID_NOTICE

EVAL_SIZE = 50  # BALROG's BabyAI evaluation: 10 episodes for each of the 5 families
# minigrid's action indices for the six strings (its `done` action is not offered, as in BALROG).
_MINIGRID_ACTION = {name: i for i, name in enumerate(ACTIONS)}


def episode_return(success: bool, steps: int, limit: int) -> float:
    """1 − 0.9·steps/limit on success (minigrid's reward, which BALROG sums into the return), else 0."""
    return 1.0 - 0.9 * steps / limit if success else 0.0


class BabyAITextEnv:
    """`reset(seed=, task=) -> observation`, `step(action) -> (observation, reward, done)`.

    `action` is the reply as BALROG reads it (`prompt.filter_reply`); anything but one of the six
    exact action strings executes `go forward` and the observation then starts with BALROG's notice.
    `reward` is minigrid's for that step; the return is their sum. `done` is BALROG's: the level
    terminated (success) or hit its step limit (truncated), or `max_steps` (BALROG's
    `max_steps_per_episode`, optional) steps were played; a cap does not change the reward scale,
    which stays the level's limit, as in BALROG. After each step `terminated`, `truncated`,
    `success`, `steps`, `invalid_actions`, `episode_return` and `progression` (BALROG's: 1 once a
    reward was earned) hold the outcome. `instruction` is the mission sentence.
    """

    def __init__(self, max_steps: int | None = None):
        if max_steps is not None and int(max_steps) < 1:
            raise ValueError(f"max_steps={max_steps} must be >= 1")
        self.max_steps = None if max_steps is None else int(max_steps)
        self._level: TextLevel | None = None

    @staticmethod
    def actions() -> list[str]:
        return list(ACTIONS)

    def reset(self, seed: int, task: str) -> str:
        if task not in TASKS:
            raise ValueError(f"unknown BabyAI task {task!r}; expected one of {', '.join(TASKS)}")
        self._level = TextLevel(task)
        with contextlib.redirect_stdout(io.StringIO()):  # minigrid prints each rejected layout
            self._level.reset(seed=int(seed))
        if self._level.max_steps != STEP_LIMITS[task]:
            raise RuntimeError(f"minigrid's step limit {self._level.max_steps} != documented {STEP_LIMITS[task]}")
        self.level_limit = self._level.max_steps
        self.limit = self.level_limit if self.max_steps is None else min(self.level_limit, self.max_steps)
        self.task, self.seed = task, int(seed)
        self.instruction = self._level.mission
        self.steps = self.invalid_actions = 0
        self.success = self.done = self.terminated = self.truncated = False
        self.episode_return = self.progression = 0.0
        return self.observation()

    def observation(self) -> str:
        lv = self._level
        return "\n".join(describe_view(lv.gen_obs()["image"], lv.carrying))

    def step(self, action: str | None) -> tuple[str, float, bool]:
        if self._level is None or self.done:
            raise RuntimeError("step() before reset() or after the episode ended")
        valid = action in _MINIGRID_ACTION
        if not valid:
            self.invalid_actions += 1
        _, reward, terminated, truncated, _ = self._level.step(_MINIGRID_ACTION[action if valid else FALLBACK_ACTION])
        self.steps += 1
        reward = float(reward)
        self.episode_return += reward
        if reward > 0:
            self.progression = 1.0
        self.terminated, self.truncated = bool(terminated), bool(truncated)
        self.success = self.terminated and reward > 0
        self.done = self.terminated or self.truncated or self.steps >= self.limit
        text = self.observation()
        return (text if valid else INVALID_NOTICE + text), reward, self.done


def item_seed(seed: int, index: int) -> int:
    return random.Random(f"babyai:{seed}:{index}").randrange(2**31)


def make_eval_items(n: int, seed: int) -> list[dict]:
    """`n` episodes `{id, task, seed}`: tasks round-robin in `TASKS` order (10 each for n=50),
    level seeds derived from (`seed`, index) so item i is the same whatever `n` is."""
    if int(n) < 1:
        raise ValueError(f"n={n} must be >= 1")
    items = []
    for i in range(int(n)):
        task = TASKS[i % len(TASKS)]
        s = item_seed(int(seed), i)
        items.append({"id": f"babyai_{i:04d}_{task}", "task": task, "seed": s})
    return items
