"""Follow one piece of data, a function's parameter, through the calls it is passed to; count how often the walk
enters each room and how often it climbs back up.

    python3 tools/walk.py FILE:FUNC:PARAM [--rooms folders|files] [--through FOLDER] [--show] [--root DIR] [--cap N]

FUNC may be `Class.method`. Static (`ast`), standard library only; module names and floors are
tools/import_graph.py's. The definitions (the tool's contract):

- Taint. In a function, the tainted names are the followed parameters plus every local name bound (=, op=, for,
  with, comprehension, :=, tuple unpacking) from an expression that mentions a tainted name; flow-insensitive (to a
  fixpoint over the whole body). A function defined inside another is part of it: its calls are the outer
  function's calls (a closure sees the tainted names), and a call to it is no step of its own.
- Follow. A call whose arguments (positional, keyword, *args, **kwargs) mention a tainted name is followed when its
  callee resolves to a function, method or class (its __init__) of this checkout: bare names (module-level defs,
  `from x import f`, `import x as y; y.f`, `from pkg import mod; mod.f`, relative imports, re-exports, imports
  inside the function), `self.m`/`cls.m`/`cls(...)` in a class (and its bases here), `Class(...)`, `Class.m`. The
  callee's followed parameters are those bound to the tainted arguments (by position or keyword, else its
  *args/**kwargs; a tainted `*xs`/`**kw` binds them all). Other calls (builtins, stdlib, third-party, methods of
  objects) are unresolved: counted, and listed with --show.
- Walk. Depth first, in source order of the call sites. A function already on the stack is not re-expanded
  (recursion); the same function reached from another call site is walked again. At most --cap call sites are
  followed (reported when hit).
- Tour. The functions in visit order, returns included: entering a callee and coming back are both steps.
- Rooms: the top-level folders (--rooms folders) or the files (--rooms files). A room's entries: the steps where
  the room changes to it (the start room is entered once). Climbs back up: steps to a room on a higher floor than
  the step before (floors: import_graph.LEVELS, common 0 ... launch 6; a file has its folder's floor; a step to or
  from a room without a floor, such as tools, demo or bench, is no climb). --through FOLDER (e.g. common, the
  library every stage calls): the steps into that folder's functions are left out of the counts, so the walk stays
  in the room before them.
"""
from __future__ import annotations

import argparse
import ast
import difflib
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from import_graph import DRIVERS, LEVELS, import_prefix, module_name, package_of

ROOT = Path(__file__).resolve().parents[1]
ROOMS = (*LEVELS, *DRIVERS, "tools")
DEFS = ast.FunctionDef | ast.AsyncFunctionDef
Fn = tuple[str, str]   # (module, qualname: "f" or "Class.m")


class WalkError(Exception):
    """A FILE:FUNC:PARAM that names nothing here (exit 2)."""


@dataclass
class Module:
    defs: dict[str, ast.FunctionDef]   # qualname -> def
    classes: dict[str, ast.ClassDef]
    aliases: dict[str, str]   # module-level imports: local name -> absolute dotted name


@dataclass
class Step:
    fn: Fn
    depth: int
    site: str | None = None   # "file:line callee(...)": the call this step enters, or returns from (None: the start)
    back: bool = False   # a return
    enters: str | None = None   # the room this step enters, if it changes room


@dataclass
class Walk:
    rooms: str
    through: tuple[str, ...] = ()
    tour: list[Step] = field(default_factory=list)
    unresolved: list[str] = field(default_factory=list)
    recursion: list[str] = field(default_factory=list)
    capped: bool = False
    entries: Counter = field(default_factory=Counter)
    why: dict[str, Counter] = field(default_factory=dict)   # room -> what entered it (start, a call site, a return)
    climbs: int = 0


def imports(nodes, package: str, nested: bool) -> dict[str, str]:
    """local name -> absolute dotted name, for the imports among `nodes` (inside nested defs only when `nested`)."""
    out: dict[str, str] = {}
    todo = list(nodes)
    while todo:
        n = todo.pop(0)
        if isinstance(n, ast.Import):
            out.update({a.asname or a.name.split(".")[0]: a.name if a.asname else a.name.split(".")[0] for a in n.names})
        elif isinstance(n, ast.ImportFrom):
            out.update({a.asname or a.name: f"{import_prefix(n, package)}.{a.name}" for a in n.names})
        elif nested or not isinstance(n, DEFS | ast.ClassDef | ast.Lambda):
            todo.extend(ast.iter_child_nodes(n))
    return out


