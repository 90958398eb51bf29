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


_DICT_ATTRS = frozenset(dir(dict))


class _CachedSandbox(ImmutableSandboxedEnvironment):
    """Memoises the sandbox's attribute verdict per (type, attribute name). jinja decides with
    name rules and `isinstance` checks on the object, so for any object whose `__class__` is its
    real type the verdict is the same for every instance of that type; anything else (a proxy
    faking its class) is checked every time."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._verdicts: dict[tuple[type, str], bool] = {}

    def getattr(self, obj, attribute):
        # Fast path for `message.role` on plain dicts: jinja's own lookup raises and catches an
        # AttributeError first (dicts have no such attribute), then returns obj[attribute].
        if type(obj) is dict and attribute not in _DICT_ATTRS:
            try:
                return obj[attribute]
            except (KeyError, TypeError):
                return self.undefined(obj=obj, name=attribute)
        return super().getattr(obj, attribute)

    def is_safe_attribute(self, obj, attr, value):
        tp = type(obj)
        if getattr(obj, "__class__", None) is not tp:
            return super().is_safe_attribute(obj, attr, value)
        key = (tp, attr)
        verdict = self._verdicts.get(key)
        if verdict is None:
            verdict = self._verdicts[key] = super().is_safe_attribute(obj, attr, value)
        return verdict


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
