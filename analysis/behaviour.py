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
    """Every split point of an analysis, and what could not be split (and why)."""

    points: list[Point] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # "who × bench" -> why it was not decomposed

    def finals(self) -> list[Point]:
        """Each run × bench × pre evaluation at its final evaluated step."""
        last: dict[tuple[str, str, str], Point] = {}
        for p in self.points:
            key = (p.run, p.bench, p.pre_source)
            if key not in last or p.step > last[key].step:
                last[key] = p
        return list(last.values())


UNRECORDED = "unrecorded"


def identity_label(eval_dir: Path, bench: str) -> str:
    """The bench's evaluation-identity fingerprint in `eval_dir/meta.json`, shortened (or "unrecorded")."""
    from analysis.discover import read_json_object

    record = ((read_json_object(Path(eval_dir) / "meta.json", []) or {}).get("identities") or {}).get(bench)
    fp = record.get("fingerprint") if isinstance(record, dict) else None
    return str(fp)[:10] if fp else UNRECORDED


def load_behaviour(eval_dir: Path, bench: str, who: str, dec: Decomposed) -> Behaviour | None:
    """`bench_behaviour`, with what it can't read recorded on `dec`: rows lacking a field the decomposition
    needs under `skipped` (shown beside the table), anything else wrong under `problems`."""
    from analysis.collect import qa_label

    try:
        return bench_behaviour(eval_dir, bench)
    except MissingField as exc:
        dec.skipped[f"{who} × {qa_label(bench)}"] = f"rows without `{exc.key}` (an older evaluate's?)"
    except AnalysisError as exc:
        dec.problems.append(str(exc))
    return None


def decompose_runs(runs, anchor_dir: Path | None, benches: list[str]) -> Decomposed:
    """Every evaluated step (> 0) of every run × QA bench against its pre evaluation (an RL run's own step
    0, else the anchor); where that pre has no ok row (the split undefined), also every later step against
    the run's first checkpoint with one (pre "step N"). A pair whose recorded identities differ beyond the
    design (analysis.prepost's rule) or that evaluated another number of items is listed as a problem and not
    split; a pair without recorded identities is split and labelled `unrecorded`."""
    from analysis.prepost import identity_problem

    out = Decomposed()
    cache: dict[tuple[Path, str], Behaviour | None] = {}

    def load(d: Path, bench: str, who: str) -> Behaviour | None:
        if (d, bench) not in cache:
            cache[(d, bench)] = load_behaviour(d, bench, who, out)
        return cache[(d, bench)]

    def split_against(run, label: str, bench: str, pre_dir: Path, pre: Behaviour, source: str, steps: list[int]):
        for step in steps:
            if (b := load(run.evals[step], bench, label)) is None or math.isnan(b.em):
                continue
            ident = identity_label(run.evals[step], bench)
            recorded = ident != UNRECORDED and identity_label(pre_dir, bench) != UNRECORDED
            rule = "anchor" if source == "anchor" else "step 0"   # a run's own checkpoints differ only in the weights
            if recorded and (why := identity_problem(pre_dir, run.evals[step], bench, rule)):
                out.problems.append(f"behaviour: {label} step {step} × {bench}: {why}")
                continue
            if b.n != pre.n:
                out.problems.append(f"behaviour: {label} step {step} × {bench}: {b.n} items vs {pre.n} in the "
                                    f"{source} evaluation: not split")
                continue
            out.points.append(Point(run.arm, run.seed, step, bench, ident, source, b, pre, decompose(pre, b)))

    for run in runs:
        label = f"{run.arm}/seed{run.seed}"
        own_start = 0 in run.evals
        pre_dir = run.evals[0] if own_start else anchor_dir
        source = "step 0" if own_start else "anchor"
        steps = sorted(s for s in run.evals if s > 0)
        for bench in benches:
            if pre_dir is None or (pre := load(pre_dir, bench, "anchor" if source == "anchor" else label)) is None \
                    or math.isnan(pre.em):
                continue
            split_against(run, label, bench, pre_dir, pre, source, steps)
            if pre.p_ok > 0:
                continue
            first = next((s for s in steps if (b := load(run.evals[s], bench, label)) is not None
                          and not math.isnan(b.em) and b.p_ok > 0), None)
            if first is not None:
                split_against(run, label, bench, run.evals[first], cache[(run.evals[first], bench)], f"step {first}",
                              [s for s in steps if s > first])
    return out


def _f(x: float, signed: bool = False) -> str:
    if not math.isfinite(x):
        return "–"
    return f"{x:+.3f}" if signed else f"{x:.3f}"


def _counts(d: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items()) or "–"


DECOMPOSITION_COLUMNS = ["bench (context mode)", "identity", "n", "well-formed", "search→answer", "searches/ep",
                         "finish call", "p(ok) pre→post", "EM|ok pre→post", "ΔEM", "format Δp·EM₀|ok",
                         "capability p₁·ΔEM|ok", "rest", "format share"]
STAGE_COLUMNS = ["bench (context mode)", "identity", "n", "extraction stage", "stop reason", "format failures"]


