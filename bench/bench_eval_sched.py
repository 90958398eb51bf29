"""Generated tokens/s of episode scheduling on vLLM (the CPU build here): lockstep vs asynchronous.

A pinned, seeded workload (issue 28): 256 episodes of 1-6 turns (uniform), each turn's length drawn
lognormal (mu 3.8, sigma 0.8: median ~45 tokens) and clipped to 4-256, forced with
`min_tokens`/`max_tokens`/`ignore_eos`; a 20 ms tool round after every turn but the last (a
retriever round trip: 20 ms for one call, whatever its number of queries). Prompts are token ids:
a shared 96-token system prefix, a 24-token question per episode, and after each turn the
generated tokens plus a 24-token tool response, so every later turn re-sends the conversation so
far (what the chat template does) and vLLM's prefix cache may reuse it. Greedy, tiny base model.

    lockstep64     today's lockstep: 64-episode chunks, each turn one batch, one tool round per turn
    lockstep_all   the same, all 256 episodes in one chunk
    coroutine      one plain coroutine per episode, no cap, each its own tool call
    async          the project's driver (evals.scheduler.run_async): in-flight cap (max_in_flight,
                   default evals.scheduler.auto_in_flight of the engine's KV capacity), tool calls
                   micro-batched (evals.engine.ToolBatcher), prompts prepared off the event loop
    saturated      the same turns (each turn's prompt, generated tokens stood in by a constant token)
                   as independent requests all at once: no turn dependency, the engine's ceiling

All modes run on one AsyncLLM engine (evals.backends.AsyncVLLMBackend), its prefix cache reset
before each. Timings on a small shared machine swing by tens of percent from one run to the next,
so every mode runs `repeats` times, interleaved (repeat r starts with the r-th mode, so no mode is
always first or last), and the ratios are of the medians. Prints every run's tokens, seconds,
tok/s, vLLM prefix-cache hit rate and this process's CPU seconds (the driver's own cost: the engine
runs in its own processes), each mode's median, then the last line exactly
`async/lockstep64 A async/lockstep_all B efficiency C` (efficiency = async / saturated).

    VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python bench/bench_eval_sched.py [episodes=256] [max_in_flight=auto]
        [modes=lockstep64,lockstep_all,coroutine,async,saturated] [seed=0] [repeats=3]
"""
from __future__ import annotations

import asyncio
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evals.engine import Engine, ToolBatcher  # noqa: E402

TOOL_S = 0.020
SYSTEM, QUESTION, RESPONSE = 96, 24, 24
MAX_MODEL_LEN = 2048
MODES = ("lockstep64", "lockstep_all", "coroutine", "async", "saturated")


def workload(episodes: int, seed: int) -> list[dict]:
    """The pinned episodes: per episode its question ids, turn lengths and tool-response ids."""
    rng = random.Random(seed)
    system = [rng.randrange(100, 4000) for _ in range(SYSTEM)]
    out = []
    for e in range(episodes):
        turns = rng.randint(1, 6)
        lengths = [min(256, max(4, int(round(math.exp(rng.gauss(3.8, 0.8)))))) for _ in range(turns)]
        out.append({"id": e, "prompt": system + [rng.randrange(100, 4000) for _ in range(QUESTION)], "lengths": lengths,
                    "responses": [[rng.randrange(100, 4000) for _ in range(RESPONSE)] for _ in range(turns)]})
    return out


class Forced(Engine):
    """Requests with a forced length on the AsyncLLM of `backend`; counts generated tokens."""

    def __init__(self, backend, final_only: bool = True):
        self.backend, self.tokens, self.requests, self.sent, self.final_only = backend, 0, 0, [], final_only
        self.lengths: dict = {}
        self._n = 0

    def encode(self, ids):
        return ids

    async def generate(self, ids: list[int], n: int) -> list[int]:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(temperature=0.0, max_tokens=n, min_tokens=n, ignore_eos=True, seed=self.backend.seed,
                                output_kind=RequestOutputKind.FINAL_ONLY if self.final_only else RequestOutputKind.CUMULATIVE)
        self._n += 1
        final = None
        async for out in self.backend.llm.generate({"prompt_token_ids": list(ids)}, params, f"bench-{self._n}"):
            final = out
        toks = list(final.outputs[0].token_ids)
        self.tokens += len(toks)
        self.requests += 1
        self.sent.append((list(ids), n))
        return toks

    async def generate_one(self, ids, cap, *, temperature=0.0, seed=None):
        """The scheduler's interface: the turn's forced length comes from the prompt (registered by the steps)."""
        from evals.backends import Generation

        toks = await self.generate(ids, self.lengths.pop(tuple(ids)))
        return _Gen(Generation("", "length", len(toks)), toks)


