"""The `stage=grpo` config: composition, validation and the run directory.

    recipes/base.yaml <- recipes/grpo/base.yaml <- recipes/grpo/task/<task>.yaml
        <- recipes/model/<model>.yaml <- recipes/grpo/model/<model>.yaml (if any)
        <- recipes/launcher/<launcher>.yaml <- key=value overrides

The SFT `data` section does not apply and is dropped; `arm` is `grpo_<task>`. Every key (task,
LoRA, GRPO settings, env split) is in the resolved `config.yaml`, the trainer's only input.
Unknown keys are errors with a "did you mean" (common.cli); bad values fail here, before any work.
"""
from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from common.cli import apply_overrides, split_dotlist
from common import schema
from common.benchmarks import CONTEXT_MODES
from common.layout import variant_name_problem
from common.plan import save_points
from launch.compose import ALIASES, CHOICES, RECIPES, STRING_KEYS, Composed, load_recipe
from rl.errors import RlError

SELECTORS = {"task": "spa", "model": "qwen3_4b_thinking_2507", "launcher": "local"}
RL_ALIASES = {k: v for k, v in ALIASES.items() if not v.startswith("data.") and v.split(".")[-1] != "epochs"}
TRAIN_KEYS = ("steps", "save_steps", "state_every", "lr", "lr_schedule", "betas", "eps", "weight_decay", "grad_clip",
              "activation_checkpointing", "precision")
MODEL_KEYS = ("name", "path", "gpu_only", "attn_implementation")  # the tokenizer is the starting model's


