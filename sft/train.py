"""The SFT training loop: `python -m sft.train <run_dir>/config.yaml [key=value ...]`.

Reads top to bottom like a recipe: validate config and data (no model work yet) ->
process group -> model (rank-0 load, Liger, FSDP1) -> optimizer/schedule -> resume ->
steps -> checkpoints -> DONE. Runs under torchrun (RANK/WORLD_SIZE/LOCAL_RANK) or as a
plain process (a world of one on a free local port); FSDP is used either way so the code
path is the same.

Loss normalization (exact for any split): each micro-batch returns
sum(token losses) / N_global, where N_global is the trainable-token count of the whole
global batch (all-reduced before any backward). FSDP averages gradients over ranks, so
each backward is scaled by the world size; the result is the gradient of
sum(all token losses) / N_global, whatever the ranks and micro-batch budget.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import torch
import torch.distributed as dist

from common import fingerprint, layout, lock
from common.cli import ConfigError, wants_help
from common.io import replace_aside
from common.plan import late_saves, train_plan
from common.preempt import PreemptionFlag
from common.schema import TRAINER_SEMANTICS
from common.tracking import MetricsLog, Wandb

from . import checkpoint as ckpt
from .config import EXCLUDED_KEYS, SFT, TrainConfig, load_config
from .console import StepConsole
from .data import (DataError, StepPlan, TrainData, dummy_micro_batch, load_train_data, pack_budget, plan_step,
                   seen_before)
from .metrics import lookup_peak_tflops, peak_memory_gb, step_flops, wandb_spec
from .model import apply_liger, base_commits, build_model, load_tokenizer, matmul_params, model_config, select_attn_implementation, wrap_fsdp
from .optim import NonFiniteError, NonFiniteGuard, build_optimizer, build_scheduler, warmup_steps
from sft.errors import SftError

log = logging.getLogger("sft.train")
EXIT_NONFINITE = 3


# ---------------------------------------------------------------- process setup


def setup_logging(rank: int) -> None:
    fmt = f"[rank{rank}] %(asctime)s %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, format=fmt, force=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(device_type: str) -> tuple[int, int, bool]:
    """(rank, world size, whether we created the group). Env from torchrun, else a world of 1."""
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), False
    backend = "cpu:gloo,cuda:nccl" if device_type == "cuda" else "gloo"
    if "RANK" in os.environ:
        dist.init_process_group(backend=backend)
    else:  # a world of one, without touching os.environ (in-process callers run several)
        dist.init_process_group(backend=backend, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    return dist.get_rank(), dist.get_world_size(), True


def pick_device(cfg: TrainConfig) -> torch.device:
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    if cfg.model.gpu_only:
        raise SftError("model.gpu_only=true but CUDA is not available (set model.gpu_only=false for a CPU run)")
    return torch.device("cpu")


def train_dtype(cfg: TrainConfig, device: torch.device) -> torch.dtype:
    if cfg.train.precision == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"bf16": torch.bfloat16, "fp32": torch.float32}[cfg.train.precision]


# ---------------------------------------------------------------- model and one global batch


def prepare_model(cfg: TrainConfig, conf, *, rank: int, device: torch.device, dtype: torch.dtype, model=None):
    """(FSDP-wrapped model in train mode, active Liger kernels). `model`: an already built
    (unwrapped) model instead of `build_model`'s (bench/gpu_acceptance.py builds on the GPU)."""
    if model is None:
        model = build_model(cfg, conf, rank=rank, device=device)
    liger = apply_liger(model, cfg.model.liger, device)
    model = wrap_fsdp(model, rank=rank, device=device, dtype=dtype, activation_checkpointing=cfg.train.activation_checkpointing)
    model.train()
    return model, liger


def micro_batch_loss(model, mb, num_items_in_batch):
    """The model output whose `.loss` is the training loss of one packed micro-batch: the sum of its
    token losses (targets `mb.shift_labels`) divided by `num_items_in_batch`."""
    return model(input_ids=mb.input_ids, position_ids=mb.position_ids, labels=mb.labels, shift_labels=mb.shift_labels,
                 num_items_in_batch=num_items_in_batch, use_cache=False)


