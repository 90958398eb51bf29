"""OpenSeeker rows: `question`, `answer`, `trajectory` (messages: assistant `<think>` +
`<tool_call>{json}</tool_call>` (sometimes inside `<tool_calls_begin>...</tool_calls_end>`),
user turns holding one `<tool_response>` block per call, a final `<answer>`).

The gold is the row's `answer` under the search readers' rule (`data_prep.readers.search.gold`): a string, a number
(as its text) or a list of strings; a row with anything else is refused, never given the model's own `<answer>` as its gold.

OpenSeeker's search takes a list of queries; a one-element list becomes the canonical
`{"query": str}`, longer lists are kept as lists (the data is not rewritten). A row the loop would not
have run as written (a tag left unpaired, a tool other than search/visit, a call with no response,
a turn after the answer) is refused."""
from __future__ import annotations

import json
import re

from data_prep.readers.common import message_list, require_parameters, require_str, thought_message
from data_prep.readers.search import SEARCH_TOOL, VISIT_TOOL, final_turn, gold, search_record
from data_prep.schema import RecordError, tool_call
from data_prep.terminators import extract_answer_tag

SOURCE = "openseeker"
_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_RESP_RE = re.compile(r"<tool_response>(.*?)</tool_response>", re.DOTALL)
_WRAP_RE = re.compile(r"</?tool_calls_(?:begin|end)>")
_TOOLS = {"search": SEARCH_TOOL, "visit": VISIT_TOOL}


def _parse_call(raw: str, where: str) -> tuple[str, dict]:
    try:
        obj = json.loads(raw.strip())
    except json.JSONDecodeError as exc:
        raise RecordError("unparseable_tool_call", f"{where}: {exc.msg} in {raw.strip()[:120]!r}")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not isinstance(obj.get("arguments", {}), dict):
        raise RecordError("unparseable_tool_call", f"{where}: {raw.strip()[:120]!r}")
    if obj["name"] not in _TOOLS:
        raise RecordError("unparseable_tool_call", f"{where}: OpenSeeker has no tool {obj['name']!r} (its tools: {', '.join(_TOOLS)})")
    args = dict(obj.get("arguments", {}))
    require_parameters(_TOOLS[obj["name"]]["function"], obj["name"], args, where)
    if obj["name"] == "search" and isinstance(args.get("query"), list) and len(args["query"]) == 1:
        args["query"] = args["query"][0]
    return obj["name"], args


def _stray(text: str, tag: str, where: str, reason: str) -> None:
    """`text` (the blocks the loop acts on taken out) still holding `<tag>` or `</tag>`: refused, naming it."""
    if m := re.search(f"</?{tag}>", text):
        raise RecordError(reason, f"{where}: a stray {m.group()} in {text[max(0, m.start() - 40):m.end() + 40]!r} (OpenSeeker's "
                          "loop acts on complete blocks and stops at the first </answer>, so it is neither a step nor thought to train)")


def parse(row: dict, *, rid: str, reasoning: str) -> dict:
    traj = message_list(row, "trajectory")
    question = row.get("question")
    turns: list[dict] = []
    pending: list[dict] = []
    answer = None
    used, last = set(), None  # the tools called; the last assistant turn's index
    for i, m in enumerate(traj):
        role = m.get("role") if isinstance(m, dict) else None
        if role not in ("system", "user", "assistant"):
            raise RecordError("unknown_role", f"message {i} has role {role!r}")
        content = require_str(m.get("content"), f"message {i} ({role})")
        if role == "system":
            continue  # replaced by the canonical search system prompt
        if role == "user":
            _stray(_RESP_RE.sub("", content), "tool_response", f"message {i}", "tool_response_mismatch")
            blocks = _RESP_RE.findall(content)
            if not blocks:
                if question is None:
                    question = content.strip()
                elif turns:
                    turns.append({"role": "user", "content": content})
                continue
            if len(blocks) != len(pending):
                raise RecordError("tool_response_mismatch", f"message {i}: {len(blocks)} responses for {len(pending)} calls")
            for call, block in zip(pending, blocks):
                turns.append({"role": "tool", "content": block.strip("\n"), "tool_call_id": call["id"], "name": call["function"]["name"]})
            pending = []
            continue
        if pending:
            raise RecordError("tool_response_mismatch", f"message {i}: {len(pending)} call(s) of message {last} have no <tool_response>")
        if answer is not None:
            raise RecordError("no_final_answer", f"message {i}: a turn after the <answer> of message {last}: the loop stops there")
        last, text = i, _WRAP_RE.sub("", content)
        calls, rest = _CALL_RE.findall(text), _CALL_RE.sub("", text)
        _stray(rest, "tool_call", f"message {i}", "unparseable_tool_call")
        _stray(rest, "tool_response", f"message {i}", "tool_response_mismatch")  # the environment's text, never the model's
        before, ans = extract_answer_tag(text)
        _stray(before if ans is not None and not calls else rest, "answer", f"message {i}", "no_final_answer")
        if calls:
            msg = thought_message(clean(rest), reasoning)
            msg["tool_calls"] = []
            for j, raw in enumerate(calls):
                name, args = _parse_call(raw, f"message {i} call {j}")
                used.add(name)
                msg["tool_calls"].append(tool_call(name, args, f"call_{i}_{j}"))
            pending = list(msg["tool_calls"])
            turns.append(msg)
            continue
        if ans is not None:
            answer = ans
            turns.append(final_turn(before, ans, reasoning))
        else:
            turns.append(thought_message(clean(text), reasoning))
    if answer is None:
        raise RecordError("no_final_answer", "no <answer> in the trajectory")
    if not isinstance(question, str) or not question.strip():
        raise RecordError("no_question")
    tools = [SEARCH_TOOL] + ([VISIT_TOOL] if "visit" in used else [])
    return search_record(rid, SOURCE, question.strip(), gold(row.get("answer"), "answer"), turns, tools)


def clean(text: str) -> str:
    from data_prep.readers.search import clean_thought

    return clean_thought(text)
