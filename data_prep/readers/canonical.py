"""`canonical:PATH` sources: rows that already are canonical records (e.g. the envs exporter); a call to a tool
the record's `tools` lack, a call with no result or a result of no call is refused."""
from __future__ import annotations

from data_prep.readers.common import check_results, require_declared
from data_prep.schema import FIELDS, RecordError, strip_none, validate_record


def parse(row: dict, *, rid: str, reasoning: str) -> dict:
    rec = {k: row.get(k) for k in FIELDS}
    if not isinstance(rec["id"], str) or not rec["id"]:
        rec["id"] = rid
    if not isinstance(rec["source"], str):
        raise RecordError("missing_field", "canonical row has no `source`")
    rec["tools"] = strip_none(rec["tools"] or [])
    validate_record(rec)
    require_declared(rec["messages"], rec["tools"], "the record's tools lack")
    check_results(rec["messages"])
    return rec
