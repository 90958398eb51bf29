"""`analyze ... launcher=slurm`: the evaluations fanned out as a Slurm job array, then one aggregation job.

    analyze runs_root=runs profile=P launcher=slurm [slurm.gpus_per_task=1] [slurm.concurrency=K] ...

What is still to evaluate is decided here exactly as a local analyze decides it (`launch.evaluation.plan`:
the evaluation identity), before anything is submitted. Then, under `<out>/_slurm/analyze-<UTC time>/`:
- `tasks.json`: one entry per checkpoint (and the anchor) with its pending benches;
- `eval.sbatch`: a job array, task i evaluates entry i (`--array=0-(N-1)[%K]`, `slurm.gpus_per_task` GPUs
  each, `--requeue`). A task first asks the harness what is left by identity: a requeued task, or one
  whose work another job finished, exits 0 without loading a model; an interrupted one resumes from
  its rows (evaluate skips finished ids). Each task writes `outcome-<i>.json`; a failed one exits 1.
  `--signal=B:USR1@120`: warned before its time limit, a task stops (its rows stay) and requeues itself
  (`scontrol requeue`) when benches are left and this segment wrote rows; with no progress it is not
  requeued again but fails, saying so (`evaluate_segment`);
- `aggregate.sbatch`: `--dependency=afterany:<array>`, runs the analysis on `analyze.yaml` (this
  request, `eval_tasks=` set): it evaluates nothing, and a task that failed or wrote no outcome (killed,
  out of time) is listed as a gap in the report, as a failed local evaluation is.
`dry_run=true` prints the plan and both scripts and writes nothing.

`slurm.runs=[DIR,...]` (+ `slurm.runs_after=[DEP,...]`, what `launch sweep eval_profile=` passes): one job
per run instead, each after its own dependency (`afterok:<training array>_<i>`, `--kill-on-invalid-dep=yes`
so that a failed training cancels it), planning that run's checkpoints when it starts (they do not exist
at submission), then the aggregation after all of them (`afterany`); a run whose job wrote no outcome
has its checkpoints listed as gaps. Plan dir `<out>/_slurm/runs-<UTC time>/` (`runs.json`, `run-<i>.sbatch`,
`outcome-run-<i>.json`).

`python -m launch.eval_jobs task PLAN_DIR I` / `run PLAN_DIR I` / `aggregate PLAN_DIR` are what the
scripts run.
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
from launch.evaluation import EvalFailure, EvalJob, EvalReport, _pending, harness, run_job
from common.io import read_json_object, write_json

TASKS = "tasks.json"
RUNS = "runs.json"   # slurm.runs: one evaluation job per run
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


def _spec(cfg: DictConfig, more: tuple[str, ...] = (), **kw):
    from launch.slurm import Cluster, SlurmSpec

    return SlurmSpec.of(Cluster.of(cfg.slurm), more, nodes=1, nproc_per_node=1, exclusive=False, **kw)


def _python(cfg: DictConfig) -> str:
    """The interpreter every evaluation and aggregation job execs: `python.eval=`, else this one."""
    from common.interpreter import interpreter

    return interpreter(cfg.python, "eval")


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
    py, q = _python(cfg), shlex.quote
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
            f'exec {q(py)} -m launch.eval_jobs task {q(str(plan))} "$SLURM_ARRAY_TASK_ID"']
    command = "analyze launcher=slurm (the evaluations)"
    here = os.getcwd()   # the request's relative paths (runs_root, out, corpus) are relative to it
    eval_script = render_command_script(spec, here, command, task, repo=repo)
    agg = _spec(cfg, job_name="dtsft-analyze", gpus_per_node=0, signal=False, output=str(plan / "slurm-aggregate-%j.out"),
                dependency=f"afterany:{array_job}")
    agg_script = render_command_script(agg, here, "analyze launcher=slurm (the aggregation)",
                                       [f"exec {q(py)} -m launch.eval_jobs aggregate {q(str(plan))}"], repo=repo)
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
    write_json(plan / TASKS, {"eval_opts": eval_opts, "anchor_dir": str(anchor_dir), "python": _python(cfg),
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


def _entry_name(index: int, entry: dict) -> str:
    return f"run {index} ({entry['run']})" if entry.get("run") else f"the anchor ({entry['anchor']})"


def _run_script(cfg: DictConfig, plan: Path, index: int, entry: dict, gpus: int) -> str:
    """The job that evaluates one run (or the anchor): it plans the run's checkpoints when it starts."""
    from launch.slurm import render_command_script

    py, q = _python(cfg), shlex.quote
    after = entry["after"]
    # A dependency that can never be met (its training task failed) cancels the job, so that the
    # aggregation (afterany) still runs and lists the run as a gap instead of waiting forever.
    spec = _spec(cfg, job_name="dtsft-eval-run", gpus_per_node=gpus, signal=WARNING,
                 output=str(plan / f"slurm-run-{index}-%j.out"), more=("--kill-on-invalid-dep=yes",) if after else (),
                 **({"dependency": after} if after else {}))
    lines = [f"# {_entry_name(index, entry)}: its checkpoints when this job starts, by evaluation identity",
             f'echo "[analyze] evaluation of {_entry_name(index, entry)} (segment ${{SLURM_RESTART_COUNT:-0}}) on '
             '${SLURM_JOB_NODELIST:-this host}"',
             f"exec {q(py)} -m launch.eval_jobs run {q(str(plan))} {index}"]
    return render_command_script(spec, os.getcwd(), "analyze launcher=slurm slurm.runs=... (one run's evaluation)",
                                 lines, repo=str(Path(__file__).resolve().parents[1]))


