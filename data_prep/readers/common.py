"""Conversions shared by the readers: XML-text tool calls, native OpenAI tool calls, thoughts.

Every reader produces the canonical record of `data_prep.schema`. Rules applied here:
- observations become role `tool` with the matching `tool_call_id`/`name` (the Qwen3 templates
  otherwise treat each observation as a new user query and drop all earlier reasoning);
- the free text before a call becomes `reasoning_content` or `content` (`reasoning=` switch);
- tool arguments become dicts; `None` never reaches a template (keys stripped, content "").
"""
from __future__ import annotations

import json
import re
from typing import Any

from data_prep.config import REASONING_MODES  # data.reasoning's values, defined with its field
from data_prep.schema import RecordError, strip_none, tool_call

_FUNC_RE = re.compile(r"<function=([^>\s]+)>(.*?)</function>", re.DOTALL)
_PARAM_RE = re.compile(r"<parameter=([^>\s]+)>(.*?)</parameter>", re.DOTALL)
_STEPS_RE = re.compile(r"\n*Steps Remaining: \d+\s*$")
_XML_TAG_RE = re.compile(r"</?(?:function|parameter)[=>]")


def thought_message(thought: str, reasoning: str) -> dict:
    """An assistant message carrying free-text `thought` per the `reasoning` switch."""
    if reasoning not in REASONING_MODES:
        raise ValueError(f"reasoning must be one of {REASONING_MODES}, got {reasoning!r}")
    thought = thought.strip()
    msg: dict[str, Any] = {"role": "assistant", "content": ""}
    if thought:
        msg["reasoning_content" if reasoning == "reasoning_content" else "content"] = thought
    return msg


def _param_value(raw: str) -> str:
    """XML parameter text -> its string value. OpenHands wraps multi-line values in newlines (one
    stripped each side); nothing else is touched (typing happens against the tool's schema, see
    `type_xml_arguments`)."""
    val = raw[1:] if raw.startswith("\n") else raw
    return val[:-1] if val.endswith("\n") else val


_DECODED_TYPES = {"integer": int, "number": (int, float), "boolean": bool, "array": list, "object": dict}


def _declared_type(spec: dict | None, param: str) -> str | None:
    prop = (((spec or {}).get("parameters") or {}).get("properties") or {}).get(param) or {}
    t = prop.get("type")
    return t if isinstance(t, str) else None


def type_xml_arguments(messages: list[dict], tools: list[dict]) -> list[dict]:
    """Type XML-text call parameters by the tool's declared schema: a parameter declared as a
    non-string JSON type (integer, number, boolean, array, object) is JSON-decoded when its text
    decodes to that type; string parameters and parameters with no declared schema stay the
    byte-exact text the model wrote (a `new_str` that looks like JSON stays that text). A call
    lacking a parameter its schema requires is refused (the scaffold rejects it unrun)."""
    specs = {t["function"]["name"]: t["function"] for t in tools if isinstance(t.get("function"), dict)}
    for i, m in enumerate(messages):
        for c in m.get("tool_calls") or []:
            fn = c["function"]
            require_parameters(specs.get(fn["name"]), fn["name"], fn["arguments"], f"message {i}")
            for k, v in list(fn["arguments"].items()):
                want = _declared_type(specs.get(fn["name"]), k)
                if want not in _DECODED_TYPES or not isinstance(v, str):
                    continue
                try:
                    val = json.loads(v)
                except json.JSONDecodeError:
                    continue  # kept as written; the template renders it as a string
                if isinstance(val, _DECODED_TYPES[want]) and not (want != "boolean" and isinstance(val, bool)):
                    fn["arguments"][k] = val
    return messages


def require_parameters(spec: dict | None, name: str, args: dict, where: str) -> None:
    """Refuse a call lacking a parameter its tool's schema (`spec`, the `function` part) requires: the loop rejects it unrun."""
    if missing := [r for r in ((spec or {}).get("parameters") or {}).get("required") or [] if r not in args]:
        raise RecordError("unparseable_tool_call", f"{where}: a {name} call without its required parameter(s) {', '.join(missing)}")


