"""The GRPO trainer: `python -m rl.train <run_dir>/config.yaml`, started by launch under torchrun.

TRL's GRPOTrainer (a transformers Trainer) does generation, the multi-turn tool loop over the
environment, rewards, the GRPO loss and the LoRA update; it runs on `accelerate`'s process state,
which under torchrun picks up RANK/WORLD_SIZE itself (no `accelerate launch`). This module adds what
a run directory needs around it:

1. `checkpoints/step-000000`: the starting model (rl.checkpoint), from which training loads;
2. the adversarial pilot guard (task=spa): a reward that a scripted hack can farm within the
   required margin of genuine play is refused (exit 2, the pilot table);
3. LoRA (r, alpha, the seven projections) on the policy; TRL's tool-calling loop with the
   training-side chat template and the evals tool-call parser (rl.chat);
4. per step: `metrics.jsonl` (loss, lr, reward and each component, tool calls per rollout, tool
   failures, completion length, KL when beta > 0, tokens/s), `rollouts/step-NNNNNN.jsonl` (sampled
   transcripts with rewards), merged checkpoints at the save steps, resumable `state/`;
5. SIGTERM / SIGUSR1: state at the next step boundary, exit 0; the next launch continues at the next
   step, the lr schedule (train.lr_schedule over all train.steps, `run_scheduler`) from its saved
   state, each rank's RNG from where that state left it (`Run.restore_rng`): on one CPU process with the
   same seed and the same rollouts, the resumed run's updates are the uninterrupted run's bit for bit
   (tests/test_rl_schedule.py, with scripted generation);
6. `DONE` after the final step.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import sys
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from common import fingerprint, layout, lock, thinking
from common.interpreter import installed_trl, trl_problem
from common.io import check_sha256sums, write_json
from common.plan import late_saves
from rl import chat, checkpoint as rlck
from rl.config import GRPO, planned_saves, run_identity, validate, check_world
from rl.errors import RlError
from rl.envs import environment_for, reward_funcs_for
from rl.prompts import model_checks, prompts_per_step, rows
from common.preempt import PreemptionFlag
from common.tracking import MetricsLog, Wandb
from sft.checkpoint import step_name
from sft.optim import NonFiniteError
from sft.train import EXIT_NONFINITE

log = logging.getLogger("rl.train")


def load_config(path: str | Path) -> DictConfig:
    return OmegaConf.load(path)


def on_gpu() -> bool:
    return torch.cuda.is_available()


def training_dtype(cfg: DictConfig) -> torch.dtype:
    p = cfg.train.precision
    if p == "auto":
        p = "bf16" if on_gpu() else "fp32"
    return torch.bfloat16 if p == "bf16" else torch.float32


def use_vllm(cfg: DictConfig) -> bool:
    import importlib.util

    v = cfg.grpo.use_vllm
    if v == "auto":
        return on_gpu() and importlib.util.find_spec("vllm") is not None
    return bool(v)


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def pilot_guard(cfg: DictConfig) -> str | None:
    """None when the reward passes the adversarial pilot on the training split, else the table."""
    from envs.search_plan_act import run_pilot

    res = run_pilot(split=str(cfg.grpo.split), tasks=int(cfg.grpo.pilot_tasks), seed=int(cfg.seed), progress=False)
    return None if res.ok else res.table()


class SearchFailureError(RlError):
    """Too many of a step's searches failed (a dead or overloaded retriever): the run stops (exit 2)."""


class CountingRetriever:
    """The run's retriever, counting searches and failed searches (a failure still reaches the policy
    as TRL's tool error, and is counted against `grpo.max_search_failure_rate` at the step's end)."""

    def __init__(self, inner):
        self.inner = inner
        self.searches = 0
        self.failures = 0
        self.last_error = ""

    def search(self, queries: list[str], topk: int) -> list[list[dict]]:
        self.searches += 1
        try:
            return self.inner.search(queries, topk)
        except Exception as exc:
            self.failures += 1
            self.last_error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise

    def take(self) -> tuple[int, int, str]:
        """(searches, failures, last error) since the last call; the counters restart."""
        out = (self.searches, self.failures, self.last_error)
        self.searches, self.failures, self.last_error = 0, 0, ""
        return out


def make_retriever(cfg: DictConfig, probe: bool = True) -> CountingRetriever:
    """The qa retriever (grpo.retriever, .corpus, .encoder / .index / .encoder_device (e5) / .retriever_url,
    .retriever_timeout, .retriever_retries);
    `probe`: one search first, so an unreachable server is a start-up error (RetrieverError, exit 2)."""
    from evals.retrievers import RetrieverError, make_retriever as _make

    inner = _make(OmegaConf.create({"retriever": cfg.grpo.retriever, "corpus": cfg.grpo.corpus, "index_dir": None,
                                    "encoder": cfg.grpo.get("encoder"), "index": cfg.grpo.get("index"),
                                    "encoder_device": cfg.grpo.get("encoder_device") or "cpu",
                                    "retriever_url": cfg.grpo.retriever_url,
                                    "retriever_timeout": float(cfg.grpo.retriever_timeout),
                                    "retriever_retries": int(cfg.grpo.retriever_retries)}))
    if probe:
        try:
            inner.search(["retriever start-up check"], 1)
        except RetrieverError as exc:  # a bad input (exit 2, one line), not a crash
            raise RlError(f"grpo.retriever={cfg.grpo.retriever}: the retriever does not answer at start: {exc}") from None
    return CountingRetriever(inner)


