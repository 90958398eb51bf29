"""The tidy results table: one row per (arm, seed, step, bench, metric), from every summary.json.

Columns: arm, seed, step, bench, metric, value, n. The anchor (the base model with the
`anchor_nudge` prompt) is arm "anchor", seed 0, step 0. Per-example metrics come from
`<eval_dir>/<bench>.jsonl` (each line has `id` and a `metrics` dict) and feed the intervals.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

import pandas as pd

from analysis.discover import ANCHOR_ARM, Run, read_json_object
from common.io import JsonLineError, parse_json_line
from evals.metrics import NON_METRIC_FIELDS, NULL_REASON, PROMPT_TOO_LONG
from analysis.errors import AnalysisError
from common.benchmarks import CONTEXT_MODES, BenchError, bench_label, parse_bench_key
from evals.registry import headline_metrics, metric_problem, metric_specs
from evals.results import too_long_text

COLUMNS = ["arm", "seed", "step", "bench", "metric", "value", "n"]
# The Search-R1 seven, in the order of its Table 2 (general QA, then multi-hop QA).
GENERAL_QA = ["nq", "triviaqa", "popqa"]
MULTIHOP_QA = ["hotpotqa", "2wikimultihopqa", "musique", "bamboogle"]
SEARCH_R1_BENCHES = GENERAL_QA + MULTIHOP_QA
MEAN_BENCH = "avg"  # pseudo-bench: the unweighted mean over the QA benches (Search-R1's "Avg.")


@dataclass
class Collected:
    table: pd.DataFrame
    problems: list[str] = field(default_factory=list)
    # (arm, seed, step, bench) -> why evaluate gave it no score (its metrics null: means over no items)
    nulls: dict[tuple[str, int, int, str], str] = field(default_factory=dict)
    # (arm, seed, step) -> why its summary.json could not be read (the problem's own line)
    unread: dict[tuple[str, int, int], str] = field(default_factory=dict)
    # (arm, seed, step, bench) -> how many of its scored items never generated a token (evaluate's `prompt_too_long`)
    too_long: dict[tuple[str, int, int, str], str] = field(default_factory=dict)


def env_benches() -> list[str]:
    """The benches played in their own environment, each scored by one headline metric (not EM/F1): the
    bench registry's (evals.registry: a kind's `headline`), in its order."""
    return list(headline_metrics())


COUNT_FIELDS = ("num_turns", "num_tool_calls", "num_tool_errors", "generated_tokens")
TORN = "a torn last line (no newline at its end: a write cut short)"


def json_rows(path: str | Path) -> Iterator[tuple[int, Any, str | None]]:
    """(line number, value, None) for each non-blank line of a jsonl, or (line number, None, why) for one that
    is not JSON (invalid UTF-8 or JSON; a last line without its newline that does not parse is torn, whether
    the cut fell between ASCII characters or inside a multibyte one). Every analysis reader of eval rows
    reads them so: none raises on a bad line, each names it."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                yield lineno, parse_json_line(raw), None
            except JsonLineError as exc:
                yield lineno, None, TORN if not raw.endswith(b"\n") else str(exc)


def row_problem(obj: Any) -> str | None:
    """Why an eval row's fields are not of their types (None: they are): `metrics` an object of numbers (or
    nulls), the counts numbers, `messages` a list whose tool calls' `function` is an object."""
    if not isinstance(obj, dict):
        return "a row must be a JSON object"
    for key in COUNT_FIELDS:
        if obj.get(key) is not None and not _is_number(obj[key]):
            return f"{key} = {str(obj[key])[:40]!r}: not a number"
    metrics = obj.get("metrics", {})
    if not isinstance(metrics, dict):
        return f"`metrics` is {type(metrics).__name__}, not an object"
    for k, v in metrics.items():
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            return f"metric {k} = {str(v)[:40]!r}: not a number"   # (NaN / inf: the metric registry's to judge)
    messages = obj.get("messages", [])
    if messages is not None and not isinstance(messages, list):
        return f"`messages` is {type(messages).__name__}, not a list"
    for m in messages or []:
        calls = m.get("tool_calls") if isinstance(m, dict) else None
        if calls is not None and not isinstance(calls, list):
            return "`tool_calls` is not a list"
        for c in calls or []:
            if isinstance(c, dict) and "function" in c and not isinstance(c["function"], dict):
                return f"a tool call's `function` is {type(c['function']).__name__}, not an object"
    return None

def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))


