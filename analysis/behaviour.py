"""Why EM moved: format vs capability, from the rows evaluate already writes (`<bench>.jsonl`).

Per QA episode (one row):

    well-formed      every turn is a parsable tool call or a final answer: no tool-call parse error
                     (`num_tool_errors` 0), no call answered with an `Error:` (unknown tool, bad
                     arguments), and the episode did not stop on a turn cut at the token limit
                     (`length`, `context_limit`) or on a turn with neither call nor answer (`no_answer`)
    extractable      an extraction rule of evals.extract fired (`extract_rule` != `none`)
    ok               well-formed and extractable: the episode produced an answer in the agent format
    searched         it ran at least one `search` call; search-before-answer = searched and extractable
    finish call      its last assistant turn calls `finish`/`submit` (the dual terminator's call)

Per (checkpoint, bench): p = P(ok), EM|ok (EM over the ok rows), EM|¬ok, the rates above, the
extraction stage and stop reason counts, and format failures by kind.

The decomposition of an arm's EM change from its pre evaluation (the anchor, or an RL run's own step
0) is a two-factor shift-share. With EM = p·EM|ok + (1 − p)·EM|¬ok,

    ΔEM = Δp · EM₀|ok  +  p₁ · ΔEM|ok  +  Δ[(1 − p) · EM|¬ok]
          (format)        (capability)    (rest: answers found outside the agent format)

an identity (exact, no approximation): format is what the change in the share of well-formed,
extractable answers is worth at the pre model's accuracy on them; capability is the change in
accuracy given the format, weighted by the post model's share. The rest is usually ~0 (an episode
without an extractable answer scores EM 0) and is reported so the three parts add up to ΔEM exactly.
When the pre evaluation has no ok row, EM₀|ok is undefined and so is the split (reported as such); the
run's later checkpoints are then also split against its first checkpoint that has an ok row (pre "step N":
what changed after the run first produced the format), beside the undefined row, never in its place.

That aggregate split is one convention among several (format valued at the pre model's accuracy,
the interaction p·EM|ok term given to capability) and it is confounded by selection: when the newly
well-formed episodes are harder items than the old ones, EM|ok falls although no item was lost, and the
split reports a capability loss (and a format share above 1). The **transition table** is the split that
cannot flip sign that way. Each item (per seed) is in one of four states before and after:

    W1 well-formed right   W0 well-formed wrong   M1 malformed right   M0 malformed wrong

(well-formed: `ok` above, a well-formed episode with an extractable answer; right: EM ≥ 0.5). ΔEM is
the exact sum over the 16 transitions of (EM₁ − EM₀) / (items × seeds), grouped into

    well-formed before, now right     W0 → W1   (capability gained)
    newly well-formed and right       M0 → W1   (format gained)
    well-formed before, now wrong     W1 → W0   (capability lost)
    right before, now malformed       W1 → M0   (format lost)
    rest                              every other transition (answers outside the format, partial EM)

net format = the 2nd + 4th, net capability = the 1st + 3rd. A transition only counts where the same item
changed, so an item the model answers before and after is never a loss whatever else changed. Each part
has an interval (`part_intervals`) from the report's one variance model (analysis.variance): a part is
the mean over items × seeds of a per-(item, seed) contribution, so with ≥ 2 seeds its interval is the
crossed items × seeds t interval (covers items and seeds), with one seed the item term alone (covers
items only: seed variance unknown). Pairs whose item ids differ (even with the same count), whose recorded evaluation settings
differ beyond the design, or whose identity is not recorded are refused, the reason shown in the table.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from analysis.errors import AnalysisError
from analysis.collect import json_rows, row_problem

# Stop reasons of a turn that was not a call or an answer (evals.agent's stop reasons).
MALFORMED_STOPS = ("no_answer", "length", "context_limit")
FINISH_CALLS = ("finish", "submit")
FAILURE_KINDS = ("tool_call_parse_error", "tool_call_refused", "no_call_no_answer", "cut_at_token_limit",
                 "context_limit", "max_turns_without_answer", "no_extractable_answer")
_RAW_FINISH = re.compile(r"\"name\"\s*:\s*\"(?:finish|submit)\"")


class MissingField(AnalysisError):
    """Rows without a field the decomposition needs (not rows today's evaluate writes): not decomposed."""

    def __init__(self, message: str, key: str):
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class Episode:
    """What the decomposition needs of one `<bench>.jsonl` row: its id and EM, the extraction rule and stop
    reason, whether it is well-formed, its search calls, whether it ends on a finish call, its failures."""

    id: str
    em: float
    rule: str
    stop: str
    well_formed: bool
    searches: int
    finish_call: bool
    failures: tuple[str, ...]

    @property
    def extractable(self) -> bool:
        return self.rule != "none"

    @property
    def ok(self) -> bool:
        return self.well_formed and self.extractable


def _tool_messages(messages) -> list[dict]:
    return [m for m in messages or [] if isinstance(m, dict) and m.get("role") == "tool"]


def _finish_call(messages) -> bool:
    last = next((m for m in reversed(messages or []) if isinstance(m, dict) and m.get("role") == "assistant"), None)
    if last is None:
        return False
    names = [(c.get("function") or {}).get("name") for c in last.get("tool_calls") or [] if isinstance(c, dict)]
    return any(n in FINISH_CALLS for n in names) or bool(_RAW_FINISH.search(str(last.get("content") or "")))


def episode(row: dict, where: str) -> Episode:
    """One row read; a row missing a field the decomposition needs is an error naming it."""
    for key in ("id", "extract_rule", "stop_reason", "num_tool_errors", "metrics"):
        if key not in row:
            raise MissingField(f"{where}: row has no `{key}` (needed by the behaviour decomposition)", key)
    em = row["metrics"].get("em") if isinstance(row["metrics"], dict) else None
    if not isinstance(em, (int, float)) or isinstance(em, bool) or not math.isfinite(em):
        raise AnalysisError(f"{where}: row {row['id']!r} has no numeric metrics.em")
    messages = row.get("messages")
    tools = _tool_messages(messages)
    refused = sum(str(m.get("content", "")).startswith("Error:") and m.get("name") != "error" for m in tools)
    if messages is None:  # rows without the trajectory: the executed calls are all there is
        searches = int(row.get("num_tool_calls") or 0)
    else:
        searches = sum(m.get("name") == "search" and not str(m.get("content", "")).startswith("Error:") for m in tools)
    rule, stop, parse_errors = str(row["extract_rule"]), str(row["stop_reason"]), int(row["num_tool_errors"])
    failures = []
    if parse_errors:
        failures.append("tool_call_parse_error")
    if refused:
        failures.append("tool_call_refused")
    failures += {"no_answer": ["no_call_no_answer"], "length": ["cut_at_token_limit"],
                 "context_limit": ["context_limit"]}.get(stop, [])
    if stop == "max_turns" and rule == "none":
        failures.append("max_turns_without_answer")
    if rule == "none":
        failures.append("no_extractable_answer")
    well_formed = not parse_errors and not refused and stop not in MALFORMED_STOPS
    return Episode(str(row["id"]), float(em), rule, stop, well_formed, searches, _finish_call(messages), tuple(failures))


def read_episodes(path: Path) -> list[Episode]:
    out = []
    for lineno, row, why in json_rows(path):
        if why:
            raise AnalysisError(f"{path}:{lineno}: not valid JSON ({why})")
        if why := row_problem(row):
            raise AnalysisError(f"{path}:{lineno}: {why}")
        if row.get("skipped_empty_gold"):  # left out of the bench's means by evaluate: left out here too
            continue
        out.append(episode(row, f"{path}:{lineno}"))
    return out


def _mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else math.nan


@dataclass
class Behaviour:
    """One (checkpoint, bench): rates over its episodes."""

    n: int
    em: float
    p_ok: float                  # well-formed and extractable
    em_ok: float                 # EM | ok (NaN when no row is ok)
    em_not_ok: float             # EM | not ok (NaN when every row is ok)
    well_formed: float
    extractable: float
    search_before_answer: float  # searched at least once and then gave an extractable answer
    searches: float              # search calls per episode
    finish_call: float
    rules: dict[str, int] = field(default_factory=dict)
    stops: dict[str, int] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)


