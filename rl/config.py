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

from common.cli import KeySpace, apply_overrides, did_you_mean, flat_keys, split_dotlist
from common import schema, thinking
from common.benchmarks import CONTEXT_MODES
from common.layout import variant_name_problem
from common.plan import save_points
from common.recipes import ALIASES, CHOICES, RECIPES, RL_ALIASES, STRING_KEYS
from launch.compose import (USER_RECIPE, Composed, check_user_recipe, load_recipe, load_user_recipe,
                            resolve_interpolations)
from launch.errors import LaunchError
from launch.paths import GRPO_KEYS, make_absolute
from rl.errors import RlError

SELECTORS = {"task": "spa", "model": "qwen3_4b", "launcher": "local"}  # the references' Qwen3-4B (hybrid)
TRAIN_KEYS = ("steps", "save_steps", "state_every", "lr", "lr_schedule", "warmup_ratio", "min_lr_ratio", "betas", "eps",
              "weight_decay", "grad_clip", "activation_checkpointing", "precision")
MODEL_KEYS = ("name", "path", "gpu_only", "attn_implementation")  # the tokenizer is the starting model's
# TRL 1.16's GRPO losses that need no setting this config does not expose (luspo needs sequence-level
# importance sampling, vespo a vLLM correction setting).
LOSS_TYPES = ("dapo", "grpo", "dr_grpo", "bnpo", "cispo", "sapo")
# Keys a user recipe may not set: the command line's selectors (task=) and what they derive (arm, stage).
RL_SELECTOR_KEYS = ("task", "arm", "stage")


def _shipped_layers(choices: dict, recipes: Path) -> list[tuple[str, DictConfig]]:
    base = OmegaConf.load(recipes / "base.yaml")
    base.pop("data")
    layers = [("recipes/base.yaml", base), ("recipes/grpo/base.yaml", OmegaConf.load(recipes / "grpo" / "base.yaml")),
              (f"recipes/grpo/task/{choices['task']}.yaml",
               OmegaConf.load(recipes / "grpo" / "task" / f"{choices['task']}.yaml")),
              (f"recipes/model/{choices['model']}.yaml", load_recipe("model", choices["model"], recipes))]
    layers.append((f"recipes/launcher/{choices['launcher']}.yaml", load_recipe("launcher", choices["launcher"], recipes)))
    # After the launcher: a model's GRPO recipe states the hardware its reference trained on (4 GPUs),
    # which a launcher's generic default (slurm: 8 GPUs per node) must not override silently.
    rl_model = recipes / "grpo" / "model" / f"{choices['model']}.yaml"
    if rl_model.is_file():
        layers.append((f"recipes/grpo/model/{choices['model']}.yaml", OmegaConf.load(rl_model)))
    return layers


def recipe_gpus(composed: Composed, recipes: Path = RECIPES) -> tuple[int, str] | None:
    """(GPUs, recipe file) when the model's GRPO recipe states the reference's GPU count."""
    path = recipes / "grpo" / "model" / f"{composed.choices['model']}.yaml"
    gpus = OmegaConf.select(OmegaConf.load(path), "launcher.gpus_per_node") if path.is_file() else None
    return (int(gpus), f"recipes/grpo/model/{path.name}") if gpus is not None else None


def hardware_note(composed: Composed, world: int) -> str | None:
    """What a launch says when its world size is not the recipe's GPU count, and how the batch is kept."""
    stated = recipe_gpus(composed)
    if stated is None or stated[0] == world:
        return None
    g = composed.cfg.grpo
    per_device = int(g.completions_per_step) // (world * int(g.grad_accum))
    return (f"{stated[1]} states {stated[0]} GPUs (the reference's); this run has {world} process(es) "
            f"(launcher.gpus_per_node / nproc / nodes). The effective batch is kept: grpo.completions_per_step="
            f"{g.completions_per_step} completions per optimizer step = {per_device} per process x {world} "
            f"process(es) x grpo.grad_accum={g.grad_accum}; the group size (num_generations={g.num_generations}) is unchanged")


