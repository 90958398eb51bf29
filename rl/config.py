"""The `stage=grpo` config the GRPO trainer reads (its only input): its keys (`GRPO`: its own sections, grpo
and lora, beside the SFT trainer's and the shared ones it takes), its validation (`problems`: launch checks the
composed config with it before any work, rl.train the resolved `config.yaml`), its run directory and identity."""
from __future__ import annotations

import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from common import datafetch, fields, fingerprint, layout
from common.benchmarks import CONTEXT_MODES
from common.fields import (CONTENT, IDENTITY, MODEL as MODEL_ROLE, PATH, Default, Field, Test, choice, count, excluded, field,
                           is_int, list_of, number, text)
from common.plan import save_points
from common.schema import ENABLE_THINKING, LAUNCHER, PYTHON, RUN, TRAINER_SEMANTICS, run_dir
from evals.retrievers import retriever_problem
from rl.envs import REWARD_SEMANTICS
from rl.errors import RlError
from sft.config import LOGGING, MODEL, SFT, TRAIN

# TRL 1.16's GRPO losses that need no setting this config does not expose (luspo needs sequence-level
# importance sampling, vespo a vLLM correction setting).
LOSS_TYPES = ("dapo", "grpo", "dr_grpo", "bnpo", "cispo", "sapo")
# grpo.trl: a release number as pip spells it (1.9.2, 1.16.0, 1.17.0rc1)
TRL_VERSION = re.compile(r"\d+(\.\d+)+((a|b|rc|\.post|\.dev)\d+)?")
_ID, _PATH_CONTENT, _MODEL_ID = (IDENTITY,), (PATH, CONTENT), (IDENTITY, PATH, MODEL_ROLE)

