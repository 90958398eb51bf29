"""`analyze ... launcher=slurm`: the evaluations fanned out as a Slurm job array, then one aggregation job.

    analyze runs_root=runs profile=P launcher=slurm [slurm.gpus_per_task=1] [slurm.concurrency=K] ...

What is still to evaluate is decided here exactly as a local analyze decides it (`analysis.evaluation.plan`:
the evaluation identity), before anything is submitted. Then, under `<out>/_slurm/analyze-<UTC time>/`:
- `tasks.json`: one entry per checkpoint (and the anchor) with its pending benches;
- `eval.sbatch`: a job array, task i evaluates entry i (`--array=0-(N-1)[%K]`, `slurm.gpus_per_task` GPUs
  each, `--requeue`). A task first asks the harness what is left by identity: a requeued task, or one
  whose work another job finished, exits 0 without loading a model; an interrupted one resumes from
  its rows (evaluate skips finished ids). Each task writes `outcome-<i>.json`; a failed one exits 1;
- `aggregate.sbatch`: `--dependency=afterany:<array>`, runs the analysis on `analyze.yaml` (this
  request, `eval_tasks=` set): it evaluates nothing, and a task that failed or wrote no outcome (killed,
  out of time) is listed as a gap in the report, as a failed local evaluation is.
`dry_run=true` prints the plan and both scripts and writes nothing.

`python -m analysis.slurm_jobs task PLAN_DIR I` / `python -m analysis.slurm_jobs aggregate PLAN_DIR` are
what the scripts run.
"""
from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf

from analysis.errors import AnalysisError
from analysis.evaluation import EvalFailure, EvalJob, EvalReport, _pending, harness, run_job
from common.io import read_json_object, write_json

TASKS = "tasks.json"
CONFIG = "analyze.yaml"
LAUNCHERS = ("local", "slurm")
# Slurm's warning before an evaluation task's time limit: SIGUSR1 120 s before, to the batch shell, which is
# the task's python (the script execs it): it stops, keeps its rows and requeues itself (evaluate_segment).
WARNING = "B:USR1@120"


def _outcome(plan: Path, index: int) -> Path:
    return plan / f"outcome-{index}.json"


def check_launcher(cfg: DictConfig) -> None:
    """Refuse a bad `launcher` / `slurm.*` value before any work."""
    from launch.slurm import slurm_option_problems

    if cfg.launcher not in LAUNCHERS:
        raise AnalysisError(f"launcher={cfg.launcher!r}: expected local or slurm")
    s = cfg.slurm
    gpus, k = s.gpus_per_task, s.concurrency
    if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0):
        raise AnalysisError(f"slurm.gpus_per_task={gpus!r}: expected an integer >= 0, or null (from eval.data_parallel)")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise AnalysisError(f"slurm.concurrency={k!r}: expected an integer >= 1 (array tasks at once), or null")
    problems = slurm_option_problems(list(s.sbatch) if s.sbatch is not None else None)
    if problems:
        raise AnalysisError("; ".join(p.replace("launcher.sbatch", "slurm.sbatch").replace("launcher.", "slurm.")
                                      for p in problems))


def _spec(cfg: DictConfig, **kw):
    from launch.slurm import SlurmSpec

    s = cfg.slurm
    opt = {k: None if s[k] is None else str(s[k]) for k in ("partition", "time", "account")}
    return SlurmSpec(nodes=1, nproc_per_node=1, extra=tuple(s.sbatch or ()), setup=s.setup, exclusive=False,
                     **opt, **kw)


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


def scripts(cfg: DictConfig, jobs: list[EvalJob], plan: Path, gpus: int,
            array_job: str = "<eval array job id>") -> tuple[str, str]:
    """(the evaluation array's sbatch script, the aggregation job's) for `jobs`."""
    from launch.slurm import render_command_script

    repo = str(Path(__file__).resolve().parents[1])
    py, q = sys.executable, shlex.quote
    k = cfg.slurm.concurrency
    array = f"0-{len(jobs) - 1}" + (f"%{k}" if k else "")
    dep = cfg.slurm.after
    spec = _spec(cfg, job_name="dtsft-eval", gpus_per_node=gpus, signal=WARNING,
                 output=str(plan / "slurm-%A_%a.out"), array=array,
                 **({"dependency": str(dep)} if dep else {}))
    listing = [f"# task {i}: {j.label} {j.benches} <- {j.ckpt}" for i, j in enumerate(jobs)]
    task = [*listing,
            'echo "[analyze] evaluation task $SLURM_ARRAY_TASK_ID (segment ${SLURM_RESTART_COUNT:-0}) on '
            '${SLURM_JOB_NODELIST:-this host}"',
            f'exec {q(py)} -m analysis.slurm_jobs task {q(str(plan))} "$SLURM_ARRAY_TASK_ID"']
    command = "analyze launcher=slurm (the evaluations)"
    here = os.getcwd()   # the request's relative paths (runs_root, out, corpus) are relative to it
    eval_script = render_command_script(spec, here, command, task, repo=repo)
    agg = _spec(cfg, job_name="dtsft-analyze", gpus_per_node=0, signal=False, output=str(plan / "slurm-aggregate-%j.out"),
                dependency=f"afterany:{array_job}")
    agg_script = render_command_script(agg, here, "analyze launcher=slurm (the aggregation)",
                                       [f"exec {q(py)} -m analysis.slurm_jobs aggregate {q(str(plan))}"], repo=repo)
    return eval_script, agg_script


