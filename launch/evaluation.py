"""Incremental evaluation (`analyze`'s planning half): every (checkpoint × bench) not yet evaluated under
the identity asked for, plus the anchor once.

The evals harness is reached through its Python API only, behind `Harness` (tests subclass it, e.g. to count
calls). "Already evaluated" is decided by evaluation identity (checkpoint content digest + every
result-changing setting + n, seed, bench file), never by a bench name in `summary.json`; a bench held under
another identity is re-evaluated with `overwrite=true` (evaluate renames the old results aside). One call
per checkpoint with just its pending benches; a failing call is a gap in the report, never raised; a bad
evaluation setting is refused before any work (`check_settings`).
"""
from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tqdm import tqdm

from analysis.discover import ANCHOR_ARM, Run, anchor_eval_dir, read_json_object, step_name
from common.cli import ConfigError
from common.io import write_json
from common.tiny import resolve_model_path
from analysis.errors import AnalysisError

Evaluator = Callable[[dict[str, Any]], dict]
ANCHOR_PROMPT = "anchor_nudge"
# Stands in for the checkpoint when the settings are checked before any checkpoint is looked at.
_ANY_CKPT = "<checkpoint>"


class Harness:
    """What analyze needs from the evals harness, for one checkpoint's evaluation (an `EvalJob`). The real one is
    `EvalsHarness`; a stand-in (tests) subclasses this class and implements `evaluate`, `pending` and `check`, each
    given the request as the dict `EvalJob.config` makes (`given`)."""

    def evaluate(self, cfg) -> dict:
        """Evaluate the request's benches on its checkpoint into its out dir; the summary."""
        raise NotImplementedError

    def pending(self, cfg) -> dict[str, list[str]]:
        """{bench: differences}: the benches `evaluate(cfg)` has left to do, by identity (no model loaded); a bench
        held under another identity lists how it differs."""
        raise NotImplementedError

    def check(self, cfg: dict[str, Any]) -> Any:
        """The settings every evaluation of an analysis resolves to (its ckpt and out stand-ins); a ConfigError
        for a request evaluate would refuse."""
        raise NotImplementedError

    def template(self, cfg) -> str | None:
        """A setting one checkpoint's chat template cannot take (why), else None; here: not checked."""
        return None

    def plan(self, job: EvalJob, settings) -> None:
        """Make `job`'s request from the analysis's resolved `settings` (`check`'s), once per change of its
        benches; a stand-in's request is its dict (`given`): nothing to make."""

    def given(self, job: EvalJob, eval_opts: dict[str, Any]):
        """What `pending`, `template` and `evaluate` are given for `job`: its planned request, else its dict."""
        return job.config(eval_opts) if job.request is None else job.request

    def run(self, job: EvalJob, eval_opts: dict[str, Any]) -> dict:
        """Evaluate `job` (run_job)."""
        return self.evaluate(self.given(job, eval_opts))


class EvalsHarness(Harness):
    """The evals harness (imported when the harness is made: aggregation alone must not need it). A request is
    planned once per checkpoint: its config made from the analysis's resolved settings and its checkpoint's
    identity computed once (`plan`: evals.config.Resolved), for pending, template and evaluate."""

    def __init__(self):
        try:
            import evals.run  # noqa: F401
        except ImportError as exc:
            raise AnalysisError(f"the evals harness is not importable ({exc}); use evaluate=false to only aggregate") from exc

    def evaluate(self, cfg) -> dict:
        from evals.run import evaluate

        return evaluate(cfg)

    def pending(self, cfg) -> dict[str, list[str]]:
        from evals.run import to_evaluate

        return to_evaluate(cfg)

    def check(self, cfg: dict[str, Any]) -> Any:
        from evals.config import resolve_request

        return resolve_request(cfg)

    def template(self, cfg) -> str | None:
        from evals.config import Resolved, resolve
        from evals.run import thinking_problem

        return thinking_problem(cfg.cfg if isinstance(cfg, Resolved) else resolve(cfg))

    def plan(self, job: EvalJob, settings) -> None:
        from evals.config import Resolved, for_checkpoint
        from evals.identity import checkpoint_identity

        # overwrite when a bench is held under another identity (evaluate renames the old results aside)
        cfg = for_checkpoint(settings, job.ckpt, str(job.out), job.benches, job.prompt,
                             overwrite=True if job.stale else None)
        job.request = Resolved(cfg, job.request.ckpt_id if job.request is not None else checkpoint_identity(str(cfg.ckpt)))


