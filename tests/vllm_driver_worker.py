"""The vLLM-tier driver check, in its own process (vLLM spawns its engine core: `__main__` guard):
`python tests/vllm_driver_worker.py OUT_ROOT RESULT.json BENCH_ROOT`.

One AsyncLLM engine (evals.backends.AsyncVLLMBackend) on the tiny base evaluates the same request
twice, with driver=lockstep (each turn one batch of requests submitted together) and driver=async
(one coroutine per episode, at most 3 in flight), greedy, into two out dirs; the prefix cache is
reset in between. Records vLLM's prefix-cache hit rate of each run."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BENCHES = ("bamboogle", "search_plan_ood", "babyai")


def main(out_root: Path, result: Path, bench_root: Path) -> None:
    from evals.backends import AsyncVLLMBackend
    from evals.run import evaluate

    root = Path(__file__).resolve().parents[1]
    ckpt = str(root / "common" / "tiny_base")
    cfg = {"ckpt": ckpt, "benches": list(BENCHES), "n": 4, "bench_n": {"search_plan_ood": 2, "babyai": 4},
           "babyai_max_steps": 6, "ood_max_turns": 4, "max_turns": 3, "bench_root": str(bench_root),
           "corpus": str(bench_root / "corpus" / "wiki18_example_10.jsonl"), "index_dir": str(out_root / "idx"),
           "max_model_len": 4096, "max_new_tokens": 64, "babyai_max_new_tokens": 64, "babyai_temperature": 0,
           "dtype": "float32", "backend": "vllm", "progress": False, "wandb": False}
    engine = AsyncVLLMBackend(ckpt, max_model_len=4096, dtype="float32", seed=42)
    stats = {}
    try:
        for driver, extra in (("lockstep", {}), ("async", {"max_in_flight": 3})):
            before = (engine.prefix_cache.queries, engine.prefix_cache.hits)
            evaluate({**cfg, "driver": driver, "out": str(out_root / driver), **extra}, backend=engine)
            q, h = engine.prefix_cache.queries - before[0], engine.prefix_cache.hits - before[1]
            stats[driver] = {"prefix_queries": q, "prefix_hits": h}
            engine.run(engine.reset_prefix_cache())
    finally:
        engine.close()
    result.write_text(json.dumps({"benches": list(BENCHES), "prefix_cache": stats}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
