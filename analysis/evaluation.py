"""Incremental evaluation: every (checkpoint × bench) without a summary entry, plus the anchor once.

The evals harness is reached only through its Python API `evals.run.evaluate(cfg) -> summary`
(injected here as `evaluator`, so tests can count calls). One call per checkpoint with just its
missing benches; afterwards `summary.json` holds the union of old and new benches, so a second
sweep finds nothing to do. A failing call is recorded (and shown as gaps in the report), never raised.
"""
from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tqdm import tqdm

from analysis.discover import ANCHOR_ARM, Run, read_json_object, step_name
from common import layout
from common.io import write_json
from analysis.errors import AnalysisError

Evaluator = Callable[[dict[str, Any]], dict]
ANCHOR_PROMPT = "anchor_nudge"


@dataclass
class EvalJob:
    arm: str
    seed: int
    step: int
    ckpt: str
    out: Path
    benches: list[str]
    prompt: str

    @property
    def label(self) -> str:
        return f"{self.arm}/seed{self.seed}/{step_name(self.step)}"


@dataclass
class EvalFailure:
    job: EvalJob
    benches: list[str]
    error: str


@dataclass
class EvalReport:
    jobs: list[EvalJob] = field(default_factory=list)
    failures: list[EvalFailure] = field(default_factory=list)

    def failed(self, arm: str, seed: int, step: int, bench: str) -> str | None:
        for f in self.failures:
            j = f.job
            if (j.arm, j.seed, j.step) == (arm, seed, step) and bench in f.benches:
                return f.error
        return None


def summary_benches(eval_dir: Path) -> set[str]:
    """Benches already in `<eval_dir>/summary.json` (empty when absent or unreadable: then re-evaluate)."""
    return {k for k, v in _read_summary_dict(Path(eval_dir)).items() if isinstance(v, dict)}


def anchor_eval_dir(anchor_dir: Path, profile: str | None = None) -> Path:
    return layout.eval_dir(anchor_dir, 0, profile)


def check_anchor_identity(anchor_dir: Path, anchor: str | None) -> None:
    """The anchor dir is re-used only for the same base model: a different one must not inherit its numbers."""
    meta = Path(anchor_dir) / "anchor.json"
    if anchor is None or not meta.exists():
        return
    recorded = (read_json_object(meta, []) or {}).get("model")
    if recorded != str(anchor):
        raise AnalysisError(
            f"{meta} records anchor {recorded!r} but anchor={anchor!r} was given; "
            f"pass anchor_dir=<another dir> or remove {anchor_dir} to re-evaluate")


def plan(runs: list[Run], benches: list[str], anchor: str | None, anchor_dir: Path, prompt: str,
         profile: str | None = None) -> list[EvalJob]:
    jobs = []
    for run in runs:
        for step, ckpt in sorted(run.checkpoints.items()):
            missing = [b for b in benches if b not in summary_benches(run.eval_dir(step))]
            if missing:
                jobs.append(EvalJob(run.arm, run.seed, step, str(ckpt), run.eval_dir(step), missing, prompt))
    if anchor is not None:
        out = anchor_eval_dir(anchor_dir, profile)
        missing = [b for b in benches if b not in summary_benches(out)]
        if missing:
            jobs.append(EvalJob(ANCHOR_ARM, 0, 0, str(anchor), out, missing, ANCHOR_PROMPT))
    return jobs


def _merge_summary(out: Path, before: dict, returned: Any) -> dict:
    """Old benches + whatever the harness wrote + what it returned, written back atomically."""
    merged = {**before, **_read_summary_dict(out)}
    if isinstance(returned, dict):
        merged.update({k: v for k, v in returned.items() if isinstance(v, dict)})
    if merged:
        write_json(out / "summary.json", merged)
    return merged


def _read_summary_dict(out: Path) -> dict:
    return read_json_object(out / "summary.json", []) or {}


def run_jobs(jobs: list[EvalJob], evaluator: Evaluator, eval_opts: dict[str, Any], anchor_dir: Path) -> EvalReport:
    report = EvalReport(jobs=list(jobs))
    for job in tqdm(jobs, desc="evaluate", unit="ckpt", disable=not jobs):
        job.out.mkdir(parents=True, exist_ok=True)
        if job.arm == ANCHOR_ARM:
            write_json(Path(anchor_dir) / "anchor.json", {"model": job.ckpt, "prompt": job.prompt})
        before = _read_summary_dict(job.out)
        cfg = {**eval_opts, "ckpt": job.ckpt, "benches": list(job.benches), "out": str(job.out), "prompt": job.prompt}
        try:
            returned = evaluator(cfg)
        except Exception as exc:  # one bad checkpoint must not stop the sweep: it becomes a listed gap
            last = traceback.format_exception_only(type(exc), exc)[-1].strip()
            report.failures.append(EvalFailure(job, list(job.benches), last))
            _merge_summary(job.out, before, None)
            continue
        merged = _merge_summary(job.out, before, returned)
        absent = [b for b in job.benches if not isinstance(merged.get(b), dict)]
        if absent:
            report.failures.append(EvalFailure(job, absent, "the harness returned no summary for it"))
    return report


def default_evaluator(cfg: dict[str, Any]) -> dict:
    """The evals harness's Python API (imported lazily: aggregation alone must not need it)."""
    try:
        from evals.run import evaluate
    except ImportError as exc:
        raise RuntimeError(f"the evals harness is not importable ({exc}); use evaluate=false to only aggregate") from exc
    return evaluate(cfg)