def behaviour(episodes: list[Episode]) -> Behaviour:
    ok = [e for e in episodes if e.ok]
    not_ok = [e for e in episodes if not e.ok]
    return Behaviour(
        n=len(episodes), em=_mean(e.em for e in episodes), p_ok=_mean(e.ok for e in episodes),
        em_ok=_mean(e.em for e in ok), em_not_ok=_mean(e.em for e in not_ok),
        well_formed=_mean(e.well_formed for e in episodes), extractable=_mean(e.extractable for e in episodes),
        search_before_answer=_mean(e.searches > 0 and e.extractable for e in episodes),
        searches=_mean(e.searches for e in episodes), finish_call=_mean(e.finish_call for e in episodes),
        rules=dict(sorted(Counter(e.rule for e in episodes).items())),
        stops=dict(sorted(Counter(e.stop for e in episodes).items())),
        failures={k: v for k in FAILURE_KINDS if (v := sum(k in e.failures for e in episodes))},
    )


def bench_behaviour(eval_dir: Path, bench: str) -> Behaviour | None:
    """The behaviour of `bench` in one eval dir; None when it has no rows file or no rows."""
    path = Path(eval_dir) / f"{bench}.jsonl"
    if not path.is_file():
        return None
    episodes = read_episodes(path)
    return behaviour(episodes) if episodes else None


@dataclass(frozen=True)
class Decomposition:
    delta: float       # EM₁ − EM₀
    format: float      # Δp · EM₀|ok
    capability: float  # p₁ · ΔEM|ok
    rest: float        # Δ[(1 − p) · EM|¬ok]
    why_undefined: str | None = None

    @property
    def format_share(self) -> float:
        """The format part's share of ΔEM (NaN when ΔEM is 0 or the split is undefined)."""
        return self.format / self.delta if self.delta and math.isfinite(self.format) else math.nan


def _not_ok_mass(b: Behaviour) -> float:
    return 0.0 if b.p_ok == 1 else (1 - b.p_ok) * b.em_not_ok


def decompose(pre: Behaviour, post: Behaviour) -> Decomposition:
    """The shift-share split of post.em − pre.em (module docstring); the parts add up to it exactly."""
    delta = post.em - pre.em
    if not pre.p_ok > 0:
        return Decomposition(delta, math.nan, math.nan, math.nan,
                             "the pre evaluation has no well-formed, extractable answer (EM₀|ok undefined)")
    fmt = (post.p_ok - pre.p_ok) * pre.em_ok
    cap = post.p_ok * (post.em_ok - pre.em_ok) if post.p_ok > 0 else 0.0
    return Decomposition(delta, fmt, cap, _not_ok_mass(post) - _not_ok_mass(pre))


