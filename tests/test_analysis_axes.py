"""Compute axes: curves against tokens / trainable tokens / examples seen, read from metrics.jsonl."""
import json
import math

import pytest
from test_analysis_helpers import make_run, write_eval

from analysis.axes import build_axis
from analysis.discover import discover_runs
from launch.analyze import run_analysis


def _metrics(run, rows):
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _tree(tmp_path):
    root = tmp_path / "runs"
    r0 = make_run(root, "r2e", 0, [2, 4], evaluated={2: {"nq": 0.3}, 4: {"nq": 0.5}})
    s0 = make_run(root, "search", 0, [2, 4], evaluated={2: {"nq": 0.4}, 4: {"nq": 0.6}})
    # cumulative counters as sft.train logs them (r2e trajectories are longer); a resumed segment's
    # repeated step 3 row: the last one wins
    _metrics(r0, [{"step": s, "tokens": 900, "tokens_seen": 900 * s, "trainable_tokens_seen": 300 * s,
                   "examples_seen": 2 * s} for s in (1, 2, 3, 3, 4)])
    _metrics(s0, [{"step": s, "tokens": 150, "tokens_seen": 150 * s + 7, "trainable_tokens_seen": 40 * s,
                   "examples_seen": 2 * s} for s in (1, 2, 3, 4)])
    write_eval(root / "_anchor" / "eval" / "step-000000", {"nq": 0.2})
    return root


def _rows(root, arm):
    return {json.loads(line)["step"]: json.loads(line) for line in (root / arm / "seed0" / "metrics.jsonl").read_text().splitlines()}


def test_a_tokens_seen_figure_draws_each_checkpoint_at_its_metrics_counter(tmp_path):
    root = _tree(tmp_path)
    res = run_analysis({"runs_root": str(root), "out": str(tmp_path / "o"), "benches": ["nq"], "evaluate": False,
                        "axis": "tokens", "metrics": ["em"]})
    fig = next(f for f in res.figures if f.paths[0].stem == "curves_em")
    for arm in ("r2e", "search"):
        rows = _rows(root, arm)
        assert fig.x["nq"][arm] == [float(rows[2]["tokens_seen"]), float(rows[4]["tokens_seen"])]
    assert fig.xlabel == "tokens seen" and "`tokens_seen`" in fig.caption
    assert "axis=tokens (" in (tmp_path / "o" / "report.md").read_text()


@pytest.mark.parametrize("axis,key", [("trainable_tokens", "trainable_tokens_seen"), ("examples", "examples_seen")])
def test_every_compute_axis_reads_its_own_counter(tmp_path, axis, key):
    root = _tree(tmp_path)
    a = build_axis(axis, discover_runs(root))
    for arm in ("r2e", "search"):
        rows = _rows(root, arm)
        assert [a.x(arm, s) for s in (0, 2, 4)] == [0.0, float(rows[2][key]), float(rows[4][key])]
    assert a.problems == []


def test_the_step_axis_is_the_default_and_a_missing_counter_is_a_gap(tmp_path, capsys):
    root = _tree(tmp_path)
    res = run_analysis({"runs_root": str(root), "out": str(tmp_path / "o"), "benches": ["nq"], "evaluate": False,
                        "metrics": ["em"]})
    fig = next(f for f in res.figures if f.paths[0].stem == "curves_em")
    assert fig.x["nq"]["r2e"] == [2.0, 4.0] and fig.xlabel == "step"
    _metrics(root / "search" / "seed0", [{"step": 2, "tokens_seen": 300}])  # an older run: no row at step 4
    res = run_analysis({"runs_root": str(root), "out": str(tmp_path / "o2"), "benches": ["nq"], "evaluate": False,
                        "axis": "tokens", "metrics": ["em"]})
    fig = next(f for f in res.figures if f.paths[0].stem == "curves_em")
    assert fig.x["nq"]["search"][0] == 300.0 and math.isnan(fig.x["nq"]["search"][1])
    assert "search/seed0: metrics.jsonl has no tokens_seen at step 4" in (tmp_path / "o2" / "report.md").read_text()
    from launch.analyze import main

    assert main([f"runs_root={root}", "evaluate=false", "axis=token"]) == 2
    assert "axis=token: not one of step, examples, tokens, trainable_tokens (did you mean tokens?)" in capsys.readouterr().err


def test_each_seeds_teacher_forced_line_is_drawn_at_its_own_tokens_seen(tmp_path, fast_figures):
    """Two seeds of one arm see different tokens per step (different batches): each seed's teacher-forced line
    sits at that seed's own counters, not at the arm's mean (the oracle: the metrics.jsonl rows written here)."""
    from test_analysis_helpers import write_json

    root = tmp_path / "runs"
    per_step = {0: 500, 1: 1300}   # seed -> tokens per step
    for seed, tok in per_step.items():
        run = make_run(root, "r2e", seed, [2, 4])
        _metrics(run, [{"step": s, "tokens_seen": tok * s} for s in (1, 2, 3, 4)])
        for s in (2, 4):
            d = run / "eval" / f"step-{s:06d}"
            d.mkdir(parents=True)
            write_json(d / "summary.json", {"tf_code": {"loss": 2.0 - 0.1 * s - 0.05 * seed, "tokens": 100, "n": 4}})
    search = make_run(root, "search", 0, [2])
    (search / "eval" / "step-000002").mkdir(parents=True)
    write_json(search / "eval" / "step-000002" / "summary.json", {"tf_code": {"loss": 1.5, "tokens": 100, "n": 4}})
    res = run_analysis({"runs_root": str(root), "out": str(tmp_path / "o"), "benches": ["tf_code"],
                        "evaluate": False, "axis": "tokens", "compare": [["r2e", "search"]]})
    # no QA or environment bench: no EM/F1 tables (before: main_em, paired_em, compare_r2e_vs_search_em, ... with
    # no column, captioned EM and F1), and the compare request is answered in the report, not dropped silently
    assert set(res.tables) == {"teacher_forced"} and not list((tmp_path / "o" / "tables").glob("*_em.md"))
    assert "compare=[[r2e,search]]: no QA or environment bench to compare the arms on" in res.report.read_text()
    fig = next(f for f in res.figures if f.paths[0].stem == "teacher_forced")
    xs = fig.x[next(t for t in fig.x if t.endswith(": all"))]
    for seed, tok in per_step.items():
        assert xs[f"r2e/seed{seed}"] == [2.0 * tok, 4.0 * tok]
    assert "its own" in fig.caption