def compose_grpo(argv: list[str], recipes: Path = RECIPES) -> Composed:
    """The GRPO config of `argv` (selectors task= model= launcher= recipe=, then key=value), validated."""
    choices, rest = dict(SELECTORS), []
    for tok, (key, value) in zip(argv, split_dotlist(argv)):
        if key in ("model", "launcher", USER_RECIPE):
            choices[key] = value.strip()
        elif key == "task":
            choices["task"] = value.strip()
            rest.append(tok)
        elif key == "stage":
            if value.strip() != "grpo":
                raise RlError(f"stage={value.strip()}: this is the GRPO launcher (stage=grpo); SFT is `launch arm=...`")
        elif key == "arm":
            raise RlError("arm= is not a GRPO key: the arm of a GRPO run is grpo_<task> (use task=spa|qa)")
        elif ALIASES.get(key, key) in STRING_KEYS and value and value[0] not in "'\"" and value != "null":
            rest.append(f"{key}='{value}'")
        else:
            rest.append(tok)
    if choices["task"] not in ("spa", "qa"):
        raise RlError(f"task={choices['task']!r}: choices are spa, qa")
    cfg, origins = OmegaConf.create(), {}
    for where, layer in _shipped_layers(choices, recipes):
        layer.pop("_launch", None)  # an SFT model recipe's launch hints; nothing of them applies to GRPO
        layer.pop("data", None)  # model recipes size SFT data; not used here
        cfg = OmegaConf.merge(cfg, layer)
        origins.update(dict.fromkeys(flat_keys(layer), where))
    if cfg.model.init != "pretrained":
        raise RlError(f"model={choices['model']} is a random init (model.init={cfg.model.init}); GRPO starts "
                      "from a pretrained model or an SFT checkpoint (e.g. model=tiny_base on CPU)")
    # Only the keys GRPO reads stay, so config.yaml (and the run fingerprint over it) holds no
    # SFT-only knob that changes nothing here, and setting one is an unknown-key error.
    cfg.train = {k: cfg.train[k] for k in TRAIN_KEYS}
    cfg.model = {k: cfg.model[k] for k in MODEL_KEYS}
    if choices.get(USER_RECIPE):
        path, user = load_user_recipe(choices[USER_RECIPE])
        choices[USER_RECIPE] = str(path)
        where = f"recipe={path}"
        if "_launch" in user:
            raise RlError(f"{where}: `_launch` is internal to the shipped SFT recipes; nothing of it applies to GRPO")
        check_user_recipe(user, where, RL_SELECTOR_KEYS)
        known = KeySpace(cfg)
        for key in flat_keys(user):
            if key not in known:
                raise RlError(f"{where}: key {key!r} is not a GRPO key (stage=grpo reads only the keys "
                              f"`launch stage=grpo --help` lists).{did_you_mean(key, sorted(known.leaves))}")
        cfg = OmegaConf.merge(cfg, user)
        origins.update(dict.fromkeys(flat_keys(user), where))
    cfg = apply_overrides(cfg, rest, aliases=RL_ALIASES, open_prefixes=())
    origins.update({RL_ALIASES.get(k, k): f"command line ({tok})" for tok, (k, _) in zip(rest, split_dotlist(rest))})
    try:
        cfg = resolve_interpolations(cfg)
    except LaunchError as exc:
        raise RlError(str(exc)) from None
    make_absolute(cfg, GRPO_KEYS, origins)
    cfg.arm = f"grpo_{cfg.task}"
    validate(cfg)
    return Composed(cfg=cfg, choices=choices, argv=list(argv), origins=origins)


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _pos_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


# The trainer's keys that common.schema already rules on (the same rule as SFT's).
SCHEMA_KEYS = ("seed", "model.path", "model.gpu_only", "model.attn_implementation", "train.lr",
               "train.lr_schedule", "train.warmup_ratio", "train.min_lr_ratio",
               "train.betas", "train.eps", "train.weight_decay", "train.grad_clip", "train.state_every",
               "train.save_steps", "train.activation_checkpointing", "train.precision", "logging.wandb",
               "logging.mode", "logging.project", "logging.entity", "logging.group", "logging.name", "logging.tags")


