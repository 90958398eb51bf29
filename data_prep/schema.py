"""The canonical trajectory record: the contract every reader writes.

A record is a plain dict (so it round-trips through JSON and `datasets` unchanged):

    id          str   unique within its source, stable across runs
    source      str   one of SOURCES ("r2e-gym", "swe-gym", "swe-smith", "openseeker", "search-r1", ...)
    domain      str   "code" | "search"
    messages    list  OpenAI chat form, see below
    tools       list  JSON-schema function specs, OpenAI form
                      {"type": "function", "function": {"name", "description", "parameters"}},
                      with every None-valued key stripped recursively
    task        str   the problem statement (code) or question (search)
    answer      str | list[str] | None   gold answer where known (search; a list: each one a gold), else None
    terminator  str   what ends the trajectory: "finish" (code: a finish/submit tool call)
                      or "final_answer" (search: `Final answer: X` in the last assistant turn)

Messages:
    {"role": "system",    "content": str}
    {"role": "user",      "content": str}
    {"role": "assistant", "content": str, "reasoning_content"?: str,
                          "tool_calls"?: [{"type": "function", "id"?: str,
                                           "function": {"name": str, "arguments": dict}}]}
    {"role": "tool",      "content": str, "tool_call_id": str, "name": str}

Invariants checked by `validate_record` (readers quarantine a record that fails, with the reason):
content is always a str (never None), tool arguments are dicts, roles are known, there is at least
one assistant turn and the conversation ends with one.

Dataset rows: a record is one row with the record's id, or — when its chat template rewrites
earlier turns later in the conversation — several contiguous rows with ids `<id>#row<k>`
(`trajectory_id` maps a row id back to the record's). The trainer batches by record.
"""
from __future__ import annotations

import re
from typing import Any

from data_prep.errors import DataPrepError

DOMAINS = ("code", "search")
SOURCES = ("r2e-gym", "swe-gym", "swe-smith", "openseeker", "search-r1", "search-plan-act", "synthetic")
TERMINATORS = ("finish", "final_answer")
ROLES = ("system", "user", "assistant", "tool")
FIELDS = ("id", "source", "domain", "messages", "tools", "task", "answer", "terminator")


class RecordError(DataPrepError):
    """A record that can't become canonical. `reason` is a short stable slug used for counting."""

    def __init__(self, reason: str, detail: str = ""):
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}" if detail else reason)


def quarantine_detail(exc: BaseException) -> str:
    """`Type: first line of the message` (at most 200 characters): the detail of a rejection for
    an unexpected exception while handling one record."""
    msg = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {msg[:200]}"


def strip_none(obj: Any) -> Any:
    """Drop None-valued keys recursively (parquet union structs fill absent keys with null)."""
    if isinstance(obj, dict):
        return {k: strip_none(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list):
        return [strip_none(v) for v in obj]
    return obj


def tool_call(name: str, arguments: dict, call_id: str | None = None) -> dict:
    call = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if call_id is not None:
        call["id"] = call_id
    return call


def make_record(
    *,
    id: str,
    source: str,
    domain: str,
    messages: list[dict],
    tools: list[dict] | None,
    task: str,
    answer: str | list[str] | None,
    terminator: str,
) -> dict:
    rec = {
        "id": id,
        "source": source,
        "domain": domain,
        "messages": messages,
        "tools": strip_none(tools or []),
        "task": task,
        "answer": answer,
        "terminator": terminator,
    }
    validate_record(rec)
    return rec


# What ends a trajectory of each domain (see data_prep.terminators).
DOMAIN_TERMINATOR = {"code": "finish", "search": "final_answer"}


def validate_tools(tools) -> None:
    """`tools` is a list of OpenAI function specs: {"type": "function", "function": {"name": str,
    "parameters"?: object}}."""
    if not isinstance(tools, list):
        raise RecordError("bad_tools", f"tools is {type(tools).__name__}, expected a list of tool schemas")
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict) \
                or not isinstance(fn.get("name"), str) or not fn["name"] \
                or not isinstance(fn.get("parameters", {}), dict):
            raise RecordError("bad_tools", f"tools[{i}] is not a function schema: {t!r:.120}")


