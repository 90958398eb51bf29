"""evals.scheduler: the asynchronous driver gives the lockstep driver's rows and summaries.

A deterministic scripted policy (its reply a pure function of the prompt's token ids, and of the
seed when sampling) drives both: a batched backend for the lockstep driver, and an async twin that
completes its outstanding requests in a scrambled (seeded) order for the async driver. The policy
searches 0-4 times, makes malformed and unknown-tool calls, runs out of turns, out of context and
out of tokens, and its generation lengths have a long tail. Also: the in-flight cap and "the
engine never idles while an episode is runnable" (measured by the engine), resume after a kill,
the tool batcher's call bound, BabyAI greedy and sampled."""
from __future__ import annotations

import asyncio
import hashlib
import json
import math
import random
import re
import time

import pytest

from evals import scheduler
from evals.backends import Generation
from evals.engine import Engine, ToolBatcher
from evals.run import evaluate
from tests.test_evals_loop import make_world


def _h(*parts) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "big")


class Policy:
    """A search agent whose every reply is a function of the prompt ids (and the seed)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def encode(self, text):
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def reply(self, ids, cap, temperature=0.0, seed=None) -> Generation:
        prompt = self.tokenizer.decode(ids)
        h = _h(tuple(ids), temperature, seed)
        n_tokens = 1 + (h % 97 if h % 10 else 300 + h % 900)  # a long tail of generation lengths
        if "Current Observation:" in prompt:   # a BabyAI prompt: pick an action (or junk) from the hash
            acts = ["turn left", "turn right", "go forward", "pick up", "toggle", "I do not know"]
            return Generation(f"<think>\n{h % 13}\n</think>\n\n{acts[h % len(acts)]}", "stop", min(cap, n_tokens))
        question = re.search(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", prompt, re.S).group(1)
        hq = _h(question)
        responses = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", prompt, re.S)
        searches = hq % 5
        if hq % 13 == 0 or n_tokens >= cap:  # runs out of tokens
            return Generation("Let me think about this at length " * 3, "length", cap)
        if len(responses) < searches:
            k = len(responses)
            if hq % 7 == 0 and k == 0:
                return Generation('Searching.</think>\n\n<tool_call>\n{"name": "search", "arguments": {"query": }\n</tool_call>',
                                  "stop", n_tokens)
            name = "lookup" if hq % 4 == 1 and k == 1 else "search"
            call = json.dumps({"name": name, "arguments": {"query": f"{question} {k}"}})
            return Generation(f"Search {k}.</think>\n\n<tool_call>\n{call}\n</tool_call>", "stop", n_tokens)
        found = re.search(r"The capital of \w+ is (\w+)\.", responses[-1]) if responses else None
        if hq % 3 == 0:
            return Generation("Done.</think>\n\nI am not sure.", "stop", n_tokens)
        return Generation(f"Done.</think>\n\nFinal answer: {found.group(1) if found else 'unknown'}", "stop", n_tokens)


class BatchedScripted(Policy):
    """The lockstep twin: a batched generate."""

    name = "scripted"

    def generate(self, prompt_ids, caps, *, temperature=0.0, seeds=None):
        return [self.reply(ids, cap, temperature, None if seeds is None else seeds[i])
                for i, (ids, cap) in enumerate(zip(prompt_ids, caps))]


class ScrambledAsync(Policy, Engine):
    """The async twin: requests wait until the driver has submitted what it can (no new request
    for `quiet` seconds, or `fill()` requests outstanding), then one outstanding request, picked
    by a seeded rng, completes. Records the most requests outstanding at once; with `fill` it also
    records each time it had to give up waiting (the driver left a runnable episode unsubmitted);
    `fail_after`: raise after that many completions (a kill)."""

    name = "scripted"

    def __init__(self, tokenizer, order_seed=0, quiet=0.004, fill=None, fail_after=None, patience=0.25):
        super().__init__(tokenizer)
        self.rng, self.quiet, self.fill, self.fail_after, self.patience = random.Random(order_seed), quiet, fill, fail_after, patience
        self.pending: list = []
        self.max_outstanding, self.completed, self.idle_waits, self.first_turns = 0, 0, 0, 0
        self._clock = None
        self._last = 0.0

    async def generate_one(self, ids, cap, *, temperature=0.0, seed=None):
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        if "<tool_response>" not in self.tokenizer.decode(ids):
            self.first_turns += 1
        self.pending.append((ids, cap, temperature, seed, fut))
        self.max_outstanding = max(self.max_outstanding, len(self.pending))
        self._last = loop.time()
        if self._clock is None or self._clock.done():
            self._clock = asyncio.ensure_future(self._run())
        return await fut

    async def _run(self):
        loop = asyncio.get_running_loop()
        while self.pending:
            if self.fill is not None:
                start = loop.time()
                while len(self.pending) < self.fill():
                    if loop.time() - start > self.patience:
                        self.idle_waits += 1
                        break
                    await asyncio.sleep(0.0005)
            else:
                while loop.time() - self._last < self.quiet:
                    await asyncio.sleep(self.quiet / 4)
            ids, cap, temperature, seed, fut = self.pending.pop(self.rng.randrange(len(self.pending)))
            self.completed += 1
            if self.fail_after is not None and self.completed > self.fail_after:
                fut.set_exception(RuntimeError("simulated kill"))
                continue
            fut.set_result(self.reply(ids, cap, temperature, seed))
            await asyncio.sleep(0)


@pytest.fixture()
def world(tmp_path):
    corpus, bench_root = make_world(tmp_path, n=24, seed=3)
    return {"corpus": str(corpus), "bench_root": str(bench_root), "index_dir": str(tmp_path / "idx"),
            "ckpt": str(tmp_path / "model"), "benches": ["synthqa"], "n": 24, "progress": False,
            "max_turns": 3, "max_new_tokens": 400, "max_model_len": 800, "wandb": False}


def _rows(path):
    return sorted((json.loads(line) for line in open(path)), key=lambda r: r["id"])


def test_both_drivers_write_the_same_rows_and_summary_in_any_completion_order(world, tmp_path, tiny_tokenizer):
    ref = evaluate({**world, "out": str(tmp_path / "lock"), "batch_size": 5}, backend=BatchedScripted(tiny_tokenizer))
    reasons = ref["synthqa"]["stop_reasons"]
    # the workload covers every way an episode ends and every tool mistake
    assert {"answer", "no_answer", "length", "max_turns", "context_limit"} <= set(reasons), reasons
    lock_rows = _rows(tmp_path / "lock" / "synthqa.jsonl")
    assert sum(r["num_tool_errors"] for r in lock_rows) > 0
    assert any(m.get("content", "").startswith("Error: unknown tool") for r in lock_rows for m in r["messages"])
    for order_seed, cap in ((0, 3), (1, 7), (2, 64)):
        engine = ScrambledAsync(tiny_tokenizer, order_seed=order_seed)
        out = tmp_path / f"async{order_seed}"
        got = evaluate({**world, "out": str(out), "driver": "async", "max_in_flight": cap}, backend=engine)
        assert engine.max_outstanding <= cap
        assert got == ref
        assert _rows(out / "synthqa.jsonl") == lock_rows
        finished = [json.loads(line)["id"] for line in open(out / "synthqa.jsonl")]
        if order_seed == 1:
            assert finished != sorted(finished, key=[r["id"] for r in lock_rows].index)  # really another order
    assert json.loads((tmp_path / "async0" / "summary.json").read_text()) == json.loads(
        (tmp_path / "lock" / "summary.json").read_text())
    # the driver is operational: the same identity, so a lockstep out dir resumes under async and vice versa
    meta_l, meta_a = (json.loads((tmp_path / d / "meta.json").read_text()) for d in ("lock", "async0"))
    assert meta_l["identities"]["synthqa"]["fingerprint"] == meta_a["identities"]["synthqa"]["fingerprint"]


def test_a_killed_async_evaluation_resumes_to_the_same_summary(world, tmp_path, tiny_tokenizer):
    cfg = {**world, "out": str(tmp_path / "out"), "driver": "async", "max_in_flight": 4}
    ref = evaluate({**cfg, "out": str(tmp_path / "ref")}, backend=ScrambledAsync(tiny_tokenizer))
    with pytest.raises(RuntimeError, match="simulated kill"):
        evaluate(cfg, backend=ScrambledAsync(tiny_tokenizer, order_seed=5, fail_after=20))
    k = len(_rows(tmp_path / "out" / "synthqa.jsonl"))
    assert 0 < k < 24   # rows of the episodes that finished were appended as they finished
    assert not (tmp_path / "out" / "summary.json").exists() or "synthqa" not in json.loads(
        (tmp_path / "out" / "summary.json").read_text())
    again = ScrambledAsync(tiny_tokenizer, order_seed=6)
    assert evaluate(cfg, backend=again) == ref
    assert again.first_turns == 24 - k      # only the episodes without a row were played again
    assert len(_rows(tmp_path / "out" / "synthqa.jsonl")) == 24


class _Unit:
    def __init__(self, i):
        self.id, self.turn, self.stop_reason = i, 0, None


class _CountingSteps:
    """Episodes of `turns[i]` turns with an instant tool round after each turn but the last."""

    def __init__(self, turns):
        self.turns = turns

    async def play(self, u, table):
        while u.stop_reason is None:
            await table.engine.generate_one(table.engine.encode(f"{u.id}|{u.turn}"), 64)
            u.turn += 1
            if u.turn >= self.turns[u.id]:
                u.stop_reason = "answer"
            else:
                assert await table.tools.submit(u, ["call"]) == ["ok"]
        return u

    def execute(self, batch):
        return [["ok"] * len(calls) for _, calls in batch]


class _Tok:
    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


@pytest.mark.parametrize("cap", [1, 5, 16])
def test_the_cap_holds_and_the_engine_never_idles_while_an_episode_is_runnable(cap):
    n = 40
    turns = [1 + _h("turns", i) % 6 for i in range(n)]
    finished: list[int] = []
    engine = ScrambledAsync(_Tok(), order_seed=cap, fill=lambda: min(cap, n - len(finished)))
    engine.reply = lambda ids, c, t=0.0, s=None: Generation("x", "stop", 1 + _h(tuple(ids)) % 50)
    steps = _CountingSteps(turns)
    tools = ToolBatcher(steps.execute, window_ms=0, max_queries=8)
    jobs = [scheduler.Job((lambda i=i: _Unit(i)), steps.play, lambda u: finished.append(u.id), tools) for i in range(n)]
    played = asyncio.run(scheduler.run_async(jobs, engine, max_in_flight=cap, max_model_len=10**6))
    assert played == n and sorted(finished) == list(range(n))
    assert engine.completed == sum(turns)
    assert engine.max_outstanding == min(cap, n)   # the cap is reached and never exceeded
    assert engine.idle_waits == 0                  # every runnable episode reached the engine before it stepped


def test_the_auto_in_flight_formula():
    assert scheduler.auto_in_flight(kv_tokens=1_000_000, max_model_len=16384, max_num_seqs=256) == 244
    assert scheduler.auto_in_flight(kv_tokens=10**9, max_model_len=4096, max_num_seqs=256) == 512
    assert scheduler.auto_in_flight(kv_tokens=100, max_model_len=4096, max_num_seqs=256) == 1


def test_the_tool_batcher_makes_at_most_ceil_queries_over_k_plus_windows_calls():
    calls: list[list] = []

    def execute(batch):
        calls.append(batch)
        return [[f"{u}:{q}" for q in qs] for u, qs in batch]

    async def go(batcher, arrivals):
        async def one(u, delay, qs):
            await asyncio.sleep(delay)
            assert await batcher.submit(u, qs) == [f"{u}:{q}" for q in qs]   # each gets its own answers
        await asyncio.gather(*(one(u, d, qs) for u, (d, qs) in enumerate(arrivals)))

    rng = random.Random(0)
    # all at once: size flushes only (+ the remainder's window)
    b = ToolBatcher(execute, window_ms=50, max_queries=8)
    asyncio.run(go(b, [(0.0, [f"q{j}" for j in range(1 + u % 3)]) for u in range(60)]))
    q = sum(1 + u % 3 for u in range(60))
    assert b.queries == q == sum(len(qs) for batch in calls for _, qs in batch)
    assert len(calls) <= math.ceil(q / 8) + b.windows and b.windows <= 1
    # spread over time: windows expire too
    calls.clear()
    b = ToolBatcher(execute, window_ms=5, max_queries=8)
    t0 = time.monotonic()
    asyncio.run(go(b, [(rng.random() * 0.1, ["q"]) for _ in range(80)]))
    elapsed = time.monotonic() - t0
    assert len(calls) == b.calls <= math.ceil(80 / 8) + b.windows
    assert b.windows <= elapsed / 0.005 + 1 and len(calls) < 80   # calls were batched


@pytest.mark.parametrize("temperature", [0, 1.0])
def test_babyai_greedy_and_sampled_are_the_same_under_both_drivers(tmp_path, tiny_tokenizer, temperature):
    pytest.importorskip("minigrid")
    cfg = {"ckpt": "m", "benches": ["babyai"], "bench_n": {"babyai": 6}, "babyai_max_steps": 5, "progress": False,
           "babyai_temperature": temperature, "babyai_max_new_tokens": 200, "wandb": False}
    ref = evaluate({**cfg, "out": str(tmp_path / "l"), "batch_size": 4}, backend=BatchedScripted(tiny_tokenizer))
    engine = ScrambledAsync(tiny_tokenizer, order_seed=3)
    got = evaluate({**cfg, "out": str(tmp_path / "a"), "max_in_flight": 4}, backend=engine)  # auto: async for this engine
    assert got == ref
    assert _rows(tmp_path / "a" / "babyai.jsonl") == _rows(tmp_path / "l" / "babyai.jsonl")
    seeds = [t["seed"] for r in _rows(tmp_path / "a" / "babyai.jsonl") for t in r["transcript"]]
    assert all(s is None for s in seeds) if temperature == 0 else len(set(seeds)) == len(seeds)


def test_driver_errors(world, tmp_path, tiny_tokenizer):
    from evals.errors import EvalError

    with pytest.raises(EvalError, match="driver=async needs an asynchronous engine"):
        evaluate({**world, "out": str(tmp_path / "x"), "driver": "async"}, backend=BatchedScripted(tiny_tokenizer))
    with pytest.raises(EvalError, match="driver='sideways'"):
        evaluate({**world, "out": str(tmp_path / "y"), "driver": "sideways"}, backend=BatchedScripted(tiny_tokenizer))
