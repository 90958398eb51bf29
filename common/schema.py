"""Every recipe key of both trainers, defined once (common.fields): its default, its rule, its help and its
roles. `SFT` is `launch`'s keys (the trainer's, data_prep's `data:` section, the launcher's, the
interpreters'), `GRPO` is `launch stage=grpo`'s; the recipes under recipes/ only override these
defaults. From the tables come the composed base config (`keydoc.defaults`), each command's `--help`
and docs/keys page, the value checks (`problems`: launch checks a composed config and sft its
config.yaml with the same function, so the two can never disagree), the typed sections the trainers
read (`common.fields.section`) and the run fingerprint's exclusions (`EXCLUDED_KEYS`: every key
without the IDENTITY role, common.fingerprint).
"""
from __future__ import annotations

import re
from pathlib import Path

from common import thinking
from common.benchmarks import CONTEXT_MODES
from common.fields import (ABSENT, CONTENT, IDENTITY, MODEL, OUTPUT, PATH, PATHS, SOURCES, STATE, Default, Field,
                           Number, Range, Test, choice, field, flag, must_problems, number, text)
from common.layout import variant_name_problem

__all__ = ["ABSENT", "Number"]

# Bumped whenever a code change alters what an unchanged config means (e.g. the warmup
# definition): a run dir's state made under another value is not resumed (run identity).
# 2: warmup follows transformers' get_*_schedule_with_warmup (step 1 at lr 0; was one step ahead);
#    a step is global_batch_size trajectories, a record split into several rows being one.
TRAINER_SEMANTICS = 2

# data_prep's vocabularies (its readers and renderer check the same tuples)
REASONING_MODES = ("reasoning_content", "content")
HISTORY_POLICIES = ("exact", "keep_as_rendered", "reject")
THOUGHT_POLICIES = ("reject", "drop")
# TRL 1.16's GRPO losses that need no setting this config does not expose (luspo needs sequence-level
# importance sampling, vespo a vLLM correction setting).
LOSS_TYPES = ("dapo", "grpo", "dr_grpo", "bnpo", "cispo", "sapo")
# grpo.trl: a release number as pip spells it (1.9.2, 1.16.0, 1.17.0rc1)
TRL_VERSION = re.compile(r"\d+(\.\d+)+((a|b|rc|\.post|\.dev)\d+)?")

_ID, _PATH, _PATH_CONTENT, _OUTPUT = (IDENTITY,), (PATH,), (PATH, CONTENT), (PATH, OUTPUT)
_MODEL_ID = (IDENTITY, PATH, MODEL)   # a model directory or hub id: its spelling is part of the identity


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _count(help: str, default, roles=_ID, lo: int = 1, null: bool = False) -> Field:
    return number(help, default, roles, lo=lo, integer=True, null=null)


def _list_of(ok, what: str) -> Test:
    return Test(lambda v: v is not None and not isinstance(v, (str, int, float)) and all(ok(x) for x in v), what)


def _state(v) -> bool:
    return isinstance(v, str) and (v in ("auto", "never") or Path(v).is_dir())


def _slurm_text(help: str) -> Field:
    return field(help, None, (), Test(lambda v: v is None or isinstance(v, (str, int)), "null or a string"))


_BETA = Number(lo=0, hi=1, hi_open=True)
_NONEMPTY = Test(lambda v: isinstance(v, str) and v != "", "a non-empty string")
# A key of GRPO and evaluate (grpo.enable_thinking, enable_thinking): one field.
ENABLE_THINKING = field("hybrid Qwen3 thinking switch: auto (not passed to the chat template) | true | false", "auto", _ID,
                        Test(lambda v: thinking.value_problem(v, "") is None, "auto, true or false"))

