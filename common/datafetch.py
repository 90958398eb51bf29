"""Data the project fetches: named files from pinned public sources, checksummed, cached.

Each name (`nq:seed42_1000`, `musique:hub_ans_dev`, `index:wiki18_e5_flat`, ...) is one file (or one model
directory) of a public repository at a pinned commit, read as plain file URLs (GitHub's raw files at
`$DTSFT_DATA_ENDPOINT`, default https://raw.githubusercontent.com; a hub file at
`$HF_ENDPOINT/datasets/<repo>/resolve/<commit>/<path>`; an official URL outside both, HotpotQA's), and
stored in the cache `$DTSFT_DATA` (default ~/.cache/dtsft) as `<collection>/<bench>/<file>`:
`$DTSFT_DATA/benchmarks` is laid out as a `bench_root`.

- `TABLE`: the reference files, each pinned by commit and by the sha256 of the cached file (measured
  against the source): `fetch-data` with no name fetches these.
- `LARGE`: the full sets and Search-R1's dense-retrieval artefacts, fetched only when named. Each is pinned
  by a full commit stated by a public record (`cite` names it), and checked by what public records state:
  the sha256 (and size) of each *source part* (`pins`: the `.gz`, `part_aa`, `part_ab`, a Git LFS oid) and,
  where one is published, of the cached file. Where no cached-file digest is public, the first download
  records it beside the file (`<file>.sha256`, one console line saying it was recorded, not checked) and
  every later use is checked against that record.
- `UNPINNED`: entries for which no public commit was found: never downloaded (each says why); pre-filled
  from the user's copy only (`fetch-data NAME from=DIR`, its digest recorded then).

A download goes part by part into `<file>.download/` beside its place (resumed with an HTTP Range request
after an interruption, by this or a later run), each part checked against its pin, then assembled
(concatenated, gunzipped, a tar member extracted, a prefix taken: `take` keeps the source's bytes, its first
N lines or N JSON array elements one per line) into a temporary file, checked, and renamed into place:
an interrupted or failed download is never served. A cached file of 1 GiB or more is checked through
common.fingerprint.file_digest (hashed again when its path, size, mtime, inode or ctime changes).

- `path(name)`: the cached, checked file; downloaded on first use.
- `cached(name)`: the cached file or None, never the network (what planning code asks).
- `prefill(src, names)`: fills the cache from a directory in the cache's layout, a bench_root, the upstream
  repository's layout, or a raw download (Search-R1's `part_aa` + `part_ab`, `wiki-18.jsonl.gz`), checked
  the same way; a `src` that is (or is inside) the entry's place in the cache is verified in place.
  Nothing a user put in the cache is deleted: an entry replaced by a different one is renamed aside
  (`<path>.replaced-<UTC>`). An entry's place that is a symlink is refused (one line naming its target),
  before anything is read or written: a link is never followed, renamed aside or recorded.
- `fetch-data [NAME ...] [from=DIR]`: the command line (`main`); every failure is one line, exit 2.
- `no_network()`: a block of planning code (a dry run) in which hub lookups answer from the local hub
  cache only, so a plan never waits on an unreachable hub.
"""
from __future__ import annotations

import functools
import gzip
import http.client
import json
import os
import shutil
import sys
import tarfile
import urllib.error
import urllib.request
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from common import fields
from common.cli import ConfigError, did_you_mean, run_cli, split_dotlist, wants_help
from common.io import (SHA256SUMS, check_sha256_entry, clean_dead_tmp, read_sha256sums, replace_aside, sha256_file,
                       tmp_name)

GITHUB = "https://raw.githubusercontent.com"
HUB = "https://huggingface.co"
TIMEOUT_S = 60.0
BIG_FILE = 1 << 30   # bytes: a cached file this large is checked by its stat-keyed digest (common.fingerprint)
RETRIES = 5          # resumed requests after an interrupted one that made progress, within one run
CHUNK = 1 << 20


class DataError(ConfigError):
    """A named file that is unknown, cannot be fetched, or does not match its digest."""


class Interrupted(DataError):
    """A download cut short: what arrived is kept in `<file>.download/` and the next run resumes it."""


@dataclass(frozen=True)
class Pin:
    """What a public record states of one source part (an LFS pointer's oid is the file's sha256)."""
    part: str
    sha256: str | None
    size: int | None = None


@dataclass(frozen=True)
class DataFile:
    name: str                        # KIND:VARIANT (a bench, corpus, encoder or index)
    rel: str                         # <collection>/<bench>/<file> (or <dir>) in the cache
    repo: str                        # owner/name (GitHub), a hub dataset / model id, or "" (host "url")
    commit: str | None               # the full commit; None: no public commit found (UNPINNED)
    src: str | None                  # the path in the repository, the folder of `parts` ("": its root), or the URL
    sha256: str | None               # of the cached file (after `take`), or of a dir's SHA256SUMS; None: not public
    take: tuple[str, int] | None = None   # ("lines", N) | ("json_array", N): a prefix of the source
    host: str = "github"             # github | hub (a hub dataset) | hub_model (a hub model repo) | url
    kind: str = "file"               # file | dir (a directory of `parts`, with SHA256SUMS)
    parts: tuple[str, ...] = ()      # under `src`: a dir's files; a file's pieces, concatenated in order
    gunzip: bool = False             # the source is gzip: the cache holds it decompressed
    alt: str | None = None           # what a user may pass instead of pre-filling (said when refused)
    member: str | None = None        # the (gunzipped) source is a tar archive: the cache holds this member
    pins: tuple[Pin, ...] = ()       # per source part: its sha256 / size as a public record states them
    cite: str = ""                   # where the commit and the digests are stated
    why: str = ""                    # UNPINNED: why no commit is pinned

    @property
    def pinned(self) -> bool:
        """A source path and a commit (or an official URL): the entry can be downloaded."""
        return self.src is not None and (bool(self.commit) or self.host == "url")

    measured = pinned

    def source_parts(self) -> tuple[str, ...]:
        """The names of the source files: a dir's files, a file's pieces, or the one file's name."""
        return self.parts or (Path(str(self.src)).name,)

    def pin(self, part: str) -> Pin | None:
        return next((p for p in self.pins if p.part == part), None)

    def url(self, part: str | None = None) -> str:
        if self.host == "url":
            return str(self.src)
        path = "/".join(x for x in (self.src, part) if x)
        if self.host == "hub":
            base = os.environ.get("HF_ENDPOINT") or HUB
            return f"{base.rstrip('/')}/datasets/{self.repo}/resolve/{self.commit}/{path}"
        if self.host == "hub_model":
            base = os.environ.get("HF_ENDPOINT") or HUB
            return f"{base.rstrip('/')}/{self.repo}/resolve/{self.commit}/{path}"
        base = os.environ.get("DTSFT_DATA_ENDPOINT") or GITHUB
        return f"{base.rstrip('/')}/{self.repo}/{self.commit}/{path}"

    def part_url(self, part: str) -> str:
        return self.url(part if self.parts else None)

    def source(self) -> str:
        """`<repo>@<commit>:<path>` (+ the prefix taken): where the file comes from, as recorded."""
        cut = f" [{self.take[0]} {self.take[1]}]" if self.take else ""
        if self.host == "url":
            return f"url:{self.src}{cut}"
        where = self.src if self.src is not None else "(path unknown)"
        if self.parts:
            where = f"{where.rstrip('/') + '/' if where else ''}{{{','.join(self.parts)}}}"
            cut += " [concatenated]" if self.kind == "file" and len(self.parts) > 1 else ""
        cut += " [gunzip]" if self.gunzip else ""
        cut += f" [tar member {self.member}]" if self.member else ""
        return f"{self.host}:{self.repo}@{self.commit or 'unpinned'}:{where}{cut}"