def dotted(expr: ast.expr) -> list[str] | None:
    """`a.b.c` -> ["a", "b", "c"]; None for anything but a chain of names."""
    if isinstance(expr, ast.Name):
        return [expr.id]
    head = dotted(expr.value) if isinstance(expr, ast.Attribute) else None
    return head and [*head, expr.attr]


def mentions(expr: ast.AST, names: set[str]) -> bool:
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(expr))


def bound_names(target: ast.AST) -> set[str]:
    """The local names an assignment target binds (not `x` of `x.a = ...` or `x[k] = ...`)."""
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, ast.Starred):
        return bound_names(target.value)
    return set().union(*map(bound_names, target.elts)) if isinstance(target, ast.Tuple | ast.List) else set()


def tainted(fn: ast.FunctionDef, start: set[str]) -> set[str]:
    binds = []
    for n in ast.walk(fn):
        if isinstance(n, ast.Assign):
            binds += [(t, n.value) for t in n.targets]
        elif isinstance(n, ast.AugAssign | ast.AnnAssign | ast.NamedExpr) and n.value is not None:
            binds.append((n.target, n.value))
        elif isinstance(n, ast.For | ast.AsyncFor | ast.comprehension):
            binds.append((n.target, n.iter))
        elif isinstance(n, ast.withitem) and n.optional_vars is not None:
            binds.append((n.optional_vars, n.context_expr))
    names, size = set(start), -1
    while size != len(names):
        size = len(names)
        for target, value in binds:
            if mentions(value, names):
                names |= bound_names(target)
    return names


def bind(call: ast.Call, callee: ast.FunctionDef, skip_self: bool, names: set[str]) -> frozenset[str]:
    """The callee's parameters bound to the arguments of `call` that mention a tainted name."""
    a = callee.args
    positional = [p.arg for p in a.posonlyargs + a.args][int(skip_self):]
    keywords = {p.arg for p in a.args + a.kwonlyargs}
    everything = frozenset([*positional, *(p.arg for p in a.kwonlyargs), *(v.arg for v in (a.vararg, a.kwarg) if v)])
    out = set()
    for i, arg in enumerate(call.args):
        if mentions(arg, names):
            if isinstance(arg, ast.Starred):
                return everything
            out |= {positional[i]} if i < len(positional) else {a.vararg.arg} if a.vararg else set()
    for kw in call.keywords:
        if mentions(kw.value, names):
            if kw.arg is None:
                return everything
            out |= {kw.arg} if kw.arg in keywords else {a.kwarg.arg} if a.kwarg else set()
    return frozenset(out)


def decorated(fn: ast.FunctionDef, name: str) -> bool:
    return any(dotted(d) == [name] for d in fn.decorator_list)


