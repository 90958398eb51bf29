"""Search-R1's dense-retrieval artefacts as `fetch-data` names (common.datafetch): the E5 encoder (a model
directory), the wiki-18 flat index (two published parts, concatenated) and the wiki-18 corpus (gzip), each
downloaded from a loopback server by the one downloader once pinned, refused while unpinned until pre-filled,
and resolved by `retriever=e5` through the cache. The files served are the committed Search-R1 oracle's
(tests/data/search_r1_e5): the retriever built from the fetched names must return Search-R1's ids."""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile

import pytest

from common import datafetch
from conftest import ROOT
from test_datafetch import Loopback

DATA = ROOT / "tests" / "data" / "search_r1_e5"
ENCODER, CORPUS, INDEX = DATA / "encoder", DATA / "corpus.jsonl", DATA / "e5_Flat.index"
ENCODER_FILES = tuple(sorted(p.name for p in ENCODER.iterdir()))
QUERIES = json.loads((DATA / "queries.json").read_text())
THEIRS = json.loads((DATA / "topk.json").read_text())
C = "c" * 40


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DTSFT_DATA", str(tmp_path / "cache"))
    monkeypatch.setenv("DTSFT_DATA_TIMEOUT", "10")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))   # offsets + the digest cache
    return tmp_path / "cache"


def sums_digest(files: dict[str, bytes]) -> str:
    """sha256 of the SHA256SUMS `sha256sum` would write over `files` (a dir entry's digest)."""
    text = "".join(f"{hashlib.sha256(b).hexdigest()}  {n}\n" for n, b in sorted(files.items()))
    return hashlib.sha256(text.encode()).hexdigest()


def pin(monkeypatch, name: str, digest: str | None, **changes) -> datafetch.DataFile:
    """`name`'s entry at commit C with the test's files (the real parts are 40 GiB: their pins do not apply)."""
    f = dataclasses.replace(datafetch.entry(name), commit=C, sha256=digest, **{"pins": (), **changes})
    monkeypatch.setitem(datafetch.TABLE, name, f)
    return f


MEMBER = datafetch.LARGE["corpus:wiki18"].member


