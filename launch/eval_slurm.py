"""`analyze ... launcher=slurm`: the evaluations as Jobs (launch/jobs.py) that the SlurmRunner submits, then one
aggregation job (docs/stages/analyze.md says what a user sees).

What is still to evaluate is decided here as a local analyze decides it (by evaluation identity). The plan:
`eval`, a job array whose task i runs `python -m launch.eval_jobs eval-<i>.json` (one checkpoint's
evaluation), or with `slurm.runs` one job per run, `eval-run-<i>`, each after its training task and finding
the run's checkpoints when it starts; then `aggregate`, after all of them however they ended, running
`python -m launch.analyze analyze.yaml` (this request with `eval_tasks=` the evaluation configs: it evaluates
nothing, and a job that failed or wrote no outcome is a gap). Every evaluation job's config has one format
(`_task`): the checkpoints planned at submission (an array task's one) and the run or anchor whose checkpoints
it finds when it starts (a run's job), run and reported by one code path (`run_task`, `tasks_report`). A job
asks the harness what is left before it loads a model, so a requeued one resumes or exits 0; warned before
its time limit (`--signal=B:USR1@120`) it stops, keeping its rows, and requeues itself while it makes
progress (`evaluate_segment`).
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
    s = cfg.slurm   # (gpus_per_task and concurrency: their fields' rules, launch.analyze.request)
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


def _task(req, plan: Path, name: str, what: str, gap: str, planned: list[EvalJob] = (), discover: dict | None = None) -> str:
    """Write one evaluation job's config (the one format: the checkpoints `planned` at submission, and a run's
    or the anchor's to `discover` when the job starts); its path."""
    path = plan / f"{name}.json"
    write_json(path, {"name": what, "eval_opts": req.eval_opts, "anchor_dir": str(Path(req.anchor_dir).resolve()),
                      "outcome": str(plan / f"outcome-{name.removeprefix('eval-')}.json"), "no_outcome": gap,
                      "planned": [_job_record(j) for j in planned], "discover": discover})
    return str(path)


def _evaluation(req, name: str, configs: list[str], notes: list[str], waits: str | None) -> Job:
    """An evaluation job (an array when `name` is `eval`): python.eval runs launch.eval_jobs on each config; it
    needs the data evaluate reads and what its backend imports."""
    from common.interpreter import eval_needs, interpreter
    from launch.slurm import Cluster

    cfg, opts, array = req.cfg, req.eval_opts, name == "eval"
    data = tuple(str(opts[k]) for k in ("corpus", "index", "encoder", "bench_root") if opts.get(k))
    needs = Needs(data=data, modules=tuple(eval_needs(eval_backend(opts, cfg.profile or None))))
    return Job(name, MODULE, config=None if array else configs[0], array=tuple(configs) if array else (),
               python=interpreter(cfg.python, "eval"), cluster=Cluster.of(cfg.slurm), needs=needs, notes=tuple(notes),
               resources=Resources(gpus_per_node=task_gpus(cfg, opts), signal=WARNING,
                                   at_once=cfg.slurm.concurrency if array else None), waits=waits)


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


def array_plan(req, plan: Path, jobs: list[EvalJob]) -> list[Job]:
    """The checkpoints still to evaluate (`jobs`, planned here) as Jobs: one array, task i evaluating jobs[i]
    (after `slurm.after`), then the aggregation after it (afterany). The configs are written under `plan`."""
    cfg = req.cfg
    configs = [_task(req, plan, f"eval-{i}", j.label, f"Slurm array task {i} wrote no outcome (killed, out of time "
                     f"or not run; see {plan}/slurm-eval-*_{i}.out)", planned=[j]) for i, j in enumerate(jobs)]
    evals = _evaluation(req, "eval", configs, [f"{j.label} {j.benches} <- {j.ckpt}" for j in jobs], cfg.slurm.after)
    return [evals, _aggregation(cfg, plan, configs, ("eval",))]


