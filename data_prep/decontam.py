"""Decontamination: n-gram overlap between training task/question text and evaluation questions.

Texts are lower-cased and split into word tokens. A training record overlaps an evaluation
question when they share an n-gram (default 13). Questions shorter than n words are matched as a
whole (their full word sequence appearing in the training text) when they have at least
MIN_SHORT_WORDS words — most QA questions are shorter than 13 words and would otherwise never match;
shorter ones (a phrase that short occurs by chance in long texts) match when the training record's
task/question equals them after normalization.

`bench_files(root)`: the files of the seven Search-R1 benches laid out as a bench_root
(`<root>/<bench>/*.jsonl`), what `data.decontam_bench_root` checks against (the named sets of
`data.decontam_sets` are files of the data cache, common.datafetch).
"""
from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path

from common.benchmarks import SEARCH7
from common.io import JsonLineError, parse_json_line, read_jsonl, sha256_file
from data_prep.errors import DataPrepError

MIN_SHORT_WORDS = 6
_WORD_RE = re.compile(r"\w+")


def words(text: str) -> list[str]:
    return _WORD_RE.findall(text.lower())


def bench_files(root: str | Path, key: str = "data.decontam_bench_root") -> list[str]:
    """Every `<root>/<bench>/*.jsonl` of the seven benches; a missing bench is a ConfigError naming `key`."""
    base = Path(root).expanduser().resolve()
    files, missing = [], []
    for bench in SEARCH7:
        found = sorted((base / bench).glob("*.jsonl")) if (base / bench).is_dir() else []
        if not found:
            missing.append(bench)
        files += [str(f) for f in found]
    if missing:
        raise DataPrepError(f"{key}={root}: no {base}/<bench>/*.jsonl for {', '.join(missing)} — put the benchmark files "
                            f"there (one <bench>/<file>.jsonl each), name the reference sets instead (data.decontam_sets), "
                            f"or set {key}=null to build without decontamination")
    return files


def bench_of(qid: str) -> str:
    """The bench an evaluation id belongs to (ids are `<bench dir>/<item id>`)."""
    return qid.split("/", 1)[0]


def load_questions(paths: list[str]) -> tuple[list[tuple[str, str]], list[dict]]:
    """[(eval id, question)] from FlashRAG / R1-Searcher jsonl files, plus file identities. An eval id
    is `<bench dir>/<item id>`; one id given to different questions (two files of a bench) is told apart
    as `<bench dir>/<item id>@<file>:<line>` (where each question was first read), and the same
    question read again under the same id (a sample of a set also given whole) is one question."""
    first: dict[tuple[str, str], str] = {}  # (eval id, question) -> file:line it was first read at
    files = []
    for p in paths:
        path = Path(p)
        files.append({"path": os.path.abspath(path), "sha256": sha256_file(path)})   # (its manifest names it from anywhere)
        for lineno, line in read_jsonl(path):
            try:
                row = parse_json_line(line)
            except JsonLineError as exc:
                raise DataPrepError(f"{path}:{lineno}: {exc}") from None
            if not isinstance(row, dict):
                raise DataPrepError(f"{path}:{lineno}: expected a JSON object, found {type(row).__name__}")
            q = row.get("question") or row.get("Question") or row.get("query")
            if not isinstance(q, str):
                raise DataPrepError(f"{path}:{lineno}: no `question` string")
            first.setdefault((f"{path.parent.name}/{row.get('id', row.get('idx', lineno))}", q), f"{path}:{lineno}")
    shared = Counter(qid for qid, _ in first)
    return [(qid if shared[qid] == 1 else f"{qid}@{where}", q) for (qid, q), where in first.items()], files


class Decontaminator:
    def __init__(self, questions: list[tuple[str, str]], n: int = 13):
        self.n = n
        self.grams: dict[int, dict[tuple[str, ...], list[str]]] = {}  # every question holding the n-gram
        self.exact: dict[tuple[str, ...], list[str]] = {}  # short questions: whole-text equality
        for qid, q in questions:
            w = words(q)
            if 0 < len(w) < MIN_SHORT_WORDS:
                self.exact.setdefault(tuple(w), []).append(qid)
            elif len(w) >= n:
                table = self.grams.setdefault(n, {})
                for gram in {tuple(w[i:i + n]) for i in range(len(w) - n + 1)}:
                    table.setdefault(gram, []).append(qid)
            elif len(w) >= MIN_SHORT_WORDS:
                self.grams.setdefault(len(w), {}).setdefault(tuple(w), []).append(qid)

    def matches(self, text: str) -> list[str]:
        """Evaluation ids whose n-grams (or whole question) occur in `text`, or whose short
        question (< MIN_SHORT_WORDS words) equals `text` after normalization."""
        w = words(text)
        hits: set[str] = set(self.exact.get(tuple(w), ()))
        for k, table in self.grams.items():
            for i in range(len(w) - k + 1):
                hits.update(table.get(tuple(w[i:i + k]), ()))
        return sorted(hits)
