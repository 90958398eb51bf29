"""The format-vs-capability decomposition on constructed eval dirs whose answer is known."""
import json
import math

import pytest
from test_analysis_helpers import make_run

from analysis.behaviour import bench_behaviour, decompose
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
    res = run_analysis({"runs_root": str(root), "out": str(out), "benches": ["nq"], "evaluate": False, "n_boot": 50,
                        "metrics": ["em"]})
    table = res.tables["decomposition"]
    (label, cells), = table.rows
    assert label == "r2e/seed0 @20 (pre: anchor)"
    assert cells[:2] == ["nq (open)", "armfp00002"] and cells[9:13] == ["+0.200", "+0.200", "+0.000", "+0.000"]
    assert any(f.paths[0].stem == "decomposition" for f in res.figures)
    report = (out / "report.md").read_text()
    assert "### decomposition" in report and "![decomposition](figures/decomposition.png)" in report
    assert "Δp·EM₀|ok" in report and "### behaviour_stages" in report and "final_answer 80, none 20" in report
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
                        "n_boot": 50, "metrics": ["em"]})
    assert res.tables["decomposition"].rows == []
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
                        "evaluate": False, "n_boot": 50, "metrics": ["em"]})
    rows = res.tables["decomposition"].rows
    assert [label for label, _ in rows] == ["r2e/seed0 @20 (pre: anchor)", "r2e/seed0 @20 (pre: step 10)"]
    assert rows[0][1][10].startswith("– (the pre evaluation has no well-formed")
    assert rows[1][1][7:13] == ["0.500→0.600", "0.200→0.600", "+0.260", "+0.020", "+0.240", "+0.000"]
    assert [label for label, _ in res.tables["behaviour_stages"].rows] == ["anchor", "r2e/seed0 @20"]
    points = (tmp_path / "rep" / "tables" / "decomposition_points.csv").read_text().splitlines()
    assert len(points) == 1 + 3 + 1   # every step against the anchor, and step 20 against step 10
    figure = next(f for f in res.figures if f.paths[0].stem == "decomposition")
    assert list(figure.series.values()) == [["r2e\n(from step 10)"]]   # only the defined split is drawn
