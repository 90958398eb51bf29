"""A copy task in the dataset-dir contract (DESIGN.md "Dataset directory"), and a resolved tiny-model
config that trains on it: the smallest learnable input the trainer reads exactly as it reads
data_prep's output. Used by the tests and by `bench/bench_train.py`.

The task is "repeat: w1 w2 ..." -> "w1 w2 ...", tokenized with the tiny tokenizer, only the answer
trainable, lengths varied so that packing and rank splitting have something to do.
"""
from __future__ import annotations

import json
from pathlib import Path

from omegaconf import OmegaConf

from common import fields, layout
from sft.config import SFT

WORDS = "alpha beta gamma delta river stone cloud tiger maple orbit pixel lunar amber frost cedar".split()


def make_dataset_dir(out: Path, n: int = 48, seed: int = 0, fingerprint: str = "test-fp") -> Path:
    import datasets
    import numpy as np
    from transformers import AutoTokenizer

    from common.tiny import tiny_tokenizer_path

    tok = AutoTokenizer.from_pretrained(tiny_tokenizer_path())
    rng = np.random.default_rng(seed)
    cols = {k: [] for k in ("id", "source", "domain", "input_ids", "labels", "num_tokens", "num_trainable", "messages")}
    for i in range(n):
        words = " ".join(rng.choice(WORDS, size=int(rng.integers(3, 16))))
        prompt = tok(f"<|im_start|>user\nrepeat: {words}<|im_end|>\n<|im_start|>assistant\n").input_ids
        answer = tok(f"{words}<|im_end|>\n").input_ids
        ids = prompt + answer
        labels = [-100] * len(prompt) + answer
        msgs = [{"role": "user", "content": f"repeat: {words}"}, {"role": "assistant", "content": words}]
        cols["id"].append(f"copy-{i:04d}")
        cols["source"].append("synthetic-copy")
        cols["domain"].append("search" if i % 2 else "code")
        cols["input_ids"].append(ids)
        cols["labels"].append(labels)
        cols["num_tokens"].append(len(ids))
        cols["num_trainable"].append(len(answer))
        cols["messages"].append(json.dumps({"id": f"copy-{i:04d}", "messages": msgs}))
    out.mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_dict(cols).save_to_disk(str(out))
    (out / "manifest.json").write_text(json.dumps({"fingerprint": fingerprint, "n": n}))
    (out / "rejected.jsonl").write_text("")
    return out


def write_config(run_dir: Path, data_dir: Path, **train) -> Path:
    """A resolved config for the tiny model on CPU; `train` overrides train.* / other dotted keys."""
    cfg = OmegaConf.create(fields.defaults(SFT))   # every key at its default (sft.config)
    cfg.arm, cfg.run_dir, cfg.data.dir = "test", str(run_dir), str(data_dir)
    cfg.model.update(path="tiny", tokenizer="tiny", init="random", gpu_only=False)
    cfg.train.update(global_batch_size=8, max_tokens_per_micro_batch=256, lr=3e-3, steps=6, save_steps=[3],
                     save_epoch_ends=False, state_every=2, warmup_ratio=0.2, activation_checkpointing=True)
    cfg.logging.wandb = False
    for k, v in train.items():
        key = k if ("." in k or k in ("resume", "seed")) else f"train.{k}"
        OmegaConf.update(cfg, key, v, merge=False)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / layout.CONFIG
    OmegaConf.save(cfg, path)
    return path
