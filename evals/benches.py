"""Benchmark loaders: a bench's named item set (the default), or a user's own files under `bench_root`.

Named item sets (`bench_set`): without `bench_root`, each bench reads the set `sets` names for it,
else its `DEFAULT_SETS` entry: a reference file the project fetches (`common.datafetch`:
`nq:seed42_1000`, `hotpotqa:r1searcher_500`, ..., downloaded and checked on first use, then read
from the cache `$DTSFT_DATA`), or a hub set: `<bench>:hub` (FlashRAG's split), or the original-format
dev sets of `HUB_CONTEXT` (`musique:hub_ans_dev`, ...; the defaults of modes item/given). The hub is
read only when a hub set is named, and through the same downloader and cache (a hub set is a file of
`common.datafetch`; one whose commit and sha256 are not measured, `UNPINNED`, is refused until the
user pre-fills it with `fetch-data NAME from=DIR`).

`bench_root=DIR` (a user's own files): `<bench_root>/<bench>/*.jsonl`, one file per bench (a `test*`
file wins over `dev*` when there are several), in the row formats of `common.benchmarks` (FlashRAG
or R1-Searcher; `read_bench_file` is defined there, since rl reads QA files of the same format).

Any other `<bench_root>/<name>/` in FlashRAG format works too (e.g. the synthetic `synthqa`). A
bench that `bench_root` does not hold is an error naming the path looked for, never the hub.

A bench is named `NAME[@MODE]` (`common.benchmarks.parse_bench_key`): plain `musique` is context
mode `open` (FlashRAG's hub rows, search over a corpus); `musique@item` / `musique@given` read the
same `<bench_root>/musique/` file, which must then carry each item's paragraphs (the original
dev-set formats; anything else is refused naming the file), or the original dev sets from the
hub (`HUB_CONTEXT`). Items with `answerable: false` (MuSiQue-Full) are left out
before sampling, and counted (`unanswerable_excluded` in the summary and meta.json).

A named set's identity is its name, pinned source and digest (`datafetch.digest`: the table's, or
for a pre-filled unpinned hub set the one measured when it was pre-filled).

Sampling N: a seeded shuffle of the whole split, first N (`random.Random(seed).shuffle`, as the
upstream subsampler). Files that already *are* such a sample are kept in order and cut to N:
`*_seed<seed>_<N>.jsonl` (same seed) and R1-Searcher's `*r1searcher*` dev samples; this makes
the first 500 of `nq/test_seed42_1000.jsonl` exactly Search-R1's 500. N larger than the split
(Bamboogle has 125) takes everything.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path

# the bench file format (BenchItem, read_bench_file, BenchError) is common's: rl reads QA files too
from common import datafetch
from common.cli import did_you_mean
from common.benchmarks import (SEARCH7, BenchError, BenchItem, check_context_mode, parse_bench_key,  # noqa: F401
                               parse_bench_row, parse_bench_rows, read_bench_file)

OOD_BENCH = "search_plan_ood"
BABYAI_BENCH = "babyai"
# FlashRAG_datasets split of each bench: the hub set `<bench>:hub` (common.datafetch, <bench>/<split>.jsonl).
HUB_SPLITS = {
    "nq": "test", "triviaqa": "test", "popqa": "test", "bamboogle": "test",
    "hotpotqa": "dev", "2wikimultihopqa": "dev", "musique": "dev",
}
HUB_REPO = "RUC-NLPIR/FlashRAG_datasets"


@dataclass(frozen=True)
class HubContext:
    """An original-format dev set on the hub (context modes item/given): its `common.datafetch` name and
    the item count it must have (a file with another count is refused: not the dev set the reference
    sizes name)."""
    name: str
    rows: int


# Each a hub file of common.datafetch (fetched through the one downloader); their commits and digests
# are NOT measured (datafetch.UNPINNED: no hub access): until they are, each is pre-filled by the user.
HUB_CONTEXT = {
    "musique": HubContext("musique:hub_ans_dev", 2417),               # MuSiQue-Ans v1.0 dev, 20 paragraphs each
    "2wikimultihopqa": HubContext("2wikimultihopqa:hub_dev", 12576),  # 2WikiMultihopQA dev.json, 10 each
    "hotpotqa": HubContext("hotpotqa:hub_distractor_dev", 7405),      # HotpotQA distractor dev, 10 each
}


HUB_SET = "hub"   # the set `<bench>:hub`: FlashRAG's split (HUB_SPLITS) of the bench
# The set each bench reads when none is named (`sets`) and no bench_root is given.
DEFAULT_SETS = {
    "nq": "nq:seed42_1000", "triviaqa": "triviaqa:seed42_1000", "popqa": "popqa:seed42_1000",
    "bamboogle": "bamboogle:test", "hotpotqa": "hotpotqa:r1searcher_500",
    "2wikimultihopqa": "2wikimultihopqa:r1searcher_500", "musique": "musique:r1searcher_500",
    **{f"{b}@{m}": src.name for b, src in HUB_CONTEXT.items() for m in ("item", "given")},
}


def set_names(key: str) -> list[str]:
    """The item sets bench `key` (`NAME[@MODE]`) can read: the fetched files of its bench (its hub sets
    among them)."""
    bench = parse_bench_key(key)[0]
    return [n for n in datafetch.names() if n.split(":", 1)[0] == bench]


def bench_set(key: str, bench_root, sets=None) -> str | None:
    """The named item set bench `key` reads: None with `bench_root` (its files), else `sets[key]` or the
    default; a bench with neither, or a name that is not one of its sets, is a BenchError."""
    if bench_root:
        return None
    name = (sets or {}).get(key) or DEFAULT_SETS.get(key)
    known = set_names(key)
    if name is None:
        raise BenchError(f"bench {key!r} has no default item set: name one (sets={{{key}: NAME}}, NAME one of "
                         f"{', '.join(known) or 'none known'}) or pass bench_root=DIR with {parse_bench_key(key)[0]}/<file>.jsonl")
    if name not in known:
        hint = did_you_mean(str(name), known) if known else ""
        raise BenchError(f"sets.{key}={name!r}: not an item set of {key} (known: {', '.join(known) or 'none'}).{hint}")
    return name


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


def _missing(bench_root, key: str) -> BenchError:
    bench = parse_bench_key(key)[0]
    d = Path(bench_root) / bench
    found = sorted(p.name for p in d.iterdir()) if d.is_dir() else None
    held = f"it holds {found} (one <file>.jsonl is read)" if found else ("it is empty" if d.is_dir() else "there is no such directory")
    return BenchError(f"bench_root={bench_root} does not hold bench {key!r}: looked for {d}/*.jsonl; {held}")


def bench_source(key: str, bench_root: str | Path | None, *, resolve: bool = True, sets=None, fetch: bool = True) -> str:
    """Where QA bench `key` (`NAME[@MODE]`) comes from, without loading it: its file under `bench_root`,
    else its named set's cached file (fetched first; `fetch=False`: its place in the cache, present or
    not; `resolve=False` fetches nothing and returns the set's name when it is not cached)."""
    bench = parse_bench_key(key)[0]
    if bench_root:
        path = bench_file(bench_root, bench)
        if path is None:
            raise _missing(bench_root, key)
        return str(path)
    name = bench_set(key, None, sets)
    if not fetch:
        return str(datafetch.local_path(name))
    return str(datafetch.path(name) if resolve else (datafetch.cached(name) or name))


