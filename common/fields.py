"""Typed config fields: each key of a command defined once, with its default, its rule, its help text and
its roles.

A command's keys are a table `{dotted.key: Field}`; from it come the defaults (`defaults`), the `--help` and
docs/keys/*.md lines (common.keydoc reads a Field as it reads a `(default, description)` pair) and the
value checks (`problems`). A key several commands share is one Field object: another command holds it in a
`Passed` (analyze's `eval.n` is evaluate's `n`, unset unless given, so that evaluate's default or a
profile's value applies).

Roles say what a key is besides its value:
- IDENTITY: its value is part of the result's identity as it is (a digest of the settings);
- CONTENT:  it changes the result through the content identity of what it names (a checkpoint's digest,
            a bench file's, a corpus'), not through its spelling;
- ENGINE:   it changes the result through the engine settings the host resolves it to;
- PATH:     a file or directory, resolved against the caller's directory.
A key with none of the identity roles is operational: how fast or where, never what.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from common.schema import Number

IDENTITY, CONTENT, ENGINE, PATH = "identity", "content", "engine", "path"


def _alternatives(values: Iterable[Any]) -> str:
    shown = ["null" if v is None else str(v).lower() if isinstance(v, bool) else str(v) for v in values]
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"


@dataclass(frozen=True)
class Choices:
    """One of `values` (YAML's true/false are the booleans); `hint`: a "did you mean" for a near miss."""

    values: tuple
    hint: bool = False

    def problem(self, key: str, v: Any) -> str | None:
        if any(v is c or (type(v) is type(c) and v == c) for c in self.values):
            return None
        from common.cli import did_you_mean

        tail = did_you_mean(v, [c for c in self.values if isinstance(c, str)]) if self.hint and isinstance(v, str) else ""
        return f"{key}={v!r}: expected {_alternatives(self.values)}" + (f".{tail}" if tail else "")


@dataclass(frozen=True)
class Flag:
    """true or false."""

    def problem(self, key: str, v: Any) -> str | None:
        return None if isinstance(v, bool) else f"{key}={v!r}: expected true or false"


@dataclass(frozen=True)
class Text:
    """A string (a path, a URL, a name), or null."""

    def problem(self, key: str, v: Any) -> str | None:
        return None if v is None or isinstance(v, (str, os.PathLike)) else f"{key}={v!r}: expected a string (or null)"


@dataclass(frozen=True)
class Check:
    """A rule written as a function `(key, value) -> problem or None` (what a table of values cannot say)."""

    fn: Callable[[str, Any], str | None]

    def problem(self, key: str, v: Any) -> str | None:
        return self.fn(key, v)


@dataclass(frozen=True)
class Range:
    """A number by common.schema.Number's rule (range, integer, null and words such as auto)."""

    number: Number

    def problem(self, key: str, v: Any) -> str | None:
        return None if self.number.ok(v) else f"{key}={v!r}: expected {self.number.describe()}"


@dataclass(frozen=True, eq=False)
class Field:
    """One key: its default, its help line, what a value may be (`rule`; None: checked where it is used)
    and its roles (IDENTITY, CONTENT, ENGINE, PATH). Compared by identity: one object per key."""

    default: Any
    help: str
    rule: Choices | Flag | Text | Check | Range | None = None
    roles: frozenset = frozenset()

    def problem(self, key: str, v: Any) -> str | None:
        return self.rule.problem(key, v) if self.rule is not None else None


@dataclass(frozen=True, eq=False)
class Passed:
    """Another command's `field`, passed on to it when set: unset (null) by default, so that the other
    command's own default (or a profile's value) applies; `default` when this command sets one itself."""

    field: Field
    owner: str                 # the command the field is defined by: its help says so
    default: Any = None
    note: str = ""             # what this command does with it, besides passing it on

    @property
    def help(self) -> str:
        from common.keydoc import shown

        theirs = "" if self.field.default is None else f" {shown(self.field.default)}"
        own = f"; {self.note}" if self.note else ""
        unset = "" if self.default is not None else f" (null: {self.owner}'s default{theirs} or the profile's)"
        return f"{self.owner}'s: {self.field.help}{own}{unset}"

    def problem(self, key: str, v: Any) -> str | None:
        return None if v is None else self.field.problem(key, v)


def number(help: str, default: Any, roles: Iterable[str] = (), **rule) -> Field:
    """A numeric field (`rule`: common.schema.Number's arguments)."""
    return Field(default, help, Range(Number(**rule)), frozenset(roles))


def choice(help: str, default: Any, values: Iterable, roles: Iterable[str] = (), hint: bool = False) -> Field:
    return Field(default, help, Choices(tuple(values), hint), frozenset(roles))


def flag(help: str, default: bool, roles: Iterable[str] = ()) -> Field:
    return Field(default, help, Flag(), frozenset(roles))


def text(help: str, default: Any = None, roles: Iterable[str] = ()) -> Field:
    return Field(default, help, Text(), frozenset(roles))


def field(help: str, default: Any, roles: Iterable[str] = (), rule=None) -> Field:
    """A field whose value is checked where it is used (a list, a mapping) or by `rule`."""
    return Field(default, help, rule, frozenset(roles))


def with_role(table: dict[str, Field], role: str) -> tuple[str, ...]:
    """The keys of `table` that have `role`, in table order."""
    return tuple(k for k, f in table.items() if role in getattr(f, "roles", ()))


def problems(table: dict[str, Field | Passed], cfg) -> list[str]:
    """One line per key of `table` whose value in `cfg` (a mapping) breaks its rule."""
    return [why for key, f in table.items() if key in cfg and (why := f.problem(key, cfg[key])) is not None]
