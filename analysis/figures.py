"""Paper figures: per-step transfer curves, one panel per (bench, metric), PDF (vector) + PNG (300 dpi).

Sized for a two-column paper (full text width 7.0 in, one column 3.4 in) with 7-pt text so labels
stay readable when printed. Colours are Okabe-Ito (colour-blind safe) with a fixed arm -> colour map,
so an arm has the same colour in every figure of the paper. The anchor is a black point at step 0
(with its interval) and a black dashed line across; a run with its own step-0 evaluation (an RL run,
whose `checkpoints/step-000000` is the starting model) starts its curve there instead. X ticks sit at
the checkpoint steps. The caption (under the figure and in `FigureInfo.caption`) says what the bands
are; a panel whose every value is 0 becomes a one-line note instead of an empty plot.
Missing points are NaN and drawn as gaps (lines are broken, never interpolated across). Each point is the mean over
the seeds evaluated at its step: the legend names each arm's seed count, the caption each point over fewer of them.
"""
from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from analysis.aggregate import Points, anchor_value, curve  # noqa: E402
from analysis.axes import Axis  # noqa: E402

OKABE_ITO = {
    "black": "#000000", "orange": "#E69F00", "sky_blue": "#56B4E9", "bluish_green": "#009E73",
    "yellow": "#F0E442", "blue": "#0072B2", "vermillion": "#D55E00", "reddish_purple": "#CC79A7",
}
ARM_COLOURS = {
    "r2e": OKABE_ITO["vermillion"],
    "search": OKABE_ITO["blue"],
    "mixed": OKABE_ITO["bluish_green"],
    "r2e_v5": OKABE_ITO["reddish_purple"],
}
# For arms outside the study's four: assigned in sorted-name order, so still stable across figures.
_SPARE = [OKABE_ITO["orange"], OKABE_ITO["sky_blue"], OKABE_ITO["yellow"]]
# Markers too, so arms stay apart in greyscale print and where lines coincide.
ARM_MARKERS = {"r2e": "o", "search": "s", "mixed": "^", "r2e_v5": "D"}
_SPARE_MARKERS = ["v", "P", "X"]
ANCHOR_STYLE = dict(color=OKABE_ITO["black"], linestyle="--", linewidth=1.0)
ARM_ORDER = ["r2e", "search", "mixed", "r2e_v5"]
TEXT_WIDTH_IN = 7.0
COLUMN_WIDTH_IN = 3.4
PANEL_HEIGHT_IN = 1.65
MAX_COLS = 4

RC = {
    "font.size": 7, "axes.titlesize": 7, "axes.labelsize": 7, "xtick.labelsize": 6, "ytick.labelsize": 6,
    "legend.fontsize": 7, "lines.linewidth": 1.2, "lines.markersize": 3, "axes.linewidth": 0.6,
    "axes.spines.top": False, "axes.spines.right": False,
    # TrueType fonts in the PDF: venues reject Type-3 fonts.
    "pdf.fonttype": 42, "ps.fonttype": 42, "savefig.bbox": "tight", "savefig.pad_inches": 0.02,
}


def bounded(metric: str) -> bool:
    """Rates and scores live in [0, 1]; per-episode counts (`mean_turns`, `mean_tool_calls`) do not."""
    return not metric.startswith("mean_")


def sort_arms(arms) -> list[str]:
    arms = set(arms)
    return [a for a in ARM_ORDER if a in arms] + sorted(arms - set(ARM_ORDER))


def arm_markers(arms) -> dict[str, str]:
    extra = sorted(set(arms) - set(ARM_MARKERS))
    return {**ARM_MARKERS, **{a: _SPARE_MARKERS[i % len(_SPARE_MARKERS)] for i, a in enumerate(extra)}}


def arm_colours(arms) -> dict[str, str]:
    """The fixed arm -> colour map; unknown arms take spare colours by sorted name (cycled)."""
    extra = sorted(set(arms) - set(ARM_COLOURS))
    return {**ARM_COLOURS, **{a: _SPARE[i % len(_SPARE)] for i, a in enumerate(extra)}}