def compose_grpo(argv: list[str], recipes: Path = RECIPES) -> Composed:
    choices, rest = dict(SELECTORS), []
    for tok, (key, value) in zip(argv, split_dotlist(argv)):
        if key in ("model", "launcher"):
            choices[key] = value.strip()
        elif key == "task":
            choices["task"] = value.strip()
            rest.append(tok)
        elif key == "arm":
            raise RlError("arm= is not a GRPO key: the arm of a GRPO run is grpo_<task> (use task=spa|qa)")
        elif ALIASES.get(key, key) in STRING_KEYS and value and value[0] not in "'\"" and value != "null":
            rest.append(f"{key}='{value}'")
        else:
            rest.append(tok)
    if choices["task"] not in ("spa", "qa"):
        raise RlError(f"task={choices['task']!r}: choices are spa, qa")
    cfg = OmegaConf.load(recipes / "base.yaml")
    cfg.pop("data")
    layers = [OmegaConf.load(recipes / "grpo" / "base.yaml"), OmegaConf.load(recipes / "grpo" / "task" / f"{choices['task']}.yaml"),
              load_recipe("model", choices["model"], recipes)]
    rl_model = recipes / "grpo" / "model" / f"{choices['model']}.yaml"
    if rl_model.is_file():
        layers.append(OmegaConf.load(rl_model))
    layers.append(load_recipe("launcher", choices["launcher"], recipes))
    for layer in layers:
        layer.pop("_launch", None)
        layer.pop("data", None)  # model recipes size SFT data; not used here
        cfg = OmegaConf.merge(cfg, layer)
    if cfg.model.init != "pretrained":
        raise RlError(f"model={choices['model']} is a random init (model.init={cfg.model.init}); GRPO starts "
                      "from a pretrained model or an SFT checkpoint (e.g. model=tiny_base on CPU)")
    # Only the keys GRPO reads stay, so config.yaml (and the run fingerprint over it) holds no
    # SFT-only knob that changes nothing here, and setting one is an unknown-key error.
    cfg.train = {k: cfg.train[k] for k in TRAIN_KEYS}
    cfg.model = {k: cfg.model[k] for k in MODEL_KEYS}
    cfg = apply_overrides(cfg, rest, aliases=RL_ALIASES, open_prefixes=())
    cfg.arm = f"grpo_{cfg.task}"
    validate(cfg)
    return Composed(cfg=cfg, choices=choices, argv=list(argv))


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _pos_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def validate(cfg: DictConfig) -> None:
    g, lo, t = cfg.grpo, cfg.lora, cfg.train
    bad: list[str] = []

    def need(ok: bool, key: str, what: str) -> None:
        if not ok:
            bad.append(f"{key} must be {what}, got {OmegaConf.select(cfg, key)!r}")

    need(cfg.task in ("spa", "qa"), "task", "spa or qa")
    need(variant_name_problem(cfg.name) is None, "name", variant_name_problem(cfg.name) or "")
    need(isinstance(cfg.seed, int) and cfg.seed >= 0, "seed", "a non-negative integer")
    need(_pos_int(t.steps), "train.steps", "a positive integer")
    need(t.save_steps is not None and all(_pos_int(s) for s in t.save_steps), "train.save_steps", "a list of positive integers")
    need(_pos_int(t.state_every), "train.state_every", "a positive integer")
    need(_num(t.lr) and t.lr > 0, "train.lr", "a positive number")
    need(t.lr_schedule == "constant", "train.lr_schedule", "constant for GRPO (resume restores no scheduler state)")
    for key in ("completions_per_step", "num_generations", "max_completion_length", "max_turns", "grad_accum",
                "topk", "rollouts_logged", "pilot_tasks"):
        need(_pos_int(g[key]), f"grpo.{key}", "a positive integer")
    need(_pos_int(g.num_generations) and g.num_generations >= 2, "grpo.num_generations", "an integer >= 2 (GRPO compares a group)")
    if _pos_int(g.completions_per_step) and _pos_int(g.num_generations):
        need(g.completions_per_step % g.num_generations == 0, "grpo.completions_per_step",
             f"a multiple of grpo.num_generations={g.num_generations}")
    need(_num(g.beta) and g.beta >= 0, "grpo.beta", "a number >= 0")
    need(_num(g.temperature) and g.temperature > 0, "grpo.temperature", "a positive number")
    need(g.use_vllm in ("auto", True, False), "grpo.use_vllm", "auto, true or false")
    need(g.split in ("train", "ood"), "grpo.split", "train or ood")
    need(g.retriever in ("bm25", "http"), "grpo.retriever", "bm25 or http")
    need(g.qa_mode in CONTEXT_MODES, "grpo.qa_mode", f"one of {', '.join(CONTEXT_MODES)} (evals' context modes)")
    lc = cfg.launcher
    need(lc.nproc == "auto" or _pos_int(lc.nproc), "launcher.nproc", "auto or a positive integer")
    need(_pos_int(lc.nodes) and (lc.kind == "slurm" or lc.nodes == 1), "launcher.nodes",
         "1 with launcher=local, a positive integer with launcher=slurm")
    need(_pos_int(lc.gpus_per_node), "launcher.gpus_per_node", "a positive integer")
    for key in ("launcher.dry_run", "logging.wandb", "model.gpu_only", "train.activation_checkpointing"):
        need(isinstance(OmegaConf.select(cfg, key), bool), key, "true or false")
    for key in ("logging.mode", "launcher.kind", "train.precision", "model.attn_implementation"):
        allowed = schema.CHOICES.get(key) or CHOICES[key]   # the trainer's keys: common.schema's lists
        need(OmegaConf.select(cfg, key) in allowed, key, f"one of {', '.join(allowed)}")
    need(cfg.resume in ("auto", "never") or (isinstance(cfg.resume, str) and cfg.resume), "resume",
         "auto, never or a state directory")
    need(_pos_int(lo.r), "lora.r", "a positive integer")
    need(_num(lo.alpha) and lo.alpha > 0, "lora.alpha", "a positive number")
    need(_num(lo.dropout) and 0 <= lo.dropout < 1, "lora.dropout", "in [0, 1)")
    need(lo.target_modules is not None and len(lo.target_modules) > 0 and all(isinstance(m, str) for m in lo.target_modules),
         "lora.target_modules", "a non-empty list of module names")
    if cfg.task == "qa" and not bad:
        if not g.prompts_file:
            bad.append("task=qa needs grpo.prompts_file=PATH (FlashRAG-format training questions)")
        searches = g.qa_mode == "open"  # item / given use the rows' own paragraphs, no retriever
        if searches and g.retriever == "bm25" and not g.corpus:
            bad.append("task=qa with grpo.retriever=bm25 needs grpo.corpus=PATH (a wiki-18 style jsonl)")
        if searches and g.retriever == "http" and not g.retriever_url:
            bad.append("task=qa with grpo.retriever=http needs grpo.retriever_url=URL (serve-retriever)")
    if is_sft_checkpoint(cfg.model.path) and not cfg.name:
        bad.append(f"model.path={cfg.model.path} is a checkpoint of an earlier run: set name=<variant> "
                   "(e.g. name=from_search_s100) so the GRPO run gets its own directory")
    if bad:
        raise RlError("invalid config:\n  " + "\n  ".join(bad))


def is_sft_checkpoint(path: str) -> bool:
    p = Path(str(path)).expanduser()
    return p.is_dir() and (p / "SHA256SUMS").is_file()


def parent_run(path: str) -> dict | None:
    """{"run_dir", "checkpoint"} when the start is `<run>/checkpoints/step-NNNNNN`, else None."""
    p = Path(str(path)).expanduser()
    if not is_sft_checkpoint(str(p)):
        return None
    p = p.resolve()
    run = p.parent.parent if p.parent.name == "checkpoints" else None
    return {"run_dir": str(run) if run else None, "checkpoint": str(p)}


def run_dir(cfg: DictConfig) -> Path:
    """`<runs_root>/grpo_<task>/[<name>/]seed<seed>` unless `run_dir` is set; absolute."""
    if cfg.run_dir:
        return Path(cfg.run_dir).expanduser().resolve()
    parts = [f"grpo_{cfg.task}"] + ([str(cfg.name)] if cfg.name else []) + [f"seed{cfg.seed}"]
    return Path(cfg.runs_root).expanduser().joinpath(*parts).resolve()


def planned_saves(cfg: DictConfig) -> list[int]:
    """GRPO checkpoint steps (no epochs): common.plan's rule over `train.steps`."""
    return save_points(save_steps=cfg.train.save_steps, save_epoch_ends=False, per_epoch=0, total=int(cfg.train.steps))