_ROS = ("GaurisankarJ/reason_over_search", "45495b576c768f0d5996789e2db29eaa285a3c54")
_R1S = ("RUCAIBox/R1-Searcher", "631167cbb3c2464f805730e3e364a690f5b136d4")
_MIGRES = ("AdelWang/MIGRES", "a261f2b30ad5ff31e21c1c5fdc1763de738c1958")
# The reference files (provenance and sampling: docs/reference/data.md). Digests checked against the sources.
TABLE = {f.name: f for f in (
    DataFile("nq:seed42_1000", "benchmarks/nq/test_seed42_1000.jsonl", *_ROS, "data_subsample/nq/test.jsonl",
             "a95e3864de49e0339b433a5235451895d98cfa38d0bc4e8013dc2b1439b569be"),
    DataFile("triviaqa:seed42_1000", "benchmarks/triviaqa/test_seed42_1000.jsonl", *_ROS, "data_subsample/triviaqa/test.jsonl",
             "4a46971e676400b102885b4690f26014cbfed71d6d9785f134b22182170e58e3"),
    DataFile("popqa:seed42_1000", "benchmarks/popqa/test_seed42_1000.jsonl", *_ROS, "data_subsample/popqa/test.jsonl",
             "849ee23a02b395acb68dddbb7789ab86dd9e818765ed804696eab4760f042aea"),
    DataFile("bamboogle:test", "benchmarks/bamboogle/test.jsonl", *_ROS, "data_subsample/bamboogle/test.jsonl",
             "c9703dae6bb1ceb9e2df77be45da28cb12aa040d2f471507890a461296968f3f"),
    DataFile("hotpotqa:r1searcher_500", "benchmarks/hotpotqa/dev_r1searcher_500.jsonl", *_R1S,
             "data/eval_set/hotpotqa_500.jsonl", "bf8a42f6e1abcaaaf050cf3c7ffa50231102dd1c021b77ab01eeac95fad04bea"),
    DataFile("2wikimultihopqa:r1searcher_500", "benchmarks/2wikimultihopqa/dev_r1searcher_500.jsonl", *_R1S,
             "data/eval_set/2wiki_500.jsonl", "0fb19dee8acbf146d60c699443b1164038727f9597f30f4894bab2da253b2f1a"),
    DataFile("musique:r1searcher_500", "benchmarks/musique/dev_r1searcher_500.jsonl", *_R1S,
             "data/eval_set/musique_500.jsonl", "d1342802b9b9850e44a946031de4557722427783c92421178d729dd6e113b50d"),
    DataFile("corpus:wiki18_example_10", "benchmarks/corpus/wiki18_example_10.jsonl", "PeterGriffinJin/Search-R1",
             "a14dc3a4ffc6fe88c1e95038d9738e21ba3f7a06", "example/corpus.jsonl",
             "68b4ff871e19da6e63610517f5af253f118cce301b4d90a6ae007d0a86976491"),
    DataFile("nq:flashrag_quickstart_17", "benchmarks/fixtures/flashrag_quickstart_nq_test_17.jsonl", "RUC-NLPIR/FlashRAG",
             "1ee524901aa3daf009f97b7a31e7a1b58eee8206", "examples/quick_start/dataset/nq/test.jsonl",
             "805b1349d4bda37fb81c55067918bb4fd0565154cb0fe0956077479799f49f50"),
    DataFile("hotpotqa:distractor_dev_30", "benchmarks-context/hotpotqa/dev_distractor_30.jsonl", "Rakin061/hotpot",
             "077eab2e2b7c8e81a7d7baaea8d22f4f13f9ad3f", "hotpot_dev_distractor_v1.json",
             "f63db2fb64556880dc6bc182ce5f61b52b642c997ec51e584e4d7bfc9f3f8c4b", ("json_array", 30)),
    DataFile("musique:ans_dev_20", "benchmarks-context/musique/dev_ans_paragraphs_20.jsonl", *_MIGRES, "data/musique.json",
             "3dbed990de58f2984de3127ce5a9ffad20552056d1b0d379b43cc7504afb855e", ("lines", 20)),
    DataFile("2wikimultihopqa:dev_context_20", "benchmarks-context/2wikimultihopqa/dev_context_20.jsonl", *_MIGRES,
             "data/wikihop.json", "f2c267da3b0141748509f472fa9ed3a8a9742ed60931b6b1a8e7b58cc18ec3c3", ("lines", 20)),
)}
_FR = "RUC-NLPIR/FlashRAG_datasets"
_FR_AT = "bcafb8dd07d453be3cbeeeb3f78be1841bddf92c"         # stated with bamboogle/test.jsonl's sha256 (below)
_FR_MUSIQUE_AT = "cb1bab678e9b0d4d629b6a34530c2cd018c36e5b"  # the hub's commit page showing musique/dev.jsonl
_FR_CITE = (f"{_FR}@{_FR_AT}: public research notes that pin this revision and state the sha256 of its "
            "bamboogle/test.jsonl (c9703dae..., the same bytes as bamboogle:test) and of nq/train.jsonl and "
            "hotpotqa/train.jsonl; found by searching public code for the repository id with '@'")
