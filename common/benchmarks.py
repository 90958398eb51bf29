"""The benchmark names and the QA bench file format, one definition for every stage: evals scores
the benches, rl trains on QA files of the same format, data_prep decontaminates training data
against the 7-bench.

A bench file is jsonl, one item per line, in one of two row formats:

    FlashRAG     {"id", "question", "golden_answers": [str, ...]}
    R1-Searcher  {"idx", "question", "answer"}  -> id f"{bench}_dev_{idx}", golden_answers [answer]
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from common.cli import ConfigError
from common.io import JsonLineError, parse_json_line, read_jsonl

SEARCH7 = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")


class BenchError(ConfigError):
    """A bench that can't be loaded: missing, ambiguous or malformed (the message names the file)."""


@dataclass
class BenchItem:
    id: str
    question: str
    golden_answers: list[str]
    extra: dict = field(default_factory=dict)


def parse_bench_row(row, bench: str, where: str) -> BenchItem:
    if not isinstance(row, dict):
        raise BenchError(f"{where}: expected a JSON object")
    question = row.get("question")
    if not isinstance(question, str) or not question.strip():
        raise BenchError(f"{where}: missing or empty \"question\"")
    if "golden_answers" in row:
        golds = row["golden_answers"]
        golds = [golds] if isinstance(golds, str) else golds
        if "id" not in row:
            raise BenchError(f"{where}: FlashRAG row without \"id\"")
        item_id = str(row["id"])
    elif "answer" in row and "idx" in row:
        golds, item_id = [row["answer"]], f"{bench}_dev_{row['idx']}"
    else:
        raise BenchError(f"{where}: unknown format (need id/question/golden_answers or idx/question/answer), keys {sorted(row)}")
    if not isinstance(golds, list) or not golds or not all(isinstance(g, str) for g in golds):
        raise BenchError(f"{where}: golden answers must be a non-empty list of strings, got {golds!r}")
    return BenchItem(item_id, question.strip(), list(golds))


def read_bench_file(path: Path, bench: str) -> list[BenchItem]:
    items, seen = [], set()
    try:
        lines = list(read_jsonl(path))
    except JsonLineError as exc:
        raise BenchError(str(exc)) from None
    except OSError as exc:
        raise BenchError(f"{path}: cannot read ({exc.strerror or exc})") from None
    for lineno, line in lines:
        where = f"{path}:{lineno}"
        try:
            row = parse_json_line(line)
        except JsonLineError as exc:
            raise BenchError(f"{where}: {exc}") from None
        item = parse_bench_row(row, bench, where)
        if item.id in seen:
            raise BenchError(f"{where}: duplicate id {item.id!r}")
        seen.add(item.id)
        items.append(item)
    if not items:
        raise BenchError(f"{path}: no items")
    return items
