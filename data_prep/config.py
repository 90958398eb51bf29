"""data_prep's defaults: the `data:` section of recipes/base.yaml (a test keeps them equal)."""
from __future__ import annotations

import copy
from typing import Any

from common import datafetch
from common.cli import did_you_mean
from common.schema import Number
from data_prep.errors import DataPrepError

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
    "decontam_bench_root": None,         # your own dir laid out as <bench>/*.jsonl: all 7 benches
    "decontam_sets": [],                 # named item sets (common.datafetch, fetched on first use; the hub recipe sets the 7)
    "decontam_drop": False,
    "decontam_ngram": 13,
    "sources": {"code": [], "search": []},
    "synthetic": {},
    "heldout": None,                     # a `data-prep heldout` dir: its records' content never trains (data_prep.heldout)
    "cache_root": None,
    "dir": None,
}
KINDS = ("hub", "synthetic")
LENGTH_POLICIES = ("drop", "truncate")
# What each data key may be (launch checks a composed config with `problems`, data_prep with `resolve`).
NUMBERS = {
    "n": Number(lo=1, integer=True),
    "max_seq_len": Number(lo=16, integer=True),
    "decontam_ngram": Number(lo=1, integer=True),
    "max_record_bytes": Number(lo=1, integer=True, null=True, words=()),   # null: auto
}
BOOLS = ("epilogue", "allow_fewer", "strict", "decontam_drop")
# Keys that never change the built dataset (left out of the cache key).
NON_OUTPUT_KEYS = ("cache_root", "dir", "strict")


def choices() -> dict[str, tuple]:
    """The data keys with a fixed set of values, each list from its owner module."""
    from data_prep.readers.common import REASONING_MODES
    from data_prep.render import HISTORY_POLICIES, THOUGHT_POLICIES

    return {"kind": KINDS, "length_policy": LENGTH_POLICIES, "reasoning": REASONING_MODES,
            "history_reasoning": HISTORY_POLICIES, "thoughts": THOUGHT_POLICIES}


def problems(data_cfg: Any) -> list[str]:
    """Every data key of `data_cfg` (the `data:` section, dict or DictConfig) that is unknown or
    invalid, one line each naming `data.<key>`."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(data_cfg, DictConfig):
        data_cfg = OmegaConf.to_container(data_cfg, resolve=True)
    out = [f"unknown data key {k!r} (known: {', '.join(DATA_DEFAULTS)})" for k in (data_cfg or {}) if k not in DATA_DEFAULTS]
    cfg = {**DATA_DEFAULTS, **{k: v for k, v in (data_cfg or {}).items() if k in DATA_DEFAULTS}}
    for key, allowed in choices().items():
        if cfg[key] not in allowed:
            out.append(f"data.{key} must be one of {', '.join(allowed)}, got {cfg[key]!r}")
    for key, rule in NUMBERS.items():
        if not rule.ok(cfg[key]):
            out.append(f"data.{key} must be {rule.describe()}, got {cfg[key]!r}")
    out += [f"data.{key} must be true or false, got {cfg[key]!r}" for key in BOOLS if not isinstance(cfg[key], bool)]
    sets = cfg["decontam_sets"]
    if not isinstance(sets, (list, tuple)) or not all(isinstance(n, str) for n in sets):
        out.append(f"data.decontam_sets must be a list of data names such as [nq:seed42_1000], got {sets!r}")
    else:
        out += [f"data.decontam_sets: unknown data name {n!r}.{did_you_mean(n, datafetch.TABLE)}"
                for n in sets if not datafetch.is_name(n)]
    return out


def resolve(data_cfg: Any) -> dict:
    """Plain dict of `data_cfg` (dict or DictConfig) over the defaults, values checked."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(data_cfg, DictConfig):
        data_cfg = OmegaConf.to_container(data_cfg, resolve=True)
    bad = problems(data_cfg)
    if bad:
        raise DataPrepError(bad[0] if len(bad) == 1 else "; ".join(bad))
    cfg = copy.deepcopy(DATA_DEFAULTS)
    cfg.update(data_cfg or {})
    cfg["sources"] = {"code": list((cfg["sources"] or {}).get("code") or []),
                      "search": list((cfg["sources"] or {}).get("search") or [])}
    cfg["decontam"] = list(cfg["decontam"] or [])
    cfg["decontam_sets"] = list(cfg["decontam_sets"] or [])
    cfg["synthetic"] = dict(cfg["synthetic"] or {})
    return cfg


# Bytes of record JSON per token of max_seq_len allowed before rendering (auto max_record_bytes):
# a token is ~4 bytes of text on average, so 16 leaves room for JSON escapes and the template;
# under length_policy=truncate a record is meant to be longer than max_seq_len, so 4x that.
RECORD_BYTES_PER_TOKEN = {"drop": 16, "truncate": 64}


def max_record_bytes(cfg: dict) -> int:
    """The byte cap applied to each record before rendering."""
    return cfg["max_record_bytes"] or RECORD_BYTES_PER_TOKEN[cfg["length_policy"]] * cfg["max_seq_len"]