def check_finite(model, step: int) -> None:
    """NonFiniteError (exit 3, as sft.train's guard) when a trained weight is no longer finite: a non-finite loss or
    gradient reached it, and every later step, checkpoint and evaluation would carry it."""
    bad = [n for n, p in model.named_parameters() if p.requires_grad and not bool(torch.isfinite(p).all())]
    if bad:
        raise NonFiniteError(f"step {step}: {len(bad)} trained weight tensor(s) are not finite ({bad[0]}{', ...' if len(bad) > 1 else ''}) "
                             "after the update; stopping before this step's checkpoint and state are written (the last state "
                             "resumes). Lower train.lr, or inspect this step's rollouts/ file")


def check_search_failures(step: int, searches: int, failures: int, rate: float, last: str) -> None:
    """SearchFailureError when more than `rate` of the step's `searches` failed (all ranks' counts)."""
    if searches and failures / searches > rate:
        raise SearchFailureError(
            f"step {step}: {failures} of {searches} searches failed ({failures / searches:.0%} > "
            f"grpo.max_search_failure_rate={rate:g}); the policy would be rewarded on error messages. "
            f"Last error: {last or 'see the log'}. Fix the retriever, then re-run to resume from the last state")


def preflight(cfg: DictConfig, probe_retriever: bool = True) -> str | None:
    """Everything the trainer refuses before training, in the trainer's own words: the config
    (rl.config.problems, the schema launch checks too; a save step past train.steps: common.plan.late_saves), the chat
    template (rl.chat.install: grpo.enable_thinking, tool calls), a grpo.max_completion_length the model's context
    cannot hold with the longest prompt (context_problem),
    the run dir's `rollouts` and `step-000000`, the prompts file, and (`probe_retriever`) a qa retriever that does not answer: RlError / BenchError /
    RetrieverError, exit 2, one line. Then task=spa's adversarial pilot (pilot_guard): its table when a
    reward hack comes within the required margin of genuine play, else None. Launch calls it before it
    writes a run dir; the trainer again at start."""
    validate(cfg)
    if late := late_saves(cfg.train, None, GRPO):   # as launch refuses it (launch.compose)
        raise RlError(late[0])
    model_checks(cfg)
    rd = Path(cfg.run_dir)
    rollouts, start = rd / layout.ROLLOUTS, layout.checkpoint_dir(rd, 0)
    if rollouts.exists() and not rollouts.is_dir():
        raise RlError(f"{rollouts} is a file, not the run's rollouts directory; move it aside")
    if start.exists() and not (start / "SHA256SUMS").is_file():
        raise RlError(f"{start} exists without SHA256SUMS: it is not a starting-model copy this trainer wrote "
                      "(or its copy was torn); move it aside and re-run")
    if cfg.task == "qa":
        from rl.envs import qa_rows

        qa_rows(str(cfg.grpo.prompts_file), 0, 1)  # a bad prompts file: BenchError naming file:line
        if probe_retriever and cfg.grpo.qa_mode == "open" and cfg.grpo.retriever == "http":
            make_retriever(cfg)
    return pilot_guard(cfg) if cfg.task == "spa" else None


def grpo_args(cfg: DictConfig, rd: Path, steps: int):
    from trl import GRPOConfig

    g, t = cfg.grpo, cfg.train
    per_device = int(g.completions_per_step) // (world_size() * int(g.grad_accum))
    if per_device * world_size() * int(g.grad_accum) != int(g.completions_per_step):
        raise ValueError(f"grpo.completions_per_step={g.completions_per_step} is not divisible by "
                         f"world size {world_size()} x grpo.grad_accum={g.grad_accum}")
    vllm = use_vllm(cfg)
    # transformers renamed gradient_checkpointing to activation_checkpointing (the old name warns where both
    # exist); .venv-vllm's pinned transformers (5.19) knows only the old one
    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    checkpointing = "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
    return GRPOConfig(
        output_dir=str(rd / "trl"), use_cpu=not on_gpu(), bf16=training_dtype(cfg) == torch.bfloat16,
        max_steps=steps, per_device_train_batch_size=per_device, gradient_accumulation_steps=int(g.grad_accum),
        num_generations=int(g.num_generations), max_completion_length=int(g.max_completion_length),
        max_tool_calling_iterations=int(g.max_turns), temperature=float(g.temperature), beta=float(g.beta),
        # The schedule TRL would build from these spans only this segment's steps; the trainer's
        # create_scheduler builds the run's own instead (run_scheduler), so these two are not read.
        loss_type=str(g.loss_type), learning_rate=float(t.lr), lr_scheduler_type="constant", warmup_steps=0,
        adam_beta1=float(t.betas[0]), adam_beta2=float(t.betas[1]), adam_epsilon=float(t.eps),
        weight_decay=float(t.weight_decay), max_grad_norm=float(t.grad_clip) if t.grad_clip else 0.0,
        **{checkpointing: bool(t.activation_checkpointing)}, shuffle_dataset=False, seed=int(cfg.seed),
        logging_steps=1, save_strategy="no", report_to=[],  # metrics.jsonl + wandb through sft.metrics
        # Every LoRA parameter takes part in every forward pass: DDP need not search for unused ones (transformers
        # would turn the search on without activation checkpointing, and DDP then warns that it found none).
        ddp_find_unused_parameters=False,
        use_vllm=vllm, vllm_mode="colocate", vllm_gpu_memory_utilization=float(g.vllm_gpu_memory_utilization),
        disable_tqdm=True, chat_template_kwargs=thinking.template_kwargs(g.enable_thinking),  # every render TRL does
    )


