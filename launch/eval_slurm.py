"""`analyze ... launcher=slurm`: the evaluations as Jobs (launch/jobs.py) that the SlurmRunner submits, then one
aggregation job (docs/stages/analyze.md says what a user sees).

What is still to evaluate is decided here as a local analyze decides it (by evaluation identity). The plan:
`eval`, a job array whose task i runs `python -m launch.eval_jobs eval-<i>.json` (one checkpoint's
evaluation), or with `slurm.runs` one job per run, `eval-run-<i>`, each after its training task and finding
the run's checkpoints when it starts; then `aggregate`, after all of them however they ended, running
`python -m launch.analyze analyze.yaml` (this request with `eval_tasks=` the evaluation configs: it evaluates
nothing, and a job that failed or wrote no outcome is a gap). Every evaluation job's config has one format
(`_task`). A job asks the harness what is left before it loads a model, so a requeued one resumes or exits 0;
warned before its time limit (`--signal=B:USR1@120`) it stops, keeping its rows, and requeues itself while it
makes progress (`evaluate_segment`).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf

from analysis.errors import AnalysisError
from common.io import read_json_object, write_json
from launch.evaluation import EvalFailure, EvalJob, EvalReport, _pending, harness, run_job
from launch.errors import LaunchError
from launch.jobs import Job, Needs, Resources, backend, dry_run, dry_run_dir

CONFIG = "analyze.yaml"
MODULE = "launch.eval_jobs"   # what every evaluation job runs: python -m launch.eval_jobs CONFIG
# Slurm's warning before an evaluation task's time limit: SIGUSR1 120 s before, to the batch shell, which is
# the task's python (the script execs it): it stops, keeps its rows and requeues itself (evaluate_segment).
WARNING = "B:USR1@120"


def check_launcher(cfg: DictConfig) -> None:
    """Refuse a bad `launcher` / `slurm.*` value before any work."""
    from launch.slurm import slurm_option_problems

    try:
        backend(cfg.launcher)
    except LaunchError as exc:
        raise AnalysisError(str(exc)) from None
    s = cfg.slurm
    gpus, k = s.gpus_per_task, s.concurrency
    if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0):
        raise AnalysisError(f"slurm.gpus_per_task={gpus!r}: expected an integer >= 0, or null (from eval.data_parallel)")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise AnalysisError(f"slurm.concurrency={k!r}: expected an integer >= 1 (array tasks at once), or null")
    runs, after = s.runs, s.runs_after
    if runs is not None and (isinstance(runs, (str, int)) or not runs or not all(isinstance(r, str) and r for r in runs)):
        raise AnalysisError(f"slurm.runs={runs!r}: expected a list of run dirs, e.g. [runs/r2e/seed0,runs/r2e/seed1]")
    if after is not None:
        if runs is None:
            raise AnalysisError("slurm.runs_after is given without slurm.runs (one dependency per run dir)")
        if isinstance(after, (str, int)) or len(after) != len(runs) or \
                not all(a is None or (isinstance(a, str) and a.strip() == a and a) for a in after):
            raise AnalysisError(f"slurm.runs_after={after!r}: expected one sbatch dependency (e.g. afterok:5001_0) "
                                f"or null per run of slurm.runs ({len(runs)})")
    if runs is not None and not cfg.evaluate:
        raise AnalysisError("slurm.runs evaluates each run in its own job: not with evaluate=false")
    problems = slurm_option_problems(list(s.sbatch) if s.sbatch is not None else None)
    if problems:
        raise AnalysisError("; ".join(p.replace("launcher.sbatch", "slurm.sbatch").replace("launcher.", "slurm.")
                                      for p in problems))


def eval_backend(eval_opts: dict[str, Any], profile: str | None) -> str | None:
    """The evaluation backend asked for: eval.backend, else the profile's."""
    backend = eval_opts.get("backend")
    if backend is None and profile:
        from evals.profiles import load_profile

        backend = load_profile(profile)["evaluate"].get("backend")
    return backend


def _job_record(job: EvalJob) -> dict[str, Any]:
    return {"label": job.label, "arm": job.arm, "seed": job.seed, "step": job.step, "ckpt": job.ckpt,
            "out": str(job.out), "benches": list(job.benches), "prompt": job.prompt}


