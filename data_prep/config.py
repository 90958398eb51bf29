"""data_prep's keys: the `data:` section of every SFT config, whose fields (default, rule, help) are
common.schema.DATA's."""
from __future__ import annotations

import copy
from typing import Any

from common import datafetch, keydoc, schema
from common.cli import did_you_mean
from common.fields import must_problems
from data_prep.errors import DataPrepError

DATA_DEFAULTS: dict[str, Any] = keydoc.defaults(schema.DATA)
# Keys that never change the built dataset (left out of the cache key).
NON_OUTPUT_KEYS = ("cache_root", "dir", "strict")


def problems(data_cfg: Any) -> list[str]:
    """Every data key of `data_cfg` (the `data:` section, dict or DictConfig) that is unknown or
    invalid, one line each naming `data.<key>`."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(data_cfg, DictConfig):
        data_cfg = OmegaConf.to_container(data_cfg, resolve=True)
    out = [f"unknown data key {k!r} (known: {', '.join(DATA_DEFAULTS)})" for k in (data_cfg or {}) if k not in DATA_DEFAULTS]
    cfg = {"data": {**copy.deepcopy(DATA_DEFAULTS), **{k: v for k, v in (data_cfg or {}).items() if k in DATA_DEFAULTS}}}
    rules = {f"data.{k}": f for k, f in schema.DATA.items() if not k.startswith("sources.")}
    out += must_problems(rules, cfg)
    sets = cfg["data"]["decontam_sets"]   # names the data cache knows (the rule: a list of strings)
    return out + [f"data.decontam_sets: unknown data name {n!r}.{did_you_mean(n, datafetch.TABLE)}" for n in sets
                  if isinstance(n, str) and not datafetch.is_name(n)]


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