class Evaluating(EvalsHarness):
    """The evals harness with a caller's `evaluate` callable (a test's counting or scripted one), given each
    checkpoint's request as the dict `EvalJob.config` makes; pending, check and template stay the harness's."""

    def __init__(self, evaluator: Evaluator):
        super().__init__()
        self.evaluator = evaluator

    def run(self, job: EvalJob, eval_opts: dict[str, Any]) -> dict:
        return self.evaluator(job.config(eval_opts))


def harness(evaluator: Harness | Evaluator | None = None) -> Harness:
    """The harness analyze evaluates with: `evaluator` itself when it is one (a stand-in), the evals harness
    with `evaluator` as its evaluate when it is a plain callable, else the evals harness."""
    if isinstance(evaluator, Harness):
        return evaluator
    return EvalsHarness() if evaluator is None else Evaluating(evaluator)


def check_templates(h: Harness, jobs: list[EvalJob], eval_opts: dict[str, Any]) -> None:
    """Refuse, before any evaluation (also under dry_run), a setting a planned checkpoint's chat template
    cannot take (every evaluate of it would fail after loading): one AnalysisError naming the checkpoints."""
    problems = []
    for job in jobs:
        try:
            why = h.template(h.given(job, eval_opts))
        except (ConfigError, OSError, ValueError, RuntimeError):   # its tokenizer does not load: its evaluation says so
            why = None
        if why:
            problems.append(why)
    if problems:
        more = f" (and {len(problems) - 1} more checkpoint(s))" if len(problems) > 1 else ""
        raise AnalysisError(f"evaluation settings (eval.KEY=...): {problems[0]}{more}")


@dataclass
class EvalJob:
    arm: str
    seed: int
    step: int
    ckpt: str
    out: Path
    benches: list[str]
    prompt: str
    # bench -> how the identity it is held under differs from the one asked for (re-evaluated aside)
    stale: dict[str, list[str]] = field(default_factory=dict)
    # the real harness's request (evals.config.Resolved: this evaluation's config, resolved once from the
    # analysis's settings, and the checkpoint's identity); None: a stand-in's, given job.config(...)
    request: Any = field(default=None, repr=False, compare=False)

    @property
    def label(self) -> str:
        return f"{self.arm}/seed{self.seed}/{step_name(self.step)}"

    def config(self, eval_opts: dict[str, Any]) -> dict[str, Any]:
        cfg = {**eval_opts, "ckpt": self.ckpt, "benches": list(self.benches), "out": str(self.out),
               "prompt": self.prompt}
        return {**cfg, "overwrite": True} if self.stale else cfg


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
    """Benches in `<eval_dir>/summary.json` (empty when absent or unreadable)."""
    return {k for k, v in (read_json_object(Path(eval_dir) / "summary.json", []) or {}).items() if isinstance(v, dict)}


def check_settings(h: Harness, eval_opts: dict[str, Any], benches: list[str]):
    """Refuse, before any work, what every evaluate call of this analysis would refuse (a bad value,
    an unknown key or bench, a missing corpus): one AnalysisError naming it. Returns the evaluate config
    every evaluation of it resolves to (its ckpt and out: `<checkpoint>`), as the harness resolves it."""
    try:
        return h.check({**eval_opts, "ckpt": _ANY_CKPT, "benches": list(benches), "out": _ANY_CKPT})
    except ConfigError as exc:
        raise AnalysisError(f"evaluation settings (eval.KEY=...): {exc}") from exc


