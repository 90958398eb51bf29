"""The trainer's config keys (recipes/base.yaml's `model:`, `train:` and `logging:` sections plus the
top-level `arm` / `seed`), validated in one place: `launch` checks a composed config with
`problems(cfg)` and `sft` reads its config.yaml through the same function, so the two can never
disagree on what a value may be. The data keys are data_prep's (`data_prep.config.problems`).

Each rule says what a value may be; `check(key, value)` answers one value, `problems(cfg)` every key
of a config (one line per bad key, naming it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# Bumped whenever a code change alters what an unchanged config means (e.g. the warmup
# definition): a run dir's state made under another value is not resumed (run identity).
# 2: warmup follows transformers' get_*_schedule_with_warmup (step 1 at lr 0; was one step ahead);
#    a step is global_batch_size trajectories, a record split into several rows being one.
TRAINER_SEMANTICS = 2

ATTN_CHOICES = ("auto", "flash_attention_2", "sdpa", "eager")
PRECISIONS = ("auto", "bf16", "fp32")
SCHEDULES = ("cosine", "linear", "constant")
INITS = ("pretrained", "random")
LIGER_CHOICES = ("auto", "true", "false")   # YAML true/false count as "true"/"false"
WANDB_MODES = ("auto", "online", "offline", "disabled")


@dataclass(frozen=True)
class Number:
    """A number in [lo, hi] (an open end when `lo_open` / `hi_open`); `integer` for counts; `null`
    and `words` (e.g. "auto") are accepted as they are."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    integer: bool = False
    null: bool = False
    words: tuple[str, ...] = ()

    def describe(self) -> str:
        alts = [*self.words, *(["null"] if self.null else [])]
        tail = f" (or {', '.join(alts)})" if alts else ""
        if self.hi is None and self.lo == 0 and self.lo_open:
            return f"a positive number{tail}"
        if self.hi is None and self.integer and self.lo in (0, 1) and not self.lo_open:
            return f"a {'positive' if self.lo == 1 else 'non-negative'} integer{tail}"
        if self.hi is not None and self.lo is not None:
            return f"in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}{')' if self.hi_open else ']'}{tail}"
        kind = "an integer" if self.integer else "a number"
        lo = "" if self.lo is None else f" {'>' if self.lo_open else '>='} {self.lo:g}"
        return f"{kind}{lo}{tail}"

    def ok(self, v: Any) -> bool:
        if v is None:
            return self.null
        if isinstance(v, str):
            return v in self.words
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return False
        if self.integer and not isinstance(v, int):
            return False
        if not math.isfinite(float(v)):
            return False
        if self.lo is not None and (v <= self.lo if self.lo_open else v < self.lo):
            return False
        if self.hi is not None and (v >= self.hi if self.hi_open else v > self.hi):
            return False
        return True


def _count(lo: int = 1, null: bool = False) -> Number:
    return Number(lo=lo, integer=True, null=null)


# Every numeric trainer key and what it may be.
NUMBERS: dict[str, Number] = {
    "seed": _count(0),
    "train.global_batch_size": _count(1),
    "train.max_tokens_per_micro_batch": _count(2),   # a shifted label needs 2 tokens
    "train.lr": Number(lo=0, lo_open=True),
    "train.eps": Number(lo=0, lo_open=True),
    "train.weight_decay": Number(lo=0),
    "train.warmup_ratio": Number(lo=0, hi=1, hi_open=True),
    "train.min_lr_ratio": Number(lo=0, hi=1),
    "train.grad_clip": Number(lo=0, lo_open=True, null=True),   # null: no clipping
    "train.steps": _count(1, null=True),                        # null: epochs x steps per epoch
    "train.epochs": _count(1),
    "train.state_every": _count(1),
    "train.max_consecutive_nonfinite": _count(1),
    "train.log_every": _count(1),
    "train.peak_tflops": Number(lo=0, lo_open=True, null=True, words=("auto",)),
}
BETA = Number(lo=0, hi=1, hi_open=True)
CHOICES: dict[str, tuple] = {
    "model.init": INITS,
    "model.attn_implementation": ATTN_CHOICES,
    "model.liger": LIGER_CHOICES,
    "train.lr_schedule": SCHEDULES,
    "train.precision": PRECISIONS,
    "logging.mode": WANDB_MODES,
}
BOOLS = ("model.gpu_only", "train.save_epoch_ends", "train.activation_checkpointing", "logging.wandb")
STRINGS = ("arm", "model.path", "model.tokenizer")                                  # non-empty
OPTIONAL_STRINGS = ("logging.project", "logging.entity", "logging.group", "logging.name")   # null or a string
ABSENT = object()