def decomposition_tables(dec: Decomposed, anchor: dict[str, Behaviour], anchor_identity: dict[str, str]):
    """(the decomposition table, the extraction-stage table), at each run's final evaluated step."""
    from analysis.collect import qa_label
    from analysis.tables import Column, Table

    caption = ("Format vs capability at each run's final checkpoint, per QA bench (context mode) and evaluation "
               "identity: ΔEM = Δp·EM₀|ok + p₁·ΔEM|ok + Δ[(1−p)·EM|¬ok], p = share of well-formed episodes with "
               "an extractable answer; pre is the anchor (SFT arms) or the run's own step 0 (RL), and where that pre has "
               "no ok episode (split undefined) also the run's first checkpoint with one (pre: step N). Rates of "
               "the post checkpoint; the three parts add up to ΔEM exactly (analysis/behaviour.py).")
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
    return main, stages


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


PARTS = (("format", "format (Δp·EM₀|ok)"), ("capability", "capability (p₁·ΔEM|ok)"), ("rest", "rest"))


def _bar(p: Point) -> str:
    """A bar of the figure: the arm, or the arm and its later pre where the first one left the split undefined."""
    return p.arm if p.pre_source in ("anchor", "step 0") else f"{p.arm}\n(from {p.pre_source})"


def plot_decomposition(dec: Decomposed, out_stem: Path):
    """One panel per QA bench: per arm (mean over seeds at each seed's final step) stacked bars of the
    format, capability and rest parts, with ΔEM as a black diamond. Returns analysis.figures.FigureInfo."""
    import matplotlib.pyplot as plt
    import numpy as np

    from analysis.collect import qa_label
    from analysis.figures import OKABE_ITO, PANEL_HEIGHT_IN, RC, FigureInfo, _layout, save_figure, sort_arms

    finals = [p for p in dec.finals() if p.split.why_undefined is None]
    benches = list(dict.fromkeys(p.bench for p in sorted(finals, key=lambda p: p.bench)))
    out_stem = Path(out_stem)
    out_stem.parent.mkdir(parents=True, exist_ok=True)
    titles = [f"{qa_label(b)} [{next(p.identity for p in finals if p.bench == b)}]" for b in benches]
    info = FigureInfo(paths=[], panels=titles)
    colours = {"format": OKABE_ITO["orange"], "capability": OKABE_ITO["blue"], "rest": OKABE_ITO["yellow"]}
    rows, cols, width = _layout(max(1, len(benches)))
    with plt.rc_context(RC):
        fig, axes = plt.subplots(rows, cols, figsize=(width, PANEL_HEIGHT_IN * rows + 0.35), squeeze=False)
        for ax, bench, title in zip(axes.flat, benches, titles):
            here = [p for p in finals if p.bench == bench]
            arms = sort_arms({_bar(p) for p in here})
            x = np.arange(len(arms))
            mean = {k: np.array([np.mean([getattr(p.split, k) for p in here if _bar(p) == a]) for a in arms])
                    for k in ("format", "capability", "rest", "delta")}
            pos, neg = np.zeros(len(arms)), np.zeros(len(arms))
            for key, label in PARTS:
                v = mean[key]
                base = np.where(v >= 0, pos, neg)
                ax.bar(x, v, bottom=base, color=colours[key], label=label, width=0.6)
                pos, neg = pos + np.clip(v, 0, None), neg + np.clip(v, None, 0)
            ax.scatter(x, mean["delta"], marker="D", color=OKABE_ITO["black"], zorder=5, s=10, label="ΔEM")
            ax.axhline(0, color="0.5", linewidth=0.5)
            top, bottom = max(pos.max(), mean["delta"].max(), 0.0), min(neg.min(), mean["delta"].min(), 0.0)
            pad = 0.12 * ((top - bottom) or 1.0)   # room beyond the tallest bar for its ΔEM marker
            ax.set_ylim(bottom - (pad if bottom < 0 else 0.0), top + pad)
            ax.set_xticks(x, arms)
            ax.set_title(title)
            ax.set_ylabel("ΔEM vs pre")
            info.series[title] = arms
        for ax in list(axes.flat)[len(benches):]:
            ax.set_visible(False)
        if not benches:
            axes.flat[0].set_visible(True)
            axes.flat[0].axis("off")
            axes.flat[0].text(0.5, 0.5, "no QA bench with a defined split", ha="center", va="center")
        handles, labels = axes.flat[0].get_legend_handles_labels()
        if handles:
            fig.legend(handles, labels, loc="upper center", ncol=len(labels), frameon=False, bbox_to_anchor=(0.5, 1.0))
        info.caption = ("ΔEM from each arm's pre evaluation at its final checkpoint (mean over seeds), split into "
                        "format, capability and rest (ΔEM = Δp·EM₀|ok + p₁·ΔEM|ok + Δ[(1−p)·EM|¬ok]); \"from step "
                        "N\": against the run's first checkpoint with a well-formed, extractable answer, where its "
                        "pre had none; panel titles: bench (context mode) [evaluation identity].")
        save_figure(fig, info, out_stem, rows)
    return info
