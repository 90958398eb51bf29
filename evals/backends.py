"""Generation backends behind one interface:
`generate(prompt_ids, caps, *, temperature=0.0, seeds=None) -> [Generation]`.

Prompts arrive already rendered by the chat template and tokenized (the agent loop needs the
token count anyway, for the context limit), each with its own cap on new tokens. Decoding is
greedy by default so an evaluation is deterministic. With `temperature > 0` each request samples
from softmax(logits / temperature) with its own seed (`seeds`, one int per request): a request's
random stream depends only on its seed, never on which other requests share its batch, their
order or the micro-batch size. Generation stops at end-of-turn (`<|im_end|>` for
Qwen3, `<|eot_id|>`/`<|eom_id|>` for Llama-3.1, the tokenizer's eos); the stop token is not part
of the returned text.

    hf    transformers `generate`, left-padded micro-batches (sorted by length to waste less on
          padding); runs on CPU.
    vllm  `LLM.generate` with per-prompt SamplingParams, `max_model_len` and tensor parallelism;
          in its own environment (`make venv-vllm`: vLLM's CPU build on a CPU host, the [serve]
          extra on a CUDA one), imported only when selected. The engine is a separate process
          that vLLM spawns: build it only under `if __name__ == "__main__":` or from a console
          entry point (`evaluate`), never at import time. If this process dies without shutting
          the engine down (SIGKILL, the OOM killer), a watcher stops its processes (evals.reaper).
    vllm, driver=async   `AsyncVLLMBackend`: vLLM's AsyncLLM, one request at a time
          (`await generate_one(ids, cap, temperature=, seed=)`, the same SamplingParams), for the
          asynchronous driver (evals.scheduler); it counts vLLM's prefix-cache hits.

Host defaults (`engine_settings`, recorded resolved in the evaluation identity):
    dtype=auto      hf: bf16 on CUDA, fp32 on CPU. vllm: on CPU the checkpoint's own dtype (vLLM-CPU
                    itself would run an fp32 checkpoint in bf16); on CUDA bf16 for an fp32 checkpoint.
    enforce_eager   vllm, auto: true on CPU (no compiled graphs), false on CUDA (CUDA graphs).
    prefix_caching  vllm: true (reuses the KV of shared prompt prefixes; changes rounding, not results' meaning).
    gpu_memory_utilization=auto   CUDA: 0.9 of the GPU. CPU: vLLM reads it as the fraction of *host RAM*
                    to reserve and refuses to start when that much is not free, so instead the KV cache
                    is sized explicitly: VLLM_CPU_KVCACHE_SPACE GiB (default 1), which starts beside a
                    trainer on a 24 GB box.
    On CPU the engine runs in the calling process (VLLM_ENABLE_V1_MULTIPROCESSING=0 unless set).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from common.cli import ConfigError
from evals.engine import Engine
from evals.toolcalls import END_OF_TURN_TOKENS


class BackendError(RuntimeError):
    """The model or its backend can't be loaded (missing dir, no vLLM, no chat template)."""


@dataclass
class Generation:
    text: str
    finish_reason: str  # "stop" (end-of-turn) | "length" (hit its cap)
    num_tokens: int


def load_tokenizer(tokenizer: str | None, ckpt: str | None = None):
    """The tokenizer `tokenizer=` names (checked as every stage checks one: common.hub.tokenizer_source's), else the
    checkpoint's own; a hub id at the commit the process loads it at (common.hub.hub_revision: the model's, with
    it), while the hub cannot answer its cached copy, or one line at once."""
    from transformers import AutoTokenizer

    from common.hub import source
    from common.tiny import checked_tokenizer
    from evals.errors import EvalError

    where = checked_tokenizer(str(tokenizer), "tokenizer", EvalError) if tokenizer else str(ckpt)
    src = source(where, "tokenizer" if tokenizer else "ckpt", EvalError, "tokenizer_config.json")
    path = tokenizer or ckpt
    tok = AutoTokenizer.from_pretrained(where, trust_remote_code=False, **src)
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    if not tok.chat_template:
        raise BackendError(f"tokenizer {path} has no chat template; the agent loop renders tools through it")
    return tok


def stop_token_ids(tok, generation_config=None) -> list[int]:
    ids: set[int] = set()
    vocab = tok.get_vocab()
    for t in END_OF_TURN_TOKENS:
        if t in vocab:
            ids.add(vocab[t])
    if tok.eos_token_id is not None:
        ids.add(tok.eos_token_id)
    eos = getattr(generation_config, "eos_token_id", None) if generation_config is not None else None
    if eos is not None:
        ids.update([eos] if isinstance(eos, int) else eos)
    return sorted(ids)