class _Gen:
    def __init__(self, gen, token_ids):
        self.text, self.finish_reason, self.num_tokens, self.token_ids = gen.text, gen.finish_reason, gen.num_tokens, token_ids


class _Episode:
    def __init__(self, spec):
        self.spec, self.ids, self.turn, self.stop_reason = spec, list(spec["prompt"]), 0, None


class Steps:
    """The workload as an episode (`play`) and its tool round (`execute`), for the project's driver."""

    def __init__(self, engine: Forced):
        self.engine = engine

    async def play(self, ep: _Episode, table) -> _Episode:
        while ep.stop_reason is None:
            self.engine.lengths[tuple(ep.ids)] = ep.spec["lengths"][ep.turn]
            gen = await table.engine.generate_one(ep.ids, 256)
            ep.ids = ep.ids + gen.token_ids
            ep.turn += 1
            if ep.turn >= len(ep.spec["lengths"]):
                ep.stop_reason = "answer"
            else:
                await table.tools.submit(ep, ["search"])
                ep.ids = ep.ids + ep.spec["responses"][ep.turn - 1]
        return ep

    def execute(self, batch):
        time.sleep(TOOL_S)   # one retriever round trip for the whole batch
        return [["ok"] for _ in batch]


async def lockstep(engine: Forced, specs, chunk: int) -> None:
    for start in range(0, len(specs), chunk):
        eps = [_Episode(s) for s in specs[start:start + chunk]]
        while eps:
            outs = await asyncio.gather(*(engine.generate(ep.ids, ep.spec["lengths"][ep.turn]) for ep in eps))
            for ep, toks in zip(eps, outs):
                ep.ids += toks
                ep.turn += 1
            eps = [ep for ep in eps if ep.turn < len(ep.spec["lengths"])]
            if eps:
                await asyncio.sleep(TOOL_S)   # the batch's tool round
                for ep in eps:
                    ep.ids += ep.spec["responses"][ep.turn - 1]


async def coroutines(engine: Forced, specs) -> None:
    async def one(spec):
        ep = _Episode(spec)
        while True:
            ep.ids += await engine.generate(ep.ids, spec["lengths"][ep.turn])
            ep.turn += 1
            if ep.turn >= len(spec["lengths"]):
                return
            await asyncio.sleep(TOOL_S)
            ep.ids += spec["responses"][ep.turn - 1]
    await asyncio.gather(*(one(s) for s in specs))


async def project_driver(engine: Forced, specs, cap: int) -> None:
    from evals import scheduler

    steps = Steps(engine)
    tools = ToolBatcher(steps.execute, window_ms=2.0, max_queries=256)
    jobs = [scheduler.Job((lambda s=s: _Episode(s)), steps.play, lambda ep: None, tools) for s in specs]
    await scheduler.run_async(jobs, engine, max_in_flight=cap, max_model_len=MAX_MODEL_LEN)


async def saturated(engine: Forced, turns) -> None:
    await asyncio.gather(*(engine.generate(ids, n) for ids, n in turns))


def _args(argv):
    cfg = {"episodes": "256", "max_in_flight": "auto", "modes": ",".join(MODES), "seed": "0", "repeats": "3"}
    for tok in argv:
        k, v = tok.split("=", 1)
        if k not in cfg:
            raise SystemExit(f"unknown key {k!r}; keys: {sorted(cfg)}")
        cfg[k] = v
    modes = cfg["modes"].split(",")
    if bad := [m for m in modes if m not in MODES]:
        raise SystemExit(f"unknown modes {bad}; modes: {', '.join(MODES)}")
    if int(cfg["repeats"]) < 1:
        raise SystemExit(f"repeats={cfg['repeats']}: expected an integer >= 1")
    return int(cfg["episodes"]), cfg["max_in_flight"], modes, int(cfg["seed"]), int(cfg["repeats"])