def no_score_reason(entry: dict) -> str | None:
    """Why a summary.json bench entry has no score: evaluate's `null_reason`, or, in a summary written before
    evaluate said so, a bench every one of whose items stopped at `context_limit` without generating a token
    (its zeros are no answer of the model's); None when it has one."""
    if isinstance(entry.get(NULL_REASON), str):
        return entry[NULL_REASON]
    n = entry.get("n")
    if (isinstance(n, int) and n > 0 and entry.get("stop_reasons") == {"context_limit": n}
            and entry.get("mean_generated_tokens") == 0):
        return (f"not measured: {n} of {n} items never generated a token: their first prompt does not fit "
                "max_model_len (stop reason context_limit, no token generated; summary.json of an earlier evaluate)")
    return None


def eval_no_score(eval_dir: Path, bench: str) -> str | None:
    """Why `eval_dir`'s summary.json gives `bench` no score (no_score_reason), else None (also when unreadable:
    its readers say that)."""
    entry = (read_json_object(Path(eval_dir) / "summary.json", []) or {}).get(bench)
    return no_score_reason(entry) if isinstance(entry, dict) else None


def _is_count(metric: str) -> bool:
    """A count of items (empty_gold_items, ...), which a bench without a score still has; not a mean."""
    spec = metric_specs().get(metric)
    return spec is not None and spec.integer


def summary_rows(arm: str, seed: int, step: int, summary: dict, benches: list[str] | None,
                 problems: list[str] | None = None, where: Path | str = "summary.json",
                 nulls: dict | None = None, too_long: dict | None = None) -> list[dict]:
    """Tidy rows of one summary.json. Every value is checked against evals' metric registry: a NaN,
    an inf, an out-of-range value, an unknown metric or a bad `n` is listed in `problems` (file,
    bench, metric, value) and not written (a bad `n` is written as -1, unknown). A bench whose means
    evaluate left null with a reason (`null_reason`: no items to score, or none generated a token; then n may
    be 0; analysis.collect.no_score_reason) writes no row for its means, only its counts of items: the reason goes
    to `nulls`. A scored bench some of whose items never generated
    a token (`prompt_too_long`, each scored 0) is said in `too_long`."""
    problems = [] if problems is None else problems
    rows = []
    for bench, metrics in summary.items():
        if benches is not None and bench not in benches:
            continue
        if not isinstance(metrics, dict):
            problems.append(f"{where}: {bench}: expected an object of metrics, found {metrics!r}")
            continue
        reason = no_score_reason(metrics)
        if reason and nulls is not None:
            nulls[(arm, seed, step, bench)] = reason
        if not reason and too_long is not None and isinstance(info := metrics.get(PROMPT_TOO_LONG), dict) \
                and isinstance(info.get("items"), int):
            too_long[(arm, seed, step, bench)] = too_long_text(info, metrics.get("n"))
        n = metrics.get("n")
        if (why := metric_problem("n", n)) is not None and not (reason and n == 0):
            problems.append(f"{where}: {bench}.n = {n!r}: {why}; its values are written with n=-1")
            n = -1
        for metric, value in metrics.items():
            if metric == "n" or metric in NON_METRIC_FIELDS or (reason and (value is None or not _is_count(metric))):
                continue
            if (why := metric_problem(metric, value)) is not None:
                problems.append(f"{where}: {bench}.{metric} = {value!r}: {why}; not written")
                continue
            rows.append(dict(arm=arm, seed=seed, step=step, bench=bench, metric=metric, value=float(value), n=int(n)))
    return rows


def collect(runs: list[Run], anchor_eval_dir: Path | None, benches: list[str] | None = None) -> Collected:
    """Tidy table over every run's eval summaries (plus the anchor's); problems are listed, not raised."""
    rows, problems, nulls, unread, too_long = [], [], {}, {}, {}
    for run in runs:
        for step, d in sorted(run.evals.items()):
            before = len(problems)
            summary = read_json_object(d / "summary.json", problems)
            if summary is not None:
                rows += summary_rows(run.arm, run.seed, step, summary, benches, problems, d / "summary.json", nulls,
                                     too_long)
            elif len(problems) > before:
                unread[(run.arm, run.seed, step)] = problems[-1]
    if anchor_eval_dir is not None and (anchor_eval_dir / "summary.json").is_file():
        summary = read_json_object(anchor_eval_dir / "summary.json", problems)
        if summary is not None:
            rows += summary_rows(ANCHOR_ARM, 0, 0, summary, benches, problems, anchor_eval_dir / "summary.json", nulls,
                                 too_long)
    table = pd.DataFrame(rows, columns=COLUMNS)
    table = table.astype({"seed": "int64", "step": "int64", "value": "float64", "n": "int64"})
    table = table.sort_values(["arm", "seed", "step", "bench", "metric"], kind="stable").reset_index(drop=True)
    return Collected(table, problems, nulls, unread, too_long)


