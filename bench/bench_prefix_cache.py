"""vLLM's prefix-cache hit rate of real evaluations under the real chat templates.

The tiny base evaluates bamboogle (open retrieval, the 10-document example corpus) and babyai under
the asynchronous driver (evals.run.evaluate, driver=async) once per chat template of
`../shared/fixtures/chat_templates/` (the template replaces the tiny tokenizer's own; rendering is
the template's, never altered), and prints vLLM's prefix-cache hit rate (tokens found cached /
prompt tokens looked up) with, as a check independent of vLLM, the share of each later turn's
prompt that is a prefix of the previous turn's prompt + reply (what a cache can reuse at best
within an episode; first turns also hit the shared system prompt of other episodes).

    VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python bench/bench_prefix_cache.py [n=8] [babyai=4]
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TEMPLATES = ("qwen3_4b_hybrid", "qwen3_4b_thinking_2507")


def _lcp(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def within_episode_reuse(tok, rows: list[dict], bench: str, kwargs=None) -> tuple[int, int]:
    """(reusable tokens, prompt tokens) over every turn after an episode's first: the common prefix
    of turn k's prompt with turn k-1's prompt + its reply."""
    from evals.agent import render
    from common.tools import SEARCH_TOOL

    enc = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    reuse = total = 0
    for r in rows:
        if bench == "babyai":
            steps = r["transcript"]
            prompts = [(enc(render(tok, t["messages"], [], kwargs)), t["reply"]) for t in steps]
        else:
            msgs = r["messages"]
            cut = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
            prompts = []
            for i in cut:
                raw = msgs[i].get("reasoning_content", "")
                reply = (raw + "</think>\n\n" if raw else "") + msgs[i].get("content", "")
                prompts.append((enc(render(tok, msgs[:i], [SEARCH_TOOL], kwargs)), reply))
        for (prev, reply), (cur, _) in zip(prompts, prompts[1:]):
            reuse += _lcp(cur, prev + enc(reply))
            total += len(cur)
    return reuse, total


def main(argv=None) -> int:
    args = dict(a.split("=", 1) for a in (sys.argv[1:] if argv is None else argv))
    n, n_babyai = int(args.get("n", 8)), int(args.get("babyai", 4))
    from evals.backends import AsyncVLLMBackend
    from evals.run import evaluate

    root = Path(__file__).resolve().parents[1]
    shared = root.parent / "shared"
    bench_root = shared / "benchmarks"
    ckpt = str(root / "common" / "tiny_base")
    engine = AsyncVLLMBackend(ckpt, max_model_len=4096, dtype="float32", seed=42)
    own = engine.tokenizer.chat_template
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for name in ("tiny (own)", *TEMPLATES):
                engine.tokenizer.chat_template = own if name.startswith("tiny") else (
                    shared / "fixtures" / "chat_templates" / f"{name}.jinja").read_text()
                engine.run(engine.reset_prefix_cache())
                q0, h0 = engine.prefix_cache.queries, engine.prefix_cache.hits
                out = Path(tmp) / name.split()[0]
                evaluate({"ckpt": ckpt, "benches": ["bamboogle", "babyai"], "n": n, "bench_n": {"babyai": n_babyai},
                          "babyai_max_steps": 8, "max_turns": 4, "bench_root": str(bench_root),
                          "corpus": str(bench_root / "corpus" / "wiki18_example_10.jsonl"),
                          "index_dir": str(Path(tmp) / "idx"), "max_model_len": 4096, "max_new_tokens": 48,
                          "babyai_max_new_tokens": 48, "babyai_temperature": 0, "dtype": "float32",
                          "backend": "vllm", "driver": "async", "progress": False, "wandb": False, "out": str(out)},
                         backend=engine)
                engine.run(__import__("asyncio").sleep(1.2))   # the last step's stats
                q, h = engine.prefix_cache.queries - q0, engine.prefix_cache.hits - h0
                parts = []
                for bench in ("bamboogle", "babyai"):
                    rows = [json.loads(x) for x in open(out / f"{bench}.jsonl")]
                    reuse, total = within_episode_reuse(engine.tokenizer, rows, bench)
                    turns = sum(r.get("num_turns", r.get("steps", 0)) for r in rows)
                    parts.append(f"{bench}: {turns} turns, later-turn prefix share {reuse / total if total else 0:.3f}")
                print(f"{name:<24} vLLM prefix-cache hit rate {h / q if q else 0:.3f} ({h}/{q} tokens); " + "; ".join(parts),
                      flush=True)
    finally:
        engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
