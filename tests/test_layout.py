"""The run-dir contract (DESIGN.md "Run directory") is spelled out only in common/layout.py: no other
module of the stages, the demo or the benches writes one of its names as a literal (a marker, a
file name, a sub-directory joined onto a path, the `step-NNNNNN` pattern). The tests themselves may:
they check the layout against DESIGN.md's own spelling."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from common import layout

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("common", "data_prep", "sft", "launch", "envs", "evals", "rl", "analysis", "demo", "bench")
NAMES = {"DONE", "COMPLETE", "metrics.jsonl", "config.yaml"}          # never anything else
PATH_PARTS = {"checkpoints", "state", "eval", "rollouts", "adapter"}   # joined onto a path
# `step-` as a name pattern: the end of an f-string piece (`f"step-{n:06d}"`), a regex or a glob
STEP_PATTERN = re.compile(r"step-(?:$|[{(\\*\[])")


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                ids.add(id(first.value))
    return ids


def literal_uses(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            left = node.left
            if isinstance(left, ast.BinOp) and isinstance(left.right, ast.Constant) and left.right.value == "recipes":
                continue   # recipes/eval/ holds the evaluation profiles, not a run's evaluations
            for side in (node.left, node.right):
                if isinstance(side, ast.Constant) and side.value in PATH_PARTS:
                    found.append(f"{path.relative_to(ROOT)}:{side.lineno}: path part {side.value!r}")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if node.value in NAMES:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
            elif STEP_PATTERN.search(node.value):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: step pattern {node.value!r}")
    return found


def test_the_run_dir_names_are_written_once():
    files = [p for pkg in PACKAGES if (ROOT / pkg).is_dir() for p in sorted((ROOT / pkg).rglob("*.py"))]
    own = ROOT / "common" / "layout.py"
    assert own in files
    assert literal_uses(own), "the checker finds the names in common/layout.py itself"
    hits = [h for p in files if p != own for h in literal_uses(p)]
    assert hits == []


def test_layout_matches_design_md():
    """DESIGN.md's own spelling (an oracle the code did not write)."""
    run = Path("/r")
    assert layout.checkpoint_dir(run, 218) == Path("/r/checkpoints/step-000218")
    assert layout.eval_dir(run, 50) == Path("/r/eval/step-000050")
    assert layout.eval_dir(run, 50, "rl_ood") == Path("/r/eval/rl_ood/step-000050")
    assert layout.states_dir(run) / layout.step_name(7) == Path("/r/state/step-000007")
    assert (layout.DONE, layout.COMPLETE, layout.CONFIG, layout.MANIFEST, layout.METRICS, layout.ROLLOUTS, layout.ADAPTER) == (
        "DONE", "COMPLETE", "config.yaml", "manifest.json", "metrics.jsonl", "rollouts", "adapter")
    assert layout.parse_step("step-000218") == 218 and layout.parse_step("step-x") is None
    assert layout.parse_step("step-000218.replaced-20260101T000000Z") is None


def test_one_latest_complete_state_rule(tmp_path):
    root = tmp_path / "state"
    for step, files in ((10, ("COMPLETE", "meta.json")), (20, ("COMPLETE",)), (30, ("meta.json",))):
        d = root / f"step-{step:06d}"
        d.mkdir(parents=True)
        for f in files:
            (d / f).write_text("x")
    assert layout.latest_complete_state(root) == root / "step-000010"   # 20 lacks meta.json, 30 COMPLETE
    assert [s for s, _ in layout.complete_states(root)] == [10]
