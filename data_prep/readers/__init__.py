"""Source readers: `FORMAT:PATH_OR_HUB_ID` -> canonical records (or quarantined rejections).

FORMAT is one of FORMATS. PATH is a local .jsonl / .json (one row, a list of rows, or JSON Lines) / .parquet file (or a directory of
them, not its subdirectories; those of `#split` when their names name splits: docs/formats.md);
anything else is a Hugging Face dataset id, optionally `ID@REVISION` (a commit sha, tag or branch)
and `#split` (default split `train`): `ID@REV#split`. A trailing `~SHARE` (a fraction in (0, 1])
fixes the share of its domain's quota that this source supplies (data_prep.build): either
every source of a domain has one (summing to 1) or none has (the sources are pooled).
Every row read yields exactly one outcome — a record or a rejection with a reason — so the totals
always add up.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from common.io import JsonLineError, parse_json_line, sha256_file
from data_prep.config import FORMATS
from data_prep.readers import canonical, openseeker, r2e_gym, search_r1, swe_gym, swe_smith
from data_prep.schema import RecordError, quarantine_detail
from data_prep.errors import DataPrepError

PARSERS = {   # one per FORMATS (data.sources.*' rule, data_prep.config)
    "r2e-gym": r2e_gym.parse,
    "swe-gym": swe_gym.parse,
    "swe-smith": swe_smith.parse,
    "openseeker": openseeker.parse,
    "search-r1": search_r1.parse,
    "canonical": canonical.parse,
}
LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")
_ID_KEYS = ("id", "traj_id", "instance_id")
# A local directory's split, as the Hub's layout names files (datasets.data_files' rule: a keyword at the start of the
# name or between separators, e.g. train.parquet, data-test-00000.jsonl, my_dev-0.jsonl)
_SPLIT_WORDS = {"train": "train|training", "validation": "validation|valid|dev|val", "test": "test|testing|eval|evaluation"}


def _unread_data(f: Path) -> bool:
    """A file of a source directory holding rows the readers do not read: compressed JSON Lines / JSON / Parquet
    (`train.jsonl.gz`), or Arrow (`datasets`' own files)."""
    return f.suffix not in LOCAL_SUFFIXES and (f.suffix == ".arrow" or any(s in LOCAL_SUFFIXES for s in f.suffixes))


def splits_of(name: str) -> set[str]:
    """The splits a file named `name` is part of in the Hub's layout (`train_test.jsonl`: both, as in datasets)."""
    return {s for s, words in _SPLIT_WORDS.items() if re.search(rf"(^|[-._ 0-9])({words})[-._ 0-9]", name)}


class SourceError(DataPrepError):
    """A source spec that can't be read at all (unknown format, missing file)."""


@dataclass(frozen=True)
class Source:
    format: str
    location: str
    split: str = "train"
    revision: str | None = None   # hub commit (ID@REV); launch pins it at the first launch
    share: float | None = None    # `~SHARE`: this source's fraction of its domain's quota; None: pooled

    @property
    def is_local(self) -> bool:
        return Path(self.location).exists()

    def reads(self) -> tuple:
        """What the source reads, however it was spelled (a local path resolved; its share aside)."""
        where = os.path.realpath(self.location) if self.is_local else self.location
        return self.format, where, self.split, self.revision

    def files(self) -> list[Path]:
        """A file; a directory's data files, those of the split (`#split`, `a+b`) when their names name splits."""
        p = Path(self.location)
        if p.is_dir() and (unread := sorted(f for f in p.iterdir() if _unread_data(f))):
            raise SourceError(f"{unread[0]}: a data file ({''.join(unread[0].suffixes)}) the readers do not read, so its rows "
                              f"would be counted nowhere: decompress it or move it out (read: {', '.join(LOCAL_SUFFIXES)})")
        found = sorted(f for f in p.iterdir() if f.suffix in LOCAL_SUFFIXES) if p.is_dir() else [p]
        named = {f: splits_of(f.name) for f in found} if p.is_dir() else {}
        if not any(named.values()):
            if self.split != "train" and self.is_local:
                raise SourceError(f"{p} is read whole (no file of it names a split), so #{self.split} cannot pick one")
            return found
        if unnamed := [str(f) for f, s in named.items() if not s]:
            raise SourceError(f"{unnamed[0]} names no split, beside files that do ({', '.join(f.name for f, s in named.items() if s)}): "
                              f"rename it train-*, test-* or validation-*, or move it out")
        for want in (wanted := set(self.split.split("+"))):
            if not any(want in s for s in named.values()):
                raise SourceError(f"{p} has no {want!r} split (its files name {', '.join(sorted(set().union(*named.values())))})")
        return [f for f, s in named.items() if s & wanted]

    def identity(self) -> dict:
        """What the cache key / manifest records: local files with sha256, hub ids as given."""
        share = {"share": self.share} if self.share is not None else {}
        if self.is_local:
            return {"format": self.format, "files": [{"path": str(f), "sha256": sha256_file(f)} for f in self.files()],
                    **share}
        pinned = {"revision": self.revision} if self.revision else {}
        return {"format": self.format, "hub_id": self.location, "split": self.split, **pinned, **share}


def spec_parts(spec: str, exists: Callable[[str], bool]) -> tuple[str, str, str, str, str]:
    """`FORMAT:LOCATION[@REVISION][#SPLIT][~SHARE]` as written: (FORMAT, LOCATION, @REVISION, #SPLIT, ~SHARE), each part
    with its mark ('' where absent); one is cut off only while the rest names no path that `exists` (then its `~`, `#`
    or `@` is its name's), and a `~` a `/` follows is a home directory, not a share."""
    fmt, _, loc = str(spec).partition(":")
    cut = {}
    for mark in "~#@":
        at = loc.find(mark) if mark == "#" else loc.rfind(mark)
        if at >= 0 and not exists(loc) and not (mark == "~" and "/" in loc[at:]):
            loc, cut[mark] = loc[:at], loc[at:]
    return fmt, loc, cut.get("@", ""), cut.get("#", ""), cut.get("~", "")


def parse_source(spec: str) -> Source:
    fmt, loc, revision, split, share = spec_parts(spec, lambda p: os.path.exists(os.path.expanduser(p)))
    if ":" not in str(spec) or not loc + revision + split + share:
        raise SourceError(f"source {spec!r}: expected FORMAT:PATH_OR_HUB_ID with FORMAT in {', '.join(FORMATS)}")
    if fmt not in PARSERS:
        raise SourceError(f"source {spec!r}: unknown format {fmt!r} (known: {', '.join(FORMATS)})")
    try:
        fraction = float(share[1:]) if share else None
    except ValueError:
        fraction = 0
    if share and not (loc + revision + split and 0 < fraction <= 1):
        raise SourceError(f"source {spec!r}: expected SOURCE~SHARE with SHARE a fraction in (0, 1], got {share[1:]!r}")
    if revision and not (loc and revision[1:]):
        raise SourceError(f"source {spec!r}: expected HUB_ID@REVISION (a commit sha, tag or branch)")
    loc, split, revision = os.path.expanduser(loc), split[1:] if split else "train", revision[1:] or None
    if not Path(loc).exists() and (loc.startswith((".", "/")) or Path(loc).suffix in LOCAL_SUFFIXES):
        raise SourceError(f"source {spec!r}: no such file {loc}")
    if Path(loc).is_file() and Path(loc).suffix not in LOCAL_SUFFIXES:
        raise SourceError(f"source {spec!r}: {loc} is not a {', '.join(LOCAL_SUFFIXES[:-1])} or {LOCAL_SUFFIXES[-1]} file")
    try:
        files = (src := Source(fmt, loc, split, revision, fraction)).files()
    except SourceError as exc:
        raise SourceError(f"source {spec!r}: {exc}") from None
    if not files:
        raise SourceError(f"source {spec!r}: {loc} is a directory holding no {'/'.join(LOCAL_SUFFIXES)} file (its subdirectories are not read)")
    return src


@dataclass
class Outcome:
    """One row's result: `record` set, or `reason`/`detail` set (quarantined)."""

    id: str
    source: str
    record: dict | None = None
    reason: str | None = None
    detail: str = ""
    where: str = ""
    positional: bool = False  # `id` names the row's position in its source (the row has no id field)

    def rejection(self) -> dict:
        return {"id": self.id, "source": self.source, "reason": self.reason, "detail": self.detail, "where": self.where}


def _rows(src: Source) -> Iterator[tuple[str, Any]]:
    """(where, row-or-RecordError) for each row of the source."""
    if not src.is_local:
        import datasets

        pinned = {"revision": src.revision} if src.revision else {}
        ds = datasets.load_dataset(src.location, split=src.split, **pinned)
        for i, row in enumerate(ds):
            yield f"{src.location}#{src.split}[{i}]", row
        return
    for f in src.files():
        if f.suffix == ".jsonl":
            yield from _json_lines(f)
        elif f.suffix == ".json":
            obj = _json_row(f.read_bytes())
            if isinstance(obj, RecordError) and _holds_json_lines(f):
                yield from _json_lines(f)   # JSON Lines named .json (as the Hub names many; datasets reads them so)
                continue
            if isinstance(obj, RecordError):
                yield f"{f}", obj
                continue
            rows = obj if isinstance(obj, list) else [obj]
            for i, row in enumerate(rows):
                yield f"{f}[{i}]", row
        else:
            import pyarrow.parquet as pq

            for i, row in enumerate(pq.read_table(f).to_pylist()):
                yield f"{f}[{i}]", row


def _json_lines(f: Path) -> Iterator[tuple[str, Any]]:
    """(file:line, row-or-RecordError) per non-blank line, decoded line by line: one bad line is one rejection."""
    with open(f, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            if raw.strip():
                yield f"{f}:{lineno}", _json_row(raw)


def _holds_json_lines(f: Path) -> bool:
    """A file that is no one JSON value but whose first non-blank line is one: JSON Lines."""
    with open(f, "rb") as fh:
        first = next((raw for raw in fh if raw.strip()), b"")
    return bool(first) and not isinstance(_json_row(first), RecordError)


def _json_row(raw: bytes) -> Any:
    """A parsed JSON value, or the RecordError saying why these bytes are not one."""
    try:
        return parse_json_line(raw)
    except JsonLineError as exc:
        return RecordError(exc.reason, exc.detail)


def _row_id(src: Source, row: Any, where: str) -> tuple[str, bool]:
    """(the row's own id field, else its position; whether it is its position). Positions name the
    file relative to the source (not the absolute path), so ids don't depend on where the data lives."""
    if isinstance(row, dict):
        for k in _ID_KEYS:
            if isinstance(row.get(k), (str, int)) and str(row[k]):
                return str(row[k]), False
        extra = row.get("extra_info")
        if isinstance(extra, dict) and extra.get("index") is not None:
            return f"{extra.get('split', 'row')}-{extra['index']}", False
    if src.is_local:
        base = Path(src.location)
        where = where[len(str(base.parent)) + 1:] if where.startswith(str(base.parent) + "/") else where
    return where.replace(" ", "_"), True


def read_source(src: Source | str, *, reasoning: str = "reasoning_content") -> Iterator[Outcome]:
    """Yield one Outcome per row; bad rows are quarantined with a reason, never raised."""
    src = parse_source(src) if isinstance(src, str) else src
    parse = PARSERS[src.format]
    seen: set[str] = set()
    for where, row in _rows(src):
        rid, positional = _row_id(src, row, where)
        label = src.format
        if isinstance(row, RecordError):
            yield Outcome(rid, label, reason=row.reason, detail=row.detail, where=where)
            continue
        if not isinstance(row, dict):
            yield Outcome(rid, label, reason="bad_row", detail=f"row is {type(row).__name__}", where=where)
            continue
        if rid in seen:
            yield Outcome(rid, label, reason="duplicate_id", detail=f"id {rid!r} seen before in this source", where=where)
            continue
        seen.add(rid)
        try:
            rec = parse(row, rid=rid, reasoning=reasoning)
        except RecordError as exc:
            yield Outcome(rid, label, reason=exc.reason, detail=exc.detail, where=where)
            continue
        except Exception as exc:  # a shape we did not anticipate, RecursionError, UnicodeError: one record's problem
            yield Outcome(rid, label, reason="bad_row", detail=quarantine_detail(exc), where=where)
            continue
        yield Outcome(rec["id"], rec["source"], record=rec, where=where, positional=positional and rec["id"] == rid)
