"""The trainer's view of the resolved config (the keys of common.schema.SFT).

`load_config` reads `<run_dir>/config.yaml`, applies optional `key=value` overrides and
checks every value the trainer uses *before* any model or GPU work, so a typo fails in
a second with a message naming the key instead of after a 4B model has been loaded.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from omegaconf import DictConfig, OmegaConf

from common import schema
from common.fields import ABSENT, section, select
from common.cli import apply_overrides
from common.plan import save_points as plan_save_points
from common.plan import schedule
# The trainer's keys and what they may be are common.schema's (launch checks with the same rule).
from common.schema import TRAINER_SEMANTICS  # noqa: F401  (sft.train reads it from here)
from common.tiny import resolve_model_path
from sft.errors import SftError


@dataclass
class TrainConfig:
    """What the training loop reads: the recipe's sections under their own names (`cfg.train.lr` is
    `train.lr`: common.schema's fields, read by `common.fields.section`), plus the paths launch filled in."""

    run_dir: Path
    data_dir: Path
    arm: str
    seed: int
    resume: str  # auto | never | PATH of a state dir
    model: SimpleNamespace      # model.path resolved (`tiny-base` -> the committed dir)
    train: SimpleNamespace
    logging: SimpleNamespace    # logging.name filled: <arm>[-<name>]-s<seed> when null
    raw: DictConfig = field(repr=False, default=None)


def _get(cfg: DictConfig, key: str):
    if (node := select(cfg, key)) is ABSENT:
        raise SftError(f"{key}: missing from the resolved config")
    return node


def load_config(path: str | Path, overrides: list[str] | None = None) -> TrainConfig:
    path = Path(path)
    if not path.is_file():
        raise SftError(f"{path}: config file not found")
    try:
        raw = OmegaConf.load(path)
    except Exception as exc:
        raise SftError(f"{path}: not a valid YAML config ({exc})") from exc
    if not isinstance(raw, DictConfig):
        raise SftError(f"{path}: expected a mapping at the top level")
    raw = apply_overrides(raw, overrides or [], open_prefixes=("model.config.",))
    return from_dictconfig(raw)


def from_dictconfig(raw: DictConfig) -> TrainConfig:
    """Validate and flatten; every failure names the offending key."""
    run_dir = _get(raw, "run_dir")
    if not run_dir:
        raise SftError("run_dir: must be set in the resolved config (launch fills it)")
    data_dir = _get(raw, "data.dir")
    if not data_dir:
        raise SftError("data.dir: must be set in the resolved config (launch fills it from the data cache)")
    resume = _get(raw, "resume")
    if resume in (None, False):
        resume = "never"
    resume = str(resume)

    bad = schema.problems(raw)
    if bad:
        raise SftError(bad[0] if len(bad) == 1 else "invalid config:\n  " + "\n  ".join(bad))
    arm, seed, variant = raw.arm, raw.seed, raw.get("name")   # validated above
    model, train, logging = (section(schema.TRAINER, raw, name) for name in ("model", "train", "logging"))
    model.path = resolve_model_path(model.path, random_ok=True)
    logging.name = str(logging.name or (f"{arm}-{variant}-s{seed}" if variant else f"{arm}-s{seed}"))
    cfg = TrainConfig(run_dir=Path(str(run_dir)), data_dir=Path(str(data_dir)), arm=arm, seed=seed, resume=resume,
                      model=model, train=train, logging=logging, raw=raw)
    if cfg.resume not in ("auto", "never") and not Path(cfg.resume).is_dir():
        raise SftError(f"resume: {cfg.resume!r} is neither auto, never nor an existing state directory")
    return cfg


def schedule_steps(cfg: TrainConfig, n_examples: int) -> tuple[int, int]:
    """(steps per epoch, total optimizer steps) for this dataset (common.plan.schedule)."""
    return schedule(steps=cfg.train.steps, epochs=cfg.train.epochs, n_examples=n_examples,
                    global_batch_size=cfg.train.global_batch_size)


def save_points(cfg: TrainConfig, per_epoch: int, total: int) -> list[int]:
    """The checkpoint steps of this run (common.plan.save_points, the one definition)."""
    return plan_save_points(save_steps=cfg.train.save_steps, save_epoch_ends=cfg.train.save_epoch_ends,
                            per_epoch=per_epoch, total=total)