# ---- the item-paired transition table -----------------------------------------------------------------------

STATES = ("W1", "W0", "M1", "M0")
STATE_NAMES = {"W1": "well-formed right", "W0": "well-formed wrong", "M1": "malformed right",
               "M0": "malformed wrong"}
# The parts of ΔEM (key, label): transitions (pre state, post state) each part sums; "rest" is every other one.
TRANSITION_PARTS = (
    ("capability_gain", "well-formed before, now right", (("W0", "W1"),)),
    ("format_gain", "newly well-formed and right", (("M0", "W1"),)),
    ("capability_loss", "well-formed before, now wrong", (("W1", "W0"),)),
    ("format_loss", "right before, now malformed", (("W1", "M0"),)),
)
PART_KEYS = ("delta", "capability_gain", "format_gain", "capability_loss", "format_loss", "rest", "net_format",
             "net_capability")


def state(e: Episode) -> str:
    """W/M: well-formed with an extractable answer (`ok`) or not; 1/0: right (EM ≥ 0.5) or not."""
    return ("W" if e.ok else "M") + ("1" if e.em >= 0.5 else "0")


def part_of(pre_state: str, post_state: str) -> str:
    return next((key for key, _, moves in TRANSITION_PARTS if (pre_state, post_state) in moves), "rest")


@dataclass
class TransitionSplit:
    """One (arm, step, bench, pre): the 4 × 4 transition counts and contributions summed over its seeds'
    items, each part of ΔEM with its interval (`parts[key] = (estimate, lo, hi)`) and what it covers."""

    n_items: int
    seeds: tuple[int, ...]
    pre_em: float
    post_em: float
    counts: dict[tuple[str, str], int]
    contributions: dict[tuple[str, str], float]
    parts: dict[str, tuple[float, float, float]]
    covers: str
    method: str = "crossed t"   # or "Tango score": one seed, 0/1 EM; or MIXED_METHOD (part_intervals)

    @property
    def delta(self) -> float:
        return self.parts["delta"][0]


def ids_problem(pre: list[Episode], post: list[Episode]) -> str | None:
    """Why two evaluations of a bench are not over the same items (None when they are): the id sets differ,
    even with the same count, or an id repeats."""
    a, b = [e.id for e in pre], [e.id for e in post]
    if len(set(a)) != len(a) or len(set(b)) != len(b):
        return "an item id repeats within one evaluation: not paired"
    only_pre, only_post = set(a) - set(b), set(b) - set(a)
    if only_pre or only_post:
        return (f"item ids differ (pre n={len(a)}, post n={len(b)}; {len(only_pre)} only in pre, {len(only_post)} "
                f"only in post, e.g. {sorted(only_pre or only_post)[0]!r}): not paired")
    return None


def part_intervals(contrib, conf: float = 0.95) -> tuple[dict, str, str]:
    """Each part's interval under the report's one variance model (analysis.variance): a part is the mean over
    items × seeds of a per-(item, seed) contribution, so with ≥ 2 seeds it is the crossed items × seeds
    model's t interval on Satterthwaite df (covers items and seeds); with one seed the item term alone
    (covers items only: seed variance unknown), and where every contribution is -1, 0 or +1 (0/1 EM) Tango's
    score interval from the items gained and lost (the t over few changed items covered 0.87 at 95%), also for seeds
    whose contributions to a part agree on every item (no seed variance to show: one seed for that part's interval,
    whatever the seeds do in the other parts). A part no item took gets exact bounds. Returns ({part index: (est,
    lo, hi)}, what it covers, the method: MIXED_METHOD where some parts are Tango's and some the t)."""
    import numpy as np

    from analysis.variance import COVERS_BOTH, COVERS_ITEMS, Term, crossed_parts, discordant_limits, exact_bounds, limits

    c = np.moveaxis(np.asarray(contrib, dtype=float), 2, 0)   # parts × items × seeds
    parts = crossed_parts([[Term("post − pre", 1.0, c)]])
    # per part: seeds that agree on every item count as one
    tango = ~np.ptp(c, axis=2).any(axis=1) & np.isin(c, (-1.0, 0.0, 1.0)).all(axis=(1, 2))
    if c.shape[1] < 2:   # one item: no item variance, a bare point
        lo = hi = np.full(c.shape[0], np.nan)
    else:
        lo, hi = limits(parts, conf)
        if tango.any():
            lo[tango], hi[tango] = discordant_limits(c[tango][..., 0], conf)
        for k in np.flatnonzero(parts.var < 1e-24):   # a part no item took (all 0): exact bounds, not zero width
            lo[k], hi[k] = exact_bounds([[Term("part", 1.0, c[k])]], [1.0], conf) or (np.nan, np.nan)
    out = {k: (float(parts.est[k]), float(lo[k]), float(hi[k])) for k in range(c.shape[0])}
    method = "Tango score" if tango.all() else "crossed t" if not tango.any() else MIXED_METHOD
    return out, COVERS_ITEMS if parts.seeds_unknown else COVERS_BOTH, method


MIXED_METHOD = "crossed t, Tango score where the seeds agree"   # seeds that differ in some parts only


