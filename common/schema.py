"""The recipe keys several stages share, defined once (common.fields): the run's (where it goes, how it
starts), data_prep's `data:` section, the launcher's and the interpreters' (and evaluate's and GRPO's one
`enable_thinking`). Each stage defines the sections it reads beside the code that reads them (sft.config:
model, train and logging, with the console's cadence from sft.console; rl.config: GRPO's) and assembles its
command's table from them and from these: `sft.config.SFT` is `launch`'s keys, `rl.config.GRPO` is `launch
stage=grpo`'s; the recipes under recipes/ only override their defaults.
"""
from __future__ import annotations

from pathlib import Path

from common import thinking
from common.fields import (CONTENT, IDENTITY, NONEMPTY, OUTPUT, PATH, PATHS, SOURCES, STATE, Field, Test, choice, count,
                           field, flag, is_int, list_of, text)
from common.layout import variant_name_problem

# Bumped whenever a code change alters what an unchanged config means (e.g. the warmup
# definition): a run dir's state made under another value is not resumed (run identity).
# 2: warmup follows transformers' get_*_schedule_with_warmup (step 1 at lr 0; was one step ahead);
#    a step is global_batch_size trajectories, a record split into several rows being one.
TRAINER_SEMANTICS = 2

# data_prep's vocabularies (its readers and renderer check the same tuples)
REASONING_MODES = ("reasoning_content", "content")
HISTORY_POLICIES = ("exact", "keep_as_rendered", "reject")
THOUGHT_POLICIES = ("reject", "drop")

_ID, _PATH, _PATH_CONTENT, _OUTPUT = (IDENTITY,), (PATH,), (PATH, CONTENT), (PATH, OUTPUT)


def _state(v) -> bool:
    return isinstance(v, str) and (v in ("auto", "never") or Path(v).is_dir())


def _slurm_text(help: str) -> Field:
    return field(help, None, (), Test(lambda v: v is None or isinstance(v, (str, int)), "null or a string"))


# A key of GRPO and evaluate (grpo.enable_thinking, enable_thinking): one field.
ENABLE_THINKING = field("hybrid Qwen3 thinking switch: auto (not passed to the chat template) | true | false", "auto", _ID,
                        Test(lambda v: thinking.value_problem(v, "") is None, "auto, true or false"))

# ---------------------------------------------------------------- the run: where it goes, how it starts
RUN: dict[str, Field] = {
    "arm": field("r2e | search | mixed | r2e_v5: the training arm (recipes/arm/<arm>.yaml)", "r2e", _ID, NONEMPTY),
    "seed": count("data sampling, model init and data order", 0, lo=0),
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

# ---------------------------------------------------------------- data_prep's `data:` section (relative keys)
DATA: dict[str, Field] = {
    "kind": choice("hub | synthetic", "hub", ("hub", "synthetic"), _ID),
    "n": count("trajectories per arm (mixed: n/2 + n/2)", 3500),
    "epilogue": flag("dual terminator; false builds the single-terminator baseline", True, _ID),
    "reasoning": choice("free-text thoughts before a call -> reasoning_content | content", "reasoning_content",
                        REASONING_MODES, _ID),
    "history_reasoning": choice("exact | keep_as_rendered (INEXACT: trains turns as the template rewrites them) | reject",
                                "exact", HISTORY_POLICIES, _ID),
    "thoughts": choice("thoughts a template can't render (Llama-3.1): reject | drop (INEXACT, counted)", "reject",
                       THOUGHT_POLICIES, _ID),
    "max_seq_len": count("tokens per trajectory; longer ones follow length_policy", 32768, lo=16),
    "length_policy": choice("drop | truncate", "drop", ("drop", "truncate"), _ID),
    "max_record_bytes": count("records larger than this (JSON bytes) rejected before rendering; null = 16 (truncate: 64) "
                               "x max_seq_len", None, null=True),
    "allow_fewer": flag("true: build with fewer than n usable records instead of failing", False, _ID),
    "strict": flag("true: any rejected record fails the build (exit 1)", False, _ID),
    "decontam": field("extra evaluation jsonl files to decontaminate against", [], (IDENTITY, PATH, PATHS)),
    "decontam_bench_root": text("your own dir laid out as <bench>/*.jsonl: every record checked against all 7 benches",
                                roles=(IDENTITY, PATH)),
    "decontam_sets": field("named item sets (fetch-data names, fetched into $DTSFT_DATA on first use) to check against",
                           [], _ID, list_of(lambda n: isinstance(n, str), "a list of data names such as [nq:seed42_1000]")),
    "decontam_drop": flag("true: drop records that overlap an evaluation question (default: report them)", False, _ID),
    "decontam_ngram": count("n-gram length of the overlap check", 13),
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
    "launcher.kind": choice("local | slurm", "local", ("local", "slurm")),
    "launcher.nproc": field("auto: the GPUs on this machine (1 gloo process without CUDA); slurm: gpus_per_node", "auto",
                            (), Test(lambda v: v == "auto" or (is_int(v) and v > 0), "auto or a positive integer")),
    "launcher.nodes": count("slurm: nodes per run", 1, ()),
    "launcher.gpus_per_node": field("slurm: GPUs (and torchrun processes) per node; 0: a CPU-only partition (no GPU asked, "
                                    "1 process)", 8, (), Test(lambda v: is_int(v) and v >= 0,
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
