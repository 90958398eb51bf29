"""`serve-retriever corpus=PATH|NAME [retriever=bm25|e5] [port=8000] [index_dir=DIR]`: one retriever shared over HTTP.

retriever=bm25 serves a BM25 index of the corpus; retriever=e5 serves Search-R1's dense retrieval
(evals.dense: an E5 encoder over a faiss flat index, `index=` Search-R1's e5_Flat.index or null to
build one from the corpus), one copy per node for every evaluation and GRPO job that points
`retriever=http retriever_url=` at it. `faiss_gpu=true` moves the index onto the GPUs (faiss-gpu).

Speaks Search-R1's retrieval API on 127.0.0.1 (loopback only: put a tunnel or proxy in front to
share it across a cluster deliberately):

    POST /retrieve {"queries": [str], "topk": int, "return_scores": bool}
    -> {"result": [[{"document": {"id", "contents"}, "score": float}, ...], ...]}   (return_scores)
    -> {"result": [[{"id", "contents"}, ...], ...]}                                 (otherwise)
"""
from __future__ import annotations

import json
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from omegaconf import OmegaConf

from common import datafetch, fields
from common.fields import Default
from common.cli import apply_overrides, run_cli, wants_help
from common.io import parse_json_line
from evals.errors import EvalError
from evals.config import KEYS as EVALUATE
from evals.retrievers import MAX_QUERIES, MAX_RESULTS, retriever_problem

KEYS = {  # `serve-retriever --help` and docs/keys/serve-retriever.md; the retriever keys are evaluate's fields
    "corpus": Default(EVALUATE["corpus"], None, "(required)"),
    "retriever": fields.choice("bm25 | e5 (dense, as Search-R1: evals.dense)", "bm25", ("bm25", "e5")),
    "encoder": EVALUATE["encoder"],
    "index": EVALUATE["index"],
    "encoder_device": EVALUATE["encoder_device"],
    "faiss_gpu": fields.flag("retriever=e5: search on every visible GPU (needs a faiss build with GPU support)", False),
    "port": fields.number("TCP port (0: an ephemeral one)", 8000, lo=0, hi=65535, integer=True),
    "host": fields.choice("loopback only: 127.0.0.1 | localhost | ::1", "127.0.0.1", ("127.0.0.1", "localhost", "::1")),
    "index_dir": EVALUATE["index_dir"],
    "max_topk": fields.count("largest topk a request may ask for", 100, roles=()),
    "max_queries": fields.count("most queries one request may carry (more: 413; evaluate's and GRPO's client splits a "
                                "larger batch at the default)", MAX_QUERIES, roles=()),
    "max_results": fields.count("most passages one request may ask for, queries x topk (more: 413)", MAX_RESULTS, roles=()),
}
DEFAULTS = fields.defaults(KEYS)
USAGE = """usage: serve-retriever corpus=PATH|NAME [key=value ...]

Serve a wiki-18 style corpus with Search-R1's POST /retrieve API on 127.0.0.1: BM25 (retriever=bm25,
the index built on first use and cached under index_dir) or Search-R1's dense E5 retrieval
(retriever=e5 encoder=encoder:e5-base-v2 index=index:wiki18_e5_flat corpus=corpus:wiki18, fetched by name
into the data cache, or your files; index=null builds one from the corpus)."""


# A request body larger than this is refused unread (413); a client silent for longer than
# SOCKET_TIMEOUT_S is dropped, so a stalled client never holds a server thread for long. The body cap
# bounds bytes, not work: max_queries and max_results (queries x topk) bound what one request may ask.
MAX_BODY_BYTES = 1 << 20
SOCKET_TIMEOUT_S = 30.0
# The listen backlog: connections the kernel queues while the server is busy accepting others. Sized for
# the documented concurrency (docs/stages/evaluate.md): 256 clients connecting at once (e.g. 32 GRPO or
# evaluation processes per node with 8 requests in flight each); Python's default of 5 reset clients at 64.
BACKLOG = 256


class TooLarge(ValueError):
    """A well-formed request asking for more than the server's caps allow (413)."""


def _parse_request(body: bytes, max_topk: int, max_queries: int = MAX_QUERIES,
                   max_results: int = MAX_RESULTS) -> tuple[list[str], int, bool]:
    """(queries, topk, return_scores) from a request body; ValueError/TypeError say what is wrong,
    TooLarge what exceeds a cap."""
    req = parse_json_line(body)
    if not isinstance(req, dict):
        raise TypeError("expected a JSON object")
    if "queries" not in req:
        raise ValueError("missing \"queries\"")
    queries, topk = req["queries"], req.get("topk", 3)
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise TypeError("queries must be a list of strings")
    if isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= max_topk:
        raise ValueError(f"topk must be an integer in [1, {max_topk}], got {str(topk)[:40]}")
    if len(queries) > max_queries:
        raise TooLarge(f"{len(queries)} queries in one request (at most max_queries={max_queries}); split the batch")
    if len(queries) * topk > max_results:
        raise TooLarge(f"{len(queries)} queries x topk {topk} = {len(queries) * topk} passages in one request "
                       f"(at most max_results={max_results}); split the batch or lower topk")
    return queries, topk, bool(req.get("return_scores", False))


