"""GPU throughput of the sft training step: Qwen3-4B (random init from its real config),
16k packed tokens per micro-batch, flash-attn + FSDP1 bf16, with and without Liger.

    python bench/gpu_train.py                          # 1 GPU
    torchrun --nproc_per_node 8 bench/gpu_train.py     # one 8-GPU node
    python bench/gpu_train.py --model tiny --steps 4   # CPU smoke test of this script

It drives the trainer's own pieces (sft.train.prepare_model / forward_backward,
sft.optim, sft.data.collate) on synthetic packed batches, so the measured step is the
real one minus checkpoint I/O. Sequences of 1k-8k tokens (seeded) are packed
best-fit-decreasing into micro-batches of --tokens, half of each sequence trainable.
Prints, per variant: tokens/s/GPU, MFU (6N + causal attention FLOPs over the device
peak), peak memory, and whether the fused linear cross-entropy ran (logits never
materialized). The first --warmup steps are not timed.
"""
from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omegaconf import OmegaConf  # noqa: E402

from sft import train  # noqa: E402
from sft.config import from_dictconfig  # noqa: E402
from sft.data import StepPlan, collate, pack_best_fit_decreasing  # noqa: E402
from sft.metrics import lookup_peak_tflops, step_flops  # noqa: E402
from sft.model import matmul_params, model_config, select_attn_implementation  # noqa: E402
from sft.optim import build_optimizer  # noqa: E402

# Qwen3-4B(-Thinking-2507) architecture, used when the hub is unreachable.
QWEN3_4B = dict(
    architectures=["Qwen3ForCausalLM"], vocab_size=151936, hidden_size=2560, intermediate_size=9728,
    num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
    max_position_embeddings=262144, rope_theta=5000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
    hidden_act="silu", attention_bias=False, bos_token_id=151643, eos_token_id=151645,
)


def model_dir(name: str, tmp: Path) -> str:
    """A local dir with the model's config.json (hub cache first, then the embedded numbers)."""
    if name == "tiny":
        return "tiny"
    from transformers import AutoConfig, Qwen3Config

    try:
        # local cache only: GPU nodes are often offline, and a hub retry loop would stall the bench
        conf = AutoConfig.from_pretrained("Qwen/Qwen3-4B-Thinking-2507", local_files_only=True)
        src = "the local hub cache"
    except Exception:
        conf, src = Qwen3Config(**QWEN3_4B), "embedded"
    out = tmp / "qwen3_4b"
    conf.save_pretrained(out)
    print(f"Qwen3-4B config from {src}", flush=True)
    return str(out)


def trainer_config(path: str, liger: bool, device: torch.device):
    raw = OmegaConf.load(Path(__file__).resolve().parents[1] / "recipes" / "base.yaml")
    raw.run_dir, raw.data.dir = "unused", "unused"
    raw.model.update(path=path, tokenizer="tiny", init="random", gpu_only=device.type == "cuda",
                     liger="true" if liger else "false")
    return from_dictconfig(raw)


