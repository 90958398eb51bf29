"""Every interval the report prints covers what it claims (issue 61): small versions of the simulation study
(bench/bench_coverage.py), each against this file's own numpy simulation with known truth, and the report
paths around them (the one-item gap, compare's settings refusal and dropped ids).

Simulations: logit item difficulty, item-specific gains, seed effects on the logit scale, Bernoulli scores.
Replicates are stated per test (no bootstrap: the crossed model has a closed form)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.special import expit, logit
from scipy.stats import norm
from scipy.stats import t as student_t

from analysis.variance import Term, crossed_parts, limits


def _arm(rng, difficulty, gain_sd: float, seed_em_sd: float, seeds: int) -> np.ndarray:
    """(replicates, items, seeds) 0/1 scores: item difficulty + an item-specific gain + a seed effect whose SD
    on the EM scale is `seed_em_sd` (its logit SD divided by the mean p(1 − p))."""
    gain = rng.normal(0, gain_sd, size=difficulty.shape)
    p = expit(difficulty + gain)
    seed_logit = seed_em_sd / (p * (1 - p)).mean(axis=1, keepdims=True)
    effect = rng.normal(0, 1, size=(difficulty.shape[0], 1, seeds)) * seed_logit
    return (rng.random((difficulty.shape[0], difficulty.shape[1], seeds)) < expit(difficulty + gain + effect)).astype(float)


def test_compare_type_one_error_at_three_seeds_covers_seed_variance():
    """1,000 null studies of A − B at 3 seeds × 500 items, σ_seed = 3.4 EM points per arm, items drawn anew
    each study (A and B: the same difficulty, independent gains of the same law, so the population
    difference is 0). The crossed interval rejects ≤ 7.5% with a median width ≤ 1.5× the oracle's
    (±1.96 × the estimate's SD across studies); the items-only interval (per-item differences averaged
    over seeds, t over items: the rule before issue 61) rejects far more often."""
    rng = np.random.default_rng(61)
    studies, items, seeds = 1000, 500, 3
    difficulty = rng.normal(logit(0.3), 1.5, size=(studies, items, 1))
    a = _arm(rng, difficulty, 0.8, 0.034, seeds)
    b = _arm(rng, difficulty, 0.8, 0.034, seeds)
    parts = crossed_parts([[Term("A", 1.0, a), Term("B", -1.0, b)]])
    lo, hi = limits(parts, 0.95)
    rejects = float(((lo > 0) | (hi < 0)).mean())
    oracle_width = 2 * norm.isf(0.025) * parts.est.std()
    assert rejects <= 0.075, rejects
    assert np.median(hi - lo) <= 1.5 * oracle_width, (np.median(hi - lo), oracle_width)
    assert set(parts.seeds.values()) == {3}
    d = (a - b).mean(axis=2)   # items only: what the seed means hide
    half = student_t.isf(0.025, items - 1) * d.std(axis=1, ddof=1) / np.sqrt(items)
    assert (np.abs(d.mean(axis=1)) > half).mean() > 0.15


def test_one_seed_band_keeps_its_coverage_at_one_percent():
    """1,000 studies of one seed × 200 items × 8 steps sharing item difficulty, the first step's EM ≈ 1%
    (truth: the population mean per step, from 400,000 items of the same law). The band (each step's
    interval at the Bonferroni level, Wilson on the effective n) covers every step at once >= 90%, with
    a mean width <= 1.5× the oracle band's (true per-step SD × the 95% quantile of the largest |z| over
    steps); the t band at the same level does not keep its coverage."""
    rng = np.random.default_rng(8)
    studies, items, steps, item_sd = 1000, 200, 8, 1.0
    centre = np.linspace(logit(0.008), logit(0.3), steps)
    truth = expit(centre + rng.normal(0, item_sd, size=(400_000, 1))).mean(axis=0)
    assert truth[0] == pytest.approx(0.01, abs=0.004)
    difficulty = rng.normal(0, item_sd, size=(studies, items, 1))
    scores = (rng.random((studies, items, steps)) < expit(centre + difficulty)).astype(float)
    per_step = np.moveaxis(scores, 2, 1)[..., None]            # (studies, steps, items, 1 seed)
    parts = crossed_parts([[Term("A", 1.0, per_step)]])
    level = 1 - 0.05 / steps
    lo, hi = limits(parts, level, binary=True)
    covered = ((lo <= truth) & (truth <= hi)).all(axis=1).mean()
    sd = parts.est.std(axis=0)
    oracle_crit = np.quantile((np.abs(parts.est - truth) / sd).max(axis=1), 0.95)
    assert covered >= 0.90, covered
    assert np.median((hi - lo).mean(axis=1)) <= 1.5 * (2 * oracle_crit * sd).mean()
    t_lo, t_hi = limits(parts, level, binary=False)
    assert ((t_lo <= truth) & (truth <= t_hi)).all(axis=1).mean() < 0.90


@pytest.mark.parametrize("n, p0, gain, loss, seeds, vs", [
    (20, 0.2, 0.2, 0.02, 1, "anchor"), (15, 0.3, 0.3, 0.0, 1, "anchor"), (50, 0.3, 0.1, 0.02, 1, "anchor"),
    (20, 0.2, 0.2, 0.02, 3, "anchor"), (15, 0.3, 0.3, 0.0, 2, "anchor"),
    (20, 0.2, 0.2, 0.02, 1, "arm"), (50, 0.3, 0.1, 0.02, 1, "arm"), (20, 0.2, 0.2, 0.02, 2, "arm"), (200, 0.3, 0.1, 0.02, 2, "arm"),
    (20, 0.2, 0.2, 0.02, 1, "arm:2"), (50, 0.3, 0.1, 0.02, 1, "arm:3"), (20, 0.2, 0.2, 0.02, 1, "anchor:3")])
def test_arm_vs_anchor_or_arm_on_0_1_scores_covers_a_known_difference(n, p0, gain, loss, seeds, vs):
    """The paired table's arm − anchor (vs="anchor") and the compare table's A − B (vs="arm": B an arm with as many
    seeds, at ≥ 2 seeds each flipping an item's right/wrong with 0.02) on 0/1 scores, simulated with known truth: B
    right on an item with p0, each seed of A turns a wrong item right with `gain`, a right one wrong with `loss`
    (Δ = (1 − p0)·gain − p0·loss, less 0.02·(1 − 2·p0) where B flips). One seed each: Tango's score interval
    (analysis.variance.estimate, met once per distinct count of items gained and lost in 20,000 studies) covers
    0.99, 0.99, 0.98 against the anchor, 0.99, 0.98 against an arm, where the crossed t covered 0.87, 0.88, 0.88 and
    0.87, 0.88. Two or more seeds keep the crossed t with its seed terms: 0.98, 0.97 against the anchor, 0.98, 0.99 between
    two arms of 2 seeds each (4,000 studies; docs/stages/analyze.md has the wider simulation). Seeds that agree on every
    item ("arm:2": B's 2 seeds, "anchor:3": A's 3, e.g. greedy evaluations that ignore the seed) are one seed for the
    interval, Tango's: 0.99, 0.98, 0.99 of 4,000 studies, where the crossed t (seed part 0) covered 0.88, 0.88, 0.88."""
    from analysis.variance import estimate

    rng = np.random.default_rng(n + seeds)
    vs, _, copies = vs.partition(":")
    reps, flip = (4000 if seeds > 1 or copies else 20000), (0.02 if vs == "arm" and seeds > 1 else 0.0)
    pre = (rng.random((reps, n)) < p0).astype(float)
    u = rng.random((reps, n, seeds))
    post = np.where(pre[..., None] == 1, u >= loss, u < gain).astype(float)
    b = np.abs(pre[..., None] - (rng.random((reps, n, seeds if vs == "arm" else 1)) < flip))
    post, b = (np.repeat(post, int(copies), -1), b) if vs == "anchor" and copies else (post, np.repeat(b, int(copies or 1), -1))
    truth, d = (1 - p0) * gain - p0 * loss - flip * (1 - 2 * p0), post.mean(axis=-1) - b.mean(axis=-1)
    vary = np.ptp(d, axis=-1) > 0   # no difference varies: the exact bounds of the test above
    terms = lambda i: [Term("A", 1.0, post[i]), Term("B", -1.0, b[i], random_seeds=vs == "arm")]  # noqa: E731
    if seeds == 1:
        lo, hi = np.full(reps, np.nan), np.full(reps, np.nan)
        counts = np.stack([(d > 0).sum(-1), (d < 0).sum(-1)], axis=-1)
        for bc in np.unique(counts[vary], axis=0):
            rows = vary & (counts == bc).all(-1)
            got = estimate([terms(np.flatnonzero(rows)[0])], 0.95)
            assert got.method == "Tango score" and got.covers == ("items+seeds" if vs == "anchor" and copies else "items")
            lo[rows], hi[rows] = got.lo, got.hi
    else:
        lo, hi = limits(crossed_parts([terms(Ellipsis)]), 0.95)
    assert ((lo <= truth) & (truth <= hi))[vary].mean() >= 0.94



@pytest.mark.parametrize("ns, gain, loss, copies", [
    ((50, 200), 0.03, 0.01, 1), ((50, 200), (0.15, 0.0), (0.0, 0.1), 1), ((50, 125, 200), 0.03, 0.01, 3), ((20,) * 7, 0.1, 0.02, 1)])
def test_avg_of_benches_one_seed_each_on_0_1_scores_covers_a_known_difference(ns, gain, loss, copies):
    """The compare table's Avg. (aggregate.paired_arms: the benches as equal-weight strata) of A − B, one seed each on
    0/1 scores (`copies`: B's seeds, alike on every item), simulated with known truth: bench b's B right on an item with
    p0_b (0.15 to 0.5), A turning a wrong item right with `gain`, a right one wrong with `loss` (per bench where a
    pair: the benches' differences of opposite sign); Δ = the mean over benches of (1 − p0_b)·gain − p0_b·loss. The
    stratified Tango score interval (analysis.variance.discordant_limits, the limits estimate gives each study, checked
    on a few) covers 0.98, 0.95, 0.96, 0.95 of 10,000 studies, where the crossed t covered 0.83, 0.94, 0.90, 0.94
    (20,000 studies a setting: docs/stages/analyze.md)."""
    from analysis.variance import discordant_limits, estimate

    rng, reps = np.random.default_rng(len(ns) * 100 + ns[0]), 10000
    p0s, gain, loss = np.linspace(0.15, 0.5, len(ns)), np.broadcast_to(gain, len(ns)), np.broadcast_to(loss, len(ns))
    pre = [(rng.random((reps, n)) < p0).astype(float) for n, p0 in zip(ns, p0s)]
    post = [np.where(b == 1, rng.random(b.shape) >= lost, rng.random(b.shape) < won).astype(float) for b, won, lost in zip(pre, gain, loss)]
    truth = np.mean((1 - p0s) * gain - p0s * loss)
    d = [a - b for a, b in zip(post, pre)]
    lo, hi = discordant_limits(d, 0.95)
    vary = np.any([x.any(-1) for x in d], axis=0)   # some item changed: else the exact bounds of the test above
    for i in np.flatnonzero(vary)[:3]:
        got = estimate([[Term("A", 1.0, a[i][:, None]), Term("B", -1.0, np.repeat(b[i][:, None], copies, -1))]
                        for a, b in zip(post, pre)], 0.95)
        assert (got.method, got.covers, got.lo, got.hi) == ("stratified Tango score", "items", lo[i], hi[i])
    assert ((lo <= truth) & (truth <= hi))[vary].mean() >= 0.94

# ---- the report's paths: per-item eval dirs written here ----

def _write(eval_dir: Path, bench: str, scores: dict[str, float], keys: dict | None = None) -> None:
    eval_dir.mkdir(parents=True, exist_ok=True)
    (eval_dir / f"{bench}.jsonl").write_text(
        "".join(json.dumps({"id": i, "metrics": {"em": float(v)}}) + "\n" for i, v in scores.items()))
    if keys is not None:
        (eval_dir / "meta.json").write_text(json.dumps({"identities": {bench: {"keys": keys}}}))


def _points(tmp_path: Path, cells: dict, keys: dict | None = None):
    """Points over (arm, seed, step) -> {id: score} for bench nq (meta.json identities from `keys[arm]`)."""
    from analysis.aggregate import Points
    from analysis.collect import COLUMNS

    rows, dirs = [], {}
    for (arm, seed, step), scores in cells.items():
        d = tmp_path / arm / f"seed{seed}" / f"step-{step:06d}"
        dirs[(arm, seed, step)] = d
        _write(d, "nq", scores, None if keys is None else {**keys[arm], "checkpoint.sha256": f"{arm}{seed}{step}"})
        rows.append({**{c: None for c in COLUMNS}, "arm": arm, "seed": seed, "step": step, "bench": "nq",
                     "metric": "em", "value": float(np.mean(list(scores.values()))), "n": len(scores)})
    table = pd.DataFrame(rows, columns=COLUMNS).astype({"seed": "int64", "step": "int64", "value": "float64"})
    return Points(table, dirs, ["nq"])


def _oracle_interval(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """A − B (items × seeds each) by hand: the item part s²(d)/n (df n − 1) plus each arm's seed part, the
    spread of its seed means over S (df S − 1; none for one column: the anchor), a t on Satterthwaite's df."""
    n = a.shape[0]
    d = a.mean(axis=1) - b.mean(axis=1)
    terms = [(d.var(ddof=1) / n, n - 1)] + [(y.mean(axis=0).var(ddof=1) / y.shape[1], y.shape[1] - 1)
                                            for y in (a, b) if y.shape[1] > 1]
    var = sum(v for v, _ in terms)
    df = var ** 2 / sum(v ** 2 / f for v, f in terms)
    half = student_t.isf(0.025, df) * np.sqrt(var)
    return d.mean() - half, d.mean() + half


def test_compare_is_the_crossed_model_and_lists_the_items_it_dropped(tmp_path):
    from analysis.aggregate import paired_arms, paired_vs_anchor
    from analysis.stats import stratified_tango_limits, tango_limits
    from analysis.tables import Column, compare_table, main_table

    rng = np.random.default_rng(3)
    ids = [f"q{i}" for i in range(40)]
    a = (rng.random((40, 3)) < np.linspace(0.2, 0.8, 3)).astype(float)   # three very different seeds
    b = (rng.random((40, 2)) < 0.4).astype(float)
    cells = {("A", s, 10): dict(zip(ids, a[:, s])) for s in range(3)}
    dropped = {"q3", "q17", "q39"}
    cells.update({("B", s, 10): {i: v for i, v in zip(ids, b[:, s]) if i not in dropped} for s in range(2)})
    anchor = (rng.random(40) < 0.3).astype(float)
    cells[("anchor", 0, 0)] = dict(zip(ids, anchor))
    points = _points(tmp_path, cells)
    vs = paired_vs_anchor(points, "A", "nq", "em")   # the greedy anchor: one column, no seed part
    assert (vs.result.lo, vs.result.hi) == pytest.approx(_oracle_interval(a, anchor[:, None]), abs=1e-9)
    assert (vs.result.covers, vs.result.n_seeds, vs.dropped) == ("items+seeds", "3", 0)
    base = points.interval("anchor", 0, "nq", "em")
    assert (base.covers, base.note) == ("items", "")
    caption = main_table(points, ["A", "B"], [Column("nq", "em", "nq", "QA")], "em").caption
    assert caption.endswith("n: nq: anchor 40 items, A 40×3 items+seeds, B 37×2 items+seeds)")
    got = paired_arms(points, "A", "B", 10, "nq", "em")
    keep = [k for k, i in enumerate(ids) if i not in dropped]
    lo, hi = _oracle_interval(a[keep], b[keep])
    assert (got.result.lo, got.result.hi) == pytest.approx((lo, hi), abs=1e-9)
    assert (got.result.covers, got.result.n_items, got.result.n_seeds) == ("items+seeds", 37, "3/2")
    assert got.dropped_ids == sorted(dropped)
    table = compare_table(points, "A", "B", [Column("nq", "em", "nq", "QA")], "em")
    assert table.rows[0][1][0].endswith("n=37×3/2 items+seeds (3 dropped)")
    assert table.rows[0][0] == "10 (A: seeds 0, 1, 2; B: seeds 0, 1)"   # each arm's own (was "10 (seeds 0, 1, 2)")
    assert table.rows[-1] == ("items not in both", ["3 dropped: q17, q3, q39"])
    # one seed each on 0/1 EM: Tango's score interval from the items A gained and lost, named in the cell (before: the
    # crossed t, which covered 0.87 at 95% with few changed items)
    one_seed = _points(tmp_path / "one", {("A", 0, 10): dict(zip(ids, a[:, 0])), ("B", 0, 10): dict(zip(ids, b[:, 0]))})
    one, d = paired_arms(one_seed, "A", "B", 10, "nq", "em"), a[:, 0] - b[:, 0]
    assert one.result.covers == "items" and "seed variance unknown" in one.result.note and one.result.method == "Tango score"
    assert (one.result.lo, one.result.hi) == pytest.approx(np.ravel(tango_limits((d > 0).sum(), (d < 0).sum(), 40)))
    one_table = compare_table(one_seed, "A", "B", [Column("nq", "em", "nq", "QA")], "em")
    assert one_table.rows[0][1][0].endswith("items, Tango score") and one_table.rows[0][0] == "10 (seed 0)"   # both arms'
    # B's 2 seeds agree on every item (greedy evaluations that ignore the seed): one seed for the interval, the same Tango
    # interval, and the note says why (before: the crossed t with its seed part 0, which covered 0.87–0.91)
    alike = _points(tmp_path / "alike", {("A", 0, 10): dict(zip(ids, a[:, 0])), **{("B", s, 10): dict(zip(ids, b[:, 0])) for s in (0, 1)}})
    two = paired_arms(alike, "A", "B", 10, "nq", "em").result
    assert (two.method, two.covers, two.n_seeds, two.lo, two.hi) == ("Tango score", "items", "1/2", one.result.lo, one.result.hi)
    assert two.note == "seed variance unknown (one seed); B's 2 seeds agree on every item: one seed for the interval"
    # the Avg. of nq and hotpotqa (equal-weight strata), one seed each: the stratified Tango score interval, named in the
    # cell and the caption (before: the crossed t, "always the t", which covered 0.82–0.94 with few changed items)
    avg = _points(tmp_path / "avg", {("A", 0, 10): dict(zip(ids, a[:, 0])), ("B", 0, 10): dict(zip(ids, b[:, 0]))})
    for arm, col in (("A", a[:30, 1]), ("B", b[:30, 1])):
        _write(avg.eval_dirs[(arm, 0, 10)], "hotpotqa", dict(zip(ids[:30], col)))
    avg.qa, avg.table = ["nq", "hotpotqa"], pd.concat([avg.table, avg.table.assign(bench="avg")])
    got, d2 = paired_arms(avg, "A", "B", 10, "avg", "em").result, a[:30, 1] - b[:30, 1]
    want = stratified_tango_limits([[(d > 0).sum(), (d2 > 0).sum()]], [[(d < 0).sum(), (d2 < 0).sum()]], [40, 30], [0.5, 0.5])
    assert (got.method, got.covers, got.n_items, got.mean) == ("stratified Tango score", "items", 70, pytest.approx((d.mean() + d2.mean()) / 2))
    assert (got.lo, got.hi) == pytest.approx(np.ravel(want))
    table = compare_table(avg, "A", "B", [Column("avg", "em", "Avg.", "QA")], "em")
    assert table.rows[0][1][0].endswith("n=70×1/1 items, stratified Tango score") and "stratified Tango score = " in table.caption


def test_compare_refuses_arms_evaluated_under_different_settings(tmp_path, capsys):
    from analysis.sweep import check_compare_settings
    from launch.analyze import main as analyze_main

    ids = {f"q{i}": float(i % 2) for i in range(6)}
    cells = {(arm, 0, 10): ids for arm in ("r2e", "r2e_v5")}
    keys = {"r2e": {"evaluate.max_turns": 4, "bench.n": 6}, "r2e_v5": {"evaluate.max_turns": 8, "bench.n": 6}}
    points = _points(tmp_path / "p", cells, keys)
    with pytest.raises(Exception, match=r"evaluate\.max_turns: 4 -> 8.*compare_allow_settings=true"):
        check_compare_settings(points, [("r2e", "r2e_v5")], ["nq"], allow=False)
    note = check_compare_settings(points, [("r2e", "r2e_v5")], ["nq"], allow=True)
    assert "evaluate.max_turns: 4 -> 8" in note[("r2e", "r2e_v5")]
    same = _points(tmp_path / "s", cells, {"r2e": keys["r2e"], "r2e_v5": keys["r2e"]})
    assert check_compare_settings(same, [("r2e", "r2e_v5")], ["nq"], allow=False) == {("r2e", "r2e_v5"): ""}
    # the command line: exit 2, one line naming the key, before any figure is drawn
    root = tmp_path / "runs"
    for arm in ("r2e", "r2e_v5"):
        run = root / arm / "seed0"
        (run / "checkpoints" / "step-000010").mkdir(parents=True)
        (run / "checkpoints" / "step-000010" / "config.json").write_text("{}")
        (run / "config.yaml").write_text("arm: x\nseed: 0\ntrain:\n  steps: 10\n  save_steps: [10]\n")
        _write(run / "eval" / "step-000010", "nq", ids, {**keys[arm], "checkpoint.sha256": arm})
        (run / "eval" / "step-000010" / "summary.json").write_text(json.dumps({"nq": {"em": 0.5, "n": 6}}))
    rc = analyze_main([f"runs_root={root}", f"out={tmp_path / 'out'}", "benches=[nq]", "evaluate=false",
                       "compare=[[r2e,r2e_v5]]"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "evaluate.max_turns" in err[0] and "compare_allow_settings" in err[0]
    assert not (tmp_path / "out" / "figures").exists()



def test_paired_vs_anchor_refuses_an_anchor_evaluated_under_other_settings(tmp_path):
    """The paired table's arm − anchor over an anchor evaluated under other settings than the arm (here another
    max_new_tokens): a gap naming the key, as the pre/post table's (before: +0.500 with a CI, no word of it); the
    checkpoint and the anchor's prompt differ by design, and another n only changes which ids both have."""
    from analysis.aggregate import Paired, paired_vs_anchor
    from analysis.tables import Column, paired_table

    arm, anchor = {f"q{i}": float(i % 2) for i in range(6)}, {f"q{i}": 0.0 for i in range(6)}
    cells = {("r2e", 0, 10): arm, ("anchor", 0, 0): anchor}
    keys = {"r2e": {"evaluate.max_new_tokens": 512, "evaluate.prompt": "tool_agent", "bench.n": 6},
            "anchor": {"evaluate.max_new_tokens": 64, "evaluate.prompt": "anchor_nudge", "bench.n": 6}}
    p = _points(tmp_path / "p", cells, keys)
    why = "the anchor was evaluated under other settings (evaluate.max_new_tokens: 64 -> 512): not paired"
    assert paired_vs_anchor(p, "r2e", "nq", "em") == why
    assert paired_table(p, ["r2e"], [Column("nq", "em", "nq", "QA")], "em").rows == [("r2e", [f"– ({why})"])]
    same = _points(tmp_path / "s", cells, {**keys, "anchor": {**keys["anchor"], "evaluate.max_new_tokens": 512, "bench.n": 500}})
    assert isinstance(paired_vs_anchor(same, "r2e", "nq", "em"), Paired)   # another n: the shared ids are paired


def test_evaluations_under_different_settings_in_one_column_are_a_listed_problem(tmp_path):
    """One seed of an arm evaluated under another max_new_tokens than every other point of the column (by hand, then
    analyze evaluate=false): a problem naming the key, each value and where (before: pooled into one mean without a
    word); the checkpoint and the anchor's prompt differ by design."""
    from analysis.aggregate import mixed_settings

    ids = {f"q{i}": float(i % 2) for i in range(6)}
    cells = {("r2e", 0, 10): ids, ("r2e", 1, 10): ids, ("search", 0, 10): ids, ("anchor", 0, 0): ids}
    keys = {arm: {"evaluate.max_new_tokens": 512, "evaluate.prompt": "tool_agent", "bench.n": 6} for arm in ("r2e", "search")}
    keys["anchor"] = {**keys["r2e"], "evaluate.prompt": "anchor_nudge"}
    p = _points(tmp_path / "p", cells, keys)
    assert mixed_settings(p, ["nq"]) == []
    _write(p.eval_dirs[("r2e", 1, 10)], "nq", ids, {**keys["r2e"], "evaluate.max_new_tokens": 1024, "checkpoint.sha256": "x"})
    assert mixed_settings(p, ["nq"]) == [
        "nq: its evaluations differ in settings (evaluate.max_new_tokens: 512 at anchor and 2 more, 1024 at "
        "r2e/seed1/step-000010): the report's numbers of nq mix them (evaluate=true re-evaluates every point under one)"]

def test_points_of_one_column_evaluated_with_different_prompts_are_a_listed_problem(tmp_path):
    """Two seeds of an arm evaluated with different prompts (neither the anchor's): a problem naming evaluate.prompt,
    as any other setting (before: left out of the comparison for every point, so pooled without a word); the anchor's
    own prompt (anchor_nudge) still differs by design and is not a problem."""
    from analysis.aggregate import mixed_settings

    ids = {f"q{i}": float(i % 2) for i in range(6)}
    cells = {("r2e", 0, 10): ids, ("r2e", 1, 10): ids, ("anchor", 0, 0): ids}
    keys = {"r2e": {"evaluate.max_new_tokens": 512, "evaluate.prompt": "tool_agent", "bench.n": 6}}
    keys["anchor"] = {**keys["r2e"], "evaluate.prompt": "anchor_nudge"}
    p = _points(tmp_path / "p", cells, keys)
    assert mixed_settings(p, ["nq"]) == []
    _write(p.eval_dirs[("r2e", 1, 10)], "nq", ids, {**keys["r2e"], "evaluate.prompt": "anchor_nudge", "checkpoint.sha256": "x"})
    assert mixed_settings(p, ["nq"]) == [
        "nq: its evaluations differ in settings (evaluate.prompt: tool_agent at r2e/seed0/step-000010, anchor_nudge at "
        "r2e/seed1/step-000010): the report's numbers of nq mix them (evaluate=true re-evaluates every point under one)"]


def test_one_item_one_seed_band_is_a_labelled_gap(tmp_path):
    """A one-seed run of a one-item bench at 2 steps: no band (no item variance), a gap the caption names."""
    from analysis.figures import Panel, plot_curves

    points = _points(tmp_path, {("A", 0, 10): {"q0": 0.0}, ("A", 0, 20): {"q0": 1.0}})
    assert points.simultaneous("A", "nq", "em", [10, 20]) is None
    assert points.band_gaps[("A", "nq", "em")] == "one item: no item variance"
    assert points.interval("A", 20, "nq", "em").covers == "none"
    info = plot_curves(points, [Panel("nq", "em", "nq", "EM")], ["A"], {"A": [10, 20]}, tmp_path / "fig")
    assert "No simultaneous band: A, nq: one item: no item variance." in info.caption


@pytest.mark.parametrize("arm, anchor, bounds, method", [
    (np.zeros((50, 1)), np.zeros((50, 1)), (-1, 1), "exact discordant"),      # 0 vs 0: |Δ| <= u
    (np.ones((10, 1)), np.zeros((10, 1)), (1, None), "exact discordant"),     # all right vs all wrong: [1 - 2u, 1]
    (np.zeros((10, 1)), np.ones((10, 1)), (None, -1), "exact discordant"),    # (before: [0.69, 1.31], "no item differs")
    (np.tile([[1.0, 0.0], [0.0, 1.0]], (5, 1)), np.zeros((10, 1)), None, "point"),   # every item 0.5 up: no variance
    (np.full((10, 1), 0.7), np.full((10, 1), 0.2), None, "point"),            # F1 0.5 up on every item: no zero width
])
def test_a_contrast_whose_items_all_differ_alike_is_not_a_zero_width_or_impossible_interval(arm, anchor, bounds, method):
    """Every item differs by the same amount (0 vs 0, a failing base against an arm that learnt nothing, or
    1 vs 0 on every item): no variance. A 0/1 contrast with no item departing from c in {0, ±1} gets the exact
    limit u of a rate with 0 events in n (scipy's beta quantile), inside [-1, 1]; anything else a labelled
    point, never a zero-width interval."""
    from scipy.stats import beta

    from analysis.variance import estimate

    got = estimate([[Term("A", 1.0, arm), Term("anchor", -1.0, anchor, random_seeds=False)]], 0.95)
    assert (got.mean, got.method) == (pytest.approx((arm.mean(1) - anchor[:, 0]).mean()), method)
    if bounds is None:
        assert np.isnan([got.lo, got.hi]).all() and got.covers == "none" and "no variance" in got.note
        return
    u = beta.ppf(0.975, 1, len(arm))
    want = {(-1, 1): (-u, u), (1, None): (1 - 2 * u, 1.0), (None, -1): (-1.0, -1 + 2 * u)}[bounds]
    assert (got.lo, got.hi) == pytest.approx(want) and got.covers == "items" and "seed variance unknown" in got.note


def test_analyze_on_a_one_item_one_seed_run_writes_its_report_with_the_gap(tmp_path, capsys):
    """The whole command on a one-seed run of a one-item bench at 2 steps, evaluate=false: exit 0, the report
    written, its caption naming the missing band (before: a ValueError from the band, exit 1, no report)."""
    from test_analysis_helpers import make_run, write_eval

    from launch.analyze import main

    root = tmp_path / "runs"
    make_run(root, "r2e", 0, [10, 20])
    for step, value in ((10, 0.0), (20, 1.0)):
        write_eval(root / "r2e" / "seed0" / "eval" / f"step-{step:06d}", {"nq": value}, n=1)
    write_eval(root / "_anchor" / "eval" / "step-000000", {"nq": 0.0}, n=1)
    assert main([f"runs_root={root}", f"out={tmp_path / 'x'}", "evaluate=false", "benches=[nq,hotpotqa]"]) == 2   # no hotpotqa
    assert "benches: hotpotqa has no evaluation" in capsys.readouterr().err and not (tmp_path / "x").exists()
    assert main([f"runs_root={root}", f"out={tmp_path / 'o'}", "evaluate=false", "benches=[nq]", "metrics=[em]"]) == 0
    assert "No simultaneous band: r2e, nq: one item: no item variance." in (tmp_path / "o" / "report.md").read_text()
