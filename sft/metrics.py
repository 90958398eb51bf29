"""MFU and the SFT trainer's wandb run spec (metrics.jsonl and the wandb run: common.tracking).

MFU counts the model FLOPs of a training step (forward + backward = 3x forward):
6 * N per token for the matmul parameters, plus causal self-attention, whose
QK^T and AV products cost 2 * 2 * L^2 * d_attn per layer forward for a sequence of
length L, halved by the causal mask: 6 * n_layers * d_attn * L^2 per sequence for
training. Activation-checkpoint recomputation is not counted (it is overhead, not
model FLOPs).
"""
from __future__ import annotations

import logging
import resource

import torch

log = logging.getLogger("sft.metrics")

# Dense bf16 tensor-core peak, TFLOP/s, matched against torch.cuda.get_device_name().
PEAK_TFLOPS = (
    ("H200", 989.0), ("H100", 989.0), ("H800", 989.0), ("GH200", 989.0),
    ("B200", 2250.0), ("A100", 312.0), ("A800", 312.0), ("L40S", 362.0),
    ("A10G", 125.0), ("A6000", 155.0), ("4090", 165.0), ("V100", 125.0),
)


def lookup_peak_tflops(device: torch.device, configured: float | None) -> float | None:
    """Configured value, else the GPU-name table; None on CPU or an unknown GPU (MFU null)."""
    if configured is not None:
        return configured
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, tf in PEAK_TFLOPS:
        if key in name:
            return tf
    log.warning("no peak TFLOP/s known for %r: MFU will be null (set train.peak_tflops)", name)
    return None


def attention_dims(conf) -> tuple[int, int]:
    head_dim = getattr(conf, "head_dim", None) or conf.hidden_size // conf.num_attention_heads
    return conf.num_hidden_layers, conf.num_attention_heads * head_dim


def step_flops(n_matmul_params: int, conf, seq_lens: list[int]) -> float:
    layers, d_attn = attention_dims(conf)
    tokens = sum(seq_lens)
    return 6.0 * n_matmul_params * tokens + 6.0 * layers * d_attn * sum(L * L for L in seq_lens)


def peak_memory_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB (Linux)


def wandb_spec(cfg):
    """The trainer's wandb run: `<arm>-s<seed>` (or logging.name), tagged arm/seed/model/stage;
    None when logging.wandb is off (nothing about wandb is resolved then)."""
    if not cfg.logging.wandb:
        return None
    from omegaconf import OmegaConf

    from common.tracking import run_spec, run_tags

    model = cfg.model.name or cfg.model.path
    return run_spec(cfg.logging, name=cfg.logging.name, runs_root=OmegaConf.select(cfg.raw, "runs_root", default=None),
                    tags=run_tags(arm=cfg.arm, seed=cfg.seed, model=str(model), stage="sft"))
