"""R2E-Gym SFT rows: `messages` with `<function=NAME>` XML calls as text, observations as user
turns, the problem statement in `<github_issue>` of the first user turn."""
from __future__ import annotations

from data_prep.readers.code import code_record, row_messages, xml_messages

SOURCE = "r2e-gym"


def parse(row: dict, *, rid: str, reasoning: str) -> dict:
    msgs, specs = xml_messages(row_messages(row), reasoning=reasoning)
    return code_record(rid, SOURCE, msgs, specs)
