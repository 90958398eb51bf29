"""The recipe keys several stages share, defined once (common.fields): the run's, the launcher's, the interpreters' and
`enable_thinking`. Each stage's own sections are beside the code that reads them; its table (`SFT`, `GRPO`) adds these.
"""
from __future__ import annotations

import re
from pathlib import Path

from common import thinking
from common.fields import IDENTITY, NONEMPTY, OUTPUT, PATH, STATE, Field, Test, count, field, flag, is_int, list_of, text
from common.layout import is_complete_state, run_dir_path, variant_name_problem

# Bumped whenever a code change alters what an unchanged config means (e.g. the warmup
# definition): a run dir's state made under another value is not resumed (run identity).
# 2: warmup follows transformers' get_*_schedule_with_warmup (step 1 at lr 0; was one step ahead);
#    a step is global_batch_size trajectories, a record split into several rows being one.
TRAINER_SEMANTICS = 2

_ID, _OUTPUT = (IDENTITY,), (PATH, OUTPUT)
# a Slurm setting given as one #SBATCH option's value
_ONE_WORD = Test(lambda v: v is None or is_int(v) or (isinstance(v, str) and v.split() in ([], [v]) and not v.startswith(("[", "{"))),
                 "null or one word (not a list)")

# A key of GRPO and evaluate (grpo.enable_thinking, enable_thinking): one field.
ENABLE_THINKING = field("hybrid Qwen3 thinking switch: auto (not passed to the chat template) | true | false", "auto", _ID,
                        Test(lambda v: thinking.value_problem(v, "") is None, "auto, true or false"))

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
                    Test(lambda v: isinstance(v, str) and (v in ("auto", "never") or (v != "" and is_complete_state(v))),
                         "auto, never or a complete state directory (<run>/state/step-NNNNNN)")),
}

LAUNCHER: dict[str, Field] = {
    "launcher.kind": field("the launcher backend: local | slurm | another one a file launch/<kind>.py defines", "local", (),
                           NONEMPTY),   # launch.compose checks it names a backend
    "launcher.nproc": field("auto: the GPUs on this machine (1 gloo process without CUDA); slurm: gpus_per_node", "auto",
                            (), Test(lambda v: v == "auto" or (is_int(v) and v > 0), "auto or a positive integer")),
    "launcher.nodes": count("slurm: nodes per run", 1, ()),
    "launcher.gpus_per_node": field("slurm: GPUs (and torchrun processes) per node; 0: a CPU-only partition (no GPU asked, "
                                    "1 process)", 8, (), Test(lambda v: is_int(v) and v >= 0,
                                                              "an integer >= 0 (0: a CPU-only partition)")),
    "launcher.partition": field("slurm: #SBATCH --partition (null: the cluster's default)", None, (), _ONE_WORD),
    "launcher.time": field("slurm: #SBATCH --time of each job or array task, e.g. 24:00:00 (null: the partition's)", None, (), Test(
        lambda v: v in (None, "") or (is_int(v) and v >= 0) or bool(re.fullmatch(r"([0-9]+-)?[0-9]+(:[0-9]+){0,2}|(?i:unlimited|infinite)", str(v))),
        "null or a time sbatch --time takes (man sbatch): MINUTES, M:S, H:M:S, D-H, D-H:M, D-H:M:S or UNLIMITED (0: no limit)")),
    "launcher.account": field("slurm: #SBATCH --account", None, (), _ONE_WORD),
    "launcher.qos": field("slurm: #SBATCH --qos", None, (), _ONE_WORD),
    "launcher.sbatch": field("extra #SBATCH options, e.g. [--constraint=h100,--mem=0]", []),   # launch.slurm checks them
    "launcher.setup": field("shell run before each job's command (a training job's srun), e.g. \"module load cuda; "
                            "source env/bin/activate\" (a list: one line each)", None, (),
                            Test(lambda v: v is None or isinstance(v, str) or list_of(lambda x: isinstance(x, str), "").ok(v),
                                 "null, a shell snippet or a list of its lines")),
    "launcher.dry_run": flag("true: write the plan (and sbatch script) and print it; train nothing", False),
}
PYTHON: dict[str, Field] = {
    "python.sft": text("the interpreter of SFT training jobs (the training environment: CUDA torch, flash-attn); null: "
                       "the one running launch", as_before=None),
    "python.grpo": text("the interpreter of GRPO training jobs (with vllm for grpo.use_vllm=true); null: the one running launch", as_before=None),
    "python.eval": text("the interpreter of evaluation and aggregation jobs (a sweep's eval_profile=, analyze "
                        "launcher=slurm), asked first for what they need (vllm for backend=vllm); null: the one running "
                        "the command", as_before=None),
}


def run_dir(cfg) -> Path:
    """`<runs_root>/<arm>/[<name>/]seed<seed>` (common.layout; GRPO's arm: grpo_<task>) unless `run_dir` is set; absolute."""
    return (Path(cfg.run_dir).expanduser() if cfg.run_dir else run_dir_path(cfg.runs_root, cfg.arm, cfg.seed, cfg.name)).resolve()