_SR1_CITE = ("public Search-R1 asset downloaders that pin PeterJinGo/wiki-18-e5-index@a4d31160, "
             "PeterJinGo/wiki-18-corpus@69c1c00f and intfloat/e5-base-v2@f52bf8ec and state each part's size and "
             "sha256 (the corpus archive is a gzipped tar holding wiki_dump.jsonl, 14,393,573,105 bytes, "
             "21,015,324 passages); found by searching public code for these commits")
# The full sets and the dense-retrieval artefacts: fetched only when named (never by a bare `fetch-data`).
# Each pinned by a commit a public record states (`cite`); `pins` holds what public records state of its source
# parts; a cached-file `sha256` of None is recorded at first download (`<file>.sha256`) and checked afterwards.
LARGE = {f.name: f for f in (
    *(DataFile(f"{b}:hub", f"hub/{b}/flashrag_{split}.jsonl", _FR, _FR_AT, f"{b}/{split}.jsonl", sha, host="hub",
               pins=(Pin(f"{split}.jsonl", sha),) if sha else (), cite=_FR_CITE)
      for b, split, sha in (("nq", "test", None), ("triviaqa", "test", None), ("popqa", "test", None),
                            ("bamboogle", "test", "c9703dae6bb1ceb9e2df77be45da28cb12aa040d2f471507890a461296968f3f"),
                            ("hotpotqa", "dev", None), ("2wikimultihopqa", "dev", None))),
    DataFile("musique:hub", "hub/musique/flashrag_dev.jsonl", _FR, _FR_MUSIQUE_AT, "musique/dev.jsonl", None, host="hub",
             cite=f"{_FR}@{_FR_MUSIQUE_AT}: the hub's commit page of that revision, which shows musique/dev.jsonl as a "
                  "Git LFS pointer; its oid is not copied here, so the digest is recorded at first "
                  "download"),
    # the original-format dev sets, each question with its paragraphs (context modes item/given)
    DataFile("musique:hub_ans_dev", "hub/musique/musique_ans_v1.0_dev.jsonl", "dgslibisey/MuSiQue",
             "c8f4f8c9465fb69d31a8eae894c3fd509c4ca321", "musique_ans_v1.0_dev.jsonl",
             "15fa63794d18a94ce12411aca6e2327e65b6e83b0b1490efab3f1962e48abf3b", host="hub",
             pins=(Pin("musique_ans_v1.0_dev.jsonl", "15fa63794d18a94ce12411aca6e2327e65b6e83b0b1490efab3f1962e48abf3b"),),
             cite="public code pinning dgslibisey/MuSiQue at this revision and stating the sha256 of "
                  "musique_ans_v1.0_dev.jsonl, compared byte for byte with the authors' musique_data_v1.0.zip "
                  "(2,417 rows); found by searching public code for the revision"),
    # the authors' official file (outside GitHub and the hub), one array element per line as hotpotqa:distractor_dev_30
    DataFile("hotpotqa:hub_distractor_dev", "hub/hotpotqa/dev_distractor.jsonl", "",  None,
             "http://curtis.ml.cmu.edu/datasets/hotpot/hotpot_dev_distractor_v1.json", None, ("json_array", 7405),
             host="url", pins=(Pin("hotpot_dev_distractor_v1.json",
                                   "4e9ecb5c8d3b719f624d66b60f8d56bf227f03914f5f0753d6fa1b359d7104ea", 46_320_117),),
             cite="HotpotQA's official download URL (hotpotqa.github.io); its size and sha256 as stated by several "
                  "public dataset-preparation scripts that download that URL and check it"),
    # Search-R1's dense retrieval (evals.dense, retriever=e5), as its README and retrieval_launch.sh fetch it
    # (scripts/download.py at a14dc3a: the index's two parts, `cat part_*`; wiki-18.jsonl.gz; the encoder by hub
    # id). The model's safetensors weights, never its pickled pytorch_model.bin.
    DataFile("encoder:e5-base-v2", "models/intfloat/e5-base-v2", "intfloat/e5-base-v2",
             "f52bf8ec8c7124536f0efb74aca902b2995e5bcd", "", None, host="hub_model", kind="dir",
             parts=("config.json", "model.safetensors", "special_tokens_map.json", "tokenizer.json",
                    "tokenizer_config.json", "vocab.txt"),
             pins=(Pin("model.safetensors", "d0d559c47d5f71b1d280b13b62a2657f3e3bc70c0786f9ab91a36545e6a8f693",
                       437_955_512),),
             alt="pass encoder=intfloat/e5-base-v2 (the hub's copy through transformers' cache, not checked here)",
             cite=_SR1_CITE),
    DataFile("index:wiki18_e5_flat", "hub/wiki18/e5_Flat.index", "PeterJinGo/wiki-18-e5-index",
             "a4d31160a035f30764604f4827cd8f1d0315eb86", "", None, host="hub", parts=("part_aa", "part_ab"),
             pins=(Pin("part_aa", "a8a6a246951da4bbc8771a223283ef61963882a32864d9044ec00abb90fc3023", 42_949_672_960),
                   Pin("part_ab", "b6d9bc943626fe7cb44de4c849e9379e7f272ab216c0552acbcf2390cc033c11", 21_609_402_413)),
             alt="pass index=FILE", cite=_SR1_CITE),
    DataFile("corpus:wiki18", "hub/wiki18/wiki-18.jsonl", "PeterJinGo/wiki-18-corpus",
             "69c1c00ffe7c5554c68d8548355cb22e46aabc51", "wiki-18.jsonl.gz", None, host="hub", gunzip=True,
             member="data00/jiajie_jin/flashrag_indexes/wiki_dpr_100w/wiki_dump.jsonl",
             pins=(Pin("wiki-18.jsonl.gz", "7abd929223399cd63c52b499f289bf4f9039be1e9f8c43e1cb3938305b2317db",
                       5_123_307_260),),
             alt="pass corpus=FILE", cite=_SR1_CITE),
)}
# No public commit found: never downloaded; pre-filled from the user's copy only (its digest recorded then).
UNPINNED = {f.name: f for f in (
    DataFile("2wikimultihopqa:hub_dev", "hub/2wikimultihopqa/dev.jsonl", "kamelliao/2wikimultihopqa", None,
             "data/dev.json", None, ("json_array", 12576), host="hub",
             why="no public record pins a commit of kamelliao/2wikimultihopqa; the pinned public copy "
                 "(framolfese/2WikiMultihopQA@fe713bfb) is parquet, which this loader does not read"),
)}