def synthetic_plans(steps: int, micro: int, tokens: int, vocab: int, rank: int, world: int, device) -> list[StepPlan]:
    """`micro` packed micro-batches per rank per step; identical across variants."""
    plans = []
    for s in range(steps):
        rng = np.random.default_rng([s, rank])
        rows, bins = [], []
        while len(bins) < micro:
            lens = rng.integers(min(1024, tokens // 2), min(8192, tokens) + 1, size=64)
            bins = pack_best_fit_decreasing(range(len(lens)), lens, tokens)
        bins = bins[:micro]
        mbs = []
        for b in bins:
            rows = []
            for i in b:
                ids = rng.integers(0, vocab, size=int(lens[i]))
                labels = ids.copy()
                labels[: len(ids) // 2] = -100
                rows.append((ids, labels))
            mbs.append(collate(rows))
        seq_lens = [int(lens[i]) for b in bins for i in b]
        local = torch.tensor([sum(m.num_trainable for m in mbs), sum(seq_lens)], device=device)
        dist.all_reduce(local)
        plans.append(StepPlan(0, [], mbs, n_micro=micro, global_trainable=int(local[0]), global_tokens=int(local[1]), seq_lens=seq_lens))
    return plans


def run_variant(path, liger, plans, args, rank, world, device, attn):
    cfg = trainer_config(path, liger, device)
    conf = model_config(cfg, attn)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model, active = train.prepare_model(cfg, conf, rank=rank, device=device, dtype=dtype)
    opt = build_optimizer(model, lr=1e-5, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    n_matmul, peak = matmul_params(conf), lookup_peak_tflops(device, args.peak_tflops)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    timed_tokens, timed_flops, timed_s = 0, 0.0, 0.0
    for s, plan in enumerate(plans):
        t0 = time.perf_counter()
        loss, _, _, _ = train.forward_backward(model, plan, device=device, world=world, liger_active=bool(active))
        model.clip_grad_norm_(1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dt = time.perf_counter() - t0
        if rank == 0:
            print(f"  step {s + 1}: loss {loss:.4f}, {dt:.2f}s", flush=True)
        if s >= args.warmup:
            timed_tokens += plan.num_tokens
            timed_flops += step_flops(n_matmul, conf, plan.seq_lens)
            timed_s += dt
    tps = timed_tokens / timed_s
    mfu = timed_flops / timed_s / (peak * 1e12) if peak else None
    mem = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
    del model, opt
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"liger": liger, "kernels": active, "tokens_per_s_per_gpu": tps, "mfu": mfu, "peak_mem_gib": mem}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["qwen3_4b", "tiny"], default="qwen3_4b")
    ap.add_argument("--tokens", type=int, default=16384, help="packed tokens per micro-batch")
    ap.add_argument("--micro", type=int, default=2, help="micro-batches per rank per step")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--liger", choices=["both", "on", "off"], default="both")
    ap.add_argument("--peak-tflops", type=float, default=None, help="default: looked up from the GPU name")
    args = ap.parse_args()

    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        import os

        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        device = torch.device("cuda", torch.cuda.current_device())
    rank, world, owns = train.init_distributed(device.type)
    train.setup_logging(rank)
    attn = select_attn_implementation("auto", device)
    # Without Liger first: Liger patches transformers' Qwen3 module globals (RoPE function,
    # RMSNorm and MLP classes) for the whole process, so a later "off" model would not be off.
    variants = {"both": [False, True], "on": [True], "off": [False]}[args.liger]
    if device.type != "cuda" and True in variants:
        print("no CUDA: Liger variant skipped (Triton kernels need a GPU)", flush=True)
        variants = [False]
    with tempfile.TemporaryDirectory() as tmp:
        path = model_dir(args.model, Path(tmp))
        vocab = 4096 if args.model == "tiny" else QWEN3_4B["vocab_size"]
        plans = synthetic_plans(args.steps, args.micro, args.tokens, vocab, rank, world, device)
        results = []
        for liger in variants:
            if rank == 0:
                print(f"== {args.model}, liger={'on' if liger else 'off'}, attn={attn}, world={world}, "
                      f"{args.micro} x {args.tokens} tokens per rank per step", flush=True)
            results.append(run_variant(path, liger, plans, args, rank, world, device, attn))
    if rank == 0:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        print(f"\nresults ({name}, world {world}, attn {attn}):")
        for r in results:
            mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a"
            print(f"  liger={'on ' if r['liger'] else 'off'}  tokens/s/GPU={r['tokens_per_s_per_gpu']:,.0f}  MFU={mfu}  "
                  f"peak mem={r['peak_mem_gib']:.1f} GiB  kernels={','.join(r['kernels']) or '-'}"
                  f"{'  (fused CE ran: logits never materialized)' if r['kernels'] else ''}")
        if len(results) == 2:
            print(f"  Liger speed-up: {results[1]['tokens_per_s_per_gpu'] / results[0]['tokens_per_s_per_gpu']:.2f}x")
    if owns:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
