"""The study's published numbers beside the measured ones (`analyze study=NAME`).

One table, `tables/reference.md|tex`: per `reference_results` entry of the study file, what the
reference reported (labelled "reported", never given an interval) and, where the entry names an
`arm` (and `step`), the value measured here at that point: the mean over seeds of the tidy table's
rows. Nothing here feeds a measured cell, a figure or a CI: the other tables are computed without
the study file, so editing `reference_results` changes only this table.
"""
from __future__ import annotations

import pandas as pd

from analysis.tables import DASH, Column, Table
from common.study import ReferenceResult, Study


def _fmt(v: float | None) -> str:
    return DASH if v is None else f"{v:.3f}"


def reported_cell(r: ReferenceResult) -> str:
    if r.value is not None:
        text = _fmt(r.value)
    elif r.pre is not None and r.post is not None:
        text = f"{_fmt(r.pre)} → {_fmt(r.post)}"
    else:
        text = DASH
    return text + (f" ({r.note})" if r.note else "")


def _measured_at(table: pd.DataFrame, arm: str, step: int, bench: str, metric: str) -> tuple[float, int, int] | None:
    """(mean over seeds, seeds, n per seed) of one point, or None when the analysis has none."""
    rows = table[(table.arm == arm) & (table.step == step) & (table.bench == bench) & (table.metric == metric)]
    if rows.empty:
        return None
    return float(rows.value.mean()), int(rows.seed.nunique()), int(rows.n.max())


def _measured_text(point: tuple[float, int, int] | None) -> tuple[str, str]:
    return (DASH, "") if point is None else (f"{point[0]:.3f}", f"n={point[2]}, {point[1]} seed(s)")


def measured_cell(r: ReferenceResult, table: pd.DataFrame) -> str:
    if r.arm is None or table.empty:
        return DASH
    if r.value is not None:
        if r.step is None:
            return DASH
        text, detail = _measured_text(_measured_at(table, r.arm, r.step, r.bench, r.metric))
        return text if text == DASH else f"{text} ({detail})"
    steps = sorted(table[table.arm == r.arm].step.unique())
    if not steps:
        return DASH
    pre = _measured_at(table, r.arm, 0, r.bench, r.metric)
    post = _measured_at(table, r.arm, int(steps[-1]), r.bench, r.metric) if steps[-1] != 0 else None
    if pre is None and post is None:
        return DASH
    detail = _measured_text(post or pre)[1]
    return f"{_measured_text(pre)[0]} → {_measured_text(post)[0]} @{int(steps[-1])} ({detail})"


def reference_table(study: Study, table: pd.DataFrame) -> Table:
    cols = [Column(bench="", metric="", label=label, group="") for label in
            ("Bench", "Metric", "n reported", "Reported by the reference", "Measured here")]
    t = Table(caption=f"Reported by the reference (study {study.name}, {study.path.name} sha256 {study.sha256[:12]}): "
                      f"published numbers, not measured here and never part of an interval; beside them the mean "
                      f"over seeds measured by this analysis at the same arm and step ({DASH}: no such point).",
              columns=cols, row_header="Reference system")
    for r in study.reference_results:
        t.rows.append((r.system, [r.bench, r.metric, DASH if r.n is None else str(r.n), reported_cell(r),
                                  measured_cell(r, table)]))
    return t