def _aggregate_script(cfg: DictConfig, plan: Path, after: str) -> str:
    from launch.slurm import render_command_script

    agg = _spec(cfg, job_name="dtsft-analyze", gpus_per_node=0, signal=False, output=str(plan / "slurm-aggregate-%j.out"),
                dependency=after)
    return render_command_script(agg, os.getcwd(), "analyze launcher=slurm (the aggregation)",
                                 [f"exec {shlex.quote(_python(cfg))} -m launch.eval_jobs aggregate "
                                  f"{shlex.quote(str(plan))}"], repo=str(Path(__file__).resolve().parents[1]))


def submit_runs(cfg: DictConfig, eval_opts: dict[str, Any], benches: list[str], anchor: str | None,
                anchor_dir: Path, profile: str | None) -> None:
    """`slurm.runs`: one evaluation job per run dir (each after its own dependency: its training task),
    the anchor's (when `anchor=` is given) after nothing more, then the aggregation after all of them
    (afterany). Nothing is planned here: a run's checkpoints appear while it trains, so each job plans
    its own when it starts. dry_run: print the scripts only."""
    from launch.slurm import submit

    plan = (Path(cfg.out) / "_slurm" / time.strftime("runs-%Y%m%dT%H%M%SZ", time.gmtime())).resolve()
    after = list(cfg.slurm.runs_after) if cfg.slurm.runs_after is not None else [None] * len(cfg.slurm.runs)
    entries = [{"run": str(Path(r).resolve()), "after": a} for r, a in zip(cfg.slurm.runs, after)]
    if anchor is not None:
        entries.append({"anchor": anchor, "after": None})
    gpus = task_gpus(cfg, eval_opts)
    if cfg.dry_run:
        for i, e in enumerate(entries):
            print(f"# {plan / f'run-{i}.sbatch'} (not written: dry_run=true): {_entry_name(i, e)}, after "
                  f"{e['after'] or 'nothing'}\n{_run_script(cfg, plan, i, e, gpus)}")
        waits = ":".join(f"<evaluation job of run {i}>" for i in range(len(entries)))
        print(f"# {plan / 'aggregate.sbatch'} (not written: dry_run=true)\n{_aggregate_script(cfg, plan, 'afterany:' + waits)}")
        return
    plan.mkdir(parents=True, exist_ok=True)
    write_json(plan / RUNS, {"eval_opts": eval_opts, "anchor_dir": str(anchor_dir), "python": _python(cfg),
                             "runs_root": str(cfg.runs_root),
                             "profile": profile, "benches": list(benches), "prompt": cfg.eval.prompt, "runs": entries})
    agg_cfg = OmegaConf.merge(cfg, {"launcher": "local", "eval_tasks": str(plan / RUNS), "dry_run": False,
                                    "slurm": {"runs": None, "runs_after": None}})
    (plan / CONFIG).write_text(OmegaConf.to_yaml(agg_cfg), encoding="utf-8")
    ids = []
    for i, e in enumerate(entries):
        path = plan / f"run-{i}.sbatch"
        path.write_text(_run_script(cfg, plan, i, e, gpus), encoding="utf-8")
        ids.append(submit(path))
    (plan / "aggregate.sbatch").write_text(_aggregate_script(cfg, plan, "afterany:" + ":".join(ids)), encoding="utf-8")
    agg = submit(plan / "aggregate.sbatch")
    print("[analyze] submitted one evaluation job per run: " + ", ".join(
              f"{job} ({_entry_name(i, e)}, after {e['after'] or 'nothing'})" for i, (job, e) in enumerate(zip(ids, entries)))
          + f"; the aggregation as job {agg} (afterany:{':'.join(ids)}); plan and logs in {plan}\n"
          f"[analyze] watch: squeue -j {','.join([*ids, agg])}   (when done: sacct -j {','.join([*ids, agg])})", flush=True)


