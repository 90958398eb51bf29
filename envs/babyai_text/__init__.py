"""babyai_text: BabyAI as BALROG plays it (`BabyAI-MixedTrainLocal-v0/<task>`), on stock minigrid.

Five task families (levels.py: goto, pickup, open, putnext, pick_up_seq_go_to), BALROG's levels seed
for seed with no distractors; success by minigrid's BabyAI verifiers. The observation text is
BALROG's (describe.py), the prompt and the reply rule are BALROG's naive agent (prompt.py, strings
from BALROG's code in balrog_protocol.json). Per step the player sends one of six action strings
(`ACTIONS`): turn left, turn right, go forward, pick up, drop, toggle; anything else executes
`go forward` and the next observation starts with BALROG's notice. Step limits (BabyAI's rule):
64 for goto/pickup, 128 for open (two rooms), putnext and pick_up_seq_go_to. Return = minigrid's
reward, 1 − 0.9·steps/limit on success, else 0. A level is fully determined by (task, seed);
`make_eval_items(n, seed)` gives the fixed evaluation episodes (seed 0, n=50: 10 per family).
"""
from .env import EVAL_SIZE, BabyAITextEnv, episode_return, make_eval_items
from .levels import STEP_LIMITS, TASKS
from .prompt import ACTIONS, FALLBACK_ACTION, HISTORY, INVALID_NOTICE, PROTOCOL, History, filter_reply

__all__ = ["BabyAITextEnv", "ACTIONS", "FALLBACK_ACTION", "EVAL_SIZE", "TASKS", "STEP_LIMITS", "episode_return",
           "make_eval_items", "History", "filter_reply", "INVALID_NOTICE", "HISTORY", "PROTOCOL"]