def runs_plan(req, plan: Path, after: list) -> list[Job]:
    """`slurm.runs` (req: launch.analyze.Request) as Jobs: one evaluation job per run dir, each after its own
    dependency (`after[i]`: an sbatch dependency string, or (job name, array task) of a training job planned
    before it in the same plan), the anchor's (when `anchor=` is given) after nothing more, then the aggregation
    after all of them (afterany). Nothing is planned here: a run's checkpoints appear while it trains, so each
    job plans its own when it starts. The jobs' configs are written under `plan`."""
    cfg = req.cfg
    entries = [(f"run {i}", str(Path(r).resolve()), None, a) for i, (r, a) in enumerate(zip(cfg.slurm.runs, after))]
    entries += [("the anchor", None, req.anchor, None)] if req.anchor is not None else []
    jobs, configs = [], []
    for i, (who, run, anchor_, dep) in enumerate(entries):
        name, what = f"eval-run-{i}", f"{who} ({run or anchor_})"
        shown = f"{dep[0]} task {dep[1]}" if isinstance(dep, tuple) else dep
        cause = f"cancelled because its dependency {shown} failed, i.e. its training did not finish, or " if dep else ""
        configs.append(_task(req, plan, name, what, f"{who}'s evaluation job wrote no outcome ({cause}killed, out of "
                             "time or not run; see its slurm-*.out log)",
                             discover={"run": run, "anchor": anchor_, "runs_root": str(cfg.runs_root),
                                       "profile": req.profile, "benches": list(req.benches), "prompt": cfg.eval.prompt}))
        job = _evaluation(req, name, configs[-1:], [f"{what}: its checkpoints when this job starts, by evaluation "
                                                    "identity"], dep if isinstance(dep, str) else None)
        jobs.append(replace(job, after=(dep[0],), after_task=dep[1]) if isinstance(dep, tuple) else job)
    return [*jobs, _aggregation(cfg, plan, configs, tuple(j.name for j in jobs))]


def submit(req, jobs: list[EvalJob]) -> None:
    """`analyze launcher=slurm`: the evaluation jobs, then the aggregation, submitted (dry_run: written and
    printed). `jobs`: the checkpoints planned here (array_plan); with `slurm.runs`, one job per run instead,
    each after its `slurm.runs_after` dependency (runs_plan)."""
    cfg = req.cfg
    runs = cfg.slurm.runs is not None
    where = _plan_dir(cfg, "runs" if runs else "analyze")
    after = list(cfg.slurm.runs_after or [None] * len(cfg.slurm.runs)) if runs else []
    plan = runs_plan(req, where, after) if runs else array_plan(req, where, jobs)
    runner = backend(cfg.launcher)(f"analyze launcher={cfg.launcher}")
    if cfg.dry_run:
        dry_run(plan, runner, where)
        return
    ids = runner.run(plan, where)
    shown = [(f"{len(j.array)} evaluation(s) as Slurm job array {ids[j.name]}" if j.array else
              f"{j.notes[0].split(': ')[0]} as job {ids[j.name]}") + (f" (after {j.waits})" if j.waits else "")
             for j in plan[:-1]]
    every = ",".join(ids.values())
    if cfg.slurm.jobs_file:   # a study's analyze job: its submissions join the study's job ids
        record_jobs(Path(cfg.slurm.jobs_file), ids, os.environ.get("SLURM_JOB_ID"))
    print(f"[analyze] submitted {', '.join(shown)} and the aggregation as job {ids['aggregate']} "
          f"(afterany:{':'.join(ids[j.name] for j in plan[:-1])}); plan and logs in {where}\n"
          f"[analyze] watch: squeue -j {every}   (when done: sacct -j {every})", flush=True)


