"""`serve-retriever corpus=PATH [port=8000] [index_dir=DIR]`: one BM25 index shared over HTTP.

Speaks Search-R1's retrieval API on 127.0.0.1 (loopback only: put a tunnel or proxy in front to
share it across a cluster deliberately):

    POST /retrieve {"queries": [str], "topk": int, "return_scores": bool}
    -> {"result": [[{"document": {"id", "contents"}, "score": float}, ...], ...]}   (return_scores)
    -> {"result": [[{"id", "contents"}, ...], ...]}                                 (otherwise)
"""
from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from omegaconf import OmegaConf

from common.cli import ConfigError, apply_overrides, run_cli, wants_help

DEFAULTS = {"corpus": None, "port": 8000, "host": "127.0.0.1", "index_dir": None, "max_topk": 100}
USAGE = """usage: serve-retriever corpus=PATH [port=8000] [index_dir=DIR] [max_topk=100]

Serve a BM25 index of a wiki-18 style corpus with Search-R1's POST /retrieve API on 127.0.0.1.
The index is built on first use and cached under index_dir (default ~/.cache/dtsft/bm25)."""


def _handler(retriever, lock: threading.Lock, max_topk: int):
    class Handler(BaseHTTPRequestHandler):
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
                req = json.loads(self.rfile.read(length).decode("utf-8"))
                queries, topk = req["queries"], int(req.get("topk", 3))
                if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
                    raise ValueError("queries must be a list of strings")
                if not 1 <= topk <= max_topk:
                    raise ValueError(f"topk must be in [1, {max_topk}], got {topk}")
            except (ValueError, KeyError, TypeError) as exc:
                return self._send(400, {"error": f"bad request: {exc}"})
            with lock:  # bm25s retrieval is not documented as thread-safe
                results = retriever.search(queries, topk)
            if req.get("return_scores", False):
                out = [[{"document": {"id": d["id"], "contents": d["contents"]}, "score": d["score"]} for d in row] for row in results]
            else:
                out = [[{"id": d["id"], "contents": d["contents"]} for d in row] for row in results]
            return self._send(200, {"result": out})

        def log_message(self, fmt, *args):  # keep stderr quiet; errors still go to the client
            pass

    return Handler


def make_server(retriever, host: str = "127.0.0.1", port: int = 0, max_topk: int = 100) -> ThreadingHTTPServer:
    """An HTTP server over `retriever` (port 0 = an ephemeral port; read it from server_address)."""
    return ThreadingHTTPServer((host, port), _handler(retriever, threading.Lock(), max_topk))


def main(argv: list[str] | None = None) -> int:
    def _main(args: list[str]) -> int:
        if wants_help(args):
            print(USAGE)
            return 0
        cfg = apply_overrides(OmegaConf.create(DEFAULTS), args)
        if not cfg.corpus:
            raise ConfigError("corpus=PATH is required (a wiki-18 style jsonl)")
        if cfg.host not in ("127.0.0.1", "localhost", "::1"):
            raise ConfigError(f"host={cfg.host!r}: serve-retriever only binds loopback")
        from evals.retrievers import Bm25Retriever, RetrieverError

        try:
            retriever = Bm25Retriever(cfg.corpus, cfg.index_dir)
        except RetrieverError as exc:
            raise ConfigError(str(exc)) from exc
        server = make_server(retriever, cfg.host, int(cfg.port), int(cfg.max_topk))
        host, port = server.server_address[:2]
        print(f"serving {retriever.num_docs} docs from {cfg.corpus} at http://{host}:{port}/retrieve", flush=True)
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
