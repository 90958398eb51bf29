"""Benchmark loaders: local files under `bench_root` first, the FlashRAG hub datasets otherwise.

Layout (as in ../shared/benchmarks): `<bench_root>/<bench>/*.jsonl`, one file per bench (a `test*`
file wins over `dev*` when there are several). Two row formats are read:

    FlashRAG     {"id", "question", "golden_answers": [str, ...]}
    R1-Searcher  {"idx", "question", "answer"}  -> id f"{bench}_dev_{idx}", golden_answers [answer]

Any other `<bench_root>/<name>/` in FlashRAG format works too (e.g. the synthetic `synthqa`).

Sampling N: a seeded shuffle of the whole split, first N (`random.Random(seed).shuffle`, as the
upstream subsampler). Files that already *are* such a sample are kept in order and cut to N:
`*_seed<seed>_<N>.jsonl` (same seed) and R1-Searcher's `*r1searcher*` dev samples; this makes
the first 500 of `nq/test_seed42_1000.jsonl` exactly Search-R1's 500. N larger than the split
(Bamboogle has 125) takes everything.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from pathlib import Path

from common.benchmarks import SEARCH7  # noqa: F401  (evals.benches.SEARCH7 is public API)
from common.io import JsonLineError, parse_json_line, read_jsonl
OOD_BENCH = "search_plan_ood"
BABYAI_BENCH = "babyai"
ENV_BENCHES = (OOD_BENCH, BABYAI_BENCH)  # benches that bring their own environment (no retriever, no file)
# FlashRAG_datasets config and split used for each bench when loading from the hub.
HUB_SPLITS = {
    "nq": "test", "triviaqa": "test", "popqa": "test", "bamboogle": "test",
    "hotpotqa": "dev", "2wikimultihopqa": "dev", "musique": "dev",
}
HUB_REPO = "RUC-NLPIR/FlashRAG_datasets"


class BenchError(ValueError):
    """A bench that can't be loaded: missing, ambiguous or malformed (the message names the file)."""


@dataclass
class BenchItem:
    id: str
    question: str
    golden_answers: list[str]
    extra: dict = field(default_factory=dict)


def _parse_row(row, bench: str, where: str) -> BenchItem:
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


def bench_file(bench_root: str | Path, bench: str) -> Path | None:
    d = Path(bench_root) / bench
    if not d.is_dir():
        return None
    files = sorted(d.glob("*.jsonl"))
    for prefix in ("test", "dev"):
        preferred = [f for f in files if f.name.startswith(prefix)]
        if preferred:
            files = preferred
            break
    if len(files) > 1:
        raise BenchError(f"{d}: several candidate files {[f.name for f in files]}; keep one")
    return files[0] if files else None


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
        item = _parse_row(row, bench, where)
        if item.id in seen:
            raise BenchError(f"{where}: duplicate id {item.id!r}")
        seen.add(item.id)
        items.append(item)
    if not items:
        raise BenchError(f"{path}: no items")
    return items


def is_presampled(path: Path, seed: int) -> bool:
    m = re.search(r"_seed(\d+)_\d+", path.stem)
    return (m is not None and int(m.group(1)) == seed) or "r1searcher" in path.stem


def sample(items: list[BenchItem], n: int | None, seed: int, presampled: bool) -> list[BenchItem]:
    items = list(items)
    if not presampled:
        random.Random(seed).shuffle(items)
    return items if not n or n < 0 else items[:n]


def _load_hub(bench: str) -> list[BenchItem]:
    if bench not in HUB_SPLITS:
        raise BenchError(f"bench {bench!r} is not on the hub ({HUB_REPO}); put it under bench_root=DIR/{bench}/")
    try:
        from datasets import load_dataset

        ds = load_dataset(HUB_REPO, bench, split=HUB_SPLITS[bench])
    except Exception as exc:  # offline, gated, renamed: say what to do instead
        raise BenchError(
            f"could not load {bench} from the hub ({HUB_REPO}, split {HUB_SPLITS[bench]}): {exc}. "
            f"Pass bench_root=DIR with {bench}/<file>.jsonl (see ../shared/benchmarks)."
        ) from exc
    return [_parse_row(dict(row), bench, f"{HUB_REPO}/{bench}[{i}]") for i, row in enumerate(ds)]


def load_bench(bench: str, bench_root: str | Path | None, n: int | None, seed: int) -> tuple[list[BenchItem], str]:
    """(sampled items, where they came from) for a QA bench."""
    path = bench_file(bench_root, bench) if bench_root else None
    if path is not None:
        return sample(read_bench_file(path, bench), n, seed, is_presampled(path, seed)), str(path)
    if bench_root and bench not in HUB_SPLITS:
        raise BenchError(f"no {Path(bench_root) / bench}/*.jsonl for bench {bench!r}")
    return sample(_load_hub(bench), n, seed, presampled=False), f"hub:{HUB_REPO}/{bench}/{HUB_SPLITS[bench]}"