DTYPES = ("float32", "bfloat16", "float16")
CPU_KV_CACHE_GIB = 1  # VLLM_CPU_KVCACHE_SPACE when unset


def on_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def checkpoint_dtype(ckpt: str) -> str | None:
    """The dtype a local checkpoint's config.json declares (`dtype`, or v4's `torch_dtype`); None when unknown."""
    cfg = Path(ckpt) / "config.json"
    if not cfg.is_file():
        return None
    try:
        conf = json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    d = conf.get("dtype") or conf.get("torch_dtype")
    return d if d in DTYPES else None


def engine_settings(conf) -> dict:
    """The engine settings that change results, resolved for this host without loading a model:
    `dtype` for both backends; for vllm also `enforce_eager` and `prefix_caching`."""
    backend, dtype, cuda = conf.get("backend", "hf"), conf.get("dtype", "auto"), on_cuda()
    device = conf.get("device", "auto")
    if dtype == "auto":
        if backend == "hf":
            gpu = device.startswith("cuda") if device != "auto" else cuda
            dtype = "bfloat16" if gpu else "float32"
        else:
            ck = checkpoint_dtype(str(conf.get("ckpt")))
            if cuda:
                dtype = ck if ck in ("bfloat16", "float16") else "bfloat16"
            else:
                dtype = ck or "float32"
    if dtype not in DTYPES:
        raise BackendError(f"dtype={dtype!r}: expected auto, {', '.join(DTYPES)}")
    out = {"dtype": dtype}
    if backend == "vllm":
        eager = conf.get("enforce_eager", "auto")
        out["enforce_eager"] = (not cuda) if eager == "auto" else bool(eager)
        out["prefix_caching"] = bool(conf.get("prefix_caching", True))
    return out


def cpu_kv_cache_bytes() -> int:
    """The KV cache a CPU engine gets: VLLM_CPU_KVCACHE_SPACE GiB, CPU_KV_CACHE_GIB when unset."""
    raw = os.environ.get("VLLM_CPU_KVCACHE_SPACE") or str(CPU_KV_CACHE_GIB)
    try:
        gib = float(raw)
    except ValueError:
        raise BackendError(f"VLLM_CPU_KVCACHE_SPACE={raw!r}: expected a number of GiB") from None
    if gib <= 0:
        raise BackendError(f"VLLM_CPU_KVCACHE_SPACE={raw!r}: expected a positive number of GiB")
    return int(gib * (1 << 30))


def check_sampling(n: int, temperature: float, seeds) -> list[int] | None:
    """The per-request sampling arguments, checked: None for greedy, else one seed per request."""
    if temperature < 0:
        raise BackendError(f"temperature={temperature}: expected 0 (greedy) or a positive number")
    if temperature == 0:
        return None
    if seeds is None:
        raise BackendError(f"temperature={temperature} needs seeds (one int per request): a request's random stream is its own seed's")
    seeds = [int(s) for s in seeds]
    if len(seeds) != n:
        raise BackendError(f"{n} prompts but {len(seeds)} seeds: sampling takes one seed per request")
    return seeds


class _RowSampler:
    """A transformers logits processor that draws each row's next token with that row's own
    torch.Generator and leaves only it finite, so greedy decoding inside `generate` picks it (the
    cache, padding and stopping stay transformers'). Each row draws once per step from its own
    stream, so what it samples does not depend on the other rows."""

    def __init__(self, seeds: list[int], temperature: float, device):
        import torch

        self.temperature = float(temperature)
        self.gens = [torch.Generator(device=device).manual_seed(s) for s in seeds]

    def __call__(self, input_ids, scores):
        import torch

        probs = torch.softmax(scores.float() / self.temperature, dim=-1)
        picked = torch.full_like(scores, float("-inf"))
        for row, gen in enumerate(self.gens):
            tok = torch.multinomial(probs[row], 1, generator=gen)
            picked[row, tok] = 0.0
        return picked