# ---------------------------------------------------------------- the run: where it goes, how it starts
RUN: dict[str, Field] = {
    "arm": field("r2e | search | mixed | r2e_v5: the training arm (recipes/arm/<arm>.yaml)", "r2e", _ID, _NONEMPTY),
    "seed": _count("data sampling, model init and data order", 0, lo=0),
    "runs_root": field("where run directories go: <runs_root>/<arm>/[<name>/]seed<seed>", "runs", _OUTPUT,
                       Test(lambda v: isinstance(v, str) and v != "", "a directory path")),
    "name": field("variant name: run dir <runs_root>/<arm>/<name>/seed<seed> (another config of the arm)", None, (),
                  Test(lambda v: variant_name_problem(v) is None, "a name of letters, digits, '_' and '-' (starting "
                       "with a letter or digit, not seed<N>), or null")),
    "run_dir": field("null -> <runs_root>/<arm>/[<name>/]seed<seed>", None, _OUTPUT,
                     Test(lambda v: v is None or isinstance(v, str), "null or a directory path")),
    "resume": field("auto: continue from the latest complete state (same run identity) | never: rename the old run dir "
                    "aside, start over | PATH to a state dir", "auto", (PATH, STATE),
                    Test(_state, "auto, never or an existing state directory")),
}

# ---------------------------------------------------------------- the trainer's model / train / logging
MODEL: dict[str, Field] = {
    "model.name": field("the model's short name (run identity, wandb tag)", "qwen3_4b_thinking_2507", _ID, _NONEMPTY),
    "model.path": field("hub id or local directory", "Qwen/Qwen3-4B-Thinking-2507", _MODEL_ID, _NONEMPTY),
    "model.tokenizer": field("hub id or local directory of the tokenizer and chat template", "Qwen/Qwen3-4B-Thinking-2507",
                             _MODEL_ID, _NONEMPTY),
    "model.init": choice("pretrained | random (random init from the model's config)", "pretrained",
                         ("pretrained", "random"), _ID),
    "model.config": field("config overrides (the tiny model sets all of them)", {}, _ID, read=dict),
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
    "train.global_batch_size": _count("trajectories per optimizer step", 16),
    "train.max_tokens_per_micro_batch": _count(">= data.max_seq_len: a packed micro-batch never splits a trajectory",
                                               32768, lo=2),   # a shifted label needs 2 tokens
    "train.lr": number("peak learning rate (AdamW)", 1.0e-5, _ID, lo=0, lo_open=True),
    "train.betas": field("AdamW betas", [0.9, 0.999], _ID,
                         Test(lambda v: v is not None and not isinstance(v, (str, int, float)) and len(v) == 2
                              and all(_BETA.ok(b) for b in v), "two numbers in [0, 1)"),
                         read=lambda v: (float(v[0]), float(v[1]))),
    "train.eps": number("AdamW epsilon", 1.0e-8, _ID, lo=0, lo_open=True),
    "train.weight_decay": number("AdamW weight decay", 0.0, _ID, lo=0),
    "train.lr_schedule": choice("cosine | linear | constant, as transformers' get_*_schedule_with_warmup", "cosine",
                                ("cosine", "linear", "constant"), _ID),
    "train.warmup_ratio": number("warmup steps = ceil(warmup_ratio x steps)", 0.03, _ID, lo=0, hi=1, hi_open=True),
    "train.min_lr_ratio": number("floor of the cosine schedule, as a fraction of lr", 0.0, _ID, lo=0, hi=1),
    "train.grad_clip": number("gradient-norm clipping threshold", 1.0, _ID, lo=0, lo_open=True, null=True),
    "train.steps": _count("optimizer steps; null -> epochs * floor(n / global_batch_size)", None, null=True),
    "train.epochs": _count("passes over the data when steps is null", 1),
    "train.save_steps": field("the final step is always saved", [50, 100, 150, 200], _ID,
                              _list_of(Number(lo=1, integer=True).ok, "a list of positive integers, e.g. [50,100]"),
                              read=lambda v: tuple(sorted(set(v)))),
    "train.save_epoch_ends": flag("also save at every epoch boundary (218 = epoch 1)", True, _ID),
    "train.state_every": _count("resumable state cadence (and on SIGTERM / SIGUSR1)", 25, ()),
    "train.activation_checkpointing": flag("recompute activations in the backward pass (less memory)", True, _ID),
    "train.precision": choice("auto: bf16 on GPU, fp32 on CPU | bf16 | fp32", "auto", ("auto", "bf16", "fp32"), _ID),
    "train.max_consecutive_nonfinite": _count("non-finite gradient norms in a row before the run exits with code 3", 5, ()),
    "train.peak_tflops": field("for MFU; auto: looked up from the GPU name", "auto", (),
                               Range(Number(lo=0, lo_open=True, null=True, words=("auto",))),
                               read=lambda v: None if v == "auto" else float(v)),
    "train.log_every": _count("steps between console lines (metrics.jsonl has every step)", 1, ()),
}
LOGGING: dict[str, Field] = {
    "logging.wandb": flag("false: no wandb run at all", True),
    "logging.project": text("null -> $WANDB_PROJECT, else dtsft"),
    "logging.entity": text("null -> $WANDB_ENTITY, else the account's default"),
    "logging.group": text("null -> $WANDB_RUN_GROUP, else the study (last component of runs_root)"),
    "logging.tags": field("added to arm:<arm> seed:<seed> model:<name> stage:<stage>", [], (),
                          Test(lambda v: v is not None and not isinstance(v, str) and all(isinstance(t, (str, int)) for t in v),
                               "a list of strings, e.g. [ablation,lr-sweep]"), read=tuple),
    "logging.name": text("null -> <arm>-s<seed>"),
    "logging.mode": choice("online|offline|disabled; auto: $WANDB_MODE, else online when logged in (key or netrc)", "auto",
                           ("auto", "online", "offline", "disabled")),
}
# What sft.train checks in its config.yaml (launch checks these and the rest of SFT).
TRAINER: dict[str, Field] = {"arm": RUN["arm"], "seed": RUN["seed"], **MODEL, **TRAIN, **LOGGING}