def validate_record(rec: dict) -> None:
    """Raise RecordError(reason, detail) if `rec` breaks the contract."""
    from data_prep.terminators import FINAL_ANSWER_PREFIX, finish_problem

    if not isinstance(rec, dict):
        raise RecordError("bad_row", f"record is {type(rec).__name__}")
    missing = [f for f in FIELDS if f not in rec]
    if missing:
        raise RecordError("missing_field", f"missing {missing}")
    for key in ("id", "source", "task"):
        if not isinstance(rec[key], str) or (key != "task" and not rec[key]):
            raise RecordError("bad_field_type", f"{key} is {type(rec[key]).__name__} {rec[key]!r:.60}, expected a non-empty str")
    golds = rec["answer"]
    if golds is not None and not isinstance(golds, str) and not (isinstance(golds, list) and golds and all(isinstance(g, str) for g in golds)):
        raise RecordError("bad_field_type", f"answer is {type(golds).__name__} {golds!r:.60}, expected a str, a non-empty list of str or null")
    if rec["domain"] not in DOMAINS:
        raise RecordError("bad_domain", repr(rec["domain"]))
    if rec["terminator"] not in TERMINATORS:
        raise RecordError("bad_terminator", repr(rec["terminator"]))
    if rec["terminator"] != DOMAIN_TERMINATOR[rec["domain"]]:
        raise RecordError("bad_terminator", f"a {rec['domain']} record must end with {DOMAIN_TERMINATOR[rec['domain']]!r}, "
                                            f"found {rec['terminator']!r}")
    validate_tools(rec["tools"])
    msgs = rec["messages"]
    if not isinstance(msgs, list) or not msgs:
        raise RecordError("empty_conversation")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise RecordError("bad_message", f"message {i} is {type(m).__name__}")
        role = m.get("role")
        if role not in ROLES:
            raise RecordError("unknown_role", f"message {i} has role {role!r}")
        if not isinstance(m.get("content"), str):
            raise RecordError("non_string_content", f"message {i} ({role}) content is {type(m.get('content')).__name__}")
        if "reasoning_content" in m and not isinstance(m["reasoning_content"], str):
            raise RecordError("non_string_content", f"message {i} reasoning_content is not a str")
        if role == "tool":
            if not isinstance(m.get("tool_call_id"), str) or not isinstance(m.get("name"), str):
                raise RecordError("bad_tool_message", f"message {i} lacks tool_call_id/name")
        calls = m.get("tool_calls") or []
        if not isinstance(calls, list):
            raise RecordError("unparseable_tool_call", f"message {i}: tool_calls is {type(calls).__name__}")
        for c in calls:
            fn = (c.get("function") if isinstance(c, dict) else None) or {}
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not isinstance(fn.get("arguments"), dict):
                raise RecordError("unparseable_tool_call", f"message {i}: tool call {c!r:.120}")
    if not any(m["role"] == "assistant" for m in msgs):
        raise RecordError("no_assistant_turn")
    if msgs[-1]["role"] != "assistant":
        raise RecordError("does_not_end_with_assistant", f"last role is {msgs[-1]['role']!r}")
    if rec["domain"] == "code" and (unfinished := finish_problem(msgs)):
        raise RecordError("no_finish_call", unfinished)
    if rec["domain"] == "search" and not re.search(re.escape(FINAL_ANSWER_PREFIX.strip()) + r"[ \t]*\S", msgs[-1]["content"]):
        raise RecordError("no_final_answer", f"the last assistant turn has no `{FINAL_ANSWER_PREFIX}<answer>` line")


ROW_SEP = "#row"


def trajectory_id(row_id: str) -> str:
    """The id of the record a dataset row came from (`<id>#row<k>` -> `<id>`)."""
    head, sep, k = row_id.rpartition(ROW_SEP)
    return head if sep and k.isdigit() else row_id