def forward_backward(model, plan: StepPlan, *, device, world: int, liger_active: bool = False, stop: bool = False):
    """Run every micro-batch of this rank's share of a global batch, accumulating gradients.

    Every rank runs `plan.n_micro` forward/backward passes (each is an FSDP collective),
    padding with empty dummy micro-batches. The loss denominator is the global batch's
    trainable-token count, known to every rank from the row lengths; one all-reduce after
    the passes sums the losses, checks that count, and spreads the preemption flag.
    Returns (mean token loss of the global batch, trainable tokens, tokens, stop).
    """
    n_global = torch.tensor(plan.global_trainable, dtype=torch.int64, device=device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    for i in range(plan.n_micro):
        mb = (plan.micro_batches[i] if i < len(plan.micro_batches) else dummy_micro_batch()).to(device)
        out = micro_batch_loss(model, mb, n_global)
        if liger_active and out.logits is not None:
            raise RuntimeError("Liger fused linear cross-entropy is not active: the model materialized logits")
        (out.loss * world).backward()
        loss_sum += out.loss.detach().double()
    stats = torch.stack([loss_sum, *(torch.tensor(float(v), dtype=torch.float64, device=device)
                                      for v in (plan.num_trainable, plan.num_tokens, stop))])
    dist.all_reduce(stats)
    loss, n_train, n_tok, stops = stats.tolist()
    if int(n_train) != plan.global_trainable:
        raise RuntimeError(f"ranks disagree on the global batch: {int(n_train)} trainable tokens summed, {plan.global_trainable} planned")
    return loss, int(n_train), int(n_tok), stops > 0


def clip_grad_norm(model, max_norm: float | None) -> float:
    """Total gradient norm over all shards (clipped to max_norm when set)."""
    return float(model.clip_grad_norm_(max_norm if max_norm else float("inf")))


# ---------------------------------------------------------------- the run


def run_identity(cfg: TrainConfig, data: TrainData) -> dict:
    """This run's identity (common.fingerprint): its result-changing config keys, the trainer's
    semantics version and the dataset's content fingerprint. Recorded in every state's meta.json."""
    return fingerprint.identity(cfg.raw, EXCLUDED_KEYS, trainer_semantics=TRAINER_SEMANTICS, data_fingerprint=data.fingerprint)


def read_state_meta(state_dir: Path) -> dict:
    """A state's meta.json, read before any model work (a 50 GB state is not loaded to be refused)."""
    path = Path(state_dir) / "meta.json"
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SftError(f"resume: {path} is missing or unreadable ({exc}); not a resumable state") from None
    if not isinstance(meta, dict):
        raise SftError(f"resume: {path} is not a JSON object; not a resumable state")
    return meta


def validate_resume_meta(meta: dict, cfg: TrainConfig, data: TrainData, state_dir: Path, want: dict | None = None) -> None:
    """Refuse to resume a state saved under another identity: every differing key, old -> new.

    States written before identity was recorded carry only n, batch size, seed and the data
    fingerprint (and were made under `LEGACY_TRAINER_SEMANTICS`); those are checked. A state whose
    data fingerprint is null was saved from a dataset dir without a manifest before such a dir was
    known by its content (`sft.data.load_train_data`): there is nothing to compare its data with, so
    it resumes on its other checks, with a warning, and the states saved from then on record the
    content fingerprint."""
    want = run_identity(cfg, data) if want is None else want
    diff = [f"n: {meta.get('n')!r} -> {data.n!r}"] if meta.get("n") != data.n else []
    ident = meta.get("identity")
    unknown = (ident if isinstance(ident, dict) else meta).get("data_fingerprint", "") is None   # recorded as null
    if isinstance(ident, dict):
        diff += fingerprint.fingerprint_diff({k: v for k, v in ident.items() if not (unknown and k == "data_fingerprint")}, want)
    else:
        legacy = {"global_batch_size": cfg.train.global_batch_size, "seed": cfg.seed, "data_fingerprint": data.fingerprint,
                  "trainer_semantics": TRAINER_SEMANTICS}
        recorded = {**{k: meta.get(k) for k in legacy}, "trainer_semantics": fingerprint.LEGACY_TRAINER_SEMANTICS}
        diff += [f"{k}: {recorded[k]!r} -> {v!r}" for k, v in legacy.items() if recorded[k] != v and not (unknown and k == "data_fingerprint")]
    if diff:
        raise fingerprint.identity_error(f"resume: {state_dir} was saved by a run of a different configuration; resuming it "
                             "would mix the two", diff, SftError)
    if unknown:
        log.warning("resume: %s recorded no data fingerprint (saved from a dataset dir without a manifest before such a dir "
                    "was known by its content): its data cannot be compared with %s's; resuming on the other checks",
                    state_dir, data.path)


def check_done_identity(done: Path, cfg: TrainConfig) -> None:
    """A finished run is reported as this config's only if DONE's identity says so (the config half:
    the data is not loaded for it); a DONE written before identity was recorded is taken as is."""
    try:
        recorded = json.loads(done.read_text(encoding="utf-8")).get("identity")
    except (OSError, ValueError, AttributeError):
        recorded = None
    if isinstance(recorded, dict):
        diff = fingerprint.fingerprint_diff(recorded, fingerprint.identity(cfg.raw, EXCLUDED_KEYS, trainer_semantics=TRAINER_SEMANTICS))
        if diff:
            raise fingerprint.identity_error(f"{done.parent} holds a finished run of a different configuration", diff, SftError)


# Outputs of a run that resume=never renames aside (never deletes) before starting over.
RUN_OUTPUTS = (layout.STATES, layout.CHECKPOINTS, layout.EVAL, layout.METRICS, layout.DONE)


def resolve_resume(cfg: TrainConfig) -> Path | None:
    """The state to resume from, chosen before any model work. With resume=auto: the newest
    complete state whose meta.json reads (a damaged one is skipped, not a crash loop on every
    relaunch); its checksums are verified later, collectively, which may fall back further.
    Complete states none of whose meta.json reads are refused (exit 2), as are states none of which
    verifies: never a silent start from step 0 over a run's progress."""
    if cfg.resume == "never":
        return None
    if cfg.resume == "auto":
        skipped = []
        for _, d in reversed(ckpt.complete_states(layout.states_dir(cfg.run_dir))):
            try:
                read_state_meta(d)
            except ConfigError as exc:
                log.warning("skipped state %s: %s", d.name, exc)
                skipped.append(f"{d.name}: {exc}")
                continue
            return d
        if skipped:
            raise SftError(f"resume=auto: no state under {layout.states_dir(cfg.run_dir)} has a readable meta.json "
                           f"({'; '.join(skipped)}); move the state dir aside or pass resume=PATH")
        return None
    return Path(cfg.resume)


def run(cfg: TrainConfig, held: ExitStack) -> int:
    """Train; resources that must outlive the run's work (the run-dir lock) go on `held`."""
    # 1. Everything that can fail cheaply fails here, before any model work.
    device = pick_device(cfg)
    done = cfg.run_dir / layout.DONE
    if done.exists() and cfg.resume != "never":
        check_done_identity(done, cfg)
        print(f"{done} exists: run already finished (resume=never to retrain)", file=sys.stderr)
        return 0
    data = load_train_data(cfg.data_dir, global_batch_size=cfg.train.global_batch_size, max_tokens_per_micro_batch=cfg.train.max_tokens_per_micro_batch)
    # the plan launch and analysis make too (common.plan), for the dataset's real size; `step in saves` lists no step
    per_epoch, total, saves = train_plan(cfg.train, data.n)
    identity = run_identity(cfg, data)
    resume_dir = resolve_resume(cfg)
    resumed = read_state_meta(resume_dir) if resume_dir is not None else {}
    if resume_dir is not None:
        validate_resume_meta(resumed, cfg, data, resume_dir, identity)

    rank, world, owns_group = init_distributed(device.type)
    setup_logging(rank)
    run_lock = lock.take_run_lock(Path(cfg.run_dir) / layout.TRAIN_LOCK, rank, world, SftError)
    if run_lock is not None:
        held.callback(os.close, run_lock)
        layout.clear_end(cfg.run_dir)   # this run trains again: a FAILED / REQUEUED of an earlier segment is stale
    if cfg.train.global_batch_size < world:
        raise SftError(f"train.global_batch_size={cfg.train.global_batch_size} is smaller than the world size {world}")
    base = base_commits(cfg, resumed.get("base"), rank=rank, world=world, resumed=resume_dir)   # before any load of a Hub-id base
    attn = select_attn_implementation(cfg.model.attn_implementation, device)
    budget = pack_budget(attn, cfg.train.max_tokens_per_micro_batch)
    log.info("micro-batches: packed up to %d tokens%s", budget, "" if budget == cfg.train.max_tokens_per_micro_batch else
             f" ({attn} attends over a pack through a dense mask; a longer sequence is a micro-batch of its own)")
    conf = model_config(cfg, attn)
    if data.max_token_id >= conf.vocab_size:
        raise DataError(f"{cfg.data_dir}: token id {data.max_token_id} >= the model's vocab_size {conf.vocab_size} (wrong tokenizer?)")
    if cfg.resume == "never" and rank == 0:  # after every cheap check: a refused start moves nothing
        # A fresh start must leave nothing a later resume=auto would take for this run's progress;
        # the previous outputs are renamed aside (<path>.replaced-<UTC time>), never deleted.
        for name in RUN_OUTPUTS:
            if (cfg.run_dir / name).exists():
                log.info("resume=never: previous %s renamed to %s", name, replace_aside(cfg.run_dir / name).name)
    tokenizer = load_tokenizer(cfg.model.tokenizer) if rank == 0 else None
    if rank == 0:
        layout.record_base(cfg.run_dir, base)
    log.info("data: %d trajectories (%d rows) from %s; %d steps/epoch, %d steps, world %d, device %s",
             data.n, data.n_rows, cfg.data_dir, per_epoch, total, world, device)
    for late in late_saves(cfg.train, data.n, SFT, counted="the dataset's n") if rank == 0 else ():
        log.warning("%s", late)   # launch refuses what data.n's plan shows; the dataset's real size (data.dir, allow_fewer) only here

    # 2. Model: rank-0 load, kernels, FSDP.
    dtype = train_dtype(cfg, device)
    model, liger = prepare_model(cfg, conf, rank=rank, device=device, dtype=dtype)
    model.module.config.dtype = dtype  # what every config.json written from here declares
    n_matmul = matmul_params(conf)
    gen_conf = ckpt.generation_config_for(cfg.model.path, conf)
    optimizer = build_optimizer(model, lr=cfg.train.lr, betas=cfg.train.betas, eps=cfg.train.eps, weight_decay=cfg.train.weight_decay)
    scheduler = build_scheduler(optimizer, total=total, warmup_ratio=cfg.train.warmup_ratio, schedule=cfg.train.lr_schedule, min_ratio=cfg.train.min_lr_ratio)
    log.info("schedule: %s, peak lr %g, %d warmup steps of %d", cfg.train.lr_schedule, cfg.train.lr, warmup_steps(total, cfg.train.warmup_ratio), total)

    # 3. Resume.
    ckpt.seed_rngs(cfg.seed + rank)   # each rank its own draws; a resumed run's saved state replaces these
    start, guard = 0, NonFiniteGuard(cfg.train.max_consecutive_nonfinite)
    if resume_dir is not None and cfg.resume == "auto":  # the newest state that verifies
        checked, skipped = ckpt.newest_verified_state(layout.states_dir(cfg.run_dir))
        if checked is None:
            raise SftError(f"resume=auto: no state under {layout.states_dir(cfg.run_dir)} passes its checks ({'; '.join(skipped)}); "
                           "move the state dir aside or pass resume=PATH")
        if checked != resume_dir:  # fell back past the state checked above: check this one's identity too
            validate_resume_meta(read_state_meta(checked), cfg, data, checked, identity)
        resume_dir = checked
    if resume_dir is not None:
        meta = ckpt.load_state(model, optimizer, resume_dir, rank=rank, verified=cfg.resume == "auto")
        scheduler.load_state_dict(meta["scheduler"])
        start, guard.consecutive = meta["step"], meta.get("consecutive_nonfinite", 0)
        log.info("resumed from %s at step %d", resume_dir, start)
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    metrics = MetricsLog(cfg.run_dir / layout.METRICS, start, rank)
    from omegaconf import OmegaConf

    wb = Wandb(enabled=cfg.logging.wandb, rank=rank, run_dir=cfg.run_dir, spec=wandb_spec(cfg),
               config=OmegaConf.to_container(cfg.raw, resolve=True))
    peak_tf = lookup_peak_tflops(device, cfg.train.peak_tflops)
    preempt = PreemptionFlag().install()

    def hf_files(out: Path) -> None:  # what export needs to rebuild the model from a state
        out.mkdir(parents=True, exist_ok=True)
        model.module.config.save_pretrained(out)
        tokenizer.save_pretrained(out)
        gen_conf.save_pretrained(out)

    def save_state(step: int, epoch: int) -> None:
        meta = {"step": step, "epoch": epoch, "step_in_epoch": step - epoch * per_epoch, "n": data.n,
                "global_batch_size": cfg.train.global_batch_size, "seed": cfg.seed, "data_fingerprint": data.fingerprint,
                "data_dir": str(cfg.data_dir), "world_size": world, "total_steps": total,
                "consecutive_nonfinite": guard.consecutive, "scheduler": scheduler.state_dict(), "time": time.time(),
                "trainer_semantics": TRAINER_SEMANTICS, "identity": identity, "base": base}
        ckpt.save_state(model, optimizer, run_dir=cfg.run_dir, step=step, meta=meta, hf_writer=hf_files, rank=rank)

    # 4. Steps. `step` counts optimizer steps done; batch `step - 1` is consumed by it.
    # Cumulative counters (the compute axes of analysis): a resumed run recounts its earlier batches.
    seen = seen_before(data, start, global_batch_size=cfg.train.global_batch_size, seed=cfg.seed)
    console = StepConsole(cfg.train, total=total, start=start, rank=rank, desc=f"sft {cfg.logging.name}")
    epoch = start // per_epoch if per_epoch else 0
    try:
        for step in range(start + 1, total + 1):
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            t0 = time.perf_counter()
            plan = plan_step(data, step - 1, rank=rank, world=world, global_batch_size=cfg.train.global_batch_size,
                             seed=cfg.seed, capacity=cfg.train.max_tokens_per_micro_batch, budget=budget)
            epoch, t_data = plan.epoch, time.perf_counter() - t0
            loss, n_train, n_tok, stop = forward_backward(model, plan, device=device, world=world, liger_active=bool(liger), stop=preempt.set)
            grad_norm = clip_grad_norm(model, cfg.train.grad_clip)
            lr = scheduler.get_last_lr()[0]
            if liger and step == start + 1:
                log.info("liger: fused linear cross-entropy ran (labels reached the model, logits were not materialized)")
            applied = guard.check(grad_norm, step)
            if applied:
                optimizer.step()
            else:
                log.warning("step %d: non-finite gradient norm %s, step skipped (%d in a row)", step, grad_norm, guard.consecutive)
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            dt = time.perf_counter() - t0
            flops = step_flops(n_matmul, conf, plan.seq_lens)
            for key, add in zip(seen, (cfg.train.global_batch_size, len(plan.seq_lens), n_tok, n_train)):
                seen[key] += add
            row = {
                "step": step, "epoch": epoch, "loss": loss, "lr": lr, "grad_norm": grad_norm, "skipped": not applied,
                "tokens": n_tok, "trainable_tokens": n_train,
                "tokens_per_s_per_gpu": n_tok / dt / world, "trainable_tokens_per_s_per_gpu": n_train / dt / world,
                "mfu": (flops / dt / world / (peak_tf * 1e12)) if peak_tf else None,
                "step_time_s": dt, "data_wait_s": t_data, "peak_mem_gb": peak_memory_gb(device), **seen,
            }
            logged = console.logged(step)
            if logged or step in saves:  # a checkpoint's row is always there (its compute axes)
                metrics.write(row)
                wb.log(row, step)
            console.step(row, logged)

            if step in saves:
                ckpt.save_hf_checkpoint(model, out=layout.checkpoint_dir(cfg.run_dir, step), dtype=dtype,
                                        tokenizer=tokenizer, generation_config=gen_conf, device=device, rank=rank)
            if step < total and (step % cfg.train.state_every == 0 or stop):
                save_state(step, epoch)
            if stop and step < total:
                log.warning("preemption signal received: state saved at step %d, exiting for a resume", step)
                return 0
    finally:
        console.close()
        preempt.restore()
        wb.finish()
    if rank == 0:
        done.write_text(json.dumps({"step": total, "checkpoint": str(layout.checkpoint_dir(cfg.run_dir, total)),
                                    "identity": identity, "base": base}) + "\n")
    log.info("training finished: %d steps", total)
    if owns_group:
        dist.barrier()
    return 0


def main(config_path: str | Path, overrides: list[str] | None = None) -> int:
    """In-process entry: train from a resolved config file; returns the exit code."""
    cfg = load_config(config_path, overrides)
    owned_before = dist.is_initialized()
    with ExitStack() as held:
        try:
            return run(cfg, held)
        finally:
            if not owned_before and dist.is_initialized():
                dist.destroy_process_group()


USAGE = """usage: python -m sft.train <resolved-config.yaml> [key=value ...]

Trains the model of the resolved config (the keys of sft.config.SFT, with run_dir and
data.dir filled) on data.dir. Launch with torchrun for several processes; a plain process
trains as a world of one. Exit codes: 0 done or preempted (DONE marks a finished run),
2 config/data error, 3 too many non-finite gradient norms in a row."""


def cli(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if wants_help(argv) or not argv:
        print(USAGE)
        return 0 if argv else 2
    try:
        return main(argv[0], argv[1:])
    except (ConfigError, NonFiniteError) as exc:
        code = EXIT_NONFINITE if isinstance(exc, NonFiniteError) else 2
        print(f"error: {exc}", file=sys.stderr)
        message = " ".join(str(exc).split("\n  "))
        layout.record_refusal(argv[0], code, message)
        if not isinstance(exc, lock.LockHeld):   # another trainer holds the run: it has not failed
            layout.record_trainer_failure(argv[0], message, "sft.train", code)
        return code
    except Exception as exc:   # a crash: recorded (FAILED), then the traceback as usual
        layout.record_trainer_failure(argv[0], f"{type(exc).__name__}: {exc}", "sft.train")
        raise


if __name__ == "__main__":
    sys.exit(cli())
