"""Tables in Search-R1's Table-2 layout (methods as rows; general QA | multi-hop QA | Avg. as columns),
as LaTeX (booktabs) and Markdown.

- main: the anchor, then per arm its final checkpoint and its best checkpoint (best is selected on
  the evaluation set, hence optimistic; the caption says so). Cells are mean with the `conf` (95%) half-width.
- paired: per arm (final checkpoint) × bench, the difference to the anchor over the same items.
- compare (analyze's `compare=[[A, B]]`): per step both arms were evaluated at × bench, A − B over the
  same items, each arm's seeds independent.
Every interval is the crossed items × seeds model's (analysis.variance); each cell says what it covers
(`items+seeds`, or `items` where an arm has one seed and its seed variance is unknown) and its n.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from analysis.aggregate import Paired, Points, Selected, anchor_value, best_point, final_point, final_steps, paired_arms, paired_vs_anchor
from analysis.collect import GENERAL_QA, MEAN_BENCH, MULTIHOP_QA, env_benches, qa_label
from analysis.discover import ANCHOR_ARM
from analysis.figures import sort_arms
from analysis.variance import COVERS_BOTH, COVERS_NONE, Estimate
from evals.registry import kind_of

DASH = "–"
ENV = "env"   # the metric name of a report without QA benches: each column in its bench's headline metric


def metric_words(metric: str, columns: list[Column]) -> str:
    """A caption's name for the tables' `metric` over `columns`: EM, F1, or for ENV the metric each column's header
    names; EM/F1 beside environment columns (each in its bench's headline, table_columns) names those too."""
    if metric == ENV:
        return "The headline metric (each column's own, named in its header)"
    if not (env := [f"{c.bench}: {c.metric}" for c in columns if c.metric != metric]):
        return metric.upper()
    return (f"{metric.upper()} on the QA benches and each environment bench's own headline metric "
            f"({'; '.join(env)}, named in its column's header)")


@dataclass
class Column:
    bench: str
    metric: str
    label: str
    group: str


@dataclass
class Table:
    caption: str
    columns: list[Column]
    rows: list[tuple[str, list[str]]] = field(default_factory=list)  # (row label, cells)
    row_header: str = "Method"

    def to_markdown(self) -> str:
        head = [self.row_header] + [f"{c.label}" for c in self.columns]
        groups = ["", *[c.group for c in self.columns]]
        lines = [f"*{self.caption}*", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        if len({g for g in groups if g}) > 1:
            by_group: dict[str, list[str]] = {}
            for c in self.columns:
                by_group.setdefault(c.group, []).append(c.label)
            lines.insert(2, "Column groups: " + "; ".join(f"{g}: {', '.join(ls)}" for g, ls in by_group.items()))
            lines.insert(3, "")
        lines += ["| " + " | ".join([label, *cells]) + " |" for label, cells in self.rows]
        return "\n".join(lines) + "\n"

    def to_latex(self) -> str:
        spans: list[tuple[str, int]] = []
        for c in self.columns:
            if spans and spans[-1][0] == c.group:
                spans[-1] = (c.group, spans[-1][1] + 1)
            else:
                spans.append((c.group, 1))
        out = ["\\begin{table*}[t]", "\\centering", "\\small",
               f"\\caption{{{latex_escape(self.caption)}}}",
               "\\begin{tabular}{l" + "c" * len(self.columns) + "}", "\\toprule"]
        out.append(" & " + " & ".join(f"\\multicolumn{{{n}}}{{c}}{{{latex_escape(g)}}}" for g, n in spans) + " \\\\")
        start, rules = 2, []
        for _, n in spans:
            rules.append(f"\\cmidrule(lr){{{start}-{start + n - 1}}}")
            start += n
        out.append(" ".join(rules))
        out.append(latex_escape(self.row_header) + " & " + " & ".join(latex_escape(c.label) for c in self.columns) + " \\\\")
        out.append("\\midrule")
        for label, cells in self.rows:
            out.append(" & ".join([latex_escape(label), *[latex_cell(c) for c in cells]]) + " \\\\")
        out += ["\\bottomrule", "\\end{tabular}", "\\end{table*}"]
        return "\n".join(out) + "\n"

    def write(self, stem: Path) -> list[Path]:
        stem.parent.mkdir(parents=True, exist_ok=True)
        paths = [stem.parent / f"{stem.name}.md", stem.parent / f"{stem.name}.tex"]   # an arm's name may hold a dot
        paths[0].write_text(self.to_markdown(), encoding="utf-8")
        paths[1].write_text(self.to_latex(), encoding="utf-8")
        return paths


_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "_": r"\_", "%": r"\%", "&": r"\&", "#": r"\#",
                  "$": r"\$", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\^{}",
                  "±": r"$\pm$", "–": "--", "→": r"$\rightarrow$", "×": r"$\times$", "Δ": r"$\Delta$", "−": "$-$"}


def latex_escape(text: str) -> str:
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in str(text))