# A model below this many parameters gets one CPU thread per process: its matmuls are too small to split, the
# threads only wait on each other (and spin, on a machine busy with other work). The tiny base's documented GRPO
# run on the idle 2-core box: 29 s with OMP_NUM_THREADS=1 (docs/benchmarks.md), 38 s with torch's default of two.
SMALL_MODEL_PARAMS = 50_000_000


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, which a cgroup or `taskset` narrows)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:   # not Linux
        return os.cpu_count() or 1


def cpu_threads(cpus: int, local_world: int, params: int | None) -> int:
    """Intra-op threads of one CPU trainer process: one for a small model (SMALL_MODEL_PARAMS), else its share of
    the machine's CPUs among the `local_world` trainer processes on it."""
    if params is not None and params < SMALL_MODEL_PARAMS:
        return 1
    return max(1, cpus // max(1, local_world))


def local_world_size() -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))   # torchrun's processes on this machine


def completion_tokens(generated) -> int:
    """Tokens in what TRL's `_generate_single_turn` returned: (completion id lists, ...) in TRL 1.16; 0 for a
    shape this does not know (another TRL release), so the count never stops a run."""
    ids = generated[0] if isinstance(generated, tuple) and generated else generated
    try:
        return sum(len(x) for x in ids)
    except TypeError:
        return 0


def tool_counts(completions: list[list[dict]]) -> list[float]:
    """[turns whose tool-call markup did not parse, tool answers that are errors, rollouts] of one process's
    completions. Tools answer a bad call with an "Error: ..." string (they never raise), so TRL's failure count
    misses them; a call TRL could not make (an unknown tool, arguments that do not bind) answers "{'error': ...}"."""
    turns = [m for c in completions for m in c]
    return [float(sum(1 for m in turns if m.get("tool_call_errors"))),
            float(sum(1 for m in turns if m.get("role") == "tool" and str(m.get("content", "")).startswith(("Error", "{'error'")))),
            float(len(completions))]


def step_tool_counts(counts: list[float], gather, device) -> tuple[int, float]:
    """(tool parse failures, tool errors per rollout) of a step over every process's `tool_counts`; `gather`: the
    accelerator's (each process calls it, as TRL gathers its own tool counts)."""
    parse, errors, rollouts = gather(torch.tensor(counts, device=device)).view(-1, 3).sum(0).tolist()
    return int(parse), errors / max(1.0, rollouts)


class Progress:
    """The console while GRPO runs (main process): a line per generation round and per optimizer step, numbers
    only (docs/glossary.md, "Columns"). The trainer class feeds it the round's generation and environment time."""

    def __init__(self, total: int, main: bool, group: int = 1):
        self.total, self.main, self.group = total, main, group   # group: completions per prompt (grpo.num_generations)
        self.rounds = 0
        self.gen_s = self.env_s = self.round_s = 0.0
        self.tokens = 0
        self.rewards: list[float] = []
        self._round_t0 = self._step_t0 = time.perf_counter()

    def generated(self, seconds: float, tokens: int) -> None:
        self.gen_s += seconds
        self.tokens += tokens

    def round_begins(self) -> None:
        self.gen_s = self.env_s = 0.0
        self.tokens, self.rewards = 0, []
        self._round_t0 = time.perf_counter()

    def round_ends(self, steps_done: int) -> None:
        took = time.perf_counter() - self._round_t0
        self.round_s += took
        self.rounds += 1
        if not self.main:
            return
        n = len(self.rewards)
        mean = sum(self.rewards) / n if n else math.nan
        # the sample standard deviation, as TRL's reward_std in metrics.jsonl for the same round
        std = math.sqrt(sum((r - mean) ** 2 for r in self.rewards) / (n - 1)) if n > 1 else math.nan
        print(f"[grpo] round {self.rounds} (step {steps_done + 1}/{self.total}): completions={n} "
              f"reward_mean={mean:.3f} reward_std={std:.3f} gen_s={self.gen_s:.2f} env_s={self.env_s:.2f} "
              f"score_s={max(0.0, took - self.gen_s - self.env_s):.2f} tokens={self.tokens} "
              f"tokens/s={self.tokens / self.gen_s if self.gen_s > 0 else 0.0:.1f}", flush=True)
        if n and not self.learnable_groups():
            print(f"[grpo] round {self.rounds} (step {steps_done + 1}/{self.total}): every prompt's {self.group} completions "
                  "got the same reward, so every advantage is 0: this round has no reward signal to learn from", flush=True)

    def learnable_groups(self) -> int:
        """Groups of the round (consecutive `group` rewards, TRL's order) whose rewards differ: the only ones
        with a non-zero advantage (TRL: reward minus the group's mean)."""
        groups = [self.rewards[i:i + self.group] for i in range(0, len(self.rewards), self.group)]
        return sum(1 for g in groups if max(g) - min(g) > 1e-8 * max(1.0, abs(max(g))))

    def step_begins(self) -> None:
        self._step_t0, self.round_s = time.perf_counter(), 0.0

    def step_ends(self) -> float:
        return time.perf_counter() - self._step_t0

    def step_line(self, step: int, row: dict, step_s: float) -> None:
        if not self.main:
            return

        def num(key, fmt):
            v = row.get(key)
            return format(float(v), fmt) if isinstance(v, (int, float)) and not isinstance(v, bool) else "nan"

        print(f"[grpo] step {step}/{self.total}: loss={num('loss', '.4f')} grad_norm={num('grad_norm', '.4f')} "
              f"lr={num('lr', '.3g')} reward={num('reward', '.3f')} step_s={step_s:.2f} "
              f"train_s={max(0.0, step_s - self.round_s):.2f}", flush=True)


