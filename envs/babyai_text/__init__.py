"""babyai_text: BabyAI as a text game, on stock minigrid (BALROG's protocol, our own levels).

Five task families (levels.py: goto, pickup, open, putnext, pick_up_seq_go_to), one 8x8 room each,
no distractors; success by minigrid's BabyAI verifiers. Per step the player sends one of six
action strings (`actions()`): turn left, turn right, go forward, pick up, drop, toggle. Anything
else counts as an invalid action, is executed as `go forward`, and the next observation begins
with a feedback line saying so. The observation (describe.py) is one line per visible thing
relative to the agent ("a red ball 2 steps left and 1 step forward", "a wall 3 steps forward") and
what the agent carries. Step limits (BabyAI's rule): 64 steps for goto/pickup/open, 128 for
putnext/pick_up_seq_go_to, optionally capped lower (`max_steps`). Return = 1 − 0.9·steps/limit
on success, else 0. A level is fully determined by (task, seed); `make_eval_items(n, seed)` gives
the fixed evaluation episodes (seed 0, n=50: 10 per family).
"""
from .env import ACTIONS, EVAL_SIZE, FALLBACK_ACTION, BabyAITextEnv, episode_return, invalid_feedback, make_eval_items
from .levels import STEP_LIMITS, TASKS

__all__ = ["BabyAITextEnv", "ACTIONS", "FALLBACK_ACTION", "EVAL_SIZE", "TASKS", "STEP_LIMITS", "episode_return",
           "invalid_feedback", "make_eval_items"]
