"""The engine an episode generates with: one abstract class, two kinds behind it.

An episode (evals.agent.play_agent, evals.babyai.play_game) awaits `engine.generate_one(ids, cap,
temperature=, seed=)` once per turn, whatever answers it:

    an asynchronous engine   vLLM's AsyncLLM (evals.backends.AsyncVLLMBackend): each request goes
                             to the engine as it comes; episodes never wait for one another.
    `Lockstep(backend)`      an adapter over a batched backend (`backend.generate(prompt_ids, caps,
                             *, temperature=, seeds=)`: HF, vLLM's LLM): it holds each request until
                             every live episode is blocked — on a generation or on a tool round —,
                             then runs the pending tool calls of all of them in one `execute` (when
                             any), else the pending generations in one batched `generate`, in the
                             episodes' start order. So each turn of a set of episodes is one batch,
                             as the reference lockstep loop had it, played by the same episode code.

A turn of an episode depends only on its own prompt, its own seed and its own tool responses, so
the rows of an episode are the same under both (greedy rows equal across drivers by construction).

The episode runner (evals.scheduler.run_async) tells the engine when an episode starts and ends
(`episode_started` / `episode_finished`) and asks it for the tool batcher of a bench
(`tool_batcher`); an engine with its own event loop runs the episodes there (`run`), and one that
knows its KV capacity reports it (`kv_capacity`, for `max_in_flight=auto`).
"""
from __future__ import annotations

import asyncio
import contextvars
import math
from abc import ABC, abstractmethod
from concurrent.futures import Executor
from typing import Any, Callable

# The start position of the episode a coroutine is playing (set by evals.scheduler.run_async): the
# lockstep adapter orders each batch by it, so a batch is in item order whatever order its
# requests arrived in.
EPISODE_ORDER: contextvars.ContextVar[int] = contextvars.ContextVar("dtsft_episode_order", default=0)
DEFAULT_TOOL_WINDOW_MS = 5.0
DEFAULT_TOOL_BATCH = 64


class Engine(ABC):
    """What an episode generates with (as vLLM's EngineClient): a tokenizer, `encode`, and one
    awaitable generation per request."""

    tokenizer: Any

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """The token ids of a rendered prompt (the template wrote every special token)."""

    @abstractmethod
    async def generate_one(self, ids: list[int], cap: int, *, temperature: float = 0.0, seed: int | None = None):
        """One generation (evals.backends.Generation) of at most `cap` new tokens after `ids`;
        greedy at temperature 0, else sampled from the request's own `seed`."""

    def run(self, coro):
        """Run the episodes' coroutine (an engine bound to an event loop of its own overrides this)."""
        return asyncio.run(coro)

    def kv_capacity(self) -> tuple[int, int] | None:
        """(tokens the KV cache holds, sequences run at once), or None when the engine cannot tell."""
        return None

    def tool_batcher(self, execute: Callable, *, window_ms: float, max_queries: int):
        """The tool batcher of one bench's episodes: calls gathered within a time window (`ToolBatcher`)."""
        return ToolBatcher(execute, window_ms=window_ms, max_queries=max_queries)

    def episode_started(self) -> None:
        """An episode is in play (it will generate or end)."""

    def episode_finished(self) -> None:
        """An episode has ended."""

    def close(self) -> None:
        """Release what the engine holds (an engine process, a loop)."""


class Lockstep(Engine):
    """A batched backend as an engine: every request is held until all live episodes are blocked,
    then one tool round (all pending tool calls, one `execute` per bench) or one batched `generate`
    (per temperature) answers them, in episode start order."""

    def __init__(self, backend):
        self.backend = backend
        self.tokenizer = backend.tokenizer
        self.live = 0
        self._generations: list[tuple[int, list[int], int, float, int | None, asyncio.Future]] = []
        self._tools: list[_GatheredTools] = []
        self._rounds: set[asyncio.Future] = set()
        self.batches = 0   # generation rounds answered

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text)

    async def generate_one(self, ids, cap, *, temperature: float = 0.0, seed: int | None = None):
        fut = asyncio.get_running_loop().create_future()
        self._generations.append((EPISODE_ORDER.get(), list(ids), int(cap), float(temperature), seed, fut))
        self._advance()
        return await fut

    def tool_batcher(self, execute: Callable, *, window_ms: float, max_queries: int):
        batcher = _GatheredTools(execute, self)
        self._tools.append(batcher)
        return batcher

    def episode_started(self) -> None:
        self.live += 1

    def episode_finished(self) -> None:
        self.live -= 1
        self._advance()

    def _advance(self) -> None:
        """Answer the pending requests once every live episode waits on one (tool rounds first)."""
        blocked = len(self._generations) + sum(len(t.pending) for t in self._tools)
        if blocked == 0 or blocked < self.live:
            return
        if any(t.pending for t in self._tools):
            for tools in self._tools:
                tools.flush()
            return
        pending, self._generations = sorted(self._generations, key=lambda g: g[0]), []
        for temperature in sorted({g[3] for g in pending}):
            group = [g for g in pending if g[3] == temperature]
            if isinstance(self.backend, Engine):   # an async engine: the round submitted together
                task = asyncio.ensure_future(self._submit_together(group))
                self._rounds.add(task)
                task.add_done_callback(self._rounds.discard)
                continue
            prompts, caps = [g[1] for g in group], [g[2] for g in group]
            if temperature > 0:
                _answer(group, lambda: self.backend.generate(prompts, caps, temperature=temperature,
                                                             seeds=[g[4] for g in group]))
            else:
                _answer(group, lambda: self.backend.generate(prompts, caps))
        self.batches += 1

    async def _submit_together(self, group: list) -> None:
        try:
            gens = await asyncio.gather(*(self.backend.generate_one(g[1], g[2], temperature=g[3], seed=g[4])
                                          for g in group))
        except Exception as exc:
            _deliver(group, exc=exc)
            return
        _deliver(group, gens)

    def run(self, coro):
        return self.backend.run(coro) if isinstance(self.backend, Engine) else asyncio.run(coro)

    def kv_capacity(self) -> tuple[int, int] | None:
        return self.backend.kv_capacity() if isinstance(self.backend, Engine) else None


