"""Synthetic run trees for the analysis tests (helpers only, no tests): summary.json + per-example jsonl."""
from __future__ import annotations

import json
from pathlib import Path

from common.io import write_json


def example_scores(n: int, value: float) -> list[float]:
    """n per-example 0/1 scores whose mean is `value` rounded to 1/n (first k examples correct)."""
    k = round(value * n)
    return [1.0] * k + [0.0] * (n - k)


def write_eval(eval_dir: Path, bench_values: dict[str, float], n: int = 10) -> None:
    """A summary.json + <bench>.jsonl per bench; search_plan_ood gets the harness's reward + reward_<component> instead of EM."""
    eval_dir.mkdir(parents=True, exist_ok=True)
    summary = {}
    for bench, value in bench_values.items():
        scores = example_scores(n, value)
        mean = sum(scores) / n
        lines = []
        for i, s in enumerate(scores):
            if bench == "search_plan_ood":
                metrics = {"reward": s, "reward_outcome": s, "reward_grounding": 1.0, "reward_stop": s}
            else:
                metrics = {"em": s, "f1": s, "cover_em": s, "strict_em": s}
            lines.append(json.dumps({"id": f"{bench}-{i}", "metrics": metrics, "num_tool_calls": 2 * s,
                                     "extract_rule": "final_answer" if s else "none"}))
        (eval_dir / f"{bench}.jsonl").write_text("\n".join(lines) + "\n")
        if bench == "search_plan_ood":
            summary[bench] = {"reward": mean, "reward_outcome": mean, "reward_grounding": 1.0, "reward_stop": mean,
                              "format_failure_rate": 0.0, "n": n, "source": "envs.search_plan_act/ood",
                              "stop_reasons": {"finish": n}}
        else:
            summary[bench] = {"em": mean, "f1": mean, "cover_em": mean, "strict_em": mean,
                              "format_failure_rate": 1 - mean, "n": n, "mean_turns": 2.0, "mean_tool_calls": 2 * mean}
    write_json(eval_dir / "summary.json", summary)


def make_run(root: Path, arm: str, seed: int, steps: list[int], *, evaluated: dict[int, dict[str, float]] | None = None,
             horizon: int | None = None, save_steps: list[int] | None = None, done: bool = True,
             manifest: dict | None = None) -> Path:
    """A run dir with fake checkpoints at `steps` and evals from `evaluated[step] = {bench: value}`."""
    run = root / arm / f"seed{seed}"
    for s in steps:
        ck = run / "checkpoints" / f"step-{s:06d}"
        ck.mkdir(parents=True)
        (ck / "config.json").write_text("{}")
    for s, values in (evaluated or {}).items():
        write_eval(run / "eval" / f"step-{s:06d}", values)
    run.mkdir(parents=True, exist_ok=True)
    horizon = horizon if horizon is not None else max(steps, default=0)
    (run / "config.yaml").write_text(
        f"arm: {arm}\nseed: {seed}\ntrain:\n  steps: {horizon}\n  save_steps: {save_steps or steps}\n"
        f"  epochs: 1\n  global_batch_size: 1\n  save_epoch_ends: false\ndata:\n  n: {max(horizon, 1)}\n")
    write_json(run / "manifest.json", manifest or {"git": {"commit": f"abc{seed}", "dirty": False},
                                                   "data": {"fingerprint": f"fp-{arm}"}})
    if done:
        (run / "DONE").write_text("")
    return run


def drawn_figures(monkeypatch, grab) -> dict:
    """Figures drawn but not rendered (empty PDF/PNG files under their names); per figure stem, `grab(fig)` of
    the figure as drawn (its legend, lines, tick labels)."""
    import matplotlib.pyplot as plt

    import analysis.figures

    seen: dict = {}

    def save(fig, info, out_stem, rows):
        seen[out_stem.stem] = grab(fig)
        for ext in ("pdf", "png"):
            out_stem.with_suffix(f".{ext}").write_bytes(b"")
            info.paths.append(out_stem.with_suffix(f".{ext}"))
        plt.close(fig)

    monkeypatch.setattr(analysis.figures, "save_figure", save)
    return seen