def submit_analysis(cfg: DictConfig, jobs: list[EvalJob], eval_opts: dict[str, Any], anchor_dir: Path) -> None:
    """Write the plan dir and submit the array and its aggregation (dry_run: print them only)."""
    from launch.slurm import submit

    plan = (Path(cfg.out) / "_slurm" / time.strftime("analyze-%Y%m%dT%H%M%SZ", time.gmtime())).resolve()
    gpus = task_gpus(cfg, eval_opts)
    if cfg.dry_run:
        eval_script, agg_script = scripts(cfg, jobs, plan, gpus)
        print(f"# {plan / 'eval.sbatch'} (not written: dry_run=true): {len(jobs)} array task(s)\n{eval_script}")
        print(f"# {plan / 'aggregate.sbatch'} (not written: dry_run=true)\n{agg_script}")
        return
    plan.mkdir(parents=True, exist_ok=True)
    write_json(plan / TASKS, {"eval_opts": eval_opts, "anchor_dir": str(anchor_dir),
                              "tasks": [_job_record(j) for j in jobs]})
    agg_cfg = OmegaConf.merge(cfg, {"launcher": "local", "eval_tasks": str(plan / TASKS), "dry_run": False})
    (plan / CONFIG).write_text(OmegaConf.to_yaml(agg_cfg), encoding="utf-8")
    eval_script, _ = scripts(cfg, jobs, plan, gpus)
    (plan / "eval.sbatch").write_text(eval_script, encoding="utf-8")
    array = submit(plan / "eval.sbatch")
    _, agg_script = scripts(cfg, jobs, plan, gpus, array_job=array)
    (plan / "aggregate.sbatch").write_text(agg_script, encoding="utf-8")
    agg = submit(plan / "aggregate.sbatch")
    print(f"[analyze] submitted {len(jobs)} evaluation(s) as Slurm job array {array} and the aggregation as "
          f"job {agg} (afterany:{array}); plan and logs in {plan}\n"
          f"[analyze] watch: squeue -j {array},{agg}   (when done: sacct -j {array},{agg})", flush=True)


def _read_plan(plan: Path) -> dict:
    try:
        data = read_json_object(plan / TASKS)
        if not isinstance(data.get("tasks"), list):
            raise ValueError(f"{plan / TASKS}: no `tasks` list")
        return data
    except (OSError, ValueError) as exc:
        raise AnalysisError(f"{plan / TASKS}: not a readable evaluation plan ({exc})") from exc


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
    """Rows held in the jobs' eval dirs (every `<bench>.jsonl`): what a segment adds is its progress."""
    return sum(path.read_bytes().count(b"\n") for j in jobs for path in Path(j.out).glob("*.jsonl"))


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
            why = _requeue(ref)
            if why is None:
                print(f"[analyze] {what}: stopped by the time-limit warning with {pending} bench(es) of "
                      f"{len(left)} checkpoint(s) left ({_rows(jobs) - before} row(s) written in this segment, "
                      f"kept); requeueing {ref}", flush=True)
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


def run_task(plan: Path, index: int, evaluator=None) -> int:
    """Array task `index`: evaluate its checkpoint's benches still pending (by identity); 0 when done,
    or when stopped at the time limit and requeued (evaluate_segment)."""
    plan = Path(plan)
    data = _read_plan(plan)
    if not 0 <= index < len(data["tasks"]):
        raise AnalysisError(f"{plan / TASKS}: no task {index} (it lists {len(data['tasks'])})")
    entry, opts = data["tasks"][index], data["eval_opts"]
    h = harness(evaluator)

    def todo() -> list[EvalJob]:
        job = _pending(h, _job(entry), opts)
        return [job] if job is not None else []

    label = _job(entry).label
    status, _, failures = evaluate_segment(label, todo, h, opts, Path(data["anchor_dir"]))
    if status == "requeued":   # the next segment writes the outcome
        return 0
    write_json(_outcome(plan, index), {"label": label, "status": status,
                                       "failures": [{"benches": f.benches, "error": f.error} for f in failures]})
    return 1 if failures else 0


def tasks_report(tasks_file: Path) -> EvalReport:
    """The array's evaluations as a local analyze would have reported them: a task that failed, or
    wrote no outcome (killed, out of time, never ran), is a failure of its benches."""
    plan = Path(tasks_file).parent
    data = _read_plan(plan)
    report = EvalReport(jobs=[_job(e) for e in data["tasks"]])
    for i, job in enumerate(report.jobs):
        path = _outcome(plan, i)
        try:
            outcome = read_json_object(path)
        except (OSError, ValueError):
            report.failures.append(EvalFailure(job, list(job.benches),
                                               f"Slurm array task {i} wrote no outcome (killed, out of time or not "
                                               f"run; see {plan}/slurm-*_{i}.out)"))
            continue
        report.failures += [EvalFailure(job, list(f["benches"]), str(f["error"])) for f in outcome.get("failures", [])]
    return report
