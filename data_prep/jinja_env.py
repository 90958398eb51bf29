"""A sandboxed Jinja environment for chat templates, equivalent to transformers' but faster.

Chat templates are untrusted code, so they run in Jinja's ImmutableSandboxedEnvironment, as in
transformers. The sandbox checks every attribute access (`message.content.startswith`, ...), and
that check dominated rendering time for long agent conversations. Its outcome depends only on the
object's type and the attribute name (all of jinja's tests are `isinstance` checks plus name
rules), so it is memoised per (type, name): same safety, far fewer calls. Filters and globals
mirror transformers' (`tojson` without HTML escaping, `raise_exception`, `strftime_now`,
`namespace` rejecting underscore names); a test checks the output equals `apply_chat_template`.
"""
from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class _Namespace(jinja2.utils.Namespace):
    def __init__(*args, **kwargs):  # same calling convention as jinja's Namespace
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates cannot set underscore attributes ({name!r})")


# One instance per plain type the templates touch; jinja's safety rules are isinstance checks plus
# name rules, so the verdict for a representative instance holds for every instance of that type.
_REPRESENTATIVE = {str: "", dict: {}, list: [], tuple: (), int: 0, float: 0.0, bool: False, type(None): None,
                   _Namespace: _Namespace()}


class _CachedSandbox(ImmutableSandboxedEnvironment):
    def is_safe_attribute(self, obj, attr, value):
        if type(obj) not in _REPRESENTATIVE:
            return super().is_safe_attribute(obj, attr, value)
        return _safe_plain(type(obj), attr)


_REFERENCE = ImmutableSandboxedEnvironment()


@lru_cache(maxsize=4096)
def _safe_plain(tp: type, attr: str) -> bool:
    return ImmutableSandboxedEnvironment.is_safe_attribute(_REFERENCE, _REPRESENTATIVE[tp], attr, None)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise(message):
    raise jinja2.exceptions.TemplateError(message)


@lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    env = _CachedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["namespace"] = _Namespace
    env.globals["dict"] = dict
    return env.from_string(source)