@contextmanager
def no_network():
    """Hub lookups inside the block answer from the local cache or fail at once (huggingface_hub's
    offline mode, read per request): what planning code wraps the hub calls it shares with real runs in."""
    from huggingface_hub import constants

    was = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = was


def data_root() -> Path:
    """The cache: `$DTSFT_DATA`, default ~/.cache/dtsft."""
    return Path(os.path.expanduser(os.environ.get("DTSFT_DATA") or "~/.cache/dtsft"))


def names() -> list[str]:
    """Every known name: the reference files (TABLE), the large pinned ones (LARGE), then the unpinned ones."""
    return list(dict.fromkeys([*TABLE, *LARGE, *UNPINNED]))


def entry(name: str) -> DataFile:
    """The entry of `name` (TABLE, LARGE, then UNPINNED); an unknown name is a DataError with the nearest names."""
    for table in (TABLE, LARGE, UNPINNED):
        if name in table:
            return table[name]
    raise DataError(f"unknown data name {name!r}.{did_you_mean(str(name), names())} Known: {', '.join(names())}")


def is_name(value) -> bool:
    return isinstance(value, str) and (value in TABLE or value in LARGE or value in UNPINNED)


def named(key: str, value, kind: str) -> bool:
    """Whether `value`, given for `key`, names a fetched `kind` entry (`kind:...`: corpus, encoder, index).
    A value meant as one but unknown is a DataError with the nearest names: `kind:...` that is no
    existing path, or (no `/`, so no hub id either) a near miss such as encoder=e5-base-v2. Else False:
    a path or hub id, the caller's to check."""
    if not isinstance(value, str) or not value:
        return False
    if is_name(value):
        return True
    if os.path.exists(os.path.expanduser(value)):
        return False
    known = [n for n in names() if n.startswith(kind + ":")]
    if value.startswith(kind + ":"):
        raise DataError(f"{key}={value}: unknown data name.{did_you_mean(value, known)} Known: {', '.join(known)}")
    if "/" not in value and (hint := did_you_mean(f"{kind}:{value}", known)):
        raise DataError(f"{key}={value}: no such path, no hub id (owner/name) and no data name.{hint}")
    return False


