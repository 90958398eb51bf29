"""Goal templates and task construction.

A task is: a chain of records reached from a named start record by following relations (the
hops), a list of required writes (copy a fact of one chain record into a slot of another, or link
two chain records), and a question (a fact of one chain record). Chain records other than the
start are named only by labels (A, B, ...) defined through relations, so the agent must search for
the start, read it, and follow relation ids. Each split has its own templates (see spec.py).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from .spec import Relation, SplitSpec, get_spec, resolve_difficulty
from .world import World, build_world, sample_path

LABELS = "ABCDEFGH"

INSTRUCTIONS = "Use the tools; ids and values appear only in tool results. Call finish once, when done."


@dataclass(frozen=True)
class Write:
    """One required change. `kind` is "update" (slot of `record` := `fact` of `source`) or
    "link" (link `record` -> `source` with relation `name`). Records are chain indices."""

    kind: str
    record: int
    name: str  # slot (update) or relation (link)
    source: int
    fact: str | None = None


@dataclass(frozen=True)
class Plan:
    """The goal exactly as the prompt states it, in structured form and free of ids and values:
    what a scripted policy may know without touching a tool."""

    start_name: str
    path: tuple[str, ...]  # relation names, hop by hop
    writes: tuple[Write, ...]
    question: tuple[int, str]  # (chain index, fact)


@dataclass
class Task:
    seed: int
    split: str
    template: str
    hops: int
    n_writes: int
    distractors: int
    world: World
    chain: list[str]  # record ids, start first
    plan: Plan
    prompt: str
    answer: str
    # Resolved target changes: ("update", record_id, slot, value) / ("link", src_id, relation, dst_id).
    targets: list[tuple[str, str, str, str]] = field(default_factory=list)


def ref(i: int, start: str) -> str:
    return start if i == 0 else LABELS[i - 1]


# ---- templates: each turns (start name, path, writes, question) into the goal text ----------

def _phrases(start: str, path: list[Relation]) -> list[str]:
    """`A is <phrase of start>`, `B is <phrase of A>`, ..."""
    return [rel.phrase.format(x=ref(i, start)) for i, rel in enumerate(path)]


def _write_lines(start: str, writes: list[Write], upd: str, lnk: str) -> list[str]:
    out = []
    for w in writes:
        X, Y = ref(w.record, start), ref(w.source, start)
        out.append(upd.format(X=X, Y=Y, slot=w.name, fact=w.fact) if w.kind == "update"
                   else lnk.format(X=X, Y=Y, rel=w.name))
    return out


def t_define_then_do(start, path, writes, q):
    defs = [f"{LABELS[i]} be {p}" for i, p in enumerate(_phrases(start, path))]
    todo = _write_lines(start, writes, "set the `{slot}` slot of {X} to the `{fact}` of {Y}",
                        "link {X} to {Y} with relation `{rel}`")
    items = "; ".join(f"{k}) {t}" for k, t in enumerate(todo, 1))
    return (f"Let {', and '.join(defs)}. Tasks: {items}. "
            f"Then finish with the `{q[1]}` of {ref(q[0], start)}.")


def t_stepwise(start, path, writes, q):
    steps = [f"follow the `{rel.name}` relation of {ref(i, start)} to reach {LABELS[i]}" for i, rel in enumerate(path)]
    todo = _write_lines(start, writes, "Update {X}: set `{slot}` to the `{fact}` of {Y}.",
                        "Add a `{rel}` link from {X} to {Y}.")
    return (f"Start at the record of {start}; {', then '.join(steps)}. {' '.join(todo)} "
            f"Finally call finish with the `{q[1]}` of {ref(q[0], start)}.")


def t_question_first(start, path, writes, q):
    defs = [f"{LABELS[i]} is {p}" for i, p in enumerate(_phrases(start, path))]
    todo = _write_lines(start, writes, "copy the `{fact}` of {Y} into the `{slot}` slot of {X}",
                        "record with link_records that {X} `{rel}` {Y}")
    return (f"Question: what is the `{q[1]}` of {ref(q[0], start)}, where {' and '.join(defs)}? "
            f"Before answering: {'; '.join(todo)}.")


def t_trace_handoff(start, path, writes, q):
    trace = start + "".join(f" -{rel.name}-> {LABELS[i]}" for i, rel in enumerate(path))
    todo = _write_lines(start, writes, "write {Y}'s `{fact}` into {X}'s `{slot}`",
                        "connect {X} -> {Y} as `{rel}`")
    items = "; ".join(f"({chr(97 + k)}) {t}" for k, t in enumerate(todo))
    return (f"Handover for {start}. Trace the path {trace}. Required changes: {items}. "
            f"Close the handover by finishing with the `{q[1]}` of {ref(q[0], start)}.")


def t_nested_clause(start, path, writes, q):
    # Defined backwards (last label first), unlike any train template.
    defs = [f"{LABELS[i]} is {p}" for i, p in enumerate(_phrases(start, path))][::-1]
    todo = _write_lines(start, writes, "{X}.{slot} must become {Y}.{fact}",
                        "{X} must gain a `{rel}` link to {Y}")
    return (f"Consider {LABELS[len(path) - 1]}, where {', where '.join(defs)}. "
            f"Make these true: {'; '.join(todo)}. Your answer is {ref(q[0], start)}.{q[1]}.")


def t_checklist(start, path, writes, q):
    steps = [f"{LABELS[i]} = `{rel.name}` of {ref(i, start)}" for i, rel in enumerate(path)]
    steps += _write_lines(start, writes, "in {X}, write `{slot}` := `{fact}` of {Y}",
                          "link {X} => {Y} as `{rel}`")
    steps.append(f"finish(answer = `{q[1]}` of {ref(q[0], start)})")
    body = " ".join(f"Step {k}: {s}." for k, s in enumerate(steps, 1))
    return f"Checklist (start: {start}). {body}"


TEMPLATES = {
    "define_then_do": t_define_then_do,
    "stepwise": t_stepwise,
    "question_first": t_question_first,
    "trace_handoff": t_trace_handoff,
    "nested_clause": t_nested_clause,
    "checklist": t_checklist,
}


# ---- task construction --------------------------------------------------------------------

def _sample_writes(rng: random.Random, spec: SplitSpec, n_chain: int, n: int) -> list[Write]:
    """`n` distinct writes over chain records; the first always targets the last record so the
    whole chain must be walked."""
    writes: list[Write] = []
    keys: set[tuple] = set()
    while len(writes) < n:
        x = n_chain - 1 if not writes else rng.randrange(n_chain)
        y = rng.choice([j for j in range(n_chain) if j != x])
        if rng.random() < 0.6:
            w = Write("update", x, rng.choice(spec.slots), y, rng.choice(spec.facts))
            key = ("update", x, w.name)
        else:
            w = Write("link", x, rng.choice(spec.link_relations), y)
            key = ("link", x, w.name, y)
        if key not in keys:
            keys.add(key)
            writes.append(w)
    return writes


def episode_seeds(seed: int, n: int, stream: str) -> list[int]:
    """n distinct task seeds for a run seed; `stream` (e.g. "train", "eval-ood") keeps the seed
    lists of different uses independent. Deterministic."""
    return random.Random(f"{stream}:{int(seed)}").sample(range(2**31), n)


def task_rng(seed: int, split: str) -> random.Random:
    # A string seed is hashed with SHA-512 by `random`, so it is stable across processes.
    return random.Random(f"search-plan-act:{split}:{int(seed)}")


def build_task(seed: int, split: str = "train", hops=None, writes=None, distractors=None) -> Task:
    """The task fully determined by (seed, split[, knob overrides])."""
    spec = get_spec(split)
    diff = resolve_difficulty(spec, hops, writes, distractors)
    rng = task_rng(seed, split)
    template = rng.choice(spec.templates)
    n_hops = rng.choice(diff.hops)
    n_writes = rng.choice(diff.writes)
    path = sample_path(rng, spec, n_hops)
    world, chain = build_world(rng, spec, path, diff.distractors)
    wlist = _sample_writes(rng, spec, len(chain), n_writes)
    question = (rng.randrange(len(chain)), rng.choice(spec.facts))
    start = world.name_of(chain[0])
    plan = Plan(start, tuple(r.name for r in path), tuple(wlist), question)
    goal = TEMPLATES[template](start, path, wlist, question)
    targets = []
    for w in wlist:
        if w.kind == "update":
            targets.append(("update", chain[w.record], w.name, world.records[chain[w.source]].facts[w.fact]))
        else:
            targets.append(("link", chain[w.record], w.name, chain[w.source]))
    answer = world.records[chain[question[0]]].facts[question[1]]
    return Task(
        seed=int(seed), split=split, template=template, hops=n_hops, n_writes=n_writes,
        distractors=diff.distractors, world=world, chain=chain, plan=plan,
        prompt=f"{INSTRUCTIONS}\nGoal: {goal}", answer=answer, targets=targets,
    )
