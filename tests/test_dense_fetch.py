"""Search-R1's dense-retrieval artefacts as `fetch-data` names (common.datafetch): the E5 encoder (a model
directory), the wiki-18 flat index (two published parts, concatenated) and the wiki-18 corpus (gzip), each
downloaded from a loopback server by the one downloader once pinned, refused while unpinned until pre-filled,
and resolved by `retriever=e5` through the cache. The files served are the committed Search-R1 oracle's
(tests/data/search_r1_e5): the retriever built from the fetched names must return Search-R1's ids."""
from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys

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


def pin(monkeypatch, name: str, digest: str, **changes) -> datafetch.DataFile:
    """`name`'s entry as it reads once measured (the real commits/digests are not: no hub access here)."""
    f = dataclasses.replace(datafetch.entry(name), commit=C, sha256=digest, **changes)
    monkeypatch.setitem(datafetch.TABLE, name, f)
    return f


def served(index_body: bytes | None = None, corpus_body: bytes | None = None, encoder: dict | None = None):
    """URL path -> bytes, at the hub's URLs of the three entries (a model repo's have no /datasets/)."""
    index_body = INDEX.read_bytes() if index_body is None else index_body
    half = len(index_body) // 2
    files = {f"/datasets/PeterJinGo/wiki-18-e5-index/resolve/{C}/part_aa": index_body[:half],
             f"/datasets/PeterJinGo/wiki-18-e5-index/resolve/{C}/part_ab": index_body[half:],
             f"/datasets/PeterJinGo/wiki-18-corpus/resolve/{C}/wiki-18.jsonl.gz":
                 gzip.compress(CORPUS.read_bytes() if corpus_body is None else corpus_body, mtime=0)}
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


def test_an_interrupted_part_leaves_nothing_behind(cache, monkeypatch):
    pin_all(monkeypatch)
    files = served()
    cut = f"/intfloat/e5-base-v2/resolve/{C}/model.safetensors"
    with Loopback(files, cut={cut}) as srv:
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        with pytest.raises(datafetch.DataError, match=r"interrupted: \d+ of \d+ bytes"):
            datafetch.path("encoder:e5-base-v2")
    assert not cache.exists()


def _cli(*args, cache, cwd=None):
    env = dict(os.environ, PYTHONPATH=str(ROOT), DTSFT_DATA=str(cache), HF_ENDPOINT="http://127.0.0.1:9")
    return subprocess.run([sys.executable, "-m", "common.datafetch", *args], env=env, capture_output=True, text=True,
                          timeout=60, cwd=cwd)


