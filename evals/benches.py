"""Benchmark loaders: a bench's named item set (the default), or a user's own files under `bench_root`.

Named item sets (`bench_set`): without `bench_root`, each bench reads the set `sets` names for it,
else its `DEFAULT_SETS` entry: a reference file the project fetches (`common.datafetch`:
`nq:seed42_1000`, `hotpotqa:r1searcher_500`, ..., downloaded and checked on first use, then read
from the cache `$DTSFT_DATA`), or a hub set `<bench>:hub` (FlashRAG's split in context mode open,
the original-format dev set in modes item/given). The hub is read only when a hub set is named.

`bench_root=DIR` (a user's own files): `<bench_root>/<bench>/*.jsonl`, one file per bench (a `test*`
file wins over `dev*` when there are several), in the row formats of `common.benchmarks` (FlashRAG
or R1-Searcher; `read_bench_file` is defined there, since rl reads QA files of the same format).

Any other `<bench_root>/<name>/` in FlashRAG format works too (e.g. the synthetic `synthqa`). A
bench that `bench_root` does not hold is an error naming the path looked for, never the hub.

A bench is named `NAME[@MODE]` (`common.benchmarks.parse_bench_key`): plain `musique` is context
mode `open` (FlashRAG's hub rows, search over a corpus); `musique@item` / `musique@given` read the
same `<bench_root>/musique/` file, which must then carry each item's paragraphs (the original
dev-set formats; anything else is refused naming the file), or the original dev sets from the
hub (`HUB_CONTEXT`, the sets `<bench>:hub`). Items with `answerable: false` (MuSiQue-Full) are left out
before sampling, and counted (`unanswerable_excluded` in the summary and meta.json).

A hub bench's source names the dataset revision it was read at (`...@<commit>`), so the revision
is part of the bench's identity (evals.identity hashes the source string of a non-file source).

Sampling N: a seeded shuffle of the whole split, first N (`random.Random(seed).shuffle`, as the
upstream subsampler). Files that already *are* such a sample are kept in order and cut to N:
`*_seed<seed>_<N>.jsonl` (same seed) and R1-Searcher's `*r1searcher*` dev samples; this makes
the first 500 of `nq/test_seed42_1000.jsonl` exactly Search-R1's 500. N larger than the split
(Bamboogle has 125) takes everything.
"""
from __future__ import annotations

import json
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
ENV_BENCHES = (OOD_BENCH, BABYAI_BENCH)  # benches that bring their own environment (no retriever, no file)
# FlashRAG_datasets config and split used for each bench when loading from the hub.
HUB_SPLITS = {
    "nq": "test", "triviaqa": "test", "popqa": "test", "bamboogle": "test",
    "hotpotqa": "dev", "2wikimultihopqa": "dev", "musique": "dev",
}
HUB_REPO = "RUC-NLPIR/FlashRAG_datasets"


@dataclass(frozen=True)
class HubSource:
    """An original-format dev set on the hub (context modes item/given): a file of the dataset repo
    (`file`) or a `datasets` config/split; `revision` pins the commit; `rows` the item count it must have."""
    repo: str
    revision: str | None
    rows: int
    file: str | None = None
    config: str | None = None
    split: str | None = None


# Chosen here without hub access: names, revisions and row counts are NOT verified on this machine
# (a count that differs on load is an error, so a wrong pin cannot pass silently).
HUB_CONTEXT = {
    # MuSiQue-Ans v1.0 dev in the original format (20 paragraphs per item), not FlashRAG's.
    "musique": HubSource("dgslibisey/MuSiQue", "c8f4f8c", 2417, file="musique_ans_v1.0_dev.jsonl"),
    # 2WikiMultihopQA dev.json (a JSON array of the original rows, 10 paragraphs each).
    "2wikimultihopqa": HubSource("kamelliao/2wikimultihopqa", "f4f0d7e4ae275d9281e90c46c93e66d6cdda3674", 12576,
                                 file="data/dev.json"),
    # HotpotQA distractor dev (the hub's layout of hotpot_dev_distractor_v1.json); no pin chosen: the
    # commit it resolves to is recorded in the source (and so the identity).
    "hotpotqa": HubSource("hotpotqa/hotpot_qa", None, 7405, config="distractor", split="validation"),
}


