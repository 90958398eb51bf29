"""Pretrain the embedded tiny base (`model=tiny_base`): `python -m sft.tiny_pretrain [--out DIR]`.

The real study fine-tunes a pretrained model that can already read; a random-init tiny model
spends most of a CPU demo learning to read at all (measured: the search arm needs ~500 steps x 8
trajectories before it copies an answer out of a retrieved document). This script gives the tiny
architecture (`sft.tiny.TINY_CONFIG`) that one skill, deterministically, in ~25 minutes on a
2-core CPU (run once; the result is committed): plain-text reading comprehension
(`data_prep.synthetic.reading_items`) about a synthetic world that no demo or test bench uses,
partly laid out as JSON lines. The base has never seen the chat template, a tool call or
`Final answer:`; SFT teaches those.

What was measured on the way (one search-arm SFT of 200 steps x 4 trajectories, lr 1e-3, then
synthqa EM): without the JSON layout, a longer-pretrained base (1200 steps, reading 0.42) had
become rigid — it never produced the tool-call JSON in 200 steps, while its 800-step sibling did;
with the JSON layout, 800 steps (reading 0.20) learned the format by step 100 but copied names
badly (EM 0.03); the committed 1600 steps (reading 0.62) reach EM 0.78.

The committed result lives in `common/tiny_base/` (a Hugging Face model dir + `pretrain.json` with
the settings, the loss curve and the held-out reading accuracy). Training is deterministic (same
seed, same data order, single process; tests/test_tiny_base.py gets byte-identical weights from
two short runs); the full 1600-step run has not been repeated to compare with the committed file.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from common.tiny import TINY_BASE_DIR

# The demo and tests build their worlds from small seeds (0, 1, ...); these are far from them.
PRETRAIN_WORLD_SEED = 90_001
HELDOUT_WORLD_SEED = 90_002  # reading accuracy is measured on a world never trained on


@dataclass
class PretrainConfig:
    steps: int = 1600
    batch: int = 16              # rows per step
    seq_len: int = 512           # tokens per row (whole passages packed, never split)
    lr: float = 3e-3
    warmup: int = 30
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    seed: int = 0
    n_entities: int = 5000       # large, so memorizing the world is harder than reading
    eval_every: int = 100
    eval_n: int = 200


def _encode(tok, texts: list[str]) -> list[list[int]]:
    eos = tok.convert_tokens_to_ids("<|endoftext|>")
    return [ids + [eos] for ids in tok(texts, add_special_tokens=False)["input_ids"]]


def pack_rows(seqs: list[list[int]], seq_len: int, pad_id: int):
    """Greedy in-order packing into rows of `seq_len`: (input_ids, position_ids, labels) tensors.

    position_ids restart at 0 for each passage, which (with no attention mask and use_cache=False)
    keeps attention inside a passage; a passage's first token is not a training target."""
    rows, cur = [], []
    for s in seqs:
        if len(s) > seq_len:
            raise ValueError(f"a pretraining passage has {len(s)} tokens > seq_len {seq_len}")
        if sum(map(len, cur)) + len(s) > seq_len:
            rows.append(cur)
            cur = []
        cur.append(s)
    if cur:
        rows.append(cur)
    ids = torch.full((len(rows), seq_len), pad_id, dtype=torch.long)
    pos = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for r, row in enumerate(rows):
        o = 0
        for s in row:
            n = len(s)
            ids[r, o:o + n] = torch.tensor(s)
            pos[r, o:o + n] = torch.arange(n)
            labels[r, o + 1:o + n] = torch.tensor(s[1:])
            o += n
        pos[r, o:] = torch.arange(seq_len - o)  # padding: its own "passage", no targets
    return ids, pos, labels


def reading_accuracy(model, tok, n: int, seed: int) -> dict[str, float]:
    """Per layout (and "all"): the share of held-out passages whose answer tokens are all the
    greedy (argmax) prediction given the text before them. The world is one never trained on, so
    this measures reading the passage, not recall."""
    from data_prep.synthetic import READING_LAYOUTS, SyntheticConfig, reading_items

    items = reading_items(n, seed, SyntheticConfig(world_seed=HELDOUT_WORLD_SEED, n_entities=500))
    hits: dict[str, list[int]] = {k: [] for k in READING_LAYOUTS}
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for layout, before, answer, _ in items:
            prompt = before.rstrip(" ")  # byte-level BPE keeps the space with the answer's first word
            p = tok(prompt, add_special_tokens=False)["input_ids"]
            full = tok(before + answer, add_special_tokens=False)["input_ids"]
            if full[:len(p)] != p:
                raise RuntimeError(f"tokenizer merged across the answer boundary: {before!r} + {answer!r}")
            a = full[len(p):]
            pred = model(input_ids=torch.tensor([full]), use_cache=False).logits[0, len(p) - 1:-1].argmax(-1)
            hits[layout].append(int(pred.tolist() == a))
    model.train(was_training)
    acc = {k: round(sum(v) / len(v), 4) for k, v in hits.items() if v}
    acc["all"] = round(sum(map(sum, hits.values())) / len(items), 4)
    return acc