@dataclass
class Panel:
    bench: str
    metric: str
    title: str
    ylabel: str


@dataclass
class FigureInfo:
    """What was drawn, for the report and for tests (no need to parse the image)."""

    paths: list[Path]
    panels: list[str]  # panel titles, in order
    series: dict[str, list[str]] = field(default_factory=dict)  # panel title -> legend labels drawn
    gaps: dict[str, dict[str, int]] = field(default_factory=dict)  # panel -> arm -> NaN points
    xticks: dict[str, list[int]] = field(default_factory=dict)  # panel -> the steps ticked
    x: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # panel -> arm -> the x drawn per step
    xlabel: str = "step"
    bands: dict[str, dict[str, str]] = field(default_factory=dict)  # panel -> arm -> simultaneous band drawn
    notes: dict[str, str] = field(default_factory=dict)  # panel -> the note drawn instead of a plot
    seeds: dict[str, dict[str, dict[int, int]]] = field(default_factory=dict)  # panel -> arm -> step -> seeds in its mean
    caption: str = ""


def _layout(n: int) -> tuple[int, int, float]:
    # 3 or 4 columns, whichever leaves fewer empty slots (4 on ties): 9 panels -> 3x3, 8 -> 2x4.
    cols = n if n <= 3 else min((MAX_COLS, MAX_COLS - 1), key=lambda c: (math.ceil(n / c) * c - n, -c))
    rows = math.ceil(n / cols)
    width = TEXT_WIDTH_IN if cols > 1 else COLUMN_WIDTH_IN
    return rows, cols, width


MAX_TICKS = 8
BAND_TEXT = {
    "crossed t": "t on Satterthwaite df",
    "crossed wilson": "Wilson's score interval on the effective n (a 0/1 score)",
    "seed t": "Student-t across seed means (no per-item file: items taken as fixed)",
}
COVERS_WORDS = {
    "items+seeds": "items and seeds both random",
    "items": "items only (one seed: seed variance unknown)",
    "seeds": "seeds only",
}


def tick_steps(steps) -> list[int]:
    """The checkpoint steps, thinned evenly to at most MAX_TICKS (first and last always kept)."""
    steps = sorted(set(int(s) for s in steps))
    if len(steps) <= MAX_TICKS:
        return steps
    keep = {steps[round(i * (len(steps) - 1) / (MAX_TICKS - 1))] for i in range(MAX_TICKS)}
    return sorted(keep)


def _kinds_text(kinds: set[tuple[str, str, int, str]]) -> str:
    """`t on Satterthwaite df, covers items and seeds both random (n = 500 items × 3 seeds)` per kind drawn."""
    by: dict[tuple[str, str], list[str]] = {}
    for method, covers, n, seeds in sorted(kinds):
        by.setdefault((method, covers), []).append(f"{n} items" + (f" × {seeds} seed{'' if seeds == '1' else 's'}"
                                                                    if seeds else ""))
    return "; ".join(f"{BAND_TEXT.get(m, m)}, covers {COVERS_WORDS.get(c, c)} (n = {', '.join(sorted(set(ns)))})"
                     for (m, c), ns in by.items())


def caption_text(kinds: set[tuple[str, str, int, str]], anchor_drawn: bool,
                 bands: set[tuple[str, str, int, str]] = frozenset(), gaps: list[str] = (), conf: float = 0.95) -> str:
    """The figure's caption: what each shaded interval and each dotted band covers, and its n.
    `kinds`/`bands`: (method, covers, n items, seeds) of what was drawn; `gaps`: bands not drawn, why."""
    shaded = _kinds_text(kinds) or "none drawn (no interval available)"
    parts = [f"Shaded: the {conf:.0%} interval of each step's expected score over the item and seed populations "
             f"(crossed items × seeds model): {shaded}."]
    if bands:
        parts.append(f"Dotted: a simultaneous {conf:.0%} band over the steps of each curve (each step at the Bonferroni "
                     f"level 1 − {1 - conf:.3g}/K; it covers the whole curve of expected scores at once): "
                     f"{_kinds_text(bands)}.")
    if gaps:
        parts.append("No simultaneous band: " + "; ".join(gaps) + ".")
    if anchor_drawn:
        parts.append("Step 0: the anchor (base model, anchor_nudge prompt; greedy, so items only) for SFT arms; "
                     "a run's own starting checkpoint (same prompt) where it has a step-0 evaluation.")
    return " ".join(parts)


