"""The project's import graph, read from the source with `ast`: every import of every module (also those inside
functions), relative imports resolved, folded to the checkout's own modules; and the stage levels of DESIGN.md.

One reader for the two that need it: tests/test_import_graph.py checks the stage map on it, and
tools/pipeline_diagram.py draws docs/pipeline.md from it. Standard library only (it runs before any install).
"""
from __future__ import annotations

import ast
from pathlib import Path

LEVELS = {"common": 0, "data_prep": 1, "sft": 2, "envs": 2, "evals": 3, "rl": 4, "analysis": 5, "launch": 6}
RL_MAY_USE = ("evals.toolcalls", "evals.metrics", "evals.extract", "evals.retrievers")
DRIVERS = ("demo", "bench")
PACKAGES = (*LEVELS, *DRIVERS, "tests")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_of(path: Path, module: str) -> str:
    """The package a module's relative imports start from."""
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def import_prefix(node: ast.ImportFrom, package: str) -> str:
    """The absolute module a `from ... import` reads from (relative imports resolved against `package`)."""
    if not node.level:
        return node.module or ""
    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(path: Path, module: str) -> set[str]:
    """Every module `path` imports (absolute names; relative imports resolved), ours or not."""
    package = package_of(path, module)
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            prefix = import_prefix(node, package)
            out.add(prefix)
            # `from pkg import mod` imports the module pkg.mod when there is one
            out.update(f"{prefix}.{a.name}" for a in node.names)
    return out


def import_graph(root: Path) -> dict[str, set[str]]:
    """module -> the project modules it imports (only names that are modules of the checkout)."""
    files = {module_name(p, root): p for pkg in PACKAGES if (root / pkg).is_dir()
             for p in sorted((root / pkg).rglob("*.py"))}
    # the tests' helper modules are also importable by their bare names (`sys.path += [tests/]`)
    bare = {m.removeprefix("tests."): m for m in files if m.startswith("tests.") and m.count(".") == 1}
    graph = {}
    for mod, path in files.items():
        names = {m if m in files else bare.get(m.split(".")[0], m) for m in imports_of(path, mod)}
        graph[mod] = {m for m in names if m in files and m != mod}
    return graph
