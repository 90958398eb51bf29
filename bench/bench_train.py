"""CPU benchmark of the sft training loop (not a test; prints ratios against named baselines).

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_train.py [--steps 20] [--rows 1024] [--repeats 3]

Same copy-task data, same tiny model (fp32, sdpa, activation checkpointing off everywhere so
only the loop differs). The machine is shared and noisy, so comparisons are interleaved:
  loop overhead - in one process, step by step alternately: the trainer's step (sft.data.plan_step,
             FSDP-wrapped model, sft.train.forward_backward, clip, AdamW, schedule, metrics
             row) and a bare forward+backward+clip+AdamW on the *identical* micro-batches
             (the trainer's under sdpa: packs of at most 512 tokens; unwrapped model, batches prebuilt);
             overhead = raw/trainer - 1.
  vs HF      - whole runs, alternately, best of --repeats: `python -m sft.train` in-process
             (tokens/s from its metrics.jsonl step times) and transformers `Trainer` with
             `DataCollatorWithFlattening` (padding-free: the 32 sequences of a step packed into
             one row, which sdpa attends through a block mask; timed per step by a callback,
             data loading not counted).
The first 3 steps of every run are warm-up and not timed.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

WARMUP = 3
GBS = 32  # sequences per step (~1.5k tokens): enough work per step that fixed costs show as overhead, not noise


def trainer_tps(cfg_path: Path, run_dir: Path) -> float:
    from common import layout
    from sft import train

    assert train.cli([str(cfg_path)]) == 0
    rows = [json.loads(line) for line in (run_dir / layout.METRICS).read_text().splitlines()][WARMUP:]
    return sum(r["tokens"] for r in rows) / sum(r["step_time_s"] for r in rows)


def interleaved_overhead(cfg_path: Path, steps: int) -> tuple[float, float]:
    """(trainer-step tokens/s, raw-step tokens/s), alternating step by step in this process."""
    from transformers import AutoModelForCausalLM

    from sft import train
    from sft.config import load_config
    from sft.data import load_train_data, pack_budget, plan_step
    from sft.metrics import step_flops
    from sft.model import matmul_params, model_config
    from sft.optim import NonFiniteGuard, build_optimizer, build_scheduler

    cfg = load_config(cfg_path)
    dev = torch.device("cpu")
    _, world, owns = train.init_distributed("cpu")
    data = load_train_data(cfg.data_dir, global_batch_size=cfg.train.global_batch_size, max_tokens_per_micro_batch=cfg.train.max_tokens_per_micro_batch)
    # the trainer's own micro-batches under sdpa (sft.data.pack_budget), for both loops
    cap = cfg.train.max_tokens_per_micro_batch
    plan_kw = dict(rank=0, world=1, global_batch_size=cfg.train.global_batch_size, seed=cfg.seed, capacity=cap, budget=pack_budget("sdpa", cap))
    conf = model_config(cfg, "sdpa")
    model, _ = train.prepare_model(cfg, conf, rank=0, device=dev, dtype=torch.float32)
    opt = build_optimizer(model, lr=cfg.train.lr, betas=cfg.train.betas, eps=cfg.train.eps, weight_decay=cfg.train.weight_decay)
    sched = build_scheduler(opt, total=steps, warmup_ratio=cfg.train.warmup_ratio, schedule=cfg.train.lr_schedule, min_ratio=cfg.train.min_lr_ratio)
    guard, n_matmul = NonFiniteGuard(cfg.train.max_consecutive_nonfinite), matmul_params(conf)
    torch.manual_seed(cfg.seed)
    raw = AutoModelForCausalLM.from_config(conf).train()
    raw_opt = torch.optim.AdamW(raw.parameters(), lr=cfg.train.lr, betas=cfg.train.betas, eps=cfg.train.eps)
    raw_plans = [plan_step(data, s, **plan_kw) for s in range(steps)]

    def trainer_step(s):
        plan = plan_step(data, s, **plan_kw)
        loss, n_train, n_tok, _ = train.forward_backward(model, plan, device=dev, world=world)
        norm = train.clip_grad_norm(model, cfg.train.grad_clip)
        if guard.check(norm, s + 1):
            opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        _ = {"loss": loss, "lr": sched.get_last_lr()[0], "tokens": n_tok, "flops": step_flops(n_matmul, conf, plan.seq_lens)}
        return n_tok

    def raw_step(s):
        plan = raw_plans[s]
        for mb in plan.micro_batches:
            out = raw(input_ids=mb.input_ids, position_ids=mb.position_ids, labels=mb.labels,
                      shift_labels=mb.shift_labels, num_items_in_batch=plan.num_trainable, use_cache=False)
            out.loss.backward()
        torch.nn.utils.clip_grad_norm_(raw.parameters(), 1.0)
        raw_opt.step()
        raw_opt.zero_grad(set_to_none=True)
        return plan.num_tokens

    totals = {"trainer": [0, 0.0], "raw": [0, 0.0]}
    for s in range(steps):
        for name, fn in (("trainer", trainer_step), ("raw", raw_step)) if s % 2 else (("raw", raw_step), ("trainer", trainer_step)):
            t0 = time.perf_counter()
            n = fn(s)
            if s >= WARMUP:
                totals[name][0] += n
                totals[name][1] += time.perf_counter() - t0
    if owns:
        import torch.distributed as dist

        dist.destroy_process_group()
    return totals["trainer"][0] / totals["trainer"][1], totals["raw"][0] / totals["raw"][1]


def hf_tps(data_dir: Path, steps: int, lr: float, out: Path) -> float:
    import datasets
    from transformers import AutoModelForCausalLM, DataCollatorWithFlattening, Trainer, TrainerCallback, TrainingArguments

    from common.tiny import tiny_config

    ds = datasets.load_from_disk(str(data_dir)).select_columns(["input_ids", "labels"])
    conf = tiny_config()
    conf._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(conf)

    class Timer(TrainerCallback):
        def __init__(self):
            self.t0, self.elapsed, self.tokens, self.step = 0.0, 0.0, 0, 0

        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            if self.step >= WARMUP:
                self.elapsed += time.perf_counter() - self.t0
            self.step += 1

    timer = Timer()
    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=GBS, max_steps=steps, learning_rate=lr,
                             lr_scheduler_type="cosine", warmup_steps=1, max_grad_norm=1.0, logging_strategy="no",
                             save_strategy="no", report_to=[], use_cpu=True, dataloader_num_workers=0, seed=0,
                             disable_tqdm=True)
    collator = DataCollatorWithFlattening()
    seen = []

    def collate(feats):
        seen.append(sum(len(f["input_ids"]) for f in feats))
        return collator(feats)

    Trainer(model=model, args=args, train_dataset=ds, data_collator=collate, callbacks=[timer]).train()
    return sum(seen[WARMUP:steps]) / timer.elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repetitions; the best of each is reported")
    a = ap.parse_args()
    from sft.copytask import make_dataset_dir, write_config

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data_dir = make_dataset_dir(tmp / "data", n=a.rows)
        kw = dict(steps=a.steps, save_steps=[], state_every=10**6, activation_checkpointing=False,
                  max_tokens_per_micro_batch=4096, global_batch_size=GBS)
        step_tr, step_raw = interleaved_overhead(write_config(tmp / "overhead", data_dir, **kw), a.steps)
        runs = {"trainer": [], "hf": []}
        for r in range(a.repeats):
            runs["trainer"].append(trainer_tps(write_config(tmp / f"run{r}", data_dir, **kw), tmp / f"run{r}"))
            runs["hf"].append(hf_tps(data_dir, a.steps, 3e-3, tmp / f"hf{r}"))
    tr, hf = max(runs["trainer"]), max(runs["hf"])
    threads = torch.get_num_threads()
    print(f"\ntiny model, {a.steps} steps x {GBS} sequences, {threads} thread(s), shared CPU")
    print(f"step by step, interleaved: trainer step {step_tr:,.0f} tok/s, raw fwd+bwd+opt {step_raw:,.0f} tok/s")
    print(f"  loop overhead vs raw loop: {step_raw / step_tr - 1:+.1%}   (aim <= +5%)")
    fmt = lambda xs: ", ".join(f"{x:,.0f}" for x in xs)  # noqa: E731
    print(f"whole runs, alternating: sft.train [{fmt(runs['trainer'])}] tok/s, HF Trainer [{fmt(runs['hf'])}] tok/s")
    print(f"  speed vs HF Trainer (best of {a.repeats} each): {tr / hf:.2f}x   (aim > 1)")


if __name__ == "__main__":
    main()