def _read_runs(plan: Path) -> dict:
    try:
        data = read_json_object(plan / RUNS)
        if not isinstance(data.get("runs"), list):
            raise ValueError(f"{plan / RUNS}: no `runs` list")
        return data
    except (OSError, ValueError) as exc:
        raise AnalysisError(f"{plan / RUNS}: not a readable per-run evaluation plan ({exc})") from exc


def _entry_runs(data: dict, entry: dict) -> list:
    """The run of a per-run entry as discovered now (empty before it wrote anything discoverable)."""
    from analysis.discover import discover_runs

    want = Path(entry["run"])
    return [r for r in discover_runs(Path(data["runs_root"]), data["profile"]) if Path(r.path).resolve() == want]


def _entry_jobs(data: dict, entry: dict, h, opts: dict[str, Any]) -> list[EvalJob]:
    """The evaluations an entry has left, by identity (h.pending)."""
    from launch.evaluation import plan as plan_evaluations

    runs = [] if entry.get("anchor") else _entry_runs(data, entry)
    return plan_evaluations(runs, data["benches"], entry.get("anchor"), Path(data["anchor_dir"]), data["prompt"],
                            data["profile"], h=h, eval_opts=opts)


def _run_outcome(plan: Path, index: int) -> Path:
    return plan / f"outcome-run-{index}.json"


def run_run(plan: Path, index: int, evaluator=None) -> int:
    """Per-run job `index`: evaluate what the run's checkpoints (or the anchor) have left, by identity;
    0 when done or requeued at the time limit (evaluate_segment), 1 when an evaluation failed."""
    plan = Path(plan)
    data = _read_runs(plan)
    if not 0 <= index < len(data["runs"]):
        raise AnalysisError(f"{plan / RUNS}: no run {index} (it lists {len(data['runs'])})")
    entry, opts = data["runs"][index], data["eval_opts"]
    h = harness(evaluator)
    name = _entry_name(index, entry)
    status, jobs, failures = evaluate_segment(name, lambda: _entry_jobs(data, entry, h, opts), h, opts,
                                              Path(data["anchor_dir"]))
    if status == "requeued":   # the next segment writes the outcome
        return 0
    write_json(_run_outcome(plan, index), {
        "name": name, "status": status, "jobs": [_job_record(j) for j in jobs],
        "failures": [{"job": _job_record(f.job), "benches": f.benches, "error": f.error} for f in failures]})
    return 1 if failures else 0


def _runs_report(plan: Path) -> EvalReport:
    """The per-run jobs' evaluations; a job that wrote no outcome (cancelled because its training task
    failed, killed, out of time) makes every checkpoint of its run now on disk a failure saying so."""
    from analysis.discover import ANCHOR_ARM, anchor_eval_dir
    from launch.evaluation import ANCHOR_PROMPT

    data = _read_runs(plan)
    report = EvalReport()
    for i, entry in enumerate(data["runs"]):
        try:
            outcome = read_json_object(_run_outcome(plan, i))
        except (OSError, ValueError):
            if entry.get("anchor"):
                jobs = [EvalJob(ANCHOR_ARM, 0, 0, entry["anchor"], anchor_eval_dir(Path(data["anchor_dir"]), data["profile"]),
                                list(data["benches"]), ANCHOR_PROMPT)]
            else:
                jobs = [EvalJob(r.arm, r.seed, step, str(ckpt), r.eval_dir(step), list(data["benches"]), data["prompt"])
                        for r in _entry_runs(data, entry) for step, ckpt in sorted(r.checkpoints.items())]
            why = (f"{_entry_name(i, entry).split(' (')[0]}'s evaluation job wrote no outcome (cancelled because its "
                   f"dependency {entry['after']} failed, i.e. its training did not finish, or killed, out of time, not "
                   f"run; see {plan}/slurm-run-{i}-*.out)" if entry["after"] else
                   f"{_entry_name(i, entry).split(' (')[0]}'s evaluation job wrote no outcome (killed, out of time or "
                   f"not run; see {plan}/slurm-run-{i}-*.out)")
            report.failures += [EvalFailure(j, list(j.benches), why) for j in jobs]
            continue
        report.jobs += [_job(r) for r in outcome.get("jobs", [])]
        report.failures += [EvalFailure(_job(f["job"]), list(f["benches"]), str(f["error"]))
                            for f in outcome.get("failures", [])]
    return report


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
    if Path(tasks_file).name == RUNS:
        return _runs_report(plan)
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
