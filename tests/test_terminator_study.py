"""The single- vs dual-terminator comparison (issue 41): `analyze compare=[[A, B]]`'s table (A − B per step,
over the same examples, each arm's seeds its own) against a numpy oracle, and the study variant that trains r2e_v5
beside r2e (recipes/study/variants/dual_terminator_vs_v5.yaml): it loads like a study, and its cpu_smoke runs
end to end to a report with the r2e vs r2e_v5 table."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats import t as student_t

from tests.conftest import ROOT
from tests.study_helpers import prefilled_data_cache

BENCHES = ("nq", "hotpotqa")


def _scores(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, 3, size=n) / 4.0   # 0, 0.25, 0.5: room for a +0.5 shift inside [0, 1]


def _write(eval_dir: Path, bench: str, ids: list[str], values: np.ndarray) -> None:
    eval_dir.mkdir(parents=True, exist_ok=True)
    (eval_dir / f"{bench}.jsonl").write_text(
        "".join(json.dumps({"id": i, "metrics": {"em": float(v)}}) + "\n" for i, v in zip(ids, values)))


def _points(tmp_path: Path, cells: dict[tuple[str, int, int], dict[str, np.ndarray]]):
    """Points over per-example files: (arm, seed, step) -> bench -> scores of ids q0..q{n-1}."""
    from analysis.aggregate import Points
    from analysis.collect import COLUMNS, add_mean_rows

    rows, dirs = [], {}
    for (arm, seed, step), by_bench in cells.items():
        d = tmp_path / arm / f"seed{seed}" / f"step-{step:06d}"
        dirs[(arm, seed, step)] = d
        for bench, values in by_bench.items():
            _write(d, bench, [f"q{i}" for i in range(len(values))], values)
            rows.append({**{c: None for c in COLUMNS}, "arm": arm, "seed": seed, "step": step, "bench": bench,
                         "metric": "em", "value": float(values.mean()), "n": len(values)})
    table = pd.DataFrame(rows, columns=COLUMNS).astype({"seed": "int64", "step": "int64", "value": "float64"})
    return Points(add_mean_rows(table, list(BENCHES)), dirs, list(BENCHES))


def test_compare_table_is_the_difference_per_step_over_each_arms_seeds(tmp_path):
    from analysis.collect import MEAN_BENCH
    from analysis.tables import Column, compare_table

    rng = np.random.default_rng(7)
    n = 40
    cells: dict = {}
    base = {(seed, step, b): _scores(rng, n) for seed in (0, 1) for step in (50, 100) for b in BENCHES}
    shift = {"nq": 0.5, "hotpotqa": 0.25}
    for (seed, step, b), v in base.items():
        cells.setdefault(("r2e_v5", seed, step), {})[b] = v
        cells.setdefault(("r2e", seed, step), {})[b] = v + shift[b]   # every example of every seed: exactly +shift
    # step 100: r2e_v5 seed 1 was never evaluated; each arm's seeds are its own draws, so r2e's seed 1 enters
    del cells[("r2e_v5", 1, 100)]
    cells[("r2e", 1, 100)] = {b: np.ones(n) for b in BENCHES}
    cells[("r2e", 0, 218)] = {b: np.ones(n) for b in BENCHES}   # only r2e trained to 218: no row
    points = _points(tmp_path, cells)
    cols = [Column(b, "em", b, "QA") for b in BENCHES] + [Column(MEAN_BENCH, "em", "Avg.", "QA")]
    table = compare_table(points, "r2e", "r2e_v5", cols, "em")

    assert [label for label, _ in table.rows] == ["50 (seeds 0, 1)", "100 (r2e: seeds 0, 1; r2e_v5: seed 0)"]   # each arm's
    at_100 = {b: float(np.mean([cells[("r2e", s, 100)][b].mean() for s in (0, 1)]) - cells[("r2e_v5", 0, 100)][b].mean())
              for b in BENCHES}
    pattern = r"([+-]\d\.\d{3}) \[([+-]\d\.\d{3}),([+-]\d\.\d{3})\] n=(\d+)×(\S+) (\S+)"
    for (_, row), want, seeds in zip(table.rows, [shift, at_100], ["2/2", "2/1"]):
        got = [re.fullmatch(pattern, c).groups() for c in row]
        for (delta, lo, hi, count, n_seeds, covers), w in zip(got, [want["nq"], want["hotpotqa"], np.mean(list(want.values()))]):
            assert float(delta) == pytest.approx(w, abs=1e-3) and float(lo) <= float(delta) <= float(hi), row
            assert n_seeds == seeds and covers == ("items+seeds" if seeds == "2/2" else "items")
        assert [int(g[3]) for g in got] == [n, n, 2 * n]


def test_compare_interval_covers_the_oracle_and_a_bad_pair_is_one_line(tmp_path):
    from analysis.aggregate import paired_arms
    from analysis.errors import AnalysisError
    from analysis.sweep import compare_pairs

    rng = np.random.default_rng(3)
    n = 60
    a, b = _scores(rng, n), _scores(rng, n)
    points = _points(tmp_path, {("r2e", 0, 50): {"nq": a, "hotpotqa": a}, ("r2e_v5", 0, 50): {"nq": b, "hotpotqa": b}})
    got = paired_arms(points, "r2e", "r2e_v5", 50, "nq", "em")
    assert got.seeds == {"r2e": [0], "r2e_v5": [0]} and got.dropped == 0   # each arm's seeds
    assert got.result.delta == pytest.approx(float(np.mean(a - b)))
    d = a - b   # one seed each: the items-only interval, a paired t over the items
    half = student_t.isf(0.025, n - 1) * d.std(ddof=1) / np.sqrt(n)
    assert (got.result.lo, got.result.hi) == pytest.approx((d.mean() - half, d.mean() + half))
    assert got.result.covers == "items"
    assert got.result.lo <= got.result.delta <= got.result.hi and got.result.lo < got.result.hi
    assert compare_pairs([["r2e", "r2e_v5"]]) == [("r2e", "r2e_v5")]
    for bad in ([["r2e"]], [["r2e", "r2e"]], ["r2e"], [["r2e", 3]]):
        with pytest.raises(AnalysisError, match=r"^compare\[0\]=.*pair of two different arm names"):
            compare_pairs(bad)


def test_the_variant_loads_with_both_arms_on_the_same_seeds_and_is_listed_apart():
    from common.study import VARIANT_DIR, load_study, study_names

    assert study_names(VARIANT_DIR) == ["dual_terminator_vs_v5"] and "dual_terminator_vs_v5" not in study_names()
    study = load_study("dual_terminator_vs_v5")
    train, report = study.stages
    assert train.args["arms"] == ["r2e", "r2e_v5"] and train.args["seeds"] == [0, 1, 2]
    base = load_study("dual_terminator_sft")
    assert base.stages[0].args["model"] == train.args["model"] and base.stages[0].args["seeds"] == train.args["seeds"]
    for key in ("profile", "anchor", "eval.backend"):   # judged as the dual-terminator study judges
        assert report.args[key] == base.stages[1].args[key], key
    assert report.args["compare"] == [["r2e", "r2e_v5"]]
    assert study.reference_results == base.reference_results
    assert any("compare" in line for line in study.differences())


@pytest.mark.slow
def test_the_variant_cpu_smoke_reports_r2e_against_r2e_v5(tmp_path, monkeypatch):
    """cpu_smoke end to end (both arms, same seed, 2 steps each; the anchor and both final checkpoints judged)
    from a data cache filled by `fetch-data from=DIR`: the report carries the r2e vs r2e_v5 table with a row
    for the step both reached, every cell a paired difference."""
    import os
    import subprocess
    import sys

    from common.study import load_study

    study = load_study("dual_terminator_vs_v5")
    prefilled_data_cache(tmp_path / "data", monkeypatch)
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, PYTHONPATH=str(ROOT), WANDB_MODE="disabled")
    proc = subprocess.run([sys.executable, "-m", "launch.cli", "study=dual_terminator_vs_v5", "runs_root=runs",
                           "reports=rep", *study.cpu_smoke], cwd=work, env=env, capture_output=True, text=True,
                          timeout=1500)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    for arm in ("r2e", "r2e_v5"):
        assert (work / "runs" / arm / "seed0" / "DONE").is_file(), arm
    table = (work / "rep" / "tables" / "compare_r2e_vs_r2e_v5_em.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| 2 (seed 0) |")]
    assert len(rows) == 1, table
    cell = r"[+-]\d\.\d{3} \[[+-]\d\.\d{3},[+-]\d\.\d{3}\] n=2×1/1 items, (Tango score|exact discordant)"   # one seed each, 0/1 EM
    assert re.fullmatch(rf"\| 2 \(seed 0\) \| {cell} \|", rows[0].rstrip()), rows
    report = (work / "rep" / "report.md").read_text()
    assert "### compare_r2e_vs_r2e_v5_em" in report and "`failed=0`" in report
