"""The bench registry: each kind of bench declares where its items come from, how one is played, its
row, its summary and its meta.json fields, and what the other stages read off it (its identity keys,
analysis's headline metric, report.html's rendering: BenchKind). `kind_of(bench)` is the only place a
bench name decides anything: evaluate, its identity, analyze and report.html ask it (docs/stages/envs.md,
"Adding an environment bench").

    qa               every QA bench, in each context mode (`musique`, `musique@item`, `musique@given`):
                     items from a file or a named set; tool-calling episodes (evals.agent.play_agent)
                     with the `search` tool; EM/F1/cover-EM/strict-EM; unanswerable items counted
    search_plan_ood  envs.search_plan_act: an environment per episode and its own tools; reward components
    babyai           envs.babyai_text under BALROG's protocol (evals.babyai.play_game); return, success,
                     progression; its decoding settings as a `babyai` block of meta.json
    teacher_forced   `tf_code`, `tf_search` (evals.teacher_forced): no episode; the checkpoint's token loss
                     on the held-out gold trajectories of one domain (evaluate's `heldout=DIR`), rendered
                     and masked as in training, by span kind; HF backend only; a `teacher_forced` block
                     of meta.json (the held-out set's fingerprint, its render settings). The held-out
                     set is opened once per call (`opens`) and its items and block read from it.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from common import thinking
from common.benchmarks import parse_bench_key
from common.cli import did_you_mean
from evals import babyai, tasks, teacher_forced
from evals.agent import AgentRules, play_agent
from evals.benches import BABYAI_BENCH, HUB_CONTEXT, HUB_SPLITS, OOD_BENCH, bench_set, bench_size, bench_source, load_bench
from evals.metrics import METRICS, RATE, SIZE, MetricSpec
from evals.results import QA_KEYS, summarize
from evals.scheduler import Episodes
from evals.toolcalls import opens_think


@dataclass(frozen=True)
class BenchKind:
    """One kind of bench. `source(bench, cfg)`: where its items come from (no download), as its identity
    digests it (a file: its bytes; else the string itself, e.g. a held-out set's records); `opens(cfg)`:
    what its items are read from, opened once per evaluate call (verified, checked) for every bench of
    the kind, if anything (`opened` below, else None); `items(bench, cfg, opened) -> (items, source,
    unanswerable left out)`; `episodes(bench, cfg, tokenizer, retriever, style)`; `summarize(rows)`;
    `item_set(bench, cfg)`: the named item set it reads (None: an environment); `counts_unanswerable`:
    its summary says how many unanswerable items were left out; `meta(cfg, opened)`: its own block of
    meta.json (under the kind's name, after the key `meta_after`, else last), if any; `scores`: its items are scored by the model's own
    logits (`evals.teacher_forced.score`, over what `opens` opened), not played as episodes.

    What the other stages read off a kind (the defaults: a QA bench): `key_prefix`, the evaluate keys
    that belong to this kind alone (they enter no other bench's identity, and a kept bench's are carried
    in meta.json); `sampled(conf)`, whether its rows are sampled under the evaluate config `conf` (the
    backend then enters its identity: the backends' samplers differ); `headline`, the one metric an
    environment bench is scored by in analysis's tables and figures (None: a QA bench's EM/F1, or a
    scored bench's losses); `components`, the parts of the headline that get a figure of their own
    (a row's `<headline>_<part>`); `correct`, the per-item metric report.html counts as right (>= 1);
    `shown`, the per-item scores it lists; `game`, its rows are games (a transcript of steps, actions
    and no tool calls), which report.html shows as one conversation, a step the game could not take
    labelled `invalid_step`; `console`, evaluate's console line after the bench and n: a format string
    over its summary (a metric it lacks prints nan; None: the table's EM/F1 columns, a QA bench), and
    `legend`, what each name on that line is (the table's legend line, when a row of the kind is shown);
    `metrics`, the summary and row metrics of its own, with their ranges (those every kind shares:
    evals.metrics.METRICS); `semantics`, bumped when a change alters this kind's rows only (its identity's
    eval_semantics is then `<EVAL_SEMANTICS>.<semantics>`, so no other kind's out dirs are refused)."""
    name: str
    source: Callable[[str, Any], str]
    items: Callable[[str, Any, Any], tuple[list, str, int]]
    episodes: Callable[[str, Any, Any, Any, str], Episodes]
    summarize: Callable[[list[dict]], dict]
    item_set: Callable[[str, Any], str | None]
    counts_unanswerable: bool
    meta: Callable[[Any, Any], dict] | None = None
    meta_after: str | None = None
    scores: bool = False
    opens: Callable[[Any], Any] | None = None
    key_prefix: str | None = None
    sampled: Callable[[dict], bool] | None = None
    headline: str | None = None
    components: tuple[str, ...] = ()
    correct: str = "em"
    shown: tuple[str, ...] = ("em", "f1")
    game: bool = False
    invalid_step: str = "invalid"
    console: str | None = None
    legend: str = ""
    metrics: dict[str, MetricSpec] = field(default_factory=dict)
    semantics: int = 0


def _qa_episodes(bench: str, cfg, tokenizer, retriever, style: str) -> Episodes:
    mode = parse_bench_key(bench)[1]
    kwargs = thinking.template_kwargs(cfg.enable_thinking)
    rules = AgentRules(style, int(cfg.max_turns), int(cfg.max_new_tokens), kwargs, opens_think=opens_think(tokenizer, kwargs))
    return Episodes(start=lambda item: tasks.qa_episode(item, cfg.prompt, mode),
                    play=lambda ep, table: play_agent(ep, table, rules),
                    row=functools.partial(tasks.qa_row, skip_empty_golds=bool(cfg.skip_empty_golds)),
                    execute=tasks.SearchTools(retriever if mode == "open" else None, int(cfg.topk)))


def _ood_episodes(bench: str, cfg, tokenizer, retriever, style: str) -> Episodes:
    kwargs = thinking.template_kwargs(cfg.enable_thinking)
    rules = AgentRules(style, int(cfg.ood_max_turns), int(cfg.max_new_tokens), kwargs, is_done=tasks.env_done,
                       opens_think=opens_think(tokenizer, kwargs))
    return Episodes(start=lambda item: tasks.ood_episode(item, cfg.prompt), play=lambda ep, table: play_agent(ep, table, rules),
                    row=tasks.ood_row, execute=tasks.env_tools)


def _babyai_episodes(bench: str, cfg, tokenizer, retriever, style: str) -> Episodes:
    kwargs = thinking.template_kwargs(cfg.enable_thinking)
    rules = babyai.GameRules(None if cfg.babyai_max_steps is None else int(cfg.babyai_max_steps),
                             int(cfg.babyai_max_new_tokens), float(cfg.babyai_temperature), kwargs, opens_think(tokenizer, kwargs))
    return rules.episodes()


def _babyai_meta(cfg) -> dict:
    return {"max_steps": cfg.babyai_max_steps, "max_new_tokens": int(cfg.babyai_max_new_tokens),
            "temperature": float(cfg.babyai_temperature), "samples": int(cfg.babyai_samples), "history": babyai.HISTORY}


QA = BenchKind(
    "qa",
    source=lambda bench, cfg: bench_source(bench, cfg.bench_root, sets=cfg.get("sets"), fetch=False),
    items=lambda bench, cfg, opened: load_bench(bench, cfg.bench_root, bench_size(cfg, bench), int(cfg.seed),
                                                 cfg.get("sets")),
    episodes=_qa_episodes,
    summarize=lambda rows: summarize(rows, QA_KEYS),
    item_set=lambda bench, cfg: bench_set(bench, cfg.bench_root, cfg.get("sets")),
    counts_unanswerable=True,
)
SEARCH_PLAN_OOD = BenchKind(
    OOD_BENCH,
    source=lambda bench, cfg: f"envs.search_plan_act/{cfg.ood_split}",
    items=lambda bench, cfg, opened: (tasks.ood_items(bench_size(cfg, bench), int(cfg.seed), cfg.ood_split),
                                      f"envs.search_plan_act/{cfg.ood_split}", 0),
    episodes=_ood_episodes,
    summarize=lambda rows: summarize(rows, None),
    item_set=lambda bench, cfg: None,
    counts_unanswerable=False,
    headline="reward",
    components=("outcome", "grounding", "stop"),
    correct="reward_outcome",
    shown=("reward", "reward_outcome", "reward_grounding", "reward_stop"),
    console="reward={reward:.3f} reward_outcome={reward_outcome:.3f} reward_grounding={reward_grounding:.3f} reward_stop={reward_stop:.3f}",
    legend="reward: mean reward per episode (0-1), reward_<component>: its parts' means",
    metrics={"reward": RATE, "reward_outcome": RATE, "reward_grounding": RATE, "reward_stop": RATE},
)
BABYAI = BenchKind(
    BABYAI_BENCH,
    source=lambda bench, cfg: "envs.babyai_text",
    items=lambda bench, cfg, opened: (babyai.items(bench_size(cfg, bench), int(cfg.seed), int(cfg.babyai_samples)),
                                      "envs.babyai_text", 0),
    episodes=_babyai_episodes,
    summarize=babyai.summarize,
    item_set=lambda bench, cfg: None,
    counts_unanswerable=False,
    meta=lambda cfg, opened: _babyai_meta(cfg),
    meta_after="bench_items",
    key_prefix="babyai_",
    sampled=lambda conf: float(conf.get("babyai_temperature") or 0) > 0,
    headline="return",
    correct="success",
    shown=("return", "success", "progression"),
    game=True,
    invalid_step="invalid: the fallback action was taken",
    semantics=1,   # 1: a reply that never closes the <think> its template opened is all reasoning (evals.babyai)
    console="return={return:.3f} success={success:.3f} invalid={invalid_action_rate:.3f} steps={mean_steps:.1f}",
    legend="return: mean episode return (0-1), success: share of episodes won, invalid: share of replies not taken, steps: mean replies per episode",
    metrics={"return": RATE, "progression": RATE, "samples": SIZE},
)

def _no_episodes(bench: str, cfg, tokenizer, retriever, style: str) -> Episodes:
    raise AssertionError(f"{bench} is scored, not played (evals.teacher_forced.score)")


TEACHER_FORCED = BenchKind(
    "teacher_forced",
    source=teacher_forced.source,
    items=lambda bench, cfg, held: teacher_forced.items(bench, held, bench_size(cfg, bench), int(cfg.seed)),
    episodes=_no_episodes,
    summarize=teacher_forced.summarize,
    item_set=lambda bench, cfg: None,
    counts_unanswerable=False,
    meta=lambda cfg, held: teacher_forced.meta(held),
    scores=True,
    opens=teacher_forced.open_heldout,
    semantics=1,   # 1: a held-out set identified by its records and render settings, not its manifest's bytes (they name paths)
    console="loss/token={loss:.4f} over {tokens} tokens",
    legend="loss/token: mean cross-entropy per answer token (lower is better)",
    metrics=teacher_forced.METRICS,
)
# bench name -> kind; any other bench is a QA bench
KINDS = {kind.name: kind for kind in (SEARCH_PLAN_OOD, BABYAI)} | dict.fromkeys(teacher_forced.BENCHES, TEACHER_FORCED)


def kind_of(bench: str) -> BenchKind:
    """The kind of bench `bench` (a bench key, `NAME[@MODE]`)."""
    return KINDS.get(bench, QA)


def env_benches() -> tuple[str, ...]:
    """The benches that bring their own environment or items (no retriever, no bench file, no context
    mode): every bench the registry names; any other is a QA bench."""
    return tuple(KINDS)


def uses_retriever(bench: str) -> bool:
    """Whether bench `bench` (a canonical key) searches a corpus: QA benches in context mode open."""
    return bench not in KINDS and parse_bench_key(bench)[1] == "open"


def bench_name_problem(name: str, bench_root) -> str | None:
    """Why `name` (a canonical `NAME[@MODE]`) names no bench evaluate can load (the environments, the hub's and
    each dir under `bench_root`), with the nearest names; None when it does."""
    known = {*env_benches(), *HUB_SPLITS, *HUB_CONTEXT}
    if bench_root and Path(bench_root).is_dir():
        known |= {d.name for d in Path(bench_root).iterdir() if d.is_dir()}
    if parse_bench_key(name)[0] in known:
        return None
    where = f" (no {Path(bench_root) / name}/)" if bench_root else " (and no bench_root=DIR holds it)"
    return f"unknown bench {name!r}{where}.{did_you_mean(name, sorted(known))}"


def key_prefixes() -> dict[str, str]:
    """bench -> the prefix of the evaluate keys that belong to it alone (`babyai` -> `babyai_`)."""
    return {bench: kind.key_prefix for bench, kind in KINDS.items() if kind.key_prefix}


def headline_metrics() -> dict[str, str]:
    """bench -> its headline metric, for each bench played in its own environment (in registry order)."""
    return {bench: kind.headline for bench, kind in KINDS.items() if kind.headline}


def metric_specs() -> dict[str, MetricSpec]:
    """Every registered metric's range: evals.metrics.METRICS, and each bench kind's own `metrics`."""
    return {**{m: spec for kind in KINDS.values() for m, spec in kind.metrics.items()}, **METRICS}


def metric_problem(name: str, value) -> str | None:
    """Why `value` is not a valid metric `name` (unknown to evals.metrics.METRICS and to every kind's
    `metrics`, not a number, NaN/inf, out of range, not an integer where one is needed), or None."""
    spec = METRICS.get(name) or next((kind.metrics[name] for kind in KINDS.values() if name in kind.metrics), None)
    if spec is None:
        return "not a registered metric (evals.metrics.METRICS, or a bench kind's `metrics` in evals.registry)"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"not a number ({spec.what})"
    if not math.isfinite(value):
        return f"not finite ({spec.what})"
    if spec.integer and not isinstance(value, int):
        return f"not an integer ({spec.what})"
    if value < spec.lo or (spec.hi is not None and value > spec.hi):
        return f"out of range ({spec.what})"
    return None
