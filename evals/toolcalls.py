"""Parse tool calls out of generated text, never crashing on a botched call.

`parse_tool_calls(text, style) -> (calls, errors)`; each call is `{"name": str, "arguments": dict}`
and each error a message the harness sends back to the model as the tool response, so a malformed
call costs the model a turn instead of crashing the run.

Styles:
    qwen3   Qwen3 / Hermes: `<tool_call>{"name": …, "arguments": …}</tool_call>`, any number per turn,
            text allowed before/between/after; a last `<tool_call>` left open at the end of the text
            counts when its JSON is complete (as vLLM's hermes parser reads it).
    llama3  Llama-3.1 JSON calls: `{"name": …, "parameters": …}` (or "arguments"), optionally after
            `<|python_tag|>`, ended by `<|eot_id|>`, `<|eom_id|>` or nothing, several per turn
            (separated by `;` or newlines). Nested braces, braces inside strings and Llama's special
            tokens inside strings are handled by decoding with the JSON parser itself.

Never stricter than the serving stack: every completion vLLM's `hermes` (Qwen3) or `llama3_json`
(Llama-3.1) parser turns into tool calls parses to the same calls here (tests/data/
vllm_toolcall_cases.json, each case citing the vLLM file and commit it comes from). Deliberately
more lenient where vLLM gives up on the whole completion: a malformed call beside valid ones keeps
the valid ones (plus an error for the bad one), a call without arguments gets `{}`, and for
llama3 a stray `{` or a non-call JSON object elsewhere in the text does not void the calls.
Never raises: a call nested deeper than MAX_NESTING levels is an error for that call.
"""
from __future__ import annotations

import json
import re

from common.io import lone_surrogate

STYLES = ("qwen3", "llama3")

_QWEN_BLOCK = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)
_LLAMA_MARKERS = ("<|python_tag|>", "<|eot_id|>", "<|eom_id|>")
_DECODER = json.JSONDecoder()
MAX_NESTING = 100  # JSON arrays/objects deeper than this are an error, not a RecursionError


def _depth_exceeds(text: str, start: int = 0, limit: int = MAX_NESTING) -> bool:
    """Whether the JSON value at `start` nests arrays/objects deeper than `limit` (strings skipped).
    Scans until that value closes, so trailing text costs nothing."""
    depth, i, n = 0, start, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif c in "[{":
            depth += 1
            if depth > limit:
                return True
        elif c in "]}":
            depth -= 1
            if depth <= 0:
                return False
        i += 1
    return False


def _loads(text: str):
    """json.loads with bounded nesting: ValueError (never RecursionError) past MAX_NESTING."""
    if _depth_exceeds(text, len(text) - len(text.lstrip())):
        raise ValueError(f"JSON nested deeper than {MAX_NESTING} levels")
    return json.loads(text)


def _raw_decode(text: str, i: int):
    if _depth_exceeds(text, i):
        raise ValueError(f"JSON nested deeper than {MAX_NESTING} levels")
    return _DECODER.raw_decode(text, i)


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
            args = _loads(args)
        except ValueError:
            return None, f"arguments of tool call {name!r} are a string that is not JSON: {args[:200]!r}"
    if not isinstance(args, dict):
        return None, f"arguments of tool call {name!r} must be a JSON object, got {type(args).__name__}"
    if (why := lone_surrogate([name, args])) is not None:   # `"\ud800"` alone: no tokenizer or UTF-8 row takes it
        return None, f"tool call {name[:80]!r} rejected: {why}"   # repr: the surrogate escaped
    return {"name": name, "arguments": args}, None


def _parse_qwen3(text: str) -> tuple[list[dict], list[str]]:
    calls, errors = [], []
    for m in _QWEN_BLOCK.finditer(text):
        body, closing = m.group(1).strip(), m.group(2)
        try:
            obj = _loads(body)
        except json.JSONDecodeError as exc:
            where = "in <tool_call>" if closing else "in an unclosed <tool_call> (no </tool_call>)"
            errors.append(f"invalid JSON {where}: {exc.msg} at char {exc.pos}: {body[:200]!r}")
            continue
        except ValueError as exc:
            errors.append(f"tool call rejected: {exc}: {body[:200]!r}")
            continue
        call, err = _as_call(obj, body, ("arguments", "parameters"))
        if call:
            calls.append(call)
        else:
            errors.append(err)
    return calls, errors


def _looks_like_call(text: str, i: int) -> bool:
    return re.match(r'\{\s*"name"\s*:', text[i:i + 64]) is not None