# ---------------------------------------------------------------- data_prep's `data:` section (relative keys)
DATA: dict[str, Field] = {
    "kind": choice("hub | synthetic", "hub", ("hub", "synthetic"), _ID),
    "n": _count("trajectories per arm (mixed: n/2 + n/2)", 3500),
    "epilogue": flag("dual terminator; false builds the single-terminator baseline", True, _ID),
    "reasoning": choice("free-text thoughts before a call -> reasoning_content | content", "reasoning_content",
                        REASONING_MODES, _ID),
    "history_reasoning": choice("exact | keep_as_rendered (INEXACT: trains turns as the template rewrites them) | reject",
                                "exact", HISTORY_POLICIES, _ID),
    "thoughts": choice("thoughts a template can't render (Llama-3.1): reject | drop (INEXACT, counted)", "reject",
                       THOUGHT_POLICIES, _ID),
    "max_seq_len": _count("tokens per trajectory; longer ones follow length_policy", 32768, lo=16),
    "length_policy": choice("drop | truncate", "drop", ("drop", "truncate"), _ID),
    "max_record_bytes": _count("records larger than this (JSON bytes) rejected before rendering; null = 16 (truncate: 64) "
                               "x max_seq_len", None, null=True),
    "allow_fewer": flag("true: build with fewer than n usable records instead of failing", False, _ID),
    "strict": flag("true: any rejected record fails the build (exit 1)", False, _ID),
    "decontam": field("extra evaluation jsonl files to decontaminate against", [], (IDENTITY, PATH, PATHS)),
    "decontam_bench_root": text("your own dir laid out as <bench>/*.jsonl: every record checked against all 7 benches",
                                roles=(IDENTITY, PATH)),
    "decontam_sets": field("named item sets (fetch-data names, fetched into $DTSFT_DATA on first use) to check against",
                           [], _ID, _list_of(lambda n: isinstance(n, str), "a list of data names such as [nq:seed42_1000]")),
    "decontam_drop": flag("true: drop records that overlap an evaluation question (default: report them)", False, _ID),
    "decontam_ngram": _count("n-gram length of the overlap check", 13),
    "sources.code": field("code-arm sources, [FORMAT:PATH_OR_HUB_ID[@REV][#split],...]; [] -> the arm recipe's", [],
                          (IDENTITY, PATH, SOURCES)),
    "sources.search": field("search-arm sources, same form as sources.code", [], (IDENTITY, PATH, SOURCES)),
    "synthetic": field("data=synthetic generator knobs (synthetic.KNOB=V: code_turns, n_entities, world_seed, ...)", {},
                       _ID),
    "heldout": text("a `data-prep heldout` dir: every record whose content it holds is left out of the arm (rejected, "
                    "reason heldout)", roles=_PATH_CONTENT),
    "cache_root": text("null -> <runs_root>/_data", roles=_OUTPUT),
    "dir": text("the dataset directory; launch fills it from the cache", roles=_PATH),
}

