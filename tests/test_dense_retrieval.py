"""`retriever=e5` (evals.dense) against Search-R1's own code: tests/data/search_r1_e5 holds what Search-R1's
index_builder.py and retrieval_server.py produced (tools/search_r1_reference/, run by hand at a pinned commit)
for a tiny config-built encoder, a small corpus and 24 queries. The project's index vectors, query vectors
and top-k ids must be theirs; the index is memory-mapped, never copied per process."""
from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ROOT

DATA = ROOT / "tests" / "data" / "search_r1_e5"
ENCODER = DATA / "encoder"
CORPUS = DATA / "corpus.jsonl"
QUERIES = json.loads((DATA / "queries.json").read_text())
THEIRS = json.loads((DATA / "topk.json").read_text())


@pytest.fixture(scope="module")
def encoder():
    from evals.dense import E5Encoder

    return E5Encoder(str(ENCODER), "cpu")


@pytest.fixture(scope="module")
def built(tmp_path_factory, encoder):
    """The project's own index of the corpus (index=null: built under index_dir)."""
    from evals.dense import E5Retriever

    root = tmp_path_factory.mktemp("e5_index")
    r = E5Retriever(CORPUS, encoder=str(ENCODER), index=None, index_dir=root)
    assert r.built
    return r


def _mapped(path: Path) -> bool:
    """Whether this process maps `path` into its address space (/proc/self/maps)."""
    target = str(Path(path).resolve())
    return any(line.rstrip("\n").endswith(" " + target) for line in open("/proc/self/maps"))


def test_the_index_vectors_are_search_r1_builders(built):
    theirs = np.load(DATA / "index_vectors.npy")
    ours = built.index.reconstruct_n(0, built.index.ntotal)
    assert ours.shape == theirs.shape == (120, 64)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5)
    # passages past 256 tokens are in the corpus: the truncation is part of what matched
    tok = built.encoder.tokenizer
    assert max(len(tok("passage: " + built.docs.doc(i)["contents"])["input_ids"]) for i in range(8)) > 256


def test_the_query_vectors_and_top_k_are_search_r1_servers(encoder, built):
    from evals.dense import E5Retriever

    np.testing.assert_allclose(encoder.encode(QUERIES, is_query=True), np.load(DATA / "query_vectors.npy"),
                               rtol=0, atol=1e-5)
    assert max(len(encoder.tokenizer("query: " + q)["input_ids"]) for q in QUERIES) > 256   # truncated too
    # over Search-R1's own e5_Flat.index and over the index the project built: the server's ids, in order
    theirs_index = E5Retriever(CORPUS, encoder=str(ENCODER), index=DATA / "e5_Flat.index", index_dir=built.index_path.parents[2])
    for retriever in (theirs_index, built):
        for k in (1, 3):
            got = retriever.search(QUERIES, k)
            assert [[d["id"] for d in row] for row in got] == THEIRS[f"k{k}"]["ids"], (retriever.index_path, k)
            np.testing.assert_allclose([[d["score"] for d in row] for row in got], THEIRS[f"k{k}"]["scores"], atol=1e-5)
    doc = theirs_index.search(QUERIES[:1], 1)[0][0]
    line = CORPUS.read_text().splitlines()[int(doc["id"])]
    assert {"id": doc["id"], "contents": doc["contents"]} == json.loads(line)   # the passage itself, as served


def test_the_index_is_memory_mapped_not_copied(built):
    """Every process opening the index shares the OS's pages of the file: it is mapped, not read into the heap."""
    import faiss

    from evals.dense import read_index

    theirs = DATA / "e5_Flat.index"
    plain = faiss.read_index(str(theirs))   # how Search-R1 loads it: a private copy, no mapping
    assert plain.ntotal == 120 and not _mapped(theirs)
    index = read_index(theirs)
    assert _mapped(theirs), "read_index did not memory-map the index file"
    assert _mapped(built.index_path)   # the project's built index, as E5Retriever opened it
    del index, plain


def test_serve_retriever_e5_answers_as_the_retriever(built):
    """The per-node path: one E5 retriever behind serve-retriever's HTTP API, queried as retriever=http."""
    from evals.retrievers import HttpRetriever
    from evals.server import make_server

    server = make_server(built, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        host, port = server.server_address[:2]
        client = HttpRetriever(f"http://{host}:{port}/retrieve", timeout=30, retries=0)
        got = client.search(QUERIES[:5], 3)
    finally:
        server.shutdown()
        server.server_close()
    assert [[d["id"] for d in row] for row in got] == THEIRS["k3"]["ids"][:5]


def test_a_mismatched_index_or_encoder_is_refused(tmp_path, built):
    from evals.dense import DenseError, E5Retriever

    short = tmp_path / "corpus.jsonl"
    short.write_text("".join(CORPUS.read_text().splitlines(keepends=True)[:50]))
    with pytest.raises(DenseError, match=r"holds 120 vectors but corpus .*corpus.jsonl has 50 passages"):
        E5Retriever(short, encoder=str(ENCODER), index=DATA / "e5_Flat.index", index_dir=tmp_path / "idx")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "0", "contents": "x"}\n{"id": "1"}\n')
    with pytest.raises(DenseError, match=r"bad.jsonl:2: expected"):
        E5Retriever(bad, encoder=str(ENCODER), index_dir=tmp_path / "idx")
    with pytest.raises(DenseError, match="encoder=.*nowhere: cannot load it"):
        E5Retriever(CORPUS, encoder=str(tmp_path / "nowhere"), index_dir=tmp_path / "idx")


