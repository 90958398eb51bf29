"""Incremental evaluation (`analyze`'s planning half, local and Slurm; docs/stages/analyze.md): every checkpoint ×
bench not yet evaluated under the identity asked for (the evals harness's rule, never a bench name in summary.json),
and the anchor once; one call per checkpoint with its pending benches, a failing call a gap, never raised."""
from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from functools import cache, partial
from pathlib import Path
from typing import Any, Callable

from omegaconf import DictConfig

from analysis.discover import ANCHOR_ARM, Run, anchor_eval_dir, read_json_object, step_name
from analysis.errors import AnalysisError
from common.cli import ConfigError
from common.io import write_json

Evaluator = Callable[[dict[str, Any]], dict]


class Harness:
    """What analyze needs from the evals harness (`check_settings` sets `opts` and `settings`), given one checkpoint's
    `request(job)`: `evaluate(cfg)` (its summary), `pending(cfg)` ({bench: how its held identity differs}, no model
    loaded) and `check(cfg)` (the settings every request resolves to; a ConfigError for one evaluate would refuse).
    A stand-in (tests) subclasses it and implements those three on the request as a dict (`Harness.request`)."""

    evaluator: Evaluator | None = None   # a caller's evaluate (a test's counting one), given each request as a dict
    opts: dict[str, Any] = {}            # what each evaluation is given (eval.*, the profile)
    settings: Any = None                 # check's answer (None: not checked, or refused)
    template = staticmethod(lambda cfg: None)   # a setting the request's chat template cannot take (why); here: not checked

    def request(self, job: EvalJob) -> Any:
        cfg = {**self.opts, "ckpt": job.ckpt, "benches": list(job.benches), "out": job.out, "prompt": job.prompt}
        return {**cfg, "overwrite": True} if job.stale else cfg


class EvalsHarness(Harness):
    """The evals harness (imported when it is made: aggregation alone must not need it). With the analysis's
    resolved settings, a request is an evals.config.Resolved, resolving nothing again."""

    def __init__(self, evaluator: Evaluator | None = None):
        try:
            from evals import config, identity, run
        except ImportError as exc:
            raise AnalysisError(f"the evals harness is not importable ({exc}); use evaluate=false to only aggregate") from exc
        self.config, self.evaluator, self.ids = config, evaluator, cache(identity.checkpoint_identity)   # once per checkpoint
        self.evaluate, self.pending, self.check = run.evaluate, run.to_evaluate, partial(config.resolve, engine=True)
        self.template = lambda resolved: run.thinking_problem(resolved.cfg)   # (analyze checks planned jobs on checked settings only)

    def request(self, job: EvalJob) -> Any:
        """`job`'s config made from the resolved settings (overwrite when a bench is held under another identity:
        evaluate renames the old results aside) and its checkpoint's identity."""
        if not isinstance(self.settings, DictConfig):   # refused settings: each evaluation says why (a gap)
            return super().request(job)
        cfg = self.config.for_checkpoint(self.settings, job.ckpt, job.out, job.benches, job.prompt,
                                         overwrite=True if job.stale else None)
        return self.config.Resolved(cfg, self.ids(str(cfg.ckpt)))


def harness(evaluator: Harness | Evaluator | None = None) -> Harness:
    """`evaluator` when it is a stand-in harness, else the evals harness (a plain callable: as its evaluate)."""
    return evaluator if isinstance(evaluator, Harness) else EvalsHarness(evaluator)


@dataclass
class EvalJob:
    arm: str
    seed: int
    step: int
    ckpt: str
    out: str
    benches: list[str]
    prompt: str
    # bench -> how the identity it is held under differs from the one asked for (re-evaluated aside)
    stale: dict[str, list[str]] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.arm}/seed{self.seed}/{step_name(self.step)}"

    def record(self) -> dict[str, Any]:
        """This job as an evaluation job's config and outcome hold it (`EvalJob(**record)` reads it back)."""
        return {k: v for k, v in vars(self).items() if k != "stale"}


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
        """Why that point's evaluation failed, or None."""
        return next((f.error for f in self.failures
                     if (f.job.arm, f.job.seed, f.job.step) == (arm, seed, step) and bench in f.benches), None)


