"""Shared finishing step of the code-trajectory readers (R2E-Gym, SWE-Gym, SWE-smith)."""
from __future__ import annotations

from data_prep.readers.common import (
    convert_xml_messages, message_list, merge_tools, require_declared, tools_from_system_prompt, trim_after_finish,
    type_xml_arguments,
)
from data_prep.schema import RecordError, make_record, strip_none, validate_tools
from data_prep.terminators import extract_task, finish_problem


def split_system_tools(messages: list[dict]) -> tuple[list[dict], list[dict]]:
    """Move a text function list out of the system prompt into JSON-schema specs."""
    if messages and messages[0]["role"] == "system":
        prompt, specs = tools_from_system_prompt(messages[0]["content"])
        return [{"role": "system", "content": prompt}, *messages[1:]], specs
    return messages, []


def xml_messages(raw: list, *, reasoning: str, crlf: bool = False) -> tuple[list[dict], list[dict]]:
    """Text-form (`<function=...>`) conversation -> (canonical messages, tool specs from the
    system prompt), call parameters typed by those specs."""
    msgs, specs = split_system_tools(convert_xml_messages(raw, reasoning=reasoning, crlf=crlf))
    return type_xml_arguments(msgs, specs), specs


def code_record(rid: str, source: str, messages: list[dict], tools: list[dict]) -> dict:
    """Canonical code record; the trajectory must end with a finish/submit call. Specs are inferred for called tools
    `tools` lack (a text-form prompt's list, or none given)."""
    messages = trim_after_finish(messages)
    if not any(m["role"] == "assistant" for m in messages):
        raise RecordError("no_assistant_turn")
    if unfinished := finish_problem(messages):
        raise RecordError("no_finish_call", unfinished)
    first_user = next((m["content"] for m in messages if m["role"] == "user"), None)
    if first_user is None:
        raise RecordError("no_user_turn")
    task = extract_task(first_user) or first_user
    return make_record(
        id=rid, source=source, domain="code", messages=messages, tools=merge_tools(tools, messages),
        task=task, answer=None, terminator="finish",
    )


def native_record(rid: str, source: str, messages: list[dict], row: dict) -> dict:
    """`code_record` of a native-`tool_calls` row. Its `tools` column, when it has one, is the list the model was given
    (OpenHands passes exactly these to the LLM and refuses a call to any other name: FunctionCallNotExistsError; the
    real SWE-Gym row declares every tool it calls): a call to a tool it lacks is refused, never given an inferred spec.
    A row without one (SWE-smith's `tool` split ships no schemas) gets specs inferred from its calls."""
    if tools := strip_none(row.get("tools") or []):
        validate_tools(tools)
        require_declared(trim_after_finish(messages), tools, "the row's tools column lacks")
    return code_record(rid, source, messages, tools)


def row_messages(row: dict) -> list:
    """The `messages` column; SWE-smith's `tool` split stores it as a JSON string."""
    return message_list(row, "messages")


def is_native(msgs: list) -> bool:
    return any(isinstance(m, dict) and (m.get("tool_calls") or m.get("role") == "tool") for m in msgs)
