"""Retrievers behind the `search` tool: local BM25 (bm25s), dense E5 over a faiss index as Search-R1
retrieves (evals.dense, `retriever=e5`), or a Search-R1-compatible HTTP server.

Both return, per query, a list of `{"id", "contents", "score"}` docs (BM25: at most `topk`, only docs
that match a query term, as Lucene, Search-R1's BM25, returns them; a query matching nothing finds none); `format_docs` renders them the
way Search-R1 does (`Doc 1(Title: "T") text`, the wiki-18 title keeps its quotes), which is what
the models saw in training.

The BM25 index is built once per (corpus file, parameters) and cached on disk; later runs (and
`serve-retriever`) memory-map it.

`ItemRetriever` is context mode `item`'s: BM25 (same parameters) over one bench item's own
paragraphs, built in memory per item, its docs shaped like wiki-18's (`"Title"\ntext`), so the
search tool's responses look the same as over a corpus but hold only that item's evidence.
"""
from __future__ import annotations

import json
import logging
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from common import datafetch
from common.io import JsonLineError, atomic_dir, read_jsonl, sha256_text, write_json
from evals import dense
from evals.corpus import RetrieverError, corpus_doc as _corpus_doc

BM25_PARAMS = {"method": "lucene", "k1": 1.2, "b": 0.75, "stopwords": "en"}
INDEX_FORMAT = 1


def retriever_problem(kind: str, corpus=None, index=None, encoder=None, url=None, prefix: str = "",
                      http: bool = True) -> str | None:
    """The first problem of the settings a `kind` retriever is built from (bm25 and e5: the corpus, e5: the index and
    encoder, http: the url), read before any work (evaluate's resolve, GRPO's config problems, serve-retriever), one
    line naming the key as `prefix` spells it (GRPO: "grpo."), else None. `http`: whether the command could take
    retriever=http instead (serve-retriever cannot: it is the server such a client points at), offered for a missing
    corpus. A mistyped fetched name (corpus:, index:, encoder:) raises datafetch's DataError with the nearest names; a
    known one is checked when used (the data cache)."""
    if kind == "http":
        return None if url else f"{prefix}retriever=http needs {prefix}retriever_url=http://HOST:PORT/retrieve"
    if not corpus:
        return (f"{prefix}retriever={kind} needs {prefix}corpus=PATH (a wiki-18 style jsonl or a fetched corpus:NAME)"
                + (f", or pass {prefix}retriever=http {prefix}retriever_url=URL" if http else ""))
    for key, value in (("corpus", corpus), ("index", index if kind == "e5" else None)):
        if value is not None and not datafetch.named(prefix + key, value, key) and not Path(str(value)).is_file():
            what = "a directory, not a file" if Path(str(value)).is_dir() else "no such file"
            return f"{prefix}{key}={value}: {what}" + (" (a faiss index; null builds one from the corpus)" if key == "index" else "")
    if kind != "e5":
        return None
    if not encoder:
        return f"{prefix}retriever=e5 needs {prefix}encoder=MODEL (encoder:e5-base-v2, an HF model dir or hub id)"
    datafetch.named(prefix + "encoder", encoder, "encoder")
    if index is not None or datafetch.is_name(corpus) or (size := Path(str(corpus)).stat().st_size) <= dense.BUILD_MAX_BYTES:
        return None
    return (f"{prefix}retriever=e5 {prefix}index=null would build an index over {prefix}corpus={corpus} ({size / 2**30:.1f} "
            f"GiB): pass {prefix}index=FILE (Search-R1's e5_Flat.index for wiki-18)")


def format_docs(docs: list[dict]) -> str:
    """Search-R1's passage rendering: title = first line of `contents`, text = the rest."""
    out = []
    for i, doc in enumerate(docs, 1):
        lines = doc["contents"].split("\n")
        out.append(f"Doc {i}(Title: {lines[0]}) {chr(10).join(lines[1:])}\n")
    return "".join(out)


def load_corpus(path: str | Path) -> list[dict]:
    """Read a wiki-18 style corpus (`{"id", "contents"}` per line); a bad line is an error naming it."""
    path = Path(path)
    if not path.is_file():
        raise RetrieverError(f"corpus {path} does not exist")
    docs, seen = [], set()
    try:
        for lineno, raw in read_jsonl(path):  # streamed: a wiki-18 corpus is 14 GB
            docs.append(_corpus_doc(path, lineno, raw, seen))
    except JsonLineError as exc:  # a non-UTF-8 line: read_jsonl names path:line
        raise RetrieverError(str(exc)) from None
    if not docs:
        raise RetrieverError(f"corpus {path} has no documents")
    return docs


def default_index_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dtsft" / "bm25"