class HFBackend:
    name = "hf"
    logits = True   # its model's logits are at hand: the teacher-forced benches score with them

    def __init__(self, model_path: str, tokenizer_path: str | None = None, *, micro_batch: int = 16,
                 device: str = "auto", dtype: str = "auto", seed: int = 0):
        import torch
        from transformers import AutoModelForCausalLM

        from common.hub import source
        from evals.errors import EvalError

        self.tokenizer = load_tokenizer(tokenizer_path, model_path)
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = engine_settings({"backend": "hf", "dtype": dtype, "device": device})["dtype"]
        torch.manual_seed(seed)
        self.device = torch.device(device)
        src = source(model_path, "ckpt", EvalError)   # (transformers' adapter lookup is told apart; it takes the revision)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype), trust_remote_code=False, **src,
                                                          adapter_kwargs={"local_files_only": src["local_files_only"]}).to(self.device).eval()
        self.micro_batch = max(1, int(micro_batch))
        self.stop_ids = stop_token_ids(self.tokenizer, self.model.generation_config)
        self.pad_id = self.tokenizer.pad_token_id

    def encode(self, text: str) -> list[int]:
        # The chat template already wrote every special token (BOS included for Llama).
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def close(self) -> None:
        """Nothing to shut down: the model lives in this process."""

    def _finish(self, ids: list[int], cap: int) -> Generation:
        for pos, t in enumerate(ids[:cap]):
            if t in self.stop_ids:
                return Generation(self.tokenizer.decode(ids[:pos], skip_special_tokens=False), "stop", pos + 1)
        ids = ids[:cap]
        return Generation(self.tokenizer.decode(ids, skip_special_tokens=False), "length", len(ids))

    def generate(self, prompt_ids: list[list[int]], caps: list[int], *, temperature: float = 0.0,
                 seeds: list[int] | None = None) -> list[Generation]:
        import torch
        from transformers import LogitsProcessorList

        seeds = check_sampling(len(prompt_ids), temperature, seeds)
        order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
        out: list[Generation | None] = [None] * len(prompt_ids)
        for start in range(0, len(order), self.micro_batch):
            chunk = order[start:start + self.micro_batch]
            width = max(len(prompt_ids[i]) for i in chunk)
            ids = torch.full((len(chunk), width), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, i in enumerate(chunk):
                p = prompt_ids[i]
                ids[row, width - len(p):] = torch.tensor(p, dtype=torch.long)
                mask[row, width - len(p):] = 1
            extra = {}
            if seeds is not None:
                extra["logits_processor"] = LogitsProcessorList([_RowSampler([seeds[i] for i in chunk], temperature, self.device)])
            with torch.inference_mode():
                gen = self.model.generate(
                    input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                    max_new_tokens=max(caps[i] for i in chunk), do_sample=False,
                    eos_token_id=self.stop_ids, pad_token_id=self.pad_id, **extra,
                )
            for row, i in enumerate(chunk):
                out[i] = self._finish(gen[row, width:].tolist(), caps[i])
        return out  # type: ignore[return-value]


class VLLMBackend:
    """vLLM's offline `LLM`: one batched `generate` (the lockstep adapter's backend, evals.engine.Lockstep)."""

    name = "vllm"
    logits = False

    def __init__(self, model_path: str, tokenizer_path: str | None = None, *, max_model_len: int,
                 tensor_parallel_size: int = 1, gpu_memory_utilization: float | str = "auto",
                 dtype: str = "auto", seed: int = 0, enforce_eager: bool | str = "auto", prefix_caching: bool = True):
        from evals import reaper

        try:
            engine_class = self._engine_class()
        except ImportError as exc:
            raise BackendError(
                "backend=vllm needs vLLM: its own environment (`make venv-vllm`, then .venv-vllm/bin/evaluate); "
                "use backend=hf otherwise"
            ) from exc
        self.tokenizer = load_tokenizer(tokenizer_path, model_path)
        self.seed = seed
        self.max_model_len = int(max_model_len)
        self.settings = engine_settings({"backend": "vllm", "dtype": dtype, "ckpt": model_path,
                                         "enforce_eager": enforce_eager, "prefix_caching": prefix_caching})
        self.stop_ids = stop_token_ids(self.tokenizer)
        vocab = self.tokenizer.get_vocab()
        # Stop strings as well as ids: a stop id only works when the marker is generated as its
        # single added token; the string also catches it spelled out in ordinary tokens.
        self.stop_strings = [t for t in END_OF_TURN_TOKENS if t in vocab]
        # Started before the engine: its processes are stopped if this one dies without shutting them
        # down (SIGKILL, the OOM killer; evals.reaper), from the moment the engine starts loading.
        self._guard = reaper.guard()
        self._start(engine_class, self.engine_kwargs(model_path, tokenizer_path, max_model_len, tensor_parallel_size,
                                                     gpu_memory_utilization))

    @staticmethod
    def _engine_class():
        from vllm import LLM

        return LLM

    def _start(self, engine_class, kwargs: dict) -> None:
        self.llm = engine_class(**kwargs)

    def engine_kwargs(self, model_path, tokenizer_path, max_model_len, tensor_parallel_size, gpu_memory_utilization) -> dict:
        """The engine arguments (LLM's and AsyncEngineArgs' alike) for this host; a hub id's at the commit this process
        loads it at (common.hub.hub_revision: the evaluation identity's), its tokenizer's alike."""
        from common.hub import hub_revision
        from common.tiny import resolve_tokenizer

        if not on_cuda():
            # In-process engine on CPU: vLLM's default spawns an engine and a worker process, each
            # re-importing vLLM (~30 s apiece on a busy 2-core box); VLLM_ENABLE_V1_MULTIPROCESSING=1 restores it.
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        memory = {}
        if on_cuda():
            memory["gpu_memory_utilization"] = 0.9 if gpu_memory_utilization == "auto" else float(gpu_memory_utilization)
        elif gpu_memory_utilization == "auto":
            memory["kv_cache_memory_bytes"] = cpu_kv_cache_bytes()  # bypasses vLLM-CPU's host-RAM fraction check
        else:
            memory["gpu_memory_utilization"] = float(gpu_memory_utilization)
        tokenizer = resolve_tokenizer(tokenizer_path or model_path)
        return dict(
            model=model_path, tokenizer=tokenizer, revision=hub_revision(str(model_path)),
            tokenizer_revision=hub_revision(tokenizer, "tokenizer_config.json"), max_model_len=max_model_len,
            tensor_parallel_size=tensor_parallel_size, dtype=self.settings["dtype"], seed=self.seed,
            enforce_eager=self.settings["enforce_eager"], enable_prefix_caching=self.settings["prefix_caching"],
            trust_remote_code=False, **memory,
        )

    def sampling_params(self, cap: int, temperature: float, seed: int | None, **extra):
        """One request's SamplingParams (greedy: the engine seed, which greedy decoding never reads)."""
        from vllm import SamplingParams

        return SamplingParams(temperature=float(temperature), max_tokens=cap, stop=self.stop_strings,
                              stop_token_ids=self.stop_ids, skip_special_tokens=False,
                              seed=self.seed if seed is None else int(seed), **extra)

    @staticmethod
    def to_generation(o) -> Generation:
        text = o.text
        for t in END_OF_TURN_TOKENS:  # vLLM omits stop tokens from text; be sure
            if text.endswith(t):
                text = text[: -len(t)]
        return Generation(text, "stop" if o.finish_reason == "stop" else "length", len(o.token_ids))

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def generate(self, prompt_ids: list[list[int]], caps: list[int], *, temperature: float = 0.0,
                 seeds: list[int] | None = None) -> list[Generation]:
        seeds = check_sampling(len(prompt_ids), temperature, seeds)
        params = [self.sampling_params(cap, temperature, None if seeds is None else seeds[i]) for i, cap in enumerate(caps)]
        prompts = [{"prompt_token_ids": ids} for ids in prompt_ids]
        results = self.llm.generate(prompts, params, use_tqdm=False)
        return [self.to_generation(res.outputs[0]) for res in results]

    def close(self) -> None:
        """Shut the engine process down now (a normal exit, not "engine core exited unexpectedly")."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
        self._stop_guard()

    def _stop_guard(self) -> None:
        guard, self._guard = getattr(self, "_guard", None), None
        if guard is not None:
            guard.stop()


class PrefixCacheCounter:
    """Adds up vLLM's prefix-cache statistics (prompt tokens looked up, tokens found cached) over
    an engine's life: `hit_rate` = hits / queries."""

    def __init__(self):
        self.queries = self.hits = self.requests = 0

    def factory(self):
        from vllm.v1.metrics.loggers import StatLoggerBase

        counter = self

        class _Logger(StatLoggerBase):
            def __init__(self, vllm_config, engine_index: int = 0):
                pass

            def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
                stats = getattr(scheduler_stats, "prefix_cache_stats", None)
                if stats is not None:
                    counter.queries += int(stats.queries)
                    counter.hits += int(stats.hits)
                    counter.requests += int(stats.requests)

            def log_engine_initialized(self):
                pass
        return _Logger

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


class AsyncVLLMBackend(VLLMBackend, Engine):
    """vLLM's AsyncLLM for the asynchronous driver (evals.scheduler): `await generate_one(ids, cap,
    temperature=, seed=)` per request, token-id prompts, each request's SamplingParams exactly as
    VLLMBackend.generate builds them (the same greedy seed, the same per-request sampling seeds).
    The engine keeps one event loop of its own (`run(coro)`): AsyncLLM's output handler is bound
    to the loop of its first request. `prefix_cache` counts vLLM's prefix-cache hits."""

    @staticmethod
    def _engine_class():
        from vllm.v1.engine.async_llm import AsyncLLM

        return AsyncLLM

    def _start(self, engine_class, kwargs: dict) -> None:
        import asyncio

        from vllm.engine.arg_utils import AsyncEngineArgs

        self.prefix_cache = PrefixCacheCounter()
        self.loop = asyncio.new_event_loop()
        self.llm = engine_class.from_engine_args(AsyncEngineArgs(**kwargs, disable_log_stats=False),
                                                 stat_loggers=[self.prefix_cache.factory()])
        self._next_id = 0

    def run(self, coro):
        """Run `coro` to completion on the engine's own event loop."""
        return self.loop.run_until_complete(coro)

    def kv_capacity(self) -> tuple[int, int] | None:
        """(tokens the KV cache holds, sequences the scheduler runs at once)."""
        conf = self.llm.vllm_config
        blocks = int(conf.cache_config.num_gpu_blocks or 0)
        return blocks * int(conf.cache_config.block_size), int(conf.scheduler_config.max_num_seqs)

    async def generate_one(self, ids: list[int], cap: int, *, temperature: float = 0.0, seed: int | None = None,
                           **extra) -> Generation:
        if temperature < 0:
            raise BackendError(f"temperature={temperature}: expected 0 (greedy) or a positive number")
        if temperature > 0 and seed is None:
            raise BackendError(f"temperature={temperature} needs a seed: a request's random stream is its own seed's")
        from vllm.sampling_params import RequestOutputKind

        # the final output only (as LLM.generate does): no per-token wake-up of this coroutine
        params = self.sampling_params(cap, temperature, seed if temperature > 0 else None,
                                      output_kind=RequestOutputKind.FINAL_ONLY, **extra)
        self._next_id += 1
        final = None
        async for out in self.llm.generate({"prompt_token_ids": list(ids)}, params, f"dtsft-{self._next_id}"):
            final = out
        return self.to_generation(final.outputs[0])

    async def reset_prefix_cache(self) -> None:
        await self.llm.reset_prefix_cache()

    def generate(self, prompt_ids, caps, *, temperature: float = 0.0, seeds=None) -> list[Generation]:
        """A batch at once (the lockstep driver over the async engine): every request submitted together."""
        import asyncio

        seeds = check_sampling(len(prompt_ids), temperature, seeds)

        async def batch():
            return await asyncio.gather(*(self.generate_one(ids, cap, temperature=temperature,
                                                            seed=None if seeds is None else seeds[i])
                                          for i, (ids, cap) in enumerate(zip(prompt_ids, caps))))
        return list(self.run(batch()))

    def close(self) -> None:
        """Stop the engine's output handler on its loop, shut the engine core down, close the loop."""
        import asyncio

        llm, self.llm = getattr(self, "llm", None), None
        loop = getattr(self, "loop", None)
        if loop is not None and not loop.is_closed():
            tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for t in tasks:
                t.cancel()
            if tasks:
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_default_executor())   # the tool batches' threads
        if llm is not None:
            llm.shutdown()
        self._stop_guard()
        if loop is not None and not loop.is_closed():
            loop.close()


