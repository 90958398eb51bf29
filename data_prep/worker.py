"""Render + tokenize + mask, in-process or in a pool of worker processes.

Work is cut into small chunks of candidate records; results come back in submission order, and at
most a few chunks are in flight, so the builder stops submitting once the arm's quota is met. The
output never depends on the number of processes (a test checks the fingerprint).
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
from collections import deque
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from data_prep.render import ChatRenderer, tokenize_rows
from data_prep.schema import RecordError

CHUNK = 16


@dataclass
class Encoded:
    id: str
    input_ids: np.ndarray
    labels: np.ndarray
    checks: dict
    retokenized: bool
    inexact: np.ndarray | None  # per token: inside an inexact (as-rendered) span


_STATE: dict = {}


def _init(tokenizer, renderer_kwargs: dict, single_thread: bool) -> None:
    if single_thread:  # one Rust thread per worker: the pool already uses every core
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _STATE["tok"] = tokenizer
    _STATE["renderer"] = ChatRenderer(tokenizer, **renderer_kwargs)


def process_chunk(records: list[dict]) -> list[tuple]:
    """Per record: ("ok", record-with-epilogue, [Encoded...]) or ("err", reason, detail)."""
    tok, renderer = _STATE["tok"], _STATE["renderer"]
    results: list = []
    rendered = []
    for rec in records:
        try:
            rendered.append((len(results), rec, renderer.rows(rec)))
            results.append(None)
        except RecordError as exc:
            results.append(("err", exc.reason, exc.detail))
    flat = [row for _, _, rows in rendered for row in rows]
    encoded = iter(tokenize_rows(tok, flat)) if flat else iter(())
    for k, rec, rows in rendered:
        out = []
        for row in rows:
            t = next(encoded)
            out.append(Encoded(row.id, np.asarray(t.input_ids, dtype=np.int32), np.asarray(t.labels, dtype=np.int32),
                               row.checks, t.retokenized, t.inexact))
        results[k] = ("ok", rec, out)
    return results


class Processor:
    """Ordered, windowed map of `process_chunk` over record chunks."""

    def __init__(self, tokenizer, renderer_kwargs: dict, num_proc: int):
        self.num_proc = max(1, int(num_proc))
        self.pool = None
        if self.num_proc > 1:
            ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
            self.pool = ctx.Pool(self.num_proc, initializer=_init, initargs=(tokenizer, renderer_kwargs, True))
        else:
            _init(tokenizer, renderer_kwargs, False)

    def map(self, chunks: Iterator[list[dict]]) -> Iterator[list[tuple]]:
        """Results per chunk, in order; pulls new chunks only as results are consumed."""
        if self.pool is None:
            for c in chunks:
                yield process_chunk(c)
            return
        window: deque = deque()
        it = iter(chunks)
        for c in it:
            window.append(self.pool.apply_async(process_chunk, (c,)))
            if len(window) >= 2 * self.num_proc:
                break
        while window:
            res = window.popleft().get()
            nxt = next(it, None)
            if nxt is not None:
                window.append(self.pool.apply_async(process_chunk, (nxt,)))
            yield res

    def close(self) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()
            self.pool = None


def record_json(rec: dict) -> str:
    return json.dumps(rec, ensure_ascii=False)