def transition_split(pairs: list[tuple[int, list[Episode], list[Episode]]], conf: float = 0.95) -> TransitionSplit:
    """The transition table of (seed, pre episodes, post episodes) pairs over one item set (`ids_problem` of
    every pair and of the seeds among themselves None: checked by the caller). ΔEM is the exact sum of the
    contributions: Σ over items × seeds of (EM₁ − EM₀) / (items × seeds)."""
    import numpy as np

    ids = sorted(e.id for e in pairs[0][2])
    index = {i: k for k, i in enumerate(ids)}
    n, n_seeds = len(ids), len(pairs)
    contrib = np.zeros((n, n_seeds, len(PART_KEYS)))
    counts: Counter = Counter()
    sums: dict[tuple[str, str], float] = {}
    pre_em = post_em = 0.0
    for s, (_, pre, post) in enumerate(pairs):
        before = {e.id: e for e in pre}
        for e in post:
            b = before[e.id]
            move = (state(b), state(e))
            d = e.em - b.em
            counts[move] += 1
            sums[move] = sums.get(move, 0.0) + d / (n * n_seeds)
            k = index[e.id]
            part = part_of(*move)
            contrib[k, s, PART_KEYS.index("delta")] = d
            contrib[k, s, PART_KEYS.index(part)] = d
            if part in ("format_gain", "format_loss"):
                contrib[k, s, PART_KEYS.index("net_format")] = d
            elif part in ("capability_gain", "capability_loss"):
                contrib[k, s, PART_KEYS.index("net_capability")] = d
            pre_em += b.em / (n * n_seeds)
            post_em += e.em / (n * n_seeds)
    limits, covers, method = part_intervals(contrib, conf)
    return TransitionSplit(n, tuple(sd for sd, _, _ in pairs), pre_em, post_em,
                           {m: counts[m] for m in sorted(counts)}, {m: sums[m] for m in sorted(sums)},
                           {key: limits[k] for k, key in enumerate(PART_KEYS)}, covers, method)


@dataclass
class TransitionRow:
    """One arm × step × bench against one pre ("anchor" | "step 0" | "step N"): its split, or why refused."""

    arm: str
    step: int
    bench: str
    pre_source: str
    identity: str                  # "<pre fingerprint> → <post fingerprint>"
    split: TransitionSplit | None
    refused: str | None = None


# ---- per run: the final checkpoint against its pre evaluation, as a table, a figure and a CSV -------------

@dataclass
class Point:
    """One run × step × bench (`identity`: its evaluation identity's fingerprint prefix), with its pre
    evaluation (`pre_source`: "anchor" | "step 0") and the split between them."""

    arm: str
    seed: int
    step: int
    bench: str
    identity: str
    pre_source: str
    b: Behaviour
    pre: Behaviour
    split: Decomposition

    @property
    def run(self) -> str:
        return f"{self.arm}/seed{self.seed}"


@dataclass
class Decomposed:
    """Every split point of an analysis, the transition rows, and what could not be split (and why)."""

    points: list[Point] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # "who × bench" -> why it was not decomposed
    transitions: list[TransitionRow] = field(default_factory=list)

    def finals(self) -> list[Point]:
        """Each run × bench × pre evaluation at its final evaluated step."""
        last: dict[tuple[str, str, str], Point] = {}
        for p in self.points:
            key = (p.run, p.bench, p.pre_source)
            if key not in last or p.step > last[key].step:
                last[key] = p
        return list(last.values())

    def final_transitions(self) -> list[TransitionRow]:
        """Each arm × bench × pre at its final step with a split, and every refused row."""
        last: dict[tuple[str, str, str], TransitionRow] = {}
        for r in self.transitions:
            key = (r.arm, r.bench, r.pre_source)
            if r.split is not None and (key not in last or r.step > last[key].step):
                last[key] = r
        return sorted(list(last.values()) + [r for r in self.transitions if r.split is None],
                      key=lambda r: (r.arm, r.bench, r.step, r.split is None, r.refused or ""))


UNRECORDED = "unrecorded"


def identity_label(eval_dir: Path, bench: str) -> str:
    """The bench's evaluation-identity fingerprint in `eval_dir/meta.json`, shortened (or "unrecorded")."""
    from analysis.discover import read_json_object

    record = ((read_json_object(Path(eval_dir) / "meta.json", []) or {}).get("identities") or {}).get(bench)
    fp = record.get("fingerprint") if isinstance(record, dict) else None
    return str(fp)[:10] if fp else UNRECORDED


def load_episodes(eval_dir: Path, bench: str, who: str, dec: Decomposed) -> list[Episode] | None:
    """The bench's episodes in one eval dir (None: no rows file, no rows, unreadable, or a bench its summary.json
    gives no score, e.g. one whose items never generated a token: its rows are no behaviour of the model's), with
    what can't be read recorded on `dec`: rows lacking a field the decomposition needs, and benches without a score,
    under `skipped` (shown beside the table), anything else wrong under `problems`."""
    from analysis.collect import eval_no_score, qa_label

    path = Path(eval_dir) / f"{bench}.jsonl"
    if not path.is_file():
        return None
    if why := eval_no_score(eval_dir, bench):
        dec.skipped[f"{who} × {qa_label(bench)}"] = f"no score: {why}"
        return None
    try:
        return read_episodes(path) or None
    except MissingField as exc:
        dec.skipped[f"{who} × {qa_label(bench)}"] = f"rows without `{exc.key}` (an older evaluate's?)"
    except AnalysisError as exc:
        dec.problems.append(str(exc))
    return None