def latex_cell(cell: str) -> str:
    """`0.345 ±0.012 @150` -> `0.345$_{\\pm0.012}^{@150}$`: the scripts on the word before the first of them, what
    follows them kept after (`0.300 @10 (why)` -> `0.300$^{@10}$ (why)`); other cells escaped as text."""
    parts = cell.split(" ")
    if not parts or parts[0] in (DASH, ""):
        return latex_escape(cell)
    sub = next((p[1:] for p in parts[1:] if p.startswith("±")), None)
    sup = next((p for p in parts[1:] if p.startswith("@")), None)
    if sub is None and sup is None:
        return latex_escape(cell)
    scripts = "$" + (f"_{{\\pm{sub}}}" if sub else "") + (f"^{{\\mathrm{{{sup}}}}}" if sup else "") + "$"
    words = [latex_escape(parts[0])]
    for p in parts[1:]:
        if not p.startswith(("±", "@")):
            words.append(latex_escape(p))
        elif scripts:   # the first of them: all the scripts on the word before it
            words[-1], scripts = words[-1] + scripts, ""
    return " ".join(words)


def fmt_interval(iv: Estimate | None, step: int | None = None) -> str:
    if iv is None or not math.isfinite(iv.mean):
        return DASH
    text = f"{iv.mean:.3f}"
    if math.isfinite(iv.lo) and math.isfinite(iv.hi):
        text += f" ±{max(iv.hi - iv.mean, iv.mean - iv.lo):.3f}"
    if step is not None:
        text += f" @{step}"
    return text


def table_columns(qa: list[str], has_mean: bool, agentic: list[str], metric: str) -> list[Column]:
    cols = []
    for bench in qa:  # keyed by `bench@mode`: two context modes of one bench never share a column
        name = bench.partition("@")[0]
        group = "General QA" if name in GENERAL_QA else "Multi-Hop QA" if name in MULTIHOP_QA else "QA"
        cols.append(Column(bench, metric, qa_label(bench), group))
    if has_mean:
        cols.append(Column(MEAN_BENCH, metric, "Avg.", "QA"))
    for bench in agentic:
        m = kind_of(bench).headline
        cols.append(Column(bench, m, f"{bench} ({m})", "Agentic"))
    return cols


def fmt_delta(e: Estimate) -> str:
    """`+0.030 [-0.010,+0.070] n=500×3 items+seeds` (n: items × seeds per arm; what the interval covers), its
    method after a comma where it is not the crossed t (`, Tango score`; METHODS_TEXT)."""
    n = f"n={e.n_items}" + (f"×{e.n_seeds}" if e.n_seeds else "")
    if not (math.isfinite(e.lo) and math.isfinite(e.hi)):
        return f"{e.mean:+.3f} {n} (no interval: {e.note or 'no variance'})"
    return f"{e.mean:+.3f} [{e.lo:+.3f},{e.hi:+.3f}] {n} {e.covers}" + ("" if e.method == "crossed t" else f", {e.method}")


