"""Each stage's bad-input errors are one typed family: `<stage>/errors.py` defines the stage's root
(`DataPrepError`, `SftError`, ...), a `common.cli.ConfigError` (exit 2 and one line at the command
line); every bad-input (ValueError) class a stage defines descends from its root, and no stage
raises the bare `ConfigError` (common's own helpers do). Runtime failures (a diverged loss, a backend
or retriever that fails) stay RuntimeErrors."""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from common.cli import ConfigError

ROOT = Path(__file__).resolve().parents[1]
STAGE_ROOTS = {"data_prep": "DataPrepError", "sft": "SftError", "launch": "LaunchError", "envs": "EnvsError",
               "evals": "EvalError", "rl": "RlError", "analysis": "AnalysisError"}
# modules that need an optional extra to import (the class is still checked where it imports)
OPTIONAL = {"trl", "peft", "minigrid", "gymnasium", "vllm", "flash_attn", "liger_kernel"}


def stage_files(stage: str, root: Path = ROOT) -> list[Path]:
    return sorted((root / stage).rglob("*.py"))


def module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def error_classes(stage: str) -> list[tuple[str, str]]:
    """(module, class) for every class named *Error defined in the stage, read from the source."""
    out = []
    for path in stage_files(stage):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        out += [(module_of(path), node.name) for node in ast.walk(tree)
                if isinstance(node, ast.ClassDef) and node.name.endswith("Error")]
    return out


def bare_config_error_raises(stage: str, root: Path = ROOT) -> list[str]:
    """Every `ConfigError(...)` the stage builds (raised or returned for a caller to raise) and every
    `raise ConfigError`; catching it (`except ConfigError`) is fine."""
    found = []
    for path in stage_files(stage, root):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            made = isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "ConfigError"
            raised = isinstance(node, ast.Raise) and isinstance(node.exc, ast.Name) and node.exc.id == "ConfigError"
            if made or raised:
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


@pytest.mark.parametrize("stage", sorted(STAGE_ROOTS))
def test_each_stage_has_one_root_error(stage):
    root = getattr(importlib.import_module(f"{stage}.errors"), STAGE_ROOTS[stage])
    assert issubclass(root, ConfigError) and root is not ConfigError


@pytest.mark.parametrize("stage", sorted(STAGE_ROOTS))
def test_no_stage_raises_the_bare_config_error(stage):
    assert bare_config_error_raises(stage) == []


@pytest.mark.parametrize("stage", sorted(STAGE_ROOTS))
def test_a_stages_bad_input_errors_descend_from_its_root(stage):
    root = getattr(importlib.import_module(f"{stage}.errors"), STAGE_ROOTS[stage])
    strays, checked = [], 0
    for module, name in error_classes(stage):
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:  # an optional extra this environment lacks
            if (exc.name or "").split(".")[0] in OPTIONAL:
                continue
            raise
        cls = getattr(mod, name, None)
        if not isinstance(cls, type):
            continue  # defined inside a function
        checked += 1
        if issubclass(cls, ValueError) and not issubclass(cls, root):
            strays.append(f"{module}.{name}")
    assert checked >= 1 and strays == []


def test_the_checks_catch_what_they_guard(tmp_path):
    """The scan on a hand-made stage: a bare `raise ConfigError(...)` is found, a raise of the
    stage's own type is not."""
    stage = tmp_path / "fake"
    stage.mkdir()
    (stage / "a.py").write_text("def f():\n    raise ConfigError('x')\n\n\ndef g():\n    raise FakeError('y')\n\n\n"
                                "def h():\n    return ConfigError('z')\n\n\ndef k():\n    try:\n        f()\n"
                                "    except ConfigError:\n        pass\n")
    assert bare_config_error_raises("fake", tmp_path) == ["fake/a.py:2", "fake/a.py:10"]


def test_callers_match_types_not_names():
    """What issue 18 named: launch's dataset cache matched `type(exc).__name__ == "StrictError"`."""
    for path in (ROOT / p for p in STAGE_ROOTS):
        for f in path.rglob("*.py"):
            text = f.read_text(encoding="utf-8")
            assert "__name__ == \"" not in text.replace('__name__ == "__main__"', ""), f