def load_behaviour(eval_dir: Path, bench: str, who: str, dec: Decomposed) -> Behaviour | None:
    """`bench_behaviour`, with what it can't read recorded on `dec` (`load_episodes`)."""
    episodes = load_episodes(eval_dir, bench, who, dec)
    return behaviour(episodes) if episodes else None


def _group_transitions(groups: dict, out: Decomposed, conf: float) -> None:
    """One transition row per (arm, step, bench, pre) over its seeds that share the first seed's item ids."""
    for (arm, step, bench, source), members in sorted(groups.items(), key=lambda kv: kv[0]):
        first, kept = members[0], []
        for m in members:
            seed, pre_eps, post_eps, pre_ident, ident = m
            why = ids_problem(first[2], post_eps)
            if why:
                out.transitions.append(TransitionRow(arm, step, bench, source, f"{pre_ident} → {ident}", None,
                                                     f"seed {seed}: against seed {first[0]}'s items: {why}"))
            else:
                kept.append(m)
        if not kept:
            continue
        ident = (", ".join(dict.fromkeys(m[3] for m in kept)) + " → " + ", ".join(dict.fromkeys(m[4] for m in kept)))
        out.transitions.append(TransitionRow(arm, step, bench, source, ident,
                                             transition_split([m[:3] for m in kept], conf)))


def decompose_runs(runs, anchor_dir: Path | None, benches: list[str], *, conf: float = 0.95) -> Decomposed:
    """Every evaluated step (> 0) of every run × QA bench against its pre evaluation (an RL run's own step
    0, else the anchor): the aggregate split per run (`points`) and the transition table per arm × step
    (`transitions`, the seeds pooled); where that pre has no ok row (the aggregate split undefined), also
    every later step against the run's first checkpoint with one (pre "step N", aggregate only). A pair
    without a recorded identity, whose recorded identities differ beyond the design (analysis.prepost's
    rule) or whose item ids differ is refused: listed as a problem and as a refused transition row."""
    from analysis.prepost import identity_problem

    out = Decomposed()
    cache: dict[tuple[Path, str], list[Episode] | None] = {}
    groups: dict[tuple[str, int, str, str], list] = {}

    def load(d: Path, bench: str, who: str) -> list[Episode] | None:
        if (d, bench) not in cache:
            cache[(d, bench)] = load_episodes(d, bench, who, out)
        return cache[(d, bench)]

    def split_against(run, label: str, bench: str, pre_dir: Path, pre_eps: list[Episode], source: str,
                      steps: list[int]):
        pre = behaviour(pre_eps)
        for step in steps:
            if (post_eps := load(run.evals[step], bench, label)) is None:
                continue
            b = behaviour(post_eps)
            ident, pre_ident = identity_label(run.evals[step], bench), identity_label(pre_dir, bench)
            rule = "anchor" if source == "anchor" else "step 0"   # a run's own checkpoints differ only in the weights
            why = identity_problem(pre_dir, run.evals[step], bench, rule) or ids_problem(pre_eps, post_eps)
            if why:
                out.problems.append(f"behaviour: {label} step {step} × {bench}: {why}")
                if source in ("anchor", "step 0"):
                    out.transitions.append(TransitionRow(run.arm, step, bench, source, f"{pre_ident} → {ident}", None,
                                                         f"seed {run.seed}: {why}"))
                continue
            out.points.append(Point(run.arm, run.seed, step, bench, ident, source, b, pre, decompose(pre, b)))
            if source in ("anchor", "step 0"):
                groups.setdefault((run.arm, step, bench, source), []).append(
                    (run.seed, pre_eps, post_eps, pre_ident, ident))

    for run in runs:
        label = f"{run.arm}/seed{run.seed}"
        own_start = 0 in run.evals
        pre_dir = run.evals[0] if own_start else anchor_dir
        source = "step 0" if own_start else "anchor"
        steps = sorted(s for s in run.evals if s > 0)
        for bench in benches:
            if pre_dir is None or (pre_eps := load(pre_dir, bench, "anchor" if source == "anchor" else label)) is None:
                continue
            split_against(run, label, bench, pre_dir, pre_eps, source, steps)
            if behaviour(pre_eps).p_ok > 0:
                continue
            first = next((s for s in steps if (e := load(run.evals[s], bench, label)) is not None
                          and behaviour(e).p_ok > 0), None)
            if first is not None:
                split_against(run, label, bench, run.evals[first], cache[(run.evals[first], bench)], f"step {first}",
                              [s for s in steps if s > first])
    _group_transitions(groups, out, conf)
    return out


def _f(x: float, signed: bool = False) -> str:
    if not math.isfinite(x):
        return "–"
    return f"{x:+.3f}" if signed else f"{x:.3f}"


def _counts(d: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items()) or "–"


def without_rows(table, dec: Decomposed):
    """`table`, given one row saying why where it has none: what was not decomposed and why (`dec.skipped`), the
    pairs refused, or that no run × QA bench has rows at both its pre evaluation and a later step."""
    from analysis.tables import DASH, dash

    if table.rows:
        return table
    why = ["not decomposed: " + "; ".join(f"{k}: {v}" for k, v in sorted(dec.skipped.items()))] if dec.skipped else []
    if refused := sum(r.split is None for r in dec.transitions):
        why.append(f"{refused} pair{'s' if refused > 1 else ''} refused (the transitions table and the problems say why)")
    why = why or ["no run × QA bench has rows at both its pre evaluation (the anchor or the run's step 0) and a later step"]
    table.rows.append((DASH, [dash("no rows: " + "; ".join(why))] + [DASH] * (len(table.columns) - 1)))
    return table


