"""Incremental evaluation (`analyze`'s planning half, local and Slurm): every (checkpoint × bench) not yet
evaluated under the identity asked for (the evals harness's rule, never a bench name in summary.json), plus the
anchor once; one call per checkpoint with its pending benches, a failing call a gap in the report, never raised
(docs/stages/analyze.md)."""
from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from omegaconf import DictConfig

from analysis.discover import ANCHOR_ARM, Run, anchor_eval_dir, read_json_object, step_name
from analysis.errors import AnalysisError
from common.cli import ConfigError
from common.io import write_json
from common.tiny import resolve_model_path

Evaluator = Callable[[dict[str, Any]], dict]
ANCHOR_PROMPT = "anchor_nudge"


class Harness:
    """What analyze needs from the evals harness, each method given one checkpoint's request (`EvalJob.given`):
    `evaluate(cfg)` (its summary), `pending(cfg)` ({bench: how the identity it is held under differs}: what
    evaluate has left, no model loaded) and `check(cfg)` (the settings every request of an analysis resolves to,
    its ckpt and out stand-ins; a ConfigError for one evaluate would refuse). A stand-in (tests) subclasses this
    class and implements those three on the request as a dict (`EvalJob.config`)."""

    evaluator: Evaluator | None = None   # a caller's evaluate (a test's counting one), given each request as a dict

    def template(self, cfg) -> str | None:
        """A setting the request's checkpoint's chat template cannot take (why), else None; here: not checked."""
        return None


class EvalsHarness(Harness):
    """The evals harness (imported when it is made: aggregation alone must not need it). With the analysis's
    resolved settings, a request is made once per checkpoint (`plan_request`: evals.config.Resolved)."""

    def __init__(self, evaluator: Evaluator | None = None):
        try:
            from evals import config, run
        except ImportError as exc:
            raise AnalysisError(f"the evals harness is not importable ({exc}); use evaluate=false to only aggregate") from exc
        self.config, self.run, self.evaluator = config, run, evaluator

    def evaluate(self, cfg) -> dict:
        return self.run.evaluate(cfg)

    def pending(self, cfg) -> dict[str, list[str]]:
        return self.run.to_evaluate(cfg)

    def check(self, cfg: dict[str, Any]) -> Any:
        return self.config.resolve_request(cfg)

    def template(self, cfg) -> str | None:
        return self.run.thinking_problem(cfg.cfg if isinstance(cfg, self.config.Resolved) else self.config.resolve(cfg))


def harness(evaluator: Harness | Evaluator | None = None) -> Harness:
    """`evaluator` when it is a stand-in harness, else the evals harness (a plain callable: as its evaluate)."""
    return evaluator if isinstance(evaluator, Harness) else EvalsHarness(evaluator)


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
    # evals.config.Resolved: this evaluation's config, made once from the analysis's resolved settings, and the
    # checkpoint's identity (plan_request); None: given as the dict `config` makes
    request: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        self.out = Path(self.out)

    @property
    def label(self) -> str:
        return f"{self.arm}/seed{self.seed}/{step_name(self.step)}"

    def record(self) -> dict[str, Any]:
        """This job as an evaluation job's config and outcome hold it (`EvalJob(**record)` reads it back)."""
        return {k: str(v) if k == "out" else v for k, v in vars(self).items() if k not in ("stale", "request")}

    def config(self, eval_opts: dict[str, Any]) -> dict[str, Any]:
        cfg = {**eval_opts, "ckpt": self.ckpt, "benches": list(self.benches), "out": str(self.out), "prompt": self.prompt}
        return {**cfg, "overwrite": True} if self.stale else cfg

    def given(self, eval_opts: dict[str, Any]):
        """What the harness is given for this job: its planned request, else its dict."""
        return self.config(eval_opts) if self.request is None else self.request


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


