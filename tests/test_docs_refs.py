"""Every code reference in README.md and docs/**/*.md names something that exists in the checkout.

- a path (an inline code span such as `common/datafetch.py`, `tests/test_study.py`, `recipes/base.yaml`) whose
  first part is one of the repository's own folders is a file or folder of the checkout;
- a Python name (`evals.store`, `common.tools.SEARCH_TOOL`, `launch.cli:main`, `sft.train.main(config_path, ...)`)
  whose first part is a stage package resolves: the longest prefix that is a module of the checkout, then a name
  defined at the top of that module (a def, class, assignment or import), then, for one more part, a name defined
  in that class's body.
Read from the source with `ast`: nothing is imported. Paths with a placeholder (`step-NNNNNN`, `<bench>`, `*`)
are patterns, not files, and are skipped.
"""
from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PACKAGES = ("common", "data_prep", "sft", "envs", "evals", "rl", "analysis", "launch", "demo", "bench")
FOLDERS = (*PACKAGES, "tests", "tools", "recipes", "docs")
SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
PATH = re.compile(rf"^(?:{'|'.join(FOLDERS)})/[\w./-]*$")
NAME = re.compile(rf"^(?:{'|'.join(PACKAGES)})(?:\.[A-Za-z_]\w*)+(?::[A-Za-z_]\w*)?")
PLACEHOLDER = re.compile(r"NNN|<|\*|\.\.\.")


def prose(text: str) -> str:
    """The page with its fenced blocks blanked, lines kept (the commands there are the docs-commands test's)."""
    return re.sub(r"^[ \t]*(```|~~~).*?^[ \t]*\1[ \t]*$", lambda m: "\n" * m.group(0).count("\n"), text,
                  flags=re.M | re.S)


def references(text: str) -> list[tuple[int, str]]:
    """(line, reference) of each path or Python name in an inline code span."""
    body = prose(text)
    found = []
    for m in SPAN.finditer(body):
        span = m.group(1).strip()
        line = body.count("\n", 0, m.start()) + 1
        if PATH.match(span) and not PLACEHOLDER.search(span):
            found.append((line, span))
        elif (n := NAME.match(span)) and not span.startswith(tuple(f"{p}/" for p in FOLDERS)):
            found.append((line, n.group(0)))
    return found


@functools.cache
def _defined(path: Path) -> dict[str, set[str] | None]:
    """Top-level names of a module -> the names of its body when it is a class, else None."""
    out: dict[str, set[str] | None] = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ClassDef):
            out[node.name] = {n for b in node.body for n in _names(b)}
        else:
            for n in _names(node):
                out.setdefault(n, None)
    return out


def _names(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
    names = set()
    for t in targets:
        names.update(e.id for e in ast.walk(t) if isinstance(e, ast.Name))
    if isinstance(node, (ast.If, ast.Try)):   # names defined under `if TYPE_CHECKING:` / `try: import ...`
        for b in [*node.body, *getattr(node, "orelse", []), *[s for h in getattr(node, "handlers", []) for s in h.body]]:
            names |= _names(b)
    return names


def _module_file(parts: list[str], root: Path) -> Path | None:
    base = root.joinpath(*parts)
    for f in (base.with_suffix(".py"), base / "__init__.py"):
        if f.is_file():
            return f
    return None


def resolve(ref: str, root: Path = ROOT) -> str | None:
    """None when `ref` exists in the checkout under `root`, else why not."""
    if "/" in ref:
        return None if (root / ref).exists() else "no such file or folder in the checkout"
    parts = ref.replace(":", ".").split(".")
    for k in range(len(parts), 0, -1):
        module = _module_file(parts[:k], root)
        if module is None:
            continue
        rest = parts[k:]
        if not rest:
            return None
        defined = _defined(module)
        if rest[0] not in defined:
            return f"{'.'.join(parts[:k])} defines no {rest[0]!r}"
        if len(rest) > 1 and defined[rest[0]] is not None and rest[1] not in defined[rest[0]]:
            return f"{'.'.join(parts[:k + 1])} (a class) defines no {rest[1]!r}"
        return None
    return f"no module {parts[0]!r}" if not (root / parts[0]).is_dir() else f"no module {'.'.join(parts[:2])}"


def test_every_code_reference_in_the_docs_resolves():
    refs = [(p, line, ref) for p in PAGES for line, ref in references(p.read_text(encoding="utf-8"))]
    assert len(refs) > 150   # the extraction finds the references (a broken pattern would find none)
    bad = [f"{p.relative_to(ROOT)}:{line}: `{ref}`: {why}" for p, line, ref in refs if (why := resolve(ref))]
    assert bad == [], "\n".join(bad)


def test_a_moved_name_or_file_is_reported(tmp_path):
    """The resolver on a hand-made checkout: what exists resolves, a renamed function, a missing module, a class
    attribute that is not there and a missing file are each reported."""
    (tmp_path / "evals").mkdir()
    (tmp_path / "evals" / "__init__.py").write_text("")
    (tmp_path / "evals" / "store.py").write_text(
        "import json\nfrom x import y as z\nROWS = 1\nclass Store:\n    kind = 'x'\n    def append(self): ...\n"
        "def open_store(): ...\nif True:\n    LATE = 2\n")
    ok = ["evals", "evals.store", "evals.store.ROWS", "evals.store:open_store", "evals.store.Store.append",
          "evals.store.Store.kind", "evals.store.z", "evals.store.json", "evals.store.LATE", "evals/store.py"]
    assert [resolve(r, tmp_path) for r in ok] == [None] * len(ok)
    assert resolve("evals.store.write_rows", tmp_path) == "evals.store defines no 'write_rows'"
    assert resolve("evals.run.evaluate", tmp_path) == "evals defines no 'run'"
    assert resolve("evals.store.Store.flush", tmp_path) == "evals.store.Store (a class) defines no 'flush'"
    assert resolve("evals/run.py", tmp_path) == "no such file or folder in the checkout"
    assert resolve("launch.cli:main", tmp_path) == "no module 'launch'"
    assert references("see `evals.store.Store.append(row)`, `evals/store.py`, `runs/x/seed0`, "
                      "`eval/step-NNNNNN/`, and\n```bash\nevaluate `evals.nope`\n```\n") == [
        (1, "evals.store.Store.append"), (1, "evals/store.py")]
