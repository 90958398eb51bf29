"""Benchmark loaders: local files under `bench_root` first, the FlashRAG hub datasets otherwise.

Layout (as in ../shared/benchmarks): `<bench_root>/<bench>/*.jsonl`, one file per bench (a `test*`
file wins over `dev*` when there are several), in the row formats of `common.benchmarks` (FlashRAG
or R1-Searcher; `read_bench_file` is defined there, since rl reads QA files of the same format).

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
from pathlib import Path

# the bench file format (BenchItem, read_bench_file, BenchError) is common's: rl reads QA files too
from common.benchmarks import SEARCH7, BenchError, BenchItem, parse_bench_row, read_bench_file  # noqa: F401  (evals.benches API)

OOD_BENCH = "search_plan_ood"
BABYAI_BENCH = "babyai"
ENV_BENCHES = (OOD_BENCH, BABYAI_BENCH)  # benches that bring their own environment (no retriever, no file)
# FlashRAG_datasets config and split used for each bench when loading from the hub.
HUB_SPLITS = {
    "nq": "test", "triviaqa": "test", "popqa": "test", "bamboogle": "test",
    "hotpotqa": "dev", "2wikimultihopqa": "dev", "musique": "dev",
}
HUB_REPO = "RUC-NLPIR/FlashRAG_datasets"


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
    return [parse_bench_row(dict(row), bench, f"{HUB_REPO}/{bench}[{i}]") for i, row in enumerate(ds)]


def bench_source(bench: str, bench_root: str | Path | None) -> str:
    """Where a QA bench's items come from: its file under `bench_root`, else `hub:<repo>/<bench>/<split>`."""
    path = bench_file(bench_root, bench) if bench_root else None
    if path is not None:
        return str(path)
    if bench_root and bench not in HUB_SPLITS:
        raise BenchError(f"no {Path(bench_root) / bench}/*.jsonl for bench {bench!r}")
    if bench not in HUB_SPLITS:
        raise BenchError(f"bench {bench!r} is not on the hub ({HUB_REPO}); put it under bench_root=DIR/{bench}/")
    return f"hub:{HUB_REPO}/{bench}/{HUB_SPLITS[bench]}"


def load_bench(bench: str, bench_root: str | Path | None, n: int | None, seed: int) -> tuple[list[BenchItem], str]:
    """(sampled items, where they came from) for a QA bench."""
    source = bench_source(bench, bench_root)
    if not source.startswith("hub:"):
        path = Path(source)
        return sample(read_bench_file(path, bench), n, seed, is_presampled(path, seed)), source
    return sample(_load_hub(bench), n, seed, presampled=False), source