def _answer(group: list, compute: Callable[[], list]) -> None:
    """Resolve each waiting request of `group` (its future last) with its result of `compute()`, or
    every one with the error `compute` raised."""
    try:
        results = compute()
    except Exception as exc:   # handed to every waiting episode
        _deliver(group, exc=exc)
        return
    _deliver(group, results)


def _deliver(group: list, results=None, exc: BaseException | None = None) -> None:
    for k, g in enumerate(group):
        fut = g[-1]
        if fut.done():
            continue
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(results[k])


class _GatheredTools:
    """The tool batcher of a bench under `Lockstep`: calls wait for the round, answered in one `execute`."""

    def __init__(self, execute: Callable, engine: Lockstep):
        self.execute, self.engine = execute, engine
        self.pending: list[tuple[int, Any, Any, asyncio.Future]] = []
        self.calls = 0   # execute calls made

    async def submit(self, unit, calls) -> list:
        fut = asyncio.get_running_loop().create_future()
        self.pending.append((EPISODE_ORDER.get(), unit, calls, fut))
        self.engine._advance()
        return await fut

    def flush(self) -> None:
        batch, self.pending = sorted(self.pending, key=lambda p: p[0]), []
        if not batch:
            return
        self.calls += 1
        _answer(batch, lambda: self.execute([(unit, calls) for _, unit, calls, _ in batch]))


class ToolBatcher:
    """Micro-batches the tool work of concurrent episodes: calls submitted within `window_ms` of the
    first one of a batch, or until `max_queries` calls are waiting, go to `execute` in one call (for
    a search bench: one retriever query for all of them), run in a worker thread. So `execute` is
    called at most ceil(queries / max_queries) + (number of windows that expired) times."""

    def __init__(self, execute: Callable[[list[tuple[Any, Any]]], list], *, window_ms: float = DEFAULT_TOOL_WINDOW_MS,
                 max_queries: int = DEFAULT_TOOL_BATCH, executor: Executor | None = None):
        self.execute, self.window, self.max_queries = execute, max(0.0, float(window_ms)) / 1000.0, max(1, int(max_queries))
        self.executor = executor
        self._batch: list[tuple[Any, Any, asyncio.Future]] = []
        self._queries = 0
        self._timer: asyncio.TimerHandle | None = None
        self.calls = self.windows = self.queries = 0   # execute calls, flushes by an expired window, calls batched

    async def submit(self, unit, calls) -> list:
        """The responses to `calls` (a list) of `unit`, once its batch has been executed."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._batch.append((unit, calls, fut))
        self._queries += len(calls)
        self.queries += len(calls)
        if self._queries >= self.max_queries:
            self._flush(loop, by_window=False)
        elif self._timer is None:
            self._timer = loop.call_later(self.window, self._flush, loop, True)
        return await fut

    def _flush(self, loop, by_window: bool) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._batch, self._queries = self._batch, [], 0
        if not batch:
            return
        self.calls += 1
        self.windows += int(by_window)
        work = loop.run_in_executor(self.executor, self.execute, [(u, c) for u, c, _ in batch])

        def deliver(done: asyncio.Future) -> None:
            if done.cancelled():
                for *_, fut in batch:
                    fut.cancel()
            elif done.exception() is not None:
                for *_, fut in batch:
                    if not fut.done():
                        fut.set_exception(done.exception())
            else:
                for (*_, fut), resp in zip(batch, done.result()):
                    if not fut.done():
                        fut.set_result(resp)
        work.add_done_callback(deliver)

    def bound(self) -> int:
        """The most `execute` calls the queries so far may have cost."""
        return math.ceil(self.queries / self.max_queries) + self.windows