def _job(entry: dict) -> EvalJob:
    return EvalJob(entry["arm"], int(entry["seed"]), int(entry["step"]), entry["ckpt"], Path(entry["out"]),
                   list(entry["benches"]), entry["prompt"])


def task_gpus(cfg: DictConfig, eval_opts: dict[str, Any]) -> int:
    """GPUs of one array task: slurm.gpus_per_task, else what evaluate's engines take (data_parallel engines of
    tensor_parallel_size GPUs each with backend=vllm, one each with hf)."""
    if cfg.slurm.gpus_per_task is not None:
        return int(cfg.slurm.gpus_per_task)
    tp = int(eval_opts.get("tensor_parallel_size") or 1) if eval_opts.get("backend") == "vllm" else 1
    return int(eval_opts.get("data_parallel") or 1) * tp


def _plan_dir(cfg: DictConfig, kind: str) -> Path:
    if cfg.dry_run:
        return dry_run_dir(kind)
    plan = (Path(cfg.out) / "_slurm" / time.strftime(f"{kind}-%Y%m%dT%H%M%SZ", time.gmtime())).resolve()
    plan.mkdir(parents=True, exist_ok=True)
    return plan


def _task(plan: Path, name: str, what: str, gap: str, eval_opts: dict[str, Any], anchor_dir: Path, **kind) -> str:
    """Write one evaluation job's config (the one format: `checkpoint=` a planned evaluation, or `discover=`
    a run's / the anchor's checkpoints found when the job starts); its path."""
    path = plan / f"{name}.json"
    write_json(path, {"name": what, "eval_opts": eval_opts, "anchor_dir": str(Path(anchor_dir).resolve()),
                      "outcome": str(plan / f"outcome-{name.removeprefix('eval-')}.json"), "no_outcome": gap, **kind})
    return str(path)


def _evaluation(cfg: DictConfig, name: str, configs: list[str], notes: list[str], gpus: int, needs: Needs,
                waits: str | None) -> Job:
    """An evaluation job (an array when `name` is `eval`): python.eval runs launch.eval_jobs on each config."""
    from common.interpreter import interpreter
    from launch.slurm import Cluster

    array = name == "eval"
    return Job(name, MODULE, config=None if array else configs[0], array=tuple(configs) if array else (),
               python=interpreter(cfg.python, "eval"), cluster=Cluster.of(cfg.slurm), needs=needs, notes=tuple(notes),
               resources=Resources(gpus_per_node=gpus, signal=WARNING, at_once=cfg.slurm.concurrency if array else None),
               waits=waits)


def _aggregation(cfg: DictConfig, plan: Path, configs: list[str], after: tuple[str, ...]) -> Job:
    """The job that writes the report from the evaluation jobs' outcomes (after them, however they ended)."""
    from common.interpreter import interpreter
    from launch.slurm import Cluster

    path = plan / CONFIG
    agg = OmegaConf.merge(cfg, {"launcher": "local", "eval_tasks": configs, "dry_run": False,
                                "slurm": {"runs": None, "runs_after": None}})
    path.write_text(OmegaConf.to_yaml(agg), encoding="utf-8")
    return Job("aggregate", "launch.analyze", config=str(path), python=interpreter(cfg.python, "eval"),
               cluster=Cluster.of(cfg.slurm), after=after, after_any=True,
               needs=Needs(modules=("pandas",)), notes=("the report, from the evaluation jobs' outcomes",))


def _needs(cfg: DictConfig, eval_opts: dict[str, Any]) -> Needs:
    from common.interpreter import eval_needs

    data = tuple(str(eval_opts[k]) for k in ("corpus", "index", "encoder", "bench_root") if eval_opts.get(k))
    return Needs(data=data, modules=tuple(eval_needs(eval_backend(eval_opts, cfg.profile or None))))


def _submit(cfg: DictConfig, plan: list[Job], where: Path) -> dict[str, str] | None:
    runner = backend(cfg.launcher)(f"analyze launcher={cfg.launcher}")
    if cfg.dry_run:
        dry_run(plan, runner, where)
        return None
    return runner.run(plan, where)