HUB_SET = "hub"   # the set `<bench>:hub`: the hub's rows (HUB_SPLITS in mode open, HUB_CONTEXT in item/given)
# The set each bench reads when none is named (`sets`) and no bench_root is given.
DEFAULT_SETS = {
    "nq": "nq:seed42_1000", "triviaqa": "triviaqa:seed42_1000", "popqa": "popqa:seed42_1000",
    "bamboogle": "bamboogle:test", "hotpotqa": "hotpotqa:r1searcher_500",
    "2wikimultihopqa": "2wikimultihopqa:r1searcher_500", "musique": "musique:r1searcher_500",
    **{f"{b}@{m}": f"{b}:{HUB_SET}" for b in HUB_CONTEXT for m in ("item", "given")},
}


def set_names(key: str) -> list[str]:
    """The item sets bench `key` (`NAME[@MODE]`) can read: the fetched files of its bench, its hub set."""
    bench, mode = parse_bench_key(key)
    hub = HUB_SPLITS if mode == "open" else HUB_CONTEXT
    return [n for n in datafetch.TABLE if n.split(":", 1)[0] == bench] + ([f"{bench}:{HUB_SET}"] if bench in hub else [])


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


def dataset_revision(repo: str, revision: str | None) -> str:
    """The commit `revision` (None: the default branch) of a hub dataset resolves to: a full commit
    as is, else the local hub cache's snapshot, else the hub's answer."""
    if revision and re.fullmatch(r"[0-9a-f]{40}", revision):
        return revision
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo, repo_type="dataset", revision=revision, local_files_only=True,
                                      allow_patterns=["README.md"])).name
    except Exception:  # not cached: ask the hub
        pass
    from huggingface_hub import HfApi

    sha = HfApi().dataset_info(repo, revision=revision).sha
    if not sha:
        raise BenchError(f"the hub did not say which commit {repo}@{revision or 'main'} is")
    return sha


def _load_hub(bench: str) -> tuple[list[BenchItem], str]:
    if bench not in HUB_SPLITS:
        raise BenchError(f"bench {bench!r} is not on the hub ({HUB_REPO}); put it under bench_root=DIR/{bench}/")
    try:
        from datasets import load_dataset

        revision = dataset_revision(HUB_REPO, None)
        ds = load_dataset(HUB_REPO, bench, split=HUB_SPLITS[bench], revision=revision)
    except Exception as exc:  # offline, gated, renamed: say what to do instead
        raise BenchError(
            f"could not load {bench} from the hub ({HUB_REPO}, split {HUB_SPLITS[bench]}): {exc}. "
            f"Name a fetched set instead (sets={{{bench}: NAME}}, `fetch-data --help` lists them) or pass "
            f"bench_root=DIR with {bench}/<file>.jsonl."
        ) from exc
    items = [parse_bench_row(dict(row), bench, f"{HUB_REPO}/{bench}[{i}]") for i, row in enumerate(ds)]
    return items, f"hub:{HUB_REPO}/{bench}/{HUB_SPLITS[bench]}@{revision}"


def _load_hub_context(bench: str, mode: str) -> tuple[list[BenchItem], str]:
    """An original-format dev set (its paragraphs kept) from `HUB_CONTEXT`."""
    src = HUB_CONTEXT.get(bench)
    if src is None:
        raise BenchError(f"bench {bench!r} has no original-format dev set on the hub for context mode {mode!r}; "
                         f"put it under bench_root=DIR/{bench}/ in an original format")
    what = src.file or f"{src.config}/{src.split}"
    try:
        revision = dataset_revision(src.repo, src.revision)
        if src.file:
            from huggingface_hub import hf_hub_download

            path = Path(hf_hub_download(src.repo, src.file, repo_type="dataset", revision=revision))
            if path.suffix == ".jsonl":
                items = read_bench_file(path, bench)
            else:
                rows = json.loads(path.read_text(encoding="utf-8"))
                items = parse_bench_rows(((f"{src.repo}/{src.file}[{i}]", r) for i, r in enumerate(rows)), bench,
                                         f"{src.repo}/{src.file}")
        else:
            from datasets import load_dataset

            ds = load_dataset(src.repo, src.config, split=src.split, revision=revision)
            items = parse_bench_rows(((f"{src.repo}/{what}[{i}]", dict(r)) for i, r in enumerate(ds)), bench,
                                     f"{src.repo}/{what}")
    except BenchError:
        raise
    except Exception as exc:  # offline, renamed, a pin that does not resolve
        raise BenchError(
            f"could not load {bench}@{mode} from the hub ({src.repo} {what} @ {src.revision or 'main'}): {exc}. "
            f"Pass bench_root=DIR with {bench}/<file>.jsonl in the original format (`fetch-data --help` lists samples)."
        ) from exc
    if len(items) != src.rows:
        raise BenchError(f"{src.repo} {what} @ {revision}: {len(items)} rows, expected {src.rows}; not the dev set "
                         f"the reference sizes name (pass bench_root=DIR with the file you mean)")
    return items, f"hub:{src.repo}/{what}@{revision}"


