"""common.datafetch: named reference files, downloaded from a loopback HTTP server (127.0.0.1 only,
bounded, stopping by itself) or pre-filled from ../shared, checked against the repository's table."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from common import datafetch
from conftest import ROOT, shared_path

BAMBOOGLE = "benchmarks/bamboogle/test.jsonl"


class Loopback:
    """Serves `files` (URL path -> bytes) on 127.0.0.1; a path in `cut` is declared whole but sent
    half, then the connection closes (an interrupted download). With `ranges`, a `Range: bytes=N-` request
    is answered 206 from byte N (Content-Range); without, Range is ignored (200, the whole file). A path in
    `redirect` answers 302 to another path (a hub's LFS redirect). Stops after `life_s` in any case."""

    def __init__(self, files: dict[str, bytes], cut: set[str] = frozenset(), life_s: float = 60.0,
                 ranges: bool = False, redirect: dict[str, str] | None = None):
        self.files, self.cut, self.requests, self.ranges = files, set(cut), [], []
        self.redirect = redirect or {}
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                owner.requests.append(self.path)
                owner.ranges.append(self.headers.get("Range"))
                if self.path in owner.redirect:
                    self.send_response(302)
                    self.send_header("Location", owner.redirect[self.path])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = owner.files.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                first = 0
                asked = self.headers.get("Range")
                if ranges and asked and asked.startswith("bytes=") and asked.endswith("-"):
                    first = int(asked[6:-1])
                    if first >= len(body):
                        self.send_error(416)
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {first}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                rest = body[first:]
                self.send_header("Content-Length", str(len(rest)))
                self.end_headers()
                self.wfile.write(rest[: len(rest) // 2] if self.path in owner.cut else rest)
                if self.path in owner.cut:
                    owner.cut.discard(self.path) if owner.cut_once else None
                    self.close_connection = True

            def log_message(self, *args):
                pass

        self.cut_once = False
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.timeout = 1.0
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self.timer = threading.Timer(life_s, self.server.shutdown)
        self.timer.daemon = True

    def __enter__(self):
        self.thread.start()
        self.timer.start()
        return self

    def __exit__(self, *exc):
        self.timer.cancel()
        self.server.shutdown()
        self.server.server_close()


def url_path(name: str) -> str:
    f = datafetch.TABLE[name]
    return f"/{f.repo}/{f.commit}/{f.src}"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DTSFT_DATA", str(tmp_path / "cache"))
    monkeypatch.setenv("DTSFT_DATA_TIMEOUT", "10")
    return tmp_path / "cache"


def cache_files(cache: Path) -> list[str]:
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file()) if cache.exists() else []


def test_a_download_is_checked_cached_and_not_repeated(cache, monkeypatch):
    body = shared_path("benchmarks", "bamboogle", "test.jsonl").read_bytes()
    with Loopback({url_path("bamboogle:test"): body}) as srv:
        monkeypatch.setenv("DTSFT_DATA_ENDPOINT", srv.url)
        assert datafetch.cached("bamboogle:test") is None and srv.requests == []  # asking is not fetching
        p = datafetch.path("bamboogle:test")
        assert p == cache / BAMBOOGLE and p.read_bytes() == body
        assert datafetch.path("bamboogle:test") == p and datafetch.cached("bamboogle:test") == p
        assert srv.requests == [url_path("bamboogle:test")]  # the second run downloads nothing
    assert cache_files(cache) == [BAMBOOGLE]


def test_a_corrupted_download_is_refused_naming_both_digests(cache, monkeypatch):
    body = bytearray(shared_path("benchmarks", "bamboogle", "test.jsonl").read_bytes())
    body[100] ^= 1
    with Loopback({url_path("bamboogle:test"): bytes(body)}) as srv:
        monkeypatch.setenv("DTSFT_DATA_ENDPOINT", srv.url)
        with pytest.raises(datafetch.DataError) as err:
            datafetch.path("bamboogle:test")
    msg = str(err.value)
    assert datafetch.TABLE["bamboogle:test"].sha256 in msg and hashlib.sha256(body).hexdigest() in msg
    assert srv.url in msg and cache_files(cache) == []
    (cache / BAMBOOGLE).parent.mkdir(parents=True, exist_ok=True)
    (cache / BAMBOOGLE).write_bytes(bytes(body))   # a cached file changed afterwards: refused, kept, never re-fetched over
    with pytest.raises(datafetch.DataError, match=r"changed since it was checked: move it aside and run `fetch-data bamboogle:test`"):
        datafetch.path("bamboogle:test")
    assert (cache / BAMBOOGLE).read_bytes() == bytes(body)


def test_an_interrupted_download_is_never_served_and_the_next_run_resumes_it(cache, monkeypatch):
    """A connection cut mid-file (every time, by a server that ignores Range): retried, then stopped with what
    arrived kept in `<file>.download/` (never at the file's place, never served); the next run asks for the
    rest only (Range), and the file is whole and checked."""
    body = shared_path("benchmarks", "bamboogle", "test.jsonl").read_bytes()
    u = url_path("bamboogle:test")
    with Loopback({u: body}, cut={u}) as srv:
        monkeypatch.setenv("DTSFT_DATA_ENDPOINT", srv.url)
        with pytest.raises(datafetch.Interrupted, match=r"interrupted: \d+ of \d+ bytes, kept in .*run it again to resume"):
            datafetch.path("bamboogle:test")
        assert len(srv.requests) == 1 + datafetch.RETRIES and datafetch.cached("bamboogle:test") is None
    kept = cache / (BAMBOOGLE + ".download") / "test.jsonl"
    assert cache_files(cache) == [str(kept.relative_to(cache))] and 0 < kept.stat().st_size < len(body)
    have = kept.stat().st_size
    with Loopback({u: body}, ranges=True) as srv:
        monkeypatch.setenv("DTSFT_DATA_ENDPOINT", srv.url)
        assert datafetch.path("bamboogle:test").read_bytes() == body
        assert srv.ranges == [f"bytes={have}-"]   # only the rest was asked for
    assert cache_files(cache) == [BAMBOOGLE]


def test_a_cut_connection_resumes_within_the_run(cache, monkeypatch):
    """A server that honours Range and cuts the first response: the same run asks for the rest and finishes."""
    body = shared_path("benchmarks", "bamboogle", "test.jsonl").read_bytes()
    u = url_path("bamboogle:test")
    with Loopback({u: body}, cut={u}, ranges=True) as srv:
        srv.cut_once = True
        monkeypatch.setenv("DTSFT_DATA_ENDPOINT", srv.url)
        assert datafetch.path("bamboogle:test").read_bytes() == body
        assert srv.ranges[0] is None and srv.ranges[1] == f"bytes={len(body) // 2}-" and len(srv.requests) == 2
    assert cache_files(cache) == [BAMBOOGLE]


def test_an_lfs_redirect_is_followed_and_a_wrong_size_refused(cache, monkeypatch):
    """The hub answers a resolve URL with a redirect to the LFS store: followed (a resumed request keeps its
    Range); a part whose size is not the pinned one is refused before it is served, naming both sizes."""
    body = shared_path("benchmarks", "bamboogle", "test.jsonl").read_bytes()
    f = dataclasses.replace(datafetch.LARGE["bamboogle:hub"], commit="c" * 40,
                            pins=(datafetch.Pin("test.jsonl", hashlib.sha256(body).hexdigest(), len(body)),))
    monkeypatch.setitem(datafetch.LARGE, f.name, f)
    resolve = f"/datasets/{f.repo}/resolve/{'c' * 40}/bamboogle/test.jsonl"
    with Loopback({"/lfs/blob": body}, cut={"/lfs/blob"}, ranges=True, redirect={resolve: "/lfs/blob"}) as srv:
        srv.cut_once = True
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        assert datafetch.path(f.name).read_bytes() == body
        assert srv.requests == [resolve, "/lfs/blob", resolve, "/lfs/blob"] and srv.ranges[3] == f"bytes={len(body) // 2}-"
    (cache / f.rel).unlink()
    wrong = dataclasses.replace(f, pins=(datafetch.Pin("test.jsonl", None, len(body) + 1),), sha256=None)
    monkeypatch.setitem(datafetch.LARGE, f.name, wrong)
    with Loopback({resolve: body}) as srv:
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        with pytest.raises(datafetch.DataError, match=rf"{len(body)} bytes, expected {len(body) + 1} "):
            datafetch.path(f.name)
    assert cache_files(cache) == []


def tree(root: Path) -> list[str]:
    """Every file and directory under `root` (root itself included when it exists)."""
    return sorted(["."] + [str(p.relative_to(root)) for p in root.rglob("*")]) if root.exists() else []


@pytest.mark.parametrize("failure", ["corrupted", "unreachable"])
def test_a_failed_download_leaves_nothing_behind(cache, monkeypatch, failure):
    """No file and no directory that was not there before: a fresh cache stays absent; in a cache that
    exists, the directories the download made go and the ones that were there stay."""
    body = bytearray(shared_path("benchmarks", "bamboogle", "test.jsonl").read_bytes())
    if failure == "corrupted":
        body[100] ^= 1
    cut = {url_path("bamboogle:test")} if failure == "interrupted" else set()
    with Loopback({url_path("bamboogle:test"): bytes(body)}, cut=cut) as srv:
        monkeypatch.setenv("DTSFT_DATA_ENDPOINT", srv.url if failure != "unreachable" else "http://127.0.0.1:9")
        with pytest.raises(datafetch.DataError):
            datafetch.path("bamboogle:test")
        assert not cache.exists()
        (cache / "benchmarks" / "nq").mkdir(parents=True)   # a cache in use: its directories are kept
        (cache / "benchmarks" / "nq" / "notes.txt").write_text("mine")
        before = tree(cache)
        with pytest.raises(datafetch.DataError):
            datafetch.path("bamboogle:test")
        assert tree(cache) == before == [".", "benchmarks", "benchmarks/nq", "benchmarks/nq/notes.txt"]


def test_a_killed_downloads_leftover_goes_with_the_next_download(cache, monkeypatch):
    """SIGKILL mid-download leaves `<file>.tmp-<host>-<pid>` (never read as the file); the next download
    on this host removes it once that pid is dead."""
    from common.io import tmp_name

    body = shared_path("benchmarks", "bamboogle", "test.jsonl").read_bytes()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    final = cache / BAMBOOGLE
    final.parent.mkdir(parents=True)
    leftover = tmp_name(final).with_name(tmp_name(final).name.rsplit("-", 1)[0] + f"-{dead.pid}")
    leftover.write_bytes(body[:100])
    assert datafetch.cached("bamboogle:test") is None
    with Loopback({url_path("bamboogle:test"): body}) as srv:
        monkeypatch.setenv("DTSFT_DATA_ENDPOINT", srv.url)
        datafetch.path("bamboogle:test")
    assert cache_files(cache) == [BAMBOOGLE]


def test_prefixes_of_a_source_keep_its_bytes(cache, monkeypatch):
    """`take`: the first N lines of a longer file; the first N elements of a (truncated) JSON array."""
    musique = shared_path("benchmarks-context", "musique", "dev_ans_paragraphs_20.jsonl").read_bytes()
    hotpot = shared_path("benchmarks-context", "hotpotqa", "dev_distractor_30.jsonl").read_bytes().decode()
    array = "[" + ", ".join(hotpot.splitlines()) + ', {"_id": "cut-off'   # as committed upstream: a truncated prefix
    files = {url_path("musique:ans_dev_20"): musique + b'{"id": "another row"}\n',
             url_path("hotpotqa:distractor_dev_30"): array.encode()}
    with Loopback(files) as srv:
        monkeypatch.setenv("DTSFT_DATA_ENDPOINT", srv.url)
        assert datafetch.path("musique:ans_dev_20").read_bytes() == musique
        assert datafetch.path("hotpotqa:distractor_dev_30").read_text() == hotpot


def test_hub_files_use_the_same_downloader(cache, monkeypatch):
    body = shared_path("benchmarks", "bamboogle", "test.jsonl").read_bytes()
    f = datafetch.DataFile("bamboogle:hub_copy", "benchmarks/bamboogle/test.jsonl", "org/data", "c" * 40, "test.jsonl",
                           datafetch.TABLE["bamboogle:test"].sha256, host="hub")
    monkeypatch.setitem(datafetch.TABLE, f.name, f)
    with Loopback({f"/datasets/org/data/resolve/{'c' * 40}/test.jsonl": body}) as srv:
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        assert datafetch.path(f.name).read_bytes() == body


def _pinned(name: str, body: bytes, commit: str = "c" * 40, **changes) -> datafetch.DataFile:
    """`name`'s table entry as it reads once its commit and digest are measured (the real ones are not: no hub access)."""
    return dataclasses.replace(datafetch.entry(name), commit=commit, sha256=hashlib.sha256(body).hexdigest(), **changes)


def test_a_hub_set_is_fetched_by_the_one_downloader_once_pinned(cache, monkeypatch):
    """`nq:hub` (FlashRAG's nq test split) with a pinned commit and digest: evaluate's loader fetches it from
    $HF_ENDPOINT/datasets/<repo>/resolve/<commit>/<path> into the cache, once; its identity names the commit."""
    from evals.benches import HUB_REPO, HUB_SPLITS, load_bench
    from evals.config import resolve
    from evals.run import bench_request

    assert {b: (datafetch.LARGE[f"{b}:hub"].repo, datafetch.LARGE[f"{b}:hub"].src) for b in HUB_SPLITS} == {
        b: (HUB_REPO, f"{b}/{split}.jsonl") for b, split in HUB_SPLITS.items()}   # the table's hub sets are the loader's
    body = shared_path("benchmarks", "fixtures", "flashrag_quickstart_nq_test_17.jsonl").read_bytes()
    f = _pinned("nq:hub", body)
    monkeypatch.setitem(datafetch.TABLE, f.name, f)
    url = f"/datasets/RUC-NLPIR/FlashRAG_datasets/resolve/{'c' * 40}/nq/test.jsonl"
    with Loopback({url: body}) as srv:
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        items, source, _ = load_bench("nq", None, 5, 42, {"nq": "nq:hub"})
        again, _, _ = load_bench("nq", None, 5, 42, {"nq": "nq:hub"})
        assert srv.requests == [url]   # the second load downloads nothing
    assert source == str(cache / "hub/nq/flashrag_test.jsonl") and len(items) == 5 and again == items
    rows = [json.loads(x) for x in body.decode().splitlines()]
    assert {it.id for it in items} <= {str(r["id"]) for r in rows}
    base = {"ckpt": "tiny_base", "out": str(cache / "o"), "benches": ["nq"], "corpus": "corpus:wiki18_example_10",
            "sets": {"nq": "nq:hub"}}
    keys = json.dumps(bench_request("nq", resolve(base), {"kind": "stand-in"})["keys"])
    assert f"hub:RUC-NLPIR/FlashRAG_datasets@{'c' * 40}:nq/test.jsonl" in keys and f.sha256 in keys


def test_a_hub_dev_set_array_becomes_lines_through_the_downloader(cache, monkeypatch):
    """2Wiki's dev.json is one JSON array: kept as one element per line (`take`), read in mode given."""
    from evals import benches

    lines = shared_path("benchmarks-context", "2wikimultihopqa", "dev_context_20.jsonl").read_bytes()
    array = b"[" + b", ".join(lines.splitlines()) + b"]"
    f = _pinned("2wikimultihopqa:hub_dev", lines, take=("json_array", 20))
    monkeypatch.setitem(datafetch.TABLE, f.name, f)
    monkeypatch.setitem(benches.HUB_CONTEXT, "2wikimultihopqa", benches.HubContext(f.name, 20))
    url = f"/datasets/kamelliao/2wikimultihopqa/resolve/{'c' * 40}/data/dev.json"
    with Loopback({url: array}) as srv:
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        items, _, _ = benches.load_bench("2wikimultihopqa@given", None, 4, 42)   # the default set of mode given
    assert srv.requests == [url] and len(items) == 4 and all(it.paragraphs for it in items)
    assert (cache / f.rel).read_bytes() == lines


def test_an_unpinned_hub_set_is_refused_until_prefilled(cache, monkeypatch, tmp_path):
    """An entry with no public commit (2Wiki's dev.json): loading it asks nothing of the network and says in one
    line why and how to pre-fill it; `fetch-data NAME from=DIR` then takes the user's copy, records its digest
    (the identity names it) and checks later reads against it."""
    from evals import benches

    with Loopback({}) as srv:
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        with pytest.raises(benches.BenchError) as err:
            benches.load_bench("2wikimultihopqa@given", None, 4, 42)
        assert srv.requests == []
    msg = str(err.value)
    assert "\n" not in msg and "has no pinned commit (no public record pins a commit of kamelliao" in msg
    assert "`fetch-data 2wikimultihopqa:hub_dev from=DIR` (DIR/2wikimultihopqa/dev.jsonl" in msg
    assert "bench_root=DIR with 2wikimultihopqa/<file>.jsonl" in msg and cache_files(cache) == []
    sample = shared_path("benchmarks-context", "2wikimultihopqa", "dev_context_20.jsonl").read_bytes()
    mine = tmp_path / "mine" / "2wikimultihopqa"
    mine.mkdir(parents=True)
    (mine / "dev.jsonl").write_bytes(sample)
    with pytest.raises(datafetch.DataError, match="none of the known files"):   # unpinned: taken only when named
        datafetch.prefill(mine.parent)
    proc = _cli("2wikimultihopqa:hub_dev", f"from={mine.parent}", cache=cache)
    assert proc.returncode == 0, proc.stderr
    digest = hashlib.sha256(sample).hexdigest()
    assert datafetch.digest("2wikimultihopqa:hub_dev") == digest and "recorded, not checked" in proc.stderr
    with pytest.raises(benches.BenchError, match=r"20 rows, expected 12576; not the dev set"):   # the full dev set's count
        benches.load_bench("2wikimultihopqa@given", None, 4, 42)
    monkeypatch.setitem(benches.HUB_CONTEXT, "2wikimultihopqa", benches.HubContext("2wikimultihopqa:hub_dev", 20))
    items, source, _ = benches.load_bench("2wikimultihopqa@given", None, 4, 42)
    assert len(items) == 4 and source == str(cache / "hub/2wikimultihopqa/dev.jsonl")
    from evals.config import resolve
    from evals.run import bench_request

    keys = json.dumps(bench_request("2wikimultihopqa@given", resolve({"ckpt": "t", "out": str(tmp_path / "o"),
                                    "benches": ["2wikimultihopqa@given"]}), {"kind": "x"})["keys"])
    assert digest in keys and "hub:kamelliao/2wikimultihopqa@unpinned:data/dev.json" in keys
    Path(source).write_bytes(sample.replace(b"a", b"b", 1))   # changed after it was recorded: refused
    with pytest.raises(datafetch.DataError, match=r"changed since it was checked"):
        benches.load_bench("2wikimultihopqa@given", None, 4, 42)


def test_serve_retriever_takes_a_corpus_name_through_the_cache(cache, tmp_path):
    """`serve-retriever corpus=corpus:wiki18_example_10`: fetched into the data cache (checked) and served;
    a mistyped name is a one-line error naming the nearest (evaluate's words: retriever_problem)."""
    import re

    from evals.retrievers import HttpRetriever

    body = shared_path("benchmarks", "corpus", "wiki18_example_10.jsonl").read_bytes()
    env = dict(os.environ, PYTHONPATH=str(ROOT), DTSFT_DATA=str(cache), OMP_NUM_THREADS="1")
    argv = [sys.executable, "-m", "evals.server", "port=0", f"index_dir={tmp_path / 'idx'}"]
    bad = subprocess.run(argv + ["corpus=corpus:wiki18_example_1"], env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "corpus=corpus:wiki18_example_1: unknown data name. Did you mean" in bad.stderr
    assert "corpus:wiki18_example_10" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    with Loopback({url_path("corpus:wiki18_example_10"): body}) as srv:
        env["DTSFT_DATA_ENDPOINT"] = srv.url
        proc = subprocess.Popen(argv + ["corpus=corpus:wiki18_example_10"], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, cwd=str(tmp_path))
        try:
            line = proc.stdout.readline()
            m = re.search(r"serving (\d+) docs from (\S+) at (http://127\.0\.0\.1:\d+/retrieve)", line)
            assert m, f"server did not start: {line!r}"
            assert m.group(1) == "10" and m.group(2) == str(cache / "benchmarks/corpus/wiki18_example_10.jsonl")
            docs = HttpRetriever(m.group(3), timeout=10, retries=2, backoff=0.2).search(["college house"], 2)  # two docs hold these (BM25: matches only)
            assert len(docs) == 1 and len(docs[0]) == 2
        finally:
            proc.terminate()
            proc.wait(timeout=10)
        assert srv.requests == [url_path("corpus:wiki18_example_10")]
    assert cache_files(cache) == ["benchmarks/corpus/wiki18_example_10.jsonl"]


def test_offline_says_how_to_prefill(cache, monkeypatch):
    monkeypatch.setenv("DTSFT_DATA_ENDPOINT", "http://127.0.0.1:9")   # nothing listens there
    with pytest.raises(datafetch.DataError, match=r"could not download nq:seed42_1000 .*fetch-data nq:seed42_1000 from=DIR"):
        datafetch.path("nq:seed42_1000")


def _cli(*args, cache):
    env = dict(os.environ, PYTHONPATH=str(ROOT), DTSFT_DATA=str(cache), DTSFT_DATA_ENDPOINT="http://127.0.0.1:9")
    return subprocess.run([sys.executable, "-m", "common.datafetch", *args], env=env, capture_output=True, text=True,
                          timeout=60)


def test_fetch_data_from_a_directory_prefills_the_cache(tmp_path):
    shared, cache = shared_path("benchmarks"), tmp_path / "cache"
    proc = _cli(f"from={shared}", cache=cache)
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 9   # every benchmarks/ file of the table
    proc = _cli("musique:ans_dev_20", f"from={shared.parent / 'benchmarks-context'}", cache=cache)
    assert proc.returncode == 0, proc.stderr
    for f in datafetch.TABLE.values():
        if f.name != "hotpotqa:distractor_dev_30" and f.name != "2wikimultihopqa:dev_context_20":
            assert hashlib.sha256((cache / f.rel).read_bytes()).hexdigest() == f.sha256
    again = _cli(cache=cache)   # everything cached but two, which are not reachable: the error names it
    assert again.returncode == 2 and "could not download hotpotqa:distractor_dev_30" in again.stderr
    assert _cli("musique:ans_dev_20", "nq:seed42_1000", cache=cache).returncode == 0   # cached: no network


def test_fetch_data_refuses_bad_input(tmp_path):
    cache = tmp_path / "cache"
    proc = _cli("nq:seed42_100", cache=cache)
    assert proc.returncode == 2 and proc.stderr.startswith("error: unknown data name 'nq:seed42_100'")
    assert "nq:seed42_1000" in proc.stderr and _cli("form=x", cache=cache).stderr.startswith("error: unknown key 'form'. Did you mean: from")
    bad = tmp_path / "mine" / "bamboogle"
    bad.mkdir(parents=True)
    (bad / "test.jsonl").write_text('{"id": "x", "question": "q", "golden_answers": ["a"]}\n')
    proc = _cli("bamboogle:test", f"from={bad.parent}", cache=cache)
    assert proc.returncode == 2 and "expected c9703dae6bb1ceb9" in proc.stderr and cache_files(cache) == []
    proc = _cli("nq:seed42_1000", f"from={bad.parent}", cache=cache)
    assert proc.returncode == 2 and "no " in proc.stderr and "nq/test_seed42_1000.jsonl" in proc.stderr
    assert "nq:seed42_1000" in _cli("--help", cache=cache).stdout


def test_an_empty_from_or_one_that_is_no_file_or_directory_is_named_for_what_it_is(cache, tmp_path, capfd):
    """`from=` with no value was read as the current directory (searched, silently); a FIFO or a device was
    "no such file or directory" though it exists. Each is one line saying what it is, exit 2, nothing cached."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for value, said in (("", "from= names no file or directory (empty)"),
                        (str(fifo), f"from={fifo}: not a regular file or a directory"),
                        ("/dev/null", "from=/dev/null: not a regular file or a directory")):
        assert datafetch.main(["bamboogle:test", f"from={value}"]) == 2
        err = capfd.readouterr().err
        assert err == f"error: {said}\n", err   # every command's convention (seen: "fetch-data: ...")
    assert cache_files(cache) == []


def test_a_dry_run_never_waits_on_the_network(tmp_path):
    """HF_HUB_OFFLINE unset and the hub and data endpoints a loopback port that accepts and never answers:
    a launch dry run of data=hub (tokenizer from the hub, decontamination sets) ends at once, saying in one
    line what it could not check, and downloads nothing."""
    import socket
    import time

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)   # connections queue in the backlog; nothing ever reads or answers
    url = f"http://127.0.0.1:{silent.getsockname()[1]}"
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")}
    env.update(PYTHONPATH=str(ROOT), HF_ENDPOINT=url, DTSFT_DATA_ENDPOINT=url, DTSFT_DATA=str(tmp_path / "cache"),
               HF_HOME=str(tmp_path / "hf"), WANDB_MODE="disabled")
    try:
        start = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "launch.cli", "arm=r2e", "model=qwen3_4b_thinking_2507", "data=hub",
                               f"runs_root={tmp_path / 'runs'}", "dry_run=true"], env=env, capture_output=True, text=True,
                              timeout=120)
        took = time.monotonic() - start
        # analyze's plan: the anchor's identity and each bench's named set, neither fetched
        plan = subprocess.run([sys.executable, "-m", "launch.analyze", f"runs_root={tmp_path / 'runs'}", "profile=search_r1_7bench",
                               "anchor=Qwen/Qwen3-4B-Thinking-2507", "corpus=corpus:wiki18_example_10",
                               f"out={tmp_path / 'rep'}", "dry_run=true"], env=env, capture_output=True, text=True, timeout=120)
        took_plan = time.monotonic() - start - took
    finally:
        silent.close()
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert took < 60, f"a dry run took {took:.0f} s"
    assert "dataset cache key not computable here: model.tokenizer=Qwen/Qwen3-4B-Thinking-2507" in proc.stdout
    assert plan.returncode == 0 and "evaluations to run: 1" in plan.stdout, plan.stderr[-2000:]
    assert took_plan < 60, f"analyze's dry run took {took_plan:.0f} s"
    assert not (tmp_path / "cache").exists() and not (tmp_path / "runs").exists() and not (tmp_path / "rep").exists()


def test_a_bench_identity_names_its_set_without_fetching_it(tmp_path, cache):
    """evaluate's identity of a bench read from a named set: the set's name, pinned source and digest, computed
    with nothing cached (planning fetches nothing); another set of the same bench is another identity."""
    from evals.config import resolve
    from evals.run import bench_request

    base = {"ckpt": "tiny_base", "out": str(tmp_path / "out"), "benches": ["nq"], "corpus": "corpus:wiki18_example_10"}
    ckpt = {"kind": "stand-in"}
    default = bench_request("nq", resolve(base), ckpt)
    body = json.dumps(default["keys"])
    f = datafetch.TABLE["nq:seed42_1000"]
    assert "nq:seed42_1000" in body and f.source() in body and f.sha256 in body
    other = bench_request("nq", resolve({**base, "sets": {"nq": "nq:flashrag_quickstart_17"}}), ckpt)
    assert other["fingerprint"] != default["fingerprint"]
    assert datafetch.cached("nq:seed42_1000") is None and datafetch.cached("corpus:wiki18_example_10") is None


def test_a_bench_root_without_the_bench_names_what_it_looked_for(tmp_path):
    from evals.benches import BenchError, load_bench

    (tmp_path / "musique").mkdir()
    (tmp_path / "musique" / "dev.json").write_text("[]")
    with pytest.raises(BenchError, match=r"does not hold bench 'musique': looked for .*musique/\*\.jsonl; it holds \['dev.json'\]"):
        load_bench("musique", tmp_path, 5, 42)


def test_no_user_path_names_shared():
    """No code path, recipe, study file or user doc needs ../shared (the tests and bench/ may read it)."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    proc = subprocess.run(["git", "grep", "-n", r"\.\./shared", "--", ".", ":!tests", ":!bench"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stdout == "", proc.stdout


# --- trust V (#62.3, .8, .12) and the from=DIR layouts (#63.3) ---

ENCODER = ROOT / "tests" / "data" / "search_r1_e5" / "encoder"


def _tiny_encoder_entry(monkeypatch) -> datafetch.DataFile:
    """encoder:e5-base-v2 listing the committed tiny encoder's files (the real entry lists e5-base-v2's six)."""
    f = dataclasses.replace(datafetch.entry("encoder:e5-base-v2"), parts=tuple(sorted(p.name for p in ENCODER.iterdir())),
                            pins=(), sha256=None)
    monkeypatch.setitem(datafetch.TABLE, f.name, f)   # TABLE is looked at first
    return f


def _tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_from_the_entrys_own_place_verifies_it_there_and_deletes_nothing(cache, monkeypatch, capfd):
    """`fetch-data encoder:e5-base-v2 from=$DTSFT_DATA/models/intfloat/e5-base-v2` — the directory the refusal tells
    users to fill — holding the parts and more (README.md, onnx/model.onnx, pytorch_model.bin): checked where it
    is, its digest recorded; every file kept byte for byte, only a SHA256SUMS over the parts added."""
    f = _tiny_encoder_entry(monkeypatch)
    model = cache / f.rel
    shutil.copytree(ENCODER, model)
    (model / "README.md").write_text("mine")
    (model / "onnx").mkdir()
    (model / "onnx" / "model.onnx").write_bytes(b"onnx")
    (model / "pytorch_model.bin").write_bytes(b"pickle")
    before = _tree_bytes(model)
    assert datafetch.main([f.name, f"from={model}"]) == 0
    out = capfd.readouterr()
    assert "verified in place" in out.out and "recorded, not checked" in out.err
    after = _tree_bytes(model)
    assert {k: v for k, v in after.items() if k != "SHA256SUMS"} == before
    assert sorted(after["SHA256SUMS"].decode().split()[1::2]) == sorted(f.parts)
    assert datafetch.cached(f.name) == model and datafetch.digest(f.name) == hashlib.sha256(after["SHA256SUMS"]).hexdigest()
    assert datafetch.main([f.name, f"from={model}"]) == 0 and _tree_bytes(model) == after   # again: checked, nothing changes
    (model / "config.json").write_text("{}")   # the user's part changed: refused in one line, nothing changed
    mine = _tree_bytes(model)
    assert datafetch.main([f.name, f"from={model}"]) == 2 and _tree_bytes(model) == mine
    assert len(capfd.readouterr().err.strip().splitlines()) == 1


def test_a_refill_with_a_different_copy_renames_the_old_one_aside(cache, tmp_path, capfd):
    """An unpinned entry filled twice from two different copies: the second is taken, the first (and its record)
    renamed aside as `.replaced-<UTC>`, nothing deleted."""
    sample = shared_path("benchmarks-context", "2wikimultihopqa", "dev_context_20.jsonl").read_bytes()
    first, second = tmp_path / "a" / "2wikimultihopqa", tmp_path / "b" / "2wikimultihopqa"
    first.mkdir(parents=True)
    second.mkdir(parents=True)
    (first / "dev.jsonl").write_bytes(sample)
    (second / "dev.jsonl").write_bytes(sample.splitlines(keepends=True)[0])
    assert datafetch.main(["2wikimultihopqa:hub_dev", f"from={first.parent}"]) == 0
    assert datafetch.main(["2wikimultihopqa:hub_dev", f"from={second.parent}"]) == 0
    d = cache / "hub/2wikimultihopqa"
    aside = sorted(p.name for p in d.iterdir() if ".replaced-" in p.name)
    assert len(aside) == 2 and (d / aside[0]).read_bytes() == sample   # dev.jsonl.replaced-*, dev.jsonl.sha256.replaced-*
    assert (d / "dev.jsonl").read_bytes() == (second / "dev.jsonl").read_bytes()
    assert datafetch.digest("2wikimultihopqa:hub_dev") == hashlib.sha256((second / "dev.jsonl").read_bytes()).hexdigest()


def test_a_symlinked_cache_entry_is_refused_in_one_line_never_followed_renamed_or_recorded(cache, tmp_path, monkeypatch,
                                                                                            capfd):
    """Issue 62: the entry's place is a symlink to the user's directory (holding the parts and a note). A fill from
    elsewhere, a fill from the link itself and a plain fetch are each refused in one line (exit 2) naming the entry
    and the link's target; the link stays, nothing is renamed aside, no .sha256 or SHA256SUMS is written, the
    directory it points to is untouched. (A fill used to rename the link aside; one from the link wrote into it.)"""
    f = _tiny_encoder_entry(monkeypatch)
    theirs = tmp_path / "theirs"
    shutil.copytree(ENCODER, theirs)
    (theirs / "notes.txt").write_text("mine")
    before = _tree_bytes(theirs)
    model = cache / f.rel
    model.parent.mkdir(parents=True)
    model.symlink_to(theirs, target_is_directory=True)
    for argv in ([f.name, f"from={ENCODER}"], [f.name, f"from={model}"], [f.name]):
        assert datafetch.main(argv) == 2, argv
        err = capfd.readouterr().err
        assert len(err.strip().splitlines()) == 1 and f"{model} is a symlink to {theirs}" in err, (argv, err)
        assert sorted(p.name for p in model.parent.iterdir()) == [model.name] and os.readlink(model) == str(theirs)
        assert _tree_bytes(theirs) == before
    model.unlink()   # the entry's recorded digest a link: refused alike, nothing written through it or in its place
    record = model.with_name(model.name + ".sha256")
    record.symlink_to(tmp_path / "their.sha256")
    assert datafetch.main([f.name, f"from={ENCODER}"]) == 2
    assert f"{record} is a symlink to {tmp_path / 'their.sha256'}" in capfd.readouterr().err
    assert sorted(p.name for p in model.parent.iterdir()) == [record.name] and not (tmp_path / "their.sha256").exists()


def _unwritable(tmp_path: Path) -> Path:
    """A cache directory this process cannot write in (root ignores mode bits: then a sysfs directory)."""
    if os.geteuid() != 0:
        d = tmp_path / "ro"
        d.mkdir()
        d.chmod(0o555)
        return d
    return Path("/sys/kernel/dtsft-cache")


@pytest.mark.parametrize("case", ["DTSFT_DATA is a file", "read-only cache"])
def test_a_cache_that_cannot_be_written_is_one_line(tmp_path, case):
    shared = shared_path("benchmarks")
    root = tmp_path / "afile" if case == "DTSFT_DATA is a file" else _unwritable(tmp_path)
    if case == "DTSFT_DATA is a file":
        root.write_text("not a directory")
    for argv in (["bamboogle:test", f"from={shared}"], ["bamboogle:test"]):
        proc = _cli(*argv, cache=root)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "Traceback" not in proc.stderr and str(root) in proc.stderr
    if case == "DTSFT_DATA is a file":
        assert root.read_text() == "not a directory"


def test_a_big_cached_file_edited_in_place_is_refused(cache, monkeypatch, tmp_path):
    """A cached file over BIG_FILE is checked through the stat-keyed digest cache: an in-place edit that keeps the
    size and puts the mtime back is still seen (the key has the inode and the ctime too)."""
    monkeypatch.setattr(datafetch, "BIG_FILE", 1)   # every file is "big" here
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    datafetch.prefill(shared_path("benchmarks"), ["bamboogle:test"])
    p = datafetch.cached("bamboogle:test")
    st = p.stat()
    body = bytearray(p.read_bytes())
    body[10] ^= 1
    with open(p, "r+b") as out:   # same inode, same size
        out.write(bytes(body))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert p.stat().st_size == st.st_size and p.stat().st_mtime_ns == st.st_mtime_ns
    with pytest.raises(datafetch.DataError, match="changed since it was checked"):
        datafetch.cached("bamboogle:test")


def test_from_dir_in_the_upstream_repositorys_layout(cache, tmp_path):
    """DIR as a clone of the source repository: `data_subsample/bamboogle/test.jsonl` (reason_over_search's path)
    and `data/musique.json` (MIGRES's, whose first 20 lines the entry keeps) fill the cache, checked."""
    clone = tmp_path / "clone"
    (clone / "data_subsample" / "bamboogle").mkdir(parents=True)
    shutil.copyfile(shared_path("benchmarks", "bamboogle", "test.jsonl"), clone / "data_subsample/bamboogle/test.jsonl")
    musique = shared_path("benchmarks-context", "musique", "dev_ans_paragraphs_20.jsonl").read_bytes()
    (clone / "data").mkdir()
    (clone / "data" / "musique.json").write_bytes(musique + b'{"id": "row 21"}\n')
    assert set(datafetch.prefill(clone)) == {"bamboogle:test", "musique:ans_dev_20"}   # unnamed: the TABLE files found
    assert datafetch.cached("musique:ans_dev_20").read_bytes() == musique
    assert cache_files(cache) == sorted([BAMBOOGLE, datafetch.TABLE["musique:ans_dev_20"].rel])


def test_an_official_url_is_a_source_checked_by_its_published_digest(cache, monkeypatch, capfd):
    """HotpotQA's dev file from its authors' URL (outside GitHub and the hub): the downloaded file is checked
    against the published sha256 and size, kept one array element per line (its digest recorded, not checked);
    a file that is not the published one is refused naming both digests, nothing cached."""
    lines = shared_path("benchmarks-context", "hotpotqa", "dev_distractor_30.jsonl").read_bytes()
    array = b"[" + b", ".join(lines.splitlines()) + b"]"
    with Loopback({"/datasets/hotpot/dev.json": array, "/bad.json": array.replace(b"a", b"b", 1)}) as srv:
        real = datafetch.entry("hotpotqa:hub_distractor_dev")
        assert real.host == "url" and real.pin(real.source_parts()[0]).size == 46_320_117
        f = dataclasses.replace(real, src=f"{srv.url}/datasets/hotpot/dev.json", take=("json_array", 30),
                                pins=(datafetch.Pin("dev.json", hashlib.sha256(array).hexdigest(), len(array)),))
        monkeypatch.setitem(datafetch.LARGE, f.name, f)
        assert datafetch.path(f.name).read_bytes() == lines and "recorded, not checked" in capfd.readouterr().err
        (cache / f.rel).unlink()
        (cache / (f.rel + ".sha256")).unlink()
        bad = dataclasses.replace(f, src=f"{srv.url}/bad.json", pins=(datafetch.Pin("bad.json", f.pins[0].sha256),))
        monkeypatch.setitem(datafetch.LARGE, f.name, bad)
        with pytest.raises(datafetch.DataError) as err:
            datafetch.path(f.name)
    assert f"expected {f.pins[0].sha256} for hotpotqa:hub_distractor_dev part bad.json" in str(err.value)
    assert hashlib.sha256(array.replace(b"a", b"b", 1)).hexdigest() in str(err.value) and cache_files(cache) == []
