"""The bench registry: each kind of bench declares where its items come from, how one is played, its
row, its summary and its meta.json fields. `kind_of(bench)` is the only place a bench name decides
anything about how it is evaluated.

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
from dataclasses import dataclass
from typing import Any, Callable

from common import thinking
from common.benchmarks import parse_bench_key
from evals import babyai, tasks, teacher_forced
from evals.agent import AgentRules, play_agent
from evals.benches import BABYAI_BENCH, OOD_BENCH, bench_set, bench_source, load_bench
from evals.config import bench_size
from evals.results import QA_KEYS, summarize
from evals.scheduler import Episodes


@dataclass(frozen=True)
class BenchKind:
    """One kind of bench. `source(bench, cfg)`: where its items come from (no download); `opens(cfg)`:
    what its items are read from, opened once per evaluate call (verified, checked) for every bench of
    the kind, if anything (`opened` below, else None); `items(bench, cfg, opened) -> (items, source,
    unanswerable left out)`; `episodes(bench, cfg, tokenizer, retriever, style)`; `summarize(rows)`;
    `item_set(bench, cfg)`: the named item set it reads (None: an environment); `counts_unanswerable`:
    its summary says how many unanswerable items were left out; `meta(cfg, opened)`: its own block of
    meta.json (under the kind's name), if any; `scores`: its items are scored by the model's own
    logits (`evals.teacher_forced.score`, over what `opens` opened), not played as episodes."""
    name: str
    source: Callable[[str, Any], str]
    items: Callable[[str, Any, Any], tuple[list, str, int]]
    episodes: Callable[[str, Any, Any, Any, str], Episodes]
    summarize: Callable[[list[dict]], dict]
    item_set: Callable[[str, Any], str | None]
    counts_unanswerable: bool
    meta: Callable[[Any, Any], dict] | None = None
    scores: bool = False
    opens: Callable[[Any], Any] | None = None


def _qa_episodes(bench: str, cfg, tokenizer, retriever, style: str) -> Episodes:
    mode = parse_bench_key(bench)[1]
    rules = AgentRules(style, int(cfg.max_turns), int(cfg.max_new_tokens), thinking.template_kwargs(cfg.enable_thinking))
    return Episodes(start=lambda item: tasks.qa_episode(item, cfg.prompt, mode),
                    play=lambda ep, table: play_agent(ep, table, rules),
                    row=functools.partial(tasks.qa_row, skip_empty_golds=bool(cfg.skip_empty_golds)),
                    execute=tasks.SearchTools(retriever if mode == "open" else None, int(cfg.topk)))


def _ood_episodes(bench: str, cfg, tokenizer, retriever, style: str) -> Episodes:
    rules = AgentRules(style, int(cfg.ood_max_turns), int(cfg.max_new_tokens), thinking.template_kwargs(cfg.enable_thinking),
                       is_done=tasks.env_done)
    return Episodes(start=lambda item: tasks.ood_episode(item, cfg.prompt), play=lambda ep, table: play_agent(ep, table, rules),
                    row=tasks.ood_row, execute=tasks.env_tools)


def _babyai_episodes(bench: str, cfg, tokenizer, retriever, style: str) -> Episodes:
    rules = babyai.GameRules(None if cfg.babyai_max_steps is None else int(cfg.babyai_max_steps),
                             int(cfg.babyai_max_new_tokens), float(cfg.babyai_temperature),
                             thinking.template_kwargs(cfg.enable_thinking))
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
)
def _no_episodes(bench: str, cfg, tokenizer, retriever, style: str) -> Episodes:
    raise AssertionError(f"{bench} is scored, not played (evals.teacher_forced.score)")


TEACHER_FORCED = BenchKind(
    "teacher_forced",
    source=lambda bench, cfg: teacher_forced.source(cfg),
    items=lambda bench, cfg, held: teacher_forced.items(bench, held, bench_size(cfg, bench), int(cfg.seed)),
    episodes=_no_episodes,
    summarize=teacher_forced.summarize,
    item_set=lambda bench, cfg: None,
    counts_unanswerable=False,
    meta=lambda cfg, held: teacher_forced.meta(held),
    scores=True,
    opens=teacher_forced.open_heldout,
)
# bench name -> kind; any other bench is a QA bench
KINDS = {kind.name: kind for kind in (SEARCH_PLAN_OOD, BABYAI)} | dict.fromkeys(teacher_forced.BENCHES, TEACHER_FORCED)


def kind_of(bench: str) -> BenchKind:
    """The kind of bench `bench` (a bench key, `NAME[@MODE]`)."""
    return KINDS.get(bench, QA)
