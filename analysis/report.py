"""`report.md`: figures and tables linked, every run's provenance, and every missing point with its reason."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from analysis.discover import Pending, Run, provenance, step_name
from analysis.figures import FigureInfo
from analysis.tables import Table
from common.io import replace_aside

TITLE = "# Transfer-curve report"   # report.md's first line: what marks `out` as a previous analysis's
DATA_DIR = "report_data"
SHARD = re.compile(r"e\d+(_t\d+)?\.js")   # analysis.html's shard files: all `report_data/` may hold
OUTPUTS = ("results.parquet", "results.csv", "intervals.csv", "figures", "tables", "report.md", "report.html", DATA_DIR,
           "cards")   # common.cards.CARDS_DIR: analyze cards=true


def set_aside(path: Path) -> None:
    print(f"[analyze] out: {path} is not from a previous analysis: renamed aside to {replace_aside(path).name}", flush=True)


def make_way(out: Path) -> None:
    """Rename aside each of analyze's outputs found in `out` unless `out/report.md` marks it as a previous
    analysis's; a previous analysis's are rewritten (`report_data/`: see analysis.html.write_shards), its figures
    and tables removed first (one this analysis does not write must not read as its), or their dir renamed aside
    when it holds a file that report did not link."""
    report = out / "report.md"
    if report.is_file() and not report.is_symlink() and (text := report.read_text("utf-8", "replace")).startswith(TITLE):
        for d in (out / "figures", out / "tables"):
            if d.is_symlink() or d.exists() and not all(p.is_file() and f"]({d.name}/{p.name})" in text for p in d.iterdir()):
                set_aside(d)
            for p in d.iterdir() if d.is_dir() else ():
                p.unlink()
        return
    for name in OUTPUTS:
        if (out / name).exists() or (out / name).is_symlink():
            set_aside(out / name)


@dataclass(frozen=True)
class MissingPoint:
    arm: str
    seed: int
    step: int
    bench: str
    reason: str

    count = 1

    def line(self) -> str:
        return f"{self.arm}/seed{self.seed}/{step_name(self.step)} × {self.bench}: {self.reason}"


@dataclass(frozen=True)
class MissingSteps:
    """Many expected checkpoints of one run not written yet, as one line: their count, first and last few."""
    arm: str
    seed: int
    steps: Pending
    bench: str
    reason: str

    @property
    def count(self) -> int:
        return len(self.steps)

    def line(self) -> str:
        return f"{self.arm}/seed{self.seed}: {self.count} checkpoints at steps {self.steps.shown()} × {self.bench}: {self.reason}"


def missing_count(missing: list) -> int:
    """The points a list of missing points (MissingPoint, MissingSteps) stands for."""
    return sum(m.count for m in missing)


def anchor_text(anchor: str | None, anchor_dir: Path) -> str:
    """Which base model the report's anchor rows are (Markdown; report.html renders the same line)."""
    return (f"Base model `{anchor}` evaluated with `prompt=anchor_nudge` into `{anchor_dir}` (step 0)." if anchor
            else f"No `anchor=` given; re-used whatever `{anchor_dir}` holds (see missing points).")


def ignored_head(ignored: list[Path]) -> str:
    """The line over the run dirs renamed aside (Markdown; report.html renders the same line)."""
    return f"Ignored ({len(ignored)}): renamed aside by `resume=never` / `overwrite=true` (kept, not analysed):"


def _rel(path: Path, base: Path) -> str:
    return Path(os.path.relpath(path, base)).as_posix()


def _run_rows(runs: list[Run]) -> list[str]:
    lines = ["| arm | seed | status | checkpoints | evaluated | provenance |", "|---|---|---|---|---|---|"]
    for r in runs:
        prov = provenance(r.manifest)
        prov_text = "<br>".join(f"`{k}`: `{v}`" for k, v in prov.items()) if prov else "no manifest.json"
        status = r.status()
        ckpts = ", ".join(str(s) for s in sorted(r.checkpoints)) or "none"
        evals = ", ".join(str(s) for s in sorted(r.evals)) or "none"
        lines.append(f"| {r.arm} | {r.seed} | {status} | {ckpts} | {evals} | {prov_text} |")
    return lines


def write_report(out: Path, *, runs: list[Run], figures: list[FigureInfo], tables: dict[str, Table],
                 table_paths: dict[str, list[Path]], results_paths: list[Path], anchor: str | None,
                 anchor_dir: Path, missing: list[MissingPoint], problems: list[str], settings: dict,
                 ignored: list[Path] = (), intervals: Path | None = None, partial: str | None = None,
                 evaluated_under: list[str] = (), too_long: dict | None = None) -> Path:
    """`partial` (analysis.sweep.partial_line: some expected point failed to evaluate) is the first line;
    `evaluated_under`: the evaluations' settings block (analysis.eval_settings.EvalSettings.lines) under analyze's own;
    `too_long`: (arm, seed, step, bench) -> how many of the point's scored items never generated a token
    (analysis.collect.Collected.too_long), each listed after the missing points."""
    out = Path(out)
    lines = [f"{TITLE}: {partial}" if partial else TITLE, ""]
    lines += ["Generated by `analyze`. Every number traces back to an eval dir under the runs listed below; "
              "the tidy table is " + ", ".join(f"[`{_rel(p, out)}`]({_rel(p, out)})" for p in results_paths) + "."
              + (f" Every interval's bounds, what it covers (items, seeds or both) and its n: "
                 f"[`{_rel(intervals, out)}`]({_rel(intervals, out)})." if intervals else ""), ""]
    lines += ["Settings: " + ", ".join(f"`{k}={v}`" for k, v in settings.items()), ""]
    lines += [*evaluated_under, ""] if evaluated_under else []
    lines += ["## Figures", ""]
    for fig in figures:
        png = next(p for p in fig.paths if p.suffix == ".png")
        pdf = next(p for p in fig.paths if p.suffix == ".pdf")
        lines += [f"### {png.stem}", "", f"![{png.stem}]({_rel(png, out)})", "",
                  f"Vector: [`{_rel(pdf, out)}`]({_rel(pdf, out)}). Panels: {', '.join(fig.panels)}.", ""]
        lines += [fig.caption, ""] if fig.caption else []
        lines += [f"- {note}" for note in fig.notes.values()] + ([""] if fig.notes else [])
    lines += ["## Tables", ""]
    for name, table in tables.items():
        links = ", ".join(f"[`{_rel(p, out)}`]({_rel(p, out)})" for p in table_paths.get(name, []))
        lines += [f"### {name}", "", table.to_markdown(), f"Files: {links}", ""]
    lines += ["## Anchor", "", anchor_text(anchor, anchor_dir), ""]
    lines += ["## Runs and provenance", ""] + _run_rows(runs) + [""]
    if ignored:
        lines += [ignored_head(ignored), ""] + [f"- `{p}`" for p in ignored] + [""]
    lines += [f"## Missing points ({missing_count(missing)})", ""]
    lines += [f"- {m.line()}" for m in missing] or ["None: every expected (checkpoint × bench) has a result."]
    lines += [""]
    if too_long:
        lines += [f"## Points with items that never generated ({len(too_long)})", "",
                  "Items that stopped at `context_limit` before their first generated token (their first prompt did "
                  "not fit `max_model_len`): each is scored 0 in its point's value above, which no answer of the model's "
                  "made.", ""]
        lines += [f"- {MissingPoint(*key, why).line()}" for key, why in sorted(too_long.items())] + [""]
    if problems:
        lines += [f"## Problems reading inputs ({len(problems)})", ""] + [f"- {p}" for p in problems] + [""]
    path = out / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
