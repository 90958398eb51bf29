"""`canonical:PATH` sources: rows that already are canonical records (e.g. the envs exporter)."""
from __future__ import annotations

from data_prep.schema import FIELDS, RecordError, strip_none, validate_record


def parse(row: dict, *, rid: str, reasoning: str) -> dict:
    rec = {k: row.get(k) for k in FIELDS}
    if not isinstance(rec["id"], str) or not rec["id"]:
        rec["id"] = rid
    if not isinstance(rec["source"], str):
        raise RecordError("missing_field", "canonical row has no `source`")
    rec["tools"] = strip_none(rec["tools"] or [])
    validate_record(rec)
    return rec