def load_bench(key: str, bench_root: str | Path | None, n: int | None,
               seed: int, sets=None) -> tuple[list[BenchItem], str, int]:
    """(sampled items, where they came from, unanswerable items left out) for QA bench `key`
    (`NAME[@MODE]`): a file under `bench_root`, else its named set (`bench_set`); items without
    paragraphs are refused for modes item/given."""
    bench, mode = parse_bench_key(key)
    name = bench_set(key, bench_root, sets)
    try:
        path = Path(bench_source(key, bench_root, sets=sets))
    except datafetch.DataError as exc:   # a hub set not pinned here (or offline): say what to do instead
        if name is None or datafetch.entry(name).host != "hub" or datafetch.local_path(name).is_file():
            raise   # not a hub set, or one cached that changed: the data error as it is
        raise BenchError(f"could not load {bench} from the hub ({name}): {exc}. Name a fetched set instead "
                         f"(sets={{{key}: NAME}}, `fetch-data --help` lists them)") from None
    items, source, presampled = read_bench_file(path, bench), str(path), is_presampled(path, seed)
    hub = HUB_CONTEXT.get(bench)
    if hub is not None and name == hub.name and len(items) != hub.rows:
        raise BenchError(f"{source} ({name}): {len(items)} rows, expected {hub.rows}; not the dev set the reference "
                         f"sizes name (pass bench_root=DIR with the file you mean)")
    check_context_mode(items, mode, source)
    answerable = [it for it in items if it.answerable]
    return sample(answerable, n, seed, presampled), source, len(items) - len(answerable)


def bench_size(cfg, bench: str) -> int:
    """The n asked for `bench` (`cfg`: a resolved evaluate config): `bench_n[bench]` when given, else `n` (<= 0 means every item)."""
    return int(cfg.bench_n[bench]) if bench in cfg.bench_n else int(cfg.n)
