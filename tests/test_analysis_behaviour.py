"""The format-vs-capability decomposition on constructed eval dirs whose answer is known."""
import json
import math

import pytest
from test_analysis_helpers import drawn_figures, make_run

import numpy as np

from analysis.behaviour import bench_behaviour, decompose, read_episodes, transition_split
from launch.analyze import run_analysis
from common.io import write_json

N = 100


def _row(i: int, *, ok: bool, em: float, searches: int = 1, rule: str | None = None, stop: str | None = None,
         parse_errors: int = 0) -> dict:
    """A QA row as evals.tasks.episode_row writes it: `searches` search rounds, then (ok) a Final answer."""
    messages = [{"role": "user", "content": f"q{i}"}]
    for k in range(searches):
        messages += [{"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "id": f"call_{k}", "function": {"name": "search", "arguments": {"query": "x"}}}]},
            {"role": "tool", "name": "search", "content": "Doc 1: ..."}]
    messages.append({"role": "assistant", "content": "Final answer: a" if ok else "I am not sure"})
    rule = rule or ("final_answer" if ok else "none")
    stop = stop or ("answer" if ok else "no_answer")
    return {"id": f"q{i}", "question": f"q{i}", "golden_answers": ["a"], "prediction": "a" if ok else None,
            "extract_rule": rule, "stop_reason": stop, "num_turns": searches + 1, "num_tool_calls": searches,
            "num_tool_errors": parse_errors, "generated_tokens": 10,
            "metrics": {"em": em, "f1": em, "cover_em": em, "strict_em": em if rule == "final_answer" else 0.0},
            "messages": messages}


def _write(eval_dir, rows, bench="nq", fingerprint="fp-nq"):
    eval_dir.mkdir(parents=True, exist_ok=True)
    (eval_dir / f"{bench}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    em = sum(r["metrics"]["em"] for r in rows) / len(rows)
    write_json(eval_dir / "summary.json", {bench: {"em": em, "f1": em, "cover_em": em, "strict_em": em, "n": len(rows),
                                                   "format_failure_rate": 0.0, "mean_turns": 2.0,
                                                   "mean_tool_calls": 1.0}})
    write_json(eval_dir / "meta.json", {"identities": {bench: {"fingerprint": fingerprint, "keys": {"evaluate.n": N}}}})


def _rows(n_ok: int, n_correct: int, malformed: str = "no_answer") -> list[dict]:
    """`n_ok` well-formed, extractable episodes (the first `n_correct` right), the rest without an answer."""
    out = []
    for i in range(N):
        if i < n_ok:
            out.append(_row(i, ok=True, em=float(i < n_correct)))
        else:
            out.append(_row(i, ok=False, em=0.0, stop=malformed))
    return out


def test_format_only_improvement_is_attributed_to_format(tmp_path):
    # 40 -> 80 extractable; the answers given are right half the time before and after: pure format.
    _write(tmp_path / "pre", _rows(40, 20))
    _write(tmp_path / "post", _rows(80, 40, malformed="length"))
    pre, post = bench_behaviour(tmp_path / "pre", "nq"), bench_behaviour(tmp_path / "post", "nq")
    assert (pre.p_ok, pre.em_ok, post.p_ok, post.em_ok) == (0.4, 0.5, 0.8, 0.5)
    split = decompose(pre, post)
    assert split.delta == pytest.approx(0.2)
    assert split.format + split.capability + split.rest == pytest.approx(split.delta, abs=1e-12)
    assert 0.95 <= split.format / split.delta <= 1.05
    assert abs(split.capability / split.delta) <= 0.05
    assert post.failures == {"cut_at_token_limit": 20, "no_extractable_answer": 20}
    assert pre.stops == {"answer": 40, "no_answer": 60} and post.rules == {"final_answer": 80, "none": 20}


def test_capability_only_improvement_is_attributed_to_capability(tmp_path):
    # The same 60 episodes are extractable before and after; 18 -> 36 of them right: pure capability.
    _write(tmp_path / "pre", _rows(60, 18))
    _write(tmp_path / "post", _rows(60, 36))
    split = decompose(bench_behaviour(tmp_path / "pre", "nq"), bench_behaviour(tmp_path / "post", "nq"))
    assert split.delta == pytest.approx(0.18)
    assert split.format + split.capability + split.rest == pytest.approx(split.delta, abs=1e-12)
    assert 0.95 <= split.capability / split.delta <= 1.05
    assert abs(split.format / split.delta) <= 0.05


def test_mixed_change_adds_up_and_answers_outside_the_format_are_the_rest(tmp_path):
    pre = _rows(30, 10)
    # an episode with a tool-call parse error that still answered correctly: not well-formed, EM 1
    pre[50] = _row(50, ok=True, em=1.0, parse_errors=1)
    post = _rows(70, 49)
    _write(tmp_path / "pre", pre)
    _write(tmp_path / "post", post)
    pre_b, post_b = bench_behaviour(tmp_path / "pre", "nq"), bench_behaviour(tmp_path / "post", "nq")
    assert pre_b.extractable == pytest.approx(0.31) and pre_b.well_formed == pre_b.p_ok == pytest.approx(0.30)
    assert pre_b.failures["tool_call_parse_error"] == 1
    split = decompose(pre_b, post_b)
    # by hand: EM0 = 11/100, EM1 = 49/100; format (0.7-0.3)*(10/30), capability 0.7*(0.7-1/3), rest -(0.01)
    assert split.format == pytest.approx(0.4 / 3) and split.capability == pytest.approx(0.7 * (0.7 - 1 / 3))
    assert split.rest == pytest.approx(-0.01) and split.delta == pytest.approx(0.38)
    assert split.format + split.capability + split.rest == pytest.approx(split.delta, abs=1e-12)


def test_no_extractable_answer_before_leaves_the_split_undefined(tmp_path):
    _write(tmp_path / "pre", _rows(0, 0))
    _write(tmp_path / "post", _rows(50, 25))
    split = decompose(bench_behaviour(tmp_path / "pre", "nq"), bench_behaviour(tmp_path / "post", "nq"))
    assert split.delta == pytest.approx(0.25) and math.isnan(split.format) and "pre evaluation" in split.why_undefined


def test_the_report_shows_the_decomposition_by_bench_mode_and_identity(tmp_path):
    root = tmp_path / "runs"
    run = make_run(root, "r2e", 0, [10, 20])
    _write(root / "_anchor" / "eval" / "step-000000", _rows(40, 20), fingerprint="anchorfp000")
    _write(run / "eval" / "step-000010", _rows(60, 30), fingerprint="armfp00001")
    _write(run / "eval" / "step-000020", _rows(80, 40), fingerprint="armfp00002")
    out = tmp_path / "rep"
    res = run_analysis({"runs_root": str(root), "out": str(out), "benches": ["nq"], "evaluate": False,
                        "metrics": ["em"]})
    table = res.tables["decomposition"]
    (label, cells), = table.rows
    assert label == "r2e/seed0 @20 (pre: anchor)"
    assert cells[:2] == ["nq (open)", "armfp00002"] and cells[9:13] == ["+0.200", "+0.200", "+0.000", "+0.000"]
    assert any(f.paths[0].stem == "decomposition" for f in res.figures)
    report = (out / "report.md").read_text()
    assert "### decomposition" in report and "![decomposition](figures/decomposition.png)" in report
    assert "Δp·EM₀|ok" in report and "### behaviour_stages" in report and "final_answer 80, none 20" in report
    # the aggregate split is kept only with its convention and its selection caveat (issue 61)
    assert "Convention: format valued at the pre model's EM|ok" in report and "confounded by selection" in report
    html = (out / "report.html").read_text()
    assert "capability p₁·ΔEM|ok" in html and "armfp00002" in html
    points = (out / "tables" / "decomposition_points.csv").read_text().splitlines()
    assert len(points) == 3  # header + steps 10 and 20: every checkpoint, not only the final one


def test_a_pair_evaluated_under_other_settings_is_not_split(tmp_path):
    root = tmp_path / "runs"
    run = make_run(root, "r2e", 0, [10])
    _write(root / "_anchor" / "eval" / "step-000000", _rows(40, 20))
    _write(run / "eval" / "step-000010", _rows(60, 30))
    meta = json.loads((run / "eval" / "step-000010" / "meta.json").read_text())
    meta["identities"]["nq"]["keys"]["evaluate.n"] = 7
    write_json(run / "eval" / "step-000010" / "meta.json", meta)
    res = run_analysis({"runs_root": str(root), "out": str(tmp_path / "rep"), "benches": ["nq"], "evaluate": False,
                        "metrics": ["em"]})
    (label, cells), = res.tables["decomposition"].rows   # no split: a row saying why (was: no row at all)
    assert (label, cells[0]) == ("–", "– (no rows: 1 pair refused (the transitions table and the problems say why))")
    assert "evaluated under different settings (evaluate.n: 100 -> 7)" in (tmp_path / "rep" / "report.md").read_text()


def test_an_undefined_split_is_also_made_from_the_runs_first_well_formed_checkpoint(tmp_path):
    """Anchor with no ok episode: the anchor row stays (undefined, with its reason) and a second row splits the
    final checkpoint against the run's first checkpoint that has one. Step 10: p 0.5, EM|ok 0.2 (EM 0.10);
    step 20: p 0.6, EM|ok 0.6 (EM 0.36): ΔEM 0.26 = format 0.1 x 0.2 = 0.02 + capability 0.6 x 0.4 = 0.24."""
    root = tmp_path / "runs"
    run = make_run(root, "r2e", 0, [5, 10, 20])
    _write(root / "_anchor" / "eval" / "step-000000", _rows(0, 0), fingerprint="anchorfp000")
    _write(run / "eval" / "step-000005", _rows(0, 0), fingerprint="armfp00000")
    _write(run / "eval" / "step-000010", _rows(50, 10), fingerprint="armfp00001")
    _write(run / "eval" / "step-000020", _rows(60, 36), fingerprint="armfp00002")
    res = run_analysis({"runs_root": str(tmp_path / "runs"), "out": str(tmp_path / "rep"), "benches": ["nq"],
                        "evaluate": False, "metrics": ["em"]})
    rows = res.tables["decomposition"].rows
    assert [label for label, _ in rows] == ["r2e/seed0 @20 (pre: anchor)", "r2e/seed0 @20 (pre: step 10)"]
    assert rows[0][1][10].startswith("– (the pre evaluation has no well-formed")
    assert rows[1][1][7:13] == ["0.500→0.600", "0.200→0.600", "+0.260", "+0.020", "+0.240", "+0.000"]
    assert [label for label, _ in res.tables["behaviour_stages"].rows] == ["anchor", "r2e/seed0 @20"]
    points = (tmp_path / "rep" / "tables" / "decomposition_points.csv").read_text().splitlines()
    assert len(points) == 1 + 3 + 1   # every step against the anchor, and step 20 against step 10
    figure = next(f for f in res.figures if f.paths[0].stem == "decomposition")
    assert list(figure.series.values()) == [["r2e"]]   # the item-paired split against the anchor: always defined


# ---- the item-paired transition table, against a numpy oracle ---------------------------------------------

def _item_rows(ok, right, prefix="q") -> list[dict]:
    """One row per item i: well-formed with an extractable answer where ok[i] (else no answer), EM right[i]."""
    return [_row(i, ok=bool(o), em=float(r)) | {"id": f"{prefix}{i}"} for i, (o, r) in enumerate(zip(ok, right))]


def _oracle(pre_ok, pre_em, post_ok, post_em) -> dict:
    """The transition parts by plain numpy masks (items × seeds arrays; right = EM 1)."""
    pre_ok, pre_em, post_ok, post_em = (np.atleast_2d(np.asarray(x, float).T).T for x in (pre_ok, pre_em, post_ok, post_em))
    d = post_em - pre_em
    w0, w1, m0 = (pre_ok == 1) & (pre_em == 0), (pre_ok == 1) & (pre_em == 1), (pre_ok == 0) & (pre_em == 0)
    to_w1, to_w0, to_m0 = (post_ok == 1) & (post_em == 1), (post_ok == 1) & (post_em == 0), (post_ok == 0) & (post_em == 0)
    parts = {"capability_gain": w0 & to_w1, "format_gain": m0 & to_w1, "capability_loss": w1 & to_w0,
             "format_loss": w1 & to_m0}
    out = {k: float((d * m).mean()) for k, m in parts.items()}
    out["rest"] = float((d * ~np.any(list(parts.values()), axis=0)).mean())
    out["delta"] = float(d.mean())
    return out


def _split(tmp_path, pre_rows, post_rows):
    _write(tmp_path / "pre", pre_rows)
    _write(tmp_path / "post", post_rows)
    pre, post = read_episodes(tmp_path / "pre" / "nq.jsonl"), read_episodes(tmp_path / "post" / "nq.jsonl")
    return transition_split([(0, pre, post)]), pre, post


def test_a_format_fix_on_hard_items_is_no_capability_loss(tmp_path):
    """The selection case: the model knows the same items before and after (45 of 50 easy, well-formed items;
    20 of 50 hard ones it answered malformed before); only the format on the hard items is fixed. The aggregate
    split reads capability −0.25 (format share 2.25); the transition table: no capability change at all."""
    pre_ok = [1] * 50 + [0] * 50
    knows = [1] * 45 + [0] * 5 + [1] * 20 + [0] * 30
    pre_em = [k * o for k, o in zip(knows, pre_ok)]
    post_ok, post_em = [1] * 100, knows
    sp, pre, post = _split(tmp_path, _item_rows(pre_ok, pre_em), _item_rows(post_ok, post_em))
    oracle = _oracle(pre_ok, pre_em, post_ok, post_em)
    assert decompose(bench_behaviour(tmp_path / "pre", "nq"), bench_behaviour(tmp_path / "post", "nq")).capability \
        == pytest.approx(-0.25)   # the aggregate split's selection artefact, kept only with its caveat
    for key, value in oracle.items():
        assert sp.parts[key][0] == pytest.approx(value, abs=1e-12)
    assert sp.parts["net_capability"][0] >= -0.02 and sp.parts["net_capability"][2] >= 0
    assert sp.parts["net_format"][0] == pytest.approx(0.20) and sp.delta == pytest.approx(0.20)
    assert sum(sp.parts[k][0] for k in ("capability_gain", "format_gain", "capability_loss", "format_loss", "rest")) \
        == pytest.approx(sp.delta, abs=1e-12)
    assert sp.counts[("M0", "W1")] == 20 and sp.counts[("M0", "W0")] == 30 and sp.counts[("W1", "W1")] == 45
    lo, hi = sp.parts["format_gain"][1:]
    assert lo < 0.2 < hi and hi - lo < 0.2   # an interval around the estimate, not everything


def test_format_only_and_capability_only_changes_land_in_their_own_part(tmp_path):
    # format only: 40 -> 80 well-formed; the old 40 unchanged (20 right), the newly well-formed 40 right half the time
    pre_ok, pre_em = [1] * 40 + [0] * 60, [1] * 20 + [0] * 80
    post_ok, post_em = [1] * 80 + [0] * 20, [1] * 20 + [0] * 20 + [1] * 20 + [0] * 40
    sp, _, _ = _split(tmp_path / "f", _item_rows(pre_ok, pre_em), _item_rows(post_ok, post_em))
    assert sp.delta == pytest.approx(0.2) == pytest.approx(_oracle(pre_ok, pre_em, post_ok, post_em)["delta"])
    assert sp.parts["net_format"][0] / sp.delta >= 0.95 and abs(sp.parts["net_capability"][0] / sp.delta) <= 0.05
    # capability only: the same 60 well-formed before and after, 18 -> 36 of them right
    sp, _, _ = _split(tmp_path / "c", _rows(60, 18), _rows(60, 36))
    assert sp.parts["net_capability"][0] / sp.delta >= 0.95 and abs(sp.parts["net_format"][0] / sp.delta) <= 0.05


def test_random_pairs_over_seeds_match_the_oracle_exactly(tmp_path):
    rng = np.random.default_rng(3)
    n, seeds = 60, 3
    pre_ok, pre_em = rng.random(n) < 0.5, rng.random(n) < 0.4
    post_ok, post_em = rng.random((n, seeds)) < 0.7, rng.random((n, seeds)) < 0.5
    _write(tmp_path / "pre", _item_rows(pre_ok, pre_em))
    pairs = []
    for s in range(seeds):
        _write(tmp_path / f"post{s}", _item_rows(post_ok[:, s], post_em[:, s])[::-1])   # another row order
        pairs.append((s, read_episodes(tmp_path / "pre" / "nq.jsonl"), read_episodes(tmp_path / f"post{s}" / "nq.jsonl")))
    sp = transition_split(pairs)
    oracle = _oracle(np.repeat(pre_ok[:, None], seeds, 1), np.repeat(pre_em[:, None], seeds, 1), post_ok, post_em)
    for key, value in oracle.items():
        assert sp.parts[key][0] == pytest.approx(value, abs=1e-12)
    assert sum(sp.counts.values()) == n * seeds and sp.seeds == (0, 1, 2)
    assert transition_split(pairs).parts == sp.parts   # seeded


def _add_bench(eval_dir, rows, bench):
    """Another bench's rows and summary in an eval dir, its identity not recorded in meta.json."""
    (eval_dir / f"{bench}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = json.loads((eval_dir / "summary.json").read_text())
    summary[bench] = summary["nq"] | {"em": sum(r["metrics"]["em"] for r in rows) / len(rows)}
    write_json(eval_dir / "summary.json", summary)


def test_the_transition_table_refuses_other_items_and_unrecorded_pre_and_shows_intervals(tmp_path):
    """One report, three pairs against the anchor: search × nq paired (split, with intervals); r2e × nq over
    other item ids with the same count (refused); r2e × triviaqa whose anchor records no identity (refused,
    and not labelled with the post's identity)."""
    root = tmp_path / "runs"
    anchor = root / "_anchor" / "eval" / "step-000000"
    r2e, search = make_run(root, "r2e", 0, [10]), make_run(root, "search", 0, [10])
    _write(anchor, _rows(40, 20), fingerprint="anchorfp000")
    _add_bench(anchor, _rows(40, 20), "triviaqa")
    _write(search / "eval" / "step-000010", _rows(60, 30), fingerprint="searchfp01")
    _write(r2e / "eval" / "step-000010", [r | {"id": f"other{i}"} for i, r in enumerate(_rows(60, 30))],
           fingerprint="armfp00001")
    _add_bench(r2e / "eval" / "step-000010", _rows(60, 30), "triviaqa")
    meta = json.loads((r2e / "eval" / "step-000010" / "meta.json").read_text())
    meta["identities"]["triviaqa"] = {"fingerprint": "armtqa0001", "keys": {"evaluate.n": N}}
    write_json(r2e / "eval" / "step-000010" / "meta.json", meta)
    res = run_analysis({"runs_root": str(root), "out": str(tmp_path / "rep"), "benches": ["nq", "triviaqa"],
                        "evaluate": False, "metrics": ["em"]})
    rows = {(label, cells[0]): cells for label, cells in res.tables["transitions"].rows}
    assert set(rows) == {("r2e @10 (pre: anchor)", "nq (open)"), ("r2e @10 (pre: anchor)", "triviaqa (open)"),
                         ("search @10 (pre: anchor)", "nq (open)")}
    ids = rows[("r2e @10 (pre: anchor)", "nq (open)")]
    assert any(c.startswith("refused: seed 0: item ids differ (pre n=100, post n=100; 100 only in pre") for c in ids)
    unrecorded = rows[("r2e @10 (pre: anchor)", "triviaqa (open)")]
    assert unrecorded[1] == "unrecorded → armtqa0001"
    assert any("refused: seed 0: no recorded evaluation identity" in c for c in unrecorded)
    assert [label for label, _ in res.tables["decomposition"].rows] == ["search/seed0 @10 (pre: anchor)"]
    cells = rows[("search @10 (pre: anchor)", "nq (open)")]
    assert cells[1:4] == ["anchorfp00 → searchfp01", "1 × 100", "0.200→0.300"]
    assert cells[4].startswith("+0.100 [") and cells[-1] == "items only (one seed: seed variance unknown)"
    assert cells[-2] == "Tango score" and "Tango's (1998) score interval" in res.tables["transitions"].caption   # one seed, 0/1 EM
    report = (tmp_path / "rep" / "report.md").read_text()
    assert "### transitions" in report and "newly well-formed and right" in report and "item ids differ" in report
    assert len((tmp_path / "rep" / "tables" / "transitions.csv").read_text().splitlines()) == 4


def test_transition_intervals_cover_seed_variance_with_several_seeds():
    """A simulation with known truth (numpy oracle): 80 items × 3 seeds, every item malformed and wrong before
    (the anchor); after, item i under seed s is well-formed and right with probability σ(−1 + a_i + b_s),
    a_i ~ N(0, 1), b_s ~ N(0, 0.5²) on the logit scale. The part "newly well-formed and right" estimates
    E σ(−1 + a + b) over the item and seed populations; over 150 simulated studies its 95% interval must cover
    that ≥ 88% of the time (0.92; an item-only bootstrap covers 0.66) with a median width ≤ 1.6× (1.15×) the oracle's
    (1.96 × 2 × the estimates' own spread), and say it covers items and seeds; one seed says items only."""
    from analysis.behaviour import Episode

    def ep(i, right):
        return Episode(f"q{i}", float(right), "final_answer" if right else "none", "answer" if right else "no_answer",
                       bool(right), 1, False, ())

    def sig(x):
        return 1 / (1 + np.exp(-x))

    big = np.random.default_rng(99)
    truth = sig(-1 + big.standard_normal(1_000_000) + 0.5 * big.standard_normal(1_000_000)).mean()
    rng = np.random.default_rng(7)
    n, seeds, reps = 80, 3, 150
    pre = [ep(i, False) for i in range(n)]
    hits, widths, ests = 0, [], []
    for _ in range(reps):
        a, b = rng.standard_normal(n), 0.5 * rng.standard_normal(seeds)
        w1 = rng.random((n, seeds)) < sig(-1 + a[:, None] + b[None, :])
        sp = transition_split([(s, pre, [ep(i, w1[i, s]) for i in range(n)]) for s in range(seeds)])
        est, lo, hi = sp.parts["format_gain"]
        assert est == pytest.approx(w1.mean()) and sp.parts["delta"][0] == pytest.approx(est)
        hits += lo <= truth <= hi
        widths.append(hi - lo)
        ests.append(est)
    assert sp.covers == "items+seeds"
    assert hits / reps >= 0.88
    assert np.median(widths) <= 1.6 * 2 * 1.96 * np.std(ests, ddof=1)
    one = transition_split([(0, pre, [ep(i, w1[i, 0]) for i in range(n)])])
    assert one.covers == "items" and one.parts["format_gain"][1] < one.parts["format_gain"][0]


@pytest.mark.parametrize("n, p0, gain, loss, seeds, alike", [(20, 0.2, 0.2, 0.02, 1, 1), (15, 0.3, 0.3, 0.0, 1, 1),
                                                             (50, 0.3, 0.1, 0.02, 1, 1), (20, 0.2, 0.2, 0.02, 3, 1), (20, 0.2, 0.2, 0.02, 1, 3)])
def test_transition_delta_em_on_0_1_scores_covers_a_known_difference(n, p0, gain, loss, seeds, alike):
    """The transition table's ΔEM on 0/1 EM, simulated with known truth (numpy oracle): pre right on an item with
    p0, each seed turns a wrong item right with `gain`, a right one wrong with `loss` (Δ = (1 − p0)·gain − p0·loss),
    each study one column of part_intervals. One seed: Tango's score interval covers 0.99, 0.99, 0.98 of 20,000
    studies (the item t it replaced: 0.87, 0.88, 0.89); three seeds keep the crossed t with its seed term (0.98 of 4,000).
    Three seeds that agree on every item (`alike`) are one seed for the interval: Tango's, 0.99 of 4,000 (the crossed t
    with its seed part 0: 0.88)."""
    from analysis.behaviour import part_intervals
    from analysis.stats import tango_limits

    rng = np.random.default_rng(n + seeds)
    reps = 20000 if seeds == alike == 1 else 4000
    pre = (rng.random((reps, n)) < p0).astype(float)
    u = rng.random((reps, n, seeds))
    post = np.repeat(np.where(pre[..., None] == 1, u >= loss, u < gain).astype(float), alike, -1)
    truth = (1 - p0) * gain - p0 * loss
    got, covers, method = part_intervals(np.moveaxis(post - pre[..., None], 0, 2))   # items × seeds × studies
    lo, hi = np.array([got[k][1:] for k in range(reps)]).T
    assert ((lo <= truth) & (truth <= hi)).mean() >= 0.94
    assert (covers, method) == ((("items", "Tango score") if alike == 1 else ("items+seeds", "Tango score")) if seeds == 1
                                else ("items+seeds", "crossed t"))
    if seeds == 1:   # through the table's own path: the split of one study's episodes
        d = post[0, :, 0] - pre[0]
        sp = transition_split([(0, [_ep(i, pre[0, i]) for i in range(n)], [_ep(i, post[0, i, 0]) for i in range(n)])])
        assert sp.method == "Tango score" and sp.parts["delta"][1:] == pytest.approx(np.ravel(tango_limits((d > 0).sum(), (d < 0).sum(), n)))



@pytest.mark.parametrize("n, p0, gain, loss", [(20, 0.2, 0.2, 0.02), (50, 0.3, 0.1, 0.02)])
def test_a_transition_part_whose_seeds_agree_gets_tango_beside_parts_whose_seeds_differ(n, p0, gain, loss):
    """Two seeds that differ on one part (each seed's own 10% of items) while another part's contributions agree on
    every item (simulated as above, 4,000 studies, each one part): that part is one seed for its interval, Tango's,
    covering 0.99, 0.97, where the crossed t with its seed term 0 (the rule before: Tango only where every part
    agrees) covered 0.87, 0.88; the part that differs keeps the crossed t, and the method says both."""
    from analysis.behaviour import part_intervals
    from analysis.variance import Term, crossed_parts, limits

    rng, reps = np.random.default_rng(n), 4000
    pre = rng.random((n, reps)) < p0
    u = rng.random((n, reps))
    d = np.where(pre, -(u < loss).astype(float), (u < gain).astype(float))   # the same on both seeds
    differ = (rng.random((n, 2, 1)) < 0.1).astype(float)
    got, covers, method = part_intervals(np.concatenate([differ, np.repeat(d[:, None, :], 2, 1)], axis=2))
    lo, hi = np.array([got[k][1:] for k in range(1, reps + 1)]).T
    truth, vary = (1 - p0) * gain - p0 * loss, np.ptp(d, axis=0) > 0
    assert ((lo <= truth) & (truth <= hi))[vary].mean() >= 0.94
    assert (covers, method) == ("items+seeds", "crossed t, Tango score where the seeds agree")
    assert got[0][1:] == pytest.approx(np.ravel(limits(crossed_parts([[Term("part", 1.0, differ[..., 0])]]), 0.95)))

def _ep(i, right):
    from analysis.behaviour import Episode

    return Episode(f"q{i}", float(right), "final_answer" if right else "none", "answer" if right else "no_answer",
                   bool(right), 1, False, ())


@pytest.mark.parametrize("seeds, covers, method, words", [
    ((0,), "items", "Tango score", "items only (one seed: seed variance unknown), by Tango's score interval for paired proportions"),
    ((0,), "items", "crossed t", "items only (one seed: seed variance unknown), by the crossed t on Satterthwaite df"),
    ((0, 1), "items+seeds", "crossed t", "items and seeds both random, by the crossed t on Satterthwaite df"),
    ((0, 1), "items+seeds", "crossed t, Tango score where the seeds agree",
     "items and seeds both random, by the crossed t on Satterthwaite df, or Tango's score interval where the seeds agree on every item")])
def test_the_decomposition_figure_says_what_its_interval_covers(seeds, covers, method, words):
    """The ΔEM diamond's interval is the transition table's: with 2 seeds it covers seeds too, at the analysis's
    conf (before: "95% interval over items (seed variance not included)" whatever they were), and the caption names
    its method (before: none, though one seed on 0/1 EM is Tango's score interval)."""
    from analysis.behaviour import PART_KEYS, TransitionRow, TransitionSplit, decomposition_caption

    split = TransitionSplit(10, seeds, 0.2, 0.3, {}, {}, {k: (0.1, 0.0, 0.2) for k in PART_KEYS}, covers, method)
    caption = decomposition_caption([TransitionRow("r2e", 10, "nq", "anchor", "a → b", split)], 0.9)
    assert f"its 90% interval, covering {words}." in caption and "95%" not in caption


def test_a_transition_part_no_item_took_is_not_a_zero_width_interval():
    """20 items, one seed, 5 gained capability and nothing else moved: the empty parts (every contribution 0)
    are bounded by the exact limit of 0 events in 20 (scipy's beta quantile), not [+0.000, +0.000]."""
    from scipy.stats import beta

    from analysis.behaviour import part_intervals

    c = np.zeros((20, 1, 3))
    c[:5, 0, 0] = 1.0
    got, covers, method = part_intervals(c)
    u = beta.ppf(0.975, 1, 20)
    assert got[1] == pytest.approx((0.0, -u, u)) and got[2] == got[1] and covers == "items"
    assert got[0][1] < 0.25 < got[0][2] and method == "Tango score"   # the part with items: one seed, 0/1 contributions


def _decomposed(tmp_path, monkeypatch, arm: str, seeds: dict[int, list[int]], rows, run_keys=lambda seed: {}):
    """`arm`'s runs evaluated at `seeds[seed]` (rows `rows(seed, step)`) and the anchor, analysed: the result and
    the decomposition figure's tick labels as drawn."""
    root = tmp_path / "runs"
    _write(root / "_anchor" / "eval" / "step-000000", _rows(40, 20), fingerprint="anchorfp000")
    for seed, steps in seeds.items():
        run = make_run(root, arm, seed, steps, **run_keys(seed))
        for s in steps:
            _write(run / "eval" / f"step-{s:06d}", rows(seed, s), fingerprint="armfp")
    ticks = drawn_figures(monkeypatch, lambda fig: [t.get_text() for ax in fig.axes if ax.get_visible()
                                                    for t in ax.get_xticklabels()])
    res = run_analysis({"runs_root": str(root), "out": str(tmp_path / "o"), "benches": ["nq"], "evaluate": False,
                        "metrics": ["em"]})
    return res, ticks


def test_the_decomposition_bar_of_fewer_seeds_than_its_arm_has_says_so(tmp_path, monkeypatch):
    """r2e has 3 seeds; seed 2 (still training) has no step 20: the bar at r2e's final step pools seeds 0 and 1 only,
    and its label says `2 of 3 seeds` (FigureInfo.seeds too; the caption names which seeds a bar pools). Before:
    `r2e @20` and "its seeds pooled", read as all three (the main table's final row pools all three: 0.567, the bar
    0.200→0.550)."""
    res, ticks = _decomposed(tmp_path, monkeypatch, "r2e", {0: [10, 20], 1: [10, 20], 2: [10]},
                             lambda seed, s: _rows(60 + 10 * seed, 30 + s + 10 * seed),
                             lambda seed: dict(horizon=20, save_steps=[10, 20], done=seed < 2))
    fig = next(f for f in res.figures if f.paths[0].stem == "decomposition")
    assert ticks["decomposition"] == ["r2e @20\n2 of 3 seeds"]
    assert fig.seeds == {"nq (open)": {"r2e": {20: 2}}}
    assert "the seeds evaluated at that step pooled (under each bar, of the arm's seeds)" in fig.caption
    (label, cells), = res.tables["transitions"].rows
    assert label == "r2e @20 (pre: anchor)" and cells[2] == "2 × 100"


def test_an_arm_split_against_two_pre_evaluations_gets_a_bar_for_each(tmp_path, monkeypatch):
    """grpo/seed0 has its own step 0 (pre: step 0), grpo/seed1 has none (pre: the anchor): the transition table has a
    row for each, and so does the figure, each bar naming its pre (before: one bar `grpo @10`, the other row dropped
    without a word, as the bars were keyed by arm)."""
    res, ticks = _decomposed(tmp_path, monkeypatch, "grpo", {0: [0, 10], 1: [10]},
                             lambda seed, s: _rows(50 + 5 * s, 20 + s + 10 * seed))
    assert [label for label, _ in res.tables["transitions"].rows] == ["grpo @10 (pre: anchor)", "grpo @10 (pre: step 0)"]
    fig = next(f for f in res.figures if f.paths[0].stem == "decomposition")
    assert ticks["decomposition"] == ["grpo (pre: anchor) @10\n1 of 2 seeds", "grpo (pre: step 0) @10\n1 of 2 seeds"]
    assert fig.series == {"nq (open)": ["grpo (pre: anchor)", "grpo (pre: step 0)"]}


def test_a_behaviour_table_without_rows_says_why(tmp_path):
    """The defect: eval dirs whose rows lack `stop_reason` (an older evaluate's) left every pre evaluation (the anchor,
    the RL run's step 0) undecomposed, and tables/transitions.md (and behaviour_stages.md) were written as a header
    with no row and no reason; only the decomposition's caption named the dirs."""
    from test_analysis_helpers import write_eval

    root = tmp_path / "runs"
    make_run(root, "grpo", 0, [0, 10], evaluated={0: {"nq": 0.1}, 10: {"nq": 0.4}})
    make_run(root, "sft", 0, [10], evaluated={10: {"nq": 0.3}})
    write_eval(root / "_anchor" / "eval" / "step-000000", {"nq": 0.1})
    res = run_analysis({"runs_root": str(root), "out": str(tmp_path / "rep"), "benches": ["nq"], "evaluate": False,
                        "metrics": ["em"]})
    why = ("– (no rows: not decomposed: anchor × nq (open): rows without `stop_reason` (an older evaluate's?); "
           "grpo/seed0 × nq (open): rows without `stop_reason` (an older evaluate's?))")
    for name in ("transitions", "decomposition", "behaviour_stages"):
        (label, cells), = res.tables[name].rows
        assert (label, cells[0], set(cells[1:])) == ("–", why, {"–"}), name
        assert f"| – | {why} |" in (tmp_path / "rep" / "tables" / f"{name}.md").read_text(), name
    # the anchor readable, no run with rows beside it: the tables say that instead
    _write(root / "_anchor" / "eval" / "step-000000", _rows(40, 20))
    for f in root.glob("*/seed0/eval/*/nq.jsonl"):
        f.unlink()
    res = run_analysis({"runs_root": str(root), "out": str(tmp_path / "rep2"), "benches": ["nq"], "evaluate": False,
                        "metrics": ["em"]})
    (label, cells), = res.tables["transitions"].rows
    assert cells[0] == ("– (no rows: no run × QA bench has rows at both its pre evaluation (the anchor or the run's "
                        "step 0) and a later step)")
    assert [label for label, _ in res.tables["behaviour_stages"].rows] == ["anchor"]   # a row: as before
