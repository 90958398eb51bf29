"""The seeded world: typed records, their relations, and a small BM25 index over fact snippets.

Everything the agent needs is in here and nothing of it is in the prompt: record ids and fact
values are random codes, entity names are drawn from word lists, and distractor records share a
name token with the records the goal is about, so the agent has to search and read to act.
"""
from __future__ import annotations

import math
import random
import re
from collections import Counter
from dataclasses import dataclass, field

from .spec import FACT_FORMATS, ID_PREFIX, UNSET, Relation, SplitSpec

# Two-token names per entity type: (first word list, second word list).
NAME_PARTS = {
    "person": (
        ("Ada", "Bram", "Cleo", "Dario", "Edda", "Femi", "Greta", "Hugo", "Ines", "Joss", "Kaito", "Lena",
         "Milo", "Nadia", "Otto", "Priya", "Quinn", "Rosa", "Soren", "Tamsin", "Uma", "Viggo", "Wren", "Yara"),
        ("Voss", "Okafor", "Lind", "Marsh", "Quill", "Brandt", "Castell", "Dunmore", "Ferris", "Gale", "Holm",
         "Iver", "Juno", "Kessler", "Lowe", "Moreau", "Nyberg", "Orr", "Pike", "Rooke", "Strand", "Thorne"),
    ),
    "team": (
        ("Orion", "Amber", "Cobalt", "Delta", "Ember", "Falcon", "Granite", "Harbor", "Indigo", "Jade", "Kestrel",
         "Lumen", "Meridian", "Nimbus", "Onyx", "Pioneer"),
        ("Forge", "Works", "Circle", "Guild", "Crew", "Unit", "Cell", "Squad", "Desk", "Bureau"),
    ),
    "site": (
        ("North", "South", "East", "West", "Upper", "Lower", "Old", "New", "Port", "High", "Far", "Mill"),
        ("Quay", "Yard", "Campus", "Depot", "Annex", "Tower", "Wharf", "Hall", "Point", "Park"),
    ),
    "vendor": (
        ("Calder", "Brisk", "Cortland", "Dover", "Elgin", "Fenwick", "Garrow", "Hollis", "Ingram", "Jarvis",
         "Kirby", "Larkin", "Merritt", "Norcross"),
        ("Supply", "Trading", "Partners", "Systems", "Goods", "Logistics", "Industries", "Components"),
    ),
    "project": (
        ("Project", "Program", "Initiative", "Operation", "Venture", "Track"),
        ("Bluebird", "Cinder", "Drift", "Echo", "Fathom", "Glacier", "Halcyon", "Ivory", "Juniper", "Keystone",
         "Lantern", "Mosaic", "Nova", "Orchid", "Prism", "Quartz", "Ripple", "Summit"),
    ),
}


@dataclass
class Record:
    id: str
    type: str
    name: str
    facts: dict[str, str]
    slots: dict[str, str]
    relations: dict[str, str]  # navigation relation -> target id (fixed)
    links: list[tuple[str, str]] = field(default_factory=list)  # (relation, target id) added by the agent


@dataclass
class World:
    spec: SplitSpec
    records: dict[str, Record]  # insertion order = generation order (deterministic)
    index: "BM25Index"

    def name_of(self, rid: str) -> str:
        return self.records[rid].name

    def render(self, rid: str) -> str:
        """What `read_record` shows: facts, slot values, relation and link target ids."""
        r = self.records[rid]
        facts = ", ".join(f"{k}={v}" for k, v in r.facts.items())
        # Only slots that hold a value are listed (all start unset; the goal names the slots).
        slots = ", ".join(f"{k}={v}" for k, v in r.slots.items() if v != UNSET) or "none"
        rels = ", ".join(f"{k}={t}" for k, t in r.relations.items())
        lines = [f"{r.id} ({r.type}) {r.name}", f"facts: {facts}", f"slots set: {slots}", f"relations: {rels}"]
        if r.links:
            lines.append("links: " + ", ".join(f"{k}={t}" for k, t in r.links))
        return "\n".join(lines)

    def snippet(self, rid: str) -> str:
        """The search-index text of a record besides its title (the name): type and id. Facts and relations are left to
        `read_record`, so acting on the world takes reading, and search results stay short."""
        r = self.records[rid]
        return f"{r.type}, record {r.id}."


