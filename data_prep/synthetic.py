"""Seeded synthetic sources for the tests, the benchmark and the CPU demo.

A generated *world* (entities with attributes, one document each) feeds search trajectories,
written in OpenSeeker's and Search-R1's raw formats, and a held-out benchmark over the same world
(`write_synthetic_bench`). Code trajectories are written in R2E-Gym's raw text format (XML
`<function=...>` calls, observations as user turns, a `**Title:**` issue). The readers then run on
these files exactly as on real data.

The world depends only on `world_seed`; which trajectories are drawn depends on `seed`. Questions
are split into train/test pairs by a fixed rule, so the benchmark never asks a trained question.
Defaults are short (the tiny demo model trains on them); the knobs make them realistic-length.
"""
from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from common.fields import is_int
from common.io import write_jsonl
from data_prep.errors import DataPrepError

SYLLABLES = ["ka", "lo", "mi", "ra", "ten", "vor", "sel", "dun", "bri", "hal", "mor", "zen",
             "tal", "ver", "nos", "pel", "gar", "ith", "wen", "cor", "fa", "ul", "bes", "dra"]
KINDS = {
    "city": ["country", "mayor", "river", "founded"],
    "river": ["source", "mouth", "length", "country"],
    "company": ["founder", "headquarters", "founded", "product"],
    "band": ["singer", "genre", "hometown", "formed"],
    "mountain": ["range", "height", "country", "first climber"],
}
GENRES = ["jazz", "folk", "rock", "techno", "opera", "blues"]
PRODUCTS = ["lamps", "boats", "clocks", "shoes", "radios", "bicycles"]
WORDS = ("the a of to in and is it for on with as at by from this that be are was not or an "
         "value list file name path data error result type config parse test check load save "
         "build index item node user time text line state cache table field query model").split()
ERRORS = ["ValueError", "KeyError", "TypeError", "IndexError", "AttributeError"]


@dataclass
class SyntheticConfig:
    """Generator knobs (`data.synthetic.*`)."""

    world_seed: int = 0
    n_entities: int = 200
    doc_filler: int = 0               # extra filler sentences per document (longer tool results)
    search_extra: tuple[int, int] = (0, 1)   # extra (vaguer) searches before the right one
    docs_per_search: int = 3         # = evaluate's default topk
    code_turns: tuple[int, int] = (1, 3)     # tool-using steps before finish
    code_obs_lines: tuple[int, int] = (2, 5)
    code_thought_words: tuple[int, int] = (5, 14)
    long_fraction: float = 0.1        # this share of code trajectories gets 3x the steps
    test_every: int = 5               # every k-th (entity, attribute) pair is held out for the bench
    fact_docs: bool = False           # one document per fact instead of per entity (see _Corpus)


@dataclass
class Entity:
    name: str
    kind: str
    attrs: dict[str, str] = field(default_factory=dict)

    def doc(self, filler: list[str]) -> str:
        facts = " ".join(f"The {a} of {self.name} is {v}." for a, v in self.attrs.items())
        return " ".join([f"{self.name} is a {self.kind}.", facts, *filler])


def _name(rng: random.Random, used: set[str]) -> str:
    while True:
        n = "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()
        if n not in used:
            used.add(n)
            return n


