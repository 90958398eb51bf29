"""`evaluate(cfg) -> summary`: score one checkpoint on a list of benches.

For each bench: sample the items (ids saved to `<out>/sampled_ids/<bench>.json`), skip the ids
already in `<out>/<bench>.jsonl`, run the rest through the agent loop `batch_size` episodes at a
time (appending each finished batch), then summarize the whole file into `<out>/summary.json`
(`{bench: {em, f1, cover_em, strict_em, format_failure_rate, n, mean_turns, mean_tool_calls, ...}}`,
metrics in [0, 1]; search_plan_ood carries `reward` and `reward_<component>`). Run details
(checkpoint, prompt, backend, n, seed, sampled-id files, the 7-bench mean) go to `<out>/meta.json`.
"""
from __future__ import annotations

import functools
import json
import platform
import time
from pathlib import Path

from omegaconf import OmegaConf
from tqdm import tqdm

from common.io import write_json
from evals import tasks
from evals.agent import run_episodes
from evals.benches import OOD_BENCH, SEARCH7, load_bench
from evals.config import resolve
from evals.metrics import unweighted_mean
from evals.results import QA_KEYS, ResultsError, append_rows, load_done, summarize
from evals.toolcalls import detect_style


def _sampled_ids(out: Path, bench: str, source: str, cfg, ids: list[str]) -> Path:
    """Store the sample; a resumed run must be evaluating the very same ids."""
    path = out / "sampled_ids" / f"{bench}.json"
    if path.exists():
        old = json.loads(path.read_text(encoding="utf-8"))
        if old["ids"] != ids:
            raise ResultsError(
                f"{path}: this out dir was started with a different sample of {bench} "
                f"(n={old['n']}, seed={old['seed']}, source={old['source']}); use a fresh out="
            )
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, {"bench": bench, "source": source, "seed": int(cfg.seed), "n": len(ids), "ids": ids})
    return path


def _bench_parts(bench: str, cfg, retriever):
    """(items, source, make_episode, execute, is_done, make_row) for one bench."""
    if bench == OOD_BENCH:
        items = tasks.ood_items(cfg.n, int(cfg.seed), cfg.ood_split)
        return items, f"envs.search_plan_act/{cfg.ood_split}", tasks.ood_episode, tasks.env_tools, tasks.env_done, tasks.ood_row
    items, source = load_bench(bench, cfg.bench_root, cfg.n, int(cfg.seed))
    execute = tasks.SearchTools(retriever, int(cfg.topk))
    make_row = functools.partial(tasks.qa_row, skip_empty_golds=bool(cfg.skip_empty_golds))
    return items, source, tasks.qa_episode, execute, (lambda ep: False), make_row


def run_bench(bench: str, cfg, backend, retriever, style: str, out: Path) -> tuple[dict, Path]:
    items, source, make_episode, execute, is_done, make_row = _bench_parts(bench, cfg, retriever)
    ids_file = _sampled_ids(out, bench, source, cfg, [it.id for it in items])
    path = out / f"{bench}.jsonl"
    done = load_done(path, {it.id for it in items})
    todo = [it for it in items if it.id not in done]
    bar = tqdm(total=len(items), initial=len(done), desc=bench, unit="ex", disable=not cfg.progress, dynamic_ncols=True)
    bs = int(cfg.batch_size)
    for start in range(0, len(todo), bs):
        chunk = todo[start:start + bs]
        episodes = [make_episode(it, cfg.prompt) for it in chunk]
        run_episodes(
            episodes, backend, execute, style=style,
            max_turns=int(cfg.ood_max_turns if bench == OOD_BENCH else cfg.max_turns),
            max_model_len=int(cfg.max_model_len), max_new_tokens=int(cfg.max_new_tokens), is_done=is_done,
        )
        rows = [make_row(ep, it) for ep, it in zip(episodes, chunk)]
        append_rows(path, rows)
        done.update((r["id"], r) for r in rows)
        bar.update(len(rows))
    bar.close()
    ordered = [done[it.id] for it in items]
    summary = summarize(ordered, QA_KEYS if bench != OOD_BENCH else None)
    summary["source"] = source
    return summary, ids_file