DECOMPOSITION_COLUMNS = ["bench (context mode)", "identity", "n", "well-formed", "search→answer", "searches/ep",
                         "finish call", "p(ok) pre→post", "EM|ok pre→post", "ΔEM", "format Δp·EM₀|ok",
                         "capability p₁·ΔEM|ok", "rest", "format share"]
STAGE_COLUMNS = ["bench (context mode)", "identity", "n", "extraction stage", "stop reason", "format failures"]


def decomposition_tables(dec: Decomposed, anchor: dict[str, Behaviour], anchor_identity: dict[str, str]):
    """(the decomposition table, the extraction-stage table), at each run's final evaluated step."""
    from analysis.collect import qa_label
    from analysis.tables import Column, Table

    caption = ("Aggregate format vs capability split at each run's final checkpoint, per QA bench (context mode) and "
               "evaluation identity: ΔEM = Δp·EM₀|ok + p₁·ΔEM|ok + Δ[(1−p)·EM|¬ok], p = share of well-formed "
               "episodes with an extractable answer; pre is the anchor (SFT arms) or the run's own step 0 (RL), and "
               "where that pre has no ok episode (split undefined) also the run's first checkpoint with one (pre: "
               "step N). Rates of the post checkpoint; the three parts add up to ΔEM exactly (analysis/behaviour.py). "
               "Convention: format valued at the pre model's EM|ok, the interaction given to capability. Caveat: "
               "not item-paired, so confounded by selection (newly well-formed episodes on harder items read as a "
               "capability loss, a format share above 1); the transition table is the item-paired split. No "
               "interval.")
    if dec.skipped:
        caption += " Not decomposed: " + "; ".join(f"{k}: {v}" for k, v in sorted(dec.skipped.items())) + "."
    main = Table(caption, [Column("", "", c, "") for c in DECOMPOSITION_COLUMNS], row_header="Run")
    stages = Table("Extraction stage that fired (evals/extract.py RULES), stop reason and format failures by kind "
                   "(an episode may have several), per evaluation; counts of episodes.",
                   [Column("", "", c, "") for c in STAGE_COLUMNS], row_header="Evaluation")
    for bench, b in anchor.items():
        stages.rows.append(("anchor", [qa_label(bench), anchor_identity.get(bench, "unrecorded"), str(b.n),
                                       _counts(b.rules), _counts(b.stops), _counts(b.failures)]))
    staged = set()
    for p in sorted(dec.finals(), key=lambda p: (p.arm, p.seed, p.bench, p.pre_source.startswith("step "), p.pre_source)):
        b, s = p.b, p.split
        share = _f(s.format_share) if math.isfinite(s.format_share) else "–"
        main.rows.append((f"{p.run} @{p.step} (pre: {p.pre_source})", [
            qa_label(p.bench), p.identity, str(b.n), _f(b.well_formed), _f(b.search_before_answer),
            f"{b.searches:.2f}", _f(b.finish_call), f"{_f(p.pre.p_ok)}→{_f(b.p_ok)}", f"{_f(p.pre.em_ok)}→{_f(b.em_ok)}",
            _f(s.delta, True), _f(s.format, True) if s.why_undefined is None else f"– ({s.why_undefined})",
            _f(s.capability, True), _f(s.rest, True), share]))
        if (p.run, p.bench, p.step) not in staged:   # one row per evaluation, whichever pre it was split against
            staged.add((p.run, p.bench, p.step))
            stages.rows.append((f"{p.run} @{p.step}", [qa_label(p.bench), p.identity, str(b.n), _counts(b.rules),
                                                      _counts(b.stops), _counts(b.failures)]))
    return without_rows(main, dec), without_rows(stages, dec)


TRANSITION_COLUMNS = ["bench (context mode)", "identity (pre → post)", "seeds × items", "EM pre→post", "ΔEM",
                      *(label for _, label, _ in TRANSITION_PARTS), "rest", "net format", "net capability",
                      "interval", "interval covers"]


def _part_cell(split: TransitionSplit, key: str, count: int | None = None) -> str:
    est, lo, hi = split.parts[key]
    return f"{est:+.3f} [{lo:+.3f}, {hi:+.3f}]" + ("" if count is None else f" ({count})")


