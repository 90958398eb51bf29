"""search_plan_act: a procedurally generated, closed-book, multi-step tool task.

A seeded world of typed records (people, teams, sites, vendors, projects) with random-code facts,
writable slots and relations, plus a BM25 index over one snippet per record. A goal names one
start record and defines further records through relation hops; it requires writes (copy a fact
into a slot, or add a link) and asks for one fact. Tools: `search(query)`, `read_record(record_id)`,
`update_record(record_id, field, value)`, `link_records(source_id, target_id, relation)`,
`finish(answer)`. A task is fully determined by (seed, split).

Splits: `train` (hops 1-2, writes 1-2) and `ood` (bench `search_plan_ood`: hops 3-4, writes 2-3);
they share no goal template, fact type, slot name, navigation relation or link relation.

Reward (reward.py has the exact rules), total = 0.5*outcome + 0.2*grounding + 0.3*stop in [0, 1]:
  outcome   one equal share per required write held in the final state and for a correct answer,
            minus one share per collateral change (anything changed that the goal didn't ask for);
  grounding share of writes/answers whose every id and value appeared earlier in a search or
            read_record result (over at least the number of uses the goal needs);
  stop      finish called: 1 if at that moment all required writes held and nothing else had
            changed, 0.5 if required writes outnumbered collateral changes, else 0; minus 0.25
            per call after finish; 0 if never finished.

Hack ceilings (mean total over >= 200 tasks per split; `python -m envs.search_plan_act pilot`):
reckless_guesser 0.20, search_spammer 0.15, never_finisher 0.55, early_finisher 0.35,
random_caller 0.20, write_sprayer 0.25; the genuine policy must beat every hack's mean by >= 0.30.

API: `SearchPlanActEnv` (TRL environment_factory style), `tool_schemas()`,
`export_trajectories(path, n, seed, split)`, `make_eval_items(n, seed, split)`, `run_pilot(...)`.
"""
from .env import TOOL_NAMES, SearchPlanActEnv
from .export import episode_record, export_trajectories, make_eval_items, tool_schemas
from .goals import build_task
from .pilot import run_pilot
from .reward import HACK_CEILINGS, MIN_MARGIN, WEIGHTS

__all__ = [
    "SearchPlanActEnv", "TOOL_NAMES", "tool_schemas", "export_trajectories", "make_eval_items",
    "episode_record", "build_task", "run_pilot", "WEIGHTS", "HACK_CEILINGS", "MIN_MARGIN",
]
