"""Typed config fields, a command's keys as a table `{dotted.key: Field}` (docs/concepts.md, "Where each key is defined").

Roles: IDENTITY (its value is part of the result's identity), CONTENT (it changes the result through the content
identity of what it names: a checkpoint's, a bench file's or a corpus' digest), ENGINE (through the engine settings
the host resolves it to), PATH (a file or directory, resolved against the caller's directory by launch.paths; its
kind is one of PATH_KINDS). A key with none of the identity roles is operational: how fast or where, never what.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import reduce
from types import SimpleNamespace
from typing import Any, Callable, Iterable, Sequence

from common.cli import did_you_mean, shown
from common.fingerprint import ALWAYS

IDENTITY, CONTENT, ENGINE, PATH = "identity", "content", "engine", "path"
# PATH's kinds: a list of paths, a local model directory (or a hub id / embedded model name kept as given), data
# sources FORMAT:PATH_OR_HUB_ID[~SHARE], auto | never | a state directory, an output location (the caller's directory)
PATHS, MODEL, SOURCES, STATE, OUTPUT = PATH_KINDS = ("paths", "model", "sources", "state", "output")
ABSENT = object()   # no value: a key absent from a config (`select`), a field without an `as_before` value


class Rule:
    """What a value may be: `ok(v)`, else `why(v)` is `what` it should have been (None: `v` keeps the rule), worded by
    `problem` (the evaluate-side commands) or `must` (the recipe keys)."""

    def why(self, v: Any) -> str | None:
        return None if self.ok(v) else self.what

    def problem(self, key: str, v: Any) -> str | None:
        return None if (what := self.why(v)) is None else f"{key}={v!r}: expected {what}"

    def must(self, key: str, v: Any) -> str | None:
        return None if (what := self.why(v)) is None else f"{key} must be {what}, got {v!r}"


@dataclass(frozen=True)
class Number(Rule):
    """A number in [lo, hi] (an open end when `lo_open` / `hi_open`); `integer` for counts; `null`
    and `words` (e.g. "auto") are accepted as they are."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    integer: bool = False
    null: bool = False
    words: tuple[str, ...] = ()

    @property
    def what(self) -> str:
        alts = [*self.words, *(["null"] if self.null else [])]
        tail = f" (or {', '.join(alts)})" if alts else ""
        if self.hi is None and self.lo == 0 and self.lo_open:
            return f"a positive number{tail}"
        if self.hi is None and self.integer and self.lo in (0, 1) and not self.lo_open:
            return f"a {'positive' if self.lo == 1 else 'non-negative'} integer{tail}"
        if self.hi is not None and self.lo is not None:
            return f"in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}{')' if self.hi_open else ']'}{tail}"
        kind = "an integer" if self.integer else "a number"
        lo = "" if self.lo is None else f" {'>' if self.lo_open else '>='} {self.lo:g}"
        return f"{kind}{lo}{tail}"

    def ok(self, v: Any) -> bool:
        if v is None or isinstance(v, str):
            return self.null if v is None else v in self.words
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (self.integer and not isinstance(v, int)) \
                or not math.isfinite(float(v)):
            return False
        return (self.lo is None or (v > self.lo if self.lo_open else v >= self.lo)) \
            and (self.hi is None or (v < self.hi if self.hi_open else v <= self.hi))


@dataclass(frozen=True)
class Choices(Rule):
    """One of `values` (YAML's true/false are the booleans); `hint`: a "did you mean" for a near miss;
    `what`: how a recipe key's problem names them (default: one of a, b, c)."""

    values: tuple
    hint: bool = False
    what: str = ""

    def why(self, v: Any) -> str | None:
        if any(v is c or (type(v) is type(c) and v == c) for c in self.values):
            return None
        names = list(map(shown, self.values))
        tail = did_you_mean(v, [c for c in self.values if isinstance(c, str)]) if self.hint and isinstance(v, str) else ""
        return (names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}") + (f".{tail}" if tail else "")

    def must(self, key: str, v: Any) -> str | None:
        what = self.what or f"one of {', '.join(map(str, self.values))}"
        return None if self.why(v) is None else f"{key} must be {what}, got {v!r}"


