"""Issue 65 item 7: console output reads like a report.

Every column heading and short name the printers emit (evaluate's console table, the tables of report.md) is
defined in docs/glossary.md's "Columns" table: the headings are collected by running the printers on
synthetic results, never by reading prose. The console table says what its abbreviations mean under it, and
launch prints the recipes it composed as `key=value`, never as a Python dict.
"""
from __future__ import annotations

import re
import string
from pathlib import Path

import numpy

from evals.registry import KINDS, headline_metrics
from test_analysis_helpers import make_run

ROOT = Path(__file__).resolve().parents[1]
BENCH_NAMES = ("nq", "bamboogle", *KINDS)   # every bench the registry names: a new one is checked too
MODES = ("open", "item", "given")


def glossary_columns() -> set[str]:
    text = (ROOT / "docs" / "glossary.md").read_text(encoding="utf-8")
    section = text.split("## Columns the console and the report print", 1)[1]
    names: set[str] = set()
    for line in section.splitlines():
        m = re.match(r"^\| (`.+?`) \|", line.replace("\\|", "\x00"))
        if m:
            names.update(n.replace("\x00", "|") for n in re.findall(r"`([^`]+)`", m.group(1)))
    return names


def normalise(heading: str) -> str:
    """A heading with a bench's name or a context mode in it, as the glossary writes it."""
    heading = heading.strip()
    for b in BENCH_NAMES:
        if heading.startswith(b + " ("):
            heading = "<bench>" + heading[len(b):]
    for m in MODES:
        heading = heading.replace(f"({m})", "(<context mode>)")
    if heading in {f"<bench> ({m})" for m in headline_metrics().values()}:
        heading = "<bench> (<headline metric>)"
    return re.sub(r"^reward_\w+$", "reward_<component>", heading)


def console_names(text: str) -> set[str]:
    """The console table's headings (first line), row labels that are no bench, and the `name=` of each row."""
    lines = text.splitlines()
    names = set(lines[0].split())
    for line in lines[1:]:
        if line.startswith("7-bench mean"):
            names.add("7-bench mean")
        names.update(re.findall(r"([\w/]+)=", line))
    return names


def test_evaluate_console_table_has_a_legend_and_every_column_in_the_glossary():
    from evals.run import format_table

    from evals.benches import SEARCH7

    qa = {"em": 0.5, "f1": 0.6, "cover_em": 0.7, "strict_em": 0.4, "format_failure_rate": 0.1, "n": 10}
    summary = {b: dict(qa) for b in SEARCH7}
    for bench, kind in KINDS.items():   # each registered kind's console line, over the fields it names
        if kind.console:
            summary[bench] = {"n": 4, **{f: 1 for _, f, _, _ in string.Formatter().parse(kind.console) if f}}
    text = format_table(summary)
    legend = text.splitlines()[-1]
    for abbrev in ("coverEM", "strictEM", "fmtfail"):
        assert abbrev in legend
    rows = {line.split()[0]: " ".join(line.split()[1:]) for line in text.splitlines()}
    assert rows["babyai"] == "4 return=1.000 success=1.000 invalid=1.000 steps=1.0"
    assert rows["tf_code"] == "4 loss/token=1.0000 over 1 tokens" and rows["nq"] == "10 50.0 60.0 70.0 40.0 10.0"
    assert rows["search_plan_ood"] == "4 reward=1.000 reward_outcome=1.000 reward_grounding=1.000 reward_stop=1.000"
    names = {normalise(n) for n in console_names(text.rsplit("\n", 1)[0])}
    assert names >= {"coverEM", "strictEM", "fmtfail", "return", "loss/token", "reward_<component>", "7-bench mean"}
    missing = sorted(names - glossary_columns())
    assert not missing, f"console names docs/glossary.md does not define: {missing}"
    # a table of 0-1 rewards only: no per-cent QA columns in its header or its legend, each shown name explained
    text = format_table({b: summary[b] for b in ("babyai", "search_plan_ood")})
    head, legend = text.splitlines()[0], text.splitlines()[-1]
    assert head.split() == ["bench", "n"] and "per cent" not in legend and "EM" not in legend
    assert all(f"{name}:" in legend for name in ("return", "success", "invalid", "steps", "reward")), legend
    assert "per cent of items" in format_table({"nq": qa, "tf_code": summary["tf_code"]}).splitlines()[-1]