# A `[ref: ...]` mark quotes the reference system that states the value (LoRA GRPO on search_plan_act); a
# `[chosen: ...]` mark is this project's choice, not stated by the reference (docs/stages/grpo.md says why).
GRPO: dict[str, Field | Default] = {
    "seed": RUN["seed"], "runs_root": RUN["runs_root"],
    "name": Default(RUN["name"], None, "required when model.path is an SFT checkpoint (e.g. name=from_search_s100);"),
    "run_dir": RUN["run_dir"], "resume": RUN["resume"],
    **{k: MODEL[k] for k in ("model.name", "model.path", "model.gpu_only", "model.attn_implementation")},
    "train.steps": count('[ref: spa-qwen3 "250 steps"] optimizer steps', 250),
    "train.save_steps": Default(TRAIN["train.save_steps"], [50, 100, 150, 200], "[chosen: a checkpoint every 50 steps for "
                                "the per-step curves; the GRPO references state no saves]"),
    "train.state_every": Default(TRAIN["train.state_every"], 10, "[chosen]"),
    "train.lr": Default(TRAIN["train.lr"], 1.0e-5, "[chosen: a common LoRA-GRPO step for 4-8B models (TRL 1.16's default: 1e-6)]"),
    "train.lr_schedule": Default(TRAIN["train.lr_schedule"], "constant", "[chosen: as SFT's (TRL's default: linear decay to 0)]"),
    "train.warmup_ratio": Default(TRAIN["train.warmup_ratio"], 0.0, "[chosen: as SFT's (TRL's default: 0)]"),
    **{k: TRAIN[k] for k in ("train.min_lr_ratio", "train.betas", "train.eps", "train.weight_decay", "train.grad_clip",
                          "train.activation_checkpointing")},
    "train.precision": Default(TRAIN["train.precision"], "auto", "merged checkpoints are saved in it;"),
    **LOGGING, **LAUNCHER, **PYTHON,
    "stage": choice("grpo (set by stage=grpo on the command line)", "grpo", ("grpo",), _ID, what="grpo"),
    "task": choice("spa | qa  -> arm grpo_<task>", "spa", ("spa", "qa"), _ID, what="spa or qa"),
    "grpo.completions_per_step": count('[ref: spa-qwen3 "effective batch size 32"] completions per optimizer step', 32),
    "grpo.num_generations": field("[chosen: group size G: 4 prompts x 8 completions per step]", 8, _ID,
                                  Test(lambda v: is_int(v) and v >= 2, "an integer >= 2 (GRPO compares a group)")),
    "grpo.beta": number("[chosen: no KL term (TRL's default; no reference model in memory)]", 0.0, _ID, lo=0),
    "grpo.temperature": number("[chosen: sample at the model's own distribution]", 1.0, _ID, lo=0, lo_open=True),
    "grpo.max_completion_length": count("[chosen: all turns + tool results of one rollout, in tokens]", 4096),
    "grpo.max_turns": count("[chosen: tool-calling iterations per rollout]", 16),
    "grpo.loss_type": choice("[chosen: TRL 1.16's default token-level normalisation]", "dapo", LOSS_TYPES, _ID),
    "grpo.enable_thinking": ENABLE_THINKING,
    "grpo.grad_accum": count("optimizer step = one generation batch", 1),
    "grpo.use_vllm": choice('[ref: spa-qwen3 "GRPO via TRL 1.9.2 + vLLM colocate generation"] auto: on with CUDA + vllm, '
                            "off on CPU", "auto", ("auto", True, False), _ID, what="auto, true or false"),
    "grpo.trl": field("the trl release the run must train under (the job refuses another): null: the interpreter's "
                      "(pyproject pins 1.16.0); 1.9.2: the search_plan_act references' (python.grpo=.venv-trl1.9.2/bin/python, "
                      "`make venv-trl`); docs/stages/grpo.md lists what changes GRPO between the two", None, _ID,
                      Test(lambda v: v is None or (isinstance(v, str) and TRL_VERSION.fullmatch(v) is not None),
                           "null or a trl release such as 1.9.2 (three parts: 1.16 reads as a number)"), as_before=None),
    "grpo.vllm_gpu_memory_utilization": number("[chosen: leaves room for the policy's backward pass]", 0.3, _ID, lo=0, hi=1, lo_open=True),
    "grpo.split": choice("spa: task split trained on (search_plan_ood evaluates ood)", "train", ("train", "ood"), _ID, what="train or ood"),
    "grpo.prompts_file": text("qa: training questions in a bench format (HotpotQA train)", roles=_PATH_CONTENT),
    "grpo.qa_mode": choice("qa: context mode as evals' bench@mode: open (corpus) | item | given", "open", CONTEXT_MODES,
                           _ID, what=f"one of {', '.join(CONTEXT_MODES)} (evals' context modes)"),
    "grpo.retriever": choice("qa: bm25 (corpus=...) | e5 (corpus=..., encoder=..., index=...; as Search-R1, evals.dense) | "
                             "http (retriever_url=..., serve-retriever)", "bm25", ("bm25", "e5", "http"), _ID,
                             what="bm25, e5 or http"),
    "grpo.corpus": text("qa, retriever=bm25 or e5: wiki-18 style jsonl corpus, or a fetch-data name (corpus:wiki18)", roles=_PATH_CONTENT),
    "grpo.encoder": text("qa, retriever=e5: the E5 encoder (HF model dir or hub id, or the fetch-data name "
                         "encoder:e5-base-v2)", "intfloat/e5-base-v2", _MODEL_ID, as_before="intfloat/e5-base-v2"),
    "grpo.index": text("qa, retriever=e5: faiss IndexFlatIP file, row i = corpus line i (Search-R1's e5_Flat.index, or the "
                       "fetch-data name index:wiki18_e5_flat), memory-mapped; null -> built from the corpus",
                       roles=_PATH_CONTENT, as_before=None),
    "grpo.encoder_device": field("qa, retriever=e5: where the encoder runs (cpu | auto | cuda | cuda:N)", "cpu", _ID,
                                 Test(lambda v: v is None or (isinstance(v, str) and re.fullmatch(r"cpu|auto|cuda(:\d+)?", v) is not None),
                                      "cpu, auto, cuda or cuda:N"), as_before="cpu"),
    "grpo.retriever_url": text("qa, retriever=http: http://HOST:PORT/retrieve", roles=_ID),
    "grpo.retriever_timeout": number("qa, http: seconds per search request", 30.0, (), lo=0, lo_open=True),
    "grpo.retriever_retries": count("qa, http: retries of a failed request (1 s, 2 s, 4 s ... apart)", 3, (), lo=0),
    "grpo.max_search_failure_rate": number("[chosen: a tolerance for retriever failures] qa: a step whose failed searches "
                                           "exceed this share of its searches stops the run (exit 2); an unreachable "
                                           "retriever fails at start", 0.1, (), lo=0, hi=1),
    "grpo.topk": count("qa: documents per search, as evals", 3),
    "grpo.rollouts_logged": count("transcripts kept per step in rollouts/step-NNNNNN.jsonl", 8),
    "grpo.pilot_tasks": count("spa: adversarial pilot tasks checked before training", 200),
    "lora.r": count('[ref: spa-qwen3 "LoRA (r=32, alpha=64)"] the adapters\' rank', 32),
    "lora.alpha": number('[ref: spa-qwen3 "LoRA (r=32, alpha=64)"] the adapters\' scale (alpha / r)', 64, _ID, lo=0, lo_open=True),
    "lora.dropout": number("[chosen: no LoRA dropout; the references state none]", 0.0, _ID, lo=0, hi=1, hi_open=True),
    "lora.target_modules": field('[ref: spa-qwen3 "on all attention+MLP projections"] all seven',
                                 ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], _ID,
                                 list_of(lambda m: isinstance(m, str), "a non-empty list of module names", size=lambda n: n > 0)),
}
EXCLUDED_KEYS = excluded(SFT, GRPO)   # the run fingerprint's (both trainers': as one table before)


