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

import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from analysis.errors import AnalysisError
from analysis.evaluation import EvalFailure, EvalJob, EvalReport, _pending, harness, run_job
from common.io import read_json_object, write_json

TASKS = "tasks.json"
CONFIG = "analyze.yaml"
LAUNCHERS = ("local", "slurm")


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
                     signal=False, **opt, **kw)


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
    spec = _spec(cfg, job_name="dtsft-eval", gpus_per_node=gpus,
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
    agg = _spec(cfg, job_name="dtsft-analyze", gpus_per_node=0, output=str(plan / "slurm-aggregate-%j.out"),
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


def run_task(plan: Path, index: int, evaluator=None) -> int:
    """Array task `index`: evaluate its checkpoint's benches still pending (by identity); 0 when done."""
    plan = Path(plan)
    data = _read_plan(plan)
    if not 0 <= index < len(data["tasks"]):
        raise AnalysisError(f"{plan / TASKS}: no task {index} (it lists {len(data['tasks'])})")
    job, opts = _job(data["tasks"][index]), data["eval_opts"]
    h = harness(evaluator)
    todo = _pending(h, job, opts)
    if todo is None:
        print(f"[analyze] {job.label}: every bench is already evaluated under this identity; nothing to do", flush=True)
        write_json(_outcome(plan, index), {"label": job.label, "status": "done", "failures": []})
        return 0
    failures = run_job(todo, h, opts, Path(data["anchor_dir"]))
    write_json(_outcome(plan, index), {"label": job.label, "status": "failed" if failures else "evaluated",
                                       "failures": [{"benches": f.benches, "error": f.error} for f in failures]})
    for f in failures:
        print(f"[analyze] {job.label} {f.benches}: {f.error}", file=sys.stderr, flush=True)
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