def _versions() -> dict:
    import torch
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}


def evaluate(cfg, *, backend=None, retriever=None) -> dict:
    """Evaluate `cfg.ckpt` on `cfg.benches`; returns the summary dict also written to summary.json.
    `backend` / `retriever` may be passed in (tests, a caller that keeps a model loaded)."""
    cfg = resolve(cfg)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    qa_benches = [b for b in cfg.benches if b != OOD_BENCH]
    if backend is None:
        from evals.backends import make_backend

        backend = make_backend(cfg)
    if retriever is None and qa_benches:
        from evals.retrievers import make_retriever

        retriever = make_retriever(cfg)
    style = cfg.tool_style if cfg.tool_style != "auto" else detect_style(backend.tokenizer.chat_template)
    summary_path = out / "summary.json"
    summary = json.loads(summary_path.read_text(encoding="utf-8")) if summary_path.exists() else {}
    ids_files = {}
    started = time.time()
    for bench in cfg.benches:
        summary[bench], ids_files[bench] = run_bench(bench, cfg, backend, retriever, style, out)
        write_json(summary_path, summary)  # after every bench, so a crash keeps finished ones
    meta = {
        "ckpt": str(cfg.ckpt), "tokenizer": cfg.tokenizer, "prompt": cfg.prompt, "backend": cfg.backend,
        "n": cfg.n, "seed": int(cfg.seed), "benches": list(cfg.benches), "tool_style": style,
        "retriever": cfg.retriever if qa_benches else None, "corpus": cfg.corpus, "retriever_url": cfg.retriever_url,
        "sampled_ids": {b: str(p) for b, p in ids_files.items()},
        "search7_mean": {k: unweighted_mean(summary, SEARCH7, k) for k in QA_KEYS},
        # items whose gold answers include one that normalizes to nothing (cover-EM 1 for anything)
        "empty_gold_items": {b: summary[b]["empty_gold_items"] for b in cfg.benches if "empty_gold_items" in summary.get(b, {})},
        "skip_empty_golds": bool(cfg.skip_empty_golds),
        "config": OmegaConf.to_container(cfg, resolve=True), "versions": _versions(),
        "seconds": round(time.time() - started, 3),
    }
    write_json(out / "meta.json", meta)
    from evals.wandb_log import log_summary

    logged = log_summary(cfg, summary)
    if logged:
        print(f"[evaluate] summary logged to {logged}", flush=True)
    return summary


def format_table(summary: dict) -> str:
    """Bench averages x100 and the unweighted 7-bench mean, for the terminal."""
    lines = [f"{'bench':<18}{'n':>6}{'EM':>8}{'F1':>8}{'coverEM':>9}{'strictEM':>10}{'fmtfail':>9}"]
    for bench, s in summary.items():
        if "em" in s:
            lines.append(f"{bench:<18}{s['n']:>6}{100 * s['em']:>8.1f}{100 * s['f1']:>8.1f}{100 * s['cover_em']:>9.1f}"
                         f"{100 * s['strict_em']:>10.1f}{100 * s['format_failure_rate']:>9.1f}")
        else:
            comps = " ".join(f"{k}={v:.3f}" for k, v in s.items() if k.startswith("reward"))
            lines.append(f"{bench:<18}{s['n']:>6}  {comps}")
    means = {k: unweighted_mean(summary, SEARCH7, k) for k in QA_KEYS}
    if means["em"] is not None:
        lines.append(f"{'7-bench mean':<18}{'':>6}{100 * means['em']:>8.1f}{100 * means['f1']:>8.1f}"
                     f"{100 * means['cover_em']:>9.1f}{100 * means['strict_em']:>10.1f}")
    return "\n".join(lines)
