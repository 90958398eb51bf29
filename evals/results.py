"""Per-example result files and their summaries.

`<out>/<bench>.jsonl` is appended one finished batch at a time (flushed and fsynced), so an
interruption loses at most the batch in flight; a torn last line (killed mid-write, wherever the
cut fell, inside a UTF-8 character too) is dropped on resume, with a warning, and those examples run
again. One evaluation at a time writes an out dir (evals.store.EvalStore.lock).
"""
from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path

from common.io import JsonLineError, parse_json_line, torn_line_problem, utc_stamp
from evals.metrics import NULL_REASON, PROMPT_TOO_LONG, empty_gold, mean
from evals.errors import EvalError

QA_KEYS = ("em", "f1", "cover_em", "strict_em")


class ResultsError(EvalError):
    """A results file (`<bench>.jsonl`) that can't be resumed from: the message names file and line."""


def load_done(path: Path, valid_ids: set[str], *, repair: bool = False) -> dict[str, dict]:
    """Finished rows by id. A torn last line (common.io.torn_line_problem: no newline and not whole
    JSON, cut between ASCII bytes or inside a UTF-8 character) is left out: its item runs again. A
    second row of an id already read (two evaluations appended to one out dir) is left out: the first
    row of each id is the one kept. With `repair` (the evaluation that holds the out dir, resuming) both
    are said on stderr and the file is rewritten without them, the duplicates moved to
    `<bench>.jsonl.duplicates-<UTC time>` (nothing is lost). Anything else wrong (a corrupt line before
    the last, a row that is not an object, an id not in this sample) is a ResultsError naming file and line."""
    if not path.exists():
        return {}
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    torn = torn_line_problem(lines[-1])   # the bytes after the last newline
    if torn is not None:
        lines = lines[:-1]
    done, keep, dupes = {}, [], []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = parse_json_line(line)
        except JsonLineError as exc:
            raise ResultsError(f"{path}:{i}: corrupt row ({exc.detail}); "
                               "delete the file to re-run this bench") from None
        if not isinstance(row, dict):
            raise ResultsError(f"{path}:{i}: a row must be a JSON object, found {type(row).__name__}; "
                               "delete the file to re-run this bench")
        rid = row.get("id")
        if not isinstance(rid, str) or rid not in valid_ids:
            raise ResultsError(f"{path}:{i}: id {rid!r} is not in this run's sample (different n/seed/bench?); use a fresh out=")
        if rid in done:
            dupes.append((i, rid, line))
            continue
        done[rid] = row
        keep.append(line)
    if not repair:
        return done
    if torn is not None:
        print(f"[evaluate] {path}:{len(lines) + 1}: torn last line dropped ({torn}); its item runs again",
              file=sys.stderr, flush=True)
    if dupes:
        aside = _unused(path.with_name(f"{path.name}.duplicates-{utc_stamp()}"))
        aside.write_bytes(b"".join(line + b"\n" for _, _, line in dupes))
        i, rid, _ = dupes[0]
        print(f"[evaluate] {path}: {len(dupes)} duplicate row(s) dropped (a second row of an id already held, first "
              f"{rid!r} at line {i}: two evaluations wrote into this out dir); the first row of each id is kept, "
              f"the others moved to {aside.name}", file=sys.stderr, flush=True)
    repaired = b"".join(line + b"\n" for line in keep)
    if repaired != raw:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(repaired)
        os.replace(tmp, path)
    return done


def _unused(path: Path) -> Path:
    """`path`, or `path.N` for the first N that does not exist."""
    k, found = 1, path
    while found.exists():
        found, k = path.with_name(f"{path.name}.{k}"), k + 1
    return found


def append_rows(path: Path, rows: list[dict]) -> None:
    """Append `rows`, one JSON line each, flushed and fsynced; every row is encoded before any is
    written, so a row that is not text (a lone surrogate) is refused (ResultsError naming it), never a
    half-written line."""
    lines = []
    for row in rows:
        try:
            lines.append((json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise ResultsError(f"{path}: row {ascii(row.get('id'))} not written: it holds a lone surrogate "
                               f"(U+{ord(exc.object[exc.start]):04X}), which is not text") from None
    with open(path, "ab") as f:
        f.write(b"".join(lines))
        f.flush()
        os.fsync(f.fileno())


MEAN_FIELDS = ("format_failure_rate", "mean_turns", "mean_tool_calls", "mean_tool_errors", "mean_generated_tokens")


def null_means(summary: dict, keys, reason: str) -> dict:
    """`summary` with the means `keys` null and `reason` recorded under NULL_REASON."""
    summary.update({k: None for k in keys if k in summary})
    summary[NULL_REASON] = reason
    return summary


def prompt_too_long(rows: list[dict]) -> dict | None:
    """The items that stopped at `context_limit` before their first generated token (their first prompt did not
    fit `max_model_len`): {items, longest_prompt_tokens, max_model_len} (the two from the rows' `refused_prompt`,
    None for rows written before it), or None when every item generated."""
    hit = [r for r in rows if r.get("stop_reason") == "context_limit" and not r.get("generated_tokens")]
    if not hit:
        return None
    refused = [r["refused_prompt"] for r in hit if isinstance(r.get("refused_prompt"), dict)]
    return {"items": len(hit), "longest_prompt_tokens": max((p["tokens"] for p in refused), default=None),
            "max_model_len": max((p["max_model_len"] for p in refused), default=None)}


def too_long_text(too_long: dict, n: int) -> str:
    """`k of n items never generated a token: a first prompt of up to T tokens does not fit max_model_len=M`."""
    longest, window = too_long.get("longest_prompt_tokens"), too_long.get("max_model_len")
    fits = (f"a first prompt of up to {longest} tokens does not fit max_model_len={window}" if longest is not None
            else "their first prompt does not fit max_model_len")
    return f"{too_long['items']} of {n} items never generated a token: {fits}"


def with_prompt_too_long(summary: dict, rows: list[dict], keys) -> dict:
    """`summary` with its PROMPT_TOO_LONG count where some item never generated a token; where none did, the means
    `keys` null (the bench was not measured: a 0 there would read as the checkpoint's score), with the reason."""
    too_long = prompt_too_long(rows)
    if too_long is None:
        return summary
    summary[PROMPT_TOO_LONG] = too_long
    if too_long["items"] < len(rows):
        return summary
    return null_means(summary, keys, f"not measured: {too_long_text(too_long, len(rows))} (stop reason context_limit "
                                     "before any generation); raise max_model_len or shorten the prompt")


def summarize(rows: list[dict], metric_keys: tuple[str, ...] | None = None) -> dict:
    """Bench-level means in [0, 1] plus counts of stop reasons and extractor rules. A mean over zero
    items (no rows; every item skipped for its empty golds) is null, with the reason (NULL_REASON), and so
    are all means of a bench none of whose items generated a token (with_prompt_too_long)."""
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
    summary = with_prompt_too_long(summary, rows, [*keys, *MEAN_FIELDS])
    if summary.get(NULL_REASON):
        return summary
    if not scored:
        return null_means(summary, keys, f"no item scored: the gold answers of all {len(rows)} items normalize "
                                         "to nothing and skip_empty_golds=true")
    return summary