def submit_analysis(cfg: DictConfig, jobs: list[EvalJob], eval_opts: dict[str, Any], anchor_dir: Path) -> None:
    """The evaluations as one job array (one config per checkpoint), then the aggregation."""
    plan = _plan_dir(cfg, "analyze")
    configs = [_task(plan, f"eval-{i}", j.label, f"Slurm array task {i} wrote no outcome (killed, out of time or "
                     f"not run; see {plan}/slurm-eval-*_{i}.out)", eval_opts, anchor_dir, checkpoint=_job_record(j))
               for i, j in enumerate(jobs)]
    evals = _evaluation(cfg, "eval", configs, [f"{j.label} {j.benches} <- {j.ckpt}" for j in jobs],
                        task_gpus(cfg, eval_opts), _needs(cfg, eval_opts), cfg.slurm.after)
    ids = _submit(cfg, [evals, _aggregation(cfg, plan, configs, ("eval",))], plan)
    if ids is not None:
        array, agg = ids["eval"], ids["aggregate"]
        print(f"[analyze] submitted {len(jobs)} evaluation(s) as Slurm job array {array} and the aggregation as "
              f"job {agg} (afterany:{array}); plan and logs in {plan}\n"
              f"[analyze] watch: squeue -j {array},{agg}   (when done: sacct -j {array},{agg})", flush=True)


def runs_plan(req, plan: Path, after: list) -> list[Job]:
    """`slurm.runs` (req: launch.analyze.Request) as Jobs: one evaluation job per run dir, each after its own
    dependency (`after[i]`: an sbatch dependency string, or (job name, array task) of a training job planned
    before it in the same plan), the anchor's (when `anchor=` is given) after nothing more, then the aggregation
    after all of them (afterany). Nothing is planned here: a run's checkpoints appear while it trains, so each
    job plans its own when it starts. The jobs' configs are written under `plan`."""
    cfg = req.cfg
    entries = [(f"run {i}", str(Path(r).resolve()), None, a) for i, (r, a) in enumerate(zip(cfg.slurm.runs, after))]
    entries += [("the anchor", None, req.anchor, None)] if req.anchor is not None else []
    gpus, needs = task_gpus(cfg, req.eval_opts), _needs(cfg, req.eval_opts)
    jobs, configs = [], []
    for i, (who, run, anchor_, dep) in enumerate(entries):
        name, what = f"eval-run-{i}", f"{who} ({run or anchor_})"
        shown = f"{dep[0]} task {dep[1]}" if isinstance(dep, tuple) else dep
        cause = f"cancelled because its dependency {shown} failed, i.e. its training did not finish, or " if dep else ""
        configs.append(_task(plan, name, what, f"{who}'s evaluation job wrote no outcome ({cause}killed, out of time "
                             f"or not run; see its slurm-*.out log)", req.eval_opts, req.anchor_dir,
                             discover={"run": run, "anchor": anchor_, "runs_root": str(cfg.runs_root),
                                       "profile": req.profile, "benches": list(req.benches), "prompt": cfg.eval.prompt}))
        job = _evaluation(cfg, name, configs[-1:], [f"{what}: its checkpoints when this job starts, by evaluation "
                                                    "identity"], gpus, needs, dep if isinstance(dep, str) else None)
        jobs.append(replace(job, after=(dep[0],), after_task=dep[1]) if isinstance(dep, tuple) else job)
    return [*jobs, _aggregation(cfg, plan, configs, tuple(j.name for j in jobs))]


def submit_runs(req) -> None:
    """`analyze launcher=slurm slurm.runs=[...]`: runs_plan's jobs (each run's after its slurm.runs_after
    dependency), submitted."""
    cfg = req.cfg
    plan = _plan_dir(cfg, "runs")
    after = list(cfg.slurm.runs_after) if cfg.slurm.runs_after is not None else [None] * len(cfg.slurm.runs)
    jobs = runs_plan(req, plan, after)
    ids = _submit(cfg, jobs, plan)
    if ids is not None:
        evals = [ids[j.name] for j in jobs[:-1]]
        print("[analyze] submitted one evaluation job per run: " + ", ".join(
                  f"{job} ({j.notes[0].split(': ')[0]}, after {j.waits or 'nothing'})" for job, j in zip(evals, jobs))
              + f"; the aggregation as job {ids['aggregate']} (afterany:{':'.join(evals)}); plan and logs in {plan}\n"
              f"[analyze] watch: squeue -j {','.join([*evals, ids['aggregate']])}   "
              f"(when done: sacct -j {','.join([*evals, ids['aggregate']])})", flush=True)


