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
    return cfg
