"""The hybrid Qwen3 thinking switch: `enable_thinking`, a chat-template variable.

Qwen/Qwen3-4B (the April 2025 hybrid) reads `enable_thinking` in its chat template: false appends an
empty `<think>\n\n</think>\n\n` to the generation prompt (the model answers without reasoning); true,
or not passing it, leaves the prompt open for a think block. GRPO (`grpo.enable_thinking`) and
evaluate (`enable_thinking`) take the same three values:

- `auto`: not passed (the template's own default; what every run did before the key existed);
- `true` / `false`: passed to every render of the chat template, and part of the run / evaluation
  identity.

A template that does not read the variable (Qwen3-4B-Thinking-2507's, which always opens `<think>`;
Llama-3.1's) would ignore true/false silently, so that pairing is refused (`problem`) instead of being
recorded as a difference that changes nothing.
"""
from __future__ import annotations

VARIABLE = "enable_thinking"
CHOICES = ("auto", True, False)


def value_problem(value, key: str) -> str | None:
    """Why `value` is not auto, true or false (None when it is one)."""
    if value in CHOICES and (isinstance(value, bool) or value == "auto"):
        return None
    return f"{key}={value!r}: expected auto, true or false"


def template_kwargs(value) -> dict | None:
    """The chat-template arguments of `value`: None for auto (nothing passed), else {enable_thinking: v}."""
    return None if value == "auto" else {VARIABLE: bool(value)}


def template_problem(value, template, key: str, where: str) -> str | None:
    """Why `value` cannot apply to `template` (the chat template text of `where`): true/false on a
    template that never reads `enable_thinking`. None when it applies (or value is auto)."""
    if value == "auto":
        return None
    text = template.get("default", "") if isinstance(template, dict) else str(template or "")
    if VARIABLE in text:
        return None
    return (f"{key}={str(value).lower()}: the chat template of {where} does not read {VARIABLE} (only the hybrid "
            f"Qwen3 templates, e.g. Qwen/Qwen3-4B, do), so it would change nothing; use {key}=auto")
