"""data_prep's keys: the `data:` section of every SFT config (`DATA`, relative keys: common.fields, each
with its default, rule, help and roles; sft.config.SFT holds them as `data.KEY`), and their check."""
from __future__ import annotations

from typing import Any

from common import datafetch, fields
from common.cli import did_you_mean
from common.fields import CONTENT, IDENTITY, OUTPUT, PATH, PATHS, SOURCES, Field, Test, choice, count, field, flag, list_of, plain, text
from data_prep import synthetic
from data_prep.errors import DataPrepError

# data_prep's vocabularies (its readers and renderer check the same tuples)
REASONING_MODES = ("reasoning_content", "content")
HISTORY_POLICIES = ("exact", "keep_as_rendered", "reject")
THOUGHT_POLICIES = ("reject", "drop")
FORMATS = ("r2e-gym", "swe-gym", "swe-smith", "openseeker", "search-r1", "canonical")   # data_prep.readers.PARSERS' keys
_SOURCES = (IDENTITY, PATH, SOURCES), list_of(lambda s: isinstance(s, str) and ":" in s and s.split(":", 1)[0] in FORMATS,
                                               f"a list of FORMAT:PATH_OR_HUB_ID with FORMAT in {', '.join(FORMATS)}")
_ID, _PATH, _PATH_CONTENT, _OUTPUT = (IDENTITY,), (PATH,), (PATH, CONTENT), (PATH, OUTPUT)

DATA: dict[str, Field] = {
    "kind": choice("hub | synthetic", "hub", ("hub", "synthetic"), _ID),
    "n": count("trajectories per arm (mixed: n//2 code + the rest search)", 3500),
    "epilogue": flag("dual terminator; false builds the single-terminator baseline", True, _ID),
    "reasoning": choice("free-text thoughts before a call -> reasoning_content | content", "reasoning_content", REASONING_MODES, _ID),
    "history_reasoning": choice("exact | keep_as_rendered (INEXACT: trains turns as the template rewrites them) | reject",
                                "exact", HISTORY_POLICIES, _ID),
    "thoughts": choice("thoughts a template can't render (Llama-3.1): reject | drop (INEXACT, counted)", "reject", THOUGHT_POLICIES, _ID),
    "max_seq_len": count("tokens per trajectory; longer ones follow length_policy", 32768, lo=16),
    "length_policy": choice("drop | truncate", "drop", ("drop", "truncate"), _ID),
    "max_record_bytes": count("records larger than this (JSON bytes) rejected before rendering; null = 16 (truncate: 64) "
                               "x max_seq_len", None, null=True),
    "allow_fewer": flag("true: build with fewer than n usable records instead of failing (not with none of a domain or share)", False, _ID),
    "strict": flag("true: any rejected record fails the build (exit 1)", False, _ID),
    "decontam": field("extra evaluation jsonl files to decontaminate against", [], (IDENTITY, PATH, PATHS),
                      list_of(lambda p: isinstance(p, str), "a list of jsonl paths, e.g. [held_out.jsonl]", null=True)),
    "decontam_bench_root": text("your own dir laid out as <bench>/*.jsonl: every record checked against all 7 benches", roles=(IDENTITY, PATH)),
    "decontam_sets": field("named item sets (fetch-data names, fetched into $DTSFT_DATA on first use) to check against",
                           [], _ID, list_of(lambda n: isinstance(n, str), "a list of data names such as [nq:seed42_1000]"),
                           as_before=[]),   # issue 37
    "decontam_drop": flag("true: drop records that overlap an evaluation question (default: report them)", False, _ID),
    "decontam_ngram": count("n-gram length of the overlap check", 13),
    "sources.code": field("code-arm sources, [FORMAT:PATH_OR_HUB_ID[@REV][#split],...]; [] -> the arm recipe's", [], *_SOURCES),
    "sources.search": field("search-arm sources, same form as sources.code", [], *_SOURCES),
    "synthetic": field("data=synthetic generator knobs (synthetic.KNOB=V: code_turns, n_entities, world_seed, ...)", {}, _ID,
                       Test(lambda v: v is None or isinstance(v, dict), "a mapping of generator knobs, e.g. {code_turns: 3}")),
    "heldout": text("a `data-prep heldout` dir: every record whose content it holds is left out of the arm (rejected, "
                    "reason heldout)", roles=_PATH_CONTENT),
    "cache_root": text("null -> <runs_root>/_data", roles=_OUTPUT),
    "dir": text("the dataset directory; launch fills it from the cache", roles=_PATH),
}

DATA_DEFAULTS: dict[str, Any] = fields.defaults(DATA)
# Keys that never change the built dataset (left out of the cache key).
NON_OUTPUT_KEYS = ("cache_root", "dir", "strict")


def problems(data_cfg: Any) -> list[str]:
    """Every data key of `data_cfg` (the `data:` section, dict or DictConfig) that is unknown or invalid, one line
    each naming `data.KEY` (data-prep's command line names it as typed there, bare: data_prep.cli)."""
    data_cfg = plain(data_cfg)
    out = [f"unknown data key {k!r} (known: {', '.join(DATA_DEFAULTS)})" for k in (data_cfg or {}) if k not in DATA_DEFAULTS]
    values = {**DATA_DEFAULTS, **{k: v for k, v in (data_cfg or {}).items() if k in DATA_DEFAULTS}}
    out += fields.problems({f"data.{k}": f for k, f in DATA.items()}, {"data": values}, must=True,
                           optional=["data.sources.code", "data.sources.search"])   # absent: [] (sources not a section: resolve's line)
    out += synthetic.problems(values["synthetic"]) if isinstance(values["synthetic"], dict) else []
    sets = values["decontam_sets"]   # names the data cache knows (the rule: a list of strings)
    return out + [f"data.decontam_sets: unknown data name {n!r}.{did_you_mean(n, datafetch.TABLE)}"
                  for n in (sets if isinstance(sets, list) else []) if isinstance(n, str) and not datafetch.is_name(n)]


def resolve(data_cfg: Any) -> dict:
    """Plain dict of `data_cfg` (dict or DictConfig) over the defaults, values checked."""
    if bad := problems(data_cfg):
        raise DataPrepError("; ".join(bad))
    cfg = {**DATA_DEFAULTS, **(plain(data_cfg) or {})}
    if not isinstance(sources := cfg["sources"] or {}, dict):
        raise DataPrepError(f"data.sources must be a section of keys (data.sources.KEY: value), got {sources!r}")
    cfg["sources"] = {side: list(sources.get(side) or []) for side in ("code", "search")}
    for key, kind in (("decontam", list), ("decontam_sets", list), ("synthetic", dict)):
        cfg[key] = kind(cfg[key] or ())
    return cfg
