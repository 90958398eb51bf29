"""Benchmark: data_prep's arm build vs TRL's own SFT dataset preparation, same trajectories.

    .venv/bin/python bench/bench_data_prep.py [--n 3500] [--tokenizer PATH] [--num-proc 2]

Generates a realistic-length synthetic r2e arm (R2E-Gym raw format; p50 ~15k Qwen3 tokens with the
default knobs), then times, each in its own process so peak RSS is per path:
- ours: `data_prep.build.build_arm` from the raw file (read, canonicalize, render with the chat
  template, per-turn prefix checks, tokenize, assistant loss masks, save_to_disk);
- trl:  `SFTTrainer._prepare_dataset` (TRL's own SFT preparation: chat template + tokenize +
  labels) on the same canonical conversations. TRL can't build assistant-only masks for the
  Qwen3-4B-Thinking-2507 template (`get_training_chat_template` refuses it: no `{% generation %}`
  markers and no patch for this template), so its nearest supported path is plain tokenization of
  the whole conversation (`assistant_only_loss=False`, loss on every token).
Prints trajectories/s, tokens/s, peak memory and the speed ratio. Not a test: numbers depend on
the machine and its load.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

REALISTIC = {"code_turns": [20, 30], "code_obs_lines": [15, 40], "code_thought_words": [20, 60], "long_fraction": 0.0}


def _peak_mb() -> float:
    """Peak RSS of this process plus the largest worker process (both paths use worker pools;
    ru_maxrss of RUSAGE_CHILDREN is the largest child's peak, not a sum)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return (own + child) / 1024


def _cpu_seconds() -> float:
    """CPU time of this process and its finished workers: the load-independent cost."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _ours(args) -> dict:
    from data_prep.build import build_arm

    cfg = {"sources": {"code": [f"r2e-gym:{args.raw}"]}, "n": args.n, "allow_fewer": True}
    t = time.perf_counter()
    c = _cpu_seconds()
    m = build_arm(cfg, arm="r2e", seed=0, tokenizer=args.tokenizer, out=args.out, num_proc=args.num_proc)
    dt = time.perf_counter() - t
    return {"seconds": dt, "cpu_seconds": _cpu_seconds() - c, "trajectories": m["counts"]["kept"], "tokens": m["tokens"]["total"], "p50": m["tokens"]["p50"],
            "trainable_fraction": m["tokens"]["trainable_fraction"], "peak_rss_mb": _peak_mb()}


def _trl(args) -> dict:
    from types import SimpleNamespace

    import datasets
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from data_prep.readers import read_source

    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    recs = [o.record for o in read_source(f"r2e-gym:{args.raw}") if o.record][: args.n]
    ds = datasets.Dataset.from_list([{"messages": r["messages"], "tools": json.dumps(r["tools"])} for r in recs])
    cfg = SFTConfig(output_dir=args.out, assistant_only_loss=False, max_length=None, dataset_num_proc=args.num_proc,
                    report_to=[], use_cpu=True)
    fake = SimpleNamespace(_tokenizer=tok, chat_template=None, completion_only_loss=False)
    t, c = time.perf_counter(), _cpu_seconds()
    out = SFTTrainer._prepare_dataset(fake, ds, tok, cfg, packing=False, formatting_func=None, dataset_name="train")
    dt = time.perf_counter() - t
    cpu = _cpu_seconds() - c
    n_tok = sum(len(x) for x in out["input_ids"])
    return {"seconds": dt, "cpu_seconds": cpu, "trajectories": len(out), "tokens": n_tok, "peak_rss_mb": _peak_mb()}


def _run_phase(phase: str, args, raw: Path, out: Path) -> dict:
    cmd = [sys.executable, __file__, "--phase", phase, "--raw", str(raw), "--out", str(out), "--n", str(args.n),
           "--tokenizer", args.tokenizer, "--num-proc", str(args.num_proc)]
    res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if res.returncode != 0:
        raise SystemExit(f"{phase} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    shared = ROOT.parent / "shared" / "fixtures" / "qwen3_tokenizer"
    ap.add_argument("--n", type=int, default=3500)
    ap.add_argument("--tokenizer", default=str(shared) if shared.exists() else "tiny")
    ap.add_argument("--num-proc", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--phase", choices=["ours", "trl"])
    ap.add_argument("--skip-trl", action="store_true", help="time data_prep only (e.g. when memory is short)")
    ap.add_argument("--raw")
    ap.add_argument("--out")
    args = ap.parse_args()
    from common.tiny import resolve_tokenizer

    args.tokenizer = resolve_tokenizer(args.tokenizer)
    if args.phase:
        print(json.dumps(_ours(args) if args.phase == "ours" else _trl(args)))
        return
    from common.io import write_jsonl
    from data_prep.synthetic import code_rows, config_from

    with tempfile.TemporaryDirectory() as d:
        raw = Path(d) / "r2e.jsonl"
        t = time.perf_counter()
        write_jsonl(raw, code_rows(args.n, 0, config_from(REALISTIC)))
        print(f"generated {args.n} synthetic r2e trajectories in {time.perf_counter() - t:.1f}s; tokenizer {args.tokenizer}; "
              f"num_proc {args.num_proc}; cores {os.cpu_count()}; load avg {os.getloadavg()[0]:.1f}")
        ours = _run_phase("ours", args, raw, Path(d) / "ours")
        trl = None if args.skip_trl else _run_phase("trl", args, raw, Path(d) / "trl")
    print(f"\n{'path':<28}{'traj':>6}{'seconds':>10}{'CPU s':>8}{'traj/s':>9}{'tokens/s':>12}{'peak MB*':>10}")
    for name, r in (("data_prep (masks+checks)", ours), ("TRL _prepare_dataset", trl)):
        if r is None:
            continue
        print(f"{name:<28}{r['trajectories']:>6}{r['seconds']:>10.1f}{r['cpu_seconds']:>8.0f}{r['trajectories'] / r['seconds']:>9.1f}"
              f"{r['tokens'] / r['seconds']:>12.0f}{r['peak_rss_mb']:>10.0f}")
    print("* main process + largest worker process")
    print(f"\nours: p50 {ours['p50']:.0f} tokens/trajectory, trainable fraction {ours['trainable_fraction']:.3f}")
    if trl is None:
        return
    print(f"speed ratio (TRL seconds / data_prep seconds): {trl['seconds'] / ours['seconds']:.2f}x "
          f"(CPU time: {trl['cpu_seconds'] / ours['cpu_seconds']:.2f}x)")
    print(f"memory ratio (data_prep peak / TRL peak): {ours['peak_rss_mb'] / trl['peak_rss_mb']:.2f}")


if __name__ == "__main__":
    main()
