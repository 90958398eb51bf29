"""Data the project fetches: named reference files from pinned public sources, checksummed, cached.

Each name in `TABLE` (`nq:seed42_1000`, `musique:ans_dev_20`, `corpus:wiki18_example_10`, ...) is one
file of a public repository at a pinned commit, read as a plain file URL (GitHub's raw files at
`$DTSFT_DATA_ENDPOINT`, default https://raw.githubusercontent.com; a hub file at
`$HF_ENDPOINT/datasets/<repo>/resolve/<commit>/<path>`, the same downloader), checked against the
sha256 kept here and stored in the cache `$DTSFT_DATA` (default ~/.cache/dtsft) as
`<collection>/<bench>/<file>`: `$DTSFT_DATA/benchmarks` is laid out as a `bench_root`. A file that
is a prefix of its source (`take`) keeps the source's bytes: its first N lines, or the first N
elements of a JSON array, one per line.

- `path(name)`: the cached, checked file; downloaded on first use (a temporary file renamed into
  place only once its digest matches: an interrupted or corrupted download leaves nothing, not even
  the directories it made).
- `cached(name)`: the cached file or None, never the network (what planning code asks).
- `prefill(src, names)`: copies from a directory laid out as a bench_root (`<bench>/<file>`) or as
  the cache, checked the same way (air-gapped clusters).
- `fetch-data [NAME ...] [from=DIR]`: the command line (`main`).
- `UNPINNED`: the hub sets (`<bench>:hub`, `musique:hub_ans_dev`, ...), written without hub access, so
  no commit or sha256 was measured for them. They are never downloaded: `path` refuses them saying how to
  pre-fill one (`fetch-data NAME from=DIR`, the user's copy, whose sha256 is measured then and kept
  beside it as `<file>.sha256`; from then on checked against that) or to pass `bench_root=DIR`.
  Once both are filled in, such an entry downloads like any other.
- Artefacts beyond one file (dense retrieval's, `retriever=e5`): an entry whose `kind` is "dir" is a
  directory (a model: `encoder:e5-base-v2`) made of its `parts`, each fetched by the same downloader,
  with a `SHA256SUMS` written over them; its digest is that file's sha256 (what
  `evals.identity.checkpoint_identity` computes for a model dir). A "file" entry with `parts` is their
  concatenation in order (Search-R1's `e5_Flat.index` is published as `part_aa` + `part_ab`); `gunzip`
  keeps a gzip source decompressed (wiki-18.jsonl.gz). A cached file of 1 GiB or more is checked through
  common.fingerprint.file_digest (hashed again only when its size or mtime changes: the 61 GiB index is
  not re-read by every process that opens it).
- `no_network()`: a block of planning code (a dry run) in which hub lookups answer from the local hub
  cache only, so a plan never waits on an unreachable hub.
"""
from __future__ import annotations

import http.client
import json
import os
import shutil
import sys
import urllib.error
import urllib.request
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from common.cli import ConfigError, did_you_mean, split_dotlist, wants_help
from common.io import SHA256SUMS, check_sha256sums, clean_dead_tmp, sha256_file, tmp_name, write_sha256sums

GITHUB = "https://raw.githubusercontent.com"
HUB = "https://huggingface.co"
TIMEOUT_S = 60.0
BIG_FILE = 1 << 30   # bytes: a cached file this large is checked by its stat-keyed digest (common.fingerprint)


class DataError(ConfigError):
    """A named file that is unknown, cannot be fetched, or does not match its digest."""