def summary_benches(eval_dir: Path) -> set[str]:
    """Benches in `<eval_dir>/summary.json` (empty when absent or unreadable)."""
    return {k for k, v in (read_json_object(Path(eval_dir) / "summary.json", []) or {}).items() if isinstance(v, dict)}


def check_settings(h: Harness, eval_opts: dict[str, Any], benches: list[str]) -> None:
    """What every evaluate call of this analysis would refuse (a bad value, an unknown key or bench, a missing corpus),
    refused before any work: one AnalysisError. Sets `h.opts` and `h.settings`, what every evaluation resolves to."""
    h.opts, h.settings = eval_opts, None
    try:
        h.settings = h.check({**eval_opts, "ckpt": "<checkpoint>", "benches": list(benches), "out": "<checkpoint>"})
    except ConfigError as exc:
        raise AnalysisError(f"evaluation settings (eval.KEY=...): {exc}") from exc


def candidates(runs: list[Run], benches: list[str], prompt: str, anchor: str | None, anchor_dir: Path,
               profile: str | None) -> list[EvalJob]:
    """Every checkpoint of `runs` and the anchor (when given, with prompt=anchor_nudge, as step 0), every bench."""
    jobs = [EvalJob(r.arm, r.seed, step, str(ckpt), str(r.eval_dir(step)), list(benches), prompt)
            for r in runs for step, ckpt in sorted(r.checkpoints.items())]
    if anchor is not None:
        jobs.append(EvalJob(ANCHOR_ARM, 0, 0, str(anchor), str(anchor_eval_dir(anchor_dir, profile)), list(benches), "anchor_nudge"))
    return jobs


def plan(h: Harness, jobs: list[EvalJob]) -> list[EvalJob]:
    """The `jobs` (candidates) with benches left to evaluate under their identity, each cut to them. An out dir the
    harness cannot read (a corrupt meta.json) keeps every bench: evaluate fails on it, a listed gap, not the sweep's end."""
    left_jobs = []
    for job in jobs:
        try:
            left = h.pending(h.request(job))
        except ConfigError:   # every bench, none stale
            left = dict.fromkeys(job.benches, [])
        if left:
            job.benches = [b for b in job.benches if b in left]
            job.stale = {b: diff for b, diff in left.items() if diff}
            left_jobs.append(job)
    return left_jobs


def run_job(job: EvalJob, h: Harness, anchor_dir: Path) -> list[EvalFailure]:
    """Evaluate one checkpoint's pending benches; what failed (an exception, a bench the harness
    wrote no summary for) is returned, never raised."""
    Path(job.out).mkdir(parents=True, exist_ok=True)
    if job.arm == ANCHOR_ARM:
        write_json(Path(anchor_dir) / "anchor.json", {"model": job.ckpt, "prompt": job.prompt})
    for bench, diff in job.stale.items():
        print(f"[analyze] {job.label} × {bench}: {job.out} holds it under another evaluation identity "
              f"({'; '.join(diff)}); re-evaluating (the old results are renamed aside)", flush=True)
    try:
        h.evaluator(Harness.request(h, job)) if h.evaluator else h.evaluate(h.request(job))
    except Exception as exc:  # one bad checkpoint must not stop the sweep: it becomes a listed gap (its last line)
        return [EvalFailure(job, list(job.benches), traceback.format_exception_only(exc)[-1].strip())]
    written = summary_benches(job.out)  # what the harness wrote is the whole truth
    absent = [b for b in job.benches if b not in written]
    return [EvalFailure(job, absent, "the harness returned no summary for it")] if absent else []
