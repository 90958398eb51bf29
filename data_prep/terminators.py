"""How trajectories end: `Final answer: X` for search, finish call (+ epilogue) for code.

The dual-terminator epilogue puts `\\nFinal answer: <headline>` after the finish call's
`</tool_call>` in the same assistant turn, so a literal-EM evaluator can always extract an answer
from a code-trained model. The headline is the issue/PR title.
"""
from __future__ import annotations

import re

FINAL_ANSWER_PREFIX = "Final answer: "
FINISH_TOOLS = ("finish", "submit")
HEADLINE_MAX_CHARS = 200

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_TITLE_RE = re.compile(r"\*\*Title:\*\*[ \t]*(.+)")
_TASK_TAG_RE = re.compile(r"<(github_issue|pr_description)>\s*(.*?)\s*</\1>", re.DOTALL)


def final_answer(answer: str) -> str:
    """The search terminator line."""
    return FINAL_ANSWER_PREFIX + collapse_ws(answer)


def extract_answer_tag(text: str) -> tuple[str, str | None]:
    """Split `text` at its LAST `<answer>X</answer>` -> (text before it, X), or (text, None).

    The last match is the answer (Search-R1's prompt itself contains an `<answer>` example).
    """
    matches = list(_ANSWER_RE.finditer(text))
    if not matches:
        return text, None
    m = matches[-1]
    return text[: m.start()], m.group(1).strip()


def collapse_ws(text: str) -> str:
    return " ".join(text.split())


def extract_task(first_user: str) -> str | None:
    """The problem statement inside `<github_issue>` / `<pr_description>`, or None."""
    m = _TASK_TAG_RE.search(first_user)
    return m.group(2) if m else None


def headline(task: str, max_chars: int = HEADLINE_MAX_CHARS) -> str:
    """The issue/PR title: the `**Title:**` line, else the first non-empty line (minus `[ISSUE]`
    and markdown heading marks), whitespace-collapsed, at most `max_chars` cut at a word boundary."""
    m = _TITLE_RE.search(task)
    if m:
        line = m.group(1)
    else:
        line = ""
        for raw in task.splitlines():
            cand = raw.strip()
            if cand and cand not in ("[ISSUE]", "[/ISSUE]"):
                line = cand.lstrip("#").strip()
                break
    line = collapse_ws(line)
    if len(line) <= max_chars:
        return line
    cut = line[: max_chars + 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > 0 else line[:max_chars]).rstrip()


def epilogue_text(task: str) -> str:
    """The text appended after the finish call's `</tool_call>` (before the end-of-turn token)."""
    head = headline(task)
    return "\n" + FINAL_ANSWER_PREFIX + head if head else ""


def ends_with_finish(messages: list[dict]) -> bool:
    last = messages[-1] if messages else {}
    calls = last.get("tool_calls") or []
    return last.get("role") == "assistant" and any(
        (c.get("function") or {}).get("name") in FINISH_TOOLS for c in calls
    )