def transition_table(dec: Decomposed, conf: float = 0.95):
    """The item-paired transition table: per arm × bench × pre at the final step (seeds pooled), ΔEM and its
    parts with their intervals and the number of item-seed transitions in each; refused pairs with the
    reason."""
    from analysis.collect import qa_label
    from analysis.figures import COVERS_WORDS
    from analysis.tables import Column, Table

    caption = ("Item-paired transitions at each arm's final checkpoint, per QA bench (context mode): every item "
               "(per seed) goes from {well-formed right, well-formed wrong, malformed right, malformed wrong} "
               "before to one of them after (well-formed: a well-formed episode with an extractable answer; right: "
               "EM ≥ 0.5); ΔEM is the exact sum of the parts, each Σ(EM₁ − EM₀)/(items × seeds) over its "
               "transitions: well-formed before, now right (W0→W1); newly well-formed and right (M0→W1); "
               "well-formed before, now wrong (W1→W0); right before, now malformed (W1→M0); rest (every other "
               "transition: answers outside the format). Net format = M0→W1 + W1→M0, net capability = W0→W1 + "
               f"W1→W0. In brackets the {conf:.0%} interval of each part over the item and seed populations, its "
               "method in the interval column: crossed t = the report's crossed items × seeds model, t on "
               "Satterthwaite df (n = items × seeds); Tango score = Tango's (1998) score interval for paired "
               "proportions from the item transitions of the part's sign (one seed, or seeds that agree on every item, "
               f"0/1 EM: the t over few changed items undercovers; {MIXED_METHOD}: the seeds differ in some parts only, "
               "each part whose seeds agree on every item gets Tango's); a part no item took gets exact bounds. The last column "
               "says what it covers: items and seeds where the arm has ≥ 2 seeds, items only with one seed (seed "
               "variance unknown). In parentheses the number of item-seed transitions. pre: the anchor (SFT arms) or "
               "the run's own step 0 (RL). A refused pair (item ids or "
               "recorded settings differ, or no recorded identity) is shown with the reason, never split.")
    table = Table(caption, [Column("", "", c, "") for c in TRANSITION_COLUMNS], row_header="Arm")
    for r in dec.final_transitions():
        label = f"{r.arm} @{r.step} (pre: {r.pre_source})"
        if r.split is None:
            table.rows.append((label, [qa_label(r.bench), r.identity] + [DASH_CELL] * 3
                               + [f"refused: {r.refused}"] + [DASH_CELL] * (len(TRANSITION_COLUMNS) - 6)))
            continue
        sp = r.split
        counts = {key: sum(sp.counts.get(m, 0) for m in moves) for key, _, moves in TRANSITION_PARTS}
        moving = sum(c for (a, b), c in sp.counts.items() if part_of(a, b) == "rest" and a[1] != b[1])
        table.rows.append((label, [
            qa_label(r.bench), r.identity, f"{len(sp.seeds)} × {sp.n_items}", f"{sp.pre_em:.3f}→{sp.post_em:.3f}",
            _part_cell(sp, "delta"), *(_part_cell(sp, key, counts[key]) for key, _, _ in TRANSITION_PARTS),
            _part_cell(sp, "rest", moving), _part_cell(sp, "net_format"), _part_cell(sp, "net_capability"),
            sp.method, COVERS_WORDS.get(sp.covers, sp.covers)]))
    return without_rows(table, dec)


DASH_CELL = "–"
TRANSITION_CSV = ["arm", "step", "bench", "pre_source", "identity", "seeds", "n_items", "pre_em", "post_em",
                  *(f"{k}{suffix}" for k in PART_KEYS for suffix in ("", "_lo", "_hi")), "interval", "interval_covers",
                  *(f"n_{a}_{b}" for a in STATES for b in STATES), *(f"em_{a}_{b}" for a in STATES for b in STATES),
                  "refused"]


def write_transitions_csv(dec: Decomposed, path: Path) -> Path:
    """Every arm × step × bench × pre (not only the final ones): parts with limits, the 16 transition counts
    and contributions, or the refusal."""
    import pandas as pd

    rows = []
    for r in dec.transitions:
        sp = r.split
        if sp is None:
            rows.append([r.arm, r.step, r.bench, r.pre_source, r.identity] + [None] * (len(TRANSITION_CSV) - 6)
                        + [r.refused])
            continue
        rows.append([r.arm, r.step, r.bench, r.pre_source, r.identity, " ".join(map(str, sp.seeds)), sp.n_items,
                     sp.pre_em, sp.post_em, *(v for k in PART_KEYS for v in sp.parts[k]), sp.method, sp.covers,
                     *(sp.counts.get((a, b), 0) for a in STATES for b in STATES),
                     *(sp.contributions.get((a, b), 0.0) for a in STATES for b in STATES), None])
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows, columns=TRANSITION_CSV).to_csv(path, index=False)
    return path


CSV_COLUMNS = ["arm", "seed", "step", "bench", "identity", "pre_source", "n", "em", "p_ok", "em_ok", "em_not_ok",
               "well_formed", "extractable", "search_before_answer", "searches", "finish_call", "pre_em", "pre_p_ok",
               "pre_em_ok", "delta_em", "format", "capability", "rest", "rules", "stops", "failures"]


def write_csv(dec: Decomposed, path: Path) -> Path:
    """Every checkpoint × bench (not only the final ones), one line each."""
    import pandas as pd

    rows = []
    for p in dec.points:
        b, s = p.b, p.split
        rows.append([p.arm, p.seed, p.step, p.bench, p.identity, p.pre_source, b.n, b.em, b.p_ok, b.em_ok, b.em_not_ok,
                     b.well_formed, b.extractable, b.search_before_answer, b.searches, b.finish_call, p.pre.em,
                     p.pre.p_ok, p.pre.em_ok, s.delta, s.format, s.capability, s.rest, _counts(b.rules),
                     _counts(b.stops), _counts(b.failures)])
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows, columns=CSV_COLUMNS).to_csv(path, index=False)
    return path


PARTS = (("net_format", "net format (M0→W1 + W1→M0)"), ("net_capability", "net capability (W0→W1 + W1→W0)"),
         ("rest", "rest"))