@dataclass(frozen=True)
class DataFile:
    name: str                        # KIND:VARIANT (a bench, corpus, encoder or index)
    rel: str                         # <collection>/<bench>/<file> (or <dir>) in the cache
    repo: str                        # owner/name (GitHub), or a hub dataset / model id (host "hub" / "hub_model")
    commit: str | None               # None: not measured (see `measured`)
    src: str | None                  # the file's path in the repository, or the folder of `parts` ("": its root)
    sha256: str | None               # of the cached file (after `take`), or of a dir's SHA256SUMS; None: not measured
    take: tuple[str, int] | None = None   # ("lines", N) | ("json_array", N): a prefix of the source
    host: str = "github"             # github | hub (a hub dataset) | hub_model (a hub model repo)
    kind: str = "file"               # file | dir (a directory of `parts`, with SHA256SUMS)
    parts: tuple[str, ...] = ()      # under `src`: a dir's files; a file's pieces, concatenated in order
    gunzip: bool = False             # the source is gzip: the cache holds it decompressed
    alt: str | None = None           # what a user may pass instead of pre-filling (said when refused)

    @property
    def measured(self) -> bool:
        """Pinned commit, path and digest all known: the entry can be downloaded and checked."""
        return bool(self.commit and self.src is not None and self.sha256)

    def url(self, part: str | None = None) -> str:
        path = "/".join(x for x in (self.src, part) if x)
        if self.host == "hub":
            base = os.environ.get("HF_ENDPOINT") or HUB
            return f"{base.rstrip('/')}/datasets/{self.repo}/resolve/{self.commit}/{path}"
        if self.host == "hub_model":
            base = os.environ.get("HF_ENDPOINT") or HUB
            return f"{base.rstrip('/')}/{self.repo}/resolve/{self.commit}/{path}"
        base = os.environ.get("DTSFT_DATA_ENDPOINT") or GITHUB
        return f"{base.rstrip('/')}/{self.repo}/{self.commit}/{path}"

    def source(self) -> str:
        """`<repo>@<commit>:<path>` (+ the prefix taken): where the file comes from, as recorded."""
        cut = f" [{self.take[0]} {self.take[1]}]" if self.take else ""
        where = self.src if self.src is not None else "(path unknown)"
        if self.parts:
            where = f"{where.rstrip('/') + '/' if where else ''}{{{','.join(self.parts)}}}"
            cut += " [concatenated]" if self.kind == "file" and len(self.parts) > 1 else ""
        cut += " [gunzip]" if self.gunzip else ""
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
# The hub sets: full splits, not the reference samples, read only when named (evals.benches). No hub access
# where this was written: their commits and digests are NOT measured (None), so `path` refuses them until the
# user pre-fills one (`fetch-data NAME from=DIR`). An entry whose commit and sha256 get measured moves to TABLE.
UNPINNED = {f.name: f for f in (
    *(DataFile(f"{b}:hub", f"hub/{b}/flashrag_{split}.jsonl", "RUC-NLPIR/FlashRAG_datasets", None, f"{b}/{split}.jsonl",
               None, host="hub") for b, split in (("nq", "test"), ("triviaqa", "test"), ("popqa", "test"),
                                                  ("bamboogle", "test"), ("hotpotqa", "dev"), ("2wikimultihopqa", "dev"),
                                                  ("musique", "dev"))),
    # the original-format dev sets, each question with its paragraphs (context modes item/given)
    DataFile("musique:hub_ans_dev", "hub/musique/musique_ans_v1.0_dev.jsonl", "dgslibisey/MuSiQue", None,
             "musique_ans_v1.0_dev.jsonl", None, host="hub"),
    DataFile("2wikimultihopqa:hub_dev", "hub/2wikimultihopqa/dev.jsonl", "kamelliao/2wikimultihopqa", None,
             "data/dev.json", None, ("json_array", 12576), host="hub"),
    # the hub's copy is parquet shards (no path known here): pre-filled only, one array element of
    # hotpot_dev_distractor_v1.json per line (the layout of hotpotqa:distractor_dev_30)
    DataFile("hotpotqa:hub_distractor_dev", "hub/hotpotqa/dev_distractor.jsonl", "hotpotqa/hotpot_qa", None, None, None,
             host="hub"),
    # Search-R1's dense retrieval (evals.dense, retriever=e5), as its README and retrieval_launch.sh fetch it
    # (scripts/download.py at a14dc3a: the index's two parts, `cat part_*`; wiki-18.jsonl.gz, `gzip -d`;
    # the encoder by hub id). The model's safetensors weights, never its pickled pytorch_model.bin.
    DataFile("encoder:e5-base-v2", "models/intfloat/e5-base-v2", "intfloat/e5-base-v2", None, "", None, host="hub_model",
             kind="dir", parts=("config.json", "model.safetensors", "special_tokens_map.json", "tokenizer.json",
                                "tokenizer_config.json", "vocab.txt"),
             alt="pass encoder=intfloat/e5-base-v2 (the hub's copy through transformers' cache, not checked here)"),
    DataFile("index:wiki18_e5_flat", "hub/wiki18/e5_Flat.index", "PeterJinGo/wiki-18-e5-index", None, "", None,
             host="hub", parts=("part_aa", "part_ab"), alt="pass index=FILE"),
    DataFile("corpus:wiki18", "hub/wiki18/wiki-18.jsonl", "PeterJinGo/wiki-18-corpus", None, "wiki-18.jsonl.gz", None,
             host="hub", gunzip=True, alt="pass corpus=FILE"),
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
    """Every known name: the pinned files (TABLE), then the unpinned ones (UNPINNED)."""
    return list(TABLE) + [n for n in UNPINNED if n not in TABLE]


def entry(name: str) -> DataFile:
    """The entry of `name` (TABLE first, then UNPINNED); an unknown name is a DataError with the nearest names."""
    if name in TABLE:
        return TABLE[name]
    if name in UNPINNED:
        return UNPINNED[name]
    raise DataError(f"unknown data name {name!r}.{did_you_mean(str(name), names())} Known: {', '.join(names())}")


def is_name(value) -> bool:
    return isinstance(value, str) and (value in TABLE or value in UNPINNED)


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


def local_path(name: str) -> Path:
    """Where `name` lives in the cache (present or not)."""
    return data_root() / entry(name).rel


def _mismatch(what: str, f: DataFile, actual: str, expected: str | None = None) -> DataError:
    return DataError(f"{what}: sha256 {actual}, expected {expected or f.sha256} for {f.name} ({f.source()}); not used")


def _recorded(p: Path) -> Path:
    """Beside an unmeasured entry's cached file: the sha256 measured when it was pre-filled."""
    return p.with_name(p.name + ".sha256")


def digest(name: str) -> str | None:
    """The sha256 `name`'s file is checked against: the table's, else (an unmeasured entry) the one
    recorded when it was pre-filled, else None (unmeasured and not pre-filled)."""
    f = entry(name)
    if f.sha256:
        return f.sha256
    rec = _recorded(local_path(name))
    return rec.read_text(encoding="utf-8").split()[0] if rec.is_file() and rec.read_text(encoding="utf-8").strip() else None


def _unmeasured(f: DataFile) -> DataError:
    where = (f"your copy of the directory, holding {', '.join(f.parts)}" if f.kind == "dir"
             else f"DIR/{f.rel.split('/', 1)[1]}, or from=FILE")
    alt = f.alt or f"pass bench_root=DIR with {f.name.split(':', 1)[0]}/<file>.jsonl"
    return DataError(f"{f.name} ({f.source()}) has no measured commit and sha256 (common.datafetch.UNPINNED), so it is "
                     f"never downloaded: pre-fill it from your copy with `fetch-data {f.name} from=DIR` ({where}; its "
                     f"sha256 is recorded then) or {alt}")


def _file_digest(p: Path) -> str:
    """sha256 of a cached file: read whole, or for a file of BIG_FILE bytes or more through the stat-keyed
    digest cache (common.fingerprint.file_digest: hashed again whenever its size or mtime changes)."""
    if p.stat().st_size >= BIG_FILE:
        from common.fingerprint import file_digest

        return file_digest(p)
    return sha256_file(p)


def _present(f: DataFile, p: Path) -> bool:
    return p.is_dir() if f.kind == "dir" else p.is_file()


def cached(name: str) -> Path | None:
    """The cached file (or directory) of `name` when present (its digest checked), else None; never the network."""
    f, p = entry(name), local_path(name)
    if not _present(f, p):
        return None
    expected = digest(name)
    if expected is None:   # an unmeasured entry's file put there by hand: nothing to check it against
        raise _unmeasured(f)
    if f.kind == "dir":
        problems = check_sha256sums(p)
        actual = sha256_file(p / SHA256SUMS) if (p / SHA256SUMS).is_file() else "(no SHA256SUMS)"
        if problems and actual == expected:
            actual = f"{actual} but {problems[0]}"
    else:
        actual = _file_digest(p)
    if actual != expected:
        raise DataError(f"{_mismatch(str(p), f, actual, expected)} (a cached file changed since it was checked: "
                        f"move it aside and run `fetch-data {name}` again)") from None
    return p


def path(name: str) -> Path:
    """The cached, checked file (or directory) of `name`, downloaded first when it is not cached (an
    unmeasured entry is refused: nothing to pin or check a download against)."""
    f = entry(name)
    found = cached(name)
    if found:
        return found
    if not f.measured:
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


def _make_parents(final: Path) -> list[Path]:
    """Create `final`'s missing parent directories; the ones made, deepest first."""
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
        except OSError:   # something else was put there meanwhile: kept
            return


def _tmp(final: Path) -> Path:
    """This process's temporary file for `final`; a killed process's (this host, pid dead) is removed first."""
    clean_dead_tmp(final)
    return tmp_name(final)


def _tree_digest(d: Path) -> str:
    """Write `SHA256SUMS` over the files of `d`; its sha256 (a directory entry's digest)."""
    return sha256_file(write_sha256sums(d))


def _commit(tmp: Path, f: DataFile, where: str) -> Path:
    """Rename the written `tmp` (file or directory) into place as `f`'s cached copy once its digest matches."""
    actual = _tree_digest(tmp) if f.kind == "dir" else sha256_file(tmp)
    if actual != f.sha256:
        raise _mismatch(where, f, actual)
    return _into_place(tmp, data_root() / f.rel)


def _into_place(tmp: Path, final: Path) -> Path:
    """os.replace, also over an earlier copy of a directory entry (the cache's own, moved away then removed)."""
    old = None
    if final.is_dir() and not final.is_symlink():
        old = final.with_name(f"{tmp.name}.old")
        os.replace(final, old)
    os.replace(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _drop(tmp: Path) -> None:
    if tmp.is_dir() and not tmp.is_symlink():
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.unlink(missing_ok=True)


def _fetch(f: DataFile, url: str, out, timeout: float) -> None:
    """Stream `url` into the open file `out` (decompressed when `f.gunzip`); a short or failed read is a DataError."""
    dec = zlib.decompressobj(16 + zlib.MAX_WBITS) if f.gunzip else None
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            declared, got = resp.headers.get("Content-Length"), 0
            while chunk := resp.read(1 << 20):
                got += len(chunk)
                out.write(dec.decompress(chunk) if dec else chunk)
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        raise DataError(f"could not download {f.name} from {url}: {exc!r}. Offline? Pre-fill the cache "
                        f"{data_root()} with `fetch-data from=DIR` (DIR laid out as <bench>/<file>)") from None
    except zlib.error as exc:
        raise DataError(f"download of {f.name} from {url}: not gzip data ({exc}); nothing cached") from None
    if declared is not None and got != int(declared):
        raise DataError(f"download of {f.name} from {url} interrupted: {got} of {declared} bytes; nothing cached")
    if dec is not None:
        out.write(dec.flush())
        if not dec.eof:
            raise DataError(f"download of {f.name} from {url}: the gzip stream ends early; nothing cached")


def _download(f: DataFile) -> Path:
    """Stream `f`'s URL(s) into a temporary file (or directory) beside its cached place, cut it to `take`,
    check it, rename it into place; on any failure the temporary copy goes and nothing is cached."""
    final = data_root() / f.rel
    made = _make_parents(final)
    tmp = _tmp(final)
    timeout = float(os.environ.get("DTSFT_DATA_TIMEOUT") or TIMEOUT_S)
    ok = False
    try:
        if f.kind == "dir":
            tmp.mkdir()
            for part in f.parts:
                (tmp / part).parent.mkdir(parents=True, exist_ok=True)
                with open(tmp / part, "wb") as out:
                    _fetch(f, f.url(part), out, timeout)
        else:
            with open(tmp, "wb") as out:
                for part in f.parts or (None,):
                    _fetch(f, f.url(part), out, timeout)
            if f.take:
                tmp.write_bytes(_take(tmp.read_bytes(), f.take, f.url()))
        done = _commit(tmp, f, f.url(f.parts[0] if len(f.parts) == 1 else None))
        ok = True
        return done
    finally:
        _drop(tmp)
        if not ok:
            _remove_made(made)


def _copy_in(f: DataFile, found: Path) -> Path:
    """Copy `found` (a file, or a directory holding a dir entry's parts) into `f`'s place, checked against
    the table's digest; an unmeasured entry's copy is taken as the user's and its digest recorded beside
    it (what later reads are checked against)."""
    final = data_root() / f.rel
    made = _make_parents(final)
    tmp = _tmp(final)
    ok = False
    try:
        if f.kind == "dir":
            tmp.mkdir()
            for part in f.parts:
                (tmp / part).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(found / part, tmp / part)
        else:
            shutil.copyfile(found, tmp)
        if f.sha256:
            done = _commit(tmp, f, str(found))
        else:
            rec = _recorded(final)
            rec_tmp = tmp_name(rec)
            try:
                rec_tmp.write_text(f"{_tree_digest(tmp) if f.kind == 'dir' else sha256_file(tmp)}  from={found}\n",
                                   encoding="utf-8")
                os.replace(rec_tmp, rec)
            finally:
                rec_tmp.unlink(missing_ok=True)
            done = _into_place(tmp, final)
        ok = True
        return done
    finally:
        _drop(tmp)
        if not ok:
            _remove_made(made)


def _holds(f: DataFile, c: Path) -> bool:
    """Whether `c` is a copy of `f`: a file, or a directory holding every one of a dir entry's parts."""
    return c.is_dir() and all((c / part).is_file() for part in f.parts) if f.kind == "dir" else c.is_file()


def prefill(src: str | Path, names: list[str] | None = None) -> dict[str, Path]:
    """Copy the named files (None: every TABLE file found) from `src`, laid out as a bench_root
    (`<bench>/<file>`) or as the cache (`<collection>/<bench>/<file>`), each checked (an unpinned
    entry, copied only when named, against the digest measured now and recorded beside it). A named
    entry is also found as `src/<its file name>`, or is `src` itself: one file entry's file (from=FILE),
    a dir entry's directory (a model dir holding its parts)."""
    src = Path(src).expanduser()
    if src.is_file():
        if not names or len(names) != 1 or entry(names[0]).kind != "file":
            raise DataError(f"from={src} is a file: name the one file entry it is a copy of (fetch-data NAME from=FILE)")
        f = entry(names[0])
        return {f.name: (cached(f.name) if f.measured else None) or _copy_in(f, src)}
    if not src.is_dir():
        raise DataError(f"from={src}: no such file or directory")
    wanted = [entry(n) for n in names] if names else list(TABLE.values())
    done = {}
    for f in wanted:
        candidates = [src / f.rel, src / f.rel.split("/", 1)[1]]
        if names:   # named: also DIR/<file> (Search-R1's save_path), and a directory entry's own dir
            candidates += [src] if f.kind == "dir" else [src / Path(f.rel).name]
        found = next((c for c in candidates if _holds(f, c)), None)
        if found is None:
            if names:
                what = f"{', '.join(f.parts)} in any of" if f.kind == "dir" else "file at any of"
                raise DataError(f"from={src}: no {what} {', '.join(str(c) for c in dict.fromkeys(candidates))} for {f.name}")
            continue
        done[f.name] = (cached(f.name) if f.measured else None) or _copy_in(f, found)
    if not done:
        raise DataError(f"from={src}: none of the known files is there (looked for <bench>/<file> as in "
                        f"{', '.join(f.rel.split('/', 1)[1] for f in wanted[:3])}, ...)")
    return done


USAGE = """usage: fetch-data [NAME ...] [from=DIR|FILE]

Downloads each named reference file (none named: every measured one) from its pinned public source
into the cache $DTSFT_DATA (now {root}), checked against its sha256; a file already cached is not
downloaded again. from=DIR copies them from DIR instead (laid out as a bench_root, DIR/<bench>/<file>,
or as the cache, DIR/<collection>/<bench>/<file>, or holding the named file: DIR/<file>; a model
directory itself for a directory entry), or from=FILE (one named file), checked the same way.
Sources: $DTSFT_DATA_ENDPOINT
(GitHub raw files), $HF_ENDPOINT (hub files, <endpoint>/datasets/<repo>/resolve/<commit>/<path>;
a model's, <endpoint>/<repo>/resolve/<commit>/<path>).
An "unpinned" name has no measured commit and sha256 here: never downloaded; `fetch-data NAME
from=DIR` takes your copy and records its sha256 beside it (later reads are checked against that).

Names:
{names}"""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if wants_help(argv):
        print(USAGE.format(root=data_root(), names="\n".join(f"  {n:34s} {entry(n).source()}" for n in names())))
        return 0
    try:
        wanted = [a for a in argv if "=" not in a]
        opts = dict(split_dotlist([a for a in argv if "=" in a]))
        if set(opts) - {"from"}:
            bad = sorted(set(opts) - {"from"})[0]
            raise DataError(f"unknown key {bad!r}.{did_you_mean(bad, ['from'])} fetch-data takes NAME ... [from=DIR]")
        for n in wanted:
            entry(n)
        if "from" in opts:
            done = prefill(opts["from"], wanted or None)
            for n, p in done.items():
                print(f"{n:34s} copied     {p}")
        else:
            for n in wanted or list(TABLE):
                how = "cached" if cached(n) else "downloaded"
                print(f"{n:34s} {how:10s} {path(n)}")
            if not wanted:
                print(f"not downloaded (unpinned: `fetch-data NAME from=DIR`): "
                      f"{', '.join(n for n in UNPINNED if n not in TABLE)}")
        return 0
    except DataError as exc:
        print(f"fetch-data: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