def test_unpinned_dense_artefacts_are_refused_until_prefilled(cache, monkeypatch, tmp_path):
    """The three entries carry no commit or sha256: never downloaded, one line saying how to pre-fill; then
    `fetch-data NAME from=DIR|FILE` records each copy's digest, `retriever=e5` resolves the names through
    the cache (Search-R1's ids again) and the identity names those digests; a mistyped name: did you mean."""
    from evals.config import resolve
    from evals.errors import EvalError
    from evals.identity import bench_identity
    from evals.retrievers import make_retriever

    for name in ("encoder:e5-base-v2", "index:wiki18_e5_flat", "corpus:wiki18"):
        assert not datafetch.entry(name).measured and name in datafetch.UNPINNED
    with Loopback({}) as srv:
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        with pytest.raises(datafetch.DataError) as err:
            make_retriever(e5_config(corpus=str(CORPUS)))
        assert srv.requests == []
    msg = str(err.value)
    assert "\n" not in msg and "encoder:e5-base-v2 (hub_model:intfloat/e5-base-v2@unpinned:{config.json," in msg
    assert "has no measured commit and sha256" in msg and "`fetch-data encoder:e5-base-v2 from=DIR`" in msg
    assert "or pass encoder=intfloat/e5-base-v2" in msg
    with pytest.raises(datafetch.DataError, match=r"`fetch-data index:wiki18_e5_flat from=DIR` \(DIR/wiki18/e5_Flat.index, "
                                                  r"or from=FILE; .* or pass index=FILE"):
        datafetch.path("index:wiki18_e5_flat")

    # the encoder: a model dir (in-process: the entry lists the tiny encoder's files, not e5-base-v2's six)
    monkeypatch.setitem(datafetch.UNPINNED, "encoder:e5-base-v2",
                        dataclasses.replace(datafetch.UNPINNED["encoder:e5-base-v2"], parts=ENCODER_FILES))
    mine = tmp_path / "my-e5"
    shutil.copytree(ENCODER, mine)
    (mine / "pytorch_model.bin").write_bytes(b"not copied: not a part")
    assert datafetch.main(["encoder:e5-base-v2", f"from={mine}"]) == 0
    model = cache / "models/intfloat/e5-base-v2"
    assert sorted(p.name for p in model.iterdir()) == sorted((*ENCODER_FILES, "SHA256SUMS"))
    enc_digest = sums_digest({n: (ENCODER / n).read_bytes() for n in ENCODER_FILES})
    assert datafetch.digest("encoder:e5-base-v2") == enc_digest
    # the index from=FILE and the corpus from Search-R1's save_path (DIR/wiki-18.jsonl), by the command line
    proc = _cli("index:wiki18_e5_flat", f"from={INDEX}", cache=cache)
    assert proc.returncode == 0, proc.stderr
    save_path = tmp_path / "save_path"
    save_path.mkdir()
    shutil.copyfile(CORPUS, save_path / "wiki-18.jsonl")
    proc = _cli("corpus:wiki18", f"from={save_path}", cache=cache)
    assert proc.returncode == 0, proc.stderr
    bad = _cli("index:wiki18_e5_flat", "corpus:wiki18", f"from={INDEX}", cache=cache)
    assert bad.returncode == 2 and "is a file: name the one file entry" in bad.stderr
    assert datafetch.digest("index:wiki18_e5_flat") == hashlib.sha256(INDEX.read_bytes()).hexdigest()

    retriever = make_retriever(e5_config())
    assert [[d["id"] for d in row] for row in retriever.search(QUERIES, 3)] == THEIRS["k3"]["ids"]
    base = {"ckpt": "tiny_base", "benches": ["nq"], "out": str(tmp_path / "o"), "corpus": "corpus:wiki18", "retriever": "e5"}
    keys = bench_identity("nq", resolve({**base, "index": "index:wiki18_e5_flat"}), {"kind": "x"}, n=2, seed=42,
                          source="x")["keys"]   # the default encoder is the name
    assert (keys["retrieval.encoder.digest"], keys["retrieval.index.sha256"]) == \
        (enc_digest, hashlib.sha256(INDEX.read_bytes()).hexdigest())
    with pytest.raises(EvalError, match=r"encoder=e5-base-v2: no such path, no hub id .*Did you mean: encoder:e5-base-v2\?"):
        resolve({**base, "encoder": "e5-base-v2"})
    with pytest.raises(EvalError, match=r"index=index:wiki18_e5: unknown data name\. Did you mean: index:wiki18_e5_flat\?"):
        resolve({**base, "index": "index:wiki18_e5"})
    (model / "config.json").write_text("{}")   # changed after it was recorded: refused, kept
    with pytest.raises(datafetch.DataError, match=r"changed since it was checked"):
        make_retriever(e5_config())
    assert (model / "config.json").read_text() == "{}"


def test_grpo_takes_the_names_too(cache, monkeypatch, tmp_path):
    """grpo.retriever=e5 with grpo.corpus/encoder/index names: kept as names (not made paths of the launch
    directory), no "no such file" problem, the index and corpus in the run identity by their recorded digests;
    a mistyped name is one problem line with the nearest name."""
    from launch.compose import compose_grpo
    from rl.config import problems, run_identity

    monkeypatch.setitem(datafetch.UNPINNED, "encoder:e5-base-v2",
                        dataclasses.replace(datafetch.UNPINNED["encoder:e5-base-v2"], parts=ENCODER_FILES))
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
