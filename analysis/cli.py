"""`analyze runs_root=runs [benches=[...]] [evaluate=true] [anchor=PATH_OR_HUB_ID] [out=reports] ...`"""
from __future__ import annotations

import sys

from common.cli import apply_overrides, run_cli, wants_help

HELP = """\
analyze: transfer curves, tables and a report from a sweep of runs.

  analyze runs_root=runs [benches=[nq,...,search_plan_ood]] [evaluate=true] [anchor=PATH_OR_HUB_ID]
          [key=value ...]   (every key and its default below; eval.KEY=V: any other evaluate key)

Discovers <runs_root>/<arm>/[<name>/]seed<seed>/ runs, evaluates every checkpoint × bench not yet evaluated
under the evaluation identity asked for (checkpoint content + settings; a result of another identity is
re-evaluated, the old one renamed aside), and the anchor once (prompt=anchor_nudge, as step 0); bad
evaluation settings are refused before anything runs. Then writes to `out`:
results.parquet/.csv (tidy: arm, seed, step, bench, metric, value, n), figures/*.pdf|png,
tables/*.md|tex, report.md (with provenance and every missing point) and report.html (the same, plus
every trajectory and a paired view of two checkpoints; its data in report_data/, loaded on demand from disk).
evaluate=false only aggregates. profile=NAME evaluates with recipes/eval/NAME.yaml into (and reads)
eval/NAME/ dirs, flags item counts that differ from its reference sizes, and benches defaults to its own.
Every analysis with a run's step-0 (or anchor) and later evaluations writes tables/prepost.md|tex.
launcher=slurm evaluates on a Slurm cluster instead: one array task per checkpoint still to evaluate
(slurm.gpus_per_task GPUs each, at most slurm.concurrency at once, requeue-safe; warned before the time
limit, a task stops and requeues itself while it makes progress), then an aggregation job (afterany) that
writes the report, failed tasks listed as gaps; slurm.runs=[DIR,...]: one job per run instead, each after
its slurm.runs_after dependency (analysis/slurm.py; docs/how-to/slurm.md).
study=NAME (recipes/study/NAME.yaml, or a path) adds tables/reference.md|tex: the study's published
numbers, labelled "reported", beside the values measured here (never part of a CI).
Evaluation keys (n, seed, backend, ...) go to the evals harness;
eval.KEY=VALUE passes any other harness key.

Keys (key=default  description):
"""


def main(argv: list[str] | None = None) -> int:
    return run_cli(_main, argv)


def _main(argv: list[str]) -> int:
    from analysis.sweep import ALIASES, KEYS, default_config, run_analysis
    from common import keydoc

    if wants_help(argv):
        print(HELP + keydoc.help_table(keydoc.from_table(KEYS)))
        return 0
    cfg = apply_overrides(default_config(), argv, aliases=ALIASES, open_prefixes=("eval.",))
    return print_result(run_analysis(cfg))


def print_result(result) -> int:
    """The closing line of an analysis (nothing for a dry run or a Slurm submission: they print their own)."""
    if result is None:
        return 0
    print(f"wrote {result.report} ({len(result.table)} result rows, {len(result.figures)} figures, "
          f"{len(result.tables)} tables; evaluated {len(result.evaluated.jobs)} checkpoint(s), "
          f"{len(result.evaluated.failures)} failed; {len(result.missing)} missing point(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