@dataclass(frozen=True)
class Test(Rule):
    """A rule written as a predicate `ok(value)` and what a value must be (`what`)."""

    ok: Callable[[Any], bool]
    what: str


FLAG = Test(lambda v: isinstance(v, bool), "true or false")
TEXT = Test(lambda v: v is None or isinstance(v, (str, os.PathLike)), "a string (or null)")   # a path, a URL, a name
ANY = Test(lambda v: True, "anything")   # a field whose value is checked where it is used


@dataclass(frozen=True, eq=False)
class Field:
    """One key (`read`: the value the program works with, e.g. `auto` -> None, when it differs from the one written;
    `as_before`: what an older config.yaml that lacks it means, `excluded`). Compared by identity: one object per key."""

    default: Any
    help: str
    rule: Rule = ANY
    roles: frozenset = frozenset()
    read: Callable[[Any], Any] | None = None
    as_before: Any = ABSENT
    problem = property(lambda self: self.rule.problem)   # (key, value) -> what is wrong with it, worded by the rule
    must = property(lambda self: self.rule.must)


@dataclass(frozen=True, eq=False)
class Default:
    """A field another command defines, with this command's own default (`note`: why, shown in its help). With `owner`
    (the command defining it): passed on to that command when set, unset (null) by default so that the owner's own
    default (or a profile's value) applies; `note`: what this command does with it besides."""

    field: Field
    default: Any = None
    note: str = ""
    owner: str = ""

    @property
    def help(self) -> str:
        if not self.owner:
            return f"{self.note} {self.field.help}".strip()
        theirs = "" if self.field.default is None else f" {shown(self.field.default)}"
        own = f"; {self.note}" if self.note else ""
        unset = "" if self.default is not None else f" (null: {self.owner}'s default{theirs} or the profile's)"
        return f"{self.owner}'s: {self.field.help}{own}{unset}"

    def __getattr__(self, name: str):   # rule, roles, read, problem, must: the field's
        return getattr(self.field, name)


def is_int(v: Any) -> bool:
    """An integer, not a boolean (YAML's true is an int to Python)."""
    return isinstance(v, int) and not isinstance(v, bool)


NONEMPTY = Test(lambda v: isinstance(v, str) and v != "", "a non-empty string")


def number(help: str, default: Any, roles: Iterable[str] = (), **rule) -> Field:
    return Field(default, help, Number(**rule), frozenset(roles))


def count(help: str, default: Any, roles: Iterable[str] = (IDENTITY,), lo: int = 1, null: bool = False) -> Field:
    """An integer field of at least `lo` (a count of steps, tokens, records)."""
    return number(help, default, roles, lo=lo, integer=True, null=null)


def list_of(ok: Callable[[Any], bool], what: str, size: Callable[[int], bool] = lambda n: True, null: bool = False) -> Test:
    """A rule: a list whose length passes `size` and whose every item passes `ok` (or null, with `null`)."""
    return Test(lambda v: (null and v is None) or (isinstance(v, Sequence) and not isinstance(v, str) and size(len(v))
                                                   and all(ok(x) for x in v)), what)


def choice(help: str, default: Any, values: Iterable, roles: Iterable[str] = (), hint: bool = False, what: str = "") -> Field:
    return Field(default, help, Choices(tuple(values), hint, what), frozenset(roles))


def flag(help: str, default: bool, roles: Iterable[str] = ()) -> Field:
    return Field(default, help, FLAG, frozenset(roles))


def text(help: str, default: Any = None, roles: Iterable[str] = (), as_before: Any = ABSENT) -> Field:
    return Field(default, help, TEXT, frozenset(roles), as_before=as_before)


