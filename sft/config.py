"""The trainer's view of the resolved config (structure of recipes/base.yaml).

`load_config` reads `<run_dir>/config.yaml`, applies optional `key=value` overrides and
checks every value the trainer uses *before* any model or GPU work, so a typo fails in
a second with a message naming the key instead of after a 4B model has been loaded.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from common import schema
from common.cli import ConfigError, apply_overrides
from common.plan import save_points as plan_save_points
from common.plan import schedule
# The trainer's keys and what they may be are common.schema's (launch checks with the same rule).
from common.schema import TRAINER_SEMANTICS  # noqa: F401  (sft.train reads it from here)
from common.tiny import resolve_model_path


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

    bad = schema.problems(raw)
    if bad:
        raise ConfigError(bad[0] if len(bad) == 1 else "invalid config:\n  " + "\n  ".join(bad))
    g = lambda key: _get(raw, key)  # noqa: E731  (validated above)
    betas, peak, liger = g("train.betas"), g("train.peak_tflops"), g("model.liger")
    overrides = g("model.config") or {}
    arm, seed = g("arm"), g("seed")
    variant = OmegaConf.select(raw, "name", default=None)
    name = _get(raw, "logging.name") or (f"{arm}-{variant}-s{seed}" if variant else f"{arm}-s{seed}")

    cfg = TrainConfig(
        run_dir=Path(str(run_dir)),
        data_dir=Path(str(data_dir)),
        arm=arm,
        seed=seed,
        resume=resume,
        model_path=resolve_model_path(g("model.path")),
        tokenizer=g("model.tokenizer"),
        init=g("model.init"),
        model_overrides=OmegaConf.to_container(overrides, resolve=True) if isinstance(overrides, DictConfig) else dict(overrides),
        gpu_only=g("model.gpu_only"),
        attn_implementation=g("model.attn_implementation"),
        liger={True: "true", False: "false"}.get(liger, liger),
        global_batch_size=g("train.global_batch_size"),
        max_tokens_per_micro_batch=g("train.max_tokens_per_micro_batch"),
        lr=float(g("train.lr")),
        betas=(float(betas[0]), float(betas[1])),
        eps=float(g("train.eps")),
        weight_decay=float(g("train.weight_decay")),
        lr_schedule=g("train.lr_schedule"),
        warmup_ratio=float(g("train.warmup_ratio")),
        min_lr_ratio=float(g("train.min_lr_ratio")),
        grad_clip=None if g("train.grad_clip") is None else float(g("train.grad_clip")),
        steps=g("train.steps"),
        epochs=g("train.epochs"),
        save_steps=sorted(set(g("train.save_steps"))),
        save_epoch_ends=g("train.save_epoch_ends"),
        state_every=g("train.state_every"),
        activation_checkpointing=g("train.activation_checkpointing"),
        precision=g("train.precision"),
        max_consecutive_nonfinite=g("train.max_consecutive_nonfinite"),
        peak_tflops=None if peak in ("auto", None) else float(peak),
        log_every=g("train.log_every"),
        wandb=g("logging.wandb"),
        wandb_project=g("logging.project"),
        wandb_name=str(name),
        wandb_mode=g("logging.mode"),
        raw=raw,
    )
    if cfg.resume not in ("auto", "never") and not Path(cfg.resume).is_dir():
        raise ConfigError(f"resume: {cfg.resume!r} is neither auto, never nor an existing state directory")
    return cfg


def schedule_steps(cfg: TrainConfig, n_examples: int) -> tuple[int, int]:
    """(steps per epoch, total optimizer steps) for this dataset (common.plan.schedule)."""
    return schedule(steps=cfg.steps, epochs=cfg.epochs, n_examples=n_examples, global_batch_size=cfg.global_batch_size)


def save_points(cfg: TrainConfig, per_epoch: int, total: int) -> list[int]:
    """The checkpoint steps of this run (common.plan.save_points, the one definition)."""
    return plan_save_points(save_steps=cfg.save_steps, save_epoch_ends=cfg.save_epoch_ends, per_epoch=per_epoch, total=total)
