"""data_prep's defaults: the `data:` section of recipes/base.yaml (a test keeps them equal)."""
from __future__ import annotations

import copy
from typing import Any

DATA_DEFAULTS: dict[str, Any] = {
    "kind": "hub",                       # hub | synthetic
    "n": 3500,
    "epilogue": True,
    "reasoning": "reasoning_content",    # reasoning_content | content
    "history_reasoning": "exact",        # exact | keep_as_rendered (inexact) | reject
    "thoughts": "reject",                # reject | drop (inexact): thoughts the template cannot render
    "max_seq_len": 32768,
    "length_policy": "drop",             # drop | truncate
    "max_record_bytes": None,            # a record larger than this (as JSON) is rejected before rendering; null = auto
    "allow_fewer": False,
    "strict": False,
    "decontam": [],
    "decontam_bench_root": None,         # dir laid out as ../shared/benchmarks: all 7 benches (the hub recipe sets it)
    "decontam_drop": False,
    "decontam_ngram": 13,
    "sources": {"code": [], "search": []},
    "synthetic": {},
    "cache_root": None,
    "dir": None,
}
KINDS = ("hub", "synthetic")
LENGTH_POLICIES = ("drop", "truncate")
# Keys that never change the built dataset (left out of the cache key).
NON_OUTPUT_KEYS = ("cache_root", "dir", "strict")


def resolve(data_cfg: Any) -> dict:
    """Plain dict of `data_cfg` (dict or DictConfig) over the defaults, values checked."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(data_cfg, DictConfig):
        data_cfg = OmegaConf.to_container(data_cfg, resolve=True)
    cfg = copy.deepcopy(DATA_DEFAULTS)
    for k, v in (data_cfg or {}).items():
        if k not in cfg:
            raise ValueError(f"unknown data key {k!r} (known: {', '.join(cfg)})")
        cfg[k] = v
    cfg["sources"] = {"code": list((cfg["sources"] or {}).get("code") or []),
                      "search": list((cfg["sources"] or {}).get("search") or [])}
    cfg["decontam"] = list(cfg["decontam"] or [])
    cfg["synthetic"] = dict(cfg["synthetic"] or {})
    from data_prep.readers.common import REASONING_MODES
    from data_prep.render import HISTORY_POLICIES, THOUGHT_POLICIES

    for key, allowed in (("kind", KINDS), ("length_policy", LENGTH_POLICIES),
                         ("reasoning", REASONING_MODES), ("history_reasoning", HISTORY_POLICIES), ("thoughts", THOUGHT_POLICIES)):
        if cfg[key] not in allowed:
            raise ValueError(f"data.{key}={cfg[key]!r}: expected one of {', '.join(allowed)}")
    if not isinstance(cfg["n"], int) or cfg["n"] < 1:
        raise ValueError(f"data.n must be a positive integer, got {cfg['n']!r}")
    if not isinstance(cfg["max_seq_len"], int) or cfg["max_seq_len"] < 16:
        raise ValueError(f"data.max_seq_len must be an integer >= 16, got {cfg['max_seq_len']!r}")
    if isinstance(cfg["decontam_ngram"], bool) or not isinstance(cfg["decontam_ngram"], int) or cfg["decontam_ngram"] < 1:
        raise ValueError(f"data.decontam_ngram must be an integer >= 1, got {cfg['decontam_ngram']!r}")
    mrb = cfg["max_record_bytes"]
    if mrb is not None and (isinstance(mrb, bool) or not isinstance(mrb, int) or mrb < 1):
        raise ValueError(f"data.max_record_bytes must be null (auto) or a positive integer, got {mrb!r}")
    return cfg


# Bytes of record JSON per token of max_seq_len allowed before rendering (auto max_record_bytes):
# a token is ~4 bytes of text on average, so 16 leaves room for JSON escapes and the template;
# under length_policy=truncate a record is meant to be longer than max_seq_len, so 4x that.
RECORD_BYTES_PER_TOKEN = {"drop": 16, "truncate": 64}


def max_record_bytes(cfg: dict) -> int:
    """The byte cap applied to each record before rendering."""
    return cfg["max_record_bytes"] or RECORD_BYTES_PER_TOKEN[cfg["length_policy"]] * cfg["max_seq_len"]