def parse_xml_calls(text: str, where: str = "text") -> tuple[str, list[tuple[str, dict]]]:
    """Split assistant text into (thought before the first call, [(name, args), ...]).

    A function or parameter tag outside a complete `<function=NAME>...</function>` block, or a
    block holding text outside its complete `<parameter=K>...</parameter>`s, is an
    `unparseable_tool_call` (the scaffold would not run it as written, nor is it thought)."""
    calls = []
    for m in _FUNC_RE.finditer(text):
        if left := _PARAM_RE.sub("", m.group(2)).strip():
            raise RecordError("unparseable_tool_call", f"{where}: <function={m.group(1)}> holds {left[:80]!r} outside a complete <parameter=...> block")
        calls.append((m.group(1), {k: _param_value(v) for k, v in _PARAM_RE.findall(m.group(2))}))
    if stray := _XML_TAG_RE.search(rest := _FUNC_RE.sub("", text)):
        raise RecordError("unparseable_tool_call", f"{where}: a stray {stray.group()} in {rest[max(0, stray.start() - 60):stray.end() + 60]!r}")
    first = _FUNC_RE.search(text)
    thought = text[: first.start()] if first else text
    if first:
        tail = text[_last_end(text):].strip()
        if tail:  # text after the call would be lost in the tool-call form: keep it in the thought
            thought = thought.rstrip() + "\n\n" + tail
    return thought, calls


def _last_end(text: str) -> int:
    end = 0
    for m in _FUNC_RE.finditer(text):
        end = m.end()
    return end


def strip_steps_suffix(text: str) -> str:
    """Drop the scaffold's `Steps Remaining: N` suffix (an artefact of one agent loop)."""
    return _STEPS_RE.sub("", text)


def require_str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise RecordError("non_string_content", f"{where} content is {type(value).__name__}")
    return value


def convert_xml_messages(
    messages: list[dict],
    *,
    reasoning: str,
    crlf: bool = False,
) -> list[dict]:
    """Text-form agent conversation (calls as `<function=...>` XML, observations as user turns)
    -> canonical messages. A user turn right after an assistant call is that call's observation
    (role `tool`); any other user turn stays a user turn (e.g. "please continue" nudges). A turn holds
    one call (the scaffold runs the first only, and one observation answers it), which an observation
    answers before the next assistant turn. Call parameters come back as strings: type them with `type_xml_arguments` once the tools'
    schemas are known. `crlf`: CRLF line ends of observations become LF."""
    if not isinstance(messages, list) or not messages:
        raise RecordError("empty_conversation")
    out: list[dict] = []
    pending: tuple[str, str, int] | None = None  # (call id, name, its message) awaiting an observation
    n_calls = 0
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise RecordError("bad_message", f"message {i} is {type(m).__name__}")
        role = m.get("role")
        content = require_str(m.get("content"), f"message {i} ({role})")
        if crlf and role != "assistant":  # tool output; what the model wrote stays byte-exact
            content = content.replace("\r\n", "\n")
        if role == "system":
            out.append({"role": "system", "content": content})
        elif role == "user":
            content = strip_steps_suffix(content)
            if pending:
                out.append({"role": "tool", "content": content, "tool_call_id": pending[0], "name": pending[1]})
                pending = None
            else:
                out.append({"role": "user", "content": content})
        elif role == "assistant":
            if pending:
                raise RecordError("bad_tool_message", f"message {i}: the call of message {pending[2]} has no observation")
            thought, calls = parse_xml_calls(content, f"message {i}")
            if len(calls) > 1:
                raise RecordError("unparseable_tool_call", f"message {i}: {len(calls)} <function=...> calls in one turn (the scaffold runs one a turn)")
            msg = thought_message(thought, reasoning)
            if calls:
                (name, args), call_id = calls[0], f"call_{n_calls}"
                n_calls += 1
                msg["tool_calls"] = [tool_call(name, args, call_id)]
                pending = (call_id, name, i)
            out.append(msg)
        else:
            raise RecordError("unknown_role", f"message {i} has role {role!r}")
    return out


def parse_arguments(raw: Any, where: str) -> dict:
    """Native tool-call arguments (JSON string or dict) -> dict."""
    if isinstance(raw, dict):
        return strip_none(raw)
    if isinstance(raw, str):
        try:
            val = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError as exc:
            raise RecordError("unparseable_tool_call", f"{where}: arguments are not JSON ({exc.msg}): {raw[:120]!r}")
        if isinstance(val, dict):
            return val
        raw = val
    raise RecordError("unparseable_tool_call", f"{where}: arguments are {type(raw).__name__}, not an object")


