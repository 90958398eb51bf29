"""A wiki-18 style corpus line (`{"id", "contents"}`), as every retriever reads it (evals.retrievers, evals.dense)."""
from __future__ import annotations

from pathlib import Path

from common.io import JsonLineError, parse_json_line


class RetrieverError(RuntimeError):
    """The retriever can't serve (unreachable server, bad corpus, bad index, bad response)."""


def corpus_doc(path: Path, lineno: int, raw: str, seen: set[str]) -> dict:
    """One wiki-18 corpus line as `{"id", "contents"}`; a bad line or a repeated id is an error naming path:line."""
    try:
        row = parse_json_line(raw)
    except JsonLineError as exc:
        raise RetrieverError(f"{path}:{lineno}: {exc}") from None
    if not isinstance(row, dict) or not isinstance(row.get("contents"), str) or "id" not in row:
        got = sorted(row) if isinstance(row, dict) else type(row).__name__
        raise RetrieverError(f"{path}:{lineno}: expected {{\"id\", \"contents\": str}}, got keys {got}")
    doc_id = str(row["id"])
    if doc_id in seen:
        raise RetrieverError(f"{path}:{lineno}: duplicate doc id {doc_id!r}")
    seen.add(doc_id)
    return {"id": doc_id, "contents": row["contents"]}