def record_jobs(path: Path, ids: dict[str, str], submitter: str | None = None) -> None:
    """Add `ids` (job name -> id) to `path`, a study's jobs.json, under a lock on its directory (the study and
    the analyze job it submitted both write it, in either order); `submitter`: the id of the job that submitted
    them, whose name there prefixes theirs (`report.eval`; `analyze.eval` when the file does not name it)."""
    import fcntl

    fd = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        held = read_json_object(path) if path.is_file() else {}
        name = next((k for k, v in held.items() if v == submitter), "analyze") if submitter else None
        write_json(path, {**held, **{f"{name}.{k}" if name else k: v for k, v in ids.items()}})
    finally:
        os.close(fd)


def _read_task(path: Path) -> dict:
    try:
        data = read_json_object(path)
        missing = [k for k in ("name", "eval_opts", "anchor_dir", "outcome", "no_outcome", "planned", "discover")
                   if k not in data]
        if missing:
            raise ValueError(f"no {missing}")
        return data
    except (OSError, ValueError) as exc:
        raise AnalysisError(f"{path}: not an evaluation job's config ({exc})") from exc


def _candidates(data: dict) -> list[EvalJob]:
    """What an evaluation job is to evaluate, every bench of it: the checkpoints planned at submission, and
    every checkpoint now on disk of the run (or the anchor) it discovers."""
    from analysis.discover import ANCHOR_ARM, anchor_eval_dir, discover_runs
    from launch.evaluation import ANCHOR_PROMPT

    jobs, found = [_job(r) for r in data["planned"]], data["discover"]
    if found is None:
        return jobs
    benches = list(found["benches"])
    if found["anchor"] is not None:
        return [*jobs, EvalJob(ANCHOR_ARM, 0, 0, found["anchor"], anchor_eval_dir(Path(data["anchor_dir"]),
                                                                                 found["profile"]), benches, ANCHOR_PROMPT)]
    runs = [r for r in discover_runs(Path(found["runs_root"]), found["profile"]) if Path(r.path).resolve() == Path(found["run"])]
    return jobs + [EvalJob(r.arm, r.seed, step, str(ckpt), r.eval_dir(step), list(benches), found["prompt"])
                   for r in runs for step, ckpt in sorted(r.checkpoints.items())]


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
    """One evaluation job (`python -m launch.eval_jobs CONFIG`): evaluate what its checkpoints (planned, or its
    run's found now) have left, by identity; 0 when done or when stopped at the time limit and requeued
    (evaluate_segment; the next segment writes the outcome), 1 when an evaluation failed."""
    data = _read_task(Path(config))
    opts, h = data["eval_opts"], harness(evaluator)

    def todo() -> list[EvalJob]:
        return [j for j in (_pending(h, c, opts) for c in _candidates(data)) if j is not None]

    status, jobs, failures = evaluate_segment(data["name"], todo, h, opts, Path(data["anchor_dir"]))
    if status == "requeued":
        return 0
    write_json(Path(data["outcome"]), {
        "name": data["name"], "status": status, "jobs": [_job_record(j) for j in jobs],
        "failures": [{"job": _job_record(f.job), "benches": f.benches, "error": f.error} for f in failures]})
    return 1 if failures else 0


def tasks_report(configs: list) -> EvalReport:
    """The evaluation jobs' outcomes as a local analyze would have reported them: a job that failed, or wrote
    no outcome (killed, out of time, never ran, cancelled), is a failure of what it was to evaluate."""
    report = EvalReport()
    for config in configs:
        data = _read_task(Path(config))
        planned = [_job(r) for r in data["planned"]]
        report.jobs += planned
        try:
            outcome = read_json_object(Path(data["outcome"]))
        except (OSError, ValueError):
            report.failures += [EvalFailure(j, list(j.benches), data["no_outcome"]) for j in _candidates(data)]
            continue
        report.jobs += [j for j in map(_job, outcome.get("jobs", [])) if j.label not in {p.label for p in planned}]
        report.failures += [EvalFailure(_job(f["job"]), list(f["benches"]), str(f["error"]))
                            for f in outcome.get("failures", [])]
    return report
