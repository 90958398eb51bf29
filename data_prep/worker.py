"""Render + tokenize + mask, in-process or in a pool of worker processes.

Work is cut into small chunks of candidate records; results come back in submission order, and at
most a few chunks are in flight, so the builder stops submitting once the arm's quota is met. The
output never depends on the number of processes (a test checks the fingerprint).
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
from collections import deque
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from data_prep.render import ChatRenderer, tokenize_rows, withheld_tokens
from data_prep.schema import RecordError, quarantine_detail

CHUNK = 16


@dataclass
class Encoded:
    id: str
    input_ids: np.ndarray
    labels: np.ndarray
    checks: dict
    retokenized: bool
    inexact: np.ndarray | None  # per token: inside an inexact (as-rendered) span
    withheld: int = 0  # epilogue=false: tokens of the epilogue the row leaves out (counted by length_policy=drop)
    epilogue_chars: tuple = ()  # (token, characters of the epilogue through it) per epilogue token (render.Tokenized)


_STATE: dict = {}


def _init(tokenizer, renderer_kwargs: dict, single_thread: bool) -> None:
    if single_thread:  # a pool worker: one Rust thread each (the pool already uses every core), and stopped by
        os.environ["TOKENIZERS_PARALLELISM"] = "false"   # the pool's SIGTERM (`close`) whatever handler its parent
        signal.signal(signal.SIGTERM, signal.SIG_DFL)    # had (forked with one, it runs it and waits on: a hang)
    _STATE["tok"] = tokenizer
    _STATE["renderer"] = ChatRenderer(tokenizer, **renderer_kwargs)


def _fail(exc: BaseException, stage: str) -> tuple:
    """A rejection for one record: its own RecordError, or any other exception while rendering or
    tokenizing it (a template error, RecursionError, UnicodeError...) with its type and message."""
    if isinstance(exc, RecordError):
        return ("err", exc.reason, exc.detail)
    return ("err", f"{stage}_error", quarantine_detail(exc))


def process_chunk(records: list[dict]) -> list[tuple]:
    """Per record: ("ok", record-with-epilogue, [Encoded...]) or ("err", reason, detail). An
    exception while rendering or tokenizing one record rejects that record only."""
    tok, renderer = _STATE["tok"], _STATE["renderer"]
    results: list = []
    rendered = []
    for rec in records:
        try:
            rendered.append((len(results), rec, renderer.rows(rec)))
            results.append(None)
        except Exception as exc:
            results.append(_fail(exc, "render"))
    try:  # the whole chunk in one batch; on any failure, record by record to find the bad one
        flat = [row for _, _, rows in rendered for row in rows]
        encoded = iter(tokenize_rows(tok, flat)) if flat else iter(())
        per_record = [[next(encoded) for _ in rows] for _, _, rows in rendered]
    except Exception:
        per_record = []
        for _, _, rows in rendered:
            try:
                per_record.append(tokenize_rows(tok, rows))
            except Exception as exc:
                per_record.append(exc)
    for (k, rec, rows), enc in zip(rendered, per_record):
        if isinstance(enc, BaseException):
            results[k] = _fail(enc, "tokenize")
            continue
        out = [Encoded(row.id, np.asarray(t.input_ids, dtype=np.int32), np.asarray(t.labels, dtype=np.int32),
                       row.checks, t.retokenized, t.inexact, w, t.epilogue_chars)
               for row, t, w in zip(rows, enc, withheld_tokens(tok, rows))]
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
