"""Examples/s of the evals `hf` backend: lockstep batched vs one example at a time.

Same tiny random Qwen3, same synthetic bench items, same greedy decoding and caps; the only
difference is how many episodes share a `generate` call. Prints both rates and the ratio
(baseline: one-at-a-time).

    .venv/bin/python bench/bench_evals.py [n=16] [max_new_tokens=48] [max_turns=2] [micro_batch=16] [threads=1]
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _args(argv):
    cfg = {"n": 16, "max_new_tokens": 48, "max_turns": 2, "micro_batch": 16, "threads": 1}
    for tok in argv:
        k, v = tok.split("=", 1)
        if k not in cfg:
            raise SystemExit(f"unknown key {k!r}; keys: {sorted(cfg)}")
        cfg[k] = int(v)
    return cfg


def main(argv=None) -> int:
    cfg = _args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(cfg["threads"]))
    import torch

    torch.set_num_threads(cfg["threads"])
    from data_prep.synthetic import write_synthetic_bench
    from evals.backends import HFBackend
    from evals.retrievers import Bm25Retriever
    from evals.run import evaluate
    from sft.tiny import save_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = save_tiny_model(tmp / "model", seed=0)
        paths = write_synthetic_bench(tmp / "bench", seed=0, n=cfg["n"])
        backend = HFBackend(str(model), micro_batch=cfg["micro_batch"], device="cpu")
        retriever = Bm25Retriever(paths["corpus"], tmp / "idx")
        base = {"ckpt": str(model), "benches": ["synthqa"], "n": cfg["n"], "bench_root": str(tmp / "bench"),
                "corpus": paths["corpus"], "max_new_tokens": cfg["max_new_tokens"], "max_turns": cfg["max_turns"],
                "max_model_len": 4096, "progress": False}
        rates = {}
        for label, bs in (("one-at-a-time", 1), ("batched", cfg["micro_batch"])):
            backend.micro_batch = bs
            t0 = time.perf_counter()
            summary = evaluate({**base, "batch_size": bs, "micro_batch": bs, "out": str(tmp / label)},
                               backend=backend, retriever=retriever)
            dt = time.perf_counter() - t0
            rates[label] = summary["synthqa"]["n"] / dt
            print(f"{label:>14}: {summary['synthqa']['n']} examples in {dt:.2f}s = {rates[label]:.2f} ex/s "
                  f"(mean turns {summary['synthqa']['mean_turns']:.2f})")
        print(f"batched / one-at-a-time = {rates['batched'] / rates['one-at-a-time']:.2f}x "
              f"(micro_batch={cfg['micro_batch']}, threads={cfg['threads']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