def index_key(corpus: str | Path) -> str:
    """Identity of an index: the corpus file (real path, size, mtime) and the BM25 parameters.
    Cheap on a 14 GB wiki-18 file; any edit changes size or mtime and so rebuilds."""
    import bm25s

    st = Path(corpus).stat()
    ident = {
        "corpus": str(Path(corpus).resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
        "params": BM25_PARAMS, "bm25s": bm25s.__version__, "format": INDEX_FORMAT,
    }
    return sha256_text(json.dumps(ident, sort_keys=True))[:20]


def _tokenize(texts: list[str], return_ids: bool):
    import bm25s

    return bm25s.tokenize(texts, stopwords=BM25_PARAMS["stopwords"], return_ids=return_ids, show_progress=False)


def _index(texts: list[str], what: str, progress: bool = False):
    """A BM25 index of `texts` (RetrieverError naming `what` when not one of them has a token to index)."""
    import bm25s

    if not (tokens := _tokenize(texts, return_ids=True)).vocab:
        raise RetrieverError(f"{what}: no document has a token to index (each is empty or stopwords only)")
    bm25 = bm25s.BM25(method=BM25_PARAMS["method"], k1=BM25_PARAMS["k1"], b=BM25_PARAMS["b"])
    bm25.index(tokens, show_progress=progress)
    return bm25


class Bm25Retriever:
    """bm25s over a corpus jsonl; `built` says whether this instance had to build the index."""

    def __init__(self, corpus: str | Path, index_dir: str | Path | None = None):
        import bm25s

        self.corpus_path = Path(corpus)
        if not self.corpus_path.is_file():
            raise RetrieverError(f"corpus {self.corpus_path} does not exist (pass corpus=PATH)")
        root = Path(index_dir) if index_dir else default_index_root()
        self.index_dir = root / index_key(self.corpus_path)
        self.built = False
        if not (self.index_dir / "index_meta.json").is_file():
            self._build()
            self.built = True
        logging.getLogger("bm25s").setLevel(logging.WARNING)
        self.bm25 = bm25s.BM25.load(str(self.index_dir), load_corpus=True, mmap=True, show_progress=False)
        self.num_docs = json.loads((self.index_dir / "index_meta.json").read_text())["num_docs"]

    def _build(self) -> None:
        import bm25s

        docs = load_corpus(self.corpus_path)
        bm25 = _index([d["contents"] for d in docs], f"corpus {self.corpus_path}", progress=len(docs) > 100_000)
        meta = {"corpus": str(self.corpus_path.resolve()), "num_docs": len(docs), "params": BM25_PARAMS,
                "bm25s": bm25s.__version__}
        # A derived cache keyed by the corpus. Another process (a data_parallel shard) may have put the same
        # index in place meanwhile and be reading it: a complete one is kept, never replaced under its reader;
        # only an incomplete leftover (no index_meta.json) is replaced.
        def save(existing: str) -> None:
            with atomic_dir(self.index_dir, existing=existing) as tmp:
                bm25.save(str(tmp), corpus=docs, show_progress=False)
                write_json(tmp / "index_meta.json", meta)

        try:
            save("refuse")
        except FileExistsError:
            if not (self.index_dir / "index_meta.json").is_file():
                save("replace")

    def search(self, queries: list[str], topk: int) -> list[list[dict]]:
        if not queries:
            return []
        k = min(topk, self.num_docs)
        docs, scores = self.bm25.retrieve(_tokenize(list(queries), return_ids=False), k=k, show_progress=False, n_threads=1)
        return [
            [{"id": str(d["id"]), "contents": d["contents"], "score": float(s)} for d, s in zip(row_d, row_s) if s > 0]
            for row_d, row_s in zip(docs, scores)
        ]


class ItemRetriever:
    """BM25 over one item's paragraphs (objects with `title`/`text`, or such dicts); doc ids are the
    paragraphs' 0-based positions. Ties keep the dataset's order; a paragraph no query term matches is not returned."""

    def __init__(self, paragraphs):
        def get(p, key):
            return p[key] if isinstance(p, dict) else getattr(p, key)

        self.docs = [{"id": str(k), "contents": f'"{get(p, "title")}"\n{get(p, "text")}'}
                     for k, p in enumerate(paragraphs)]
        if not self.docs:
            raise RetrieverError("context mode item: the item has no paragraphs to search")
        logging.getLogger("bm25s").setLevel(logging.WARNING)
        self.bm25 = _index([d["contents"] for d in self.docs], "context mode item: its paragraphs")

    def search(self, queries: list[str], topk: int) -> list[list[dict]]:
        import numpy as np

        out = []
        for query in queries:
            tokens = _tokenize([query], return_ids=False)[0]
            scores = self.bm25.get_scores(tokens) if tokens else np.zeros(len(self.docs))
            order = sorted((k for k in range(len(self.docs)) if scores[k] > 0), key=lambda k: (-float(scores[k]), k))[:topk]
            out.append([{**self.docs[k], "score": float(scores[k])} for k in order])
        return out


# serve-retriever's caps on one request (evals.server's defaults, keys max_queries and max_results): a
# client splits a larger batch into requests that fit them
MAX_QUERIES = 512
MAX_RESULTS = 10_000


class HttpRetriever:
    """Client of a Search-R1 retrieval server: `POST /retrieve {"queries", "topk", "return_scores"}`."""

    def __init__(self, url: str, timeout: float = 30.0, retries: int = 3, backoff: float = 1.0):
        if why := retriever_problem("http", url=url):
            raise RetrieverError(why)
        if urllib.parse.urlsplit(url).scheme not in ("http", "https") or not urllib.parse.urlsplit(url).netloc:
            raise RetrieverError(f"retriever_url={url!r}: expected http://HOST:PORT/retrieve (or https)")
        self.url = url if url.rstrip("/").endswith("/retrieve") else url.rstrip("/") + "/retrieve"
        self.timeout, self.retries, self.backoff = timeout, retries, backoff

    def _post(self, payload: dict) -> dict:
        data = json.dumps(payload).encode("utf-8")
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            req = urllib.request.Request(self.url, data=data, headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    return json.loads(resp.read().decode("utf-8"))
            except urllib.error.HTTPError as exc:
                if exc.code < 500:  # a client error will not fix itself on retry
                    raise RetrieverError(f"retriever {self.url} answered HTTP {exc.code}: {exc.read()[:300]!r}") from exc
                last = exc
            except (urllib.error.URLError, TimeoutError, ConnectionError, json.JSONDecodeError) as exc:
                last = exc
            if attempt < self.retries:
                time.sleep(self.backoff * (2 ** attempt))
        raise RetrieverError(
            f"retriever {self.url} unreachable after {self.retries + 1} attempts "
            f"(timeout {self.timeout}s): {last}. Start one with `serve-retriever corpus=PATH` or use retriever=bm25."
        )

    def search(self, queries: list[str], topk: int) -> list[list[dict]]:
        """The top `topk` passages of each query, in requests within serve-retriever's caps
        (MAX_QUERIES queries, MAX_RESULTS = queries x topk passages each)."""
        queries = list(queries)
        step = max(1, min(MAX_QUERIES, MAX_RESULTS // max(1, int(topk))))
        return [row for s in range(0, len(queries), step) for row in self._search(queries[s:s + step], topk)]

    def _search(self, queries: list[str], topk: int) -> list[list[dict]]:
        if not queries:
            return []
        body = self._post({"queries": queries, "topk": topk, "return_scores": True})
        result = body.get("result") if isinstance(body, dict) else None
        if not isinstance(result, list) or len(result) != len(queries):
            raise RetrieverError(f"retriever {self.url} returned a malformed response: {str(body)[:300]}")
        out = []
        try:
            for row in result:
                docs = []
                for item in row:
                    # return_scores=true: {"document": {...}, "score": s}; some servers send bare docs.
                    doc = item.get("document", item)
                    if not isinstance(doc.get("contents"), str):
                        raise TypeError("a doc without its contents")
                    docs.append({"id": str(doc.get("id", "")), "contents": doc["contents"], "score": float(item.get("score", 0.0))})
                out.append(docs)
        except (AttributeError, TypeError, ValueError) as exc:   # a row or doc of another shape, a score not a number
            raise RetrieverError(f"retriever {self.url} returned a malformed response ({exc}): {str(body)[:300]}") from None
        return out


def make_retriever(cfg):
    """The retriever `cfg` names: bm25 (corpus, index_dir), e5 (corpus, encoder, index, encoder_device,
    index_dir: evals.dense.E5Retriever) or http (retriever_url, retriever_timeout, retriever_retries)."""
    kind = cfg.retriever
    if kind in ("bm25", "e5"):
        if not cfg.corpus:
            raise RetrieverError(f"retriever={kind} needs corpus=PATH (a wiki-18 style jsonl)")
        corpus = datafetch.path(cfg.corpus) if datafetch.is_name(cfg.corpus) else cfg.corpus   # fetched on first use
        from evals.dense import DEFAULT_ENCODER, E5Retriever

        try:
            if kind == "bm25":
                return Bm25Retriever(corpus, cfg.get("index_dir"))
            return E5Retriever(corpus, encoder=cfg.get("encoder") or DEFAULT_ENCODER, index=cfg.get("index"),
                               index_dir=cfg.get("index_dir"), device=cfg.get("encoder_device") or "cpu")
        except OSError as exc:   # an index_dir that is a file or read-only, an unreadable corpus: the path, the reason
            raise RetrieverError(f"retriever={kind}: {exc.filename}: {exc.strerror or exc}") from None
    if kind == "http":
        return HttpRetriever(cfg.retriever_url, timeout=cfg.retriever_timeout, retries=cfg.retriever_retries)
    raise RetrieverError(f"unknown retriever {kind!r}; expected bm25, e5 or http")

