"""analyze on synthetic run trees: discovery, tidy table, figures, tables, report, incremental sweep, gaps."""
import json

import matplotlib.image as mpimg
import pandas as pd
import pytest
from test_analysis_helpers import drawn_figures, make_run, write_eval

from analysis.aggregate import Points, best_point, final_point, paired_vs_anchor
from launch.analyze import main as analyze_main
from analysis.collect import add_mean_rows, collect
from analysis.discover import discover_runs, provenance
from launch.evaluation import Harness, summary_benches
from launch.analyze import run_analysis
from analysis.tables import latex_cell, latex_escape
from common.cli import ConfigError

QA = ["nq", "hotpotqa"]
BENCHES = QA + ["search_plan_ood"]


def _vals(step, arm_bonus):
    return {"nq": 0.1 + arm_bonus + step / 1000, "hotpotqa": 0.2 + arm_bonus, "search_plan_ood": 0.3 + arm_bonus}


@pytest.fixture
def tree(tmp_path):
    """r2e: 2 seeds, steps 10/20 evaluated; search: 1 seed, step 10 evaluated, step 20 checkpointed only,
    step 30 expected but not yet written (still training). Anchor evaluated."""
    root = tmp_path / "runs"
    for seed in (0, 1):
        make_run(root, "r2e", seed, [10, 20], evaluated={10: _vals(10, 0.1 * seed), 20: _vals(20, 0.1 * seed)})
    make_run(root, "search", 0, [10, 20], evaluated={10: _vals(10, 0.3)}, horizon=30, save_steps=[10, 20], done=False)
    write_eval(root / "_anchor" / "eval" / "step-000000", {"nq": 0.1, "hotpotqa": 0.1, "search_plan_ood": 0.1})
    # A checkpoint being written right now and an incomplete one: neither is a checkpoint.
    (root / "r2e" / "seed0" / "checkpoints" / "step-000030.tmp-99").mkdir()
    (root / "r2e" / "seed0" / "checkpoints" / "step-000040").mkdir()
    return root


def test_discover_runs_checkpoints_and_provenance(tree):
    runs = discover_runs(tree)
    assert [(r.arm, r.seed) for r in runs] == [("r2e", 0), ("r2e", 1), ("search", 0)]
    r2e0, _, search = runs
    assert sorted(r2e0.checkpoints) == [10, 20] and sorted(r2e0.evals) == [10, 20] and r2e0.done
    assert any("step-000040: no config.json" in p for p in r2e0.problems)
    assert search.steps == [10, 20, 30] and not search.done
    assert provenance(r2e0.manifest) == {"git.commit": "abc0", "git.dirty": False, "data.fingerprint": "fp-r2e"}


def test_tidy_table_and_mean_rows(tree):
    c = collect(discover_runs(tree), tree / "_anchor" / "eval" / "step-000000", BENCHES)
    t = c.table
    assert list(t.columns) == ["arm", "seed", "step", "bench", "metric", "value", "n"]
    row = t[(t.arm == "r2e") & (t.seed == 1) & (t.step == 20) & (t.bench == "nq") & (t.metric == "em")]
    assert row.value.item() == pytest.approx(0.2) and row.n.item() == 10  # round((0.1+0.1+0.02)*10)/10
    assert set(t[t.arm == "anchor"].step) == {0}
    assert "format_failure_rate" in set(t.metric) and "n" not in set(t.metric)
    with_mean = add_mean_rows(t, QA)
    avg = with_mean[(with_mean.bench == "avg") & (with_mean.metric == "em")]
    # search seed0 step 10: nq 0.4, hotpotqa 0.5 -> 0.45
    assert avg[(avg.arm == "search") & (avg.step == 10)].value.item() == pytest.approx(0.45)
    dropped = add_mean_rows(t[~((t.arm == "search") & (t.bench == "hotpotqa"))], QA)
    assert dropped[(dropped.bench == "avg") & (dropped.arm == "search")].empty  # gap, not a 1-bench mean


def _points(tree):
    runs = discover_runs(tree)
    c = collect(runs, tree / "_anchor" / "eval" / "step-000000", BENCHES)
    dirs = {(r.arm, r.seed, s): d for r in runs for s, d in r.evals.items()}
    dirs[("anchor", 0, 0)] = tree / "_anchor" / "eval" / "step-000000"
    return Points(add_mean_rows(c.table, QA), dirs, QA,)


def test_final_best_and_paired_points(tree):
    p = _points(tree)
    final = final_point(p, "r2e", "nq", "em")  # seeds at step 20: 0.1, 0.2 over 10 shared items, 0/1 scores
    assert final.steps == [20] and (final.interval.method, final.interval.covers) == ("crossed wilson", "items+seeds")
    assert final.interval.mean == pytest.approx(0.15) and final.interval.lo < 0.15 < final.interval.hi
    assert (final.interval.n_items, final.interval.n_seeds) == (10, "2")
    one = final_point(p, "search", "nq", "em")  # one seed: items only, seed variance unknown
    assert (one.interval.covers, one.steps) == ("items", [10]) and one.interval.lo < 0.4 < one.interval.hi
    assert "seed variance unknown" in one.interval.note
    assert best_point(p, "r2e", "hotpotqa", "em").steps == [10]  # flat curve: earliest step wins the tie
    paired = paired_vs_anchor(p, "search", "nq", "em")  # 4/10 vs 1/10 correct, same ids
    assert paired.result.delta == pytest.approx(0.3) and paired.result.n == 10 and paired.dropped == 0
    ex = p.examples("search", 0, 10, "nq", "mean_tool_calls")  # from the row's num_tool_calls
    assert ex.sum() == 8.0 and p.examples("search", 0, 10, "nq", "format_failure_rate").sum() == 6.0
    reward = paired_vs_anchor(p, "search", "search_plan_ood", "reward")
    assert reward.result.delta == pytest.approx(0.5)  # 6/10 vs 1/10