def test_evaluate_takes_retriever_e5_with_encoder_and_index_in_the_identity(tmp_path, capsys, monkeypatch):
    from evals.cli import main
    from evals.config import resolve
    from evals.errors import EvalError
    from evals.identity import bench_identity, checkpoint_identity

    assert main(["--help"]) == 0
    assert "bm25 | e5 (dense, as Search-R1" in capsys.readouterr().out
    base = {"ckpt": str(ENCODER), "benches": ["nq"], "out": str(tmp_path / "out"), "corpus": str(CORPUS)}

    def keys(**kw):
        cfg = resolve({**base, **kw})
        return bench_identity("nq", cfg, {"kind": "files", "digest": "0"}, n=2, seed=42, source="x")["keys"]

    bm25 = keys()
    assert not any(k.startswith("retrieval") for k in bm25)   # a bm25 bench's identity is as before
    theirs = keys(retriever="e5", encoder=str(ENCODER), index=str(DATA / "e5_Flat.index"))
    assert theirs["retrieval.index.sha256"] == hashlib.sha256((DATA / "e5_Flat.index").read_bytes()).hexdigest()
    assert theirs["retrieval.encoder.digest"] == checkpoint_identity(str(ENCODER))["digest"]
    assert (theirs["retrieval.encoder_dtype"], theirs["evaluate.topk"]) == ("float32", 3)
    built = keys(retriever="e5", encoder=str(ENCODER))   # index=null: built from the corpus
    assert built["retrieval.index.built_from"] == "corpus"
    assert keys(retriever="e5", encoder=str(ENCODER), index=str(DATA / "e5_Flat.index"), topk=1)["evaluate.topk"] == 1
    with pytest.raises(EvalError, match="index=.*missing.index: no such file"):
        resolve({**base, "retriever": "e5", "index": str(tmp_path / "missing.index")})
    with pytest.raises(EvalError, match="retriever='e5s'.*Did you mean: e5"):
        resolve({**base, "retriever": "e5s"})
    import evals.dense

    monkeypatch.setattr(evals.dense, "BUILD_MAX_BYTES", CORPUS.stat().st_size - 1)   # as wiki-18 is to the real limit
    with pytest.raises(EvalError, match=r"index=null would build an index over corpus=.*corpus.jsonl .*pass index=FILE"):
        resolve({**base, "retriever": "e5"})
    assert resolve({**base, "retriever": "e5", "index": str(DATA / "e5_Flat.index")}).index == str(DATA / "e5_Flat.index")


def test_grpo_search_tool_over_retriever_e5(tmp_path, monkeypatch):
    """GRPO's qa search tool (grpo.retriever=e5): the same passages, the index in the run identity by content."""
    from launch.compose import compose_grpo
    from rl.config import problems, run_identity
    from rl.envs import qa_env_factory
    from rl.train import make_retriever

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "q.jsonl").write_text(json.dumps({"id": "q0", "question": QUERIES[0], "golden_answers": ["x"]}) + "\n")
    argv = ["task=qa", "model=tiny_base", "steps=1", "runs_root=R", "grpo.prompts_file=q.jsonl", f"grpo.corpus={CORPUS}",
            "grpo.retriever=e5", f"grpo.encoder={ENCODER}", f"grpo.index={DATA / 'e5_Flat.index'}"]
    cfg = compose_grpo(argv).cfg
    assert problems(cfg) == []
    retriever = make_retriever(cfg)   # probes it with one search, as a run's start does
    assert [d["id"] for d in retriever.search(QUERIES[:2], 3)[1]] == THEIRS["k3"]["ids"][1]
    env = qa_env_factory(retriever, 3)()
    env.reset(prompt=[{"role": "user", "content": QUERIES[1]}])
    shown = env.search(QUERIES[1])
    first = json.loads(CORPUS.read_text().splitlines()[int(THEIRS["k3"]["ids"][1][0])])["contents"]
    assert shown.startswith(f"Doc 1(Title: {first.splitlines()[0]}) ")
    ident = run_identity(cfg)
    assert ident["inputs"]["grpo.index"] == hashlib.sha256((DATA / "e5_Flat.index").read_bytes()).hexdigest()
    bm25 = compose_grpo([a for a in argv if not a.startswith(("grpo.retriever", "grpo.encoder", "grpo.index"))]).cfg
    assert "grpo.index" not in run_identity(bm25)["inputs"] and not any(k.startswith("grpo.encoder")
                                                                        for k in run_identity(bm25)["keys"])
    cfg.grpo.index = str(tmp_path / "missing.index")
    assert problems(cfg) == [f"grpo.index={tmp_path / 'missing.index'}: no such file (a faiss index; null builds one "
                             "from the corpus)"]
    import evals.dense

    cfg.grpo.index = None   # built from a corpus over the limit: refused up front, as evaluate refuses it (was: built at start)
    monkeypatch.setattr(evals.dense, "BUILD_MAX_BYTES", CORPUS.stat().st_size - 1)   # as wiki-18 is to the real limit
    assert problems(cfg) == [f"grpo.retriever=e5 grpo.index=null would build an index over grpo.corpus={CORPUS} (0.0 GiB): "
                             "pass grpo.index=FILE (Search-R1's e5_Flat.index for wiki-18)"]