def _next_break(text: str, i: int) -> int:
    """Where a broken call ends for error recovery: the next newline or Llama marker."""
    found = [j for j in (text.find(m, i) for m in ("\n", *_LLAMA_MARKERS)) if j >= 0]
    return min(found) if found else len(text)


def _parse_llama3(text: str) -> tuple[list[dict], list[str]]:
    # The markers are not stripped: they can only end a call outside a JSON string, and inside
    # one (`"query": "what is <|eot_id|>"`) they are part of the argument.
    calls, errors = [], []
    i = 0
    while True:
        i = text.find("{", i)
        if i < 0:
            break
        try:
            obj, end = _raw_decode(text, i)
        except ValueError as exc:  # JSONDecodeError, or nested too deeply
            if _looks_like_call(text, i) or not isinstance(exc, json.JSONDecodeError):
                # Skip the rest of this call so its inner objects aren't misread as calls.
                stop = _next_break(text, i)
                errors.append(f"invalid JSON tool call: {getattr(exc, 'msg', exc)}: {text[i:stop][:200]!r}")
                i = stop
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
            obj, end = _raw_decode(text, j)
        except ValueError:
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


# Tokens that end a generated turn: generation stops at them (evals.backends) and they are never
# part of a message's text (the chat template writes its own).
END_OF_TURN_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>")


def strip_end_of_turn(text: str) -> str:
    """`text` without the end-of-turn tokens (and the whitespace before them) it ends with."""
    while True:
        trimmed = text.rstrip()
        marker = next((t for t in END_OF_TURN_TOKENS if trimmed.endswith(t)), None)
        if marker is None:
            return text
        text = trimmed[: -len(marker)]


def opens_think(tokenizer, template_kwargs: dict | None = None) -> bool:
    """Whether the chat template's generation prompt opens a think block (Qwen3-Thinking-2507's): then
    `split_turn` reads a turn as reasoning until `</think>`."""
    try:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": "?"}], add_generation_prompt=True, tokenize=False,
                                               **(template_kwargs or {}))
    except Exception:   # no usable template: the episode's own render says why
        return False
    return prompt.rstrip().endswith("<think>")


def split_turn(text: str, opens_think: bool = False) -> tuple[str, str]:
    """(reasoning_content, content) of a generated assistant turn: end-of-turn tokens dropped, split at
    the last `</think>` the way the Qwen3 templates do; with `opens_think` (the generation prompt opened
    `<think>`, opens_think) a turn that never writes `</think>` is all reasoning."""
    from evals.extract import split_reasoning

    text = strip_end_of_turn(text)
    return (text.strip(), "") if opens_think and "</think>" not in text else split_reasoning(text)


def generation_message(text: str, style: str, turn: int | None = None,
                       opens_think: bool = False) -> tuple[dict, list[dict], list[str]]:
    """The one rule, for evaluation and GRPO alike, that turns a generated assistant turn (decoded
    with special tokens) into a chat message; returns (message, the calls it asks for, parse errors).

    The text is split by `split_turn` into `reasoning_content` (always set, "" without a think block)
    and `content`, so a turn inside the think block its prompt opened has no content and makes no call;
    calls are parsed from `content`. The calls are stored structurally (`tool_calls`, the markup removed from
    `content`; ids `call_<turn>_<k>` when `turn` is given) only when the turn parsed cleanly and the
    template can render them — Llama-3.1's renders one call per message —; otherwise `content` keeps
    the raw text, so the model always sees what it wrote, and `tool_call_errors` says why."""
    reasoning, content = split_turn(text, opens_think)
    calls, errors = parse_tool_calls(content, style)
    msg: dict = {"role": "assistant", "reasoning_content": reasoning}
    if calls and not errors and (style != "llama3" or len(calls) == 1):
        msg["content"] = strip_tool_calls(content, style)
        msg["tool_calls"] = [{"type": "function", **({"id": f"call_{turn}_{k}"} if turn is not None else {}),
                              "function": {"name": c["name"], "arguments": c["arguments"]}} for k, c in enumerate(calls)]
        return msg, calls, errors
    msg["content"] = content
    if errors:
        msg["tool_call_errors"] = list(errors)
    elif len(calls) > 1:
        msg["tool_call_errors"] = [f"{len(calls)} tool calls in one turn kept as text: the {style} chat template "
                                   "renders one call per assistant message"]
    return msg, calls, errors