def test_run_analysis_writes_figures_tables_report(tree, tmp_path):
    out = tmp_path / "reports"
    for bad, why in (({"eval": 5}, "eval=5: expected its keys"), ({"eval": {"ckpt": "m"}}, "eval.ckpt: set by analyze"),
                     ({"runs_rot": "x"}, "unknown key 'runs_rot'. Did you mean: runs_root")):
        with pytest.raises(ConfigError, match=why):   # the Python API's keys as the command line's (was a traceback; ignored)
            run_analysis({"runs_root": str(tree), "out": str(out), "evaluate": False, **bad})
    res = run_analysis({"runs_root": str(tree), "out": str(out), "benches": BENCHES, "evaluate": False},
                       evaluator=lambda cfg: pytest.fail("evaluate=false must not evaluate"))
    for name in ("results.parquet", "results.csv", "report.md"):
        assert (out / name).is_file()
    assert pd.read_parquet(out / "results.parquet").equals(res.table)
    figs = {f.paths[0].stem: f for f in res.figures}
    assert set(figs) == {"curves_em", "curves_f1", "search_plan_ood_components", "behaviour"}
    assert figs["behaviour"].panels[:2] == ["nq\ntool calls / episode", "nq\nno answer found"]
    for f in res.figures:
        pdf, png = f.paths
        assert pdf.read_bytes()[:5] == b"%PDF-" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert mpimg.imread(png).shape[0] > 300
    em = figs["curves_em"]
    assert em.panels == ["nq", "hotpotqa", "mean of 2 QA benches", "search_plan_ood (reward)"]
    assert all(em.series[p] == ["r2e", "search", "anchor"] for p in em.panels)
    assert em.gaps["nq"] == {"r2e": 0, "search": 2}  # search: step 20 unevaluated, step 30 not yet written
    assert figs["search_plan_ood_components"].panels == ["outcome", "grounding", "stop", "total reward"]
    for name in ("main_em", "main_f1", "paired_em", "paired_f1"):
        assert (out / "tables" / f"{name}.md").is_file() and (out / "tables" / f"{name}.tex").is_file()
    md = (out / "tables" / "main_em.md").read_text()
    # r2e nq at step 20: seeds right on items {0} and {0, 1} of 10. Item part s²(d)/n = (1.025/9)/10, seed part
    # s²(0.1, 0.2)/2 = 0.0025, V = 0.013889, Satterthwaite df 9.34 (t 2.250); Wilson on n_eff = 0.1275/V = 9.18:
    # [0.028, 0.521], the larger side 0.371.
    assert "| r2e (final, step 20) | 0.150 ±0.371 |" in md and "anchor (base, nudge prompt)" in md
    assert "search (best)" in md and "@10" in md
    tex = (out / "tables" / "main_em.tex").read_text()
    assert "\\multicolumn{1}{c}{General QA}" in tex and "\\multicolumn{1}{c}{Multi-Hop QA}" in tex
    assert "0.150$_{\\pm0.371}$" in tex and "\\toprule" in tex
    # search nq: one seed, 3 items gained, none lost of 10 (0/1 EM): Tango's score interval, named in the cell and
    # the caption (before: the crossed t, [-0.046, +0.646], which covered 0.87 at 95% with few changed items)
    paired_md = (out / "tables" / "paired_em.md").read_text()
    assert "+0.300 [-0.061,+0.603] n=10×1 items, Tango score |" in paired_md and "Tango's (1998) score interval" in paired_md
    assert "+0.050 [" in paired_md and "items+seeds |" in paired_md   # r2e: two seeds keep the crossed t
    report = (out / "report.md").read_text()
    intervals = pd.read_csv(out / "intervals.csv")
    row = intervals[(intervals.kind == "vs_anchor") & (intervals.arm == "r2e") & (intervals.bench == "nq")
                    & (intervals.metric == "em")].iloc[0]
    assert (row.covers, row.n_items, row.n_seeds) == ("items+seeds", 10, 2) and row.lo < row.estimate < row.hi
    assert "[`intervals.csv`](intervals.csv)" in report and "`profile=none (evaluations in eval/)`" in report
    assert "![curves_em](figures/curves_em.png)" in report and "tables/main_em.tex" in report
    assert "`git.commit`: `abc1`" in report and "`data.fingerprint`: `fp-search`" in report
    lines = [m.line() for m in res.missing]
    assert "search/seed0/step-000020 × nq: not evaluated (evaluate=false)" in lines
    assert "search/seed0/step-000030 × nq: not checkpointed yet (run still training)" in lines
    assert len(res.missing) == 6 and all(line in report for line in lines)


@pytest.mark.parametrize("width_attr", ["COLUMN_WIDTH_IN", "TEXT_WIDTH_IN"])
def test_a_caption_is_broken_into_lines_that_fit_its_figure(width_attr):
    """The caption is wrapped before drawing (not by matplotlib at each save): measured by matplotlib's own renderer,
    no line is wider than the figure, the lines use most of it, and the caption's own line breaks stay."""
    import matplotlib.pyplot as plt

    from analysis import figures

    words = ("Shaded: 95% Wilson interval over items (n=500); dotted band: Holm-adjusted simultaneous band, MMWW "
             "x-axis: optimizer steps 0-218; anchor Qwen3-4B-Thinking-2507 dashed; gaps: r2e/seed2 @150 (no bamboogle)")
    text = f"{words} {words}\nSecond paragraph kept on its own line."
    with plt.rc_context(figures.RC):
        fig = plt.figure(figsize=(getattr(figures, width_attr), 2))
        lines = figures.caption_lines(text, fig.get_figwidth()).split("\n")
        renderer = fig.canvas.get_renderer()
        widths = [fig.text(0, 0, line, fontsize=6).get_window_extent(renderer).width / fig.bbox.width for line in lines]
        plt.close(fig)
    assert max(widths) <= 1 and max(widths) > 0.7, widths
    assert lines[-1] == "Second paragraph kept on its own line." and " ".join(lines[:-1]).split() == f"{words} {words}".split()


def test_missing_anchor_and_empty_runs_are_gaps_not_crashes(tmp_path, fast_figures):
    root = tmp_path / "runs"
    make_run(root, "mixed", 0, [5], evaluated={5: {"nq": 0.5}})
    (root / "mixed" / "seed0" / "eval" / "step-000005" / "nq.jsonl").write_text("not json\n")
    res = run_analysis({"runs_root": str(root), "out": str(tmp_path / "o"), "benches": ["nq"], "evaluate": False})
    assert [m.bench for m in res.missing if m.arm == "anchor"] == ["nq"]
    assert res.figures[0].series["nq"] == ["mixed"]
    report = (tmp_path / "o" / "report.md").read_text()
    assert "nq.jsonl:1: not valid JSON" in report  # the bad per-example file is named, the point still plotted
    # no runs and no anchor: nothing to analyze, refused (issue 62: an empty report, exit 0, before)
    with pytest.raises(ConfigError, match="no such directory and no anchor=: nothing to analyze"):
        run_analysis({"runs_root": str(tmp_path / "nothing"), "out": str(tmp_path / "o2"), "evaluate": False})
    with pytest.raises(ConfigError, match="report.md: a file, not a directory, and no anchor="):   # was "no such directory"
        run_analysis({"runs_root": str(tmp_path / "o" / "report.md"), "out": str(tmp_path / "o2"), "evaluate": False})
    assert not (tmp_path / "o2").exists()


class FakeEvaluator(Harness):
    """A stand-in harness: writes what the evals harness would (the requested benches added to the ones the
    out dir holds) and counts calls; `pending` stands in for the harness's identity rule (a bench it wrote is
    done) and `check` accepts every setting (the real rule and check: tests/test_eval_inputs.py)."""

    def __init__(self, fail_on=None):
        self.calls, self.fail_on = [], fail_on

    def evaluate(self, cfg):
        self.calls.append(cfg)
        if self.fail_on and self.fail_on in cfg["ckpt"]:
            raise RuntimeError("CUDA out of memory (simulated)")
        from pathlib import Path
        out = Path(cfg["out"])
        held = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
        write_eval(out, {b: 0.5 for b in cfg["benches"]})
        summary = {**held, **json.loads((out / "summary.json").read_text())}
        (out / "summary.json").write_text(json.dumps(summary))
        return summary

    def pending(self, cfg):
        from pathlib import Path
        return {b: [] for b in cfg["benches"] if b not in summary_benches(Path(cfg["out"]))}

    def check(self, cfg):
        return cfg


def test_incremental_sweep_evaluates_only_what_is_new(tmp_path, fast_figures):
    root, out = tmp_path / "runs", tmp_path / "rep"
    make_run(root, "r2e", 0, [10, 20], evaluated={10: {"nq": 0.2}})  # step 10 lacks hotpotqa
    cfg = {"runs_root": str(root), "out": str(out), "benches": ["nq", "hotpotqa"], "anchor": "base-model",
           "eval": {"n": 10, "backend": "hf"}}
    ev = FakeEvaluator()
    res = run_analysis(cfg, evaluator=ev)
    jobs = sorted((c["ckpt"].rsplit("/", 1)[-1], tuple(c["benches"]), c["prompt"]) for c in ev.calls)
    assert jobs == [("base-model", ("nq", "hotpotqa"), "anchor_nudge"), ("step-000010", ("hotpotqa",), "tool_agent"),
                    ("step-000020", ("nq", "hotpotqa"), "tool_agent")]
    assert all(c["n"] == 10 and c["backend"] == "hf" for c in ev.calls)
    # The old nq result is still held (the harness keeps what it holds; analysis never writes summary.json).
    assert summary_benches(root / "r2e" / "seed0" / "eval" / "step-000010") == {"nq", "hotpotqa"}
    assert res.missing == []
    ev2 = FakeEvaluator()
    run_analysis(cfg, evaluator=ev2)
    assert ev2.calls == [] and not list(out.glob("*.replaced-*"))   # a previous analysis's report: rewritten
    (root / "r2e" / "seed0" / "checkpoints" / "step-000030").mkdir()
    (root / "r2e" / "seed0" / "checkpoints" / "step-000030" / "config.json").write_text("{}")
    ev3 = FakeEvaluator()
    run_analysis(cfg, evaluator=ev3)
    assert [c["out"].rsplit("/", 1)[-1] for c in ev3.calls] == ["step-000030"]
    with pytest.raises(ConfigError, match="records anchor 'base-model'"):
        run_analysis({**cfg, "anchor": "other-model"}, evaluator=ev3)
    (root / "_anchor" / "anchor.json").write_text("{torn")   # was "records anchor None"
    with pytest.raises(ConfigError, match=r"_anchor/anchor\.json: unreadable JSON .*; pass anchor_dir="):
        run_analysis(cfg, evaluator=ev3)


