"""metrics.jsonl, MFU and wandb (mode by common.tracking).

MFU counts the model FLOPs of a training step (forward + backward = 3x forward):
6 * N per token for the matmul parameters, plus causal self-attention, whose
QK^T and AV products cost 2 * 2 * L^2 * d_attn per layer forward for a sequence of
length L, halved by the causal mask: 6 * n_layers * d_attn * L^2 per sequence for
training. Activation-checkpoint recomputation is not counted (it is overhead, not
model FLOPs).
"""
from __future__ import annotations

import json
import logging
import os
import resource
from pathlib import Path

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


class MetricsLog:
    """Append-only metrics.jsonl on rank 0; on resume, rows past the resumed step are dropped
    so the file reads as one uninterrupted run."""

    def __init__(self, path: Path, resume_step: int, rank: int):
        self.path, self.rank = path, rank
        if rank != 0:
            return
        kept = []
        if resume_step > 0 and path.is_file():
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    if json.loads(line).get("step", 0) <= resume_step:
                        kept.append(line)
                except json.JSONDecodeError:
                    log.warning("%s: dropping unreadable line %r", path, line[:80])
        tmp = path.with_name(path.name + ".tmp")  # atomic: a kill here must not lose the kept rows
        tmp.write_text("".join(k + "\n" for k in kept), encoding="utf-8")
        os.replace(tmp, path)

    def write(self, row: dict) -> None:
        if self.rank == 0:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
                f.flush()


class Wandb:
    """Rank 0 only; mode, project, group and tags by `common.tracking` (the wandb user's
    precedence: explicit logging.mode > WANDB_MODE > logged in -> online, else offline);
    resumes the same run id from `<run_dir>/wandb_id`."""

    def __init__(self, *, enabled: bool, rank: int, run_dir: Path, spec, config: dict):
        self.run = None
        if not enabled or rank != 0:
            return
        from common.tracking import init_run

        self.run = init_run(spec, run_dir=run_dir, config=config)
        log.info("wandb: %s (%s), project %s, group %s, run %s%s", spec.mode, spec.why, spec.project, spec.group,
                 spec.name, f" ({self.run.id})" if self.run is not None else "")

    def log(self, row: dict, step: int) -> None:
        if self.run is not None:
            self.run.log({k: v for k, v in row.items() if v is not None and k != "step"}, step=step)

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None


def wandb_spec(cfg):
    """The trainer's wandb run: `<arm>-s<seed>` (or logging.name), tagged arm/seed/model/stage;
    None when logging.wandb is off (nothing about wandb is resolved then)."""
    if not cfg.wandb:
        return None
    from omegaconf import OmegaConf

    from common.tracking import run_spec, run_tags

    raw = cfg.raw
    logging_cfg = OmegaConf.to_container(raw.logging, resolve=True) if "logging" in raw else {}
    logging_cfg["mode"], logging_cfg["project"] = cfg.wandb_mode, cfg.wandb_project
    model = OmegaConf.select(raw, "model.name", default=None) or cfg.model_path
    return run_spec(logging_cfg, name=cfg.wandb_name, runs_root=OmegaConf.select(raw, "runs_root", default=None),
                    tags=run_tags(arm=cfg.arm, seed=cfg.seed, model=str(model), stage="sft"))
