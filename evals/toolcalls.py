"""Parse tool calls out of generated text, never crashing on a botched call.

`parse_tool_calls(text, style) -> (calls, errors)`; each call is `{"name": str, "arguments": dict}`
and each error a message the harness sends back to the model as the tool response, so a malformed
call costs the model a turn instead of crashing the run.

Styles:
    qwen3   Qwen3 / Hermes: `<tool_call>{"name": …, "arguments": …}</tool_call>`, any number per turn,
            text allowed before/between/after.
    llama3  Llama-3.1 JSON calls: `{"name": …, "parameters": …}` (or "arguments"), optionally after
            `<|python_tag|>`, ended by `<|eot_id|>`, `<|eom_id|>` or nothing, several per turn
            (separated by `;` or newlines). Nested braces and braces inside strings are handled by
            decoding with the JSON parser itself rather than by counting braces.
"""
from __future__ import annotations

import json
import re

STYLES = ("qwen3", "llama3")

_QWEN_BLOCK = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)
_LLAMA_MARKERS = ("<|python_tag|>", "<|eot_id|>", "<|eom_id|>")
_DECODER = json.JSONDecoder()


def _as_call(obj, raw: str, args_keys: tuple[str, ...]) -> tuple[dict | None, str | None]:
    """Validate a decoded object as a call; (call, None) or (None, error message)."""
    if not isinstance(obj, dict):
        return None, f"tool call is not a JSON object: {raw[:200]!r}"
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None, f"tool call has no \"name\" string: {raw[:200]!r}"
    args = None
    for key in args_keys:
        if key in obj:
            args = obj[key]
            break
    if args is None:
        args = {}
    if isinstance(args, str):  # some models emit the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None, f"arguments of tool call {name!r} are a string that is not JSON: {args[:200]!r}"
    if not isinstance(args, dict):
        return None, f"arguments of tool call {name!r} must be a JSON object, got {type(args).__name__}"
    return {"name": name, "arguments": args}, None


def _parse_qwen3(text: str) -> tuple[list[dict], list[str]]:
    calls, errors = [], []
    for m in _QWEN_BLOCK.finditer(text):
        body, closing = m.group(1).strip(), m.group(2)
        if not closing:
            errors.append(f"unclosed <tool_call> (no </tool_call>): {body[:200]!r}")
            continue
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as exc:
            errors.append(f"invalid JSON in <tool_call>: {exc.msg} at char {exc.pos}: {body[:200]!r}")
            continue
        call, err = _as_call(obj, body, ("arguments", "parameters"))
        if call:
            calls.append(call)
        else:
            errors.append(err)
    return calls, errors


def _looks_like_call(text: str, i: int) -> bool:
    return re.match(r'\{\s*"name"\s*:', text[i:i + 64]) is not None


def _parse_llama3(text: str) -> tuple[list[dict], list[str]]:
    for marker in _LLAMA_MARKERS:
        text = text.replace(marker, "\n")
    calls, errors = [], []
    i = 0
    while True:
        i = text.find("{", i)
        if i < 0:
            break
        try:
            obj, end = _DECODER.raw_decode(text, i)
        except json.JSONDecodeError as exc:
            if _looks_like_call(text, i):
                # Skip the rest of this line so the broken call's inner objects aren't misread.
                nl = text.find("\n", i)
                errors.append(f"invalid JSON tool call: {exc.msg}: {text[i:(nl if nl > 0 else None)][:200]!r}")
                i = nl if nl > 0 else len(text)
            else:
                i += 1
            continue
        if isinstance(obj, dict) and ("name" in obj and ("parameters" in obj or "arguments" in obj)):
            call, err = _as_call(obj, text[i:end], ("parameters", "arguments"))
            if call:
                calls.append(call)
            else:
                errors.append(err)
        i = end
    return calls, errors


def parse_tool_calls(text: str, style: str) -> tuple[list[dict], list[str]]:
    if style == "qwen3":
        return _parse_qwen3(text)
    if style == "llama3":
        return _parse_llama3(text)
    raise ValueError(f"unknown tool-call style {style!r}; expected one of {STYLES}")


def strip_tool_calls(text: str, style: str) -> str:
    """The text with the call markup removed (what goes into the assistant turn's `content`
    when the calls are stored structurally and re-rendered by the chat template)."""
    if style == "qwen3":
        return _QWEN_BLOCK.sub("", text).strip()
    for marker in _LLAMA_MARKERS:
        text = text.replace(marker, "")
    out, i = [], 0
    while True:
        j = text.find("{", i)
        if j < 0:
            out.append(text[i:])
            break
        try:
            obj, end = _DECODER.raw_decode(text, j)
        except json.JSONDecodeError:
            out.append(text[i:j + 1])
            i = j + 1
            continue
        out.append(text[i:j])
        if not (isinstance(obj, dict) and "name" in obj):
            out.append(text[j:end])
        i = end
    return "".join(out).strip().strip(";").strip()


def detect_style(chat_template: str | None) -> str:
    """`llama3` for Llama-3.x templates, else `qwen3` (Hermes-style `<tool_call>` blocks)."""
    if chat_template and "<|start_header_id|>" in chat_template and "<tool_call>" not in chat_template:
        return "llama3"
    return "qwen3"