def test_failed_evaluation_is_listed_and_retried(tmp_path, fast_figures):
    root, out = tmp_path / "runs", tmp_path / "rep"
    make_run(root, "search", 0, [10, 20])
    cfg = {"runs_root": str(root), "out": str(out), "benches": ["nq"]}
    ev = FakeEvaluator(fail_on="step-000020")
    res = run_analysis(cfg, evaluator=ev)
    assert [m.line() for m in res.missing if m.arm == "search"] == [
        "search/seed0/step-000020 × nq: evaluation failed: RuntimeError: CUDA out of memory (simulated)"]
    assert "evaluation failed" in (out / "report.md").read_text()
    ev2 = FakeEvaluator()
    run_analysis(cfg, evaluator=ev2)
    assert [c["out"].rsplit("/", 1)[-1] for c in ev2.calls] == ["step-000020"]


def test_cli_help_dry_run_and_errors(tree, tmp_path, capsys, fast_figures):
    assert analyze_main(["--help"]) == 0
    assert "runs_root" in capsys.readouterr().out
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "0", "contents": "x"}\n')
    bench_root = tmp_path / "benches"  # local bench files: a hub bench's identity needs the hub's commit
    for bench in ("nq", "triviaqa"):
        (bench_root / bench).mkdir(parents=True)
        (bench_root / bench / "test.jsonl").write_text("".join(
            json.dumps({"id": f"{bench}-{i}", "question": f"q{i}?", "golden_answers": ["a"]}) + "\n" for i in range(5)))
    assert analyze_main([f"runs_root={tree}", "anchor=base", f"out={tmp_path / 'o'}", "dry_run=true",
                         "benches=[nq,triviaqa]", "n=5", f"corpus={corpus}", f"bench_root={bench_root}"]) == 0
    plan = capsys.readouterr().out
    # The synthetic results carry no evaluation identity: held under none, so they are re-evaluated (aside).
    assert "evaluations to run: 7" in plan and "r2e/seed0/step-000010: ['nq', 'triviaqa']" in plan
    assert "    nq: held under another evaluation identity (" in plan and "rows without an identity digest" in plan
    assert "anchor/seed0/step-000000: ['nq', 'triviaqa'] (prompt=anchor_nudge)" in plan
    assert not (tmp_path / "o").exists()
    assert analyze_main(["runs_rot=x"]) == 2
    assert "Did you mean: runs_root" in capsys.readouterr().err
    o3 = tmp_path / "o3"   # the user's files under analyze's output names: renamed aside, never lost
    (o3 / "report_data").mkdir(parents=True)
    (o3 / "report_data" / "mine.txt").write_text("mine")
    (o3 / "report.md").write_text("notes")
    assert analyze_main([f"runs_root={tree}", f"out={o3}", "evaluate=false", "benches=[nq]"]) == 0
    assert (o3 / "report.md").read_text().startswith("# Transfer-curve report")
    assert [p.read_text() for p in o3.glob("report.md.replaced-*")] == ["notes"]
    assert [p.read_text() for p in o3.glob("report_data.replaced-*/mine.txt")] == ["mine"]
    assert "report.md is not from a previous analysis: renamed aside to report.md.replaced-" in capsys.readouterr().out


def test_latex_escaping():
    assert latex_escape("r2e_v5 & 100%") == "r2e\\_v5 \\& 100\\%"
    assert latex_escape("±1 50–60") == "$\\pm$1 50--60"
    assert latex_cell("0.345 ±0.012 @150") == "0.345$_{\\pm0.012}^{\\mathrm{@150}}$"
    assert latex_cell("+0.1 [+0.0,+0.2] n=5") == "+0.1 [+0.0,+0.2] n=5"
    # a note after the step (the pre/post table's post before the run's final step) stays after the number's scripts
    assert latex_cell("0.300 @10 (not the final step 20: x_y)") == "0.300$^{\\mathrm{@10}}$ (not the final step 20: x\\_y)"
    assert latex_cell("0.1 → 0.4 @20 (n=5)") == "0.1 $\\rightarrow$ 0.4$^{\\mathrm{@20}}$ (n=5)"   # the reference table's


def test_provenance_lists_each_value_once():
    m = {"git": {"commit": "a", "dirty": True}, "data": {"fingerprint": "f"},
         "launches": [{"git": {"commit": "a", "dirty": True}}, {"git": {"commit": "b", "dirty": True}}]}
    assert provenance(m) == {"git.commit": "a", "git.dirty": True, "data.fingerprint": "f", "launches.1.git.commit": "b"}


def test_demo_dry_run_prints_the_plan(capsys):
    from demo.run import DEFAULTS, RULES, main as demo_main

    assert set(RULES) == set(DEFAULTS)   # every key has its rule
    assert demo_main(["dry_run=true", "arms=[r2e,search]", "steps=8", "save_steps=[4]"]) == 0
    plan = capsys.readouterr().out
    assert "launch sweep arms=[r2e,search] seeds=[0] model=tiny_base data=synthetic steps=8 save_steps=[4]" in plan
    assert "analyze runs_root=runs/demo benches=[synthqa,search_plan_ood,tf_code,tf_search]" in plan
    assert "common/tiny_base (the committed pretrained tiny base)" in plan
    assert demo_main(["dry_run=true", "model=tiny"]) == 0
    plan = capsys.readouterr().out
    assert "model=tiny data=synthetic" in plan and "save_tiny_model(runs/demo/_anchor_model, seed=0)" in plan
    # the default save steps are cut at a shorter run's end; ones asked for past it are refused (launch refuses them)
    assert demo_main(["dry_run=true", "steps=60"]) == 0 and "steps=60 save_steps=[50]" in capsys.readouterr().out
    assert demo_main(["dry_run=true", "steps=8", "save_steps=[4,9]"]) == 2
    assert capsys.readouterr().err.startswith("error: save_steps=[4, 9]: [9] past the run's last step (steps=8)")
    assert demo_main(["stepz=3"]) == 2
    assert demo_main(["model=qwen3_4b"]) == 2
    # each value checked by its rule, a dry run's too (seen failing: exit 0 with the plan, or a TypeError traceback)
    capsys.readouterr()
    for bad in ("steps=0", "steps=abc", "seeds=5", "save_steps=5", "search_extra=5", "launch_args=5", "train=maybe",
                "eval_n=-1", "world_seed=x", "arms=[]", "parallel=0", "copy_figures_to=" + __file__):
        assert demo_main(["dry_run=true", bad]) == 2, bad
        err = capsys.readouterr().err
        assert err.startswith(f"error: {bad.split('=')[0]}=") and err.count("\n") == 1, (bad, err)


