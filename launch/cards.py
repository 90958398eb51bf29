"""`analyze cards=true`: a model card (common.cards) per evaluated final checkpoint, into `<out>/cards/`."""
from __future__ import annotations

from pathlib import Path

from analysis.discover import discover_runs
from common.cards import write_report_cards


def report_cards(cfg, profile: str | None) -> list[Path]:
    """`<out>/cards/<arm>-s<seed>-step<N>.md` for each run's final checkpoint that has an evaluation; the
    card shows only the report's results whose evaluation recorded that checkpoint's digest."""
    runs = discover_runs(Path(cfg.runs_root), profile)
    finals = [(r.arm, r.seed, r.checkpoints[max(r.checkpoints)]) for r in runs
              if r.checkpoints and max(r.checkpoints) in r.evals]
    written = write_report_cards(cfg.out, finals, study=cfg.study or None)
    if written:
        print(f"[analyze] {len(written)} model card(s) -> {Path(cfg.out) / 'cards'}", flush=True)
    return written
