"""Helpers for the sft tests: a small learnable dataset dir, a resolved config, rank launching.

The dataset is a copy task ("repeat: w1 w2 ..." -> "w1 w2 ...") tokenized with the tiny
tokenizer, only the answer trainable, lengths varied so that packing and rank splitting
have something to do. It has the dataset-dir contract's columns, so the trainer reads it
exactly as it reads data_prep's output.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
WORDS = "alpha beta gamma delta river stone cloud tiger maple orbit pixel lunar amber frost cedar".split()


def make_dataset_dir(out: Path, n: int = 48, seed: int = 0, fingerprint: str = "test-fp") -> Path:
    import datasets
    import numpy as np
    from transformers import AutoTokenizer

    from data_prep.tiny import tiny_tokenizer_path

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
    cfg = OmegaConf.load(ROOT / "recipes" / "base.yaml")
    cfg.arm, cfg.run_dir, cfg.data.dir = "test", str(run_dir), str(data_dir)
    cfg.model.update(path="tiny", tokenizer="tiny", init="random", gpu_only=False)
    cfg.train.update(global_batch_size=8, max_tokens_per_micro_batch=256, lr=3e-3, steps=6, save_steps=[3],
                     save_epoch_ends=False, state_every=2, warmup_ratio=0.2, activation_checkpointing=True)
    cfg.logging.wandb = False
    for k, v in train.items():
        key = k if ("." in k or k in ("resume", "seed")) else f"train.{k}"
        OmegaConf.update(cfg, key, v, merge=False)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "config.yaml"
    OmegaConf.save(cfg, path)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, world: int, port: int) -> dict:
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1", WANDB_MODE="offline",
               PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.pop("WANDB_API_KEY", None)
    return env


def launch(args: list[str], world: int = 2, log_dir: Path | None = None) -> list[subprocess.Popen]:
    """Start `world` ranks of `python args...` the way torchrun would (env vars), each in its
    own session so a test can kill -9 them."""
    port = free_port()
    procs = []
    for r in range(world):
        out = open(log_dir / f"rank{r}.log", "ab") if log_dir else subprocess.DEVNULL
        procs.append(subprocess.Popen([sys.executable, *args], cwd=ROOT, env=rank_env(r, world, port),
                                      stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
    return procs


def wait_all(procs, timeout: float = 300) -> list[int]:
    deadline = time.time() + timeout
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(1, deadline - time.time())))
        except subprocess.TimeoutExpired:
            kill_all(procs)
            raise
    return codes


def kill_all(procs, sig=signal.SIGKILL) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, sig)
    for p in procs:
        p.wait()


def run_ranks(config: Path, world: int = 2, timeout: float = 300, extra: list[str] = ()) -> list[int]:
    log_dir = config.parent
    return wait_all(launch(["-m", "sft.train", str(config), *extra], world, log_dir), timeout)


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines() if l.strip()]