def test_variants_replaced_runs_and_invalid_metrics(tree, tmp_path, fast_figures):
    """Run identity in analysis: a named variant is its own arm `<arm>/<name>`; run dirs renamed aside
    are ignored with a note; NaN / inf / out-of-range values and a non-integer n are listed as
    problems with file and value, never written to the results table."""
    import shutil

    from evals.metrics import METRICS, NON_METRIC_FIELDS
    from evals.results import summarize

    make_run(tree, "r2e/lr5e-4", 0, [10], evaluated={10: _vals(10, 0.5)})
    make_run(tree, "r2e-lr5e-4", 0, [10], evaluated={10: _vals(10, 0.4)})   # an arm whose name is the variant's file name
    shutil.copytree(tree / "r2e" / "seed1", tree / "r2e" / "seed1.replaced-20260101T000000Z")
    shutil.copytree(tree / "r2e" / "lr5e-4", tree / "r2e" / "lr5e-4.replaced-20260101T000000Z")
    shutil.copytree(tree / "search", tree / "search.replaced-20260101T000000Z")
    bad = tree / "search" / "seed0" / "eval" / "step-000010" / "summary.json"
    text = bad.read_text()
    summary = json.loads(text)
    summary["nq"]["em"], summary["nq"]["f1"] = float("nan"), float("inf")
    summary["hotpotqa"]["em"] = 1.7
    summary["search_plan_ood"]["n"] = "eight"
    bad.write_text(json.dumps(summary))   # json writes NaN / Infinity, as a buggy writer would
    runs = discover_runs(tree)
    assert [(r.arm, r.seed) for r in runs] == [("r2e", 0), ("r2e", 1), ("r2e-lr5e-4", 0), ("r2e/lr5e-4", 0), ("search", 0)]

    out = tmp_path / "rep"
    res = run_analysis({"runs_root": str(tree), "out": str(out), "benches": BENCHES, "evaluate": False,
                        "metrics": ["em"], "compare": [["r2e-lr5e-4", "r2e"], ["r2e/lr5e-4", "r2e"]]})
    # A variant's compare table is a file of tables/ (before: tables/compare_r2e/lr5e-4_vs_r2e_em.md), its name
    # the cards' rule (/ -> -), made unique where it meets another arm's.
    compare = sorted(p.name for p in (out / "tables").iterdir() if p.name.startswith("compare_"))
    assert compare == sorted(f"compare_r2e-lr5e-4_vs_r2e_em{k}.{ext}" for k in ("", "-2") for ext in ("md", "tex"))
    assert "header) of r2e/lr5e-4 minus r2e" in (out / "tables" / "compare_r2e-lr5e-4_vs_r2e_em-2.md").read_text()   # EM beside an env column
    t = pd.read_csv(out / "results.csv")
    assert set(t.arm) == {"r2e", "r2e-lr5e-4", "r2e/lr5e-4", "search", "anchor"}
    assert set(t[t.arm == "r2e"].seed) == {0, 1} and t.value.between(0, 2).all()
    s10 = t[(t.arm == "search") & (t.step == 10)]
    assert s10[(s10.bench == "nq") & s10.metric.isin(["em", "f1"])].empty
    assert s10[(s10.bench == "hotpotqa") & (s10.metric == "em")].empty
    assert set(s10[s10.bench == "search_plan_ood"].n) == {-1}
    assert res.table.value.map(lambda v: v == v and abs(v) != float("inf")).all()
    report = (out / "report.md").read_text()
    problems = report.split("## Problems reading inputs", 1)[1]
    for needle in ("nq.em = nan: not finite", "nq.f1 = inf: not finite", "hotpotqa.em = 1.7: out of range",
                   "search_plan_ood.n = 'eight': not a number"):
        assert f"{bad}: {needle}" in problems, needle
    assert "seed1.replaced-20260101T000000Z" in report and "lr5e-4.replaced-20260101T000000Z" in report
    assert "Ignored (3)" in report and "search.replaced-20260101T000000Z" in report
    # The registry covers every number the harness writes into a summary.
    rows = [{"metrics": {"em": 1.0, "f1": 1.0, "cover_em": 1.0, "strict_em": 1.0}, "extract_rule": "none",
             "num_turns": 1, "num_tool_calls": 0, "num_tool_errors": 0, "generated_tokens": 3, "stop_reason": "answer"}]
    assert set(summarize(rows)) <= set(METRICS) | set(NON_METRIC_FIELDS)


