"""Split vocabularies and difficulty knobs.

The two splits share only the machinery: `train` and `ood` use disjoint fact (attribute) types,
slot (writable field) names, navigation relations, link relations, goal templates and chain
lengths, so a model that memorised the train surface cannot pattern-match its way through `ood`.
"""
from __future__ import annotations

import random
import string
from dataclasses import dataclass, field

SPLITS = ("train", "ood")


@dataclass(frozen=True)
class Relation:
    """A navigation relation: every record has exactly one outgoing edge of each such relation."""

    name: str
    dst_type: str
    # How a goal describes "the record reached from {x} by this relation".
    phrase: str


@dataclass(frozen=True)
class Difficulty:
    """Difficulty knobs. `hops` and `writes` are the choices a task draws from (seeded)."""

    hops: tuple[int, ...]
    writes: tuple[int, ...]
    distractors: int = 4


@dataclass(frozen=True)
class SplitSpec:
    name: str
    facts: tuple[str, ...]  # read-only typed attributes, value format per name in FACT_FORMATS
    slots: tuple[str, ...]  # writable fields, every record starts with "unset"
    relations: tuple[Relation, ...]
    link_relations: tuple[str, ...]  # relations a goal may ask the agent to add
    templates: tuple[str, ...]  # goal template ids (see goals.py)
    difficulty: Difficulty = field(default_factory=lambda: Difficulty((1, 2), (1, 2)))


# Value generators per fact type: each produces a value that looks like its siblings but is
# drawn from a space large enough that guessing the right one is hopeless.
def _code(rng: random.Random, prefix: str, n: int) -> str:
    return prefix + "".join(rng.choice(string.ascii_uppercase + string.digits) for _ in range(n))


FACT_FORMATS = {
    # train
    "badge": lambda r: _code(r, "B-", 4),
    "desk": lambda r: f"D{r.randint(1, 9)}-{r.randint(10, 99)}",
    "budget": lambda r: str(r.randrange(1000, 99000, 10)),
    # ood
    "clearance": lambda r: f"L{r.randint(1, 5)}-{_code(r, '', 3)}",
    "locker": lambda r: f"K-{r.randint(100, 999)}",
    "cost_center": lambda r: f"CC{r.randint(1000, 9999)}",
}

UNSET = "unset"

TRAIN = SplitSpec(
    name="train",
    facts=("badge", "desk", "budget"),
    slots=("contact", "note"),
    relations=(
        Relation("member_of", "team", "the team {x} is a member of"),
        Relation("based_at", "site", "the site where {x} is based"),
        Relation("supplied_by", "vendor", "the vendor that supplies {x}"),
    ),
    link_relations=("escalates_to", "backs_up"),
    templates=("define_then_do", "stepwise", "question_first"),
    difficulty=Difficulty(hops=(1, 2), writes=(1, 2), distractors=4),
)

OOD = SplitSpec(
    name="ood",
    facts=("clearance", "locker", "cost_center"),
    slots=("escalation", "handover"),
    relations=(
        Relation("reports_to", "person", "the person {x} reports to"),
        Relation("assigned_to", "project", "the project {x} is assigned to"),
        Relation("sourced_from", "vendor", "the vendor {x} sources from"),
    ),
    link_relations=("succeeds", "mirrors"),
    templates=("trace_handoff", "nested_clause", "checklist"),
    difficulty=Difficulty(hops=(3, 4), writes=(2, 3), distractors=4),
)

SPECS = {"train": TRAIN, "ood": OOD}

ENTITY_TYPES = ("person", "team", "site", "vendor", "project")
ID_PREFIX = {"person": "P", "team": "T", "site": "S", "vendor": "V", "project": "J"}


def get_spec(split: str) -> SplitSpec:
    if split not in SPECS:
        raise ValueError(f"unknown split {split!r}; expected one of {list(SPECS)}")
    return SPECS[split]


# The largest knobs a task can be built with: a chain names its records A..H (goals.LABELS), and past ~20
# distractors the word lists run out of names that share a word with the chain's (world.NAME_PARTS).
MAX_HOPS = 7
MAX_DISTRACTORS = 20


def max_writes(spec: SplitSpec, hops: int) -> int:
    """Distinct writes over a chain of hops + 1 records: each record's slots, and a link of each link relation
    to each other chain record (goals._sample_writes draws from these)."""
    n = hops + 1
    return n * (len(spec.slots) + len(spec.link_relations) * (n - 1))


def whole(name: str, value) -> int:
    """`value` as an int, or ValueError naming the knob: a bool, a fraction or text that is not an integer is no count."""
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = None
    if isinstance(value, bool) or n is None or (n != value and str(n) != str(value).strip()):
        raise ValueError(f"{name}={value!r}: must be a whole number")
    return n


def resolve_difficulty(spec: SplitSpec, hops=None, writes=None, distractors=None) -> Difficulty:
    """The split default with any knob overridden (an int pins it; None keeps the default). ValueError naming
    the knob when it is not a whole number (an int, or a float or text holding one) or no task could be built with it."""
    d = spec.difficulty
    hops, writes, distractors = (None if v is None else whole(k, v) for k, v in (("hops", hops), ("writes", writes), ("distractors", distractors)))

    def pin(name, v, default, hi):
        if v is None:
            return default
        if not 1 <= v <= hi:
            raise ValueError(f"{name}={v}: must be at least 1 and at most {hi}")
        return (v,)

    n_hops = pin("hops", hops, d.hops, MAX_HOPS)
    most = max_writes(spec, min(n_hops))
    if writes is not None and writes > most:
        raise ValueError(f"writes={writes}: a{'n' if spec.name[0] in 'aeiou' else ''} {spec.name} task with {min(n_hops)} "
                         f"hop(s) holds at most {most} distinct writes")
    n_distractors = d.distractors if distractors is None else distractors
    if not 0 <= n_distractors <= MAX_DISTRACTORS:
        raise ValueError(f"distractors={n_distractors}: must be >= 0 and at most {MAX_DISTRACTORS}")
    return Difficulty(hops=n_hops, writes=pin("writes", writes, d.writes, most), distractors=n_distractors)
