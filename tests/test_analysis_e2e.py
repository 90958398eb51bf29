"""analyze end-to-end on tiny step checkpoints through the real evals harness (HF backend, BM25, CPU)."""
import json

import pytest

from launch.analyze import run_analysis
from common.io import write_jsonl

pytest.importorskip("evals.run", reason="needs the evals harness (evals.run.evaluate)")
pytest.importorskip("envs.search_plan_act", reason="needs envs.search_plan_act for the search_plan_ood bench")

FACTS = [("Lomira", "capital", "Velsk"), ("Tandor", "river", "Ossa"), ("Brimhal", "founder", "Ulla Kest"),
         ("Corvale", "singer", "Mirt Dun"), ("Zenpel", "height", "4120 m")]


def make_tree(root, steps=(1, 2)):
    """A corpus, the synthqa bench, run r2e/seed0 with a tiny checkpoint per step and a tiny anchor under `root`."""
    from sft.tiny import save_tiny_model

    bench_root = root / "benches"
    (bench_root / "synthqa").mkdir(parents=True)
    write_jsonl(root / "corpus.jsonl", ({"id": str(i), "contents": f'"{name}"\nThe {attr} of {name} is {val}.'}
                                        for i, (name, attr, val) in enumerate(FACTS)))
    write_jsonl(bench_root / "synthqa" / "test.jsonl", ({"id": f"q{i}", "question": f"What is the {attr} of {name}?",
                                                         "golden_answers": [val]} for i, (name, attr, val) in enumerate(FACTS)))
    runs = root / "runs"
    for step in steps:  # "training steps": different random inits stand in for trained weights
        save_tiny_model(runs / "r2e" / "seed0" / "checkpoints" / f"step-{step:06d}", seed=step)
    anchor = save_tiny_model(root / "base", seed=0)
    return root, runs, bench_root, anchor


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return make_tree(tmp_path_factory.mktemp("e2e"))


def test_analyze_evaluates_tiny_checkpoints_then_nothing(world):
    root, runs, bench_root, anchor = world
    calls = []

    from evals.run import evaluate

    def counting(cfg):
        calls.append(cfg)
        return evaluate(cfg)

    cfg = {"runs_root": str(runs), "out": str(root / "reports"), "benches": ["synthqa", "search_plan_ood"],
           "anchor": str(anchor),
           "eval": {"n": 2, "corpus": str(root / "corpus.jsonl"), "bench_root": str(bench_root), "max_turns": 2,
                    "max_model_len": 1024, "max_new_tokens": 8, "progress": False, "index_dir": str(root / "idx")}}
    res = run_analysis(cfg, evaluator=counting)
    assert len(calls) == 3 and not res.evaluated.failures
    assert sorted(c["prompt"] for c in calls) == ["anchor_nudge", "tool_agent", "tool_agent"]
    for step in (1, 2):
        d = runs / "r2e" / "seed0" / "eval" / f"step-{step:06d}"
        assert set(json.loads((d / "summary.json").read_text())) == {"synthqa", "search_plan_ood"}
        assert len((d / "synthqa.jsonl").read_text().splitlines()) == 2
    t = res.table
    assert set(zip(t.arm, t.step)) == {("r2e", 1), ("r2e", 2), ("anchor", 0)}
    assert {"em", "f1", "reward"} <= set(t.metric)
    assert res.missing == []
    assert all(p.is_file() for f in res.figures for p in f.paths)
    em = t[(t.bench == "synthqa") & (t.metric == "em")].value
    if (em == 0).all():  # the random tiny model scores 0 everywhere: a one-line note, not an empty plot
        assert res.figures[0].notes["synthqa"].startswith("synthqa: every value is 0")
    else:
        assert res.figures[0].series["synthqa"] == ["r2e", "anchor"]
    # pre = the anchor, evaluated through the same harness: only checkpoint and prompt differ (expected).
    report = res.report.read_text()
    assert "under different settings" not in report and "no recorded evaluation identity" not in report
    assert "tables/prepost" in report and " [" in (root / "reports" / "tables" / "prepost.md").read_text()
    again = run_analysis(cfg, evaluator=counting)
    assert len(calls) == 3 and again.table.equals(res.table)


def test_a_context_window_smaller_than_every_prompt_is_not_measured_not_a_zero(tmp_path):
    """evaluate.max_model_len below every first prompt: no item of the bench generated a token, at the anchor or the
    checkpoint. The report says the bench was not measured (cells, missing points, the behaviour tables' note),
    with max_model_len and the longest prompt; before: EM 0.000 for both, a transition table of 0 → 0 and exit 0."""
    _, runs, bench_root, anchor = make_tree(tmp_path, steps=(1,))
    out = tmp_path / "reports"
    res = run_analysis({"runs_root": str(runs), "out": str(out), "benches": ["synthqa"], "anchor": str(anchor),
                        "eval": {"n": 2, "corpus": str(tmp_path / "corpus.jsonl"), "bench_root": str(bench_root),
                                 "max_turns": 2, "max_model_len": 64, "max_new_tokens": 8, "progress": False,
                                 "index_dir": str(tmp_path / "idx")}})
    assert not res.evaluated.failures
    assert res.table[res.table.metric.isin(["em", "f1"])].empty   # no 0.0 anywhere in results.csv
    report = res.report.read_text()
    assert "0.000" not in report, report
    for who in ("r2e/seed0/step-000001", "anchor/seed0/step-000000"):
        line = next(x for x in report.splitlines() if x.startswith(f"- {who} × synthqa: "))
        assert "no score: not measured: 2 of 2 items never generated a token" in line and "max_model_len=64" in line
    main = (out / "tables" / "main_em.md").read_text()
    assert "| r2e (final, step 1) | – (no score: not measured: 2 of 2 items never generated a token" in main
    assert "Not decomposed: anchor × synthqa (open): no score: not measured" in report