def decomposition_caption(finals: list[TransitionRow], conf: float) -> str:
    """The decomposition figure's caption: what the bars are, and what the ΔEM diamond's interval covers and its method."""
    from analysis.figures import COVERS_WORDS

    methods = {"crossed t": "the crossed t on Satterthwaite df", "Tango score": "Tango's score interval for paired proportions",
               MIXED_METHOD: "the crossed t on Satterthwaite df, or Tango's score interval where the seeds agree on every item"}
    covers = "; or ".join(sorted({f"{COVERS_WORDS.get(r.split.covers, r.split.covers)}, by {methods[r.split.method]}" for r in finals}))
    return ("ΔEM from each arm's pre evaluation (the anchor, or an RL run's step 0) at its final "
            "checkpoint (the last step any of its seeds was evaluated at), the seeds evaluated at that step pooled (under "
            "each bar, of the arm's seeds), split by the item-paired transition table: net format "
            "(newly well-formed and right, minus right before and now malformed), net capability "
            "(well-formed before and now right, minus well-formed before and now wrong) and the rest; "
            f"the diamond is ΔEM with its {conf:.0%} interval, covering {covers}.")


def plot_decomposition(dec: Decomposed, out_stem: Path, conf: float = 0.95, arm_seeds: dict[str, int] | None = None):
    """One panel per QA bench: per arm (the seeds evaluated at its final step pooled) stacked bars of the transition
    table's net format, net capability and rest, with ΔEM as a black diamond and its interval; under each bar the
    step and the seeds pooled, `k of N seeds` where fewer than the arm's `arm_seeds[arm]`. Returns
    analysis.figures.FigureInfo."""
    import matplotlib.pyplot as plt
    import numpy as np

    from analysis.collect import qa_label
    from analysis.figures import OKABE_ITO, PANEL_HEIGHT_IN, RC, FigureInfo, _layout, save_figure, sort_arms

    finals = [r for r in dec.final_transitions() if r.split is not None]
    benches = list(dict.fromkeys(r.bench for r in sorted(finals, key=lambda r: r.bench)))
    out_stem = Path(out_stem)
    out_stem.parent.mkdir(parents=True, exist_ok=True)
    titles = [qa_label(b) for b in benches]
    info = FigureInfo(paths=[], panels=titles)
    colours = {"net_format": OKABE_ITO["orange"], "net_capability": OKABE_ITO["blue"], "rest": OKABE_ITO["yellow"]}
    rows, cols, width = _layout(max(1, len(benches)))
    with plt.rc_context(RC):
        fig, axes = plt.subplots(rows, cols, figsize=(width, PANEL_HEIGHT_IN * rows + 0.35), squeeze=False)
        for ax, bench, title in zip(axes.flat, benches, titles):
            # a bar per arm × pre: an arm whose seeds split against different pre evaluations (one seed's own
            # step 0, another's the anchor) has a row for each in the transition table, and a bar for each here
            rows_here = {(r.arm, r.pre_source): r for r in finals if r.bench == bench}
            order = sort_arms({a for a, _ in rows_here})
            keys = sorted(rows_here, key=lambda k: (order.index(k[0]), k[1]))
            twice = {a for a, _ in keys if sum(b == a for b, _ in keys) > 1}
            here = {f"{a} (pre: {src})" if a in twice else a: rows_here[(a, src)] for a, src in keys}
            arms = list(here)
            x = np.arange(len(arms))
            part = {k: np.array([here[a].split.parts[k][0] for a in arms]) for k in (*dict(PARTS), "delta")}
            lo = np.array([here[a].split.parts["delta"][1] for a in arms])
            hi = np.array([here[a].split.parts["delta"][2] for a in arms])
            pos, neg = np.zeros(len(arms)), np.zeros(len(arms))
            for key, label in PARTS:
                v = part[key]
                base = np.where(v >= 0, pos, neg)
                ax.bar(x, v, bottom=base, color=colours[key], label=label, width=0.6)
                pos, neg = pos + np.clip(v, 0, None), neg + np.clip(v, None, 0)
            ax.errorbar(x, part["delta"], yerr=[part["delta"] - lo, hi - part["delta"]], fmt="D",
                        color=OKABE_ITO["black"], zorder=5, markersize=3, capsize=2, linewidth=0.8, label="ΔEM")
            ax.axhline(0, color="0.5", linewidth=0.5)
            top, bottom = max(pos.max(), hi.max(), 0.0), min(neg.min(), lo.min(), 0.0)
            pad = 0.12 * ((top - bottom) or 1.0)   # room beyond the tallest bar for its ΔEM marker
            ax.set_ylim(bottom - (pad if bottom < 0 else 0.0), top + pad)
            pooled = {a: len(here[a].split.seeds) for a in arms}
            of = {a: (arm_seeds or {}).get(here[a].arm, 0) for a in arms}
            ax.set_xticks(x, [f"{a} @{here[a].step}\n{pooled[a]}" + (f" of {of[a]} seeds" if of[a] > pooled[a] else
                                                                     f" seed{'' if pooled[a] == 1 else 's'}")
                              for a in arms])
            ax.set_title(title)
            ax.set_ylabel("ΔEM vs pre")
            info.series[title] = arms
            info.seeds[title] = {a: {here[a].step: pooled[a]} for a in arms}
        for ax in list(axes.flat)[len(benches):]:
            ax.set_visible(False)
        if not benches:
            axes.flat[0].set_visible(True)
            axes.flat[0].axis("off")
            axes.flat[0].text(0.5, 0.5, "no QA bench with an item-paired split", ha="center", va="center")
        handles, labels = axes.flat[0].get_legend_handles_labels()
        if handles:
            fig.legend(handles, labels, loc="upper center", ncol=len(labels), frameon=False, bbox_to_anchor=(0.5, 1.0))
        info.caption = decomposition_caption(finals, conf)
        save_figure(fig, info, out_stem, rows)
    return info