def run_scheduler(cfg: DictConfig, optimizer, saved: dict | None, step: int):
    """The run's lr schedule over all `train.steps` (train.lr_schedule / warmup_ratio / min_lr_ratio,
    sft.optim's LambdaLR, the SFT trainer's), at `step`: `saved` is the scheduler state of the state
    being resumed (meta.json "scheduler"), so optimizer step `step + 1` runs at the uninterrupted
    run's lr. A state without one is refused unless the schedule is flat (constant, no warmup)."""
    from sft.checkpoint import StateError
    from sft.optim import build_scheduler

    t = cfg.train
    sched = build_scheduler(optimizer, total=int(t.steps), warmup_ratio=float(t.warmup_ratio),
                            schedule=str(t.lr_schedule), min_ratio=float(t.min_lr_ratio))
    if step == 0:
        return sched
    if saved is None:
        if t.lr_schedule == "constant" and float(t.warmup_ratio) == 0:
            return sched  # every step's lr is train.lr: nothing to restore
        raise StateError(f"resume at step {step}: the state has no scheduler state (written before GRPO schedules "
                         f"were resumable), so train.lr_schedule={t.lr_schedule} cannot continue exactly; resume=never "
                         "starts over")
    if saved.get("last_epoch") != step:
        raise StateError(f"resume at step {step}: the state's scheduler is at step {saved.get('last_epoch')!r}")
    sched.load_state_dict(dict(saved))
    # The LambdaLR constructor set the groups' lr to step 1's; the next step runs at the saved one.
    for group, lr in zip(optimizer.param_groups, sched.get_last_lr()):
        group["lr"] = lr
    return sched


def lora_config(cfg: DictConfig):
    from peft import LoraConfig

    alpha = float(cfg.lora.alpha)
    return LoraConfig(r=int(cfg.lora.r), lora_alpha=int(alpha) if alpha.is_integer() else alpha,
                      lora_dropout=float(cfg.lora.dropout), target_modules=list(cfg.lora.target_modules), task_type="CAUSAL_LM", bias="none")


def wandb_spec(cfg: DictConfig):
    """The run's wandb spec (common.tracking): `logging.name`, tagged arm/seed/model/stage=grpo."""
    if not cfg.logging.wandb:
        return None
    from common.tracking import run_spec, run_tags

    return run_spec(OmegaConf.to_container(cfg.logging, resolve=True), name=str(cfg.logging.name),
                    runs_root=str(cfg.runs_root),
                    tags=run_tags(arm=str(cfg.arm), seed=int(cfg.seed), model=str(cfg.model.name), stage="grpo"))


def _trainer_class():
    from trl import GRPOTrainer

    class DtsftGRPOTrainer(GRPOTrainer):
        """GRPOTrainer that keeps a sample of each step's rollouts (transcripts + rewards) for auditing."""

        rollouts_logged = 0
        schedule = None   # optimizer -> the run's lr scheduler (Run.build); None: TRL's from the args
        last_rollouts: tuple = ()
        last_parse_failures = 0
        last_tool_errors = 0.0

        def create_scheduler(self, num_training_steps, optimizer=None):
            if self.lr_scheduler is None and self.schedule is not None:
                self.lr_scheduler = self.schedule(optimizer if optimizer is not None else self.optimizer)
                self._created_lr_scheduler = True  # rebuilt by a later train() call, as the Trainer's own
            return super().create_scheduler(num_training_steps, optimizer)

        # Where a generation round's time goes (rl.train.Progress prints it): generating tokens, the environment
        # (tool calls, outside the generation inside TRL's tool loop, and the reward functions).
        progress = None

        def _generate_single_turn(self, *args, **kwargs):
            t0 = time.perf_counter()
            out = super()._generate_single_turn(*args, **kwargs)
            if self.progress is not None:
                self.progress.generated(time.perf_counter() - t0, completion_tokens(out))
            return out

        def _tool_call_loop(self, *args, **kwargs):
            t0, gen0 = time.perf_counter(), self.progress.gen_s if self.progress is not None else 0.0
            try:
                return super()._tool_call_loop(*args, **kwargs)
            finally:
                if self.progress is not None:   # the loop's own time less the generation inside it: the tools
                    self.progress.env_s += time.perf_counter() - t0 - (self.progress.gen_s - gen0)

        def _generate_and_score_completions(self, inputs):
            if self.progress is not None:
                self.progress.round_begins()
            with rlck.peft_reading_old_flag():
                out = super()._generate_and_score_completions(inputs)
            if self.progress is not None:
                self.progress.round_ends(self.state.global_step)
            return out

        def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
            t0 = time.perf_counter()
            rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
            if self.progress is not None:
                self.progress.env_s += time.perf_counter() - t0
                weights = self.reward_weights.tolist()
                self.progress.rewards = [sum(w * v for w, v in zip(weights, r) if not math.isnan(v))
                                         for r in rewards.tolist()]   # every process's completions (gathered)
            n, rank = len(prompts), self.accelerator.process_index
            local = rewards[rank * n:(rank + 1) * n].tolist()  # gathered in process order
            weights = self.reward_weights.tolist()
            out = []
            for i in range(min(n, self.rollouts_logged)):
                row = {k: v for k, v in inputs[i].items() if k != "prompt"}
                per = dict(zip(self.reward_func_names, local[i]))
                entry = {"row": row, "reward": sum(w * v for w, v in zip(weights, local[i]) if not math.isnan(v)),
                         "rewards": per, "messages": list(prompts[i]) + list(completions[i])}
                if self.environments is not None and hasattr(self.environments[i], "transcript"):
                    entry["tool_calls"] = self.environments[i].transcript()
                out.append(json.loads(json.dumps(entry, default=str)))
            self.last_rollouts = out
            self.last_parse_failures, self.last_tool_errors = step_tool_counts(
                tool_counts(completions), self.accelerator.gather, self.accelerator.device)
            return rewards

    return DtsftGRPOTrainer


