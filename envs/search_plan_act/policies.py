"""Scripted pilot policies (no model). Each sees only what an agent sees: the plan as the prompt
states it (`Task.plan`, no ids or values) and the text of tool responses, which it parses.

`genuine` is the oracle planner; the others are the reward hacks the pilot must rank below it.
Every policy acts through `env.call_tool`, exactly like the evaluation harness.
"""
from __future__ import annotations

import random
import re
from typing import Callable

from .env import SearchPlanActEnv
from .goals import Plan
from .spec import FACT_FORMATS

_ID = r"[A-Z]-\d{4}"


def parse_search(text: str) -> list[tuple[str, str]]:
    """[(title, record id)] from a search response."""
    return re.findall(r"Doc \d+\(Title: ([^)]*)\) [^\n]*?record (" + _ID + ")", text)


def parse_record(text: str) -> dict:
    """{"id", "facts": {..}, "relations": {..}} from a read_record response."""
    out = {"id": None, "facts": {}, "relations": {}}
    m = re.match(r"(" + _ID + r") ", text)
    if not m:
        return out
    out["id"] = m.group(1)
    for line in text.splitlines():
        if line.startswith("facts: "):
            out["facts"] = dict(kv.split("=", 1) for kv in line[7:].split(", "))
        elif line.startswith("relations: "):
            out["relations"] = dict(re.findall(r"(\w+)=(" + _ID + ")", line))
    return out


class Step:
    """One scripted tool call plus the short note a trajectory shows before it."""

    def __init__(self, note: str, name: str, arguments: dict):
        self.note, self.name, self.arguments = note, name, arguments


def walk_chain(env: SearchPlanActEnv, plan: Plan, calls: list[Step]) -> list[dict] | None:
    """Search the start record by name, then read along the relation path. Returns the parsed
    chain records (start first), or None if the start record can't be found."""
    def call(note, name, **args):
        calls.append(Step(note, name, args))
        return env.call_tool(name, args)

    hits = parse_search(call(f"Search {plan.start_name}.", "search", query=plan.start_name))
    exact = [rid for title, rid in hits if title == plan.start_name]
    if not exact:
        return None
    chain = [parse_record(call(f"Read {plan.start_name}.", "read_record", record_id=exact[0]))]
    for i, rel in enumerate(plan.path):
        nxt = chain[-1]["relations"].get(rel)
        label = "ABCDEFGH"[i]
        chain.append(parse_record(call(f"Follow {rel} to {label}.", "read_record", record_id=nxt)))
    return chain


def do_writes(env: SearchPlanActEnv, plan: Plan, chain: list[dict], calls: list[Step]) -> None:
    for w in plan.writes:
        x = chain[w.record]["id"]
        if w.kind == "update":
            value = chain[w.source]["facts"][w.fact]
            args = {"record_id": x, "field": w.name, "value": value}
            note = f"Set {x}.{w.name} to the {w.fact} read: {value}."
            calls.append(Step(note, "update_record", args))
            env.call_tool("update_record", args)
        else:
            args = {"source_id": x, "target_id": chain[w.source]["id"], "relation": w.name}
            calls.append(Step(f"Link {x} {w.name} {args['target_id']}.", "link_records", args))
            env.call_tool("link_records", args)


def _finish(env, calls, answer, note="Changes done; finish."):
    calls.append(Step(note, "finish", {"answer": answer}))
    env.call_tool("finish", {"answer": answer})


def genuine(env: SearchPlanActEnv, plan: Plan, rng: random.Random) -> list[Step]:
    """Search the start, read along the chain, write what was read, finish with the read answer."""
    calls: list[Step] = []
    chain = walk_chain(env, plan, calls)
    if chain is None:
        _finish(env, calls, "unknown", "The start record was not found.")
        return calls
    do_writes(env, plan, chain, calls)
    q_idx, q_fact = plan.question
    _finish(env, calls, chain[q_idx]["facts"][q_fact])
    return calls


