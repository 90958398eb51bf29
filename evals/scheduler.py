"""The asynchronous driver: one coroutine per episode over an async engine.

Each episode plays evals.agent's step functions on its own: render its next prompt and tokenize it
(in a worker thread, off the event loop), submit it to the engine as token ids with its own
decoding (`steps.sampling`), read the generation (`steps.on_generation`), send its tool work to
the bench's `ToolBatcher` and read the responses back (`steps.on_tools`), until it stops. Nothing
waits for another episode: while one is in a tool round or being rendered the engine decodes the
others, and a finished episode's slot goes at once to the next one.

At most `max_in_flight` episodes are in play at once (`run_async`'s workers: an episode is started
only when one finishes), so the engine holds the KV cache of a bounded set of conversations and
every later turn of an episode finds its earlier turns in vLLM's prefix cache. Episodes start in
the order given; finished ones are handed to `job.finish` in completion order (which is not the
order given: the caller writes rows keyed by id).

A turn of an episode depends only on its own prompt, its own seed and its own tool responses, so
the rows equal those of the lockstep driver (evals.agent.run_lockstep) whatever the completion
order: the tests check both drivers on a scripted engine in scrambled completion orders, and on
vLLM's CPU build with the tiny model.

The async engine interface: `tokenizer`, `encode(text) -> ids` (called from worker threads) and
`async generate_one(ids, cap, *, temperature, seed) -> Generation` (evals.backends.AsyncVLLMBackend).
"""
from __future__ import annotations

import asyncio
import math
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, Callable, Iterable

from evals.agent import fit

DEFAULT_TOOL_WINDOW_MS = 5.0
DEFAULT_TOOL_BATCH = 64


def auto_in_flight(kv_tokens: int, max_model_len: int, max_num_seqs: int) -> int:
    """`max_in_flight=auto`: min(2 x max_num_seqs, 4 x kv_tokens // max_model_len), at least 1.
    The engine runs `max_num_seqs` sequences at once; twice that keeps it full while as many
    episodes are in a tool round or being rendered. And the conversations in play should fit the KV
    cache together, so that each later turn finds its earlier turns still cached: an agentic
    conversation averages well under a quarter of `max_model_len`, so the cache holds about
    4 x kv_tokens / max_model_len of them."""
    by_kv = (4 * int(kv_tokens)) // max(1, int(max_model_len))
    return max(1, min(2 * int(max_num_seqs), by_kv))


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


class Job:
    """One episode for the async driver: its bench's steps and tool batcher, how to start it and
    what to do with it once it has stopped (e.g. append its row)."""

    def __init__(self, steps, start: Callable[[], Any], finish: Callable[[Any], None], tools: ToolBatcher | None):
        self.steps, self.start, self.finish, self.tools = steps, start, finish, tools


async def play_episode(job: Job, engine, *, max_model_len: int, max_new_tokens: int, executor: Executor | None) -> Any:
    """Play one episode to its end on `engine`; returns the unit."""
    loop = asyncio.get_running_loop()
    steps = job.steps
    unit = await loop.run_in_executor(executor, job.start)
    while unit.stop_reason is None:
        ids = await loop.run_in_executor(executor, lambda: engine.encode(steps.turn_prompt(unit)))
        cap = fit(len(ids), max_model_len=max_model_len, max_new_tokens=max_new_tokens)
        if cap is None:
            unit.stop_reason = "context_limit"
            break
        temperature, seed = steps.sampling(unit)
        gen = await engine.generate_one(ids, cap, temperature=temperature, seed=seed)
        work = steps.on_generation(unit, gen, cap)
        if work is not None:
            batch = steps.tool_batch(unit, work)
            responses = await job.tools.submit(unit, batch) if batch else []
            steps.on_tools(unit, work, responses)
    return unit


async def run_async(jobs: Iterable[Job], engine, *, max_in_flight: int, max_model_len: int | Callable[[Job], int],
                    max_new_tokens: int | Callable[[Job], int], executor: Executor | None = None) -> int:
    """Play every job with at most `max_in_flight` episodes in play; `job.finish(unit)` is called
    as each one stops. The first error cancels the rest (finished jobs stay finished). Returns the
    number of episodes played. `max_model_len`/`max_new_tokens` may be per job (a callable)."""
    queue = iter(jobs)
    own = executor is None
    # one thread: a tokenizer is not guaranteed thread-safe, and it only has to keep up with the engine
    executor = executor or ThreadPoolExecutor(max_workers=1, thread_name_prefix="dtsft-render")
    per = lambda v, job: v(job) if callable(v) else v  # noqa: E731
    played = 0

    async def worker() -> None:
        nonlocal played
        for job in queue:   # one shared iterator: each job is taken by exactly one worker
            unit = await play_episode(job, engine, max_model_len=per(max_model_len, job),
                                      max_new_tokens=per(max_new_tokens, job), executor=executor)
            job.finish(unit)
            played += 1

    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(max(1, int(max_in_flight))):
                group.create_task(worker())
    except BaseExceptionGroup as eg:   # re-raise the first real error as itself (KeyboardInterrupt, EvalError, ...)
        raise eg.exceptions[0] from None
    finally:
        if own:
            executor.shutdown(wait=False, cancel_futures=True)
    return played