def qa_benches(table: pd.DataFrame, also=()) -> list[str]:
    """QA benches present (those with EM; `bench@mode` keys; plus `also`, e.g. benches held with null
    scores), Search-R1's seven first in their table order, each bench's context modes together (open,
    item, given)."""
    present = (set(table.loc[table.metric == "em", "bench"]) | set(also)) - set(env_benches()) - {MEAN_BENCH}

    def order(key: str):
        try:
            name, mode = parse_bench_key(key)
        except BenchError:  # not a bench@mode name: after the others, as it is
            return len(SEARCH_R1_BENCHES) + 1, key, 0
        rank = SEARCH_R1_BENCHES.index(name) if name in SEARCH_R1_BENCHES else len(SEARCH_R1_BENCHES)
        return rank, name, CONTEXT_MODES.index(mode)
    return sorted(present, key=order)


def qa_label(key: str) -> str:
    """A column header naming the bench's context mode (`musique (given)`); agentic benches as they are."""
    try:
        return bench_label(key, env_benches())
    except BenchError:
        return key


def add_mean_rows(table: pd.DataFrame, benches: list[str]) -> pd.DataFrame:
    """Append the unweighted mean over `benches` as bench `avg`, only where every one is present.

    A point missing one bench is a gap in the mean, not a mean over fewer benches (which would
    shift it by the missing bench's difficulty).
    """
    if len(benches) < 2 or table.empty:
        return table
    sub = table[table.bench.isin(benches)]
    keys = ["arm", "seed", "step", "metric"]
    agg = sub.groupby(keys).agg(value=("value", "mean"), k=("bench", "nunique"), n=("n", "sum")).reset_index()
    agg = agg[agg.k == len(benches)].drop(columns="k")
    agg["bench"] = MEAN_BENCH
    return pd.concat([table, agg[COLUMNS]], ignore_index=True)


def mean_label(benches: list[str]) -> str:
    return "7-bench mean" if sorted(benches) == sorted(SEARCH_R1_BENCHES) else f"mean of {len(benches)} QA benches"


def _behaviour(row: dict) -> dict[str, float]:
    """Per-example twins of the summary's behaviour means, so they get bands too."""
    out = {f"mean_{k[4:]}": float(row[k]) for k in ("num_turns", "num_tool_calls") if _is_number(row.get(k))}
    if isinstance(row.get("extract_rule"), str):
        out["format_failure_rate"] = float(row["extract_rule"] == "none")
    return out


@lru_cache(maxsize=512)
def _load_examples(path: str, mtime: float) -> pd.DataFrame | None:
    rows = []
    for lineno, obj, why in json_rows(path):
        if why:
            raise AnalysisError(f"{path}:{lineno}: not valid JSON ({why})")
        metrics = obj.get("metrics") if isinstance(obj, dict) else None
        if not isinstance(metrics, dict) or "id" not in obj:
            raise AnalysisError(f"{path}:{lineno}: a line needs `id` and a `metrics` object")
        for k, v in metrics.items():
            if (why := metric_problem(k, v)) is not None:
                raise AnalysisError(f"{path}:{lineno}: metric {k} = {v!r}: {why}")
        skipped = obj.get("skipped_empty_gold") is True   # left out of the bench's means by evaluate: of its intervals too
        rows.append({"id": str(obj["id"]), **_behaviour(obj), **{k: math.nan if skipped else float(v) for k, v in metrics.items()}})
    if not rows:
        return None
    df = pd.DataFrame(rows)
    if df.id.duplicated().any():
        dup = df.id[df.id.duplicated()].iloc[0]
        raise AnalysisError(f"{path}: example id {dup!r} appears more than once")
    return df.set_index("id")


def example_metric(eval_dir: Path, bench: str, metric: str, problems: list[str] | None = None,
                   n: int | None = None) -> pd.Series | None:
    """Per-example values of `metric` (indexed by example id), or None when unavailable.

    Unavailable (no jsonl, no such metric, malformed file, rows other than the `n` items summary.json counts)
    is recorded in `problems` when given.
    """
    path = Path(eval_dir) / f"{bench}.jsonl"
    if not path.is_file():
        return None
    try:
        df = _load_examples(str(path), path.stat().st_mtime)
    except ValueError as exc:
        if problems is not None:
            problems.append(str(exc))
        return None
    if df is None:
        return None
    if n is not None and n > 0 and len(df) != n:
        if problems is not None:
            problems.append(f"{path}: {len(df)} rows, where summary.json counts n={n} (a rows file cut short or edited): "
                            "not used for intervals")
        return None
    return df[metric].dropna() if metric in df.columns else None