def start_base(info: dict) -> dict | None:
    """The record (`base`, as SFT's: {"model.path": {"repo", "revision"}}) of the starting snapshot
    rl.checkpoint.write_start_checkpoint took (`info`, its answer): {} for a local model dir (no Hub id), None for a
    Hub id whose commit it could not name."""
    if "revision" not in info:
        return {}
    if info["revision"] in (None, "main"):
        return None
    return {"model.path": {"repo": info["source"], "revision": info["revision"]}}


def recorded_base(rd: Path, model_path: str, meta: dict | None, state: Path | None) -> dict | None:
    """The record of the starting snapshot an earlier segment took (`checkpoints/step-000000`, which every segment
    loads, never the Hub): the resumed state's `base` (`meta`, its meta.json), else the run dir's manifest.json `base`,
    written when the snapshot was taken; {} for a local model dir; None when nothing records it. Resuming a `state`
    that records none (saved before GRPO recorded it): one line naming what this run loads."""
    if meta is not None and isinstance(meta.get("base"), dict):
        return meta["base"]
    from common.tiny import resolve_model_path

    try:
        manifest = json.loads((rd / layout.MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        manifest = None
    base = manifest.get("base") if isinstance(manifest, dict) else None
    if not isinstance(base, dict):
        base = {} if Path(resolve_model_path(model_path)).is_dir() else None
    if state is not None and base != {}:
        entry = (base or {}).get("model.path")
        entry = entry if isinstance(entry, dict) and isinstance(entry.get("revision"), str) else None
        log.warning("%s records no base commit (saved before GRPO recorded it): this resumed run loads %s, the starting "
                    "snapshot its first start took, %s", state, layout.checkpoint_dir(rd, 0),
                    f"of model.path={entry.get('repo', model_path)} at {entry['revision']} (the run dir's manifest.json base)"
                    if entry else f"of model.path={model_path} at a commit nothing in the run dir records")
    return base


class Run:
    """Everything one training segment needs: config, run dir, step offset, trainer."""

    def __init__(self, cfg: DictConfig):
        self.cfg = cfg
        self.rd = Path(cfg.run_dir)
        self.total = int(cfg.train.steps)
        self.saves = set(planned_saves(cfg))
        self.start_dir = layout.checkpoint_dir(self.rd, 0)
        self.dtype = training_dtype(cfg)
        self.flag = PreemptionFlag()
        self.start_step = 0
        self.trainer = None
        self.threads: int | None = None   # CPU threads per process (build sets them on a CPU)
        self.progress: Progress | None = None
        self.guard = None  # rl.vllm_cpu.LogprobGuard when generation runs on vLLM
        self.template: dict = {}
        self.identity = run_identity(cfg)
        self.retriever: CountingRetriever | None = None
        self.search_counts: tuple[int, int] = (0, 0)   # the last step's (searches, failures), all ranks
        self.rng_from: Path | None = None   # the resumed state whose RNG the first step restores
        self.base: dict | None = None   # (main process) the starting snapshot's commit, `start_base`; None: not known

    # ---- setup ---------------------------------------------------------------------------------

    def build(self):
        from accelerate import PartialState
        from peft import get_peft_model, set_peft_model_state_dict
        from transformers import AutoModelForCausalLM, AutoTokenizer

        cfg, rd = self.cfg, self.rd
        # torchrun's process group, as the Trainer's Accelerator (use_cpu on a CPU machine) will see it;
        # without cpu=True accelerate reports every CPU rank as a single main process.
        state = PartialState(cpu=not on_gpu())
        rd.mkdir(parents=True, exist_ok=True)
        # The trainer's own run-dir lock (rank 0, whole process), as sft.train takes it.
        self._lock = lock.take_run_lock(rd / layout.TRAIN_LOCK, state.process_index, state.num_processes, RlError)
        if self._lock is not None:
            layout.clear_end(rd)   # this run trains again: a FAILED / REQUEUED of an earlier segment is stale
        if state.is_main_process and not (self.start_dir / "SHA256SUMS").is_file():
            from common.tiny import resolve_model_path

            info = rlck.write_start_checkpoint(resolve_model_path(str(cfg.model.path)), self.start_dir)
            log.info("starting model copied to %s (%s)", self.start_dir, " ".join(f"{k}={v}" for k, v in info.items()))
            self.base = start_base(info)
        state.wait_for_everyone()
        problems = check_sha256sums(self.start_dir)  # verified before anything in it is loaded
        if problems:
            raise rlck.CheckpointError(f"{self.start_dir} fails its checksums: {problems[0]}")
        resume = rlck.resume_dir(rd, str(cfg.resume))
        st = rlck.load_state(resume, verified=str(cfg.resume) == "auto") if resume else None  # auto: resume_dir verified it
        if st and isinstance(st["meta"].get("identity"), dict):
            diff = fingerprint.fingerprint_diff(st["meta"]["identity"], self.identity)
            if diff:
                raise fingerprint.identity_error(f"resume: {resume} was saved by a run of a different configuration; "
                                                 "resuming it would mix the two", diff, RlError)
        if state.is_main_process:
            if self.base is None:   # the snapshot an earlier segment took: its commit as recorded then
                self.base = recorded_base(rd, str(cfg.model.path), st["meta"] if st else None, resume)
            if self.base is not None:
                layout.record_base(rd, self.base)
        self.start_step = int(st["meta"]["step"]) if st else 0
        steps = self.total - self.start_step
        if steps <= 0:
            return None
        tok = AutoTokenizer.from_pretrained(str(self.start_dir))
        self.template = chat.install(tok, enable_thinking=cfg.grpo.enable_thinking, where=str(cfg.model.path))
        from sft.model import select_attn_implementation

        attn = select_attn_implementation(str(cfg.model.attn_implementation), state.device)
        model = AutoModelForCausalLM.from_pretrained(str(self.start_dir), dtype=self.dtype, attn_implementation=attn)
        from transformers import set_seed

        set_seed(int(cfg.seed))  # LoRA's A init draws from the global RNG: the seed's, not the process history's
        if not on_gpu():
            self.threads = cpu_threads(available_cpus(), local_world_size(), model.num_parameters())
            torch.set_num_threads(self.threads)
        with rlck.peft_reading_old_flag():
            model = get_peft_model(model, lora_config(cfg))
        if st:
            set_peft_model_state_dict(model, st["adapter"])
        self.retriever = retriever = make_retriever(cfg) if cfg.task == "qa" and cfg.grpo.qa_mode == "open" else None
        funcs, weights = reward_funcs_for(cfg.task)
        from datasets import Dataset

        args = grpo_args(cfg, rd, steps)
        args.reward_weights = weights
        cls = _trainer_class()
        import contextlib

        from rl import vllm_cpu

        cpu_vllm = args.use_vllm and vllm_cpu.on_cpu_vllm()  # the CPU adapter (rl.vllm_cpu), only there
        if cpu_vllm:
            vllm_cpu.check_trl()
        with vllm_cpu.engine_in(self.dtype) if cpu_vllm else contextlib.nullcontext():
            trainer = cls(model=model, processing_class=tok, args=args, reward_funcs=funcs,
                          train_dataset=Dataset.from_list(rows(cfg, self.start_step, steps)),
                          environment_factory=environment_for(cfg.task, retriever=retriever, topk=int(cfg.grpo.topk),
                                                              qa_mode=str(cfg.grpo.qa_mode), trl_version=installed_trl()))
        if cpu_vllm:
            vllm_cpu.install(trainer)
        self.guard = vllm_cpu.LogprobGuard(strict=cpu_vllm and self.dtype == torch.float32) if args.use_vllm else None
        trainer.rollouts_logged = int(cfg.grpo.rollouts_logged)
        saved_schedule = st["meta"].get("scheduler") if st else None
        trainer.schedule = lambda opt: run_scheduler(cfg, opt, saved_schedule, self.start_step)
        if st:
            trainer.create_optimizer()
            trainer.optimizer.load_state_dict(st["optimizer"])
            self.rng_from = resume   # restored as the first step begins (restore_rng)
        from transformers.trainer_callback import PrinterCallback

        trainer.remove_callback(PrinterCallback)   # its raw log dicts: Progress prints the steps instead
        trainer.progress = self.progress = Progress(self.total, trainer.accelerator.is_main_process, int(cfg.grpo.num_generations))
        trainer.add_callback(_Callback(self))
        self.trainer = trainer
        rank = trainer.accelerator.process_index
        # sft.metrics' writers: rows past the resumed step are dropped (they are redone), wandb
        # resumes the run's id and is offline without an API key.
        self.metrics = MetricsLog(rd / layout.METRICS, self.start_step, rank)
        self.wandb = Wandb(enabled=bool(cfg.logging.wandb), rank=rank, run_dir=rd, spec=wandb_spec(cfg),
                           config=OmegaConf.to_container(cfg, resolve=True))
        return trainer

    # ---- per step ------------------------------------------------------------------------------

    def restore_rng(self) -> None:
        """This rank's RNG from the resumed state, once, as the segment's first step begins: where the uninterrupted
        run saved it. Restored any earlier, starting the data loader's iterator (train()) would take a draw from it that
        the uninterrupted run took before its first step, and every later draw (the order TRL shuffles each step's
        rollouts into, the sampling) would be shifted by one."""
        d, self.rng_from = self.rng_from, None
        if d is not None and not rlck.restore_rng(d, self.trainer.accelerator.process_index):
            log.warning("%s has no RNG for rank %d (world size changed?): RNG not restored", d, self.trainer.accelerator.process_index)

    def step_end(self, local_step: int) -> bool:
        """Write the step's outputs; True when training must stop (preemption)."""
        tr = self.trainer
        step = self.start_step + local_step
        main = tr.accelerator.is_main_process
        self._check_searches(step)   # before anything of this step is kept
        if main and tr.last_rollouts:
            (self.rd / layout.ROLLOUTS).mkdir(exist_ok=True)
            with open(self.rd / layout.ROLLOUTS / f"{step_name(step)}.jsonl", "w", encoding="utf-8") as f:
                for r in tr.last_rollouts:
                    f.write(json.dumps({"step": step, **r}, ensure_ascii=False) + "\n")
        model = tr.accelerator.unwrap_model(tr.model)
        check_finite(model, step)   # every rank (each holds the same weights): none saves a poisoned step
        if step in self.saves and main:
            rlck.save_merged_checkpoint(model, start_dir=self.start_dir,
                                        out=layout.checkpoint_dir(self.rd, step), dtype=self.dtype)
        stop = self._agree(self.flag.set)
        if stop or step % int(self.cfg.train.state_every) == 0 or step == self.total:  # every rank: per-rank RNG
            from peft import get_peft_model_state_dict

            # TRL's num_input_tokens_seen is not kept: it feeds only tokens_per_s, a rate within one segment (both restart at 0)
            rlck.save_state(self.rd, step, adapter=get_peft_model_state_dict(model), optimizer=tr.optimizer,
                            meta={"identity": self.identity, "rows_consumed": step * prompts_per_step(self.cfg),
                                  "seed": int(self.cfg.seed), "scheduler": tr.lr_scheduler.state_dict(),
                                  **self._base_record()},
                            rank=tr.accelerator.process_index, barrier=tr.accelerator.wait_for_everyone)
        tr.accelerator.wait_for_everyone()
        return stop

    def finish(self) -> None:
        """`DONE` once the final step's checkpoint, state and metrics line are all written."""
        tr = self.trainer
        if tr.accelerator.is_main_process and self.start_step + tr.state.global_step == self.total:
            write_json(self.rd / layout.DONE, {"step": self.total, "identity": self.identity, "trl": installed_trl(),
                                               **self._base_record(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})

    def _base_record(self) -> dict:
        """`base` for a state's meta.json and DONE, as SFT's: nothing where the snapshot's commit is not known."""
        return {} if self.base is None else {"base": self.base}

    def _check_searches(self, step: int) -> None:
        if self.retriever is None:
            return
        searches, failures, last = self.retriever.take()
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            t = torch.tensor([float(searches), float(failures)], device=self.trainer.accelerator.device)
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            searches, failures = int(t[0].item()), int(t[1].item())
        self.search_counts = (searches, failures)
        check_search_failures(step, searches, failures, float(self.cfg.grpo.max_search_failure_rate), last)

    def _agree(self, flag: bool) -> bool:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            t = torch.tensor([1.0 if flag else 0.0], device=self.trainer.accelerator.device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            return bool(t.item())
        return flag

    def log_metrics(self, logs: dict, local_step: int, state: dict) -> None:
        if "loss" not in logs or not self.trainer.accelerator.is_main_process:
            return
        step = self.start_step + local_step
        now = time.time()
        tokens = float(logs.get("num_tokens", 0.0))
        dt = now - state.get("t", now)
        row = {"step": step, "loss": logs.get("loss"), "lr": logs.get("learning_rate"), "reward": logs.get("reward"),
               "reward_std": logs.get("reward_std"), "frac_reward_zero_std": logs.get("frac_reward_zero_std")}
        for key, v in logs.items():
            if key.startswith("rewards/") and key.endswith("/mean"):
                name = key[len("rewards/"):-len("/mean")]
                row["reward_total" if name == "SearchPlanActEnv" else f"reward_{name}"] = v
        row["tool_calls_per_rollout"] = logs.get("tools/call_frequency")
        row["tool_failures"] = logs.get("tools/failure_frequency")
        row["tool_errors_per_rollout"] = self.trainer.last_tool_errors
        row["tool_parse_failures"] = self.trainer.last_parse_failures
        if self.retriever is not None:
            row["searches"], row["search_failures"] = self.search_counts
        row["completion_length"] = logs.get("completions/mean_length")
        if float(self.cfg.grpo.beta) > 0:
            row["kl"] = logs.get("kl")
        row["grad_norm"] = logs.get("grad_norm")
        if self.guard is not None:  # generation (vLLM) vs training weights, over the sampled tokens
            row["vllm_logprob_diff_mean"] = logs.get("sampling/sampling_logp_difference/mean")
            row["vllm_logprob_diff_max"] = logs.get("sampling/sampling_logp_difference/max")
        row["tokens_per_s"] = (tokens - state.get("tokens", 0.0)) / dt if dt > 0 and "t" in state else None
        state.update(t=now, tokens=tokens)
        self.metrics.write(row)
        self.wandb.log(row, step)
        self.progress.step_line(step, row, state.get("step_s", math.nan))
        if self.guard is not None:
            self.guard.check(step, row["vllm_logprob_diff_mean"], row["vllm_logprob_diff_max"])


def _Callback(run: Run):
    from transformers import TrainerCallback

    class Cb(TrainerCallback):
        def __init__(self):
            self.log_state = {"t": time.time()}

        def on_step_begin(self, args, state, control, **kw):
            run.restore_rng()
            run.progress.step_begins()

        def on_step_end(self, args, state, control, **kw):
            self.log_state["step_s"] = run.progress.step_ends()   # before the step's checkpoint and state are written
            if run.step_end(state.global_step):
                control.should_training_stop = True
            return control

        def on_log(self, args, state, control, logs=None, **kw):
            run.log_metrics(logs or {}, state.global_step, self.log_state)

    return Cb()


def run(cfg: DictConfig, *, before_train=None) -> int:
    """One training segment. `before_train(trainer)` runs just before `trainer.train()` (tests use it
    to replace the generation function with a scripted policy)."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    validate(cfg)   # the schema launch checked with: a hand-edited config.yaml is refused the same way
    check_world(cfg, world_size())
    problem = trl_problem(cfg.grpo.get("trl"), installed_trl())   # a pinned TRL: never trained under another
    if problem:
        raise RlError(problem)
    rd = Path(cfg.run_dir)
    if (rd / layout.DONE).is_file():
        recorded = json.loads((rd / layout.DONE).read_text(encoding="utf-8")).get("identity")
        diff = fingerprint.fingerprint_diff(recorded, run_identity(cfg)) if isinstance(recorded, dict) else []
        if diff:
            raise fingerprint.identity_error(f"{rd} holds a finished run of a different configuration", diff, RlError)
        print(f"[rl.train] {rd} is finished (DONE)")
        return 0
    table = preflight(cfg, probe_retriever=False)   # (the retriever is probed when it is built)
    if table:
        print(f"[rl.train] refusing to train: a reward hack comes within the required margin of genuine play\n{table}",
              file=sys.stderr)
        return 2
    if not on_gpu():
        # The trainer sets its CPU threads itself (Run.build, once the model's size is known); set here, before
        # accelerate's PartialState, the variable tells accelerate not to pick a count of its own.
        os.environ["OMP_NUM_THREADS"] = str(cpu_threads(available_cpus(), local_world_size(), None))
    r = Run(cfg)
    r.flag.install()
    try:
        trainer = r.build()
        if trainer is None:
            print(f"[rl.train] {rd}: already at step {r.start_step} of {r.total}")
            return 0
        if trainer.accelerator.is_main_process:
            print(f"[rl.train] {'resuming at' if r.start_step else 'starting'} step {r.start_step + 1} of {r.total} "
                  f"(template {'patched' if r.template.get('patched') else 'unchanged'}, parser "
                  f"{r.template.get('style')}, {trainer.accelerator.num_processes} process(es), "
                  f"{f'{r.threads} CPU thread(s) each, ' if r.threads else ''}trl {installed_trl()})", flush=True)
        if before_train is not None:
            before_train(trainer)
        trainer.train()
        r.finish()
    finally:
        r.flag.restore()
        if getattr(r, "_lock", None) is not None:
            os.close(r._lock)  # the run-dir lock (the process exit would release it too)
        if r.trainer is not None:
            r.wandb.finish()
            stop_helper_threads(r.trainer)
        remove_empty_scratch(rd / "trl")   # TRL's output_dir: nothing is saved there (save_strategy="no")
    return 0


def remove_empty_scratch(scratch: Path) -> None:
    """Remove `scratch` if it is an empty directory. Each rank of a multi-process run calls this on
    its way out, so the other rank may have removed it first; a directory that holds something is kept."""
    try:
        if scratch.is_dir() and not any(scratch.iterdir()):
            scratch.rmdir()
    except FileNotFoundError:   # the other rank got there first
        pass


def stop_helper_threads(trainer) -> None:
    """Stop the helper threads a segment leaves behind — TRL's asyncio loop (async tools or rewards)
    and tqdm's monitor (started by the first progress bar) — so none is alive at interpreter exit."""
    import threading

    thread, loop = getattr(trainer, "async_loop_thread", None), getattr(trainer, "async_loop", None)
    if thread is not None and loop is not None:
        from trl.trainer.utils import shutdown_event_loop_in_daemon

        shutdown_event_loop_in_daemon(thread, loop)
    try:
        from tqdm._monitor import TMonitor
    except ImportError:  # pragma: no cover - tqdm comes with transformers
        return
    for t in threading.enumerate():
        if isinstance(t, TMonitor):
            t.exit()   # sets its stop event and joins it


def close_process_group(clean: bool) -> None:
    """Destroy the torch.distributed process group (accelerate's PartialState made it from
    torchrun's environment) before the interpreter exits. Left alive, gloo's and the TCP store's
    C++ threads are torn down by static destructors at exit, which can abort the process
    ("terminate called without an active exception", SIGABRT) after a finished run. `clean`: every
    rank got here normally, so a barrier first keeps one rank from leaving while another still talks."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    if clean:
        dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print("usage: python -m rl.train <run_dir>/config.yaml", file=sys.stdout if len(argv) == 1 else sys.stderr)
        return 0 if len(argv) == 1 else 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    from common.cli import ConfigError
    from evals.retrievers import RetrieverError

    clean = False
    try:
        try:
            cfg = load_config(argv[0])
        except Exception as exc:  # noqa: BLE001 - YAML errors come in several types
            raise RlError(f"{argv[0]}: not a readable config ({str(exc).splitlines()[0] if str(exc) else exc})") from None
        rc = run(cfg)
        clean = True
        if rc != 0:   # the pilot guard's refusal (its table is on stderr)
            layout.record_trainer_failure(argv[0], "refused to train: a reward hack comes within the required margin "
                                          "of genuine play (the pilot guard; its table is in the log)", "rl.train", rc)
        return rc
    except (ConfigError, RetrieverError, NonFiniteError) as exc:  # ConfigError: every stage's typed bad-input error (RlError, BenchError, StateError ...)
        code = EXIT_NONFINITE if isinstance(exc, NonFiniteError) else 2
        message = " ".join(str(exc).split("\n  ")) if "\n" in str(exc) else str(exc)
        print(f"error: {exc}", file=sys.stderr)  # a bad input, named; not a crash
        layout.record_refusal(argv[0], code, message)
        if not isinstance(exc, lock.LockHeld):   # another trainer holds the run: it has not failed
            layout.record_trainer_failure(argv[0], message, "rl.train", code)
        return code
    except Exception as exc:   # a crash: recorded (FAILED), then the traceback as usual
        layout.record_trainer_failure(argv[0], f"{type(exc).__name__}: {exc}", "rl.train")
        raise
    finally:
        close_process_group(clean)


if __name__ == "__main__":
    sys.exit(main())
