"""How trajectories end: `Final answer: X` for search, finish call (+ epilogue) for code.

The dual-terminator epilogue puts `\\nFinal answer: <headline>` after the finish call's
`</tool_call>` in the same assistant turn, so a literal-EM evaluator can always extract an answer
from a code-trained model. The headline is the issue/PR title.
"""
from __future__ import annotations

import re

import regex

FINAL_ANSWER_PREFIX = "Final answer: "
FINISH_TOOLS = ("finish", "submit")
HEADLINE_MAX_CHARS = 200

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_GRAPHEME_RE = regex.compile(r"\X")  # one extended grapheme cluster (Unicode UAX #29)
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


# Headings of common GitHub issue templates (GitHub's default bug/feature forms, pandas, numpy,
# matplotlib, xarray, scikit-learn, pydantic, MONAI, ...): never a headline. Compared after
# lower-casing and stripping markdown marks and a trailing colon.
TEMPLATE_HEADINGS = frozenset("""
describe the bug|bug description|describe the issue|issue description|problem description|description|
bug report|bug|bug summary|summary|problem|issue|details|context|motivation|proposal|feature request|
to reproduce|steps to reproduce|steps to reproduce the behavior|reproduction|reproducible example|
minimal reproducible example|minimal complete verifiable example|mvce confirmation|code for reproduction|
code sample|code sample, a copy-pastable example if possible|code example|example|
expected behavior|expected behaviour|expected results|expected result|expected output|expected outcome|
actual behavior|actual behaviour|actual results|actual outcome|current behavior|what happened?|what happened|
what did you expect to happen?|anything else we need to know?|relevant log output|error message|traceback|
environment|versions|version information|installed versions|system info|additional context|additional information|
is your feature request related to a problem? please describe.|describe the solution you'd like|
describe alternatives you've considered|checklist|pandas version checks|title
""".replace("\n", "").split("|"))
TITLE_LOOKAHEAD = 3  # a `**Title:**` line counts only among the first few candidate lines

_COMMENT_RE = re.compile(r"<!--.*?(?:-->|\Z)", re.DOTALL)
_FENCE_RE = re.compile(r"^\s*(```|~~~)")
_CHECKBOX_RE = re.compile(r"^\s*[-*+]\s*\[[ xX]\]")
_LABEL_RE = re.compile(r"^\*\*([^*]+?)\*\*:?\s*(.*)$")


def _heading_key(line: str) -> str:
    return line.strip().lstrip("#").strip().strip("*_").strip().rstrip(":").strip().lower()


def _candidates(task: str):
    """(line, is_title) for each line that could be a headline, in order: HTML comments, code
    blocks, `[ISSUE]` markers, task-list checkboxes, template headings and empty labels skipped;
    markdown heading marks and a template label's `**Label:**` prefix removed."""
    in_fence = False
    for raw in _COMMENT_RE.sub("", task).splitlines():
        if _FENCE_RE.match(raw):
            in_fence = not in_fence
            continue
        line = raw.strip()
        if in_fence or not line or line in ("[ISSUE]", "[/ISSUE]") or _CHECKBOX_RE.match(line):
            continue
        if not line.strip("-=*_#~ "):
            continue  # a rule or a bare heading mark
        is_title = False
        m = _LABEL_RE.match(line)
        if m and _heading_key(m.group(1)) in TEMPLATE_HEADINGS:
            is_title = _heading_key(m.group(1)) == "title"
            line = m.group(2).strip()
            if not line:
                continue  # an empty `**Title:**` / `**Description:**`
        elif _heading_key(line) in TEMPLATE_HEADINGS:
            continue
        line = line.lstrip("#").strip()
        if line:
            yield line, is_title


def headline(task: str, max_chars: int = HEADLINE_MAX_CHARS) -> str:
    """The issue/PR title: a non-empty `**Title:**` among the first few candidate lines, else the
    first candidate line (see `_candidates`: no comments, code, checkboxes or template headings),
    whitespace-collapsed, at most `max_chars` cut at a word boundary. A first word longer than
    `max_chars` (a URL, a path) is cut inside it, after its last whole grapheme within `max_chars`:
    a letter keeps its combining marks, an emoji its modifiers, or both are left out."""
    cands = list(_candidates(task))
    line = next((c for c, is_title in cands[:TITLE_LOOKAHEAD] if is_title), cands[0][0] if cands else "")
    line = collapse_ws(line)
    if len(line) <= max_chars:
        return line
    fit = 0  # the end of the last whole grapheme within max_chars
    for m in _GRAPHEME_RE.finditer(line, 0, max_chars + 1):
        if m.end() > max_chars:
            break
        fit = m.end()
    space = line.rfind(" ", 0, fit + 1)  # a space starting the grapheme after `fit` ends a word there
    return (line[:space] if space > 0 else line[:fit]).rstrip()


def epilogue_text(task: str) -> str:
    """The text appended after the finish call's `</tool_call>` (before the end-of-turn token)."""
    head = headline(task)
    return "\n" + FINAL_ANSWER_PREFIX + head if head else ""


def finish_problem(messages: list[dict]) -> str | None:
    """Why `messages` does not end with a finish/submit call (the last call of the last message,
    an assistant turn), or None when it does."""
    last = messages[-1] if messages else {}
    if last.get("role") != "assistant":
        return f"the conversation ends with a {last.get('role')} turn, not a finish/submit call"
    calls = last.get("tool_calls") or []
    name = (calls[-1].get("function") or {}).get("name") if calls else None
    if name in FINISH_TOOLS:
        return None
    return f"the last assistant turn ends with a call to {name!r}, not finish/submit" if calls else \
        "the last assistant turn has no finish/submit call"
