"""The `stage=grpo` config the GRPO trainer reads: its keys, its validation (`problems`, one schema for
launch and rl.train), its run directory and its run identity. launch composes it
(launch.compose.compose_grpo: the recipes, the selectors task= model= launcher= recipe= and the
key=value overrides) and checks it with `validate` before any work; rl.train reads the resolved
`config.yaml` through the same check. Every key (task, LoRA, GRPO settings, env split) is in that
file, the trainer's only input.
"""
from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from common import datafetch, schema, thinking
from common.benchmarks import CONTEXT_MODES
from common.layout import variant_name_problem
from common.plan import save_points
from common.recipes import CHOICES
from rl.errors import RlError

TRAIN_KEYS = ("steps", "save_steps", "state_every", "lr", "lr_schedule", "warmup_ratio", "min_lr_ratio", "betas", "eps",
              "weight_decay", "grad_clip", "activation_checkpointing", "precision")
MODEL_KEYS = ("name", "path", "gpu_only", "attn_implementation")  # the tokenizer is the starting model's
# TRL 1.16's GRPO losses that need no setting this config does not expose (luspo needs sequence-level
# importance sampling, vespo a vLLM correction setting).
LOSS_TYPES = ("dapo", "grpo", "dr_grpo", "bnpo", "cispo", "sapo")


# grpo.trl: a release number as pip spells it (1.9.2, 1.16.0, 1.17.0rc1)
TRL_VERSION = re.compile(r"\d+(\.\d+)+((a|b|rc|\.post|\.dev)\d+)?")


def installed_trl() -> str | None:
    """The trl release this interpreter imports (None: not installed)."""
    try:
        return metadata.version("trl")
    except metadata.PackageNotFoundError:
        return None


def trl_problem(want, have: str | None, python: str = sys.executable) -> str | None:
    """Why a run pinned to `grpo.trl=want` cannot train in `python` (whose trl is `have`), or None."""
    if want in (None, "") or str(want) == have:
        return None
    return (f"grpo.trl={want}: {python} has {'trl ' + have if have else 'no trl'}; train in an environment holding "
            f"trl {want}: python.grpo=.venv-trl{want}/bin/python (`make venv-trl TRL_REF={want}` builds it beside "
            "the project's .venv), or grpo.trl=null for the installed one")


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
    trl = g.get("trl")   # absent from a config.yaml written before the key: the installed trl, as then
    need(trl is None or (isinstance(trl, str) and TRL_VERSION.fullmatch(trl) is not None), "grpo.trl",
         "null or a trl release such as 1.9.2 (three parts: 1.16 reads as a number)")
    need(_num(g.vllm_gpu_memory_utilization) and 0 < g.vllm_gpu_memory_utilization <= 1,
         "grpo.vllm_gpu_memory_utilization", "a number in (0, 1]")
    need(g.split in ("train", "ood"), "grpo.split", "train or ood")
    need(g.retriever in ("bm25", "e5", "http"), "grpo.retriever", "bm25, e5 or http")
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
    need(_pos_int(lc.gpus_per_node) or lc.gpus_per_node == 0 and not isinstance(lc.gpus_per_node, bool),
         "launcher.gpus_per_node", "an integer >= 0 (0: a CPU-only partition)")
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
        if searches and g.retriever in ("bm25", "e5") and not g.corpus:
            bad.append(f"task=qa with grpo.retriever={g.retriever} needs grpo.corpus=PATH (a wiki-18 style jsonl)")
        elif searches and g.retriever in ("bm25", "e5") and not _named("grpo.corpus", g.corpus, "corpus", bad) \
                and not Path(str(g.corpus)).is_file():
            bad.append(f"grpo.corpus={g.corpus}: no such file")
        if searches and g.retriever == "e5" and not g.get("encoder"):
            bad.append("task=qa with grpo.retriever=e5 needs grpo.encoder=MODEL (an HF model dir or hub id)")
        if searches and g.retriever == "e5":
            _named("grpo.encoder", g.get("encoder"), "encoder", bad)
        if searches and g.retriever == "e5" and g.get("index") is not None and not _named("grpo.index", g.index, "index", bad) \
                and not Path(str(g.index)).is_file():
            bad.append(f"grpo.index={g.index}: no such file (a faiss index; null builds one from the corpus)")
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


def placement(cfg: DictConfig, world: int) -> tuple[Path, dict]:
    """Where a composed, validated GRPO config runs on `world` processes and what it is: its run dir and
    run identity (launch's one call into rl before it checks the run dir). RlError when the processes
    cannot split one step's completions evenly (world_problem)."""
    problem = world_problem(cfg, world)
    if problem:
        raise RlError(f"invalid config:\n  {problem}")
    return run_dir(cfg), run_identity(cfg)


def planned_saves(cfg: DictConfig) -> list[int]:
    """GRPO checkpoint steps (no epochs): common.plan's rule over `train.steps`."""
    return save_points(save_steps=cfg.train.save_steps, save_epoch_ends=False, per_epoch=0, total=int(cfg.train.steps))


def _named(key: str, value, kind: str, bad: list[str]) -> bool:
    """Whether `value` is a fetch-data name (read through the data cache); a mistyped one is added to `bad`
    (with the nearest names) and counts as named, so no second "no such file" line follows."""
    try:
        return datafetch.named(key, value, kind)
    except datafetch.DataError as exc:
        bad.append(str(exc))
        return True


def input_digests(cfg: DictConfig) -> dict[str, str]:
    """{key: sha256} of every input file the run reads (task=qa: the prompts file, the corpus a bm25 or
    e5 retriever searches and an e5 retriever's index file), through common.fingerprint's cached digest: part of the run identity, so
    a relaunch on a changed file is a different configuration, whatever its path."""
    from common.fingerprint import file_digest

    searches = cfg.grpo.retriever in ("bm25", "e5") and cfg.grpo.qa_mode == "open"  # item / given read no corpus
    dense = searches and cfg.grpo.retriever == "e5" and cfg.grpo.get("index") is not None
    keys = ["grpo.prompts_file"] + (["grpo.corpus"] if searches else []) + (["grpo.index"] if dense else []) \
        if cfg.task == "qa" else []
    out = {}
    for key in keys:
        path = OmegaConf.select(cfg, key)
        if datafetch.is_name(path):   # a fetched file: its pinned digest, or the one recorded when pre-filled
            out[key] = datafetch.digest(path)
            continue
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