def tar_gz(corpus: bytes) -> bytes:
    """wiki-18.jsonl.gz as published: a gzipped tar holding the corpus as MEMBER."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        info = tarfile.TarInfo(MEMBER)
        info.size, info.mtime = len(corpus), 0
        tf.addfile(info, io.BytesIO(corpus))
    return buf.getvalue()


def served(index_body: bytes | None = None, corpus_body: bytes | None = None, encoder: dict | None = None):
    """URL path -> bytes, at the hub's URLs of the three entries (a model repo's have no /datasets/)."""
    index_body = INDEX.read_bytes() if index_body is None else index_body
    half = len(index_body) // 2
    files = {f"/datasets/PeterJinGo/wiki-18-e5-index/resolve/{C}/part_aa": index_body[:half],
             f"/datasets/PeterJinGo/wiki-18-e5-index/resolve/{C}/part_ab": index_body[half:],
             f"/datasets/PeterJinGo/wiki-18-corpus/resolve/{C}/wiki-18.jsonl.gz":
                 tar_gz(CORPUS.read_bytes() if corpus_body is None else corpus_body)}
    for n, b in (encoder or {n: (ENCODER / n).read_bytes() for n in ENCODER_FILES}).items():
        files[f"/intfloat/e5-base-v2/resolve/{C}/{n}"] = b
    return files


def pin_all(monkeypatch):
    enc = pin(monkeypatch, "encoder:e5-base-v2", sums_digest({n: (ENCODER / n).read_bytes() for n in ENCODER_FILES}),
              parts=ENCODER_FILES)   # the tiny encoder's files (the real entry lists e5-base-v2's six)
    idx = pin(monkeypatch, "index:wiki18_e5_flat", hashlib.sha256(INDEX.read_bytes()).hexdigest())
    cor = pin(monkeypatch, "corpus:wiki18", hashlib.sha256(CORPUS.read_bytes()).hexdigest())
    return enc, idx, cor


def e5_config(**kw):
    from omegaconf import OmegaConf

    return OmegaConf.create({"retriever": "e5", "corpus": "corpus:wiki18", "encoder": "encoder:e5-base-v2",
                             "index": "index:wiki18_e5_flat", "index_dir": None, "encoder_device": "cpu", **kw})


def test_pinned_dense_artefacts_download_once_and_retrieve_as_search_r1(cache, monkeypatch):
    """A model dir (its files + SHA256SUMS), an index from two concatenated parts and a gzip corpus, by the one
    downloader, once; `retriever=e5` over the three names returns Search-R1's top-k ids; the identity names
    the encoder's and the index's digests."""
    from evals.config import resolve
    from evals.identity import bench_identity, checkpoint_identity
    from evals.retrievers import make_retriever

    enc, idx, cor = pin_all(monkeypatch)
    files = served()
    with Loopback(files) as srv:
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        retriever = make_retriever(e5_config())
        again = make_retriever(e5_config())
        assert sorted(srv.requests) == sorted(files)   # each file once: the second retriever downloads nothing
    model = cache / "models/intfloat/e5-base-v2"
    assert sorted(p.name for p in model.iterdir()) == sorted((*ENCODER_FILES, "SHA256SUMS"))
    assert checkpoint_identity(str(model)) == {"kind": "sha256sums", "digest": enc.sha256}
    assert (cache / idx.rel).read_bytes() == INDEX.read_bytes() and (cache / cor.rel).read_bytes() == CORPUS.read_bytes()
    for r in (retriever, again):
        for k in (1, 3):
            assert [[d["id"] for d in row] for row in r.search(QUERIES, k)] == THEIRS[f"k{k}"]["ids"]
    keys = bench_identity("nq", resolve({"ckpt": "tiny_base", "benches": ["nq"], "out": str(cache.parent / "o"),
                                         "corpus": "corpus:wiki18", "retriever": "e5", "encoder": "encoder:e5-base-v2",
                                         "index": "index:wiki18_e5_flat"}),
                          {"kind": "x"}, n=2, seed=42, source="x")["keys"]
    assert (keys["retrieval.encoder.digest"], keys["retrieval.index.sha256"], keys["evaluate.topk"]) == \
        (enc.sha256, idx.sha256, 3)
    assert keys["retrieval.index.name"] == "e5_Flat.index"   # as the same file given by path would read


@pytest.mark.parametrize("what", ["encoder part", "index part", "corpus"])
def test_a_wrong_digest_is_refused_and_leaves_nothing_behind(cache, monkeypatch, what):
    pin_all(monkeypatch)
    name = {"encoder part": "encoder:e5-base-v2", "index part": "index:wiki18_e5_flat", "corpus": "corpus:wiki18"}[what]
    enc = {n: (ENCODER / n).read_bytes() for n in ENCODER_FILES}
    index, corpus = INDEX.read_bytes(), CORPUS.read_bytes()
    if what == "encoder part":
        enc["config.json"] = enc["config.json"].replace(b"{", b"{ ", 1)
    elif what == "index part":
        index = index[:-1] + bytes([index[-1] ^ 1])   # in part_ab
    else:
        corpus = corpus.replace(b"a", b"b", 1)
    with Loopback(served(index, corpus, enc)) as srv:
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        with pytest.raises(datafetch.DataError) as err:
            datafetch.path(name)
    msg = str(err.value)
    assert "\n" not in msg and f"expected {datafetch.entry(name).sha256} for {name}" in msg and "not used" in msg
    assert not cache.exists()   # no file, no directory, no temporary copy


def test_an_interrupted_part_is_kept_apart_and_resumed(cache, monkeypatch):
    pin_all(monkeypatch)
    files = served()
    cut = f"/intfloat/e5-base-v2/resolve/{C}/model.safetensors"
    with Loopback(files, cut={cut}) as srv:
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        with pytest.raises(datafetch.Interrupted, match=r"interrupted: \d+ of \d+ bytes"):
            datafetch.path("encoder:e5-base-v2")
    model = cache / "models/intfloat/e5-base-v2"
    assert not model.exists() and (model.parent / "e5-base-v2.download" / "model.safetensors").is_file()
    with Loopback(files, ranges=True) as srv:
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        assert datafetch.path("encoder:e5-base-v2") == model
        assert [r for r in srv.ranges if r] and cut in srv.requests
    assert not (model.parent / "e5-base-v2.download").exists()


def _cli(*args, cache, cwd=None):
    env = dict(os.environ, PYTHONPATH=str(ROOT), DTSFT_DATA=str(cache), HF_ENDPOINT="http://127.0.0.1:9")
    return subprocess.run([sys.executable, "-m", "common.datafetch", *args], env=env, capture_output=True, text=True,
                          timeout=60, cwd=cwd)


def test_search_r1s_raw_download_fills_the_cache_part_by_part(cache, monkeypatch, tmp_path, capfd):
    """`fetch-data NAME from=DIR` with DIR as Search-R1's download leaves it (the index's part_aa + part_ab before
    `cat`, wiki-18.jsonl.gz before gunzip, the model dir): each part checked against its pin, the cached file
    built from them; no public digest of the cached file, so it is recorded (one line) and checked afterwards;
    a part that is not the pinned one is refused naming both digests."""
    index, corpus = INDEX.read_bytes(), CORPUS.read_bytes()
    half = len(index) // 2
    raw = tmp_path / "save_path"
    raw.mkdir()
    (raw / "part_aa").write_bytes(index[:half])
    (raw / "part_ab").write_bytes(index[half:])
    (raw / "wiki-18.jsonl.gz").write_bytes(tar_gz(corpus))
    sha = {n: hashlib.sha256((raw / n).read_bytes()).hexdigest() for n in ("part_aa", "part_ab", "wiki-18.jsonl.gz")}
    for name, parts in (("index:wiki18_e5_flat", ("part_aa", "part_ab")), ("corpus:wiki18", ("wiki-18.jsonl.gz",))):
        pin(monkeypatch, name, None, pins=tuple(datafetch.Pin(n, sha[n], (raw / n).stat().st_size) for n in parts))
    pin(monkeypatch, "encoder:e5-base-v2", None, parts=ENCODER_FILES)
    before = sorted(p.name for p in raw.iterdir())
    for name, src in (("index:wiki18_e5_flat", raw), ("corpus:wiki18", raw), ("encoder:e5-base-v2", ENCODER)):
        rc, err = datafetch.main([name, f"from={src}"]), capfd.readouterr().err   # in-process: the test's pins
        assert rc == 0 and "recorded, not checked" in err, err
    assert sorted(p.name for p in raw.iterdir()) == before   # the user's files: read, never changed
    assert (cache / "hub/wiki18/e5_Flat.index").read_bytes() == index
    assert (cache / "hub/wiki18/wiki-18.jsonl").read_bytes() == corpus
    assert datafetch.digest("index:wiki18_e5_flat") == hashlib.sha256(index).hexdigest()
    model = cache / "models/intfloat/e5-base-v2"
    assert sorted(p.name for p in model.iterdir()) == sorted((*ENCODER_FILES, "SHA256SUMS"))
    bad = tmp_path / "bad"
    shutil.copytree(raw, bad)
    (bad / "part_ab").write_bytes(index[half:-1] + bytes([index[-1] ^ 1]))
    (cache / "hub/wiki18/e5_Flat.index").unlink()
    rc, err = datafetch.main(["index:wiki18_e5_flat", f"from={bad}"]), capfd.readouterr().err
    actual = hashlib.sha256((bad / "part_ab").read_bytes()).hexdigest()
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert f"sha256 {actual}, expected {sha['part_ab']} for index:wiki18_e5_flat part part_ab" in err
    proc = _cli("index:wiki18_e5_flat", f"from={raw}", cache=cache)   # the real pins: the test's parts are refused
    assert proc.returncode == 2 and "15382 bytes, expected 42949672960 for index:wiki18_e5_flat part part_aa" in proc.stderr
    assert not (cache / "hub/wiki18/e5_Flat.index").exists()


def test_a_pinned_commit_without_a_public_digest_is_recorded_once_and_then_checked(cache, monkeypatch, capfd):
    """The corpus at its pinned commit, no public digest of the cached file: the first download records it
    (one console line: recorded, not checked); the next use is checked against it, and a changed file is refused."""
    cor = pin(monkeypatch, "corpus:wiki18", None)
    with Loopback(served()) as srv:
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        p = datafetch.path("corpus:wiki18")
    err = capfd.readouterr().err
    assert err.count("recorded, not checked") == 1 and p.read_bytes() == CORPUS.read_bytes()
    assert datafetch.digest("corpus:wiki18") == hashlib.sha256(CORPUS.read_bytes()).hexdigest()
    assert datafetch.path("corpus:wiki18") == p and "recorded" not in capfd.readouterr().err
    p.write_bytes(CORPUS.read_bytes().replace(b"a", b"b", 1))
    with pytest.raises(datafetch.DataError, match=r"changed since it was checked"):
        datafetch.path(cor.name)


def test_grpo_takes_the_names_too(cache, monkeypatch, tmp_path):
    """grpo.retriever=e5 with grpo.corpus/encoder/index names: kept as names (not made paths of the launch
    directory), no "no such file" problem, the index and corpus in the run identity by their recorded digests;
    a mistyped name is one problem line with the nearest name."""
    from common.cli import ConfigError
    from evals.config import resolve
    from launch.compose import compose_grpo
    from rl.config import problems, run_identity

    for name in ("index:wiki18_e5_flat", "corpus:wiki18"):
        pin(monkeypatch, name, None)
    pin(monkeypatch, "encoder:e5-base-v2", None, parts=ENCODER_FILES)
    datafetch.prefill(ENCODER, ["encoder:e5-base-v2"])
    datafetch.prefill(INDEX, ["index:wiki18_e5_flat"])
    datafetch.prefill(CORPUS, ["corpus:wiki18"])
    monkeypatch.chdir(tmp_path)
    (tmp_path / "q.jsonl").write_text(json.dumps({"id": "q0", "question": QUERIES[0], "golden_answers": ["x"]}) + "\n")
    argv = ["task=qa", "model=tiny_base", "steps=1", "runs_root=R", "grpo.prompts_file=q.jsonl", "grpo.corpus=corpus:wiki18",
            "grpo.retriever=e5", "grpo.encoder=encoder:e5-base-v2", "grpo.index=index:wiki18_e5_flat"]
    cfg = compose_grpo(argv).cfg
    assert (cfg.grpo.corpus, cfg.grpo.encoder, cfg.grpo.index) == ("corpus:wiki18", "encoder:e5-base-v2", "index:wiki18_e5_flat")
    assert problems(cfg) == []
    inputs = run_identity(cfg)["inputs"]
    assert (inputs["grpo.index"], inputs["grpo.corpus"]) == (hashlib.sha256(INDEX.read_bytes()).hexdigest(),
                                                             hashlib.sha256(CORPUS.read_bytes()).hexdigest())
    cfg.grpo.index = "index:wiki18_flat"
    assert problems(cfg) == ["grpo.index=index:wiki18_flat: unknown data name. Did you mean: index:wiki18_e5_flat? "
                             "Known: index:wiki18_e5_flat"]
    with pytest.raises(ConfigError) as refused:   # evaluate's words for the same mistake
        resolve({"ckpt": "tiny_base", "benches": ["nq"], "out": "o", "corpus": "corpus:wiki18", "retriever": "e5",
                 "encoder": "encoder:e5-base-v2", "index": "index:wiki18_flat"})
    assert str(refused.value) == "index=index:wiki18_flat: unknown data name. Did you mean: index:wiki18_e5_flat? Known: index:wiki18_e5_flat"
    cfg.grpo.index, cfg.grpo.corpus = "index:wiki18_e5_flat", "corpus:wiki18_typo"   # (seen failing: evaluate's "no such file")
    [said] = problems(cfg)
    assert said.startswith("grpo.corpus=corpus:wiki18_typo: unknown data name. Did you mean: corpus:wiki18")
    with pytest.raises(ConfigError, match=f"^{re.escape(said.removeprefix('grpo.'))}$"):
        resolve({"ckpt": "tiny_base", "benches": ["nq"], "out": "o", "corpus": "corpus:wiki18_typo"})


def test_serve_retriever_refuses_a_mistyped_or_unfilled_name_in_one_line(tmp_path):
    """serve-retriever retriever=e5 over the names: a mistyped index is exit 2 with the nearest name; the
    unpinned encoder, not pre-filled, is exit 2 saying how to pre-fill it; nothing is written to the cache."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), DTSFT_DATA=str(tmp_path / "cache"), HF_ENDPOINT="http://127.0.0.1:9",
               XDG_CACHE_HOME=str(tmp_path / "xdg"))
    argv = [sys.executable, "-m", "evals.server", "port=0", "retriever=e5", f"corpus={CORPUS}"]
    for extra, want in ((["index=index:wiki18_e5"], "Did you mean: index:wiki18_e5_flat?"),
                        (["index=index:wiki18_e5_flat"], "`fetch-data encoder:e5-base-v2 from=DIR`")):
        proc = subprocess.run(argv + extra, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and want in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "cache").exists()