# ---------------------------------------------------------------- the launcher and the interpreters
LAUNCHER: dict[str, Field] = {
    "launcher.kind": field("the launcher backend: local | slurm | another one launch/jobs.py BACKENDS names", "local", (),
                           _NONEMPTY),   # launch.compose checks it names a backend
    "launcher.nproc": field("auto: the GPUs on this machine (1 gloo process without CUDA); slurm: gpus_per_node", "auto",
                            (), Test(lambda v: v == "auto" or (_int(v) and v > 0), "auto or a positive integer")),
    "launcher.nodes": _count("slurm: nodes per run", 1, ()),
    "launcher.gpus_per_node": field("slurm: GPUs (and torchrun processes) per node; 0: a CPU-only partition (no GPU asked, "
                                    "1 process)", 8, (), Test(lambda v: _int(v) and v >= 0,
                                                              "an integer >= 0 (0: a CPU-only partition)")),
    "launcher.partition": _slurm_text("slurm: #SBATCH --partition"),
    "launcher.time": _slurm_text("slurm: #SBATCH --time, e.g. 24:00:00"),
    "launcher.account": _slurm_text("slurm: #SBATCH --account"),
    "launcher.qos": _slurm_text("slurm: #SBATCH --qos"),
    "launcher.sbatch": field("extra #SBATCH options, e.g. [--constraint=h100,--mem=0]", []),   # launch.slurm checks them
    "launcher.setup": field('shell run before srun, e.g. "module load cuda; source env/bin/activate"', None, (),
                            Test(lambda v: v is None or isinstance(v, str), "null or a shell snippet")),
    "launcher.dry_run": flag("true: write the plan (and sbatch script) and print it; train nothing", False),
}
PYTHON: dict[str, Field] = {
    "python.sft": text("the interpreter of SFT training jobs (the training environment: CUDA torch, flash-attn); null: "
                       "the one running launch"),
    "python.grpo": text("the interpreter of GRPO training jobs (with vllm for grpo.use_vllm=true); null: the one running "
                        "launch"),
    "python.eval": text("the interpreter of evaluation and aggregation jobs (a sweep's eval_profile=, analyze "
                        "launcher=slurm), asked first for what they need (vllm for backend=vllm); null: the one running "
                        "the command"),
}

SFT: dict[str, Field] = {**RUN, **MODEL, **{f"data.{k}": f for k, f in DATA.items()}, **TRAIN, **LOGGING, **LAUNCHER,
                         **PYTHON}

