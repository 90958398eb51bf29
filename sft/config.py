"""The trainer's view of the resolved config (structure of recipes/base.yaml).

`load_config` reads `<run_dir>/config.yaml`, applies optional `key=value` overrides and
checks every value the trainer uses *before* any model or GPU work, so a typo fails in
a second with a message naming the key instead of after a 4B model has been loaded.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from common.cli import ConfigError, apply_overrides

from .tiny import resolve_model_path

# Bumped whenever a code change alters what an unchanged config means (e.g. the warmup
# definition): a run dir's state made under another value is not resumed (run identity).
# 2: warmup follows transformers' get_*_schedule_with_warmup (step 1 at lr 0; was one step ahead);
#    a step is global_batch_size trajectories, a record split into several rows being one.
TRAINER_SEMANTICS = 2

ATTN_CHOICES = ("auto", "flash_attention_2", "sdpa", "eager")
PRECISIONS = ("auto", "bf16", "fp32")
SCHEDULES = ("cosine", "linear", "constant")


@dataclass
class TrainConfig:
    """Every setting the training loop reads, flattened from the resolved config."""

    run_dir: Path
    data_dir: Path
    arm: str
    seed: int
    resume: str  # auto | never | PATH of a state dir
    # model
    model_path: str
    tokenizer: str
    init: str
    model_overrides: dict
    gpu_only: bool
    attn_implementation: str
    liger: str  # auto | true | false
    # train
    global_batch_size: int
    max_tokens_per_micro_batch: int
    lr: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    lr_schedule: str
    warmup_ratio: float
    min_lr_ratio: float
    grad_clip: float | None
    steps: int | None
    epochs: int
    save_steps: list[int]
    save_epoch_ends: bool
    state_every: int
    activation_checkpointing: bool
    precision: str
    max_consecutive_nonfinite: int
    peak_tflops: float | None  # None = look up from the device name
    log_every: int
    # logging
    wandb: bool
    wandb_project: str | None  # null -> WANDB_PROJECT, else dtsft (common.tracking)
    wandb_name: str
    wandb_mode: str
    raw: DictConfig = field(repr=False, default=None)


def _get(cfg: DictConfig, key: str):
    node = OmegaConf.select(cfg, key, throw_on_missing=False, default="__absent__")
    if node == "__absent__":
        raise ConfigError(f"{key}: missing from the resolved config")
    return node


def _int(cfg, key, minimum=None, allow_none=False):
    v = _get(cfg, key)
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"{key}: expected an integer, got {v!r}")
    if minimum is not None and v < minimum:
        raise ConfigError(f"{key}: must be >= {minimum}, got {v}")
    return v


def _float(cfg, key, lo=None, hi=None, allow_none=False):
    v = _get(cfg, key)
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
        raise ConfigError(f"{key}: expected a finite number, got {v!r}")
    v = float(v)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise ConfigError(f"{key}: must be in [{lo}, {hi}], got {v}")
    return v


def _bool(cfg, key):
    v = _get(cfg, key)
    if not isinstance(v, bool):
        raise ConfigError(f"{key}: expected true or false, got {v!r}")
    return v


def _choice(cfg, key, choices):
    v = _get(cfg, key)
    v = str(v).lower() if isinstance(v, bool) else v
    if v not in choices:
        raise ConfigError(f"{key}: expected one of {', '.join(map(str, choices))}, got {v!r}")
    return v


def _str(cfg, key):
    v = _get(cfg, key)
    if not isinstance(v, str) or not v:
        raise ConfigError(f"{key}: expected a non-empty string, got {v!r}")
    return v


def load_config(path: str | Path, overrides: list[str] | None = None) -> TrainConfig:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        raw = OmegaConf.load(path)
    except Exception as exc:
        raise ConfigError(f"{path}: not a valid YAML config ({exc})") from exc
    if not isinstance(raw, DictConfig):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    raw = apply_overrides(raw, overrides or [], open_prefixes=("model.config.",))
    return from_dictconfig(raw)


def from_dictconfig(raw: DictConfig) -> TrainConfig:
    """Validate and flatten; every failure names the offending key."""
    run_dir = _get(raw, "run_dir")
    if not run_dir:
        raise ConfigError("run_dir: must be set in the resolved config (launch fills it)")
    data_dir = _get(raw, "data.dir")
    if not data_dir:
        raise ConfigError("data.dir: must be set in the resolved config (launch fills it from the data cache)")
    resume = _get(raw, "resume")
    if resume in (None, False):
        resume = "never"
    resume = str(resume)

    betas = _get(raw, "train.betas")
    if betas is None or len(betas) != 2 or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in betas):
        raise ConfigError(f"train.betas: expected two numbers in [0, 1), got {betas!r}")
    save_steps = _get(raw, "train.save_steps") or []
    if not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in save_steps):
        raise ConfigError(f"train.save_steps: expected a list of positive integers, got {list(save_steps)!r}")
    peak = _get(raw, "train.peak_tflops")
    if peak == "auto" or peak is None:
        peak = None
    else:
        peak = _float(raw, "train.peak_tflops", lo=1e-6)
    grad_clip = _float(raw, "train.grad_clip", lo=0.0, allow_none=True)
    liger = _get(raw, "model.liger")
    liger = {True: "true", False: "false"}.get(liger, liger)
    if liger not in ("auto", "true", "false"):
        raise ConfigError(f"model.liger: expected auto, true or false, got {liger!r}")
    overrides = _get(raw, "model.config") or {}
    arm, seed = _str(raw, "arm"), _int(raw, "seed", minimum=0)
    variant = OmegaConf.select(raw, "name", default=None)
    name = _get(raw, "logging.name") or (f"{arm}-{variant}-s{seed}" if variant else f"{arm}-s{seed}")

    cfg = TrainConfig(
        run_dir=Path(str(run_dir)),
        data_dir=Path(str(data_dir)),
        arm=arm,
        seed=seed,
        resume=resume,
        model_path=resolve_model_path(_str(raw, "model.path")),
        tokenizer=_str(raw, "model.tokenizer"),
        init=_choice(raw, "model.init", ("pretrained", "random")),
        model_overrides=OmegaConf.to_container(overrides, resolve=True) if isinstance(overrides, DictConfig) else dict(overrides),
        gpu_only=_bool(raw, "model.gpu_only"),
        attn_implementation=_choice(raw, "model.attn_implementation", ATTN_CHOICES),
        liger=liger,
        global_batch_size=_int(raw, "train.global_batch_size", minimum=1),
        max_tokens_per_micro_batch=_int(raw, "train.max_tokens_per_micro_batch", minimum=2),
        lr=_float(raw, "train.lr", lo=0.0),
        betas=(float(betas[0]), float(betas[1])),
        eps=_float(raw, "train.eps", lo=0.0),
        weight_decay=_float(raw, "train.weight_decay", lo=0.0),
        lr_schedule=_choice(raw, "train.lr_schedule", SCHEDULES),
        warmup_ratio=_float(raw, "train.warmup_ratio", lo=0.0, hi=1.0),
        min_lr_ratio=_float(raw, "train.min_lr_ratio", lo=0.0, hi=1.0),
        grad_clip=grad_clip if grad_clip else None,
        steps=_int(raw, "train.steps", minimum=1, allow_none=True),
        epochs=_int(raw, "train.epochs", minimum=1),
        save_steps=sorted(set(save_steps)),
        save_epoch_ends=_bool(raw, "train.save_epoch_ends"),
        state_every=_int(raw, "train.state_every", minimum=1),
        activation_checkpointing=_bool(raw, "train.activation_checkpointing"),
        precision=_choice(raw, "train.precision", PRECISIONS),
        max_consecutive_nonfinite=_int(raw, "train.max_consecutive_nonfinite", minimum=1),
        peak_tflops=peak,
        log_every=_int(raw, "train.log_every", minimum=1),
        wandb=_bool(raw, "logging.wandb"),
        wandb_project=_get(raw, "logging.project"),
        wandb_name=str(name),
        wandb_mode=_choice(raw, "logging.mode", ("auto", "online", "offline", "disabled")),
        raw=raw,
    )
    if cfg.resume not in ("auto", "never") and not Path(cfg.resume).is_dir():
        raise ConfigError(f"resume: {cfg.resume!r} is neither auto, never nor an existing state directory")
    return cfg


def schedule_steps(cfg: TrainConfig, n_examples: int) -> tuple[int, int]:
    """(steps per epoch, total optimizer steps): floor(n / global batch) per epoch."""
    per_epoch = n_examples // cfg.global_batch_size
    total = cfg.steps if cfg.steps is not None else cfg.epochs * per_epoch
    return per_epoch, total


def save_points(cfg: TrainConfig, per_epoch: int, total: int) -> list[int]:
    """Steps that get a Hugging Face checkpoint: save_steps, epoch ends, and the final step."""
    pts = {s for s in cfg.save_steps if s <= total} | {total}
    if cfg.save_epoch_ends and per_epoch > 0:
        pts |= set(range(per_epoch, total + 1, per_epoch))
    return sorted(pts)
