"""BALROG's prompt and reply rule for BabyAI (its `naive` agent), as data plus our own builder.

The strings (instruction prompt, headers, closing instruction, invalid-action notice, the action
space, BALROG's decoding defaults) are protocol data in `balrog_protocol.json`, written by
tools/balrog_reference/make_reference.py from BALROG's own code and episodes (balrog-ai/BALROG at
af7d1f17, see its "source" field), not retyped here. The messages of one step (BALROG's
`HistoryPromptBuilder.get_prompt` plus the naive agent's closing sentence):

    user       the instruction prompt: the game, the mission, the six actions with their
               descriptions, the tips, "PLAY!"
    user       "Observation:\\n<text>"         past observations, oldest first; the agent's past
    assistant  "<filtered reply>"              replies between them (an empty one adds nothing)
    ...
    user       "Current Observation:\\n<text>\\n\\n<closing instruction>"

The history keeps the last 2 x 16 events (observations and replies); of the observations in it
only the last 16 show their text, older ones show the bare header. A reply is read as BALROG does:
stripped (its OpenAI client), then everything but letters, whitespace and colons removed (the naive
agent); it is an action only when it then equals one of the six exactly (case-sensitive).
"""
from __future__ import annotations

import json
import re
from collections import deque
from pathlib import Path

PROTOCOL: dict = json.loads(Path(__file__).with_name("balrog_protocol.json").read_text(encoding="utf-8"))
ACTIONS: tuple[str, ...] = tuple(PROTOCOL["action_space"])
FALLBACK_ACTION: str = PROTOCOL["default_action"]
INVALID_NOTICE: str = PROTOCOL["invalid_notice"]
HISTORY: int = int(PROTOCOL["max_text_history"])
_NOT_KEPT = re.compile(r"[^a-zA-Z\s:]")


def instruction_prompt(mission: str) -> str:
    return PROTOCOL["instruction_before_mission"] + mission + PROTOCOL["instruction_after_mission"]


def filter_reply(content: str | None) -> str:
    """BALROG's reading of a reply's content: stripped, then only letters, whitespace and colons."""
    return _NOT_KEPT.sub("", (content or "").strip())


class History:
    """The conversation BALROG's naive agent sends, one step at a time:
    `add_reply(previous filtered reply)` (skipped when empty), `add_observation(text)`, `messages()`."""

    def __init__(self, mission: str, max_text_history: int = HISTORY):
        self.instruction = instruction_prompt(mission)
        self.max_text_history = int(max_text_history)
        self._events: deque[tuple[str, str]] = deque(maxlen=2 * self.max_text_history)

    def add_reply(self, filtered: str) -> None:
        if filtered:
            self._events.append(("assistant", filtered))

    def add_observation(self, text: str) -> None:
        self._events.append(("observation", text))

    def messages(self) -> list[dict]:
        obs_idx = [i for i, (kind, _) in enumerate(self._events) if kind == "observation"]
        shown = set(obs_idx[-self.max_text_history:]) if self.max_text_history > 0 else set()
        out = [{"role": PROTOCOL["instruction_role"], "content": self.instruction}]
        last = len(self._events) - 1
        for i, (kind, text) in enumerate(self._events):
            if kind == "assistant":
                out.append({"role": "assistant", "content": text})
                continue
            header = PROTOCOL["current_header"] if i == last else PROTOCOL["past_header"]
            out.append({"role": "user", "content": header + ("\n" + text if i in shown else "")})
        if out[-1]["role"] == "user":
            out[-1]["content"] += PROTOCOL["closing_separator"] + PROTOCOL["closing_instruction"]
        return out