def _missing(bench_root, key: str) -> BenchError:
    bench = parse_bench_key(key)[0]
    d = Path(bench_root) / bench
    found = sorted(p.name for p in d.iterdir()) if d.is_dir() else None
    held = f"it holds {found} (one <file>.jsonl is read)" if found else ("it is empty" if d.is_dir() else "there is no such directory")
    return BenchError(f"bench_root={bench_root} does not hold bench {key!r}: looked for {d}/*.jsonl; {held}")


def bench_source(key: str, bench_root: str | Path | None, *, resolve: bool = True, sets=None, fetch: bool = True) -> str:
    """Where QA bench `key` (`NAME[@MODE]`) comes from, without loading it: its file under `bench_root`,
    else its named set's cached file (fetched first; `fetch=False`: its place in the cache, present or
    not; `resolve=False` fetches nothing and returns the set's name when it is not cached), or its hub source (`hub:<repo>/<what>@<commit>`, the string the
    loader records; `resolve=False` leaves the commit off and asks nothing of the hub)."""
    bench, mode = parse_bench_key(key)
    if bench_root:
        path = bench_file(bench_root, bench)
        if path is None:
            raise _missing(bench_root, key)
        return str(path)
    name = bench_set(key, None, sets)
    if name in datafetch.TABLE:
        if not fetch:
            return str(datafetch.local_path(name))
        return str(datafetch.path(name) if resolve else (datafetch.cached(name) or name))
    if mode == "open":
        repo, what, pin = HUB_REPO, f"{bench}/{HUB_SPLITS[bench]}", None
    else:
        src = HUB_CONTEXT[bench]
        repo, what, pin = src.repo, src.file or f"{src.config}/{src.split}", src.revision
    if not resolve:
        return f"hub:{repo}/{what}"
    try:
        return f"hub:{repo}/{what}@{dataset_revision(repo, pin)}"
    except BenchError:
        raise
    except Exception as exc:  # offline: the identity of a hub bench needs its commit
        raise BenchError(f"cannot resolve the hub commit of {key} ({repo} @ {pin or 'main'}): {exc}. "
                         f"Name a fetched set (sets={{{key}: NAME}}) or pass bench_root=DIR with {bench}/<file>.jsonl.") from exc


def load_bench(key: str, bench_root: str | Path | None, n: int | None, seed: int, sets=None) -> tuple[list[BenchItem], str]:
    """(sampled items, where they came from) for QA bench `key` (`NAME[@MODE]`)."""
    items, source, _ = load_bench_counted(key, bench_root, n, seed, sets)
    return items, source


def load_bench_counted(key: str, bench_root: str | Path | None, n: int | None,
                       seed: int, sets=None) -> tuple[list[BenchItem], str, int]:
    """(sampled items, where they came from, unanswerable items left out) for QA bench `key`
    (`NAME[@MODE]`): a file under `bench_root`, else its named set (`bench_set`); items without
    paragraphs are refused for modes item/given."""
    bench, mode = parse_bench_key(key)
    name = bench_set(key, bench_root, sets)
    if name is None or name in datafetch.TABLE:
        path = Path(bench_source(key, bench_root, sets=sets))
        items, source, presampled = read_bench_file(path, bench), str(path), is_presampled(path, seed)
    else:
        items, source = _load_hub(bench) if mode == "open" else _load_hub_context(bench, mode)
        presampled = False
    check_context_mode(items, mode, source)
    answerable = [it for it in items if it.answerable]
    return sample(answerable, n, seed, presampled), source, len(items) - len(answerable)
