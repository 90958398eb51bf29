"""The episode runner: one coroutine per episode over an engine (evals.engine).

Each episode is one `async def` (evals.agent.play_agent, evals.babyai.play_game) that plays it to its
end on a `Table`: each turn it renders its conversation and tokenizes it (in a worker thread, off
the event loop), submits the ids to the engine with its own decoding, reads the generation and, for
a tool turn, sends its calls to the bench's tool batcher and reads the responses back. Over an
asynchronous engine nothing waits for another episode: while one is in a tool round or being
rendered the engine decodes the others, and a finished episode's slot goes at once to the next one.
Over `evals.engine.Lockstep` the same coroutines advance one batched turn at a time.

At most `max_in_flight` episodes are in play at once (`run_async`'s workers: an episode is started
only when one finishes), so the engine holds the KV cache of a bounded set of conversations and
every later turn of an episode finds its earlier turns in vLLM's prefix cache. Episodes start in
the order given; finished ones are handed to `job.finish` in completion order (which is not the
order given: the caller writes rows keyed by id).

A turn of an episode depends only on its own prompt, its own seed and its own tool responses, so
the rows equal whatever the engine and the completion order: the tests check both drivers on a
scripted engine in scrambled completion orders, and on vLLM's CPU build with the tiny model.
"""
from __future__ import annotations

import asyncio
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterable

from evals.agent import fit, render
from evals.engine import EPISODE_ORDER



def auto_in_flight(kv_tokens: int, max_model_len: int, max_num_seqs: int) -> int:
    """`max_in_flight=auto`: min(2 x max_num_seqs, 4 x kv_tokens // max_model_len), at least 1.
    The engine runs `max_num_seqs` sequences at once; twice that keeps it full while as many
    episodes are in a tool round or being rendered. And the conversations in play should fit the KV
    cache together, so that each later turn finds its earlier turns still cached: an agentic
    conversation averages well under a quarter of `max_model_len`, so the cache holds about
    4 x kv_tokens / max_model_len of them."""
    by_kv = (4 * int(kv_tokens)) // max(1, int(max_model_len))
    return max(1, min(2 * int(max_num_seqs), by_kv))


@dataclass
class Episodes:
    """How one bench's items are played: `start(item) -> unit` (run in the render thread: an
    environment reset may be slow), `play(unit, table)` (the episode's `async def`), `row(unit, item)`
    (its `<bench>.jsonl` line), `execute` (the bench's tool calls, a batch at a time; None: no tools)."""
    start: Callable[[Any], Any]
    play: Callable[[Any, Any], Awaitable[Any]]
    row: Callable[[Any, Any], dict]
    execute: Callable[[list], list] | None = None


class Job:
    """One episode for the runner: how to set it up (`start() -> unit`, in a worker thread: an
    environment reset may be slow), how to play it (`play(unit, table)`, an `async def` over the
    table's engine), its bench's tool batcher, and what to do with it once it has stopped (`finish`,
    e.g. append its row)."""

    def __init__(self, start: Callable[[], Any], play: Callable[[Any, "Table"], Awaitable[Any]],
                 finish: Callable[[Any], None], tools=None):
        self.start, self.play, self.finish, self.tools = start, play, finish, tools


class Table:
    """What an episode plays against: the engine, its bench's tool batcher, the render thread and the
    context window. `generate` is a turn's generation: render the conversation with the chat
    template and tokenize it (in the render thread, off the event loop), fit it in `max_model_len`,
    await the engine."""

    def __init__(self, engine, tools, executor: Executor | None, max_model_len: int):
        self.engine, self.tools, self.executor, self.max_model_len = engine, tools, executor, int(max_model_len)

    async def generate(self, unit, messages: list[dict], tools: list[dict], *, max_new_tokens: int,
                       template_kwargs: dict | None = None, temperature: float = 0.0, seed: int | None = None):
        """(generation, its cap on new tokens) of `unit`'s next turn; None, with `unit.stop_reason`
        set to `context_limit` and `unit.refused_prompt` to the prompt's length and the window, when the
        prompt no longer fits."""
        engine = self.engine
        text = lambda: engine.encode(render(engine.tokenizer, messages, tools, template_kwargs))  # noqa: E731
        ids = await asyncio.get_running_loop().run_in_executor(self.executor, text)
        cap = fit(len(ids), max_model_len=self.max_model_len, max_new_tokens=max_new_tokens)
        if cap is None:
            unit.stop_reason = "context_limit"
            unit.refused_prompt = {"tokens": len(ids), "max_model_len": self.max_model_len}
            return None
        return await engine.generate_one(ids, cap, temperature=temperature, seed=seed), cap


async def run_async(jobs: Iterable[Job], engine, *, max_in_flight: int, max_model_len: int | Callable[[Job], int],
                    executor: Executor | None = None) -> int:
    """Play every job with at most `max_in_flight` episodes in play; `job.finish(unit)` is called
    as each one stops. The first error cancels the rest (finished jobs stay finished). Returns the
    number of episodes played. `max_model_len` may be per job (a callable)."""
    queue = enumerate(jobs)
    own = executor is None
    # one thread: a tokenizer is not guaranteed thread-safe, and it only has to keep up with the engine
    executor = executor or ThreadPoolExecutor(max_workers=1, thread_name_prefix="dtsft-render")
    per = lambda v, job: v(job) if callable(v) else v  # noqa: E731
    loop = asyncio.get_running_loop()
    played = 0

    async def worker() -> None:
        nonlocal played
        for order, job in queue:   # one shared iterator: each job is taken by exactly one worker
            EPISODE_ORDER.set(order)
            engine.episode_started()
            unit = await loop.run_in_executor(executor, job.start)
            await job.play(unit, Table(engine, job.tools, executor, per(max_model_len, job)))
            engine.episode_finished()
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


def play_items(items: list, episodes: Episodes, engine, *, max_model_len: int, tools=None,
               max_in_flight: int | None = None) -> list[dict]:
    """Play `items` to their end on `engine` (all of them in play at once unless `max_in_flight`);
    their rows in item order."""
    rows: dict = {}
    jobs = episode_jobs(items, episodes, tools, lambda unit, item: rows.__setitem__(item.id, episodes.row(unit, item)))
    engine.run(run_async(jobs, engine, max_in_flight=max_in_flight or len(items), max_model_len=max_model_len))
    return [rows[item.id] for item in items]


def episode_jobs(items: list, episodes: Episodes, tools, finish: Callable[[Any, Any], None]) -> list[Job]:
    """One job per item: started by `episodes.start`, played by `episodes.play`, `finish(unit, item)` at its end."""
    return [Job(lambda it=it: episodes.start(it), episodes.play, lambda unit, it=it: finish(unit, it), tools)
            for it in items]
