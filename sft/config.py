"""The SFT trainer's keys (model, train, logging; `SFT`, `launch`'s table, adds data_prep's and common.schema's) and
`load_config`, which reads `<run_dir>/config.yaml` (and `key=value` overrides) and checks every value the trainer uses
before any model or GPU work, so a typo fails in a second naming the key."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from omegaconf import DictConfig

from common.cli import apply_overrides, load_mapping
from common.fields import (ABSENT, IDENTITY, MODEL as MODEL_ROLE, NONEMPTY, PATH, Field, Number, Test, choice, count,
                           excluded, field, flag, list_of, number, plain, section, select, text)
from common import fields
from common.schema import LAUNCHER, PYTHON, RUN
from data_prep.config import DATA
from common.tiny import resolve_model_path
from sft import console
from sft.errors import SftError

_ID, _MODEL_ID = (IDENTITY,), (IDENTITY, PATH, MODEL_ROLE)   # a model directory or hub id: its spelling is identity

MODEL: dict[str, Field] = {
    "model.name": field("the model's short name (run identity, wandb tag)", "qwen3_4b_thinking_2507", _ID, NONEMPTY),
    "model.path": field("hub id or local directory", "Qwen/Qwen3-4B-Thinking-2507", _MODEL_ID, NONEMPTY),
    "model.tokenizer": field("hub id or local directory of the tokenizer and chat template", "Qwen/Qwen3-4B-Thinking-2507", _MODEL_ID, NONEMPTY),
    "model.init": choice("pretrained | random (random init from the model's config)", "pretrained", ("pretrained", "random"), _ID),
    "model.config": field("config overrides (the tiny model sets all of them)", {}, _ID,
                          Test(lambda v: isinstance(v, dict), "a mapping of config overrides, e.g. {hidden_size: 64}"), read=dict),
    "model.gpu_only": flag("refuse to train on a machine without CUDA", True, _ID),
    "model.attn_implementation": choice("auto: flash_attention_2 when available, else sdpa", "auto",
                                        ("auto", "flash_attention_2", "sdpa", "eager"), _ID),
    "model.liger": field("auto: on with CUDA + liger-kernel, off on CPU", "auto", _ID,
                         Test(lambda v: isinstance(v, bool) or v in ("auto", "true", "false"),
                              "one of auto, true, false"), read=lambda v: {True: "true", False: "false"}.get(v, v)),
    "model.license": field("the base model's licence as its publisher states it (a hub license id, e.g. apache-2.0); the "
                           "model card's `license` (null: none stated)", None, (),
                           Test(lambda v: v is None or (isinstance(v, str) and v.strip() != ""),
                                "null or a licence id (e.g. apache-2.0)")),
}
TRAIN: dict[str, Field] = {
    "train.global_batch_size": count("trajectories per optimizer step", 16),
    "train.max_tokens_per_micro_batch": count(">= data.max_seq_len: a packed micro-batch never splits a trajectory",
                                               32768, lo=2),   # a shifted label needs 2 tokens
    "train.lr": number("peak learning rate (AdamW)", 1.0e-5, _ID, lo=0, lo_open=True),
    "train.betas": field("AdamW betas", [0.9, 0.999], _ID,
                         list_of(Number(lo=0, hi=1, hi_open=True).ok, "two numbers in [0, 1)", size=lambda n: n == 2),
                         read=lambda v: (float(v[0]), float(v[1]))),
    "train.eps": number("AdamW epsilon", 1.0e-8, _ID, lo=0, lo_open=True),
    "train.weight_decay": number("AdamW weight decay", 0.0, _ID, lo=0),
    "train.lr_schedule": choice("cosine | linear | constant, as transformers' get_*_schedule_with_warmup", "cosine",
                                ("cosine", "linear", "constant"), _ID),
    "train.warmup_ratio": number("warmup steps = ceil(warmup_ratio x steps)", 0.03, _ID, lo=0, hi=1, hi_open=True),
    "train.min_lr_ratio": number("floor of the cosine schedule, as a fraction of lr", 0.0, _ID, lo=0, hi=1),
    "train.grad_clip": number("gradient-norm clipping threshold", 1.0, _ID, lo=0, lo_open=True, null=True),
    "train.steps": count("optimizer steps; null -> epochs * floor(n / global_batch_size)", None, null=True),
    "train.epochs": count("passes over the data when steps is null", 1),
    "train.save_steps": field("the final step is always saved", [50, 100, 150, 200], _ID,
                              list_of(Number(lo=1, integer=True).ok, "a list of positive integers, e.g. [50,100]"),
                              read=lambda v: tuple(sorted(set(v)))),
    "train.save_epoch_ends": flag("also save at every epoch boundary (218 = epoch 1)", True, _ID),
    "train.state_every": count("resumable state cadence (and on SIGTERM / SIGUSR1)", 25, ()),
    "train.activation_checkpointing": flag("recompute activations in the backward pass (less memory)", True, _ID),
    "train.precision": choice("auto: bf16 on GPU, fp32 on CPU | bf16 | fp32", "auto", ("auto", "bf16", "fp32"), _ID),
    "train.max_consecutive_nonfinite": count("non-finite gradient norms in a row before the run exits with code 3", 5, ()),
    "train.peak_tflops": field("for MFU; auto: looked up from the GPU name", "auto", (),
                               Number(lo=0, lo_open=True, null=True, words=("auto",)),
                               read=lambda v: None if v == "auto" else float(v)),
    **console.KEYS,
}
LOGGING: dict[str, Field] = {
    "logging.wandb": flag("false: no wandb run at all", True),
    "logging.project": text("null -> $WANDB_PROJECT, else dtsft"),
    "logging.entity": text("null -> $WANDB_ENTITY, else the account's default"),
    "logging.group": text("null -> $WANDB_RUN_GROUP, else the study (last component of runs_root)"),
    "logging.tags": field("added to arm:<arm> seed:<seed> model:<name> stage:<stage>", [], (),
                          list_of(lambda t: isinstance(t, (str, int)), "a list of strings, e.g. [ablation,lr-sweep]"), read=tuple),
    "logging.name": text("null -> <arm>-s<seed>"),
    "logging.mode": choice("online|offline|disabled; auto: $WANDB_MODE, else online when logged in (key or netrc)", "auto",
                           ("auto", "online", "offline", "disabled")),
}
# What sft.train checks in its config.yaml (launch checks these and the rest of SFT); launch's table.
TRAINER: dict[str, Field] = {"arm": RUN["arm"], "seed": RUN["seed"], **MODEL, **TRAIN, **LOGGING}
SFT: dict[str, Field] = {**RUN, **MODEL, **{f"data.{k}": f for k, f in DATA.items()}, **TRAIN, **LOGGING, **LAUNCHER,
                         **PYTHON}
EXCLUDED_KEYS = excluded(SFT)   # the run fingerprint's: every key without the IDENTITY role


def problems(cfg) -> list[str]:
    """Every trainer key of `cfg` that is missing or invalid. A key without the IDENTITY role may be absent (a config.yaml
    written before it existed): it changes no result, the trainer reads its default."""
    return fields.problems(TRAINER, cfg, must=True, optional=[k for k, f in TRAINER.items() if IDENTITY not in f.roles])


# What the training loop reads (load_config): the namespace from_dictconfig fills (`cfg.train.lr`: common.fields.section).
TrainConfig = SimpleNamespace


def load_config(path: str | Path, overrides: list[str] | None = None) -> TrainConfig:
    raw = load_mapping(Path(path), SftError, "not a valid YAML config", "expected a mapping at the top level",
                       missing="config file not found")
    return from_dictconfig(apply_overrides(raw, overrides or [], open_prefixes=("model.config.",)))


def from_dictconfig(raw: DictConfig) -> TrainConfig:
    """Validate and flatten; every failure names the offending key."""
    for key, filler in (("run_dir", "launch fills it"), ("data.dir", "launch fills it from the data cache")):
        if not plain(select(raw, key, None)):
            raise SftError(f"{key}: must be set in the resolved config ({filler})")
    if (resume := select(raw, "resume")) is ABSENT:
        raise SftError("resume: missing from the resolved config")
    resume = "never" if resume in (None, False) else str(resume)   # an early config's "no resume"
    if bad := problems(raw) + [why for why in (RUN["resume"].must("resume", resume),) if why]:
        raise SftError(bad[0] if len(bad) == 1 else "invalid config:\n  " + "\n  ".join(bad))
    arm, seed, variant = raw.arm, raw.seed, raw.get("name")   # validated above
    model, train, logging = (section(TRAINER, raw, name) for name in ("model", "train", "logging"))
    model.path = resolve_model_path(model.path, random_ok=True)
    logging.name = str(logging.name or (f"{arm}-{variant}-s{seed}" if variant else f"{arm}-s{seed}"))
    return TrainConfig(run_dir=Path(str(raw.run_dir)), data_dir=Path(str(raw.data.dir)), arm=arm, seed=seed,
                       resume=resume, model=model, train=train, logging=logging, raw=raw)

