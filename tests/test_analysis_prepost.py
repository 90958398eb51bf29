"""analysis: the pre-vs-post table on a synthetic runs tree (RL runs with their own step 0, an SFT arm
against the anchor), its paired interval against scipy's paired t (other values) and a published worked example of
Tango's score interval (0/1 values), its coverage in a simulation with known truth, mismatches and the figure polish."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.discover import discover_runs
from analysis.prepost import paired_limits, paired_prepost, prepost
from analysis.stats import tango_limits
from launch.analyze import run_analysis
from common.io import write_json

# Per-example values (10 items each) chosen so every pre/post/best number is known by hand.
MUSIQUE_EM = {0: [0] * 10, 10: [1, 1, 1, 0, 0, 0, 0, 0, 0, 0], 20: [1, 1, 0, 0, 0, 0, 0, 0, 0, 0]}
BABYAI_RET = {0: [0.0] * 10, 10: [0.5] + [0.0] * 9, 20: [0.9, 0.5] + [0.0] * 8}


def bench_identity(eval_dir: Path, bench: str, n: int, digest: str, settings: dict) -> dict:
    """The identity record evaluate writes (evals.identity) for `bench` of the checkpoint beside `eval_dir`."""
    from evals.config import DEFAULTS
    from evals.identity import bench_identity as evals_identity

    ckpt = {"kind": "sha256sums", "digest": f"weights of {eval_dir.parent.parent.name}/{eval_dir.name}"}
    return evals_identity(bench, {**DEFAULTS, "ckpt": str(eval_dir), **settings}, ckpt, n=n, seed=42, source=digest)


def write_bench(eval_dir: Path, bench: str, metric: str, values: list[float], ids=None, digest="f" * 64,
                settings: dict | None = None) -> None:
    eval_dir.mkdir(parents=True, exist_ok=True)
    ids = ids or [f"{bench}-{i}" for i in range(len(values))]
    metrics = {"em": ["em", "f1"], "reward": ["reward"], "return": ["return", "success"]}[metric]
    lines = [json.dumps({"id": i, "metrics": {m: float(v) for m in metrics}}) for i, v in zip(ids, values)]
    (eval_dir / f"{bench}.jsonl").write_text("\n".join(lines) + "\n")
    summary_path, meta_path = eval_dir / "summary.json", eval_dir / "meta.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    summary[bench] = {m: float(np.mean(values)) for m in metrics} | {"n": len(values)}
    write_json(summary_path, summary)
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {"bench_items": {}, "identities": {}}
    meta["bench_items"][bench] = {"n": len(values), "source_digest": digest}
    meta["identities"][bench] = bench_identity(eval_dir, bench, len(values), digest, settings or {})
    write_json(meta_path, meta)


def rl_run(root: Path, rel: str, profile: str | None = "rl_ood") -> Path:
    run = root / rel
    sub = Path("eval") / profile if profile else Path("eval")
    for step in (0, 10, 20):
        ck = run / "checkpoints" / f"step-{step:06d}"
        ck.mkdir(parents=True)
        (ck / "config.json").write_text("{}")
        write_bench(run / sub / f"step-{step:06d}", "musique@given", "em", MUSIQUE_EM[step])
        write_bench(run / sub / f"step-{step:06d}", "babyai", "return", BABYAI_RET[step])
    return run


def _ci(post, pre) -> tuple[float, float]:
    """The paired t interval of post − pre, by scipy (the crossed model with one seed and a seedless pre)."""
    from scipy.stats import ttest_rel

    got = ttest_rel(np.asarray(post, float), np.asarray(pre, float)).confidence_interval(0.95)
    return float(got.low), float(got.high)


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    root = tmp_path_factory.mktemp("prepost") / "runs"
    rl_run(root, "grpo_qa/seed0")
    rl_run(root, "grpo_babyai/lr1e-6/seed1")  # a name= level
    sft = root / "search" / "seed0"
    write_bench(sft / "eval" / "rl_ood" / "step-000050", "musique@given", "em", [1] * 5 + [0] * 5)
    write_bench(root / "_anchor" / "eval" / "rl_ood" / "step-000000", "musique@given", "em", [1] * 2 + [0] * 8,
                settings={"prompt": "anchor_nudge"})  # the anchor's prompt: an expected difference
    out = root.parent / "reports"
    res = run_analysis({"runs_root": str(root), "out": str(out), "profile": "rl_ood", "evaluate": False,
                        "benches": ["musique@given", "babyai"], "metrics": ["em"], "compare": [["grpo_babyai/lr1e-6", "grpo_qa"]]})
    return root, out, res


def test_prepost_reproduces_known_values_and_scipys_paired_t(analysed):
    root, out, res = analysed
    pp = prepost(discover_runs(root, "rl_ood"), root / "_anchor" / "eval" / "rl_ood" / "step-000000",
                 ["musique@given", "babyai"])
    rows = {(r.run, r.bench, r.metric): r for r in pp.rows}
    assert set(rows) == {(run, b, m) for run in ("grpo_qa/seed0", "grpo_babyai/lr1e-6/seed1")
                         for b, m in (("musique@given", "em"), ("musique@given", "f1"), ("babyai", "return"))} | {
        ("search/seed0", "musique@given", "em"), ("search/seed0", "musique@given", "f1")}
    r = rows[("grpo_qa/seed0", "musique@given", "em")]
    assert (r.pre_source, r.pre, r.post, r.post_step, r.best, r.best_step) == ("step 0", 0.0, 0.2, 20, 0.3, 10)
    diff = np.array(MUSIQUE_EM[20], float) - np.array(MUSIQUE_EM[0], float)
    assert r.paired.delta == pytest.approx(diff.mean()) and r.paired.n == 10
    assert r.paired.method == "Tango score" and tango_limits(2, 0, 10, 0.95) == pytest.approx((r.paired.lo, r.paired.hi))
    b = rows[("grpo_babyai/lr1e-6/seed1", "babyai", "return")]
    assert (b.pre, b.post, b.best_step) == (0.0, pytest.approx(0.14), 20)
    assert (b.paired.lo, b.paired.hi) == pytest.approx(_ci(BABYAI_RET[20], BABYAI_RET[0]), abs=1e-12)
    assert b.paired.method == "paired t"
    s = rows[("search/seed0", "musique@given", "em")]  # an SFT arm: pre is the anchor
    assert (s.pre_source, s.pre, s.post, s.post_step) == ("anchor", 0.2, 0.5, 50)
    md = (out / "tables" / "prepost.md").read_text()
    assert (out / "tables" / "prepost.tex").is_file()
    assert "| bench (context mode) |" in md and "| musique (given) |" in md  # the mode is named
    assert "selected on test" in md and "0.300 @10" in md and "0.000 (step 0)" in md and "0.200 (anchor)" in md
    assert "| interval |" in md and "| Tango score |" in md and "| paired t |" in md and "Tango (1998)" in md
    report = (out / "report.md").read_text()
    assert "grpo_qa/seed0/step-000020 × musique@given: evaluated 10 items, the reference size is 2417" in report
    assert "anchor/step-000000 × musique@given: evaluated 10 items" in report
    assert "babyai: evaluated 10 items, the reference size is 50" in report


@pytest.mark.parametrize("pre, post, want", [
    (np.linspace(0, 0.5, 20), np.linspace(0, 0.5, 20) + 0.25, None),   # every item up by 0.25: no variance, no CI
    ([0.0], [1.0], (1 - 2 * 0.975, 1.0)),                               # one item (before: [+1.000, +1.000])
    ([0.0] * 50, [0.0] * 50, "±u"),                                      # nothing changed (before: [+0.000, +0.000])
    ([0.0] * 10, [1.0] * 10, "1-2u"),                                    # every item wrong -> right (before: [+1, +1])
])
def test_differences_without_variance_give_no_zero_width_ci(pre, post, want):
    """A bootstrap of differences that never vary is a zero-width "95% CI". 0/1 scores get the report's exact
    bounds (analysis.variance.exact_bounds: u = scipy's beta quantile of 0 events in n); other values no CI,
    with the reason."""
    from scipy.stats import beta

    ids = [f"q{i}" for i in range(len(pre))]
    paired, why = paired_prepost(pd.Series(pre, index=ids), pd.Series(post, index=ids), 0.95)
    if want is None:
        assert paired is None and "every item differs by the same amount (+0.250): no variance, no CI" in why
        return
    u = beta.ppf(0.975, 1, len(pre))
    want = {"±u": (-u, u), "1-2u": (1 - 2 * u, 1.0)}.get(want, want)
    assert why is None and (paired.lo, paired.hi) == pytest.approx(want) and paired.n == len(pre) and paired.method == "exact"


@pytest.mark.parametrize("n, p0, gain, loss", [(10, 0.3, 0.5, 0.2), (20, 0.2, 0.3, 0.1), (30, 0.3, 0.5, 0.2),
                                                (15, 0.2, 0.3, 0.02), (20, 0.2, 0.2, 0.02), (15, 0.3, 0.3, 0.0)])
def test_prepost_interval_covers_a_known_difference(n, p0, gain, loss):
    """2,000 simulated studies with known truth: n items drawn from a population right before with p0, then a wrong
    item turns right with `gain`, a right one wrong with `loss` (Δ = (1 − p0)·gain − p0·loss; pre and post correlate
    0.4–0.8). The interval (Tango's score interval, these scores being 0/1) covers Δ in >= 93.5% of them: 0.97, 0.98,
    0.94, 0.98, 0.99, 0.99 (20,000 draws each). The last three have few discordant items: the paired t over the 0/1
    differences it replaced covered 0.89, 0.87, 0.88 there (0.97, 0.95, 0.95 in the first three)."""
    rng = np.random.default_rng(n)
    pre = (rng.random((20000, n)) < p0).astype(float)
    post = np.where(pre == 1, rng.random((20000, n)) >= loss, rng.random((20000, n)) < gain).astype(float)
    truth, ids, d = (1 - p0) * gain - p0 * loss, [f"q{i}" for i in range(n)], post - pre
    lo, hi = paired_limits(post, pre, 0.95)
    for c in np.unique(d[np.ptp(d, axis=-1) == 0, 0]):   # no difference varies: paired_prepost's exact bounds
        rows = (np.ptp(d, axis=-1) == 0) & (d[:, 0] == c)
        r = np.flatnonzero(rows)[0]
        got, _ = paired_prepost(pd.Series(pre[r], index=ids), pd.Series(post[r], index=ids), 0.95)
        lo[rows], hi[rows] = got.lo, got.hi
    assert ((lo <= truth) & (truth <= hi)).mean() >= 0.935


@pytest.mark.parametrize("gains, losses, n, want", [
    (6, 16, 161, (-0.1240, -0.0054)),   # Cavo et al. (2012): complete response after vs before consolidation therapy
    (3, 0, 3, (-0.1230, 1.0)),          # every item gained
    (0, 3, 3, (-1.0, 0.1230)),          # every item lost
])
def test_prepost_binary_interval_is_tangos_score_interval(gains, losses, n, want):
    """0/1 scores get Tango's (1998) score interval for paired proportions, checked against the worked examples of
    Fagerland, Lydersen & Laake (2017, "Statistical Analysis of Contingency Tables", ch. 8) to their 4 decimals."""
    assert tango_limits(gains, losses, n, 0.95) == pytest.approx(want, abs=5e-5)
    if gains and losses:   # through the table's own path: items both right / gained / lost / both wrong
        both, neither = 59, n - 59 - gains - losses
        pre = [1.0] * both + [0.0] * gains + [1.0] * losses + [0.0] * neither
        post = [1.0] * both + [1.0] * gains + [0.0] * losses + [0.0] * neither
        ids = [f"q{i}" for i in range(n)]
        paired, why = paired_prepost(pd.Series(pre, index=ids), pd.Series(post, index=ids), 0.95)
        assert why is None and paired.method == "Tango score" and paired.delta == pytest.approx(-10 / 161)
        assert (paired.lo, paired.hi) == pytest.approx(want, abs=5e-5)


def test_mismatched_item_ids_are_a_problem_never_intersected(tmp_path):
    root = tmp_path / "runs"
    run = rl_run(root, "grpo_qa/seed0", profile=None)
    post = run / "eval" / "step-000020"
    write_bench(post, "musique@given", "em", MUSIQUE_EM[20], ids=[f"musique@given-{i}" for i in range(5, 15)])
    pp = prepost(discover_runs(root), None, ["musique@given"])
    em = next(r for r in pp.rows if r.metric == "em")
    assert em.paired is None and em.post == 0.2  # values still reported, no CI
    assert any("item ids differ" in p and "5 only in pre, 5 only in post" in p for p in pp.problems)
    # Same ids but another bench file (digest) is not paired either.
    write_bench(post, "musique@given", "em", MUSIQUE_EM[20], digest="0" * 64)
    pp = prepost(discover_runs(root), None, ["musique@given"])
    assert all(r.paired is None for r in pp.rows)
    assert any("different settings (bench.source_digest: " in p for p in pp.problems)


@pytest.mark.parametrize("settings,needle", [
    ({"babyai_max_steps": 4}, "evaluate.babyai_max_steps: None -> 4"),
    ({"prompt": "anchor_nudge"}, "evaluate.prompt: 'tool_agent' -> 'anchor_nudge'"),
    ({"max_turns": 3}, "evaluate.max_turns: 8 -> 3"),
])
def test_pre_and_post_under_other_settings_are_a_problem_without_ci(tmp_path, settings, needle):
    """The defect: step 0 with one cap, the final step with another gave "+0.000 [+0.000, +0.000]" and no
    problem. An RL run's pre and post may differ only in the checkpoint."""
    root = tmp_path / "runs"
    run = rl_run(root, "grpo_babyai/seed0", profile=None)
    write_bench(run / "eval" / "step-000020", "babyai", "return", BABYAI_RET[20], settings=settings)
    pp = prepost(discover_runs(root), None, ["babyai"])
    [row] = pp.rows
    assert row.paired is None and row.post == pytest.approx(0.14)   # the values are still shown, no CI
    [problem] = [p for p in pp.problems if "babyai" in p]
    assert "grpo_babyai/seed0 × babyai (return): pre and post were evaluated under different settings" in problem
    assert needle in problem and "checkpoint" not in problem
    # Without a recorded identity there is nothing to compare: not paired either.
    meta = run / "eval" / "step-000000" / "meta.json"
    meta.write_text(json.dumps({k: v for k, v in json.loads(meta.read_text()).items() if k != "identities"}))
    write_bench(run / "eval" / "step-000020", "babyai", "return", BABYAI_RET[20])
    pp = prepost(discover_runs(root), None, ["babyai"])
    assert pp.rows[0].paired is None and any("no recorded evaluation identity" in p for p in pp.problems)


def test_an_sft_arm_against_the_anchor_may_differ_in_checkpoint_and_prompt_only(tmp_path):
    from analysis.prepost import EXPECTED_DIFFERENCES

    assert EXPECTED_DIFFERENCES == {"step 0": ("checkpoint.",), "anchor": ("checkpoint.", "evaluate.prompt")}
    root = tmp_path / "runs"
    anchor = root / "_anchor" / "eval" / "step-000000"
    write_bench(anchor, "musique", "em", [1] * 2 + [0] * 8, settings={"prompt": "anchor_nudge"})
    write_bench(root / "search" / "seed0" / "eval" / "step-000050", "musique", "em", [1] * 5 + [0] * 5)
    pp = prepost(discover_runs(root), anchor, ["musique"])
    assert all(r.paired is not None for r in pp.rows) and pp.problems == []
    write_bench(anchor, "musique", "em", [1] * 2 + [0] * 8, settings={"prompt": "anchor_nudge", "topk": 5})
    pp = prepost(discover_runs(root), anchor, ["musique"])
    assert all(r.paired is None for r in pp.rows) and any("evaluate.topk: 5 -> 3" in p for p in pp.problems)


def test_figures_start_at_step_0_tick_checkpoints_and_note_all_zero_panels(analysed):
    _, _, res = analysed
    fig = next(f for f in res.figures if f.paths[0].stem == "curves_em")
    assert "babyai (return)" in fig.panels
    assert fig.xticks["musique@given"] == [0, 10, 20, 50]  # the anchor / starting checkpoints at 0, then each checkpoint
    assert "anchor" in fig.series["musique@given"]
    assert "covers items only (one seed: seed variance unknown)" in fig.caption and "Step 0" in fig.caption
    assert fig.notes == {}  # babyai's returns are not all zero
    # All-zero panel: only zeros everywhere becomes a one-line note.
    from analysis.aggregate import Points
    from analysis.figures import Panel, plot_curves
    table = pd.DataFrame([dict(arm="a", seed=0, step=s, bench="x", metric="em", value=0.0, n=10) for s in (0, 5)])
    info = plot_curves(Points(table, {}, []), [Panel("x", "em", "x", "EM")], ["a"], {"a": [0, 5]},
                       res.out / "figures" / "zero")
    assert info.notes == {"x": "x: every value is 0 (2 points)"} and info.series["x"] == []


def test_each_table_and_curve_names_its_columns_metric_an_environment_only_report_has_no_em_or_f1(analysed, tmp_path, fast_figures):
    _, out, res = analysed   # QA + babyai: metrics=[em] tabulates the QA benches' EM, babyai in its headline (return)
    assert [c.label for c in res.tables["main_em"].columns] == ["musique (given)", "babyai (return)"]
    assert "curves_env" not in {f.paths[0].stem for f in res.figures} and "main_env" not in res.tables
    # a table mixing both says so (before: "EM of the anchor ..." over the babyai (return) column too), its words the registry's
    from evals.registry import kind_of

    for name in ("main_em", "paired_em", "compare_grpo_babyai-lr1e-6_vs_grpo_qa_em"):
        assert res.tables[name].caption.startswith("EM on the QA benches and each environment bench's own headline metric "
                                                   f"(babyai: {kind_of('babyai').headline}, named in its column's header)"), name
    root = tmp_path / "runs"   # babyai alone: EM and F1 mean nothing; before: main_em / main_f1 and curves_em /
    for step in (0, 10, 20):   # curves_f1, captioned EM / F1, each holding the same babyai (return) column
        for arm in ("grpo_babyai", "grpo_qa"):
            write_bench(root / arm / "seed0" / "eval" / f"step-{step:06d}", "babyai", "return", BABYAI_RET[step])
    env = run_analysis({"runs_root": str(root), "out": str(tmp_path / "rep"), "evaluate": False, "benches": ["babyai"],
                        "compare": [["grpo_babyai", "grpo_qa"]]})
    assert [f.paths[0].stem for f in env.figures] == ["curves_env"] and env.figures[0].panels == ["babyai (return)"]
    assert set(env.tables) == {"main_env", "paired_env", "compare_grpo_babyai_vs_grpo_qa_env", "prepost"}
    assert sorted(p.name for p in (tmp_path / "rep" / "tables").glob("main*")) == ["main_env.md", "main_env.tex"]
    for name in ("main_env", "paired_env", "compare_grpo_babyai_vs_grpo_qa_env"):
        table = env.tables[name]
        assert [c.label for c in table.columns] == ["babyai (return)"], name
        assert table.caption.startswith("The headline metric (each column's own, named in its header)"), table.caption
        assert "EM" not in table.caption and "F1" not in table.caption
    page = (tmp_path / "rep" / "report.html").read_text()
    assert 'id="table-main_env"' in page and "EM of the anchor" not in page and "F1 of the anchor" not in page


def test_analyze_with_a_profile_evaluates_into_the_profile_dir(tmp_path, tiny_tokenizer):
    pytest.importorskip("minigrid")
    from evals.run import evaluate
    from tests.test_evals_babyai import Replies

    root = tmp_path / "runs"
    ck = root / "grpo_qa" / "seed0" / "checkpoints" / "step-000000"
    ck.mkdir(parents=True)
    (ck / "config.json").write_text("{}")
    calls = []

    def evaluator(cfg):  # the real harness, with a backend that always turns left
        calls.append(cfg)
        return evaluate(cfg, backend=Replies(tiny_tokenizer, "turn left"))

    cfg = {"runs_root": str(root), "out": str(tmp_path / "rep"), "profile": "rl_ood", "benches": ["babyai"],
           "eval": {"babyai_max_steps": 1, "progress": False}}
    res = run_analysis(cfg, evaluator=evaluator)
    assert [(c["profile"], c["benches"], c["out"]) for c in calls] == [
        ("rl_ood", ["babyai"], str(root / "grpo_qa" / "seed0" / "eval" / "rl_ood" / "step-000000"))]
    assert not (root / "grpo_qa" / "seed0" / "eval" / "step-000000").exists()
    assert set(res.table.bench) == {"babyai"} and "babyai: evaluated" not in (res.report.read_text())
    run_analysis(cfg, evaluator=evaluator)
    assert len(calls) == 1  # found in eval/rl_ood/ under this identity: nothing left to evaluate
    run_analysis({**cfg, "eval": {"babyai_max_steps": 2, "progress": False}}, evaluator=evaluator)
    assert len(calls) == 2 and calls[-1]["overwrite"] is True  # another cap: another identity, re-evaluated


def test_a_delta_without_a_ci_says_why_in_its_cell(tmp_path):
    """The defect: eval dirs without meta.json gave a bare "–" Δ cell, its reason only under the report's problems;
    every other table writes "– (why)"."""
    from test_analysis_helpers import make_run

    root = tmp_path / "runs"
    make_run(root, "grpo", 0, [0, 10], evaluated={0: {"musique": 0.1}, 10: {"musique": 0.4}})   # no meta.json
    pp = prepost(discover_runs(root), None, ["musique"])
    cells = dict((r[1][1], r[1]) for r in pp.table().rows)["EM"]
    meta = root / "grpo" / "seed0" / "eval"
    assert cells[4] == (f"– (no recorded evaluation identity ({meta / 'step-000000' / 'meta.json'}, "
                        f"{meta / 'step-000010' / 'meta.json'}): not paired)")
    assert cells[5:7] == ["–", "–"]   # n and interval: no pair, nothing to repeat
    (meta / "step-000010" / "musique.jsonl").unlink()   # no per-example rows: said in the cell too
    cells = dict((r[1][1], r[1]) for r in prepost(discover_runs(root), None, ["musique"]).table().rows)["EM"]
    assert cells[4] == "– (no per-example results to pair, no CI)"



def test_a_post_before_the_runs_final_step_says_so(tmp_path):
    """The defect: the column read "post (final step)" while a bench the final step has no score for fell back to an
    earlier step, marked only "@10", beside a main table whose final row is the last step (a gap there)."""
    from test_analysis_helpers import make_run

    root = tmp_path / "runs"
    make_run(root, "grpo", 0, [0, 10, 20], evaluated={0: {"musique": 0.1, "hotpotqa": 0.2},
                                                      10: {"musique": 0.3, "hotpotqa": 0.3}, 20: {"musique": 0.4}})
    pp = prepost(discover_runs(root), None, ["musique", "hotpotqa"])
    table = pp.table()
    assert table.columns[3].label == "post (last scored step)"
    assert "post: the run's last evaluated step with a score for the bench" in table.caption
    posts = {(c[0], c[1]): c[3] for _, c in table.rows}
    assert posts[("musique (open)", "EM")] == "0.400 @20"   # the run's final step: as before
    assert posts[("hotpotqa (open)", "EM")] == "0.300 @10 (not the final step 20: not evaluated there)"
    summary = json.loads((root / "grpo" / "seed0" / "eval" / "step-000020" / "summary.json").read_text())
    summary["hotpotqa"] = {"em": None, "f1": None, "n": 10, "null_reason": "not measured: 10 of 10 items never generated"}
    write_json(root / "grpo" / "seed0" / "eval" / "step-000020" / "summary.json", summary)
    posts = {(c[0], c[1]): c[3] for _, c in prepost(discover_runs(root), None, ["musique", "hotpotqa"]).table().rows}
    assert posts[("hotpotqa (open)", "F1")] == ("0.300 @10 (not the final step 20: not measured: 10 of 10 items never "
                                                "generated)")
