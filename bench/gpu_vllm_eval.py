"""Speed of the vLLM backend on one bench, on a GPU (in .venv-vllm: `make venv-vllm`).

Runs `evaluate` with backend=vllm on one bench and prints examples/s; with `compare_hf=true` it
also runs the hf backend on the same items and prints the ratio (baseline: hf) and how many
predictions agree (greedy decoding on both, so they should mostly match; bf16 kernels differ).

    python bench/gpu_vllm_eval.py ckpt=MODEL_DIR bench_root=../shared/benchmarks \
        corpus=../shared/benchmarks/corpus/wiki18_example_10.jsonl [bench=bamboogle] [n=125] \
        [tensor_parallel_size=1] [max_model_len=16384] [max_new_tokens=2048] [compare_hf=false] [out=/tmp/vllm_eval]
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEFAULTS = {"ckpt": None, "bench": "bamboogle", "bench_root": None, "corpus": None, "n": 125,
            "tensor_parallel_size": 1, "max_model_len": 16384, "max_new_tokens": 2048, "max_turns": 8,
            "compare_hf": False, "out": "/tmp/vllm_eval"}


def main(argv=None) -> int:
    from omegaconf import OmegaConf

    from common.cli import apply_overrides, run_cli

    def _main(args):
        cfg = apply_overrides(OmegaConf.create(DEFAULTS), args)
        try:
            import vllm  # noqa: F401
        except ImportError:
            print("vLLM is not installed: its own environment, `make venv-vllm` (then .venv-vllm/bin/python bench/gpu_vllm_eval.py ...)", file=sys.stderr)
            return 2
        from evals.run import evaluate

        common = {"ckpt": cfg.ckpt, "benches": [cfg.bench], "n": cfg.n, "bench_root": cfg.bench_root,
                  "corpus": cfg.corpus, "max_model_len": cfg.max_model_len, "max_new_tokens": cfg.max_new_tokens,
                  "max_turns": cfg.max_turns, "batch_size": 1024}
        rates, preds = {}, {}
        for backend in (["vllm", "hf"] if cfg.compare_hf else ["vllm"]):
            out = Path(cfg.out) / backend
            t0 = time.perf_counter()
            s = evaluate({**common, "backend": backend, "tensor_parallel_size": cfg.tensor_parallel_size,
                          "out": str(out)})[cfg.bench]
            dt = time.perf_counter() - t0
            rates[backend] = s["n"] / dt
            preds[backend] = {json.loads(line)["id"]: json.loads(line)["prediction"] for line in open(out / f"{cfg.bench}.jsonl")}
            print(f"{backend}: {s['n']} examples in {dt:.1f}s = {rates[backend]:.2f} ex/s; "
                  f"EM {100 * s['em']:.1f} F1 {100 * s['f1']:.1f} turns {s['mean_turns']:.2f}")
        if cfg.compare_hf:
            same = sum(preds["vllm"][k] == preds["hf"].get(k) for k in preds["vllm"])
            print(f"vllm / hf = {rates['vllm'] / rates['hf']:.2f}x; identical predictions {same}/{len(preds['vllm'])}")
        return 0

    return run_cli(_main, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