def _steps_text(steps: list[int]) -> str:
    """`step 1000`, `steps 200, 1000`; more than 6 as the first three, the last and their count."""
    if len(steps) == 1:
        return f"step {steps[0]}"
    shown = steps if len(steps) <= 6 else [*steps[:3], "…", steps[-1]]
    return "steps " + ", ".join(map(str, shown)) + ("" if len(steps) <= 6 else f" ({len(steps)} steps)")


def fewer_seeds_text(seeds: dict[str, dict[str, dict[int, int]]], n_seeds: dict[str, int]) -> str:
    """The caption's sentence on every point that is a mean over fewer seeds than its arm has (`n_seeds[arm]`), per
    arm: `r2e: 2 of 3 seeds at step 1000` and, where it holds in some of the arm's panels only, which ones."""
    groups: dict[tuple[str, int], dict[int, list[str]]] = {}
    panels_of: dict[str, set[str]] = {}
    for panel, by_arm in seeds.items():
        for arm, per_step in by_arm.items():
            panels_of.setdefault(arm, set()).add(panel)
            for step, k in per_step.items():
                if k < n_seeds.get(arm, k):
                    groups.setdefault((arm, k), {}).setdefault(step, []).append(panel)
    parts = []
    for arm in sort_arms({a for a, _ in groups}):
        for k in sorted(k for a, k in groups if a == arm):
            by_panels: dict[tuple[str, ...], list[int]] = {}
            for step, panels in groups[(arm, k)].items():
                by_panels.setdefault(tuple(panels), []).append(step)
            for panels, steps in by_panels.items():
                where = "" if set(panels) == panels_of[arm] else " (" + ", ".join(p.replace("\n", " ") for p in panels) + ")"
                parts.append(f"{arm}: {k} of {n_seeds[arm]} seeds at {_steps_text(sorted(steps))}{where}")
    return ("Fewer seeds (a mean over the seeds evaluated at that step, not all of the arm's): " + "; ".join(parts) + "."
            if parts else "")


def _arm_seeds(points: Points, panels: list[Panel], arms: list[str]) -> dict[str, int]:
    """Each arm's seeds with a value on any of the figure's (bench, metric)."""
    t = points.table
    want = {(p.bench, p.metric) for p in panels}
    keep = [a in arms and (b, m) in want for a, b, m in zip(t.arm, t.bench, t.metric)]
    return {str(a): int(n) for a, n in t[keep].groupby("arm").seed.nunique().items()}


def _all_zero(values: list[float]) -> bool:
    finite = [v for v in values if math.isfinite(v)]
    return bool(finite) and all(v == 0 for v in finite)


