"""SWE-smith trajectories: the `xml` split (`<function=...>` text calls, `OBSERVATION:` user turns
with CRLF tool output, `<function=submit>` at the end) and the `tool` split (native `tool_calls`,
`messages` stored as a JSON string, no tool schemas: they are inferred from the calls; a row that does
carry a `tools` column is held to it, as SWE-Gym's)."""
from __future__ import annotations

from data_prep.readers.code import code_record, is_native, native_record, row_messages, xml_messages
from data_prep.readers.common import convert_native_messages

SOURCE = "swe-smith"


def parse(row: dict, *, rid: str, reasoning: str) -> dict:
    raw = row_messages(row)
    if is_native(raw):
        msgs = convert_native_messages(raw, reasoning=reasoning)
        for m in msgs:
            if m["role"] == "tool":
                m["content"] = m["content"].replace("\r\n", "\n")
        return native_record(rid, SOURCE, msgs, row)
    msgs, specs = xml_messages(raw, reasoning=reasoning, crlf=True)
    return code_record(rid, SOURCE, msgs, specs)