def _pending(h: Harness, job: EvalJob, eval_opts: dict[str, Any], settings=None) -> EvalJob | None:
    """`job` cut to the benches not yet evaluated under its identity (None: nothing to do). An out dir
    the harness cannot read (a corrupt meta.json) keeps every bench: evaluate then fails on it, and
    that checkpoint becomes a listed gap, not the end of the sweep. With the analysis's resolved
    `settings` (check_settings) and the real harness, the job's config is made from them once and its
    checkpoint's identity computed once (job.request), for pending, its template check and evaluate."""
    try:
        if settings is not None:
            h.plan(job, settings)
        pending = h.pending(h.given(job, eval_opts))
    except ConfigError:
        return job
    if not pending:
        return None
    job.benches = [b for b in job.benches if b in pending]
    job.stale = {b: diff for b, diff in pending.items() if diff}
    if settings is not None:   # what evaluate runs: the benches left, overwrite when one is held under another identity
        h.plan(job, settings)
    return job


def check_anchor_identity(anchor_dir: Path, anchor: str | None) -> None:
    """The anchor dir is re-used only for the same base model: a different one must not inherit its numbers."""
    meta = Path(anchor_dir) / "anchor.json"
    if anchor is None or not meta.exists():
        return
    recorded = (read_json_object(meta, []) or {}).get("model")
    if recorded != str(anchor) and not (isinstance(recorded, str) and resolve_model_path(recorded) == str(anchor)):
        # (an embedded name recorded before analyze resolved it, `tiny-base`, is its directory)
        raise AnalysisError(
            f"{meta} records anchor {recorded!r} but anchor={anchor!r} was given; "
            f"pass anchor_dir=<another dir> or remove {anchor_dir} to re-evaluate")


def plan(runs: list[Run], benches: list[str], anchor: str | None, anchor_dir: Path, prompt: str,
         profile: str | None = None, *, h: Harness, eval_opts: dict[str, Any], settings=None) -> list[EvalJob]:
    """One job per checkpoint (and the anchor) with the benches it has left, by evaluation identity;
    `settings`: the analysis's resolved evaluate config (check_settings), each job's made from it."""
    jobs = []
    for run in runs:
        for step, ckpt in sorted(run.checkpoints.items()):
            job = EvalJob(run.arm, run.seed, step, str(ckpt), run.eval_dir(step), list(benches), prompt)
            if (job := _pending(h, job, eval_opts, settings)) is not None:
                jobs.append(job)
    if anchor is not None:
        job = EvalJob(ANCHOR_ARM, 0, 0, str(anchor), anchor_eval_dir(anchor_dir, profile), list(benches), ANCHOR_PROMPT)
        if (job := _pending(h, job, eval_opts, settings)) is not None:
            jobs.append(job)
    return jobs


def run_job(job: EvalJob, h: Harness, eval_opts: dict[str, Any], anchor_dir: Path) -> list[EvalFailure]:
    """Evaluate one checkpoint's pending benches; what failed (an exception, a bench the harness
    wrote no summary for) is returned, never raised."""
    job.out.mkdir(parents=True, exist_ok=True)
    if job.arm == ANCHOR_ARM:
        write_json(Path(anchor_dir) / "anchor.json", {"model": job.ckpt, "prompt": job.prompt})
    for bench, diff in job.stale.items():
        print(f"[analyze] {job.label} × {bench}: {job.out} holds it under another evaluation identity "
              f"({'; '.join(diff)}); re-evaluating (the old results are renamed aside)", flush=True)
    try:
        h.run(job, eval_opts)
    except Exception as exc:  # one bad checkpoint must not stop the sweep: it becomes a listed gap
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        return [EvalFailure(job, list(job.benches), last)]
    written = summary_benches(job.out)  # what the harness wrote is the whole truth
    absent = [b for b in job.benches if b not in written]
    return [EvalFailure(job, absent, "the harness returned no summary for it")] if absent else []


def run_jobs(jobs: list[EvalJob], h: Harness, eval_opts: dict[str, Any], anchor_dir: Path) -> EvalReport:
    report = EvalReport(jobs=list(jobs))
    for job in tqdm(jobs, desc="evaluate", unit="ckpt", disable=not jobs):
        report.failures += run_job(job, h, eval_opts, anchor_dir)
    return report