def _read_task(path: Path) -> dict:
    try:
        data = read_json_object(path)
        missing = [k for k in ("name", "eval_opts", "anchor_dir", "outcome", "no_outcome") if k not in data]
        if missing or ("checkpoint" in data) == ("discover" in data):
            raise ValueError(f"no {missing}" if missing else "neither or both of checkpoint / discover")
        return data
    except (OSError, ValueError) as exc:
        raise AnalysisError(f"{path}: not an evaluation job's config ({exc})") from exc


def _discovered(found: dict, anchor_dir: Path) -> list[EvalJob]:
    """Every checkpoint of the run (or the anchor) now on disk, with every bench: what its job was to evaluate."""
    from analysis.discover import ANCHOR_ARM, anchor_eval_dir
    from launch.evaluation import ANCHOR_PROMPT

    benches = list(found["benches"])
    if found["anchor"] is not None:
        return [EvalJob(ANCHOR_ARM, 0, 0, found["anchor"], anchor_eval_dir(anchor_dir, found["profile"]), benches,
                        ANCHOR_PROMPT)]
    return [EvalJob(r.arm, r.seed, step, str(ckpt), r.eval_dir(step), benches, found["prompt"])
            for r in _discovered_runs(found) for step, ckpt in sorted(r.checkpoints.items())]


class TimeLimitWarning(KeyboardInterrupt):
    """Slurm's warning before the time limit (SIGUSR1, `--signal=B:USR1@120`): stop the evaluation now.
    A KeyboardInterrupt, so that it passes every `except Exception` (run_job's included) and the async
    driver re-raises it as itself; the rows already appended stay, and evaluate resumes from them."""


@contextlib.contextmanager
def _stopped_by_the_warning():
    def stop(signum, frame):
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)   # one stop; a second warning must not break the wind-down
        raise TimeLimitWarning()

    old = signal.signal(signal.SIGUSR1, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGUSR1, old)


def _rows(jobs: list[EvalJob]) -> int:
    """Rows held in the jobs' eval dirs (every `<bench>.jsonl`, data_parallel's shard dirs included): what a
    segment adds is its progress."""
    return sum(path.read_bytes().count(b"\n") for j in jobs for path in Path(j.out).rglob("*.jsonl"))


