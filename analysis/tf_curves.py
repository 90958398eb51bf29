"""Teacher-forced transfer curves: per arm, seed and span kind, a checkpoint's mean token loss on the
held-out gold trajectories of each domain (the benches `tf_code`, `tf_search` of evals.teacher_forced).

Read from the eval dirs only: each point is the bench's summary value (`loss` for all spans, `loss_<kind>`
per span kind), which evaluate computes from the bench's rows (per record: each kind's loss sum and token
count; the mean is the sum over records of the loss over the sum of the tokens). A panel is one bench ×
held-out set (its fingerprint, from the eval dir's meta.json) × span kind, so curves on different held-out
sets are never drawn as one; lines are arm (colour) × seed (line style), the anchor a dashed line. The
x-axis is analyze's `axis` (analysis.axes), each seed's line at its own counters. The table lists every point with its evaluation identity.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from analysis.discover import ANCHOR_ARM, read_json_object
from evals.teacher_forced import BENCHES, SPAN_KINDS

SPANS = ("all", *SPAN_KINDS)
SEED_STYLES = ["-", "--", ":", "-."]


@dataclass(frozen=True)
class TFPoint:
    arm: str
    seed: int
    step: int
    bench: str
    heldout: str        # the held-out set's fingerprint (shortened); "unrecorded" without meta.json
    identity: str       # the bench's evaluation identity (shortened)
    n: int              # records
    tokens: int
    loss: dict          # span ("all" or a kind) -> mean loss per token; a kind without tokens is absent


@dataclass
class TFCurves:
    points: list[TFPoint] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def value(self, arm: str, seed: int, step: int, bench: str, span: str) -> float | None:
        for p in self.points:
            if (p.arm, p.seed, p.step, p.bench) == (arm, seed, step, bench):
                return p.loss.get(span)
        return None


def _heldout_label(eval_dir: Path) -> str:
    block = (read_json_object(Path(eval_dir) / "meta.json", []) or {}).get("teacher_forced")
    fp = block.get("fingerprint") if isinstance(block, dict) else None
    return str(fp)[:10] if fp else "unrecorded"


def collect_tf(table, eval_dirs: dict[tuple[str, int, int], Path]) -> TFCurves:
    """Every (arm, seed, step) × teacher-forced bench of the tidy table (analysis.collect), with its identity."""
    from analysis.behaviour import identity_label

    out = TFCurves()
    tf = table[table.bench.isin(list(BENCHES))]
    for (arm, seed, step, bench), g in tf.groupby(["arm", "seed", "step", "bench"], sort=True):
        values = dict(zip(g.metric, g.value))
        if "loss" not in values:
            continue
        d = eval_dirs.get((arm, int(seed), int(step)))
        loss = {"all": values["loss"], **{k: values[f"loss_{k}"] for k in SPAN_KINDS if f"loss_{k}" in values}}
        out.points.append(TFPoint(str(arm), int(seed), int(step), str(bench),
                                  _heldout_label(d) if d else "unrecorded", identity_label(d, bench) if d else "unrecorded",
                                  int(g.n.iloc[0]), int(values.get("tokens", 0)), loss))
    return out


def tf_table(curves: TFCurves):
    """Every point: run @step, bench, held-out set, identity, records, tokens, loss per span kind."""
    from analysis.tables import Column, Table

    cols = ["bench", "held-out set", "identity", "records", "tokens", *SPANS]
    t = Table("Teacher-forced loss (mean per token, nats) on the held-out gold trajectories of each domain, at every "
              "checkpoint, overall (all) and per span kind (evals/teacher_forced.py); – where the set has no token of "
              "that kind. Held-out set and identity: fingerprints from each eval dir's meta.json.",
              [Column("", "", c, "") for c in cols], row_header="Run")
    for p in sorted(curves.points, key=lambda p: (p.arm != ANCHOR_ARM, p.arm, p.seed, p.bench, p.step)):
        who = "anchor" if p.arm == ANCHOR_ARM else f"{p.arm}/seed{p.seed} @{p.step}"
        t.rows.append((who, [p.bench, p.heldout, p.identity, str(p.n), str(p.tokens),
                             *(f"{p.loss[s]:.4f}" if s in p.loss else "–" for s in SPANS)]))
    return t


def write_points(curves: TFCurves, path: Path) -> Path:
    """One line per point and span (the values the figure draws)."""
    import pandas as pd

    rows = [[p.arm, p.seed, p.step, p.bench, p.heldout, p.identity, p.n, p.tokens, s, p.loss[s]]
            for p in curves.points for s in SPANS if s in p.loss]
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows, columns=["arm", "seed", "step", "bench", "heldout", "identity", "records", "tokens", "span",
                                "loss"]).to_csv(path, index=False)
    return path


def plot_tf(curves: TFCurves, out_stem: Path, axis, steps: dict[tuple[str, int], list[int]] | None = None):
    """One panel per bench × held-out set × span kind with tokens; a line per arm × seed over the checkpoints.
    `steps[(arm, seed)]`: the run's curve steps (analysis.discover.Run.steps): one without a point in the panel
    is a gap in the line (NaN, counted in `FigureInfo.gaps`), never bridged. Returns analysis.figures.FigureInfo."""
    import matplotlib.pyplot as plt

    from analysis.figures import (ANCHOR_STYLE, PANEL_HEIGHT_IN, RC, FigureInfo, _layout, arm_colours, save_figure,
                                  sort_arms, tick_steps)

    runs = [p for p in curves.points if p.arm != ANCHOR_ARM]
    groups = sorted({(p.bench, p.heldout) for p in curves.points})
    panels = [(b, h, s) for b, h in groups for s in SPANS
              if any(p.bench == b and p.heldout == h and s in p.loss for p in curves.points)]
    titles = [f"{b} [{h}]: {s}" for b, h, s in panels]
    info = FigureInfo(paths=[], panels=titles, xlabel=axis.label)
    arms = sort_arms({p.arm for p in runs})
    colours = arm_colours(arms)
    seeds = sorted({p.seed for p in runs})
    out_stem = Path(out_stem)
    out_stem.parent.mkdir(parents=True, exist_ok=True)
    rows, cols, width = _layout(max(1, len(panels)))
    with plt.rc_context(RC):
        fig, axes = plt.subplots(rows, cols, figsize=(width, PANEL_HEIGHT_IN * rows + 0.35), squeeze=False)
        for ax, (bench, held, span), title in zip(axes.flat, panels, titles):
            here = [p for p in curves.points if p.bench == bench and p.heldout == held and span in p.loss]
            info.series[title], info.x[title], info.gaps[title] = [], {}, {}
            for arm in arms:
                for seed in seeds:
                    loss = {p.step: p.loss[span] for p in here if p.arm == arm and p.seed == seed}
                    if not loss:
                        continue
                    label = f"{arm}/seed{seed}"
                    at = sorted(set(loss) | set((steps or {}).get((arm, seed), ())))
                    xs = [axis.x(arm, s, seed) for s in at]
                    ys = [loss.get(s, math.nan) for s in at]
                    ax.plot(xs, ys, color=colours[arm], marker="o",
                            linestyle=SEED_STYLES[seeds.index(seed) % len(SEED_STYLES)], label=label)
                    info.series[title].append(label)
                    info.x[title][label] = xs
                    if missing := sum(s not in loss for s in at):
                        info.gaps[title][label] = missing
            if not info.gaps[title]:
                del info.gaps[title]
            anchor = [p for p in here if p.arm == ANCHOR_ARM]
            if anchor:
                ax.axhline(anchor[0].loss[span], **ANCHOR_STYLE, label="anchor")
                info.series[title].append("anchor")
            if axis.name == "step":   # ticks at the checkpoints
                info.xticks[title] = tick_steps(sorted({p.step for p in here if p.arm != ANCHOR_ARM}))
                ax.set_xticks(info.xticks[title])
            ax.set_title(title)
            ax.set_xlabel(axis.label)
            ax.set_ylabel("loss / token")
        for ax in list(axes.flat)[len(panels):]:
            ax.set_visible(False)
        # every line of any panel, once (an arm may be evaluated on one bench only: not in the first panel)
        drawn = {label: h for ax in axes.flat for h, label in zip(*ax.get_legend_handles_labels())}
        labels = [x for x in (*(f"{a}/seed{s}" for a in arms for s in seeds), "anchor") if x in drawn]
        if labels:
            fig.legend([drawn[x] for x in labels], labels, loc="upper center", ncol=min(len(labels), 6), frameon=False,
                       bbox_to_anchor=(0.5, 1.0))
        info.caption = ("Teacher-forced loss per token on held-out gold trajectories (tf_code: code agents, tf_search: "
                        "search agents) at each checkpoint, per span kind; colour = arm, line style = seed, dashed = "
                        "anchor; panel titles: bench [held-out set fingerprint]: span. "
                        + ("A checkpoint without a loss is a gap in its line (see the missing points). " if info.gaps else "")
                        + axis.caption(per_seed=True))
        save_figure(fig, info, out_stem, rows)
    return info