def _one_line(fn):
    """An OSError from the cache (DTSFT_DATA a file, a read-only cache, a symlink in the way) is a one-line
    DataError naming the path, never a traceback."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except OSError as exc:
            where = exc.filename or data_root()
            raise DataError(f"data cache $DTSFT_DATA={data_root()}: {where}: {exc.strerror or exc}") from None
    return wrapper


def local_path(name: str) -> Path:
    """Where `name` lives in the cache (present or not)."""
    return data_root() / entry(name).rel


def _mismatch(what: str, f: DataFile, actual: str, expected: str | None = None) -> DataError:
    return DataError(f"{what}: sha256 {actual}, expected {expected or f.sha256} for {f.name} ({f.source()}); not used")


def _recorded(p: Path) -> Path:
    """Beside a cached file without a public digest: the sha256 recorded at its first download or pre-fill."""
    return p.with_name(p.name + ".sha256")


def _read_record(p: Path) -> str | None:
    rec = _recorded(p)
    try:
        text = rec.read_text(encoding="utf-8").split() if rec.is_file() else []
    except (OSError, UnicodeDecodeError):
        return None
    return text[0] if text and len(text[0]) == 64 else None


def digest(name: str) -> str | None:
    """The sha256 `name`'s file is checked against: the table's, else the one recorded at its first
    download or pre-fill, else None (nothing recorded yet)."""
    f = entry(name)
    return f.sha256 or _read_record(local_path(name))


def _unmeasured(f: DataFile) -> DataError:
    where = (f"your copy of the directory, holding {', '.join(f.parts)}" if f.kind == "dir"
             else f"DIR/{f.rel.split('/', 1)[1]}, or from=FILE")
    alt = f.alt or f"pass bench_root=DIR with {f.name.split(':', 1)[0]}/<file>.jsonl"
    return DataError(f"{f.name} ({f.source()}) has no pinned commit ({f.why or 'none is public'}), so it is never "
                     f"downloaded: pre-fill it from your copy with `fetch-data {f.name} from=DIR` ({where}; its "
                     f"sha256 is recorded then) or {alt}")


def _unrecorded(f: DataFile, p: Path) -> DataError:
    return DataError(f"{p}: in the cache for {f.name} but its sha256 was never recorded (it was not put there by "
                     f"fetch-data): run `fetch-data {f.name} from={p}` to check it in place and record its digest, "
                     f"or move it aside and run `fetch-data {f.name}`")


def _file_digest(p: Path) -> str:
    """sha256 of a cached file: read whole, or for a file of BIG_FILE bytes or more through the stat-keyed
    digest cache (common.fingerprint.file_digest: hashed again whenever its path, size, mtime, inode or
    ctime changes)."""
    if p.stat().st_size >= BIG_FILE:
        from common.fingerprint import file_digest

        return file_digest(p)
    return sha256_file(p)


def _present(f: DataFile, p: Path) -> bool:
    return p.is_dir() if f.kind == "dir" else p.is_file()


def _sums_text(d: Path, parts: tuple[str, ...]) -> str:
    """SHA256SUMS over a dir entry's parts only (`sha256sum` format, sorted): other files a user keeps
    in the directory are neither listed nor touched."""
    return "".join(f"{sha256_file(d / part)}  {part}\n" for part in sorted(parts))


def _dir_actual(f: DataFile, p: Path) -> str:
    """A cached dir entry's digest as checked now: its SHA256SUMS's sha256 when that file lists exactly the
    parts and each matches, else a description of the first problem."""
    entries, problems = read_sha256sums(p)
    if not problems and set(entries) != set(f.parts):
        problems = [f"{p / SHA256SUMS} lists {sorted(entries)}, not the parts {sorted(f.parts)}"]
    problems += [x for part, d in entries.items() if (x := check_sha256_entry(p, part, d))]
    actual = sha256_file(p / SHA256SUMS) if (p / SHA256SUMS).is_file() else "(no SHA256SUMS)"
    return f"{actual} but {problems[0]}" if problems else actual


def _no_link(f: DataFile) -> None:
    """An entry's place (or its recorded digest) that is a symlink is refused before anything is read or
    written: a link is neither followed (its target is not the cache's to check, fill or record) nor renamed
    aside (it is the user's); the user removes it or fills the entry from where it points."""
    final = data_root() / f.rel
    for p in (final, _recorded(final)):
        if p.is_symlink():
            raise DataError(f"{p} is a symlink to {os.readlink(p)}: fetch-data neither follows nor replaces a link "
                            f"in the cache; remove the link (what it points to is kept) and fill the entry with "
                            f"`fetch-data {f.name} from=DIR`")


@_one_line
def cached(name: str) -> Path | None:
    """The cached file (or directory) of `name` when present (its digest checked), else None; never the network."""
    f, p = entry(name), local_path(name)
    _no_link(f)
    if not _present(f, p):
        return None
    expected = digest(name)
    if expected is None:   # put there by hand: nothing to check it against
        raise _unrecorded(f, p) if f.pinned else _unmeasured(f)
    actual = _dir_actual(f, p) if f.kind == "dir" else _file_digest(p)
    if actual != expected:
        raise DataError(f"{_mismatch(str(p), f, actual, expected)} (a cached file changed since it was checked: "
                        f"move it aside and run `fetch-data {name}` again)") from None
    return p


@_one_line
def path(name: str) -> Path:
    """The cached, checked file (or directory) of `name`, downloaded first when it is not cached (an
    unpinned entry is refused: nothing to pin a download to)."""
    f = entry(name)
    found = cached(name)
    if found:
        return found
    if not f.pinned:
        raise _unmeasured(f)
    return _download(f)


def _take(raw: bytes, take: tuple[str, int] | None, where: str) -> bytes:
    """The prefix of a source file a table entry keeps (bytes as in the source)."""
    if take is None:
        return raw
    kind, n = take
    if kind == "lines":
        lines = raw.split(b"\n", n)
        if len(lines) <= n:
            raise DataError(f"{where}: {len(lines) - 1} complete lines, the table takes the first {n}")
        return b"\n".join(lines[:n]) + b"\n"
    text, dec, out = raw.decode("utf-8"), json.JSONDecoder(), []
    i = text.find("[") + 1
    try:
        while len(out) < n:
            while text[i] in " ,\r\n\t":
                i += 1
            _, end = dec.raw_decode(text, i)
            out.append(text[i:end])
            i = end
    except (IndexError, ValueError) as exc:
        raise DataError(f"{where}: not a JSON array of at least {n} elements ({exc})") from None
    return ("\n".join(out) + "\n").encode("utf-8")


def _writable_root() -> None:
    root = data_root()
    if root.exists() and not root.is_dir():
        raise DataError(f"$DTSFT_DATA={root} is a file, not a directory: point DTSFT_DATA at a directory")


def _make_parents(final: Path) -> list[Path]:
    """Create `final`'s missing parent directories; the ones made, deepest first."""
    _writable_root()
    made, d = [], final.parent
    while not d.exists():
        made.append(d)
        d = d.parent
    final.parent.mkdir(parents=True, exist_ok=True)
    return made


def _remove_made(made: list[Path]) -> None:
    """After a failed download: remove the directories it made, those still empty (deepest first)."""
    for d in made:
        try:
            d.rmdir()
        except OSError:   # something else was put there meanwhile (or a kept partial download): kept
            return


def _tmp(final: Path) -> Path:
    """This process's temporary file for `final`; a killed process's (this host, pid dead) is removed first."""
    clean_dead_tmp(final)
    return tmp_name(final)


def _drop(tmp: Path) -> None:
    if tmp.is_dir() and not tmp.is_symlink():
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.unlink(missing_ok=True)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _record(f: DataFile, final: Path, actual: str, origin: str) -> None:
    """Keep `actual` beside the entry (written once the entry is in place); an earlier record goes aside."""
    rec = _recorded(final)
    tmp = tmp_name(rec)
    try:
        tmp.write_text(f"{actual}  {origin}\n", encoding="utf-8")
        if rec.exists() or rec.is_symlink():
            replace_aside(rec)
        os.replace(tmp, rec)
    finally:
        tmp.unlink(missing_ok=True)
    _say(f"{f.name}: sha256 {actual} recorded, not checked (no public digest of the {'directory' if f.kind == 'dir' else 'file'}"
         f"; {origin}): every later use is checked against {rec}")


def _into_place(tmp: Path, final: Path) -> Path:
    """Rename `tmp` to `final`; whatever is at `final` (an earlier entry, a user's copy) is renamed aside first
    (`<final>.replaced-<UTC>`), never deleted (a symlink there was refused before: `_no_link`)."""
    if final.exists() or final.is_symlink():
        aside = replace_aside(final)
        _say(f"{final}: a different copy was there; renamed aside to {aside.name}")
    os.replace(tmp, final)
    return final


def _check_part(f: DataFile, part: str, p: Path, where: str) -> None:
    """A source part against what a public record states of it (size, then sha256); a DataError naming both."""
    pin = f.pin(part)
    if pin is None:
        return
    size = p.stat().st_size
    if pin.size is not None and size != pin.size:
        raise DataError(f"{where}: {size} bytes, expected {pin.size} for {f.name} part {part} ({f.source()}); not used")
    if pin.sha256:
        actual = sha256_file(p)
        if actual != pin.sha256:
            raise DataError(f"{where}: sha256 {actual}, expected {pin.sha256} for {f.name} part {part} "
                            f"({f.source()}); not used")


def _assemble(f: DataFile, sources: list[Path], out_path: Path, where: str) -> None:
    """The cached file from its source parts: concatenated, gunzipped, a tar member extracted, a prefix taken."""
    with open(out_path, "wb") as out:
        try:
            if f.member:
                _extract(f, sources[0], out, where, "r|gz" if f.gunzip else "r|")
            else:
                for src in sources:
                    with (gzip.open(src, "rb") if f.gunzip else open(src, "rb")) as inp:
                        shutil.copyfileobj(inp, out, CHUNK)
        except (gzip.BadGzipFile, EOFError, zlib.error, tarfile.TarError) as exc:
            raise DataError(f"{where}: not the expected {'gzip ' if f.gunzip else ''}{'tar ' if f.member else ''}"
                            f"data for {f.name} ({exc or 'it ends early'}); nothing cached") from None
    if f.take:
        out_path.write_bytes(_take(out_path.read_bytes(), f.take, where))


def _extract(f: DataFile, src: Path, out, where: str, mode: str) -> None:
    with tarfile.open(src, mode) as tf:
        for m in tf:
            if m.isfile() and m.name == f.member:
                shutil.copyfileobj(tf.extractfile(m), out, CHUNK)
                return
    raise DataError(f"{where}: the archive holds no member {f.member} ({f.name}); nothing cached")


def _build(f: DataFile, sources: list[Path], raw: bool, where: str, origin: str) -> Path:
    """Make `f`'s cached copy from `sources` (the source parts when `raw`, else one file or directory in the
    cache's form) in a temporary sibling, check it (the table's digest, else the one recorded earlier, where
    the entry is pinned), rename it into place, then record its digest where none was known."""
    final = data_root() / f.rel
    tmp = _tmp(final)
    try:
        if f.kind == "dir":
            tmp.mkdir()
            for part, src in zip(f.parts, sources):
                (tmp / part).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, tmp / part)
            (tmp / SHA256SUMS).write_text(_sums_text(tmp, f.parts), encoding="utf-8")
            actual = sha256_file(tmp / SHA256SUMS)
        else:
            if raw or (f.member and tarfile.is_tarfile(sources[0])):   # `gzip -d`'s output is still the tar
                _assemble(f if raw else _plain_tar(f), sources, tmp, where)
            else:
                shutil.copyfile(sources[0], tmp)
            actual = sha256_file(tmp)
        recorded = _read_record(final) if f.pinned else None   # an unpinned entry's refill takes the user's copy
        expected = f.sha256 or recorded
        if expected and actual != expected:
            raise _mismatch(where, f, actual, expected)
        _into_place(tmp, final)
        if not expected:
            _record(f, final, actual, origin)
        return final
    finally:
        _drop(tmp)


def _plain_tar(f: DataFile) -> DataFile:
    from dataclasses import replace

    return replace(f, gunzip=False)


def _span(resp, have: int) -> tuple[int, int | None]:
    """(first byte, total size) of a response to a request from byte `have`: a 206's Content-Range, else 0
    and the Content-Length (a server that ignores Range sends the whole file again)."""
    if resp.status == 206:
        rng = resp.headers.get("Content-Range", "")
        try:
            first, total = rng.split(" ", 1)[1].split("-", 1)[0], rng.rsplit("/", 1)[1]
            return int(first), None if total == "*" else int(total)
        except (IndexError, ValueError):
            raise DataError(f"unreadable Content-Range {rng!r}") from None
    length = resp.headers.get("Content-Length")
    return 0, int(length) if length is not None and length.isdigit() else None


def _get(f: DataFile, url: str, dest: Path, size: int | None, timeout: float) -> None:
    """Download `url` into `dest`, continuing from what `dest` holds (HTTP Range); a cut connection that made
    progress is resumed up to RETRIES times, then Interrupted (dest kept for the next run). A size that is not
    the pinned one removes `dest` and is a DataError."""
    resumed, restarted = 0, False
    while True:
        have = dest.stat().st_size if dest.exists() else 0
        if size is not None and have > size:
            dest.unlink()
            have = 0
        if size is not None and have == size:
            return
        req = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
        got, first, total = 0, 0, None
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                first, total = _span(resp, have)
                if first not in (0, have):
                    raise DataError(f"download of {f.name} from {url}: asked from byte {have}, answered from {first}")
                if size is not None and total is not None and total != size:
                    dest.unlink(missing_ok=True)
                    raise DataError(f"download of {f.name} from {url}: {total} bytes, expected {size} "
                                    f"({f.source()}); nothing cached")
                declared = resp.headers.get("Content-Length")
                with open(dest, "ab" if first else "wb") as out:
                    while chunk := resp.read(CHUNK):
                        got += len(chunk)
                        out.write(chunk)
            now = dest.stat().st_size
            if declared is not None and declared.isdigit() and got < int(declared) or total is not None and now < total:
                raise http.client.IncompleteRead(b"", (total or now) - now)
            if size is not None and now != size:
                dest.unlink()
                raise DataError(f"download of {f.name} from {url}: {now} bytes, expected {size} "
                                f"({f.source()}); nothing cached")
            return
        except urllib.error.HTTPError as exc:
            if exc.code == 416 and have and (exc.headers.get("Content-Range") or "").endswith(f"/{have}"):
                return   # what is kept is the whole file already
            if exc.code == 416 and have and not restarted:   # what is kept is not a prefix the server knows
                dest.unlink()
                restarted = True
                continue
            raise DataError(f"could not download {f.name} from {url}: HTTP {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            if got and resumed < RETRIES:
                resumed += 1
                continue
            kept = dest.stat().st_size if dest.exists() else 0
            if kept:
                raise Interrupted(f"download of {f.name} from {url} interrupted: {kept} of {total or size or '?'} "
                                  f"bytes, kept in {dest.parent}; run it again to resume") from None
            raise DataError(f"could not download {f.name} from {url}: {exc!r}. Offline? Pre-fill the cache "
                            f"{data_root()} with `fetch-data {f.name} from=DIR`") from None


@contextmanager
def _locked(stage: Path):
    """One download per entry at a time (on this filesystem): another is refused in one line."""
    import fcntl

    lock = open(stage / ".lock", "a")
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise DataError(f"{stage}: another fetch-data is downloading this entry; wait for it") from None
        yield
    finally:
        lock.close()


def _download(f: DataFile) -> Path:
    """Fetch `f`'s source parts into `<file>.download/` (resuming what an earlier run left), check each
    against its pin, build the cached copy from them and rename it into place; then the parts go. An
    interruption keeps the parts for the next run; any other failure leaves nothing (not even the
    directories it made)."""
    final = data_root() / f.rel
    made = _make_parents(final)
    stage = final.with_name(final.name + ".download")
    stage.mkdir(exist_ok=True)
    timeout = float(os.environ.get("DTSFT_DATA_TIMEOUT") or TIMEOUT_S)
    ok = False
    try:
        with _locked(stage):
            paths = []
            for part in f.source_parts():
                dest = stage / part
                dest.parent.mkdir(parents=True, exist_ok=True)
                url = f.part_url(part)
                pin = f.pin(part)
                _get(f, url, dest, pin.size if pin else None, timeout)
                try:
                    _check_part(f, part, dest, url)
                except DataError:
                    dest.unlink()   # a part that is not the pinned one is never kept
                    raise
                paths.append(dest)
            where = f.part_url(f.source_parts()[0]) if len(f.source_parts()) == 1 else f.url()
            try:
                done = _build(f, paths, True, where, f"downloaded from {f.source()}")
            except DataError:   # the parts make a file that is not the entry's: none of them is kept
                shutil.rmtree(stage, ignore_errors=True)
                raise
            ok = True
            return done
    finally:   # any other failure (or an interrupt) keeps the checked or partial parts for the next run
        if ok:
            shutil.rmtree(stage, ignore_errors=True)
        elif stage.is_dir():
            (stage / ".lock").unlink(missing_ok=True)
            if not any(stage.iterdir()):
                stage.rmdir()
        if not ok and not stage.exists():
            _remove_made(made)


def _inside(p: Path, final: Path) -> bool:
    """Whether `p` is `final` itself or (a dir entry) inside it."""
    a, b = p.resolve(), final.resolve()
    return a == b or b in a.parents


def _verify_in_place(f: DataFile, final: Path) -> Path:
    """`from=` names the entry's own place in the cache: check what is there (the table's or the recorded
    digest), or record it, and change nothing else: for a directory, only a SHA256SUMS over its parts is
    added (the user's other files stay as they are)."""
    if f.kind == "dir":
        missing = [part for part in f.parts if not (final / part).is_file()]
        if missing:
            raise DataError(f"from={final}: {f.name} needs {', '.join(missing)} there; nothing changed")
        for part in f.parts:
            _check_part(f, part, final / part, str(final / part))
        text = _sums_text(final, f.parts)
        import hashlib

        actual = hashlib.sha256(text.encode("utf-8")).hexdigest()
        sums = final / SHA256SUMS
        if sums.exists() and sums.read_bytes() != text.encode("utf-8"):
            raise DataError(f"from={final}: holds a {SHA256SUMS} that is not the one over {f.name}'s parts; move it "
                            f"away and run again (nothing changed)")
    else:
        if len(f.source_parts()) == 1 and not f.take and not f.gunzip:
            _check_part(f, f.source_parts()[0], final, str(final))
        actual = _file_digest(final)
    expected = digest(f.name)
    if expected and actual != expected:
        raise _mismatch(f"from={final}", f, actual, expected)
    if f.kind == "dir" and not (final / SHA256SUMS).exists():
        (final / SHA256SUMS).write_text(text, encoding="utf-8")
    if not expected:
        _record(f, final, actual, f"your copy, checked in place at {final}")
    return final


def _candidates(f: DataFile, src: Path, named: bool) -> list[tuple[list[Path], bool]]:
    """Where `src` may hold `f`: ([paths], raw). In the cache's form: the cache's layout, a bench_root's, and
    (named) `src/<file>` or a dir entry's own directory; as source parts: the upstream repository's layout
    (`src/<path in the repo>`, also inside a clone named after the repository) and a raw download's (the
    parts side by side: Search-R1's `part_aa` + `part_ab`, `wiki-18.jsonl.gz`)."""
    out = [([src / f.rel], False), ([src / f.rel.split("/", 1)[1]], False)]
    if named:
        out.append(([src] if f.kind == "dir" else [src / Path(f.rel).name], False))
    if f.host != "url" and f.src is not None:
        for base in (src, src / f.repo.rsplit("/", 1)[-1]):
            if f.parts:
                out.append(([base / f.src / part if f.src else base / part for part in f.parts], True))
            else:
                out.append(([base / f.src], True))
    if named:
        out.append(([src / part for part in f.source_parts()], True))
    return out


def _holds(f: DataFile, paths: list[Path], raw: bool) -> bool:
    if f.kind == "dir" and not raw:
        return paths[0].is_dir() and all((paths[0] / part).is_file() for part in f.parts)
    return all(p.is_file() for p in paths)


def _fill(f: DataFile, paths: list[Path], raw: bool, src: Path) -> tuple[Path, str]:
    """One entry from a found copy: verified in place, already cached, or built from it."""
    final = data_root() / f.rel
    _no_link(f)
    if not raw and _inside(paths[0], final) or raw and all(_inside(p, final) for p in paths):
        return _verify_in_place(f, final), "verified in place"
    if f.pinned and _present(f, final):
        try:
            if cached(f.name):
                return final, "cached"
        except DataError:
            pass   # a different copy is there: the checked one found in src replaces it (the old one goes aside)
    sources = [paths[0] / part for part in f.parts] if f.kind == "dir" and not raw else paths
    if raw:
        for part, p in zip(f.source_parts(), paths):
            _check_part(f, part, p, str(p))
    made = _make_parents(final)
    try:
        where = _shown(paths)
        return _build(f, sources, raw, where, f"from={src}"), "copied"
    except BaseException:
        _remove_made(made)
        raise


def _shown(paths: list[Path]) -> str:
    """One candidate as said in a message: a path, or `DIR/{a,b}` for parts side by side."""
    if len(paths) == 1:
        return str(paths[0])
    return f"{os.path.commonpath([str(p) for p in paths])}/{{{','.join(p.name for p in paths)}}}"


@_one_line
def prefill(src: str | Path, names: list[str] | None = None) -> dict[str, Path]:
    """Fill the named entries (None: every TABLE file found) from `src` (see `_candidates` for the layouts
    looked at), each checked; an unpinned entry is taken only when named, its digest recorded. A named
    entry may also be `src` itself: one file entry's file (from=FILE), a dir entry's directory. Returns
    {name: cached path}; `fill_report` says how each was done."""
    return {n: p for n, (p, _) in fill(src, names).items()}


@_one_line
def fill(src: str | Path, names: list[str] | None = None) -> dict[str, tuple[Path, str]]:
    if not str(src).strip():   # Path("") is the current directory: never searched unasked
        raise DataError("from= names no file or directory (empty)")
    src = Path(src).expanduser()
    if src.is_file():
        if not names or len(names) != 1 or entry(names[0]).kind != "file":
            raise DataError(f"from={src} is a file: name the one file entry it is a copy of (fetch-data NAME from=FILE)")
        f = entry(names[0])
        raw = bool(f.gunzip or f.take or (f.member and tarfile.is_tarfile(src))) and len(f.source_parts()) == 1 \
            and not _inside(src, data_root() / f.rel) and Path(src).name == f.source_parts()[0]
        return {f.name: _fill(f, [src], raw, src)}
    if not src.is_dir():
        raise DataError(f"from={src}: " + ("not a regular file or a directory" if src.exists()
                                           else "no such file or directory"))
    wanted = [entry(n) for n in names] if names else list(TABLE.values())
    done = {}
    for f in wanted:
        cands = _candidates(f, src, bool(names))
        found = next(((paths, raw) for paths, raw in cands if _holds(f, paths, raw)), None)
        if found is None:
            if names:
                looked = ", ".join(dict.fromkeys(_shown(paths) for paths, _ in cands))
                what = f"{', '.join(f.parts)} in any of" if f.kind == "dir" else "file at any of"
                raise DataError(f"from={src}: no {what} {looked} for {f.name}")
            continue
        done[f.name] = _fill(f, *found, src)
    if not done:
        raise DataError(f"from={src}: none of the known files is there (looked for <bench>/<file> as in "
                        f"{', '.join(f.rel.split('/', 1)[1] for f in wanted[:3])}, ...)")
    return done


KEYS = {  # common.fields: `fetch-data --help` and docs/keys/fetch-data.md
    "from": fields.text("a directory (or one named file) to fill the cache from, checked the same way, instead of "
                        "downloading (not given: download)", roles=(fields.PATH,)),
}

USAGE = """usage: fetch-data [NAME ...] [from=DIR|FILE]

Downloads each named file (none named: every reference file) from its pinned public source into the
cache $DTSFT_DATA (now {root}), checked against what public records state (a file without a published
digest has it recorded at its first download, then checked on every use); a file already cached is not
downloaded again, and an interrupted download is resumed by the next run. The full sets and the
dense-retrieval artefacts are fetched only when named.
from=DIR fills the cache from DIR instead, checked the same way: DIR laid out as the cache
(DIR/<collection>/<bench>/<file>), as a bench_root (DIR/<bench>/<file>), as the upstream repository
(DIR/<path in the repository>, e.g. DIR/data_subsample/nq/test.jsonl), as a raw download (Search-R1's
DIR/part_aa + DIR/part_ab, DIR/wiki-18.jsonl.gz), or holding the named file (DIR/<file>; a model
directory itself); from=FILE takes one named file. from= the entry's own place in the cache checks it
there (recording its digest where none is published) and changes nothing else. Nothing is deleted: an
entry replaced by a different one is renamed aside (<path>.replaced-<UTC>); an entry that is a symlink
is refused (never followed or replaced).
Sources: $DTSFT_DATA_ENDPOINT (GitHub raw files), $HF_ENDPOINT (hub files,
<endpoint>/datasets/<repo>/resolve/<commit>/<path>; a model's, <endpoint>/<repo>/resolve/<commit>/<path>).
An "unpinned" name has no public commit: never downloaded; `fetch-data NAME from=DIR` takes your copy.

Keys (key=default  description):
{keys}

Names:
{names}"""


def main(argv: list[str] | None = None) -> int:
    return run_cli(_main, argv)


def _main(argv: list[str]) -> int:
    if wants_help(argv):
        print(USAGE.format(root=data_root(), keys=fields.help_table(KEYS),
                           names="\n".join(f"  {n:34s} {entry(n).source()}" for n in names())))
        return 0
    try:
        wanted = [a for a in argv if "=" not in a]
        opts = {**fields.defaults(KEYS), **dict(split_dotlist([a for a in argv if "=" in a]))}
        if set(opts) - set(KEYS):
            bad = sorted(set(opts) - set(KEYS))[0]
            raise DataError(f"unknown key {bad!r}.{did_you_mean(bad, list(KEYS))} fetch-data takes NAME ... "
                            f"{' '.join(f'[{k}=...]' for k in KEYS)}")
        for n in wanted:
            entry(n)
        if opts["from"] is not None:
            for n, (p, how) in fill(opts["from"], wanted or None).items():
                print(f"{n:34s} {how:17s} {p}")
        else:
            for n in wanted or list(TABLE):
                how = "cached" if cached(n) else "downloaded"
                print(f"{n:34s} {how:17s} {path(n)}")
            if not wanted:
                print(f"not downloaded unless named: {', '.join(LARGE)}; unpinned (`fetch-data NAME from=DIR`): "
                      f"{', '.join(UNPINNED)}")
        return 0
    except OSError as exc:   # not from the cache functions (they say DataError): still one line
        raise DataError(f"{exc.filename or ''}: {exc.strerror or exc}") from None


if __name__ == "__main__":
    sys.exit(main())
