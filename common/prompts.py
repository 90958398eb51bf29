"""Prompt variants, shared by evaluation and RL training (rl starts its episodes from the same
prompts). The tools themselves reach the model through its chat template (`tools=`), so a prompt
here is only the system message + the first user message.

    tool_agent    (default) a tool-using assistant; says nothing about the answer format, so the
                  answer terminator a model uses is whatever its training taught it.
    anchor_nudge  the same plus an explicit instruction to end with `Final answer: X`: the study's
                  anchor row (the base model told the format it is scored on).

Context mode `given` (a multi-hop bench with its own paragraphs, `musique@given`) has no tools: its
system message says so, and the first user message is `given_context_message` (every paragraph of
the item in the dataset's order, then the question):

    Answer the question using the paragraphs below.

    Paragraph 1: <title>
    <text>

    Paragraph 2: ...

    Question: <question>
"""
from __future__ import annotations

PROMPTS = ("tool_agent", "anchor_nudge")

_SEARCH_SYSTEM = (
    "You are a helpful assistant that answers questions. You can call the search tool to look up "
    "documents, as many times as you need. Answer with a short phrase."
)
_GIVEN_SYSTEM = (
    "You are a helpful assistant that answers questions from the paragraphs you are given. "
    "Answer with a short phrase."
)
_TASK_SYSTEM = "You are a helpful assistant that completes the user's task with the tools provided."
_NUDGE = (
    "\n\nWhen you are done, end your reply with one line of the form\n"
    "Final answer: <your short answer>"
)


def system_prompt(variant: str, task: str = "search") -> str:
    if variant not in PROMPTS:
        raise ValueError(f"unknown prompt {variant!r}; expected one of {PROMPTS}")
    base = {"search": _SEARCH_SYSTEM, "given": _GIVEN_SYSTEM}.get(task, _TASK_SYSTEM)
    return base + (_NUDGE if variant == "anchor_nudge" else "")


def initial_messages(variant: str, user_content: str, task: str = "search") -> list[dict]:
    return [
        {"role": "system", "content": system_prompt(variant, task)},
        {"role": "user", "content": user_content},
    ]


def given_context_message(question: str, paragraphs) -> str:
    """The first user message of context mode `given` (`paragraphs`: objects with `title`, `text`)."""
    blocks = [f"Paragraph {i}: {p.title}\n{p.text}" for i, p in enumerate(paragraphs, 1)]
    return "Answer the question using the paragraphs below.\n\n" + "\n\n".join(blocks) + f"\n\nQuestion: {question}"