class Index:
    """The checkout's modules under the room folders, each parsed when first needed."""

    def __init__(self, root: Path):
        self.root = root
        self.files = {module_name(p, root): p for room in ROOMS if (root / room).is_dir()
                      for p in sorted((root / room).rglob("*.py"))}
        self.parsed: dict[str, Module] = {}
        self.calls_memo: dict[tuple[Fn, frozenset], list] = {}

    def module(self, name: str) -> Module | None:
        if name not in self.parsed and name in self.files:
            path = self.files[name]
            try:
                tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            except (SyntaxError, UnicodeDecodeError) as e:
                raise WalkError(f"{path.relative_to(self.root)}: cannot be read as Python: {e}") from None
            defs = {n.name: n for n in tree.body if isinstance(n, DEFS)}
            classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
            defs.update({f"{c.name}.{m.name}": m for c in classes.values() for m in c.body if isinstance(m, DEFS)})
            self.parsed[name] = Module(defs, classes, imports(tree.body, package_of(path, name), nested=False))
        return self.parsed.get(name)

    def where(self, fn: Fn, line: int | None = None) -> str:
        return f"{self.files[fn[0]].relative_to(self.root).as_posix()}:{fn[1] if line is None else line}"

    def room(self, fn: Fn, rooms: str) -> str:
        return fn[0].split(".")[0] if rooms == "folders" else self.where(fn).rpartition(":")[0]

    def lookup(self, dotted_name: str, depth: int = 0) -> tuple | None:
        """An absolute dotted name -> ("module", m) | ("func", m, qualname) | ("class", m, name) | None (not ours)."""
        if dotted_name in self.files:
            return ("module", dotted_name)
        mod, _, attr = dotted_name.rpartition(".")
        return self.member(mod, attr, depth) if self.module(mod) and depth < 20 else None

    def member(self, mod: str, name: str, depth: int = 0) -> tuple | None:
        m = self.module(mod)
        if name in m.classes:
            return ("class", mod, name)
        if name in m.defs:
            return ("func", mod, name)
        if name in m.aliases:   # a re-export
            return self.lookup(m.aliases[name], depth + 1)
        return ("module", f"{mod}.{name}") if f"{mod}.{name}" in self.files else None

    def thing(self, parts: list[str], mod: str, local: dict[str, str]) -> tuple | None:
        """What the chain of names `parts` is in module `mod` (the imports `local` to a function first)."""
        m = self.module(mod)
        head, *rest = parts
        if head in local or head in m.aliases and not (head in m.classes or head in m.defs):
            found = self.lookup(local.get(head) or m.aliases[head])
        else:
            found = self.member(mod, head) if head in m.classes or head in m.defs else None
        for attr in rest:
            if found and found[0] == "module":
                found = self.member(found[1], attr)
            else:
                method = found and found[0] == "class" and self.method(found[1], found[2], attr)
                found = method and ("func", *method)
        return found

    def method(self, mod: str, cls: str, name: str, depth: int = 0) -> Fn | None:
        """`cls.name` of module `mod`, or of its bases that are classes of this checkout."""
        if f"{cls}.{name}" in self.module(mod).defs:
            return (mod, f"{cls}.{name}")
        for base in self.module(mod).classes[cls].bases:
            b = depth < 20 and (parts := dotted(base)) and self.thing(parts, mod, {})
            if b and b[0] == "class" and (found := self.method(b[1], b[2], name, depth + 1)):
                return found
        return None

    def resolve(self, call: ast.Call, fn: Fn, local: dict[str, str]) -> tuple[Fn, bool] | None:
        """(the callee, whether its first parameter is bound: self or cls), or None when it is not ours."""
        parts, (mod, qual) = dotted(call.func), fn
        cls = qual.split(".")[0] if "." in qual else None
        if parts and cls and parts[0] in ("self", "cls") and len(parts) <= 2:
            callee = self.method(mod, cls, parts[1] if len(parts) == 2 else "__init__")
            return callee and (callee, not decorated(self.defn(callee), "staticmethod"))
        found = parts and self.thing(parts, mod, local)
        if found and found[0] == "class":
            init = self.method(found[1], found[2], "__init__")
            return init and (init, True)
        if found and found[0] == "func":
            return found[1:], "." in found[2] and decorated(self.defn(found[1:]), "classmethod")
        return None

    def defn(self, fn: Fn) -> ast.FunctionDef:
        return self.module(fn[0]).defs[fn[1]]

    def calls(self, fn: Fn, names: frozenset[str]) -> list[tuple[str, tuple[Fn, frozenset] | None]]:
        """The calls of `fn` that the data reaches, in source order: (site, (callee, its tainted params) or None)."""
        key = (fn, names)
        if key not in self.calls_memo:
            node, path = self.defn(fn), self.files[fn[0]]
            local = imports(node.body, package_of(path, fn[0]), nested=True)
            reached, out = tainted(node, set(names)), []
            inner = [[n.name] for n in ast.walk(node) if isinstance(n, DEFS) and n is not node]
            for call in sorted((c for c in ast.walk(node) if isinstance(c, ast.Call)), key=lambda c: (c.lineno, c.col_offset)):
                args = [*call.args, *(k.value for k in call.keywords)]
                if dotted(call.func) not in inner and any(mentions(arg, reached) for arg in args):
                    site = f"{self.where(fn, call.lineno)} {ast.unparse(call.func)}(...)"
                    callee = self.resolve(call, fn, local)
                    out.append((site, callee and (callee[0], bind(call, self.defn(callee[0]), callee[1], reached))))
            self.calls_memo[key] = out
        return self.calls_memo[key]