def problems(cfg: DictConfig) -> list[str]:
    """Every value of a GRPO config that the trainer would refuse, one line each (naming the key):
    the one schema `launch stage=grpo` checks before writing a run dir and rl.train checks config.yaml with."""
    bad: list[str] = []
    sel = lambda key: OmegaConf.select(cfg, key, default=schema.ABSENT)  # noqa: E731

    def need(ok: bool, key: str, what: str) -> None:
        if not ok:
            bad.append(f"{key} must be {what}, got {OmegaConf.select(cfg, key)!r}")

    for key in SCHEMA_KEYS:
        why = schema.check(key, sel(key))
        if why:
            bad.append(why)
    missing = [k for k in ("stage", "task", "grpo", "lora", "train", "launcher") if sel(k) is schema.ABSENT]
    if missing:
        return bad + [f"{k}: missing from the config" for k in missing]
    g, lo, t = cfg.grpo, cfg.lora, cfg.train
    need(cfg.stage == "grpo", "stage", "grpo")
    need(isinstance(cfg.model.name, str) and cfg.model.name != "", "model.name", "a non-empty string")
    need(cfg.task in ("spa", "qa"), "task", "spa or qa")
    need(variant_name_problem(cfg.name) is None, "name", variant_name_problem(cfg.name) or "")
    need(_pos_int(t.steps), "train.steps", "a positive integer")
    for key in ("completions_per_step", "num_generations", "max_completion_length", "max_turns", "grad_accum",
                "topk", "rollouts_logged", "pilot_tasks"):
        need(_pos_int(g[key]), f"grpo.{key}", "a positive integer")
    need(_pos_int(g.num_generations) and g.num_generations >= 2, "grpo.num_generations", "an integer >= 2 (GRPO compares a group)")
    if _pos_int(g.completions_per_step) and _pos_int(g.num_generations):
        need(g.completions_per_step % g.num_generations == 0, "grpo.completions_per_step",
             f"a multiple of grpo.num_generations={g.num_generations}")
    need(_num(g.beta) and g.beta >= 0, "grpo.beta", "a number >= 0")
    need(_num(g.temperature) and g.temperature > 0, "grpo.temperature", "a positive number")
    need(g.loss_type in LOSS_TYPES, "grpo.loss_type", f"one of {', '.join(LOSS_TYPES)}")
    need(thinking.value_problem(g.enable_thinking, "grpo.enable_thinking") is None, "grpo.enable_thinking",
         "auto, true or false")
    need(g.use_vllm in ("auto", True, False), "grpo.use_vllm", "auto, true or false")
    need(_num(g.vllm_gpu_memory_utilization) and 0 < g.vllm_gpu_memory_utilization <= 1,
         "grpo.vllm_gpu_memory_utilization", "a number in (0, 1]")
    need(g.split in ("train", "ood"), "grpo.split", "train or ood")
    need(g.retriever in ("bm25", "http"), "grpo.retriever", "bm25 or http")
    need(g.qa_mode in CONTEXT_MODES, "grpo.qa_mode", f"one of {', '.join(CONTEXT_MODES)} (evals' context modes)")
    need(_num(g.retriever_timeout) and g.retriever_timeout > 0, "grpo.retriever_timeout", "a positive number of seconds")
    need(isinstance(g.retriever_retries, int) and not isinstance(g.retriever_retries, bool) and g.retriever_retries >= 0,
         "grpo.retriever_retries", "a non-negative integer")
    need(_num(g.max_search_failure_rate) and 0 <= g.max_search_failure_rate <= 1, "grpo.max_search_failure_rate",
         "a number in [0, 1]")
    lc = cfg.launcher
    need(lc.nproc == "auto" or _pos_int(lc.nproc), "launcher.nproc", "auto or a positive integer")
    need(_pos_int(lc.nodes) and (lc.kind == "slurm" or lc.nodes == 1), "launcher.nodes",
         "1 with launcher=local, a positive integer with launcher=slurm")
    need(_pos_int(lc.gpus_per_node), "launcher.gpus_per_node", "a positive integer")
    need(isinstance(lc.dry_run, bool), "launcher.dry_run", "true or false")
    need(lc.kind in CHOICES["launcher.kind"], "launcher.kind", f"one of {', '.join(CHOICES['launcher.kind'])}")
    resume = cfg.resume
    need(resume in ("auto", "never") or (isinstance(resume, str) and Path(resume).is_dir()), "resume",
         "auto, never or an existing state directory")
    need(_pos_int(lo.r), "lora.r", "a positive integer")
    need(_num(lo.alpha) and lo.alpha > 0, "lora.alpha", "a positive number")
    need(_num(lo.dropout) and 0 <= lo.dropout < 1, "lora.dropout", "in [0, 1)")
    need(lo.target_modules is not None and not isinstance(lo.target_modules, str) and len(lo.target_modules) > 0
         and all(isinstance(m, str) for m in lo.target_modules), "lora.target_modules", "a non-empty list of module names")
    if cfg.task == "qa" and not bad:
        if not g.prompts_file:
            bad.append("task=qa needs grpo.prompts_file=PATH (FlashRAG-format training questions)")
        elif not Path(str(g.prompts_file)).is_file():
            bad.append(f"grpo.prompts_file={g.prompts_file}: no such file")
        searches = g.qa_mode == "open"  # item / given use the rows' own paragraphs, no retriever
        if searches and g.retriever == "bm25" and not g.corpus:
            bad.append("task=qa with grpo.retriever=bm25 needs grpo.corpus=PATH (a wiki-18 style jsonl)")
        elif searches and g.retriever == "bm25" and not Path(str(g.corpus)).is_file():
            bad.append(f"grpo.corpus={g.corpus}: no such file")
        if searches and g.retriever == "http" and not g.retriever_url:
            bad.append("task=qa with grpo.retriever=http needs grpo.retriever_url=URL (serve-retriever)")
    if not bad and is_sft_checkpoint(cfg.model.path) and not cfg.name:
        bad.append(f"model.path={cfg.model.path} is a checkpoint of an earlier run: set name=<variant> "
                   "(e.g. name=from_search_s100) so the GRPO run gets its own directory")
    return bad