METHODS_TEXT = ("a cell whose interval is not that t names its method: Tango score = Tango's (1998) score interval for "
                "paired proportions (one seed of an arm against the anchor or against one seed of another arm on one "
                "bench's 0/1 scores, an arm's seeds that agree on every item counting as one, where the t over few changed "
                "items undercovers), stratified Tango score = its form for the Avg. of benches (a compare table's "
                "equal-weight strata: each bench's variance Tango's under the tested difference), exact discordant = "
                "exact bounds for 0/1 items that all differ alike")


COVERS_TEXT = (f"covers: {COVERS_BOTH} = items and seeds both random (the population of items and of "
               "training seeds); items = items only, where an arm has one seed (its seed variance is unknown)")


def dash(why: str | None) -> str:
    """The cell of a table without a value: a dash, with the reason after it where there is one."""
    return f"{DASH} ({why})" if why else DASH


def gap(points: Points, arm: str, bench: str, why: str | None = None) -> str:
    """The cell of a point without a value: a dash, with `why` or the reason evaluate gave it no score."""
    return dash(why or points.no_score(arm, bench))


def main_table(points: Points, arms: list[str], columns: list[Column], metric: str) -> Table:
    caption = (f"{metric_words(metric, columns)} of the anchor and of each arm's final and best checkpoint "
               f"(mean over seeds ±{points.conf:.0%} half-width, its larger side, of the crossed items × seeds interval: "
               "covers items and seeds with >= 2 seeds, items only with one seed (seed variance unknown) "
               "and for the anchor; @step: the checkpoint; final: each seed's last evaluated checkpoint, the same "
               "for every cell of the row; best: among the steps every seed evaluated, chosen on the evaluation set "
               "and so optimistic; each cell's bounds, coverage and n are in intervals.csv)")
    table = Table(caption, columns)
    seen: dict[str, dict[str, set[str]]] = {}   # column -> row kind -> "n items × seeds, covers"
    if any(math.isfinite(anchor_value(points, c.bench, c.metric).mean) for c in columns):
        anchor = [anchor_value(points, c.bench, c.metric) for c in columns]
        _note_n(seen, columns, anchor, "anchor")
        table.rows.append(("anchor (base, nudge prompt)", [fmt_interval(iv) if math.isfinite(iv.mean)
                                                           else gap(points, ANCHOR_ARM, c.bench)
                                                           for iv, c in zip(anchor, columns)]))
    for arm in sort_arms(arms):
        last = final_steps(points, arm, [c.bench for c in columns])   # one checkpoint per seed for the whole row
        finals = [final_point(points, arm, c.bench, c.metric, last) for c in columns]
        steps = sorted({s for _, s in last})
        # Seeds still training can sit at different final steps: show the range then.
        span = "" if not steps else f", step {steps[0]}" if len(steps) == 1 else f", steps {steps[0]}–{steps[-1]}"
        _note_n(seen, columns, [f.interval if isinstance(f, Selected) else None for f in finals], arm)
        table.rows.append((f"{arm} (final{span})", [fmt_interval(f.interval) if isinstance(f, Selected) else gap(points, arm, c.bench, f)
                                                   for f, c in zip(finals, columns)]))
        bests = [best_point(points, arm, c.bench, c.metric) for c in columns]
        table.rows.append((f"{arm} (best)", [fmt_interval(b.interval, b.steps[0]) if isinstance(b, Selected)
                                             else gap(points, arm, c.bench, b) for b, c in zip(bests, columns)]))
    if seen:
        table.caption = table.caption[:-1] + "; n: " + "; ".join(
            f"{label}: " + ", ".join(f"{who} {' / '.join(sorted(ns))}" for who, ns in rows.items())
            for label, rows in seen.items()) + ")"
    return table


def _note_n(seen: dict, columns: list[Column], intervals: list, who: str) -> None:
    """Record each cell's n and coverage for the caption (`500×3 items+seeds`)."""
    for c, iv in zip(columns, intervals):
        if iv is not None and math.isfinite(iv.mean) and iv.n_items:
            n = f"{iv.n_items}" + (f"×{iv.n_seeds}" if iv.n_seeds else "")
            n += f" {iv.covers}" if iv.covers != COVERS_NONE else " (no interval)"
            seen.setdefault(c.label, {}).setdefault(who, set()).add(n)


