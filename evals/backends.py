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
          an optional extra (`pip install -e .[serve]`, in its own environment), imported only when selected.
"""
from __future__ import annotations

from dataclasses import dataclass

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
        if dtype == "auto":
            dtype = "bfloat16" if device.startswith("cuda") else "float32"
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
                 tensor_parallel_size: int = 1, gpu_memory_utilization: float = 0.9,
                 dtype: str = "auto", seed: int = 0):
        try:
            from vllm import LLM
        except ImportError as exc:
            raise BackendError(
                "backend=vllm needs vLLM (pip install -e '.[serve]', in its own environment); use backend=hf otherwise"
            ) from exc
        self.tokenizer = load_tokenizer(tokenizer_path or model_path)
        self.seed = seed
        self.llm = LLM(
            model=model_path, tokenizer=tokenizer_path or model_path, max_model_len=max_model_len,
            tensor_parallel_size=tensor_parallel_size, gpu_memory_utilization=gpu_memory_utilization,
            dtype=dtype, seed=seed, enable_prefix_caching=True, trust_remote_code=False,
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


def make_backend(cfg):
    model = cfg.ckpt
    tok = cfg.get("tokenizer") or None
    if cfg.backend not in ("hf", "vllm"):
        raise BackendError(f"unknown backend {cfg.backend!r}; expected hf or vllm")
    try:
        if cfg.backend == "hf":
            return HFBackend(model, tok, micro_batch=cfg.micro_batch, device=cfg.device, dtype=cfg.dtype, seed=cfg.seed)
        return VLLMBackend(model, tok, max_model_len=cfg.max_model_len, tensor_parallel_size=cfg.tensor_parallel_size,
                           gpu_memory_utilization=cfg.gpu_memory_utilization, dtype=cfg.dtype, seed=cfg.seed)
    except (OSError, ValueError) as exc:  # transformers' "not a model dir / no such repo" errors
        raise BackendError(f"cannot load model {model!r} with backend={cfg.backend}: {exc}") from exc