def check(key: str, v: Any) -> str | None:
    """Why `v` cannot be the value of trainer key `key` (one line naming it), or None when it can."""
    if key == "model.license":   # issue 64; a config written before it has none (no licence stated)
        ok = v is ABSENT or v is None or (isinstance(v, str) and v.strip() != "")
        return None if ok else f"model.license must be null or a licence id (e.g. apache-2.0), got {v!r}"
    if v is ABSENT:
        return f"{key}: missing from the config"
    if key in NUMBERS:
        rule = NUMBERS[key]
        return None if rule.ok(v) else f"{key} must be {rule.describe()}, got {v!r}"
    if key in CHOICES:
        allowed = CHOICES[key]
        if key == "model.liger" and isinstance(v, bool):
            v = str(v).lower()
        ok = not isinstance(v, bool) and v in allowed
        return None if ok else f"{key} must be one of {', '.join(allowed)}, got {v!r}"
    if key in BOOLS:
        return None if isinstance(v, bool) else f"{key} must be true or false, got {v!r}"
    if key in STRINGS:
        return None if isinstance(v, str) and v else f"{key} must be a non-empty string, got {v!r}"
    if key in OPTIONAL_STRINGS:
        return None if v is None or isinstance(v, str) else f"{key} must be null or a string, got {v!r}"
    if key == "train.betas":
        ok = v is not None and not isinstance(v, (str, int, float)) and len(v) == 2 and all(BETA.ok(b) for b in v)
        return None if ok else f"train.betas must be two numbers in [0, 1), got {v!r}"
    if key == "train.save_steps":
        ok = v is not None and not isinstance(v, (str, int, float)) and all(NUMBERS["train.epochs"].ok(s) for s in v)
        return None if ok else f"train.save_steps must be a list of positive integers, e.g. [50,100], got {v!r}"
    if key == "logging.tags":
        ok = v is not None and not isinstance(v, str) and all(isinstance(t, (str, int)) for t in v)
        return None if ok else f"logging.tags must be a list of strings, e.g. [ablation,lr-sweep], got {v!r}"
    raise KeyError(f"{key} is not a trainer key of common.schema")


KEYS = (*STRINGS, *NUMBERS, *CHOICES, *BOOLS, *OPTIONAL_STRINGS, "model.license", "train.betas", "train.save_steps", "logging.tags")


def _select(cfg, key: str):
    node = cfg
    for part in key.split("."):
        try:
            node = node[part]
        except (KeyError, TypeError, IndexError):
            return ABSENT
    return node


def problems(cfg) -> list[str]:
    """Every trainer key of `cfg` (a dict or an omegaconf config) that is missing or invalid."""
    out = []
    for key in KEYS:
        why = check(key, _select(cfg, key))
        if why:
            out.append(why)
    return out


# ---------------------------------------------------------------- the sections, typed
# Field names are the recipe's key names (recipes/base.yaml), so `cfg.train.lr` is `train.lr`.
@dataclass(frozen=True)
class ModelSection:
    name: str | None
    path: str
    tokenizer: str
    init: str
    config: dict
    gpu_only: bool
    attn_implementation: str
    liger: str              # auto | true | false


@dataclass(frozen=True)
class TrainSection:
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
    save_steps: tuple[int, ...]
    save_epoch_ends: bool
    state_every: int
    activation_checkpointing: bool
    precision: str
    max_consecutive_nonfinite: int
    peak_tflops: float | None     # None = look up from the device name
    log_every: int


@dataclass(frozen=True)
class LoggingSection:
    wandb: bool
    project: str | None           # null -> $WANDB_PROJECT, else dtsft (common.tracking)
    entity: str | None
    group: str | None
    tags: tuple
    name: str | None
    mode: str


def _plain_container(v):
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # pragma: no cover - omegaconf is a core dependency
        return v
    return OmegaConf.to_container(v, resolve=True) if isinstance(v, (DictConfig, ListConfig)) else v


def read_sections(cfg) -> tuple[ModelSection, TrainSection, LoggingSection]:
    """The `model:`, `train:` and `logging:` sections of a config `problems` found nothing wrong with."""
    m, t, lg = (_plain_container(_select(cfg, s)) for s in ("model", "train", "logging"))
    liger = m["liger"]
    model = ModelSection(name=m.get("name"), path=m["path"], tokenizer=m["tokenizer"], init=m["init"],
                         config=dict(m.get("config") or {}), gpu_only=m["gpu_only"],
                         attn_implementation=m["attn_implementation"],
                         liger={True: "true", False: "false"}.get(liger, liger))
    train = TrainSection(
        global_batch_size=t["global_batch_size"], max_tokens_per_micro_batch=t["max_tokens_per_micro_batch"],
        lr=float(t["lr"]), betas=(float(t["betas"][0]), float(t["betas"][1])), eps=float(t["eps"]),
        weight_decay=float(t["weight_decay"]), lr_schedule=t["lr_schedule"], warmup_ratio=float(t["warmup_ratio"]),
        min_lr_ratio=float(t["min_lr_ratio"]), grad_clip=None if t["grad_clip"] is None else float(t["grad_clip"]),
        steps=t["steps"], epochs=t["epochs"], save_steps=tuple(sorted(set(t["save_steps"]))),
        save_epoch_ends=t["save_epoch_ends"], state_every=t["state_every"],
        activation_checkpointing=t["activation_checkpointing"], precision=t["precision"],
        max_consecutive_nonfinite=t["max_consecutive_nonfinite"],
        peak_tflops=None if t["peak_tflops"] in ("auto", None) else float(t["peak_tflops"]), log_every=t["log_every"])
    logging = LoggingSection(wandb=lg["wandb"], project=lg.get("project"), entity=lg.get("entity"), group=lg.get("group"),
                             tags=tuple(lg.get("tags") or ()), name=lg.get("name"), mode=lg["mode"])
    return model, train, logging