def world_problem(cfg: DictConfig, world: int) -> str | None:
    """Why `world` processes cannot split one step's completions evenly (None when they can)."""
    g = cfg.grpo
    if not (_pos_int(g.completions_per_step) and _pos_int(g.grad_accum)):
        return None
    if g.completions_per_step % (world * g.grad_accum):
        return (f"grpo.completions_per_step={g.completions_per_step} is not divisible by {world} process(es) x "
                f"grpo.grad_accum={g.grad_accum}: each process generates completions_per_step / (processes x "
                "grad_accum) completions per micro-step")
    return None


def validate(cfg: DictConfig) -> None:
    bad = problems(cfg)
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


def input_digests(cfg: DictConfig) -> dict[str, str]:
    """{key: sha256} of every input file the run reads (task=qa: the prompts file, and the corpus a
    bm25 retriever indexes), through common.fingerprint's cached digest: part of the run identity, so
    a relaunch on a changed file is a different configuration, whatever its path."""
    from common.fingerprint import file_digest

    searches = cfg.grpo.retriever == "bm25" and cfg.grpo.qa_mode == "open"  # item / given read no corpus
    keys = ["grpo.prompts_file"] + (["grpo.corpus"] if searches else []) if cfg.task == "qa" else []
    out = {}
    for key in keys:
        path = OmegaConf.select(cfg, key)
        try:
            out[key] = file_digest(str(path))
        except OSError as exc:
            raise RlError(f"{key}={path}: cannot read it ({exc.strerror or exc})") from None
    return out


def run_identity(cfg: DictConfig) -> dict:
    """The run identity (common.fingerprint over every result-changing key of config.yaml: task, LoRA,
    GRPO settings, env split, model, seed; the input files by content), as launch and rl.train compute it."""
    from common import fingerprint

    extra = {"trainer_semantics": schema.TRAINER_SEMANTICS}
    inputs = input_digests(cfg)
    if inputs:
        extra["inputs"] = inputs
    return fingerprint.identity(cfg, **extra)
