"""SWE-Gym OpenHands rows, both forms:
- text (`OpenHands-SFT-Trajectories`): `<function=...>` calls, `EXECUTION RESULT of [...]` user turns,
  a `---- BEGIN FUNCTION #i ----` list in the system prompt;
- raw (`OpenHands-Sampled-Trajectories`): native `tool_calls` (JSON-string arguments), role `tool`,
  a `tools` column whose parquet union structs carry nulls (stripped); a call to a tool it lacks is refused."""
from __future__ import annotations

from data_prep.readers.code import code_record, is_native, native_record, row_messages, xml_messages
from data_prep.readers.common import convert_native_messages

SOURCE = "swe-gym"


def parse(row: dict, *, rid: str, reasoning: str) -> dict:
    raw = row_messages(row)
    if is_native(raw):
        return native_record(rid, SOURCE, convert_native_messages(raw, reasoning=reasoning), row)
    msgs, specs = xml_messages(raw, reasoning=reasoning, crlf=True)
    return code_record(rid, SOURCE, msgs, specs)
