"""CPU benchmark of the sft training loop (not a test; prints ratios against named baselines).

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_train.py [--steps 30] [--rows 480]

Three runs on the same copy-task data and the same tiny model (fp32, sdpa, activation
checkpointing off everywhere so only loop overhead differs):
  trainer  - `sft.train` end to end in-process (world of one, FSDP-wrapped), tokens/s
             from its metrics.jsonl step times (first 3 steps dropped as warm-up);
  raw      - a bare forward+backward+clip+AdamW loop over the *identical* packed
             micro-batches (sft.data.plan_step), no FSDP, no bookkeeping;
  hf       - transformers `Trainer` with `DataCollatorWithFlattening` (padding-free, the
             same 8 sequences per step), timed per step by a callback.
Prints tokens/s of each and the ratios: loop overhead = raw/trainer - 1 (aim <= 5%), and
trainer/hf speed-up (aim > 1).
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
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

WARMUP = 3
GBS = 32  # sequences per step (~1.5k tokens): enough work per step that fixed costs show as overhead, not noise


def trainer_tps(cfg_path: Path, run_dir: Path) -> float:
    from sft import train

    assert train.cli([str(cfg_path)]) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][WARMUP:]
    return sum(r["tokens"] for r in rows) / sum(r["step_time_s"] for r in rows)


def raw_tps(cfg_path: Path, steps: int) -> float:
    from transformers import AutoModelForCausalLM

    from sft.config import load_config
    from sft.data import load_train_data, plan_step
    from sft.tiny import tiny_config

    cfg = load_config(cfg_path)
    data = load_train_data(cfg.data_dir, global_batch_size=cfg.global_batch_size, max_tokens_per_micro_batch=cfg.max_tokens_per_micro_batch)
    plans = [plan_step(data, s, rank=0, world=1, global_batch_size=cfg.global_batch_size, seed=cfg.seed,
                       capacity=cfg.max_tokens_per_micro_batch) for s in range(steps)]
    conf = tiny_config()
    conf._attn_implementation = "sdpa"
    torch.manual_seed(cfg.seed)
    model = AutoModelForCausalLM.from_config(conf).train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)
    tokens, elapsed = 0, 0.0
    for s, plan in enumerate(plans):
        t0 = time.perf_counter()
        n = plan.num_trainable
        for mb in plan.micro_batches:
            out = model(input_ids=mb.input_ids, position_ids=mb.position_ids, labels=mb.labels,
                        shift_labels=mb.shift_labels, num_items_in_batch=n, use_cache=False)
            out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if s >= WARMUP:
            elapsed += time.perf_counter() - t0
            tokens += plan.num_tokens
    return tokens / elapsed


def hf_tps(data_dir: Path, steps: int, lr: float, out: Path) -> float:
    import datasets
    from transformers import AutoModelForCausalLM, DataCollatorWithFlattening, Trainer, TrainerCallback, TrainingArguments

    from sft.tiny import tiny_config

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
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rows", type=int, default=1024)
    a = ap.parse_args()
    from sft_helpers import make_dataset_dir, write_config

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data_dir = make_dataset_dir(tmp / "data", n=a.rows)
        run_dir = tmp / "run"
        cfg = write_config(run_dir, data_dir, steps=a.steps, save_steps=[], state_every=10**6,
                           activation_checkpointing=False, max_tokens_per_micro_batch=4096, global_batch_size=GBS)
        tr = trainer_tps(cfg, run_dir)
        raw = raw_tps(cfg, a.steps)
        hf = hf_tps(data_dir, a.steps, 3e-3, tmp / "hf")
    print(f"tokens/s  trainer={tr:,.0f}  raw fwd+bwd+opt={raw:,.0f}  HF Trainer={hf:,.0f}  "
          f"(tiny model, {a.steps} steps x {GBS} sequences, {torch.get_num_threads()} thread(s))")
    print(f"loop overhead vs raw loop: {raw / tr - 1:+.1%}   (aim <= +5%)")
    print(f"speed vs HF Trainer:       {tr / hf:.2f}x   (aim > 1)")


if __name__ == "__main__":
    main()
