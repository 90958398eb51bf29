"""The stage map of DESIGN.md as an import graph: common -> data_prep -> sft/envs -> evals -> rl ->
analysis -> launch, read from the source with `ast` (every import, also those inside functions; the reader is
tools/import_graph.py, which tools/pipeline_diagram.py draws docs/pipeline.md from).

- a stage imports only stages of a lower level (sft and envs are one level: neither imports the
  other); rl may use evals' public API only (`evals.toolcalls`, `evals.metrics`, `evals.extract`,
  `evals.retrievers`); nothing but launch imports analysis;
- launch is the top floor, above every stage (it starts SFT and GRPO in-process: launch.run.launch_one
  over its table of trainers; it plans, runs and submits the evaluations of `analyze`, whose report
  analysis writes): no module of another stage imports launch.
- no import cycle between modules;
- the drivers: `demo/` may import any stage and nothing imports it; `bench/` imports library code
  only, never the tests.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from import_graph import DRIVERS, LEVELS, RL_MAY_USE, import_graph  # noqa: E402  (the reader, shared with tools/pipeline_diagram.py)


def violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for mod, deps in sorted(graph.items()):
        src = mod.split(".")[0]
        for dep in sorted(deps):
            dst = dep.split(".")[0]
            if src == dst:
                continue
            if dst == "tests":
                bad.append(f"{mod} imports {dep}: library code and benches never import the tests")
            elif dst == "demo" and src != "tests":
                bad.append(f"{mod} imports {dep}: the demo is a driver, nothing imports it")
            elif dst == "bench" and src != "tests":
                bad.append(f"{mod} imports {dep}: nothing imports the benches")
            elif src in LEVELS and dst in LEVELS:
                if src == "rl" and dst == "evals":
                    if not dep.startswith(RL_MAY_USE):
                        bad.append(f"{mod} imports {dep}: rl uses evals' public API only ({', '.join(RL_MAY_USE)})")
                elif LEVELS[dst] >= LEVELS[src]:
                    bad.append(f"{mod} imports {dep}: {src} (level {LEVELS[src]}) may import only lower stages, "
                               f"not {dst} (level {LEVELS[dst]})")
    return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_stages_form_the_documented_dag():
    graph = import_graph(ROOT)
    assert {"common.cli", "sft.train", "launch.cli", "evals.run", "analysis.sweep", "demo.run"} <= set(graph)
    found = violations(graph)
    assert found == []


def test_launch_is_above_every_stage():
    graph = import_graph(ROOT)
    assert {"launch.run", "launch.grpo", "rl.config", "rl.train", "launch.analyze", "analysis.sweep"} <= set(graph)
    below = ("common", "data_prep", "sft", "envs", "evals", "rl", "analysis")
    assert all(LEVELS["launch"] > LEVELS[stage] for stage in below) and max(LEVELS, key=LEVELS.get) == "launch"
    assert sorted(f"{m} imports {d}" for m, deps in graph.items() if m.split(".")[0] in below
                  for d in deps if d.split(".")[0] == "launch") == []
    assert "rl.config" in graph["launch.compose"] and "launch.run" in graph["launch.grpo"]   # launch starts GRPO itself


def test_only_launch_imports_analysis():
    """analysis only reads eval dirs and writes reports: launch (the `analyze` command: launch.analyze plans and
    runs the evaluations, then calls analysis' report writer) is the one stage above it that imports it."""
    graph = import_graph(ROOT)
    assert "analysis.sweep" in graph["launch.analyze"]
    importers = {m.split(".")[0] for m, deps in graph.items() if any(d.split(".")[0] == "analysis" for d in deps)}
    assert importers - {"analysis"} <= {"launch", *DRIVERS, "tests"}
    # the evaluation jobs are launch's: analysis holds no planning, submission or requeue of them
    assert not {"analysis.evaluation", "analysis.slurm", "analysis.slurm_jobs", "analysis.cli"} & set(graph)


def test_no_import_cycles():
    assert cycles(import_graph(ROOT)) == []


def test_the_checks_catch_what_they_guard():
    """The checker itself on a hand-made graph: each kind of violation is reported."""
    graph = {
        "evals.retrievers": {"evals.server"}, "evals.server": {"evals.retrievers"},   # a cycle
        "bench.bench_train": {"tests.sft_helpers", "sft.train"},                      # a bench importing tests
        "sft.model": {"data_prep.tiny", "launch.compose"},                            # a later stage
        "evals.run": {"analysis.discover"},                                           # importing analysis
        "rl.train": {"evals.metrics", "evals.run"},                                   # outside evals' public API
        "analysis.sweep": {"demo.run"},                                               # importing the driver
        "demo.run": {"analysis.sweep", "launch.cli"},                                 # allowed
    }
    bad = violations(graph)
    assert [b.split(" imports ")[:1] + [b.split(" imports ")[1].split(":")[0]] for b in bad] == [
        ["analysis.sweep", "demo.run"], ["bench.bench_train", "tests.sft_helpers"],
        ["evals.run", "analysis.discover"], ["rl.train", "evals.run"], ["sft.model", "launch.compose"]]
    assert cycles(graph) == [["analysis.sweep", "demo.run"], ["evals.retrievers", "evals.server"]]