def _handler(retriever, lock: threading.Lock, max_topk: int, socket_timeout: float, max_queries: int = MAX_QUERIES,
             max_results: int = MAX_RESULTS):
    class Handler(BaseHTTPRequestHandler):
        timeout = socket_timeout  # applied to the connection's socket by StreamRequestHandler

        def _send(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode("utf-8")
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self):  # noqa: N802 (http.server naming)
            if self.path.rstrip("/") != "/retrieve":
                return self._send(404, {"error": f"unknown path {self.path}; use POST /retrieve"})
            try:
                length = int(self.headers.get("Content-Length", 0))
            except ValueError:
                return self._send(400, {"error": "bad request: Content-Length is not an integer"})
            if not 0 <= length <= MAX_BODY_BYTES:
                self.close_connection = True
                return self._send(413 if length > 0 else 400, {"error": f"bad request: body of {length} bytes (at most {MAX_BODY_BYTES})"})
            try:
                body = self.rfile.read(length)
            except OSError:  # the client stalled past the socket timeout or went away
                self.close_connection = True
                return None
            try:
                queries, topk, scores = _parse_request(body, max_topk, max_queries, max_results)
            except TooLarge as exc:
                return self._send(413, {"error": f"request too large: {exc}"})
            except (ValueError, TypeError) as exc:  # JsonLineError included: bad UTF-8, bad or too deep JSON
                return self._send(400, {"error": f"bad request: {exc}"})
            try:
                with lock:  # bm25s retrieval is not documented as thread-safe (nor is one torch encoder)
                    results = retriever.search(queries, topk)
            except Exception as exc:  # one failed search is this request's 500, never the server's end
                return self._send(500, {"error": f"retrieval failed: {type(exc).__name__}: {str(exc)[:200]}"})
            if scores:
                out = [[{"document": {"id": d["id"], "contents": d["contents"]}, "score": d["score"]} for d in row] for row in results]
            else:
                out = [[{"id": d["id"], "contents": d["contents"]} for d in row] for row in results]
            return self._send(200, {"result": out})

        def log_message(self, fmt, *args):  # keep stderr quiet; errors still go to the client
            pass

    return Handler


class _Server(ThreadingHTTPServer):
    request_queue_size = BACKLOG   # listen(): socketserver's default is 5
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


def make_server(retriever, host: str = "127.0.0.1", port: int = 0, max_topk: int = 100,
                socket_timeout: float = SOCKET_TIMEOUT_S, max_queries: int = MAX_QUERIES,
                max_results: int = MAX_RESULTS) -> ThreadingHTTPServer:
    """An HTTP server over `retriever` (port 0 = an ephemeral port; read it from server_address)."""
    return (_Server6 if ":" in host else _Server)((host, port), _handler(retriever, threading.Lock(), max_topk, socket_timeout,
                                                                       max_queries, max_results))


def main(argv: list[str] | None = None) -> int:
    def _main(args: list[str]) -> int:
        if wants_help(args):
            print(USAGE + "\n\nKeys (key=default  description):\n" + fields.help_table(KEYS))
            return 0
        cfg = apply_overrides(OmegaConf.create(DEFAULTS), args)
        if problems := fields.problems(KEYS, cfg):
            raise EvalError(problems[0])
        # evaluate's and GRPO's check of the corpus, index and encoder, before anything loads (a mistyped fetched
        # name: datafetch's DataError, did you mean)
        if why := retriever_problem(cfg.retriever, cfg.corpus, cfg.index, cfg.encoder, http=False):
            raise EvalError(why)
        if cfg.faiss_gpu and cfg.retriever != "e5":
            raise EvalError("faiss_gpu=true is for retriever=e5 (a faiss index)")
        from evals.retrievers import RetrieverError, make_retriever

        # a name is read through the data cache (checked, fetched on first use), as evaluate's corpus= is
        corpus = datafetch.path(cfg.corpus) if datafetch.is_name(cfg.corpus) else cfg.corpus
        try:
            cfg.corpus = str(corpus)
            retriever = make_retriever(cfg)
            if cfg.faiss_gpu:
                from evals.dense import index_to_gpus

                retriever.index = index_to_gpus(retriever.index)
        except RetrieverError as exc:
            raise EvalError(str(exc)) from exc
        try:
            server = make_server(retriever, cfg.host, cfg.port, cfg.max_topk, max_queries=cfg.max_queries,
                                 max_results=cfg.max_results)
        except OSError as exc:   # the port taken, the host without that address family
            raise EvalError(f"cannot listen on {cfg.host} port {cfg.port}: {exc.strerror or exc}") from None
        host, port = server.server_address[:2]
        host = f"[{host}]" if ":" in host else host
        print(f"serving {retriever.num_docs} docs from {corpus} at http://{host}:{port}/retrieve", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
        return 0

    return run_cli(_main, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