def convert_native_messages(messages: list[dict], *, reasoning: str) -> list[dict]:
    """OpenAI-form messages with native `tool_calls` (parquet nulls allowed) -> canonical, results paired (`check_results`)."""
    if not isinstance(messages, list) or not messages:
        raise RecordError("empty_conversation")
    out: list[dict] = []
    for i, raw in enumerate(messages):
        if not isinstance(raw, dict):
            raise RecordError("bad_message", f"message {i} is {type(raw).__name__}")
        m = strip_none(raw)
        role = m.get("role")
        if role not in ("system", "user", "assistant", "tool"):
            raise RecordError("unknown_role", f"message {i} has role {role!r}")
        content = raw.get("content")  # null only beside an assistant's calls (stripping it would read a null query as "")
        content = require_str("" if role == "assistant" and content is None else content, f"message {i} ({role})")
        if role == "assistant":
            thought = m.get("reasoning_content")
            if thought is not None:
                require_str(thought, f"message {i} reasoning")
                msg = thought_message(thought, reasoning)
                if content:
                    msg["content"] = (msg["content"] + "\n\n" + content).strip() if msg["content"] else content
            elif m.get("tool_calls"):
                msg = thought_message(content, reasoning)
            else:
                msg = {"role": "assistant", "content": content}
            calls = []
            for j, c in enumerate(m.get("tool_calls") or []):
                fn = c.get("function") if isinstance(c, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise RecordError("unparseable_tool_call", f"message {i} call {j}: {c!r:.120}")
                calls.append(tool_call(fn["name"], parse_arguments(fn.get("arguments"), f"message {i} call {j}"), c.get("id") or f"call_{i}_{j}"))
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
        elif role == "tool":
            call_id, name = m.get("tool_call_id"), m.get("name")
            if not isinstance(call_id, str) or not isinstance(name, str):
                call_id, name = _infer_call(out, i)
            out.append({"role": "tool", "content": content, "tool_call_id": call_id, "name": name})
        else:
            out.append({"role": role, "content": content})
    return check_results(out)


def check_results(messages: list[dict]) -> list[dict]:
    """Canonical `messages` whose every call but the last turn's has its tool result (its id and name)
    before the next assistant turn, and whose every result answers such a call; else refused."""
    pending: dict = {}  # call id -> (name, message) of the calls awaiting a result
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            if pending:
                raise RecordError("bad_tool_message", f"message {i}: call(s) {', '.join(map(str, pending))} of message "
                                  f"{next(iter(pending.values()))[1]} have no tool result")
            pending = {c.get("id"): (c["function"]["name"], i) for c in m.get("tool_calls") or []}
        elif m["role"] == "tool" and pending.pop(m["tool_call_id"], (None,))[0] != m["name"]:
            raise RecordError("bad_tool_message", f"message {i}: a result of {m['name']} for call {m['tool_call_id']!r}, which no call awaiting a result is")
    return messages


def _infer_call(out: list[dict], i: int) -> tuple[str, str]:
    for prev in reversed(out):
        if prev["role"] == "assistant":
            calls = prev.get("tool_calls") or []
            if calls:
                c = calls[-1]
                return c.get("id", f"call_{i}"), c["function"]["name"]
            break
    raise RecordError("bad_tool_message", f"message {i}: tool result without a preceding call")


def trim_after_finish(messages: list[dict]) -> list[dict]:
    """Drop trailing tool turns after the last assistant turn (the finish call's own observation is
    never trained on); a trailing user turn stays (the record is refused: it does not end with a finish)."""
    end = len(messages)
    while end > 0 and messages[end - 1]["role"] in ("tool",):
        end -= 1
    return messages[:end]


def infer_tools(messages: list[dict]) -> list[dict]:
    """JSON-schema specs inferred from the calls seen (for sources that ship no schemas)."""
    specs: dict[str, dict] = {}
    for m in messages:
        for c in m.get("tool_calls") or []:
            fn = c["function"]
            props = specs.setdefault(fn["name"], {})
            for k, v in fn["arguments"].items():
                props.setdefault(k, {"type": _json_type(v)})
    return [
        {"type": "function", "function": {"name": n, "description": f"The {n} tool.",
                                          "parameters": {"type": "object", "properties": p}}}
        for n, p in sorted(specs.items())
    ]


def _json_type(v: Any) -> str:
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    return "string"


_FN_HEAD_RE = re.compile(r"^[-–—]+ BEGIN FUNCTION #\d+: (\S+) [-–—]+$", re.M)
_FN_END_RE = re.compile(r"^[-–—]+ END FUNCTION #\d+ [-–—]+$", re.M)
_PARAM_LINE_RE = re.compile(r"^\s*(?:\(\d+\)|\d+\.)\s*(\w+) \((\w+), (required|optional)\):?\s*(.*)$", re.M)
_ACCESS_RE = re.compile(r"\n*(?:We|You) have access to the following functions:?", re.I)
_TYPE_MAP = {"string": "string", "integer": "integer", "int": "integer", "boolean": "boolean",
             "bool": "boolean", "array": "array", "list": "array", "number": "number", "object": "object"}


def tools_from_system_prompt(system: str) -> tuple[str, list[dict]]:
    """(system prompt without its text function list, JSON-schema specs parsed from that list).

    Text-form scaffolds (R2E, OpenHands, SWE-agent) describe tools in the system prompt and ask for
    `<function=...>` calls; the chat template renders the tools itself and the calls as
    `<tool_call>` JSON, so the text list and its format rules would contradict the render."""
    specs = []
    heads = list(_FN_HEAD_RE.finditer(system))
    for k, h in enumerate(heads):
        stop = heads[k + 1].start() if k + 1 < len(heads) else len(system)
        body = system[h.end():stop]
        endm = _FN_END_RE.search(body)
        body = body[: endm.start()] if endm else body
        desc = body.split("Parameters:")[0].strip()
        desc = desc[len("Description:"):].strip() if desc.startswith("Description:") else desc
        props, required = {}, []
        for pm in _PARAM_LINE_RE.finditer(body):
            name, typ, req, pdesc = pm.groups()
            props[name] = {"type": _TYPE_MAP.get(typ.lower(), "string")}
            if pdesc.strip():
                props[name]["description"] = pdesc.strip()
            if req == "required":
                required.append(name)
        params: dict[str, Any] = {"type": "object", "properties": props}
        if required:
            params["required"] = required
        specs.append({"type": "function", "function": {"name": h.group(1), "description": desc, "parameters": params}})
    acc = _ACCESS_RE.search(system)
    prompt = system[: acc.start()].rstrip() if acc else system
    return prompt, specs


def merge_tools(declared: list[dict], messages: list[dict]) -> list[dict]:
    """Declared specs plus inferred specs for any called tool the declaration lacks."""
    names = {t["function"]["name"] for t in declared}
    return declared + [t for t in infer_tools(messages) if t["function"]["name"] not in names]


def require_declared(messages: list[dict], tools: list[dict], lacking: str) -> None:
    """Refuse a call to a tool the specs `tools` lack (`lacking` names them in the message, e.g. "the record's tools
    lack"): trained on it, the model would call a tool its prompt never listed."""
    names = {t["function"]["name"] for t in tools}
    for i, m in enumerate(messages):
        if bad := [c["function"]["name"] for c in m.get("tool_calls") or [] if c["function"]["name"] not in names]:
            raise RecordError("unparseable_tool_call", f"message {i}: a call to {bad[0]!r}, which {lacking} ({', '.join(sorted(names)) or 'none'})")


def message_list(row: dict, key: str) -> list:
    """A column holding the conversation: a list, or a JSON string of one (SWE-smith's `tool`
    split, some OpenSeeker dumps)."""
    msgs = row.get(key)
    if isinstance(msgs, str):
        try:
            msgs = json.loads(msgs)
        except json.JSONDecodeError as exc:
            raise RecordError("malformed_json", f"{key} string is not JSON: {exc.msg}")
    if msgs is None or (isinstance(msgs, list) and not msgs):
        raise RecordError("empty_conversation")
    if not isinstance(msgs, list):
        raise RecordError("bad_message", f"{key} is {type(msgs).__name__}")
    return msgs
