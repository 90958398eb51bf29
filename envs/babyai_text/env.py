"""`BabyAITextEnv`: a seeded text game over one `TextLevel` (see the package docstring for the rules)."""
from __future__ import annotations

import contextlib
import io
import random

from envs.babyai_text.describe import describe_view
from envs.babyai_text.levels import STEP_LIMITS, TASKS, TextLevel

ACTIONS = ("turn left", "turn right", "go forward", "pick up", "drop", "toggle")
FALLBACK_ACTION = "go forward"
EVAL_SIZE = 50  # BALROG's BabyAI evaluation: 10 episodes for each of the 5 families
# minigrid's action indices for our six strings (its `done` action is not offered, as in BALROG).
_MINIGRID_ACTION = {"turn left": 0, "turn right": 1, "go forward": 2, "pick up": 3, "drop": 4, "toggle": 5}


def episode_return(success: bool, steps: int, limit: int) -> float:
    """1 − 0.9·steps/limit on success (BabyAI's reward; BALROG reports it as the return), else 0."""
    return 1.0 - 0.9 * steps / limit if success else 0.0


def invalid_feedback(action_text: str) -> str:
    return f"Your last action {action_text!r} is not a valid action; you did '{FALLBACK_ACTION}' instead."


class BabyAITextEnv:
    """`reset(seed=, task=) -> observation`, `step(action_text) -> (observation, reward, done)`.

    `max_steps` (optional) caps every episode below the level's own limit; the return then uses the
    capped limit. After `done`, `success`, `steps`, `invalid_actions` and `episode_return` hold the
    outcome. `instruction` is the task sentence (shown to the player before any observation).
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
        self.limit = STEP_LIMITS[task] if self.max_steps is None else min(STEP_LIMITS[task], self.max_steps)
        with contextlib.redirect_stdout(io.StringIO()):  # minigrid prints each rejected layout
            self._level.reset(seed=int(seed))
        if self._level.max_steps != STEP_LIMITS[task]:
            raise RuntimeError(f"minigrid's step limit {self._level.max_steps} != documented {STEP_LIMITS[task]}")
        self._level.max_steps = self.limit  # minigrid truncates and scores with the same limit
        self.task, self.seed = task, int(seed)
        self.instruction = self._level.mission
        self.steps = self.invalid_actions = 0
        self.success = self.done = False
        self.episode_return = 0.0
        return self.observation()

    def observation(self, feedback: str | None = None) -> str:
        lv = self._level
        lines = describe_view(lv.gen_obs()["image"], lv.carrying)
        return "\n".join(([feedback] if feedback else []) + lines)

    def step(self, action_text: str | None) -> tuple[str, float, bool]:
        if self._level is None or self.done:
            raise RuntimeError("step() before reset() or after the episode ended")
        action = (action_text or "").strip().lower()
        feedback = None
        if action not in _MINIGRID_ACTION:
            self.invalid_actions += 1
            feedback = invalid_feedback(action_text or "")
            action = FALLBACK_ACTION
        _, mg_reward, terminated, truncated, _ = self._level.step(_MINIGRID_ACTION[action])
        self.steps += 1
        self.success = bool(terminated and mg_reward > 0)
        self.done = bool(terminated or truncated or self.steps >= self.limit)
        reward = episode_return(self.success, self.steps, self.limit)
        self.episode_return = reward
        return self.observation(feedback), reward, self.done


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