def plot_curves(points: Points, panels: list[Panel], arms: list[str], steps: dict[str, list[int]],
                out_stem: Path, suptitle: str | None = None, axis: Axis | None = None) -> FigureInfo:
    """Draw metric-vs-step curves (mean over seeds, a band at `points.conf`) per arm, the anchor at step 0; save PDF + PNG.

    `steps[arm]`: the arm's steps on disk and enough of the expected ones (analysis.discover.Run.steps) that
    each missing one breaks the line: a gap.
    `axis` (analysis.axes): x is the step (default) or what training consumed by it (tokens seen, ...).
    """
    axis = axis or Axis()
    out_stem = Path(out_stem)
    out_stem.parent.mkdir(parents=True, exist_ok=True)
    colours, markers = arm_colours(arms), arm_markers(arms)
    info = FigureInfo(paths=[], panels=[p.title for p in panels], xlabel=axis.label)
    rows, cols, width = _layout(max(1, len(panels)))
    with plt.rc_context(RC):
        fig, axes = plt.subplots(rows, cols, figsize=(width, PANEL_HEIGHT_IN * rows + 0.35), squeeze=False)
        handles: dict[str, object] = {}
        kinds: set[tuple[str, str, int, str]] = set()
        band_kinds: set[tuple[str, str, int, str]] = set()
        gaps: list[str] = []
        anchor_drawn = False
        for ax, panel in zip(axes.flat, panels):
            drawn: list[str] = []
            info.gaps[panel.title] = {}
            curves = {arm: curve(points, arm, panel.bench, panel.metric, steps.get(arm, [])) for arm in sort_arms(arms)}
            curves = {arm: c for arm, c in curves.items() if c["mean"].notna().sum() > 0}
            anchor = anchor_value(points, panel.bench, panel.metric)
            values = [v for c in curves.values() for v in c["mean"].tolist()] + [anchor.mean]
            if _all_zero(values):
                note = f"{panel.title}: every value is 0 ({sum(math.isfinite(v) for v in values)} points)"
                ax.axis("off")
                ax.text(0.5, 0.5, note, ha="center", va="center", transform=ax.transAxes, wrap=True)
                info.notes[panel.title], info.series[panel.title], info.xticks[panel.title] = note, [], []
                continue
            ticked: set[int] = set()
            info.x[panel.title], info.seeds[panel.title] = {}, {}
            for arm, c in curves.items():
                x = np.array([axis.x(arm, int(s)) for s in c.step], dtype=float)
                info.x[panel.title][arm] = x.tolist()
                info.seeds[panel.title][arm] = {int(s): len(points.values(arm, int(s), panel.bench, panel.metric))
                                                for s, m in zip(c.step, c["mean"]) if math.isfinite(m)}
                (line,) = ax.plot(x, c["mean"].to_numpy(float), marker=markers[arm], color=colours[arm],
                                  label=arm)
                lo, hi = c.lo.to_numpy(float), c.hi.to_numpy(float)
                if bounded(panel.metric):  # a t band can leave [0, 1]: clipped for display only
                    lo, hi = np.clip(lo, 0, 1), np.clip(hi, 0, 1)
                ok = np.isfinite(lo) & np.isfinite(hi) & np.isfinite(x)
                if ok.any():
                    ax.fill_between(x, np.where(ok, lo, np.nan), np.where(ok, hi, np.nan), where=ok,
                                    color=colours[arm], alpha=0.2, linewidth=0)
                band = points.simultaneous(arm, panel.bench, panel.metric, [int(v) for v in c.step])
                if (arm, panel.bench, panel.metric) in points.band_gaps:
                    gaps.append(f"{arm}, {panel.title}: {points.band_gaps[(arm, panel.bench, panel.metric)]}")
                if band is not None:  # dotted: simultaneous over the steps, beside the per-step band
                    bx = np.array([axis.x(arm, s) for s in band.steps], dtype=float)
                    blo, bhi = band.lo, band.hi
                    if bounded(panel.metric):
                        blo, bhi = np.clip(blo, 0, 1), np.clip(bhi, 0, 1)
                    for edge in (blo, bhi):
                        ax.plot(bx, edge, linestyle=":", linewidth=0.8, color=colours[arm])
                    info.bands.setdefault(panel.title, {})[arm] = band.method
                    band_kinds.add((band.method, band.covers, band.n_items, band.n_seeds))
                handles.setdefault(arm, line)
                drawn.append(arm)
                info.gaps[panel.title][arm] = int(c["mean"].isna().sum())
                ticked.update(int(s) for s in c.step)
                kinds.update((m, cv, int(n), sd) for m, cv, n, sd, has_band
                             in zip(c.method, c.covers, c.n, c.n_seeds, ok) if has_band)
            if math.isfinite(anchor.mean):
                ax.axhline(anchor.mean, **ANCHOR_STYLE)
                err = None
                if math.isfinite(anchor.lo) and math.isfinite(anchor.hi):
                    err = [[anchor.mean - anchor.lo], [anchor.hi - anchor.mean]]
                    kinds.add((anchor.method, anchor.covers, anchor.n_items, anchor.n_seeds))
                point = ax.errorbar([0], [anchor.mean], yerr=err, fmt="o", color=OKABE_ITO["black"], capsize=2,
                                    markersize=3.5, linewidth=0.8, zorder=5)
                handles.setdefault("anchor", point)
                drawn.append("anchor")
                ticked.add(0)
                anchor_drawn = True
            if ticked and axis.name == "step":
                info.xticks[panel.title] = tick_steps(ticked)
                ax.set_xticks(info.xticks[panel.title])
                ax.tick_params(axis="x", labelrotation=45 if len(info.xticks[panel.title]) > 5 else 0)
            if not drawn:
                ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="0.5")
            # Every metric is >= 0: keep a flat-at-zero curve at the bottom, not mid-panel.
            bottom, top = ax.get_ylim()
            top = min(max(top, 0.1), 1.02) if bounded(panel.metric) else max(top, 0.1)
            ax.set_ylim(max(bottom, -0.02 * top), top)
            ax.set_title(panel.title)
            ax.set_xlabel(axis.label)
            ax.set_ylabel(panel.ylabel)
            ax.grid(True, linewidth=0.3, alpha=0.5)
            info.series[panel.title] = drawn
        for ax in list(axes.flat)[len(panels):]:
            ax.set_visible(False)
        order = [a for a in sort_arms(arms) if a in handles] + (["anchor"] if "anchor" in handles else [])
        n_seeds = _arm_seeds(points, panels, arms)
        labels = ["anchor (step 0)" if k == "anchor" else f"{k} ({n_seeds[k]} seed{'' if n_seeds[k] == 1 else 's'})"
                  if k in n_seeds else k for k in order]
        if order:
            fig.legend([handles[k] for k in order], labels, loc="upper center", ncol=len(order),
                       frameon=False, bbox_to_anchor=(0.5, 1.0))
        fewer = fewer_seeds_text(info.seeds, n_seeds)
        info.caption = (caption_text(kinds, anchor_drawn, band_kinds, gaps, points.conf) + (" " + fewer if fewer else "")
                        + ("" if axis.name == "step" else " " + axis.caption()))
        if suptitle:
            fig.suptitle(suptitle, y=1.06)
        save_figure(fig, info, out_stem, rows)
    return info


def caption_lines(text: str, width_in: float) -> str:
    """`text` broken into lines that fit a figure `width_in` inches wide at 6 pt (its own line breaks kept). Wrapped
    once here: matplotlib's `wrap=True` measured the caption word by word at every save, about half of a save's time."""
    width = max(40, int(width_in * 18))   # characters a line: 6 pt DejaVu Sans averages ~3.5 pt a character, plus a margin
    return "\n".join(textwrap.fill(part, width) for part in text.split("\n"))


def save_figure(fig, info: FigureInfo, out_stem: Path, rows: int) -> None:
    """The caption under the figure, then PDF + PNG (300 dpi) at `out_stem` (listed in `info.paths`)."""
    fig.text(0.5, 0.0, caption_lines(info.caption, fig.get_figwidth()), ha="center", va="top", fontsize=6)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.3 / (PANEL_HEIGHT_IN * rows + 0.35)))
    for ext, kw in (("pdf", {}), ("png", {"dpi": 300})):
        path = out_stem.with_suffix(f".{ext}")
        fig.savefig(path, **kw)
        info.paths.append(path)
    plt.close(fig)