def tokenize(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


class BM25Index:
    """Okapi BM25 over a handful of documents, title tokens counted `title_weight` times (a name
    query must find that record before the records whose snippets merely mention the name).
    Ties break by document order, so results are deterministic. (The worlds are tiny, so a
    dependency-free scorer is simpler than bm25s.)"""

    def __init__(self, doc_ids: list[str], titles: list[str], texts: list[str], k1: float = 1.2,
                 b: float = 0.75, title_weight: int = 3):
        self.doc_ids = doc_ids
        self.tfs = [Counter(tokenize(t) + tokenize(h) * title_weight) for h, t in zip(titles, texts)]
        self.lens = [sum(tf.values()) for tf in self.tfs]
        self.avg_len = sum(self.lens) / max(1, len(self.lens))
        df = Counter(tok for tf in self.tfs for tok in tf)
        n = len(texts)
        self.idf = {tok: math.log(1 + (n - c + 0.5) / (c + 0.5)) for tok, c in df.items()}
        self.k1, self.b = k1, b

    def search(self, query: str, k: int) -> list[str]:
        terms = tokenize(query)
        scored = []
        for i, tf in enumerate(self.tfs):
            s = 0.0
            norm = self.k1 * (1 - self.b + self.b * self.lens[i] / self.avg_len)
            for t in terms:
                if t in tf:
                    s += self.idf[t] * tf[t] * (self.k1 + 1) / (tf[t] + norm)
            if s > 0:
                scored.append((-s, i))
        return [self.doc_ids[i] for _, i in sorted(scored)[:k]]


def _fresh_id(rng: random.Random, etype: str, used: set[str]) -> str:
    while True:
        rid = f"{ID_PREFIX[etype]}-{rng.randint(1000, 9999)}"
        if rid not in used:
            used.add(rid)
            return rid


def _fresh_name(rng: random.Random, etype: str, used: set[str], keep: tuple[int, str] | None = None) -> str:
    """A new unique name; `keep=(position, word)` pins one of the two words (a distractor)."""
    firsts, seconds = NAME_PARTS[etype]
    for _ in range(1000):
        words = [rng.choice(firsts), rng.choice(seconds)]
        if keep is not None:
            words[keep[0]] = keep[1]
        name = " ".join(words)
        if name not in used:
            used.add(name)
            return name
    raise RuntimeError(f"ran out of {etype} names")  # word lists are sized far above world sizes


def build_world(rng: random.Random, spec: SplitSpec, path: list[Relation], distractors: int) -> tuple[World, list[str]]:
    """Generate a world holding a chain of len(path)+1 distinct records linked by `path`.

    Returns the world and the chain's record ids (start first)."""
    used_ids: set[str] = set()
    used_names: set[str] = set()
    types: list[str] = []  # one entry per record, in generation order
    names: list[str] = []

    def add(etype: str, keep=None) -> int:
        types.append(etype)
        names.append(_fresh_name(rng, etype, used_names, keep))
        return len(types) - 1

    chain = [add("person")] + [add(rel.dst_type) for rel in path]
    # Every relation target type needs several candidates so edges are not forced.
    for etype in sorted({"person"} | {rel.dst_type for rel in spec.relations}):
        while types.count(etype) < 3:
            add(etype)
    # Distractors share a name word with a chain record, mostly with the start record (the one
    # the agent must find by name), so a sloppy search-and-take-the-top-hit picks the wrong id.
    for _ in range(distractors):
        target = chain[0] if rng.random() < 0.6 else rng.choice(chain)
        pos = rng.randrange(2)
        add(types[target], keep=(pos, names[target].split(" ")[pos]))

    ids = [_fresh_id(rng, t, used_ids) for t in types]
    by_type: dict[str, list[int]] = {}
    for i, t in enumerate(types):
        by_type.setdefault(t, []).append(i)

    seen_values: dict[str, set[str]] = {f: set() for f in spec.facts}
    records: dict[str, Record] = {}
    for i, (rid, etype, name) in enumerate(zip(ids, types, names)):
        facts = {}
        for f in spec.facts:
            v = FACT_FORMATS[f](rng)
            while v in seen_values[f]:  # unique per fact so an answer identifies one record
                v = FACT_FORMATS[f](rng)
            seen_values[f].add(v)
            facts[f] = v
        rels = {}
        for rel in spec.relations:
            options = [j for j in by_type[rel.dst_type] if j != i]
            rels[rel.name] = ids[rng.choice(options)]
        records[rid] = Record(rid, etype, name, facts, {s: UNSET for s in spec.slots}, rels)
    # Pin the chain edges last (they override the random edge of that relation).
    for hop, rel in enumerate(path):
        records[ids[chain[hop]]].relations[rel.name] = ids[chain[hop + 1]]

    # Shuffle the record order so the chain isn't always first in the index / listings.
    order = list(records)
    rng.shuffle(order)
    records = {rid: records[rid] for rid in order}
    world = World(spec, records, index=None)  # type: ignore[arg-type]
    world.index = BM25Index(order, [records[r].name for r in order], [world.snippet(r) for r in order])
    return world, [ids[c] for c in chain]


def sample_path(rng: random.Random, spec: SplitSpec, hops: int) -> list[Relation]:
    return [rng.choice(spec.relations) for _ in range(hops)]