def test_grpo_progress_names_are_in_the_glossary(capsys):
    from rl.train import Progress

    progress = Progress(total=2, main=True, group=2)
    progress.step_begins()
    progress.round_begins()
    progress.generated(0.5, 40)
    rewards = [1.0, 0.0, 0.5, 0.5]
    progress.env_s, progress.rewards = 0.25, list(rewards)
    progress.round_ends(0)
    progress.step_line(1, {"loss": 0.01, "grad_norm": 0.5, "lr": 1e-5, "reward": 0.5}, progress.step_ends())
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["[grpo] round 1 (step 1/2)", "[grpo] step 1/2"]
    # the sample standard deviation, as TRL's reward_std in metrics.jsonl for the same round (numpy's ddof=1)
    assert f"reward_mean=0.500 reward_std={numpy.std(rewards, ddof=1):.3f}" in lines[0] and "tokens=40 tokens/s=80.0" in lines[0]
    assert progress.learnable_groups() == 1   # [1, 0] differ, [0.5, 0.5] do not
    # a round whose every group got equal rewards (a policy that never calls a tool): zero advantages, said so
    progress.round_begins()
    progress.rewards = [0.0, 0.0, 0.25, 0.25]
    progress.round_ends(0)
    flat = capsys.readouterr().out.splitlines()
    assert len(flat) == 2 and "every prompt's 2 completions got the same reward, so every advantage is 0" in flat[1], flat
    names = {n for line in lines for n in re.findall(r"([\w/]+)=", line)} | {"round", "step"}
    missing = sorted(names - glossary_columns())
    assert not missing, f"GRPO progress names docs/glossary.md does not define: {missing}"


def test_every_report_column_is_in_the_glossary(tmp_path, fast_figures):
    from launch.analyze import run_analysis

    values = {"nq": 0.3, "bamboogle": 0.2, "search_plan_ood": 0.5}
    for arm, gain in (("r2e", 0.1), ("search", 0.4)):
        make_run(tmp_path / "runs", arm, 0, [0, 10], evaluated={0: values, 10: {b: v + gain for b, v in values.items()}})
    run_analysis({"runs_root": str(tmp_path / "runs"), "out": str(tmp_path / "out"), "evaluate": False})
    lines = (tmp_path / "out" / "report.md").read_text(encoding="utf-8").splitlines()
    headings = set()
    for head, rule in zip(lines, lines[1:]):
        if head.startswith("|") and re.fullmatch(r"\|(-+\|)+", rule.replace(" ", "").replace(":", "")):
            # cells split at " | ": a heading such as `EM|ok` holds a bare `|` (analysis.tables does not escape it)
            headings.update(normalise(c) for c in head.strip("| ").split(" | "))
    headings.discard("")
    assert {"Method", "well-formed", "ΔEM", "provenance", "<bench> (<context mode>)"} <= headings
    missing = sorted(headings - glossary_columns())
    assert not missing, f"report.md headings docs/glossary.md does not define: {missing}"


def test_launch_prints_its_recipes_as_key_value(tmp_path, monkeypatch):
    from launch import grpo, run

    from launch.compose import compose, compose_grpo

    monkeypatch.chdir(tmp_path)
    composed = compose(["arm=search", "model=tiny", "data=synthetic"])   # as SFT.resolve composes it, data not built
    sft = run.SFT.describe(run.Prepared(**vars(composed), run_dir=tmp_path / "r", nproc=1)).splitlines()[0]
    composed = compose_grpo(["stage=grpo", "task=spa", "model=tiny_base"])
    rl = grpo.GRPO.describe(run.Prepared(**vars(composed), run_dir=tmp_path / "g", nproc=1)).splitlines()[0]
    assert sft.startswith("[launch] arm=search model=tiny data=synthetic launcher=local -> "), sft
    assert rl.startswith("[launch] stage=grpo task=spa model=tiny_base launcher=local -> "), rl