def make_world(cfg: SyntheticConfig) -> list[Entity]:
    rng = random.Random(f"world-{cfg.world_seed}")
    used: set[str] = set()
    people = [f"{_name(rng, used)} {_name(rng, used)}" for _ in range(max(8, cfg.n_entities // 4))]
    places = [_name(rng, used) for _ in range(max(8, cfg.n_entities // 4))]
    ents = []
    for _ in range(cfg.n_entities):
        kind = rng.choice(sorted(KINDS))
        e = Entity(_name(rng, used), kind)
        for a in KINDS[kind]:
            if a in ("mayor", "founder", "singer", "first climber"):
                v = rng.choice(people)
            elif a in ("founded", "formed"):
                v = str(rng.randint(1600, 2020))
            elif a == "length":
                v = f"{rng.randint(50, 4000)} km"
            elif a == "height":
                v = f"{rng.randint(900, 8800)} m"
            elif a == "genre":
                v = rng.choice(GENRES)
            elif a == "product":
                v = rng.choice(PRODUCTS)
            else:
                v = rng.choice(places)
            e.attrs[a] = v
        ents.append(e)
    return ents


def _is_test(e: Entity, attr: str, cfg: SyntheticConfig) -> bool:
    h = int(hashlib.sha256(f"{cfg.world_seed}|{e.name}|{attr}".encode()).hexdigest()[:8], 16)
    return h % cfg.test_every == 0


def question(e: Entity, attr: str) -> str:
    return f"What is the {attr} of {e.name}?"


def _filler(rng: random.Random, k: int) -> list[str]:
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 16))).capitalize() + "." for _ in range(k)]


def _by_kind(ents: list[Entity]) -> dict[str, list[Entity]]:
    out: dict[str, list[Entity]] = {}
    for e in ents:
        out.setdefault(e.kind, []).append(e)
    return out


def _distractors(rng: random.Random, hit: Entity, ents: list[Entity], by_kind: dict, k: int) -> list[Entity]:
    """k other entities, three in four of the same kind as `hit`: what a retriever returns for a
    query naming an attribute, and what forces matching the entity, not just the attribute."""
    out: list[Entity] = []
    while len(out) < k:
        pool = by_kind[hit.kind] if rng.random() < 0.75 and len(by_kind[hit.kind]) > k else ents
        e = pool[rng.randrange(len(pool))]
        if e is not hit and e not in out:
            out.append(e)
    return out


class _Corpus:
    """The world's documents: one per entity (all its facts), or with `fact_docs` one per fact.

    Fact documents make the answer the tail of the retrieved passage, which a model trained from
    scratch (the tiny demo model) learns to copy within minutes; entity documents are the harder,
    more realistic default.
    """

    def __init__(self, ents: list[Entity], cfg: SyntheticConfig):
        frng = random.Random(f"filler-{cfg.world_seed}")
        self.ents = ents
        self.by_kind = _by_kind(ents)
        self.k = cfg.docs_per_search
        self.fact_docs = cfg.fact_docs
        if cfg.fact_docs:
            self.docs = {(e.name, a): f"The {a} of {e.name} is {v}." for e in ents for a, v in e.attrs.items()}
        else:
            self.docs = {(e.name, None): e.doc(_filler(frng, cfg.doc_filler)) for e in ents}
        self.keys = list(self.docs)

    def results(self, rng: random.Random, hit: Entity | None, attr: str | None = None) -> str:
        """Search-R1-style result block: the hit first (when the query names it), then distractors,
        mostly of the hit's kind (as a retriever ranks documents sharing the query's attribute)."""
        if hit is None:
            picks: list[tuple[str, str | None]] = []
            while len(picks) < self.k:
                d = self.keys[rng.randrange(len(self.keys))]
                if d not in picks:
                    picks.append(d)
        else:
            others = _distractors(rng, hit, self.ents, self.by_kind, self.k - 1)
            picks = [(e.name, (attr if attr in e.attrs else sorted(e.attrs)[0]) if self.fact_docs else None)
                     for e in [hit, *others]]
        # Search-R1's layout: the wiki-18 title keeps its quotes (as evals' retriever prints it).
        return "\n".join(f'Doc {i}(Title: "{name}") {self.docs[(name, a)]}' for i, (name, a) in enumerate(picks, 1))

    def corpus_rows(self):
        """wiki-18 rows: `{"id", "contents": "\"Title\"\ntext"}`."""
        for i, ((name, _), text) in enumerate(self.docs.items()):
            yield {"id": str(i), "contents": f'"{name}"\n{text}'}


def _search_steps(e: Entity, attr: str, value: str, corpus: _Corpus, rng: random.Random, cfg: SyntheticConfig):
    """[(thought, query, results)], final thought."""
    steps = []
    for _ in range(rng.randint(*cfg.search_extra)):
        q = f"{attr} {e.kind} {rng.choice(WORDS)}"
        steps.append((f"I need the {attr} of {e.name}. Let me try a broad search first.", q, corpus.results(rng, None)))
    thought = (f"That did not mention {e.name}. I will search for it by name." if steps
               else f"I need the {attr} of {e.name}. I will search for {e.name}.")
    steps.append((thought, f"{e.name} {attr}", corpus.results(rng, e, attr)))
    return steps, f"Doc 1 is about {e.name}. It says the {attr} of {e.name} is {value}."


# OpenSeeker-style system prompts vary by source and version, and evaluate uses its own; a mix of
# phrasings keeps a small model from tying the agent format to one exact system string.
_SYSTEM_PARTS = (
    ("You are a deep research assistant.", "You are a helpful assistant.",
     "You are a research agent that answers questions.", "You are an assistant with a document search tool."),
    ("", " Look facts up before answering.", " You can search as many times as you need.", " Use the tools when they help."),
    ("", " Keep answers short.", " Answer with a short phrase.", " Be precise."),
)


def _search_system(rng: random.Random) -> str:
    return "".join(rng.choice(part) for part in _SYSTEM_PARTS)


def search_rows(n: int, seed: int, cfg: SyntheticConfig) -> tuple[list[dict], list[dict]]:
    """(OpenSeeker rows, Search-R1 rows), n in total, alternating, from training pairs only."""
    ents = make_world(cfg)
    corpus = _Corpus(ents, cfg)
    pairs = [(e, a) for e in ents for a in e.attrs if not _is_test(e, a, cfg)]
    rng = random.Random(f"search-{seed}")
    os_rows, r1_rows = [], []
    for k in range(n):
        e, attr = pairs[rng.randrange(len(pairs))]
        value = e.attrs[attr]
        steps, final = _search_steps(e, attr, value, corpus, rng, cfg)
        q = question(e, attr)
        if k % 2 == 0:
            traj = [{"role": "system", "content": _search_system(rng)}, {"role": "user", "content": q}]
            for thought, query, res in steps:
                call = json.dumps({"name": "search", "arguments": {"query": [query]}})
                traj.append({"role": "assistant", "content": f"<think>\n{thought}\n</think>\n<tool_call>\n{call}\n</tool_call>"})
                traj.append({"role": "user", "content": f"<tool_response>\n{res}\n</tool_response>"})
            traj.append({"role": "assistant", "content": f"<think>\n{final}\n</think>\n<answer>{value}</answer>"})
            os_rows.append({"id": f"synth-os-{seed}-{k}", "question": q, "answer": value,
                            "number of tool calls": len(steps), "trajectory correctness": "Correct", "trajectory": traj})
        else:
            resp = "".join(f"<think>{t}</think>\n<search> {qq} </search>\n\n<information>{res}</information>\n\n" for t, qq, res in steps)
            resp += f"<think>{final}</think>\n<answer> {value} </answer>"
            prompt = ("Answer the given question. Reason inside <think> and </think>, search with <search> query "
                      "</search>, and give the answer inside <answer> and </answer>, e.g. <answer> Beijing </answer>. "
                      f"Question: {q}")
            r1_rows.append({"id": f"synth-r1-{seed}-{k}", "question": q, "golden_answers": [value],
                            "prompt": [{"role": "user", "content": prompt}], "response": resp})
    return os_rows, r1_rows


READING_LAYOUTS = ("docs_question_answer", "question_docs_answer", "question_docs_restate", "json_records")


def reading_items(n: int, seed: int, cfg: SyntheticConfig) -> list[tuple[str, str, str, str]]:
    """Plain-text reading-comprehension passages for pretraining the tiny base (no chat template,
    no tools), as (layout, text before the answer, answer, text after it): a few documents about
    the world, a question about one of them, its answer copied from the text. Layouts vary
    (`READING_LAYOUTS`: documents before or after the question; a bare answer or a sentence that
    restates the fact; or the records as JSON lines with a JSON question/answer), the relevant document sits at any position, documents hold one fact or a
    whole entity, and distractors are mostly entities of the same kind stating the same attribute, so what is
    learned is "find the fact the question names and copy it", not a position or an attribute
    name. Use a world the demo never evaluates on."""
    ents = make_world(cfg)
    by_kind = _by_kind(ents)
    rng = random.Random(f"reading-{seed}")
    items = []
    for _ in range(n):
        hit = ents[rng.randrange(len(ents))]
        picks = [hit, *_distractors(rng, hit, ents, by_kind, rng.randint(0, 3))]
        rng.shuffle(picks)
        attr = rng.choice(sorted(hit.attrs))
        whole = rng.random() < 0.5
        docs = []
        for e in picks:
            a = attr if e is hit or (attr in e.attrs and rng.random() < 0.7) else rng.choice(sorted(e.attrs))
            docs.append(e.doc([]) if whole else f"The {a} of {e.name} is {e.attrs[a]}.")
        block = "\n".join(f"Doc {i}(Title: {e.name}) {d}" for i, (e, d) in enumerate(zip(picks, docs), 1))
        q, v = question(hit, attr), hit.attrs[attr]
        layout = READING_LAYOUTS[rng.randrange(len(READING_LAYOUTS))]
        if layout == "docs_question_answer":
            items.append((layout, f"{block}\nQuestion: {q}\nAnswer: ", v, ""))
        elif layout == "question_docs_answer":
            items.append((layout, f"Question: {q}\n{block}\nThe answer is ", v, "."))
        elif layout == "question_docs_restate":
            items.append((layout, f"{q}\n{block}\nAccording to Doc {picks.index(hit) + 1}, the {attr} of {hit.name} is ", v, "."))
        else:  # the same facts as JSON lines: quotes, braces and key-value structure, as web text has
            recs = "\n".join(json.dumps({"title": e.name, "kind": e.kind, **e.attrs}) for e in picks)
            items.append((layout, f'{recs}\n{{"question": {json.dumps(q)}, "answer": "', v, '"}'))
    return items


def reading_texts(n: int, seed: int, cfg: SyntheticConfig) -> list[str]:
    """`reading_items` as whole passages."""
    return [before + answer + after for _, before, answer, after in reading_items(n, seed, cfg)]


R2E_SYSTEM = """You are a programming agent who is provided a github issue and repository bash environment and is tasked to solve certain tasks to resolve the issue.

We have access to the following functions:

–– BEGIN FUNCTION #1: file_editor ––
Description:
Custom editing tool for viewing, creating and editing files

Parameters:
  1.\tcommand (string, required)
Allowed values: [view, create, str_replace, insert, undo_edit]
  2.\tpath (string, required)
  3.\told_str (string, optional)
  4.\tnew_str (string, optional)
–– END FUNCTION #1 ––

–– BEGIN FUNCTION #2: execute_bash ––
Description:
Execute a bash command in the terminal.

Parameters:
  1.\tcmd (string, required)
–– END FUNCTION #2 ––

–– BEGIN FUNCTION #3: search ––
Description:
Search for a term in a directory or file.

Parameters:
  1.\tsearch_term (string, required)
  2.\tpath (string, optional)
–– END FUNCTION #3 ––

–– BEGIN FUNCTION #4: finish ––
Description:
Finish the interaction when the task is complete.

Parameters:
  1.\tcommand (string, required)
  2.\tresult (string, optional)
–– END FUNCTION #4 ––

If you choose to call a function ONLY reply in the following format with NO suffix:

<function=example_function_name>
  <parameter=example_parameter_1>value_1</parameter>
</function>"""


def _ident(rng: random.Random) -> str:
    return "_".join(rng.choice(WORDS[20:]) for _ in range(rng.randint(1, 3)))


def _code_lines(rng: random.Random, k: int) -> list[str]:
    return [f"{i:6d}\t    {_ident(rng)} = {_ident(rng)}({_ident(rng)}, {rng.randint(0, 99)})" for i in range(1, k + 1)]


def _call(name: str, **params: str) -> str:
    body = "".join(f"  <parameter={k}>{v}</parameter>\n" for k, v in params.items())
    return f"<function={name}>\n{body}</function>"


def code_rows(n: int, seed: int, cfg: SyntheticConfig) -> list[dict]:
    """R2E-Gym SFT rows (`messages` only)."""
    rng = random.Random(f"code-{seed}")
    rows = []
    for k in range(n):
        mod, fn, err = _ident(rng), _ident(rng), rng.choice(ERRORS)
        title = f"{fn}() raises {err} when the {rng.choice(WORDS[20:])} is empty"
        body = " ".join(rng.choice(WORDS) for _ in range(rng.randint(15, 40)))
        user = ("Consider the following github issue:\n<github_issue>\n[ISSUE]\n"
                f"**Title:** {title}\n\n**Description:**\n{body}\n[/ISSUE]\n</github_issue>\n\n"
                "Can you help me implement the necessary changes to the repository to fix the <github_issue>?")
        msgs = [{"role": "system", "content": R2E_SYSTEM}, {"role": "user", "content": user + "\nSteps Remaining: 40"}]
        steps = rng.randint(*cfg.code_turns) * (3 if rng.random() < cfg.long_fraction else 1)
        path = f"/testbed/{mod}.py"
        for s in range(steps):
            thought = " ".join(rng.choice(WORDS) for _ in range(rng.randint(*cfg.code_thought_words))).capitalize() + "."
            lines = "\n".join(_code_lines(rng, rng.randint(*cfg.code_obs_lines)))
            tool = ("file_editor", "execute_bash", "search")[s % 3]
            if tool == "file_editor":
                call = _call("file_editor", command="view", path=path)
                obs = f"Execution output of [file_editor]:\nHere's the result of running `cat -n` on {path}:\n{lines}"
            elif tool == "execute_bash":
                call = _call("execute_bash", cmd=f"python reproduce_{fn}.py")
                obs = f"Exit code: 0\nExecution output of [execute_bash]:\n[STDOUT]\n\n{lines}\n\n[STDERR]\n\n"
            else:
                call = _call("search", search_term=fn, path="/testbed")
                obs = f"Execution output of [search]:\nFound {rng.randint(1, 9)} matches for \"{fn}\" in /testbed:\n{lines}"
            msgs.append({"role": "assistant", "content": f"{thought}\n\n{call}"})
            msgs.append({"role": "user", "content": f"{obs}\nSteps Remaining: {39 - s}"})
        msgs.append({"role": "assistant", "content": "The fix works. Let me submit.\n\n"
                     + _call("finish", command="submit", result=f"Fixed {fn} in {path}.")})
        rows.append({"messages": msgs})
    return rows


def write_sources(out_dir: str | Path, *, seed: int, code_n: int, search_n: int, cfg: SyntheticConfig) -> dict[str, list[str]]:
    """Write raw files; return `sources` specs ({"code": [...], "search": [...]}) for the readers."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    specs: dict[str, list[str]] = {"code": [], "search": []}
    if code_n:
        p = out / "r2e_gym.jsonl"
        write_jsonl(p, code_rows(code_n, seed, cfg))
        specs["code"].append(f"r2e-gym:{p}")
    if search_n:
        os_rows, r1_rows = search_rows(search_n, seed, cfg)
        for fmt, rows in (("openseeker", os_rows), ("search-r1", r1_rows)):
            if rows:
                p = out / f"{fmt.replace('-', '_')}.jsonl"
                write_jsonl(p, rows)
                specs["search"].append(f"{fmt}:{p}")
    return specs


def write_synthetic_bench(out_dir: str | Path, seed: int = 0, n: int = 100, cfg: SyntheticConfig | None = None) -> dict:
    """`<out>/corpus.jsonl` (wiki-18 format) and `<out>/synthqa/test.jsonl` (FlashRAG format):
    held-out questions about the world generated with `world_seed=seed`."""
    cfg = cfg or SyntheticConfig(world_seed=seed)
    ents = make_world(cfg)
    corpus = _Corpus(ents, cfg)
    out = Path(out_dir)
    (out / "synthqa").mkdir(parents=True, exist_ok=True)
    n_docs = write_jsonl(out / "corpus.jsonl", corpus.corpus_rows())
    test = [(e, a) for e in ents for a in e.attrs if _is_test(e, a, cfg)]
    random.Random(f"bench-{seed}").shuffle(test)
    if n > len(test):
        raise DataPrepError(f"only {len(test)} held-out questions in a world of {cfg.n_entities} entities; asked for {n}")
    rows = [{"id": f"synthqa-{i}", "question": question(e, a), "golden_answers": [e.attrs[a]]} for i, (e, a) in enumerate(test[:n])]
    write_jsonl(out / "synthqa" / "test.jsonl", rows)
    return {"corpus": str(out / "corpus.jsonl"), "test": str(out / "synthqa" / "test.jsonl"), "n": len(rows), "docs": n_docs}


def config_from(d: dict | None) -> SyntheticConfig:
    """SyntheticConfig from a `data.synthetic` mapping (checked: `problems`)."""
    if bad := problems(d := dict(d or {})):
        raise DataPrepError("; ".join(bad))
    return SyntheticConfig(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items() if k in SyntheticConfig.__dataclass_fields__})


def problems(d: dict) -> list[str]:
    """One line per bad knob of `data.synthetic` mapping `d`: an unknown one, a value not of its default's kind
    (code_n, search_n: the rows generated per domain), or a world the generator cannot draw from."""
    defaults = {**{k: getattr(SyntheticConfig, k) for k in sorted(SyntheticConfig.__dataclass_fields__)}, "code_n": 0, "search_n": 0}
    if bad := sorted(set(d) - set(defaults)):
        return [f"unknown data.synthetic key(s) {bad}; known: {list(defaults)}"]
    kinds = {k: next(w for t, w in _KNOB_KINDS if isinstance(v, t)) for k, v in defaults.items()}
    if out := [f"data.synthetic.{k}={v!r}: expected {kinds[k][1]}" for k, v in d.items()
               if not kinds[k][0](tuple(v) if isinstance(v, list) else v)]:
        return out
    cfg = SyntheticConfig(**{k: v for k, v in d.items() if k in SyntheticConfig.__dataclass_fields__})
    if cfg.test_every < 2:   # every k-th fact is held out: k=1 leaves nothing to train on
        out.append(f"data.synthetic.test_every={cfg.test_every}: expected an integer >= 2")
    if cfg.n_entities < max(1, cfg.docs_per_search):   # one search returns docs_per_search distinct entities
        out.append(f"data.synthetic.n_entities={cfg.n_entities}: fewer entities than data.synthetic.docs_per_search "
                   f"({cfg.docs_per_search}), or none")
    return out


_KNOB_KINDS = (   # (the default's type, (what a value must pass, what it is)); bool before int
    (bool, (lambda v: isinstance(v, bool), "true or false")),
    (float, (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1, "a share in [0, 1]")),
    (int, (lambda v: is_int(v) and v >= 0, "a non-negative integer")),
    (tuple, (lambda v: isinstance(v, tuple) and len(v) == 2 and all(is_int(x) and x >= 0 for x in v) and v[0] <= v[1],
             "a pair [lo, hi] of non-negative integers, lo <= hi")),
)
