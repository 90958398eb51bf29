"""Per-example result files and their summaries.

`<out>/<bench>.jsonl` is appended one finished batch at a time (flushed and fsynced), so an
interruption loses at most the batch in flight; a torn last line (killed mid-write) is dropped
on resume and those examples run again.
"""
from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

from evals.metrics import NULL_REASON, empty_gold, mean
from evals.errors import EvalError

QA_KEYS = ("em", "f1", "cover_em", "strict_em")


class ResultsError(EvalError):
    """A results file (`<bench>.jsonl`) that can't be resumed from: the message names file and line."""


def load_done(path: Path, valid_ids: set[str]) -> dict[str, dict]:
    """Finished rows by id; repairs a torn final line, rejects anything else that's wrong."""
    if not path.exists():
        return {}
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    done, keep = {}, []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines):  # the last write was interrupted (no trailing newline)
                break
            raise ResultsError(f"{path}:{i}: corrupt line in the middle of the file; delete the file to re-run this bench")
        rid = row.get("id")
        if rid not in valid_ids:
            raise ResultsError(f"{path}:{i}: id {rid!r} is not in this run's sample (different n/seed/bench?); use a fresh out=")
        done[rid] = row
        keep.append(line)
    repaired = b"".join(line + b"\n" for line in keep)
    if repaired != raw:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(repaired)
        os.replace(tmp, path)
    return done


def append_rows(path: Path, rows: list[dict]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


MEAN_FIELDS = ("format_failure_rate", "mean_turns", "mean_tool_calls", "mean_tool_errors", "mean_generated_tokens")


def null_means(summary: dict, keys, reason: str) -> dict:
    """`summary` with the means `keys` null and `reason` recorded under NULL_REASON."""
    summary.update({k: None for k in keys if k in summary})
    summary[NULL_REASON] = reason
    return summary


def summarize(rows: list[dict], metric_keys: tuple[str, ...] | None = None) -> dict:
    """Bench-level means in [0, 1] plus counts of stop reasons and extractor rules. A mean over zero
    items (no rows; every item skipped for its empty golds) is null, with the reason (NULL_REASON)."""
    keys = metric_keys or (tuple(rows[0]["metrics"]) if rows else QA_KEYS)
    scored = [r for r in rows if not r.get("skipped_empty_gold")]
    summary = {k: mean(r["metrics"][k] for r in scored) for k in keys}
    if metric_keys is not None or "em" in keys:  # QA benches: gold answers that normalize to nothing
        summary["empty_gold_items"] = sum(empty_gold(r.get("golden_answers") or []) for r in rows)
        summary["skipped_empty_gold_items"] = len(rows) - len(scored)
    summary.update({
        "format_failure_rate": mean(float(r["extract_rule"] == "none") for r in rows),
        "n": len(rows),
        "mean_turns": mean(r["num_turns"] for r in rows),
        "mean_tool_calls": mean(r["num_tool_calls"] for r in rows),
        "mean_tool_errors": mean(r["num_tool_errors"] for r in rows),
        "mean_generated_tokens": mean(r["generated_tokens"] for r in rows),
        "stop_reasons": dict(sorted(Counter(r["stop_reason"] for r in rows).items())),
        "extract_rules": dict(sorted(Counter(r["extract_rule"] for r in rows).items())),
    })
    if not rows:
        return null_means(summary, [*keys, *MEAN_FIELDS], "no items to score")
    if not scored:
        return null_means(summary, keys, f"no item scored: the gold answers of all {len(rows)} items normalize "
                                         "to nothing and skip_empty_golds=true")
    return summary