def walk(spec: str, root: Path = ROOT, rooms: str = "folders", cap: int = 10_000, through: tuple[str, ...] = ()) -> tuple[Walk, Index]:
    index, out = Index(root), Walk(rooms, through)
    start, params = parse_spec(index, spec)
    followed = 0

    def visit(fn: Fn, names: frozenset[str], stack: list[Fn]) -> None:
        nonlocal followed
        for site, callee in index.calls(fn, names):
            if out.capped:
                return
            if callee is None:
                out.unresolved.append(site)
            elif callee[0] in stack:
                out.recursion.append(site)
            elif followed >= cap:
                out.capped = True
            else:
                followed += 1
                out.tour.append(Step(callee[0], len(stack), site))
                visit(callee[0], callee[1], [*stack, callee[0]])
                out.tour.append(Step(fn, len(stack) - 1, site, back=True))

    out.tour.append(Step(start, 0))
    visit(start, params, [start])
    before, floor_before = None, None
    for step in out.tour:
        room, floor = index.room(step.fn, rooms), LEVELS.get(step.fn[0].split(".")[0])
        if step.fn[0].split(".")[0] in through and before is not None:
            continue
        if room != before:
            step.enters = room
            out.entries[room] += 1
            out.climbs += floor is not None and floor_before is not None and floor > floor_before
            why = "start" if before is None else f"back from {step.site}" if step.back else f"call {step.site}"
            out.why.setdefault(room, Counter())[why] += 1
        before, floor_before = room, floor
    return out, index


def parse_spec(index: Index, spec: str) -> tuple[Fn, frozenset[str]]:
    parts = spec.rsplit(":", 2)
    if len(parts) != 3:
        raise WalkError(f"{spec}: expected FILE:FUNC:PARAM (e.g. evals/run.py:evaluate:cfg)")
    file, func, param = parts
    path = index.root / file
    mod = module_name(path, index.root) if path.is_file() and path.suffix == ".py" else None
    if mod not in index.files:
        raise WalkError(f"{file}: no such Python file in a room folder ({', '.join(ROOMS)}) under {index.root}")
    if func not in index.module(mod).defs:
        raise WalkError(f"{file}: no function {func!r}{did_you_mean(func, index.module(mod).defs)}")
    a = index.defn((mod, func)).args
    names = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs] + [v.arg for v in (a.vararg, a.kwarg) if v]
    if param not in names:
        raise WalkError(f"{file}:{func}: no parameter {param!r}{did_you_mean(param, names)}")
    return (mod, func), frozenset([param])


def did_you_mean(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=3)
    return f" (did you mean {', '.join(close)}?)" if close else ""


def report(w: Walk, index: Index, spec: str, show: bool) -> str:
    lines = [f"walk {spec} (rooms: {w.rooms}{''.join(f'; through {t}' for t in w.through)})"]
    if show:
        for step in w.tour:
            arrow = "<-" if step.back else "->" if step.site else "  "
            lines.append(f"  {'  ' * step.depth}{arrow} {index.where(step.fn)}" + (f"   [enters {step.enters}]" if step.enters else "")
                         + (f"   (from {step.site})" if step.site and not step.back else ""))
        lines += [f"  unresolved x{n}: {s}" for s, n in Counter(w.unresolved).items()]
        lines += [f"  not re-expanded (on the stack) x{n}: {s}" for s, n in Counter(w.recursion).items()]
    for room, n in sorted(w.entries.items(), key=lambda kv: (-kv[1], kv[0])):
        lines += [f"  {room:<24} entered {n}"] + ([f"    {why} x{c}" for why, c in w.why[room].most_common()] if show else [])
    top = max(w.entries.items(), key=lambda kv: kv[1])
    lines += [f"climbs back up: {w.climbs}", f"most entries of one room: {top[1]} ({top[0]})",
              f"functions walked: {sum(1 for s in w.tour if not s.back)}; unresolved calls: {len(w.unresolved)}; "
              f"recursive calls not re-expanded: {len(w.recursion)}"]
    return "\n".join(lines + ["cap hit: the walk stopped at --cap call sites; the counts are a lower bound"] * w.capped)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tools/walk.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("spec", metavar="FILE:FUNC:PARAM")
    ap.add_argument("--rooms", choices=("folders", "files"), default="folders", help="what a room is (default: folders)")
    ap.add_argument("--show", action="store_true", help="print the tour, the unresolved calls and what entered each room")
    ap.add_argument("--through", action="append", default=[], choices=ROOMS, metavar="FOLDER",
                    help="a folder the walk passes through: a step into it stays in the room before (repeatable)")
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout to read (default: this one)")
    ap.add_argument("--cap", type=int, default=10_000, help="the most call sites followed (default 10000)")
    args = ap.parse_args(argv)
    try:
        w, index = walk(args.spec, args.root, args.rooms, args.cap, tuple(args.through))
    except WalkError as e:
        print(f"walk: {e}", file=sys.stderr)
        return 2
    print(report(w, index, args.spec, args.show))
    return 0


if __name__ == "__main__":
    sys.exit(main())