def test_a_part_already_downloaded_is_not_fetched_again(cache, monkeypatch):
    """The index's part_aa arrives, part_ab fails (404): part_aa is kept (checked against its pin); the next run
    asks for part_ab only, and the index is their concatenation."""
    index = INDEX.read_bytes()
    half = len(index) // 2
    parts = {"part_aa": index[:half], "part_ab": index[half:]}
    pin(monkeypatch, "index:wiki18_e5_flat", None,
        pins=tuple(datafetch.Pin(n, hashlib.sha256(b).hexdigest(), len(b)) for n, b in parts.items()))
    files = {k: v for k, v in served().items() if "wiki-18-e5-index" in k}
    only_aa = {k: v for k, v in files.items() if k.endswith("part_aa")}
    with Loopback(only_aa) as srv:
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        with pytest.raises(datafetch.DataError, match=r"could not download index:wiki18_e5_flat .*part_ab: HTTP 404"):
            datafetch.path("index:wiki18_e5_flat")
    stage = cache / "hub/wiki18/e5_Flat.index.download"
    assert sorted(p.name for p in stage.iterdir()) == ["part_aa"] and not (cache / "hub/wiki18/e5_Flat.index").exists()
    with Loopback(files, ranges=True) as srv:
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        assert datafetch.path("index:wiki18_e5_flat").read_bytes() == index
        assert [r.rsplit("/", 1)[1] for r in srv.requests] == ["part_ab"]
    assert not stage.exists()
