"""Answer extraction: a fixed cascade whose firing rule is reported for every example (and
`split_reasoning`, the `</think>` split of a generated turn, which rl uses too).

    final_answer         `Final answer:` (last occurrence, case-insensitive; markdown emphasis around
                         the label and a full-width colon too) up to the end of its line (of the
                         next non-blank line when nothing follows the label on its own), or to call
                         or answer markup on it (`<tool_call>`, a Llama call, `</answer>`); a
                         `\\boxed{…}` in it is unwrapped, `*` around it dropped
    answer_tag           the last closed `<answer>…</answer>`
    answer_tag_unclosed  the last `<answer>` with no closing tag, up to the end of the text
    boxed                the last `\\boxed{…}` (balanced braces; a `\\text{…}` filling it unwrapped)
    none                 nothing matched (counted as a format failure)

Reasoning never holds the answer: a `<think>…</think>` block, or an unclosed `<think>` to the end of
the text (a turn cut off while thinking), is not searched.

`strict_em` only trusts the first rule, so a model that learned the `Final answer:` terminator is
separated from one that merely produced an answer somewhere.
"""
from __future__ import annotations

import re

RULES = ("final_answer", "answer_tag", "answer_tag_unclosed", "boxed", "none")
STRICT_RULE = "final_answer"

_FINAL = re.compile(r"final answer\**\s*[:\uff1a][\s*]*([^\n]*)", re.IGNORECASE)
# where a `Final answer:` stops before the end of its line: answer or call markup, a special token, a Llama call
_MARKUP = re.compile(r"</?(?:answer|tool_call)>|<\|[a-z_]+\|>|\{\s*\"name\"\s*:")
_THINK = re.compile(r"<think>.*?(?:</think>|$)", re.DOTALL)
_LATEX_TEXT = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf)\{([^{}]*)\}")
_ANSWER_CLOSED = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def _final_answer(text: str) -> str | None:
    matches = list(_FINAL.finditer(text))
    if not matches:
        return None
    answer = _MARKUP.split(matches[-1].group(1), maxsplit=1)[0].strip().strip("* \t")
    return (_boxed(answer) if "\\boxed{" in answer else None) or answer or None


def _answer_tag(text: str) -> str | None:
    matches = _ANSWER_CLOSED.findall(text)
    if not matches:
        return None
    return matches[-1].strip() or None


def _answer_tag_unclosed(text: str) -> str | None:
    start = text.rfind("<answer>")
    if start < 0 or "</answer>" in text[start:]:
        return None
    return text[start + len("<answer>"):].strip() or None


def _boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i = start + len("\\boxed{")
    depth, j = 1, i
    while j < len(text):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                inner = text[i:j].strip()
                wrapped = _LATEX_TEXT.fullmatch(inner)   # \text{Paris}: the words, not the markup
                return (wrapped.group(1).strip() if wrapped else inner) or None
        j += 1
    return None  # unbalanced: not a complete \boxed{}


_CASCADE = (
    ("final_answer", _final_answer),
    ("answer_tag", _answer_tag),
    ("answer_tag_unclosed", _answer_tag_unclosed),
    ("boxed", _boxed),
)


def extract_answer(text: str | None) -> tuple[str | None, str]:
    """(answer or None, name of the rule that fired) for the final assistant turn's content."""
    text = _THINK.sub("", text or "")
    if not text:
        return None, "none"
    for name, rule in _CASCADE:
        answer = rule(text)
        if answer is not None:
            return answer, name
    return None, "none"


def strict_answer(answer: str | None, rule: str) -> str | None:
    """The prediction `strict_em` scores: only a `Final answer:` counts."""
    return answer if rule == STRICT_RULE else None


def split_reasoning(text: str) -> tuple[str, str]:
    """(reasoning_content, content) as the Qwen3 templates split an assistant message."""
    if "</think>" not in text:
        return "", text.strip()
    reasoning = text.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
    return reasoning.strip(), text.split("</think>")[-1].lstrip("\n").strip()