def test_a_null_metric_is_a_gap_with_its_reason_not_a_problem(tmp_path, fast_figures):
    """A bench evaluate scored over zero items (`em: null`, `n: 0`, `null_reason`) is no row of the
    results table and no input problem: its table cell and its missing point say why."""
    root = tmp_path / "runs"
    make_run(root, "r2e", 0, [10], evaluated={10: {"nq": 0.4, "musique@given": 0.5}})
    write_eval(root / "_anchor" / "eval" / "step-000000", {"nq": 0.2, "musique@given": 0.3})
    path = root / "r2e" / "seed0" / "eval" / "step-000010" / "summary.json"
    summary = json.loads(path.read_text())
    reason = "no items to score: the sample of br/mq/dev.jsonl is empty; 3 items with answerable: false left out"
    summary["musique@given"] = {"em": None, "f1": None, "cover_em": None, "strict_em": None, "format_failure_rate": None,
                                "n": 0, "mean_turns": None, "mean_tool_calls": None, "unanswerable_excluded": 3,
                                "null_reason": reason}
    path.write_text(json.dumps(summary))
    (path.parent / "musique@given.jsonl").write_text("")
    out = tmp_path / "rep"
    res = run_analysis({"runs_root": str(root), "out": str(out), "benches": ["nq", "musique@given"],
                        "evaluate": False})
    t = res.table
    r2e = t[(t.arm == "r2e") & (t.bench == "musique@given")]
    assert r2e[r2e.metric.isin(["em", "f1", "format_failure_rate"])].empty   # never 0.0
    report = (out / "report.md").read_text()
    assert "musique@given." not in report and "musique@given.n" not in report, report   # no input problem
    assert f"r2e/seed0/step-000010 × musique@given: no score: {reason}" in report
    main = (out / "tables" / "main_em.md").read_text()
    row = next(line for line in main.splitlines() if line.startswith("| r2e (final"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    header = next(line for line in main.splitlines() if line.startswith("| Method"))
    col = [c.strip() for c in header.strip("|").split("|")].index("musique (given)")
    assert cells[col] == f"– (no score: {reason})", row
    assert cells[col + 1] == "– (no mean: musique@given has no score)", row   # a gap, not a mean over fewer benches
    anchor = next(line for line in main.splitlines() if line.startswith("| anchor"))
    assert "–" not in anchor   # the anchor has both benches: its mean is there


def test_a_point_some_of_whose_items_never_generated_says_so(tmp_path, fast_figures):
    """A bench evaluate scored although some items never generated a token (`prompt_too_long`: their first prompt
    did not fit max_model_len, each scored 0) keeps its value, and report.md lists the point and bench with the
    count, the longest prompt and max_model_len (before: nothing said the value holds zeros no answer made)."""
    root = tmp_path / "runs"
    make_run(root, "r2e", 0, [10], evaluated={10: {"nq": 0.4, "hotpotqa": 0.5}})
    write_eval(root / "_anchor" / "eval" / "step-000000", {"nq": 0.2, "hotpotqa": 0.3})
    path = root / "r2e" / "seed0" / "eval" / "step-000010" / "summary.json"
    summary = json.loads(path.read_text())
    summary["hotpotqa"]["prompt_too_long"] = {"items": 3, "longest_prompt_tokens": 4100, "max_model_len": 4096}
    path.write_text(json.dumps(summary))
    out = tmp_path / "rep"
    res = run_analysis({"runs_root": str(root), "out": str(out), "benches": ["nq", "hotpotqa"], "evaluate": False})
    t = res.table
    assert t[(t.arm == "r2e") & (t.bench == "hotpotqa") & (t.metric == "em")].value.tolist() == [0.5]
    report = (out / "report.md").read_text()
    assert "## Points with items that never generated (1)" in report
    assert ("- r2e/seed0/step-000010 × hotpotqa: 3 of 10 items never generated a token: a first prompt of up to "
            "4100 tokens does not fit max_model_len=4096") in report
    assert "prompt_too_long" not in report   # a description, not a metric: no input problem


def test_an_earlier_summary_of_a_bench_that_never_generated_is_no_score(tmp_path, fast_figures):
    """A summary.json written before evaluate said so: a bench whose every item stopped at context_limit with no
    token generated (EM 0.0 there) is read as no score with the reason, in the tables and the behaviour split,
    not as the checkpoint's 0."""
    root = tmp_path / "runs"
    make_run(root, "r2e", 0, [10], evaluated={10: {"nq": 0.0}})
    write_eval(root / "_anchor" / "eval" / "step-000000", {"nq": 0.2})
    d = root / "r2e" / "seed0" / "eval" / "step-000010"
    summary = json.loads((d / "summary.json").read_text())
    summary["nq"].update(stop_reasons={"context_limit": 10}, mean_generated_tokens=0.0, empty_gold_items=0)
    (d / "summary.json").write_text(json.dumps(summary))
    for where, stop in ((d, "context_limit"), (root / "_anchor" / "eval" / "step-000000", "answer")):
        rows = [{**json.loads(line), "stop_reason": stop, "num_tool_errors": 0}
                for line in (where / "nq.jsonl").read_text().splitlines()]
        (where / "nq.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "rep"
    res = run_analysis({"runs_root": str(root), "out": str(out), "benches": ["nq"], "evaluate": False})
    t = res.table
    r2e = t[t.arm == "r2e"]
    assert r2e.metric.tolist() == ["empty_gold_items"], r2e   # its counts stay, no mean is a 0
    report = (out / "report.md").read_text()
    assert "- r2e/seed0/step-000010 × nq: no score: not measured: 10 of 10 items never generated a token" in report
    main = (out / "tables" / "main_em.md").read_text()
    assert "| r2e (final, step 10) | – (no score: not measured: 10 of 10 items never generated a token" in main
    assert "r2e/seed0 × nq (open): no score: not measured" in report   # not decomposed as if the model had answered
    assert "0.000 @10" not in report   # nor a post value of the pre/post table


def test_captions_name_the_confidence_level_the_intervals_have(tree, tmp_path):
    """conf=0.9: every caption and header says 90% (before: the main table, the curves' shaded and dotted
    bands and the pre/post table said 95% over 90% intervals)."""
    from analysis.figures import caption_text
    from analysis.prepost import PrePost
    from analysis.tables import main_table, table_columns

    p = _points(tree)
    p.conf = 0.9
    caption = main_table(p, ["r2e"], table_columns(QA, False, [], "em"), "em").caption
    assert "±90% half-width" in caption and "95%" not in caption
    kinds = {("crossed t", "items+seeds", 10, "2")}
    text = caption_text(kinds, False, kinds, conf=0.9)
    assert "the 90% interval" in text and "simultaneous 90% band" in text and "1 − 0.1/K" in text and "95" not in text
    pp = PrePost(conf=0.9).table()
    assert "90% CI" in pp.caption and "Δ post − pre [90% CI]" in [c.label for c in pp.columns] and "95" not in pp.caption


def test_an_interval_without_per_item_files_names_the_items_each_seed_evaluated(tmp_path):
    """No <bench>.jsonl: a t across seed means, its n the items each seed's summary.json counts (before:
    n = 0 items, in intervals.csv and the curves' caption "n = 0 items × 2 seeds")."""
    from analysis.aggregate import curve

    root = tmp_path / "runs"
    make_run(root, "A", 0, [10, 20], evaluated={10: {"nq": 0.3}, 20: {"nq": 0.4}})
    make_run(root, "A", 1, [10], evaluated={10: {"nq": 0.5}})
    for f in root.glob("A/seed*/eval/*/nq.jsonl"):
        f.unlink()
    runs = discover_runs(root)
    p = Points(collect(runs, None, ["nq"]).table, {(r.arm, r.seed, s): d for r in runs for s, d in r.evals.items()}, ["nq"])
    assert curve(p, "A", "nq", "em", [10]).n.tolist() == [10]
    final = final_point(p, "A", "nq", "em").interval   # seed 0 at step 20, seed 1 at step 10
    assert (final.method, final.n_items, final.n_seeds, final.mean) == ("seed t", 10, "2", pytest.approx(0.45))


def test_best_and_final_compare_like_with_like_and_gaps_say_why(tmp_path):
    """best: the step with the highest mean among the steps every seed evaluated (before: step 20, where only
    the better seed had been evaluated, 0.600 from one seed against 0.250 from both); final: one checkpoint per
    seed for the whole row (before: nq from seed 1's step 20, hotpotqa and Avg. from its step 10); a paired or
    compare cell without a value says why (before: a bare –)."""
    from analysis.aggregate import paired_arms
    from analysis.tables import compare_table, main_table, paired_table, table_columns

    root = tmp_path / "runs"
    make_run(root, "A", 0, [10, 20], evaluated={10: {"nq": 0.3, "hotpotqa": 0.3}})
    make_run(root, "A", 1, [10, 20], evaluated={10: {"nq": 0.2, "hotpotqa": 0.2}, 20: {"nq": 0.6}})
    make_run(root, "B", 0, [10], evaluated={10: {"nq": 0.5, "hotpotqa": 0.5}})
    anchor = root / "_anchor" / "eval" / "step-000000"
    write_eval(anchor, {"nq": 0.1, "hotpotqa": 0.1})
    (root / "B" / "seed0" / "eval" / "step-000010" / "hotpotqa.jsonl").unlink()
    runs = discover_runs(root)
    dirs = {(r.arm, r.seed, s): d for r in runs for s, d in r.evals.items()} | {("anchor", 0, 0): anchor}
    p = Points(add_mean_rows(collect(runs, anchor, QA).table, QA), dirs, QA)
    best = best_point(p, "A", "nq", "em")
    assert best.steps == [10] and best.interval.mean == pytest.approx(0.25)
    cols = table_columns(QA, True, [], "em")
    rows = dict(main_table(p, ["A", "B"], cols, "em").rows)
    assert rows["A (final, steps 10–20)"][0].startswith("0.450 ")   # seed 0 at 10 (0.3), seed 1 at 20 (0.6)
    assert rows["A (final, steps 10–20)"][1:] == ["– (not evaluated at A/seed1/step-000020)",
                                                 "– (no mean: hotpotqa not evaluated at A/seed1/step-000020)"]
    assert "best: among the steps every seed evaluated" in main_table(p, ["A"], cols, "em").caption
    paired = dict(paired_table(p, ["A", "B"], cols, "em").rows)
    assert paired["A"][1] == "– (not evaluated at A/seed1/step-000020)"
    assert paired["B"][1] == "– (no per-item em: B/seed0/step-000010 hotpotqa.jsonl)"
    gap = p.records[("vs_anchor", "A", "anchor", "10/20", "hotpotqa", "em")]   # in intervals.csv: a card's cell says why too
    assert gap["note"] == "not evaluated at A/seed1/step-000020" and gap["lo"] != gap["lo"]
    compare = compare_table(p, "A", "B", cols, "em").rows[0][1]
    assert compare[1:] == ["– (no per-item em: B/seed0/step-000010 hotpotqa.jsonl)"] * 2
    assert paired_arms(p, "A", "B", 20, "nq", "em") == "B: not evaluated at step 20"
    stem = tmp_path / "tables" / "compare_lr0.5_vs_B_em"   # an arm with a dot (before: tables/compare_lr0.md)
    assert [f.name for f in compare_table(p, "A", "B", cols, "em").write(stem)] == [stem.name + ".md", stem.name + ".tex"]


def test_a_huge_plan_is_analysed_without_listing_it(tmp_path):
    """A run planned for 10^8 steps (a checkpoint at every 1-step epoch end), 2 checkpoints evaluated: its curve's
    steps, its missing points and the report's count cost nothing per planned step (listing them: out of memory)."""
    from types import SimpleNamespace

    from analysis.aggregate import curve
    from analysis.report import missing_count
    from analysis.sweep import _arm_steps, _missing_points

    big, root = 10**8, tmp_path / "runs"
    run = make_run(root, "huge", 0, [1, 3], evaluated={1: {"nq": 0.2}, 3: {"nq": 0.4}}, done=False)
    (run / "config.yaml").write_text("train:\n  steps: 100000000\n  save_steps: []\n  epochs: 1\n  global_batch_size: 1\n"
                                     "  save_epoch_ends: true\ndata:\n  n: 1\n")
    runs = discover_runs(root)
    assert runs[0].steps == [1, 2, 3, 4, big] and len(runs[0].pending()) == big - 2   # a gap at 2, then 4..10^8
    table = collect(runs, tmp_path / "no_anchor", ["nq"]).table
    missing = _missing_points(runs, table, ["nq"], SimpleNamespace(failed=lambda *a: None), tmp_path / "no_anchor", False)
    assert [m.line() for m in missing] == [
        f"huge/seed0: {big - 2} checkpoints at steps [2, 4, 5, 6, ..., {big - 3}, {big - 2}, {big - 1}, {big}] × nq: "
        "not checkpointed yet (run still training)", f"anchor/seed0/step-000000 × nq: no anchor result in {tmp_path / 'no_anchor'}"]
    assert missing_count(missing) == big - 1
    c = curve(Points(table, {}, ["nq"],), "huge", "nq", "em", _arm_steps(runs)["huge"])
    assert c.step.tolist() == [1, 2, 3, 4, big] and c["mean"].isna().tolist() == [False, True, False, True, True]


def test_items_evaluate_skipped_for_empty_golds_are_left_out_of_every_interval(tmp_path):
    """skip_empty_golds=true: evaluate leaves an item whose golds normalize to nothing out of the bench's means
    (summary.json EM over 8 of 10 items); the report's cells leave it out too (before: its row's em 0.0 counted,
    the table 0.400 and 0.200, n=10, the paired Δ +0.200, where summary.json says 0.500, 0.250 and Δ +0.250; report.html's paired view likewise)."""
    from evals.agent import Episode
    from evals.benches import BenchItem
    from evals.results import summarize
    from evals.tasks import qa_row

    def evaluated(d, right: int) -> None:   # q0, q1: gold `*` (skipped); q2.. right for the first `right`
        items = [BenchItem(f"q{i}", "q", ["*"] if i < 2 else ["Paris"]) for i in range(10)]
        rows = [qa_row(Episode(it.id, [], [], final_content=f"Final answer: {'Paris' if i - 2 < right else 'Lyon'}",
                               stop_reason="answer"), it, skip_empty_golds=True) for i, it in enumerate(items)]
        d.mkdir(parents=True, exist_ok=True)
        (d / "nq.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (d / "summary.json").write_text(json.dumps({"nq": summarize(rows, ("em", "f1", "cover_em", "strict_em"))}))

    root, anchor = tmp_path / "runs", tmp_path / "runs" / "_anchor" / "eval" / "step-000000"
    make_run(root, "A", 0, [10])
    evaluated(root / "A" / "seed0" / "eval" / "step-000010", 4)
    evaluated(anchor, 2)
    runs = discover_runs(root)
    dirs = {(r.arm, r.seed, s): d for r in runs for s, d in r.evals.items()} | {("anchor", 0, 0): anchor}
    p = Points(collect(runs, anchor, ["nq"]).table, dirs, ["nq"])
    assert p.values("A", 10, "nq", "em").tolist() == [0.5]   # summary.json's
    final = final_point(p, "A", "nq", "em").interval
    assert (final.mean, final.n_items) == (pytest.approx(0.5), 8)
    assert p.interval("anchor", 0, "nq", "em").mean == pytest.approx(0.25)
    paired = paired_vs_anchor(p, "A", "nq", "em")
    assert (paired.result.delta, paired.result.n_items, paired.dropped) == (pytest.approx(0.25), 8, 0)
    assert p.examples("A", 0, 10, "nq", "mean_tool_calls").size == 10   # the behaviour means: over every item, as evaluate's
    from analysis.html import list_item   # report.html's paired view: no side of a pair (was: wrong on both, n 10)
    rows = [json.loads(line) for line in (anchor / "nq.jsonl").read_text().splitlines()]
    assert [list_item("nq", r, 0)["ok"] for r in rows[:4]] == [None, None, 1, 1]


def test_a_rows_file_cut_short_of_its_summary_is_named_and_not_read_as_the_items(tmp_path):
    """A `<bench>.jsonl` holding fewer rows than its summary.json's n (a copy cut short, an edit): a problem naming
    the file and both counts, and no interval over those rows (before: the final cell 0.250 over the 6 rows both seeds
    kept, where summary.json says 0.5 and 0.6, n=10, and no word of it in the report)."""
    root = tmp_path / "runs"
    for seed in (0, 1):
        make_run(root, "A", seed, [20], evaluated={20: {"nq": 0.5 + 0.1 * seed}})
    cut = root / "A" / "seed1" / "eval" / "step-000020" / "nq.jsonl"
    cut.write_text("".join(cut.read_text().splitlines(keepends=True)[4:]))
    runs = discover_runs(root)
    p = Points(collect(runs, None, ["nq"]).table, {(r.arm, r.seed, s): d for r in runs for s, d in r.evals.items()}, ["nq"])
    final = final_point(p, "A", "nq", "em").interval
    assert (final.mean, final.method) == (pytest.approx(0.55), "seed t")
    assert f"{cut}: 6 rows, where summary.json counts n=10 (a rows file cut short or edited): not used for intervals" in p.problems



def test_a_previous_analysis_figures_and_tables_are_not_left_beside_this_ones(tmp_path):
    """analyze into the out dir of an earlier analysis (with f1 and a compare=): none of its figures and tables is left
    in figures/ and tables/ for this one's to be written beside (before: main_f1, compare_A_vs_B_em... stayed when this
    analysis wrote none, their stale numbers read as its); a file of the user's there keeps the whole dir, renamed aside."""
    from analysis.report import TITLE, make_way

    out = tmp_path / "rep"
    earlier = ["figures/curves_f1.pdf", "figures/curves_f1.png", "tables/main_f1.md", "tables/compare_A_vs_B_em.tex"]
    for name in earlier:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text("0.123")
    (out / "report.md").write_text(f"{TITLE}\n\n" + "".join(f"[`{n}`]({n})\n" for n in earlier))
    make_way(out)
    assert [p.name for d in ("figures", "tables") for p in (out / d).iterdir()] == [] and not list(out.glob("*.replaced-*"))
    (out / "tables" / "mine.md").write_text("mine")
    make_way(out)
    assert [p.read_text() for p in out.glob("tables.replaced-*/mine.md")] == ["mine"] and not (out / "tables").exists()


def test_an_evaluation_of_other_weights_than_its_checkpoint_holds_now_is_not_read(tmp_path):
    """checkpoints/step-000010 written again after its evaluation (its SHA256SUMS changed): the eval dir's numbers are
    another model's, so the point is not read and the problem says why (before: read as the new checkpoint's, with
    evaluate=false); a checkpoint whose digest is the one meta.json recorded is read."""
    from common.io import sha256_file

    root = tmp_path / "runs"
    make_run(root, "A", 0, [10, 20], evaluated={10: {"nq": 0.3}, 20: {"nq": 0.4}})
    for step in (10, 20):
        ckpt, d = root / "A" / "seed0" / "checkpoints" / f"step-{step:06d}", root / "A" / "seed0" / "eval" / f"step-{step:06d}"
        (ckpt / "SHA256SUMS").write_text(f"{'0' * 64}  model.safetensors\n")
        keys = {"checkpoint.kind": "sha256sums", "checkpoint.digest": sha256_file(ckpt / "SHA256SUMS"), "bench.n": 10}
        (d / "meta.json").write_text(json.dumps({"identities": {"nq": {"fingerprint": "f", "keys": keys}}}))
    stale = root / "A" / "seed0" / "checkpoints" / "step-000010"
    (stale / "SHA256SUMS").write_text(f"{'1' * 64}  model.safetensors\n")
    run = discover_runs(root)[0]
    assert sorted(run.evals) == [20] and sorted(run.checkpoints) == [10, 20]
    assert any(p.startswith(f"{root / 'A' / 'seed0' / 'eval' / 'step-000010'}: nq was evaluated on other weights than "
                            f"{stale} holds now") for p in run.problems), run.problems


def test_evaluation_settings_with_evaluate_false_are_refused_not_ignored(tmp_path, capsys):
    """evaluate=false eval.max_new_tokens=512: nothing is evaluated, so the setting would label nothing (before: exit 0,
    a report of the evaluations on disk, made under another max_new_tokens, without a word); the default prompt is
    no setting given."""
    root = tmp_path / "runs"
    make_run(root, "A", 0, [10], evaluated={10: {"nq": 0.3}})
    argv = [f"runs_root={root}", f"out={tmp_path / 'o'}", "benches=[nq]", "evaluate=false"]
    assert analyze_main([*argv, "eval.max_new_tokens=512"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: eval.max_new_tokens=512: evaluate=false evaluates nothing, so no evaluation setting applies (the report reads "
        "the evaluations on disk, each made under the settings its meta.json records): drop it, or evaluate=true "
        "evaluates under it"]
    assert not (tmp_path / "o").exists()
    assert analyze_main([*argv, "eval.max_new_tokens=512", "dry_run=true"]) == 2   # a dry run refuses it too
    assert "evaluate=false evaluates nothing" in capsys.readouterr().err


def test_an_unreadable_summary_is_the_missing_point_s_reason(tmp_path):
    """A summary.json cut short (a crashed copy): its point's reason names the file (before: `not evaluated
    (evaluate=false)`, though it was evaluated)."""
    from types import SimpleNamespace

    from analysis.sweep import _missing_points

    root = tmp_path / "runs"
    make_run(root, "A", 0, [10, 20], evaluated={10: {"nq": 0.3}, 20: {"nq": 0.5}})
    torn = root / "A" / "seed0" / "eval" / "step-000020" / "summary.json"
    torn.write_text(torn.read_text()[:30])
    runs = discover_runs(root)
    c = collect(runs, None, ["nq"])
    missing = _missing_points(runs, c.table, ["nq"], SimpleNamespace(failed=lambda *a: None), tmp_path / "none", False,
                              c.nulls, c.unread)
    assert missing[0].line().startswith(f"A/seed0/step-000020 × nq: {torn}: unreadable JSON (")


def _record_identity(eval_dir, bench: str, keys: dict) -> None:
    """meta.json recording `bench`'s evaluation identity keys beside what the dir already records."""
    path = eval_dir / "meta.json"
    meta = json.loads(path.read_text()) if path.is_file() else {"identities": {}}
    meta["identities"][bench] = {"fingerprint": f"fp-{bench}", "keys": keys}
    path.write_text(json.dumps(meta))


def test_the_report_states_the_evaluation_settings_its_numbers_were_made_under(tmp_path):
    """Every evaluation's meta.json identity keys (the checkpoint's aside) summed up in one block of report.md and
    report.html: the settings all share, those that differ by bench, those that differ between evaluations of one
    bench (each value and where, never one picked), the anchor's prompt, and the evaluations that record none
    (before: the report named only analyze's own settings, so two reports could not be told comparable or not)."""
    root = tmp_path / "runs"
    for arm, seed in (("r2e", 0), ("r2e", 1), ("search", 0)):
        make_run(root, arm, seed, [10], evaluated={10: {"nq": 0.3, "hotpotqa": 0.2}})
    anchor = root / "_anchor" / "eval" / "step-000000"
    write_eval(anchor, {"nq": 0.1, "hotpotqa": 0.1})
    dirs = {"anchor": anchor, **{f"{a}/seed{s}": root / a / f"seed{s}" / "eval" / "step-000010"
                                 for a, s in (("r2e", 0), ("r2e", 1), ("search", 0))}}
    for who, d in dirs.items():
        for bench, n in (("nq", 10), ("hotpotqa", 10)):
            if (who, bench) == ("search/seed0", "hotpotqa"):
                continue   # no identity recorded for it
            keys = {"checkpoint.digest": f"d-{who}", "bench.name": bench, "bench.n": n, "bench.seed": 42,
                    "bench.source_digest": ("a" if bench == "nq" else "b") * 64, "eval_semantics": 2,
                    "evaluate.max_new_tokens": 1024 if (who, bench) == ("r2e/seed1", "nq") else 512,
                    "evaluate.max_turns": 8, "evaluate.topk": 3, "evaluate.enable_thinking": "auto",
                    "evaluate.prompt": "anchor_nudge" if who == "anchor" else "tool_agent", "corpus": None}
            _record_identity(d, bench, keys)
    out = tmp_path / "o"
    assert analyze_main([f"runs_root={root}", f"out={out}", "benches=[nq,hotpotqa]", "evaluate=false"]) == 0
    text = (out / "report.md").read_text()
    block = text[text.index("Evaluation settings"):].split("\n\n")[0].splitlines()
    assert block == [
        "Evaluation settings (the identity keys each evaluation's meta.json records, the checkpoint's aside; "
        "7 evaluations of 2 benches, the anchor's included):",
        "- shared: `bench.n=10`, `bench.seed=42`, `corpus=null`, `eval_semantics=2`, `evaluate.enable_thinking=auto`, "
        "`evaluate.max_turns=8`, `evaluate.prompt=tool_agent`, `evaluate.topk=3`",
        "- by bench: `bench.source_digest`: aaaaaaaaaaaa… (nq), bbbbbbbbbbbb… (hotpotqa); "
        "`evaluate.max_new_tokens`: 512 (hotpotqa)",
        "- differ between evaluations of one bench: nq `evaluate.max_new_tokens`: 512 at anchor and 2 more, 1024 at "
        "r2e/seed1/step-000010",
        "- the anchor's prompt: `evaluate.prompt=anchor_nudge` (by design)",
        "- no identity recorded: search/seed0/step-000010 × hotpotqa"]
    page = (out / "report.html").read_text()
    assert "<code>evaluate.topk=3</code>" in page and "512 at anchor and 2 more, 1024 at r2e/seed1/step-000010" in page
    for d in dirs.values():   # evaluations made before identities were recorded: the report says it states none
        (d / "meta.json").unlink()
    assert analyze_main([f"runs_root={root}", f"out={out}", "benches=[nq,hotpotqa]", "evaluate=false"]) == 0
    assert ("\nEvaluation settings: no evaluation's meta.json records its identity, so none is stated (anchor × "
            "hotpotqa, anchor × nq, r2e/seed0/step-000010 × hotpotqa and 5 more).\n") in (out / "report.md").read_text()


def test_the_teacher_forced_legend_lists_every_arm_drawn_in_any_panel(tmp_path, monkeypatch):
    """An arm evaluated on tf_search alone (not on tf_code, the first panel): its line has a legend entry, each
    label once, arms in order, then the anchor (before: the legend was the first panel's, so it had none)."""
    import matplotlib.pyplot

    import analysis.figures
    from common.io import write_json

    root = tmp_path / "runs"
    for arm, benches in (("r2e", ("tf_code", "tf_search")), ("search", ("tf_search",))):
        run = make_run(root, arm, 0, [2, 4])
        for s in (2, 4):
            (run / "eval" / f"step-{s:06d}").mkdir(parents=True)
            write_json(run / "eval" / f"step-{s:06d}" / "summary.json",
                       {b: {"loss": 2.0 - 0.1 * s, "tokens": 100, "n": 4} for b in benches})
    (anchor := root / "_anchor" / "eval" / "step-000000").mkdir(parents=True)
    write_json(anchor / "summary.json", {b: {"loss": 2.5, "tokens": 100, "n": 4} for b in ("tf_code", "tf_search")})
    legends = {}

    def save(fig, info, out_stem, rows):   # the legend as drawn, no file rendered
        legends[out_stem.stem] = [[t.get_text() for t in legend.get_texts()] for legend in fig.legends]
        for ext in ("pdf", "png"):
            out_stem.with_suffix(f".{ext}").write_bytes(b"")
            info.paths.append(out_stem.with_suffix(f".{ext}"))
        matplotlib.pyplot.close(fig)

    monkeypatch.setattr(analysis.figures, "save_figure", save)
    res = run_analysis({"runs_root": str(root), "out": str(tmp_path / "o"), "benches": ["tf_code", "tf_search"],
                        "evaluate": False})
    fig = next(f for f in res.figures if f.paths[0].stem == "teacher_forced")
    assert fig.panels[0].startswith("tf_code") and "search/seed0" not in fig.series[fig.panels[0]]
    assert legends["teacher_forced"] == [["r2e/seed0", "search/seed0", "anchor"]]


def test_a_teacher_forced_line_breaks_at_a_checkpoint_without_its_loss(tmp_path, monkeypatch):
    """r2e/seed0 has checkpoints 2, 4, 6 and tf_code losses at 2 and 6 only: its line is broken at 4 (a gap, counted in
    FigureInfo.gaps and said in the caption), never a straight segment from 2 to 6 (before: the line joined the points
    it had, drawing a loss at step 4 that no evaluation measured, while report.md listed step 4 as missing)."""
    import math

    from common.io import write_json

    root = tmp_path / "runs"
    run = make_run(root, "r2e", 0, [2, 4, 6])
    for s in (2, 6):
        (run / "eval" / f"step-{s:06d}").mkdir(parents=True)
        write_json(run / "eval" / f"step-{s:06d}" / "summary.json", {"tf_code": {"loss": 2.0 - 0.1 * s, "tokens": 100, "n": 4}})
    lines = drawn_figures(monkeypatch, lambda fig: [(ln.get_label(), list(ln.get_xdata()), list(ln.get_ydata()))
                                                    for ax in fig.axes for ln in ax.get_lines()])
    res = run_analysis({"runs_root": str(root), "out": str(tmp_path / "o"), "benches": ["tf_code"], "evaluate": False})
    fig = next(f for f in res.figures if f.paths[0].stem == "teacher_forced")
    (label, x, y), = lines["teacher_forced"]
    assert label == "r2e/seed0" and x == [2, 4, 6] and y[0] == pytest.approx(1.8) and math.isnan(y[1])
    assert y[2] == pytest.approx(1.4)
    assert fig.gaps == {"tf_code [unrecorded]: all": {"r2e/seed0": 1}}
    assert "A checkpoint without a loss is a gap in its line" in fig.caption
    assert "r2e/seed0/step-000004 × tf_code: not evaluated (evaluate=false)" in [m.line() for m in res.missing]


def test_a_curve_point_over_fewer_of_its_arms_seeds_is_said(tmp_path, monkeypatch):
    """r2e has 3 seeds; seed 2 (still training) lacks step 1000, which seeds 0 and 1 have: the curve's point at 1000
    is a mean over 2 of the 3 seeds, and so said in the caption and FigureInfo.seeds; the legend names each arm's
    seed count (before: the legend said `r2e`, the caption listed `10 items × 2 seeds` among its n without naming
    the arm or the step, so a mean over the two weaker seeds read as the arm's own). Steps follow numerically."""
    root = tmp_path / "runs"
    for seed in (0, 1, 2):
        steps = [200, 1000] if seed < 2 else [200]
        make_run(root, "r2e", seed, steps, evaluated={s: {"nq": 0.1 * seed + s / 5000} for s in steps}, horizon=1000,
                 save_steps=[200, 1000], done=seed < 2)
    make_run(root, "search", 0, [200, 1000], evaluated={s: {"nq": 0.3} for s in (200, 1000)})
    write_eval(root / "_anchor" / "eval" / "step-000000", {"nq": 0.1})
    legends = drawn_figures(monkeypatch, lambda fig: [t.get_text() for legend in fig.legends for t in legend.get_texts()])
    res = run_analysis({"runs_root": str(root), "out": str(tmp_path / "o"), "benches": ["nq"], "evaluate": False})
    fig = next(f for f in res.figures if f.paths[0].stem == "curves_em")
    assert legends["curves_em"] == ["r2e (3 seeds)", "search (1 seed)", "anchor (step 0)"]
    assert fig.seeds["nq"] == {"r2e": {200: 3, 1000: 2}, "search": {200: 1, 1000: 1}}
    assert fig.x["nq"]["r2e"] == [200.0, 1000.0]
    assert "Fewer seeds (a mean over the seeds evaluated at that step, not all of the arm's): r2e: 2 of 3 seeds at step 1000." in fig.caption
    report = (tmp_path / "o" / "report.md").read_text()
    assert "r2e: 2 of 3 seeds at step 1000" in report and "r2e: 2 of 3 seeds at step 1000" in (tmp_path / "o" / "report.html").read_text()


def test_report_html_names_the_anchor_and_the_runs_set_aside_as_report_md_does(tree, tmp_path, fast_figures):
    """report.html says which anchor its `anchor` rows are and lists the run dirs renamed aside (kept, not analysed),
    as report.md does (before: report.md only; the page a researcher opens named no anchor model and no ignored run)."""
    import shutil

    shutil.copytree(tree / "r2e" / "seed1", tree / "r2e" / "seed1.replaced-20260101T000000Z")
    out = tmp_path / "rep"
    run_analysis({"runs_root": str(tree), "out": str(out), "benches": QA, "evaluate": False, "metrics": ["em"]})
    md, page = (out / "report.md").read_text(), (out / "report.html").read_text()
    anchor = f"No <code>anchor=</code> given; re-used whatever <code>{tree / '_anchor'}</code> holds (see missing points)."
    assert f"No `anchor=` given; re-used whatever `{tree / '_anchor'}` holds (see missing points)." in md and anchor in page
    ignored = tree / "r2e" / "seed1.replaced-20260101T000000Z"
    assert "Ignored (1)" in md and f"- `{ignored}`" in md
    assert "Ignored (1)" in page and f"<li><code>{ignored}</code></li>" in page


def test_a_seed_or_step_named_twice_is_read_once_and_the_other_named(tmp_path, fast_figures):
    """`r2e/seed01` is seed 1 again beside `r2e/seed1`, and `eval/step-10` is step 10 again beside `eval/step-000010`:
    each point is read once, from the dir of its own name, the other listed as a problem (before: seed 1 counted twice,
    `r2e (final)` a mean over `10×3` seeds of 2 runs, and one of the two step dirs dropped without a word)."""
    import shutil

    root = tmp_path / "runs"
    make_run(root, "r2e", 0, [10], evaluated={10: {"nq": 0.2}})
    make_run(root, "r2e", 1, [10], evaluated={10: {"nq": 0.4}})
    shutil.copytree(root / "r2e" / "seed1", root / "r2e" / "seed01")
    write_eval(root / "r2e" / "seed0" / "eval" / "step-10", {"nq": 0.9})
    write_eval(root / "_anchor" / "eval" / "step-000000", {"nq": 0.1})
    runs = discover_runs(root)
    assert [(r.arm, r.seed, r.path.name) for r in runs] == [("r2e", 0, "seed0"), ("r2e", 1, "seed1")]
    assert runs[0].evals[10].name == "step-000010"
    problems = [p for r in runs for p in r.problems]
    assert f"{root / 'r2e' / 'seed01'}: seed 1 again ({root / 'r2e' / 'seed1'} is seed 1): not read" in problems
    assert (f"{root / 'r2e' / 'seed0' / 'eval' / 'step-10'}: step 10 again "
            f"({root / 'r2e' / 'seed0' / 'eval' / 'step-000010'} is step 10): not read") in problems
    res = run_analysis({"runs_root": str(root), "out": str(tmp_path / "o"), "benches": ["nq"], "evaluate": False,
                        "metrics": ["em"]})
    (_, row), = [r for r in res.tables["main_em"].rows if r[0].startswith("r2e (final")]
    assert row == ["0.300 ±0.409"] and "r2e 10×2 items+seeds" in res.tables["main_em"].caption
    assert "seed 1 again" in (tmp_path / "o" / "report.md").read_text()