def paired_table(points: Points, arms: list[str], columns: list[Column], metric: str) -> Table:
    caption = (f"{metric_words(metric, columns)} difference to the anchor at each arm's final checkpoint over the same items, "
               f"with the {points.conf:.0%} interval of the crossed model (t on Satterthwaite df; the anchor has no "
               "seed variance; " + METHODS_TEXT + "); n = items × the arm's seeds; " + COVERS_TEXT)
    cols = [c for c in columns if c.bench != MEAN_BENCH]
    table = Table(caption, cols)
    for arm in sort_arms(a for a in arms if a != ANCHOR_ARM):
        cells, last = [], final_steps(points, arm, [c.bench for c in columns])   # the main table's final row
        for c in cols:
            p = paired_vs_anchor(points, arm, c.bench, c.metric, last)
            if not isinstance(p, Paired) or not math.isfinite(p.result.delta):
                cells.append(gap(points, arm, c.bench, p if isinstance(p, str) else None))
            else:
                cells.append(fmt_delta(p.result) + (f" ({p.dropped} items dropped)" if p.dropped else ""))
        table.rows.append((arm, cells))
    return table


def step_seeds(seeds_a: set[int], seeds_b: set[int], a: str, b: str) -> str:
    """A compare row's seeds: `seeds 0, 1` where both arms have those, else each arm's (`A: seeds 0, 1, 2; B: seed 0`),
    never the two arms' seeds run together as if each had them all."""
    def text(seeds: set[int]) -> str:
        return f"seed{'s' if len(seeds) != 1 else ''} {', '.join(map(str, sorted(seeds))) or DASH}"

    return text(seeds_a) if seeds_a == seeds_b else f"{a}: {text(seeds_a)}; {b}: {text(seeds_b)}"


def compare_table(points: Points, a: str, b: str, columns: list[Column], metric: str, settings: str = "") -> Table:
    """One row per step evaluated in both arms: `a` − `b` per bench (aggregate.paired_arms); then one row
    per bench listing the item ids the intersection dropped (count and ids). `settings`: the caption's
    word on the arms' evaluation settings (differences allowed by compare_allow_settings=true)."""
    caption = (f"{metric_words(metric, columns)} of {a} minus {b} at each step both were evaluated at, over the items both "
               f"evaluated, with the {points.conf:.0%} interval of the crossed model (items shared, each arm's seeds "
               "independent; t on Satterthwaite df; " + METHODS_TEXT + "; Avg.: the benches as equal-weight strata); "
               f"n = items × seeds of {a}/{b}; " + COVERS_TEXT + (f"; {settings}" if settings else ""))
    table = Table(caption, columns, row_header="Step")
    t = points.table
    steps = sorted(set(t[t.arm == a].step.astype(int)) & set(t[t.arm == b].step.astype(int)))
    dropped: dict[str, set[str]] = {}
    for step in steps:
        cells, seeds = [], {a: set(), b: set()}
        for c in columns:
            p = paired_arms(points, a, b, step, c.bench, c.metric)
            if isinstance(p, str) or not math.isfinite(p.result.delta):
                cells.append(dash(p if isinstance(p, str) else None))
                continue
            for arm, arm_seeds in p.seeds.items():
                seeds[arm].update(arm_seeds)
            if c.bench != MEAN_BENCH:
                dropped.setdefault(c.label, set()).update(p.dropped_ids)
            cells.append(fmt_delta(p.result) + (f" ({p.dropped} dropped)" if p.dropped else ""))
        table.rows.append((f"{step} ({step_seeds(seeds[a], seeds[b], a, b)})", cells))
    if not steps:
        table.rows.append((DASH, [dash(f"no step evaluated in both {a} and {b}")] + [DASH] * (len(columns) - 1)))
    for label, ids in dropped.items():
        if ids:
            cells = [f"{len(ids)} dropped: {', '.join(sorted(ids))}" if c.label == label else "" for c in columns]
            table.rows.append(("items not in both", cells))
    return table


def agentic_benches(table_benches) -> list[str]:
    present = set(table_benches)
    return [b for b in env_benches() if b in present]
