"""The bench registry (evals.registry) is the only place a bench name decides anything: a kind registered
there, and nowhere else, is honoured by the evaluation identity, analysis's tables and pre/post metrics, and
report.html (which metric is right, which scores are listed, a game's transcript)."""
from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from evals import registry

TOY = "toy_maze"


@pytest.fixture
def toy(monkeypatch):
    """A toy environment bench, registered in the registry alone: its own `toy_` keys, sampled above
    toy_temperature 0, scored by `score` (parts `a`, `b`), right when `solved`, its rows games, `score` its own metric."""
    kind = dataclasses.replace(registry.BABYAI, name=TOY, key_prefix="toy_", metrics={"score": registry.RATE},
                               sampled=lambda conf: float(conf.get("toy_temperature") or 0) > 0,
                               headline="score", components=("a", "b"), correct="solved", shown=("score", "solved"),
                               game=True, meta=None)
    monkeypatch.setitem(registry.KINDS, TOY, kind)
    return kind


def test_identity_takes_a_kinds_own_keys_and_sampler_from_the_registry(toy, tmp_path):
    from evals.config import resolve
    from evals.identity import bench_identity

    source = tmp_path / "b.jsonl"
    source.write_text("{}\n")
    cfg = dict(resolve({"ckpt": str(tmp_path), "benches": ["search_plan_ood"], "out": str(tmp_path / "o")}))

    def _identity(tmp_path, bench, **keys):
        return bench_identity(bench, {**cfg, **keys}, {"kind": "files", "digest": "x"}, n=2, seed=1, source=str(source))

    base = _identity(tmp_path, "search_plan_ood")
    # the toy's own keys enter no other bench's identity, and its own
    assert _identity(tmp_path, "search_plan_ood", toy_level=3)["fingerprint"] == base["fingerprint"]
    assert _identity(tmp_path, TOY, toy_level=3)["fingerprint"] != _identity(tmp_path, TOY)["fingerprint"]
    # the babyai keys are no longer the toy's: they stay out of its identity
    assert _identity(tmp_path, TOY, babyai_max_steps=3)["fingerprint"] == _identity(tmp_path, TOY)["fingerprint"]
    # sampled rows are the backend's
    assert "sampler" in _identity(tmp_path, TOY, toy_temperature=1.0)["keys"]
    assert "sampler" not in _identity(tmp_path, TOY, toy_temperature=0)["keys"]
    assert "sampler" not in _identity(tmp_path, "babyai", toy_temperature=1.0, babyai_temperature=0)["keys"]
    # a rule change of one kind (its `semantics`) refuses that kind's rows only, not every bench's
    from evals.identity import EVAL_SEMANTICS
    assert base["keys"]["eval_semantics"] == EVAL_SEMANTICS == 2
    assert _identity(tmp_path, "babyai")["keys"]["eval_semantics"] == f"{EVAL_SEMANTICS}.{registry.BABYAI.semantics}" == "2.1"


def test_analysis_scores_a_registered_environment_by_its_headline(toy):
    from analysis.collect import env_benches, qa_benches
    from analysis.prepost import bench_metrics
    from analysis.sweep import component_panels
    from analysis.tables import agentic_benches, table_columns

    table = pd.DataFrame({"arm": "a", "seed": 0, "step": 0, "bench": ["nq", "nq", TOY, TOY, TOY, TOY],
                          "metric": ["em", "f1", "score", "score_a", "b", "solved"], "value": 0.5, "n": 4})
    assert TOY in env_benches() and qa_benches(table) == ["nq"]
    assert registry.metric_problem("score", 0.5) is None and registry.metric_problem("score", 2) == "out of range (a rate in [0, 1])"
    assert agentic_benches(table.bench) == [TOY]
    assert [(c.bench, c.metric, c.group) for c in table_columns(["nq"], False, [TOY], "em")] == [
        ("nq", "em", "General QA"), (TOY, "score", "Agentic")]
    assert bench_metrics(TOY) == ("score",) and bench_metrics("nq") == ("em", "f1")
    assert [(p.bench, p.metric, p.title) for p in component_panels(table, TOY)] == [
        (TOY, "score_a", "a"), (TOY, "b", "b"), (TOY, "score", "total score")]


def test_report_html_reads_a_kinds_rendering_from_the_registry(toy):
    from report_html_rows import babyai_row

    from analysis.html import correct_metric, list_item, score_metrics, transcript

    assert correct_metric(TOY) == "solved" and score_metrics(TOY) == ["score", "solved"]
    row = {k: v for k, v in babyai_row("r", 10, 2).items() if k != "transcript"}   # a game with no steps kept
    row["metrics"] = {"score": 1.0, "solved": 1.0}
    item = list_item(TOY, row, 0)
    assert item["ok"] == 1 and item["calls"] == 0
    game = transcript(TOY, {**row, "transcript": babyai_row("r", 10, 2)["transcript"], "messages": []})
    assert game["answer"] == "turn left go forward" and [m["role"] for m in game["messages"]][-1] == "env"
    # the registry's own kinds, as before
    assert correct_metric("babyai") == "success" and correct_metric("nq") == "em"
    assert score_metrics("search_plan_ood") == ["reward", "reward_outcome", "reward_grounding", "reward_stop"]


def test_evaluate_takes_a_registered_kind_as_an_environment(toy, tmp_path):
    from evals.config import resolve
    from evals.registry import bench_name_problem, uses_retriever
    from evals.errors import EvalError

    cfg = resolve({"ckpt": str(tmp_path), "benches": [TOY], "out": str(tmp_path / "o")})   # no bench file asked for
    assert list(cfg.benches) == [TOY] and not uses_retriever(TOY) and bench_name_problem(TOY, None) is None
    with pytest.raises(EvalError, match="brings its own environment"):
        resolve({"ckpt": str(tmp_path), "benches": [f"{TOY}@given"], "out": str(tmp_path / "o")})