def reckless_guesser(env, plan, rng):
    """Finds the start id by search, then writes format-plausible values without reading."""
    calls: list[Step] = []
    hits = parse_search(env.call_tool("search", {"query": plan.start_name}))
    ids = [rid for _, rid in hits] or ["P-1000"]
    for w in plan.writes:
        if w.kind == "update":
            env.call_tool("update_record", {"record_id": rng.choice(ids), "field": w.name,
                                            "value": FACT_FORMATS[w.fact](rng)})
        else:
            env.call_tool("link_records", {"source_id": ids[0], "target_id": rng.choice(ids[1:] or ids),
                                           "relation": w.name})
    env.call_tool("finish", {"answer": FACT_FORMATS[plan.question[1]](rng)})
    return calls


def search_spammer(env, plan, rng):
    """Fires many searches, never reads or writes, answers with a code it saw in the results."""
    words = re.findall(r"[A-Za-z]+", " ".join([plan.start_name, *plan.path]))
    seen: list[str] = []
    for _ in range(20):
        text = env.call_tool("search", {"query": " ".join(rng.sample(words, min(2, len(words))))})
        seen += re.findall(_ID, text)
    env.call_tool("finish", {"answer": rng.choice(seen) if seen else "unknown"})
    return []


def never_finisher(env, plan, rng):
    """Does the genuine work but never calls finish; keeps searching until the call budget."""
    calls: list[Step] = []
    chain = walk_chain(env, plan, calls)
    if chain is not None:
        do_writes(env, plan, chain, calls)
    for _ in range(10):
        env.call_tool("search", {"query": plan.start_name})
    return calls


def early_finisher(env, plan, rng):
    """Reads the chain and answers correctly, but finishes before making any required write."""
    calls: list[Step] = []
    chain = walk_chain(env, plan, calls)
    q_idx, q_fact = plan.question
    env.call_tool("finish", {"answer": chain[q_idx]["facts"][q_fact] if chain else "unknown"})
    return calls


def random_caller(env, plan, rng):
    """Random tools with arguments drawn from everything it has seen (plus malformed ones);
    finishes at a random point and may keep calling afterwards."""
    pool = re.findall(r"[A-Za-z0-9_-]+", env.task.prompt)
    names = ["search", "read_record", "update_record", "link_records", "finish"]
    finish_at = rng.randint(3, 20)
    for k in range(rng.randint(finish_at, finish_at + 3)):
        name = "finish" if k == finish_at else rng.choice(names[:4])
        n_args = {"search": 1, "read_record": 1, "update_record": 3, "link_records": 3}.get(name, 1)
        keys = {"search": ["query"], "read_record": ["record_id"], "finish": ["answer"],
                "update_record": ["record_id", "field", "value"],
                "link_records": ["source_id", "target_id", "relation"]}[name]
        args = {key: rng.choice(pool) for key in keys[:n_args]}
        if rng.random() < 0.1:
            args = {keys[0]: rng.randint(0, 99)}  # wrong type
        pool += re.findall(r"[A-Za-z0-9_-]+", env.call_tool(name, args))
    return []


def write_sprayer(env, plan, rng):
    """Reads everything reachable from the start, then writes every seen fact value into every
    named slot of every seen record and links every seen pair with every named relation: all of
    it grounded, some of it right, most of it collateral."""
    hits = parse_search(env.call_tool("search", {"query": plan.start_name}))
    frontier, seen = [rid for _, rid in hits], {}
    while frontier and len(seen) < 8:
        rid = frontier.pop(0)
        if rid not in seen:
            seen[rid] = parse_record(env.call_tool("read_record", {"record_id": rid}))
            frontier += list(seen[rid]["relations"].values())
    values = [v for rec in seen.values() for v in rec["facts"].values()]
    slots = sorted({w.name for w in plan.writes if w.kind == "update"})
    rels = sorted({w.name for w in plan.writes if w.kind == "link"})
    for x in seen:
        for slot in slots:
            for v in rng.sample(values, min(3, len(values))):
                env.call_tool("update_record", {"record_id": x, "field": slot, "value": v})
        for y in seen:
            for rel in rels:
                env.call_tool("link_records", {"source_id": x, "target_id": y, "relation": rel})
    env.call_tool("finish", {"answer": rng.choice(values) if values else "unknown"})
    return []


POLICIES: dict[str, Callable] = {
    "genuine": genuine,
    "reckless_guesser": reckless_guesser,
    "search_spammer": search_spammer,
    "never_finisher": never_finisher,
    "early_finisher": early_finisher,
    "random_caller": random_caller,
    "write_sprayer": write_sprayer,
}
