"""Reward components, weights and the hack ceilings the pilot enforces.

    outcome   = clip((satisfied_writes + answer_correct - collateral_changes) / (n_writes + 1), 0, 1)
                Each required write and the answer are worth one equal share (partial credit per
                write). A write counts when the final state holds it; any other difference from the
                target state (a slot written that the goal didn't ask for, an extra link) is a
                collateral change and cancels one share, so spraying writes can't farm credit.
    grounding = grounded_uses / max(uses, n_writes + 1)
                A use is a successful update_record, link_records or finish; it is grounded when
                every id and value it carries appeared earlier in a search or read_record result
                (results as the world was generated: values the agent wrote itself don't count, and
                error messages / write confirmations that echo arguments are not evidence). The
                denominator is at least the number of uses the goal needs, so one grounded call
                is not full marks.
    stop      = 0 if finish was never called; else, judged on the state at the moment of finish,
                1 if every required write held and nothing else had changed, 0.5 if the required
                writes held outnumbered the collateral changes, 0 otherwise (finishing before any
                required write, or after spraying writes); minus 0.25 per tool call after finish
                (including a second finish), floored at 0.
    total     = 0.5 * outcome + 0.2 * grounding + 0.3 * stop          (in [0, 1])

The weights are this project's design choice ([chosen]), not a reference's: the references name
search_plan_act and its mean-reward metric but publish no weights. The reason for these: finishing
the task (outcome) carries half the reward; stopping cleanly (stop) outweighs grounding because an
agent that never calls finish, or keeps calling tools after it, is unusable however well grounded its
writes are; grounding is kept non-zero so a lucky guess scores below an evidenced answer. The hack
ceilings below are derived from these weights: change one and the pilot's bounds must be re-derived.
"""
from __future__ import annotations

import re

from .spec import UNSET

WEIGHTS = {"outcome": 0.5, "grounding": 0.2, "stop": 0.3}  # [chosen] by this project, see the module doc
POST_FINISH_PENALTY = 0.25

# Ceilings on each scripted hack's mean total (checked by the pilot over >= 200 tasks per split),
# and the margin by which the genuine policy's mean must beat every hack's mean. The bounds below
# hold for 1 <= writes <= 3 (both splits' defaults); more writes raise the never_finisher bound.
#   never_finisher: all writes, no answer, stop 0 -> at most (0.5 + 0.2) * n/(n+1) <= 0.525 (n <= 3)
#   early_finisher: correct answer, no writes, stop 0 -> at most (0.5 + 0.2) / (n+1) <= 0.35 (n >= 1)
#   reckless_guesser / search_spammer / random_caller / write_sprayer: what they write is wrong, lands
#   on the wrong records or comes with more collateral than required changes, so outcome ~0 and
#   stop ~0; grounding alone is worth <= 0.2.
HACK_CEILINGS = {
    "reckless_guesser": 0.2,
    "search_spammer": 0.15,
    "never_finisher": 0.55,
    "early_finisher": 0.35,
    "random_caller": 0.2,
    "write_sprayer": 0.25,
}
MIN_MARGIN = 0.3
COMPONENTS = ("outcome", "grounding", "stop", "total")


def normalize(text: str) -> str:
    """Case/space/quote-insensitive form used for answers and grounding checks."""
    t = text.strip().casefold()
    t = re.sub(r"^final answer\s*:\s*", "", t)
    t = t.strip(" \t\n\"'`.")
    return re.sub(r"\s+", " ", t)


def appears_in(value: str, evidence: list[str]) -> bool:
    """`value` occurs as a whole token run (not inside a longer code) in some evidence text."""
    v = normalize(value)
    if not v:
        return False
    pat = re.compile(r"(?<![a-z0-9])" + re.escape(v) + r"(?![a-z0-9])")
    return any(pat.search(e) for e in evidence)


def state_diff(task) -> tuple[int, int]:
    """(#required writes the current state holds, #collateral changes vs the target state)."""
    target_slots = {(rid, slot): val for kind, rid, slot, val in task.targets if kind == "update"}
    target_links = {(src, rel, dst) for kind, src, rel, dst in task.targets if kind == "link"}
    satisfied = collateral = 0
    for rid, rec in task.world.records.items():
        for slot, cur in rec.slots.items():
            want = target_slots.get((rid, slot), UNSET)
            if (rid, slot) in target_slots:
                satisfied += cur == want
            elif cur != want:
                collateral += 1
    links = {(rid, rel, dst) for rid, rec in task.world.records.items() for rel, dst in rec.links}
    satisfied += len(links & target_links)
    collateral += len(links - target_links)
    return satisfied, collateral


def components(task, *, answer: str | None, finished: bool, state_at_finish: tuple[int, int],
               post_finish_calls: int, uses: int, grounded_uses: int) -> dict[str, float]:
    """The reward components; `state_at_finish` is `state_diff(task)` when finish was called."""
    n = task.n_writes
    satisfied, collateral = state_diff(task)
    answer_ok = int(finished and answer is not None and normalize(answer) == normalize(task.answer))
    outcome = min(1.0, max(0.0, (satisfied + answer_ok - collateral) / (n + 1)))
    grounding = grounded_uses / max(uses, n + 1)
    if not finished:
        stop = 0.0
    else:
        done, extra = state_at_finish
        base = 1.0 if done >= n and extra == 0 else (0.5 if done > extra else 0.0)
        stop = max(0.0, base - POST_FINISH_PENALTY * post_finish_calls)
    out = {"outcome": outcome, "grounding": grounding, "stop": stop}
    out["total"] = sum(WEIGHTS[k] * out[k] for k in WEIGHTS)
    return out
