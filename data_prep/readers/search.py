"""Shared pieces of the search-trajectory readers: the canonical search tool and system prompt, the gold rule."""
from __future__ import annotations

import json
import math
import re

from data_prep.readers.common import thought_message
from common.tools import SEARCH_TOOL  # noqa: F401  (the readers take it from here)
from data_prep.schema import RecordError, make_record
from data_prep.terminators import final_answer

SEARCH_SYSTEM_PROMPT = (
    "You are a search agent. Answer the user's question using the search tool to look facts up. "
    "When you know the answer, end your reply with a line `Final answer: <answer>`."
)

VISIT_TOOL = {
    "type": "function",
    "function": {
        "name": "visit",
        "description": "Visit a web page and return the parts relevant to the goal.",
        "parameters": {
            "type": "object",
            "properties": {"url": {"type": "string"}, "goal": {"type": "string"}},
            "required": ["url", "goal"],
        },
    },
}

_THINK_TAG_RE = re.compile(r"</?think>")


def clean_thought(text: str) -> str:
    return _THINK_TAG_RE.sub("", text).strip()


def final_turn(thought: str, answer: str, reasoning: str) -> dict:
    """The last assistant turn: optional thought, then `Final answer: X` (an empty X: no_final_answer)."""
    if not answer.strip():
        raise RecordError("no_final_answer", "the <answer> is empty")
    msg = thought_message(clean_thought(thought), reasoning)
    msg["content"] = (msg["content"] + "\n\n" if msg["content"] else "") + final_answer(answer)
    return msg


def gold(value, field: str) -> str | list[str]:
    """A row's gold (read from its `field`) as the record's `answer`: a non-blank string as is, a finite number as its
    text (evaluate's EM compares strings), a non-empty list of non-blank strings whole (each one a gold), but a list of
    one is that string (one gold has one form, so a record's content digest does not depend on whether its row wrote
    `["x"]` or `"x"`). Anything else refuses the row (`bad_gold`; a blank gold too: nothing matches it): the model's
    own `<answer>` never stands in for a gold, or a held-out item would be scored against its own prediction."""
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return str(value)
    if isinstance(value, list) and value and all(isinstance(v, str) and v.strip() for v in value):
        return value[0] if len(value) == 1 else list(value)
    raise RecordError("bad_gold", f"{field} {described(value)}: not a gold (a non-blank string, a number or a non-empty list of non-blank strings)")


def described(value) -> str:
    """`value` in a refusal: "missing" for None, else its type and the start of its JSON."""
    return "missing" if value is None else f"{type(value).__name__} {json.dumps(value, default=str)[:80]}"


def search_record(rid: str, source: str, question: str, answer: str | list[str] | None, turns: list[dict], tools: list[dict]) -> dict:
    messages = [{"role": "system", "content": SEARCH_SYSTEM_PROMPT}, {"role": "user", "content": question}, *turns]
    return make_record(id=rid, source=source, domain="search", messages=messages, tools=tools,
                       task=question, answer=answer, terminator="final_answer")