def _job_ref() -> str | None:
    """This job as scontrol names it (`<array>_<task>` for an array task), or None outside Slurm."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array}_{task}" if array and task else os.environ.get("SLURM_JOB_ID") or None


def _requeue(ref: str | None) -> str | None:
    """`scontrol requeue REF`; None when done, else why not."""
    if ref is None:
        return "not a Slurm job (no SLURM_JOB_ID), so nothing to requeue"
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return "scontrol not found on PATH"
    proc = subprocess.run([scontrol, "requeue", ref], capture_output=True, text=True)
    return None if proc.returncode == 0 else \
        f"scontrol requeue {ref} failed (exit {proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}"


def evaluate_segment(what: str, todo: Callable[[], list[EvalJob]], h, opts: dict[str, Any],
                     anchor_dir: Path) -> tuple[str, list[EvalJob], list[EvalFailure]]:
    """One Slurm segment of an evaluation task: the jobs `todo()` plans (by identity), one after another.
    Returns (status, the jobs planned, failures); status is done (nothing was left), evaluated, failed
    (a real error: in the failures), or requeued: Slurm's time-limit warning stopped it with work left
    after rows were written in this segment, and the task requeued itself (its next segment plans again
    and resumes). Warned with work left but no progress in the segment, it is not requeued again: that
    is a failure saying so (raise slurm.time)."""
    jobs: list[EvalJob] = []
    failures: list[EvalFailure] = []
    before = 0
    try:
        with _stopped_by_the_warning():
            jobs = todo()
            if not jobs:
                print(f"[analyze] {what}: every bench is already evaluated under this identity; nothing to do",
                      flush=True)
                return "done", jobs, failures
            before = _rows(jobs)
            for job in jobs:
                failures += run_job(job, h, opts, anchor_dir)
    except TimeLimitWarning:
        left = todo()
        pending = sum(len(j.benches) for j in left)
        if not left:
            print(f"[analyze] {what}: the time-limit warning came after the work was done", flush=True)
        elif _rows(jobs) > before or pending < sum(len(j.benches) for j in jobs):
            ref = _job_ref()
            print(f"[analyze] {what}: stopped by the time-limit warning with {pending} bench(es) of "
                  f"{len(left)} checkpoint(s) left ({_rows(jobs) - before} row(s) written in this segment, "
                  f"kept); requeueing {ref}", flush=True)
            why = _requeue(ref)
            if why is None:
                return "requeued", jobs, []
            error = f"stopped by the time-limit warning with {pending} bench(es) left; could not requeue: {why}"
            failures = [EvalFailure(j, list(j.benches), error) for j in left]
        else:
            error = ("stopped by the time-limit warning with no progress in this segment (no row written); "
                     "not requeued again: raise slurm.time (or lower eval.batch_size) and run analyze again")
            failures = [EvalFailure(j, list(j.benches), error) for j in left]
    for f in failures:
        print(f"[analyze] {f.job.label} {f.benches}: {f.error}", file=sys.stderr, flush=True)
    return ("failed" if failures else "evaluated"), jobs, failures


def run_task(config: Path, evaluator=None) -> int:
    """One evaluation job (`python -m launch.eval_jobs CONFIG`): evaluate what its checkpoint (or its run's
    checkpoints found now) has left, by identity; 0 when done or when stopped at the time limit and requeued
    (evaluate_segment; the next segment writes the outcome), 1 when an evaluation failed."""
    data = _read_task(Path(config))
    opts, anchor_dir = data["eval_opts"], Path(data["anchor_dir"])
    h = harness(evaluator)

    def todo() -> list[EvalJob]:
        if "checkpoint" in data:
            job = _pending(h, _job(data["checkpoint"]), opts)
            return [job] if job is not None else []
        from launch.evaluation import plan as plan_evaluations

        found = data["discover"]
        runs = [] if found["anchor"] is not None else _discovered_runs(found)
        return plan_evaluations(runs, found["benches"], found["anchor"], anchor_dir, found["prompt"], found["profile"],
                                h=h, eval_opts=opts)

    status, jobs, failures = evaluate_segment(data["name"], todo, h, opts, anchor_dir)
    if status == "requeued":
        return 0
    write_json(Path(data["outcome"]), {
        "name": data["name"], "status": status, "jobs": [_job_record(j) for j in jobs],
        "failures": [{"job": _job_record(f.job), "benches": f.benches, "error": f.error} for f in failures]})
    return 1 if failures else 0


def _discovered_runs(found: dict) -> list:
    from analysis.discover import discover_runs

    want = Path(found["run"])
    return [r for r in discover_runs(Path(found["runs_root"]), found["profile"]) if Path(r.path).resolve() == want]


def tasks_report(configs: list) -> EvalReport:
    """The evaluation jobs' outcomes as a local analyze would have reported them: a job that failed, or wrote
    no outcome (killed, out of time, never ran, cancelled), is a failure of what it was to evaluate."""
    report = EvalReport()
    for config in configs:
        data = _read_task(Path(config))
        planned = [_job(data["checkpoint"])] if "checkpoint" in data else None
        report.jobs += planned or []
        try:
            outcome = read_json_object(Path(data["outcome"]))
        except (OSError, ValueError):
            gaps = planned if planned is not None else _discovered(data["discover"], Path(data["anchor_dir"]))
            report.failures += [EvalFailure(j, list(j.benches), data["no_outcome"]) for j in gaps]
            continue
        if planned is None:
            report.jobs += [_job(r) for r in outcome.get("jobs", [])]
        report.failures += [EvalFailure(_job(f["job"]), list(f["benches"]), str(f["error"]))
                            for f in outcome.get("failures", [])]
    return report