def problems(cfg: DictConfig) -> list[str]:
    """Every value of a GRPO config that the trainer would refuse, one line each naming the key (each key's
    rule is its field's, GRPO above; below, what depends on several keys)."""
    if missing := [f"{k}: missing from the config" for k in ("stage", "task", "grpo", "lora", "train", "launcher") if k not in cfg]:
        return missing
    bad = fields.problems(GRPO, cfg, must=True)
    g = cfg.grpo
    if not bad and g.completions_per_step % g.num_generations:
        bad.append(f"grpo.completions_per_step must be a multiple of grpo.num_generations={g.num_generations}, got {g.completions_per_step!r}")
    if cfg.task == "qa" and not bad:
        if not g.prompts_file:
            bad.append("task=qa needs grpo.prompts_file=PATH (FlashRAG-format training questions)")
        elif not (path := Path(str(g.prompts_file))).is_file():
            bad.append(f"grpo.prompts_file={g.prompts_file}: {'a directory, not a file' if path.is_dir() else 'no such file'}")
        try:   # item / given use the rows' own paragraphs, no retriever; a mistyped fetched name: the nearest names
            if g.qa_mode == "open" and (why := retriever_problem(g.retriever, g.corpus, g.get("index"), g.get("encoder"), g.retriever_url, "grpo.")):
                bad.append(why)
        except datafetch.DataError as exc:
            bad.append(str(exc))
    if not bad and parent_run(cfg.model.path) and not cfg.name:
        bad.append(f"model.path={cfg.model.path} is a checkpoint of an earlier run: set name=<variant> "
                   "(e.g. name=from_search_s100) so the GRPO run gets its own directory")
    return bad


def check_world(cfg: DictConfig, world: int) -> None:
    """Refuses (RlError) `world` processes that cannot split one step's completions evenly."""
    g = cfg.grpo
    if g.completions_per_step % (world * g.grad_accum):
        raise RlError(f"invalid config:\n  grpo.completions_per_step={g.completions_per_step} is not divisible by {world} "
                      f"process(es) x grpo.grad_accum={g.grad_accum}: each process generates completions_per_step / (processes "
                      "x grad_accum) completions per micro-step")


def validate(cfg: DictConfig) -> None:
    if bad := problems(cfg):
        raise RlError("invalid config:\n  " + "\n  ".join(bad))


def parent_run(path: str) -> dict | None:
    """{"run_dir", "checkpoint"} when the start is a checkpoint of an earlier run (its SHA256SUMS; run_dir: null unless
    it is `<run>/checkpoints/step-NNNNNN`, common.layout.checkpoint_of: a step that run wrote), else None."""
    if not (Path(str(path)).expanduser() / "SHA256SUMS").is_file():
        return None
    where = layout.checkpoint_of(p := Path(str(path)).expanduser().resolve())
    return {"run_dir": str(where[0]) if where else None, "checkpoint": str(p)}


def placement(cfg: DictConfig, world: int) -> tuple[Path, dict]:
    """A composed, validated config's run dir and run identity, once it suits `world` processes and the model (launch's
    one call into rl before it checks the run dir, a dry run's too)."""
    check_world(cfg, world)
    from rl.prompts import model_checks
    model_checks(cfg)
    return run_dir(cfg), run_identity(cfg)


def planned_saves(cfg: DictConfig) -> list[int]:
    """GRPO checkpoint steps (no epochs): common.plan's rule over `train.steps`."""
    return save_points(save_steps=cfg.train.save_steps, save_epoch_ends=False, per_epoch=0, total=int(cfg.train.steps))


def run_identity(cfg: DictConfig) -> dict:
    """The run identity as launch and rl.train compute it: every result-changing key, the reward rules' version and every
    input file the run reads by content (task=qa: its prompts, and in context mode open its corpus and e5 index), so a
    relaunch on a changed file is another configuration, whatever its path."""
    g, inputs = cfg.grpo, {}
    searches = cfg.task == "qa" and g.qa_mode == "open" and g.retriever in ("bm25", "e5")
    reads = {"grpo.prompts_file": cfg.task == "qa", "grpo.corpus": searches, "grpo.index": searches and g.retriever == "e5" and g.get("index") is not None}
    for key in (k for k, read in reads.items() if read):
        path = OmegaConf.select(cfg, key)
        try:
            inputs[key] = datafetch.digest(path) if datafetch.is_name(path) else fingerprint.file_digest(str(path))
        except OSError as exc:
            raise RlError(f"{key}={path}: cannot read it ({exc.strerror or exc})") from None
    return fingerprint.identity(cfg, EXCLUDED_KEYS, trainer_semantics=TRAINER_SEMANTICS, reward_semantics=REWARD_SEMANTICS, inputs=inputs)