def field(help: str, default: Any, roles: Iterable[str] = (), rule: Rule = ANY, read=None, as_before: Any = ABSENT) -> Field:
    """A field whose value is checked where it is used (a list, a mapping) or by `rule`."""
    return Field(default, help, rule, frozenset(roles), read, as_before)


def excluded(*tables: dict) -> dict[str, Any]:
    """A run fingerprint's exclusions (common.fingerprint's `exclude`): every key of `tables` without the IDENTITY
    role (a whole section when none of its keys has it, so a key an old config.yaml holds below it is left out too)
    at any value (ALWAYS), and every other key with an `as_before` value at that value."""
    keys = {k: f for t in tables for k, f in t.items()}
    heads = dict.fromkeys(k.partition(".")[0] for k in keys if "." in k)
    whole = {s: ALWAYS for s in heads if not any(IDENTITY in f.roles for k, f in keys.items() if k.startswith(f"{s}."))}
    return whole | {k: ALWAYS if IDENTITY not in f.roles else f.as_before for k, f in keys.items()
                    if k.split(".")[0] not in whole and (IDENTITY not in f.roles or f.as_before is not ABSENT)}


def path_keys(table: dict[str, Any]) -> dict[str, str]:
    """{key: kind} for every key of `table` with the PATH role: its kind role (PATH_KINDS), else PATH (a file
    or directory). What launch resolves against the caller's directory, derived from the fields alone."""
    return {key: next((kind for kind in PATH_KINDS if kind in f.roles), PATH) for key, f in table.items() if PATH in f.roles}


def select(cfg, key: str, default: Any = ABSENT) -> Any:
    """The value at dotted `key` of a nested mapping (dict or omegaconf), `default` when absent."""
    try:
        return reduce(lambda node, part: node[part], key.split("."), cfg)
    except (KeyError, TypeError, IndexError):
        return default


def plain(v: Any) -> Any:
    """An omegaconf node as plain containers (resolved); anything else as it is."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v


def problems(table: dict[str, Field | Default], cfg, must: bool = False, optional: Iterable[str] = ()) -> list[str]:
    """One line per key of `table` whose value in `cfg` (nested) breaks its rule (Rule.problem, or Rule.must with `must`,
    which also names a key absent unless it is in `optional` or a later key's)."""
    out = []
    for key, f in table.items():
        v = select(cfg, key)
        if v is ABSENT:
            why = None if not must or key in optional or f.as_before is not ABSENT else f"{key}: missing from the config"
        else:
            why = f.must(key, plain(v)) if must else f.problem(key, v)
        out += [why] if why else []
    return out


def section(table: dict[str, Field | Default], cfg, name: str) -> SimpleNamespace:
    """Section `name` of `cfg` as the program reads it, e.g. `section(TRAINER, cfg, "train").lr`: each key's `read`
    applied; an absent key at its `as_before` value if a later key, else at its default."""
    out = {}
    for key, f in table.items():
        head, _, leaf = key.partition(".")
        if head == name and "." not in leaf:
            v = plain(select(cfg, key, f.default if f.as_before is ABSENT else f.as_before))
            out[leaf] = f.read(v) if f.read is not None and v is not None else v
    return SimpleNamespace(**out)


def defaults(table: dict[str, Any]) -> dict[str, Any]:
    """The nested defaults dict of a `{dotted.key: Field}` table."""
    out: dict[str, Any] = {}
    for name, entry in table.items():
        *parents, leaf = name.split(".")
        reduce(lambda node, p: node.setdefault(p, {}), parents, out)[leaf] = entry.default
    return out


def help_table(table: dict[str, Any]) -> str:
    """`key=default  description` lines of a `{dotted.key: Field}` table (a Field or Default each), aligned, for a CLI's --help."""
    left = [f"{name}={shown(entry.default)}" for name, entry in table.items()]
    width = min(max((len(x) for x in left), default=0), 44)
    return "\n".join(f"  {x:<{width}}  {entry.help}".rstrip() for x, entry in zip(left, table.values()))
