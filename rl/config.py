"""The `stage=grpo` config the GRPO trainer reads: its keys, its validation (`problems`, one schema for
launch and rl.train), its run directory and its run identity. launch composes it
(launch.compose.compose_grpo: the recipes, the selectors task= model= launcher= recipe= and the
key=value overrides) and checks it with `validate` before any work; rl.train reads the resolved
`config.yaml` through the same check. Every key (task, LoRA, GRPO settings, env split) is in that
file, the trainer's only input.
"""
from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from common import datafetch, fingerprint, schema
from common.fields import must_problems
from common.plan import save_points
from rl.errors import RlError

# The keys the GRPO trainer reads of the sections it shares with SFT (the tokenizer is the starting model's).
TRAIN_KEYS = tuple(k.removeprefix("train.") for k in schema.GRPO if k.startswith("train."))
MODEL_KEYS = tuple(k.removeprefix("model.") for k in schema.GRPO if k.startswith("model."))


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


def problems(cfg: DictConfig) -> list[str]:
    """Every value of a GRPO config that the trainer would refuse, one line each (naming the key):
    the one schema `launch stage=grpo` checks before writing a run dir and rl.train checks config.yaml with
    (each key's rule is its field's, common.schema.GRPO; below, what depends on several keys)."""
    if any(k not in cfg for k in ("stage", "task", "grpo", "lora", "train", "launcher")):
        return [f"{k}: missing from the config" for k in ("stage", "task", "grpo", "lora", "train", "launcher")
                if k not in cfg]
    older = (*fingerprint.GRPO_LATER_KEYS, *(k for k in schema.GRPO if k.startswith("python.")))   # absent from an
    bad = must_problems(schema.GRPO, cfg, optional=older)                                           # older config.yaml
    g = cfg.grpo
    if not bad and g.completions_per_step % g.num_generations:
        bad.append(f"grpo.completions_per_step must be a multiple of grpo.num_generations={g.num_generations}, "
                   f"got {g.completions_per_step!r}")
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