def make_backend(cfg, *, asynchronous: bool = False):
    """The configured backend; `asynchronous`: vLLM's AsyncLLM (AsyncVLLMBackend) for the async driver."""
    model = cfg.ckpt
    tok = cfg.get("tokenizer") or None
    if cfg.backend not in ("hf", "vllm"):
        raise BackendError(f"unknown backend {cfg.backend!r}; expected hf or vllm")
    try:
        if cfg.backend == "hf":
            return HFBackend(model, tok, micro_batch=cfg.micro_batch, device=cfg.device, dtype=cfg.dtype, seed=cfg.seed)
        cls = AsyncVLLMBackend if asynchronous else VLLMBackend
        return cls(model, tok, max_model_len=cfg.max_model_len, tensor_parallel_size=cfg.tensor_parallel_size,
                           gpu_memory_utilization=cfg.gpu_memory_utilization, dtype=cfg.dtype, seed=cfg.seed,
                           enforce_eager=cfg.enforce_eager, prefix_caching=cfg.prefix_caching)
    except ConfigError:   # a name refused, the hub unreachable (common.hub): its own line
        raise
    except (OSError, ValueError) as exc:  # transformers' "not a model dir / no such repo" errors (some of several lines)
        given = f" and tokenizer {tok!r}" if tok else ""
        raise BackendError(f"cannot load model {model!r}{given} with backend={cfg.backend}: {' '.join(str(exc).split())}") from exc