# ---------------------------------------------------------------- GRPO (stage=grpo)
# A `[ref: ...]` mark quotes the reference system that states the value (LoRA GRPO on search_plan_act); a
# `[chosen: ...]` mark is this project's choice, not stated by the reference (docs/stages/grpo.md says why).
GRPO_OWN: dict[str, Field] = {
    "stage": choice("grpo (set by stage=grpo on the command line)", "grpo", ("grpo",), _ID, what="grpo"),
    "task": choice("spa | qa  -> arm grpo_<task>", "spa", ("spa", "qa"), _ID, what="spa or qa"),
    "train.steps#grpo": _count('[ref: spa-qwen3 "250 steps"] optimizer steps', 250),
    "grpo.completions_per_step": _count('[ref: spa-qwen3 "effective batch size 32"] completions per optimizer step', 32),
    "grpo.num_generations": field("[chosen: group size G: 4 prompts x 8 completions per step]", 8, _ID,
                                  Test(lambda v: _int(v) and v >= 2, "an integer >= 2 (GRPO compares a group)")),
    "grpo.beta": number("[chosen: no KL term (TRL's default; no reference model in memory)]", 0.0, _ID, lo=0),
    "grpo.temperature": number("[chosen: sample at the model's own distribution]", 1.0, _ID, lo=0, lo_open=True),
    "grpo.max_completion_length": _count("[chosen: all turns + tool results of one rollout, in tokens]", 4096),
    "grpo.max_turns": _count("[chosen: tool-calling iterations per rollout]", 16),
    "grpo.loss_type": choice("[chosen: TRL 1.16's default token-level normalisation]", "dapo", LOSS_TYPES, _ID),
    "grpo.enable_thinking": ENABLE_THINKING,
    "grpo.grad_accum": _count("optimizer step = one generation batch", 1),
    "grpo.use_vllm": choice('[ref: spa-qwen3 "GRPO via TRL 1.9.2 + vLLM colocate generation"] auto: on with CUDA + vllm, '
                            "off on CPU", "auto", ("auto", True, False), _ID, what="auto, true or false"),
    "grpo.trl": field("the trl release the run must train under (the job refuses another): null: the interpreter's "
                      "(pyproject pins 1.16.0); 1.9.2: the search_plan_act references' (python.grpo=.venv-trl1.9.2/bin/python, "
                      "`make venv-trl`); docs/stages/grpo.md lists what changes GRPO between the two", None, _ID,
                      Test(lambda v: v is None or (isinstance(v, str) and TRL_VERSION.fullmatch(v) is not None),
                           "null or a trl release such as 1.9.2 (three parts: 1.16 reads as a number)")),
    "grpo.vllm_gpu_memory_utilization": number("[chosen: leaves room for the policy's backward pass]", 0.3, _ID,
                                               lo=0, hi=1, lo_open=True),
    "grpo.split": choice("spa: task split trained on (search_plan_ood evaluates ood)", "train", ("train", "ood"), _ID,
                         what="train or ood"),
    "grpo.prompts_file": text("qa: training questions in a bench format (HotpotQA train)", roles=_PATH_CONTENT),
    "grpo.qa_mode": choice("qa: context mode as evals' bench@mode: open (corpus) | item | given", "open", CONTEXT_MODES,
                           _ID, what=f"one of {', '.join(CONTEXT_MODES)} (evals' context modes)"),
    "grpo.retriever": choice("qa: bm25 (corpus=...) | e5 (corpus=..., encoder=..., index=...; as Search-R1, evals.dense) | "
                             "http (retriever_url=..., serve-retriever)", "bm25", ("bm25", "e5", "http"), _ID,
                             what="bm25, e5 or http"),
    "grpo.corpus": text("qa, retriever=bm25 or e5: wiki-18 style jsonl corpus, or a fetch-data name (corpus:wiki18)",
                        roles=_PATH_CONTENT),
    "grpo.encoder": text("qa, retriever=e5: the E5 encoder (HF model dir or hub id, or the fetch-data name "
                         "encoder:e5-base-v2)", "intfloat/e5-base-v2", _MODEL_ID),
    "grpo.index": text("qa, retriever=e5: faiss IndexFlatIP file, row i = corpus line i (Search-R1's e5_Flat.index, or the "
                       "fetch-data name index:wiki18_e5_flat), memory-mapped; null -> built from the corpus",
                       roles=_PATH_CONTENT),
    "grpo.encoder_device": field("qa, retriever=e5: where the encoder runs (cpu | auto | cuda | cuda:N)", "cpu", _ID),
    "grpo.retriever_url": text("qa, retriever=http: http://HOST:PORT/retrieve", roles=_ID),
    "grpo.retriever_timeout": number("qa, http: seconds per search request", 30.0, (), lo=0, lo_open=True),
    "grpo.retriever_retries": _count("qa, http: retries of a failed request (1 s, 2 s, 4 s ... apart)", 3, (), lo=0),
    "grpo.max_search_failure_rate": number("[chosen: a tolerance for retriever failures] qa: a step whose failed searches "
                                           "exceed this share of its searches stops the run (exit 2); an unreachable "
                                           "retriever fails at start", 0.1, (), lo=0, hi=1),
    "grpo.topk": _count("qa: documents per search, as evals", 3),
    "grpo.rollouts_logged": _count("transcripts kept per step in rollouts/step-NNNNNN.jsonl", 8),
    "grpo.pilot_tasks": _count("spa: adversarial pilot tasks checked before training", 200),
    "lora.r": _count('[ref: spa-qwen3 "LoRA (r=32, alpha=64)"] the adapters\' rank', 32),
    "lora.alpha": number('[ref: spa-qwen3 "LoRA (r=32, alpha=64)"] the adapters\' scale (alpha / r)', 64, _ID, lo=0,
                         lo_open=True),
    "lora.dropout": number("[chosen: no LoRA dropout; the references state none]", 0.0, _ID, lo=0, hi=1, hi_open=True),
    "lora.target_modules": field('[ref: spa-qwen3 "on all attention+MLP projections"] all seven',
                                 ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], _ID,
                                 Test(lambda v: v is not None and not isinstance(v, str) and len(v) > 0
                                      and all(isinstance(m, str) for m in v), "a non-empty list of module names")),
}
_T = TRAIN
GRPO: dict[str, Field | Default] = {
    "seed": RUN["seed"], "runs_root": RUN["runs_root"],
    "name": Default(RUN["name"], None, "required when model.path is an SFT checkpoint (e.g. name=from_search_s100);"),
    "run_dir": RUN["run_dir"], "resume": RUN["resume"],
    **{k: MODEL[k] for k in ("model.name", "model.path", "model.gpu_only", "model.attn_implementation")},
    "train.steps": GRPO_OWN["train.steps#grpo"],
    "train.save_steps": Default(_T["train.save_steps"], [50, 100, 150, 200], "[chosen: a checkpoint every 50 steps for "
                                "the per-step curves; the GRPO references state no saves]"),
    "train.state_every": Default(_T["train.state_every"], 10, "[chosen]"),
    "train.lr": Default(_T["train.lr"], 1.0e-5, "[chosen: a common LoRA-GRPO step for 4-8B models (TRL 1.16's default: "
                        "1e-6)]"),
    "train.lr_schedule": Default(_T["train.lr_schedule"], "constant", "[chosen: as SFT's (TRL's default: linear decay to "
                                 "0)]"),
    "train.warmup_ratio": Default(_T["train.warmup_ratio"], 0.0, "[chosen: as SFT's (TRL's default: 0)]"),
    **{k: _T[k] for k in ("train.min_lr_ratio", "train.betas", "train.eps", "train.weight_decay", "train.grad_clip",
                          "train.activation_checkpointing")},
    "train.precision": Default(_T["train.precision"], "auto", "merged checkpoints are saved in it;"),
    **LOGGING, **LAUNCHER, **PYTHON, "stage": GRPO_OWN["stage"], "task": GRPO_OWN["task"],
    **{k: f for k, f in GRPO_OWN.items() if k.startswith(("grpo.", "lora."))},
}


def _excluded(*tables: dict) -> tuple[str, ...]:
    """The run fingerprint's exclusions: every key without the IDENTITY role, a whole section when none of
    its keys has it (so a key an old config.yaml holds below it is left out too)."""
    keys = {k: f for t in tables for k, f in t.items()}
    sections: dict[str, list[bool]] = {}
    for k, f in keys.items():
        head, dot, _ = k.partition(".")
        if dot:
            sections.setdefault(head, []).append(IDENTITY in f.roles)
    whole = tuple(s for s, ids in sections.items() if not any(ids))
    return whole + tuple(k for k, f in keys.items() if IDENTITY not in f.roles and k.split(".")[0] not in whole)


EXCLUDED_KEYS = _excluded(SFT, GRPO)


def problems(cfg) -> list[str]:
    """Every trainer key of `cfg` (a dict or an omegaconf config) that is missing or invalid (model.license
    may be absent: a config written before it states no licence)."""
    return must_problems(TRAINER, cfg, optional=("model.license",))