def measure(backend, *, episodes: int = 256, modes=MODES, repeats: int = 3, seed: int = 0,
            max_in_flight: int | str = "auto", log=print) -> dict[str, list[float]]:
    """Every mode's generated tokens/s, `repeats` times interleaved, on `backend` (an
    evals.backends.AsyncVLLMBackend; bench/gpu_acceptance.py measures a GPU engine with this)."""
    from evals import scheduler

    specs = workload(episodes, seed)
    n_turns, n_tokens = sum(len(s["lengths"]) for s in specs), sum(sum(s["lengths"]) for s in specs)
    kv_tokens, max_seqs = backend.kv_capacity()
    cap = (scheduler.auto_in_flight(kv_tokens, MAX_MODEL_LEN, max_seqs) if max_in_flight == "auto"
           else int(max_in_flight))
    log(f"workload: {episodes} episodes, {n_turns} turns, {n_tokens} tokens; engine KV {kv_tokens} tokens, "
        f"max_num_seqs {max_seqs}; async max_in_flight {cap}")
    rates: dict[str, list[float]] = {m: [] for m in modes}
    turns = list(_replay(specs))

    async def one(mode: str, r: int) -> None:
        await backend.reset_prefix_cache()
        engine = Forced(backend)
        q0, h0 = backend.prefix_cache.queries, backend.prefix_cache.hits
        t0, c0 = time.perf_counter(), time.process_time()
        if mode == "lockstep64":
            await lockstep(engine, specs, 64)
        elif mode == "lockstep_all":
            await lockstep(engine, specs, len(specs))
        elif mode == "coroutine":
            await coroutines(engine, specs)
        elif mode == "async":
            await project_driver(engine, specs, cap)
        else:
            await saturated(engine, turns)
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        await asyncio.sleep(1.2)   # the stat loggers report once a step; let the last ones land
        q, h = backend.prefix_cache.queries - q0, backend.prefix_cache.hits - h0
        rates[mode].append(engine.tokens / dt)
        log(f"[{r + 1}/{repeats}] {mode:<13} {engine.requests:>5} requests {engine.tokens:>7} tokens {dt:>7.2f} s "
            f"{engine.tokens / dt:>8.1f} tok/s  prefix-cache hit rate {h / q if q else 0.0:.3f}  "
            f"this process's CPU {cpu:.1f} s")

    async def run_all():
        await saturated(Forced(backend), turns[:64])   # warm-up: the engine's first steps are slow
        for r in range(repeats):   # each repeat starts one mode later: no mode always runs first or last
            for k in range(len(modes)):
                await one(modes[(k + r) % len(modes)], r)
    backend.run(run_all())
    return rates


def ratios(med: dict[str, float]) -> list[str]:
    """The summary lines of the medians; the issue's line (`async/lockstep64 ...`) last."""
    lines = []
    if {"coroutine", "lockstep_all", "saturated", "async"} <= set(med):
        lines.append(f"coroutine/lockstep_all {med['coroutine'] / med['lockstep_all']:.2f} "
                     f"async/coroutine {med['async'] / med['coroutine']:.2f} "
                     f"coroutine efficiency {med['coroutine'] / med['saturated']:.2f}")
    if {"async", "lockstep64", "lockstep_all", "saturated"} <= set(med):
        lines.append(f"async/lockstep64 {med['async'] / med['lockstep64']:.2f} "
                     f"async/lockstep_all {med['async'] / med['lockstep_all']:.2f} "
                     f"efficiency {med['async'] / med['saturated']:.2f}")
    return lines


def main(argv=None) -> int:
    episodes, in_flight, modes, seed, repeats = _args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from evals.backends import AsyncVLLMBackend

    root = Path(__file__).resolve().parents[1]
    backend = AsyncVLLMBackend(str(root / "common" / "tiny_base"), max_model_len=MAX_MODEL_LEN, dtype="float32", seed=0)
    try:
        rates = measure(backend, episodes=episodes, modes=modes, repeats=repeats, seed=seed, max_in_flight=in_flight,
                        log=lambda line: print(line, flush=True))
    finally:
        backend.close()
    med = {m: statistics.median(v) for m, v in rates.items()}
    for m in modes:
        print(f"{m:<13} median {med[m]:8.1f} tok/s over {repeats} (" + ", ".join(f"{v:.0f}" for v in rates[m]) + ")")
    for line in ratios(med):
        print(line)
    return 0


def _replay(specs):
    """The saturated mode's requests: every turn's prompt as the episode would send it, generated
    tokens stood in by a constant token (the same lengths, so the same work as the other modes)."""
    for s in specs:
        ids = list(s["prompt"])
        for k, n in enumerate(s["lengths"]):
            yield list(ids), n
            ids += [5] * n + s["responses"][k]


if __name__ == "__main__":
    raise SystemExit(main())