def lr_at(step: int, cfg: PretrainConfig) -> float:
    # The committed weights were trained with this curve: sft.optim.lr_factor's cosine before
    # TRAINER_SEMANTICS 2 (warmup one step ahead of transformers' definition). Kept as it was so
    # the base stays reproducible; it is not the fine-tuning schedule.
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def pretrain(out: Path, cfg: PretrainConfig, log=print) -> dict:
    from transformers import AutoModelForCausalLM

    from common.io import sha256_text
    from data_prep.synthetic import SyntheticConfig, reading_texts

    from .optim import param_groups
    from common.tiny import tiny_config, tiny_tokenizer

    from .tiny import save_tiny_model

    tok = tiny_tokenizer()
    torch.manual_seed(cfg.seed)
    conf = tiny_config()
    conf._attn_implementation = "sdpa"
    model = AutoModelForCausalLM.from_config(conf, dtype=torch.float32)
    model.train()

    # Enough passages for every step; ~180 tokens each, so ~2.8 per 512-token row.
    world = SyntheticConfig(world_seed=PRETRAIN_WORLD_SEED, n_entities=cfg.n_entities)
    n_texts = cfg.steps * cfg.batch * cfg.seq_len // 150
    texts = reading_texts(n_texts, cfg.seed, world)
    ids, pos, labels = pack_rows(_encode(tok, texts), cfg.seq_len, tok.pad_token_id)
    need = cfg.steps * cfg.batch
    if len(ids) < need:
        raise RuntimeError(f"packed only {len(ids)} rows for {need} needed; raise the passage count")
    log(f"pretrain: {len(texts)} passages -> {len(ids)} rows of {cfg.seq_len}; {cfg.steps} steps x {cfg.batch} rows")

    opt = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(0.9, 0.95))
    curve, evals = [], []
    t0 = time.time()
    for step in range(cfg.steps):
        sl = slice(step * cfg.batch, (step + 1) * cfg.batch)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        loss = model(input_ids=ids[sl], position_ids=pos[sl], labels=labels[sl], use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        curve.append(round(loss.item(), 4))
        done = step + 1
        if done % 25 == 0 or done == cfg.steps:
            log(f"pretrain step {done}/{cfg.steps} loss {sum(curve[-25:]) / len(curve[-25:]):.3f} "
                f"lr {lr_at(step, cfg):.2e} {time.time() - t0:.0f}s")
        if done % cfg.eval_every == 0 or done == cfg.steps:
            acc = reading_accuracy(model, tok, cfg.eval_n, seed=1)
            evals.append({"step": done, "heldout_reading_accuracy": acc})
            log(f"pretrain step {done}: held-out reading accuracy " + " ".join(f"{k} {v:.3f}" for k, v in acc.items()))

    out = Path(out)
    save_tiny_model(out, model=model)
    info = {
        "what": "tiny Qwen3 (sft.tiny.TINY_CONFIG) pretrained on plain-text reading comprehension",
        "command": "python -m sft.tiny_pretrain",
        "config": asdict(cfg),
        "world_seed": PRETRAIN_WORLD_SEED,
        "heldout_world_seed": HELDOUT_WORLD_SEED,
        "corpus_sha256": sha256_text("\n\x00".join(texts)),
        "torch": torch.__version__,
        "seconds": round(time.time() - t0, 1),
        "loss_first": curve[0], "loss_last25": round(sum(curve[-25:]) / len(curve[-25:]), 4),
        "loss_curve_every_25": curve[::25],
        "evals": evals,
    }
    (out / "pretrain.json").write_text(json.dumps(info, indent=2) + "\n")
    log(f"wrote {out}")
    return info


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(TINY_BASE_DIR))
    for k, v in asdict(PretrainConfig()).items():
        ap.add_argument(f"--{k.replace('_', '-')}", type=type(v), default=v)
    args = vars(ap.parse_args(argv))
    out = args.pop("out")
    zero_ok = ("warmup", "seed", "weight_decay", "min_lr_ratio")   # every other count and rate must be positive
    bad = [f"--{k.replace('_', '-')} {v}: out of range" for k, v in args.items()
           if v < 0 or (v == 0 and k not in zero_ok) or (k == "min_lr_ratio" and v > 1)]
    bad += [f"--out {out} is a file; expected a directory"] if Path(out).exists() and not Path(out).is_dir() else []
    if bad:
        print(f"error: {bad[0]}", file=sys.stderr)
        return 2
    pretrain(Path(out), PretrainConfig(**args), log=lambda msg: print(msg, flush=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