def check_settings(h: Harness, eval_opts: dict[str, Any], benches: list[str]):
    """What every evaluate call of this analysis would refuse (a bad value, an unknown key or bench, a missing
    corpus), refused before any work: one AnalysisError. Returns the config every evaluation resolves to (its
    ckpt and out: stand-ins), as the harness resolves it."""
    try:
        return h.check({**eval_opts, "ckpt": "<checkpoint>", "benches": list(benches), "out": "<checkpoint>"})
    except ConfigError as exc:
        raise AnalysisError(f"evaluation settings (eval.KEY=...): {exc}") from exc


def check_templates(h: Harness, jobs: list[EvalJob], eval_opts: dict[str, Any]) -> None:
    """Refuse, before any evaluation (also under dry_run), a setting a planned checkpoint's chat template
    cannot take (every evaluate of it would fail after loading): one AnalysisError naming the checkpoints."""
    problems = []
    for job in jobs:
        try:
            problems += [why] if (why := h.template(job.given(eval_opts))) else []
        except (ConfigError, OSError, ValueError, RuntimeError):   # its tokenizer does not load: its evaluation says so
            pass
    if problems:
        more = f" (and {len(problems) - 1} more checkpoint(s))" if len(problems) > 1 else ""
        raise AnalysisError(f"evaluation settings (eval.KEY=...): {problems[0]}{more}")


def plan_request(job: EvalJob, settings: DictConfig) -> None:
    """`job.request` made from the analysis's resolved `settings` (its benches left; overwrite when one is held
    under another identity: evaluate renames the old results aside), its checkpoint's identity computed once."""
    from evals.config import Resolved, for_checkpoint
    from evals.identity import checkpoint_identity

    cfg = for_checkpoint(settings, job.ckpt, str(job.out), job.benches, job.prompt, overwrite=True if job.stale else None)
    job.request = Resolved(cfg, job.request.ckpt_id if job.request is not None else checkpoint_identity(str(cfg.ckpt)))


def candidates(runs: list[Run], benches: list[str], prompt: str, anchor: str | None, anchor_dir: Path,
               profile: str | None) -> list[EvalJob]:
    """Every checkpoint of `runs` and the anchor (when given, with prompt=anchor_nudge, as step 0), every bench."""
    jobs = [EvalJob(r.arm, r.seed, step, str(ckpt), r.eval_dir(step), list(benches), prompt)
            for r in runs for step, ckpt in sorted(r.checkpoints.items())]
    if anchor is not None:
        jobs.append(EvalJob(ANCHOR_ARM, 0, 0, str(anchor), anchor_eval_dir(anchor_dir, profile), list(benches), ANCHOR_PROMPT))
    return jobs


def plan(h: Harness, jobs: list[EvalJob], eval_opts: dict[str, Any], settings=None) -> list[EvalJob]:
    """The `jobs` (candidates) with benches left to evaluate under their identity, each cut to them. An out dir
    the harness cannot read (a corrupt meta.json) keeps every bench: evaluate then fails on it, a listed gap, not
    the end of the sweep. `settings`: the analysis's resolved evaluate config (check_settings; the evals
    harness's), from which each job's request is made (plan_request)."""
    made, left_jobs = isinstance(settings, DictConfig), []
    for job in jobs:
        try:
            if made:
                plan_request(job, settings)
            left = h.pending(job.given(eval_opts))
        except ConfigError:
            left_jobs.append(job)
            continue
        if left:
            job.benches = [b for b in job.benches if b in left]
            job.stale = {b: diff for b, diff in left.items() if diff}
            if made:
                plan_request(job, settings)
            left_jobs.append(job)
    return left_jobs


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
        h.evaluator(job.config(eval_opts)) if h.evaluator else h.evaluate(job.given(eval_opts))
    except Exception as exc:  # one bad checkpoint must not stop the sweep: it becomes a listed gap
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        return [EvalFailure(job, list(job.benches), last)]
    written = summary_benches(job.out)  # what the harness wrote is the whole truth
    absent = [b for b in job.benches if b not in written]
    return [EvalFailure(job, absent, "the harness returned no summary for it")] if absent else []
