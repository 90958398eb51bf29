"""`analyze ... launcher=slurm` (docs/how-to/slurm.md): the evaluation jobs, each `python -m launch.eval_slurm CONFIG`
on a config of one format (`_task`), cut to what is left by identity as a local analyze cuts it (run_task), then the
aggregation job (`python -m launch.analyze analyze.yaml`, its `eval_tasks=` their configs: tasks_report)."""
from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
from contextlib import suppress
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from analysis.discover import discover_runs, recorded_identity
from analysis.errors import AnalysisError
from common.cli import ConfigError, run_cli
from common.interpreter import eval_needs, interpreter
from common.datafetch import no_network
from common.io import json_text, read_json_object, utc_stamp, write_json
from evals.profiles import load_profile
from launch.evaluation import EvalFailure, EvalJob, EvalReport, candidates, check_settings, harness, plan, run_job
from launch.jobs import Cluster, Job, Needs, Resources, backend, dry_run_dir, watch

MODULE = "launch.eval_slurm"   # what every evaluation job runs: python -m launch.eval_slurm CONFIG (main)
# Slurm's warning before an evaluation task's time limit: SIGUSR1 120 s before, to the batch shell, which is
# the task's python (the script execs it): it stops, keeps its rows and requeues itself (run_task).
WARNING = "B:USR1@120"


def plan_dir(cfg, kind: str) -> Path:
    """Where a submission's job configs, scripts and logs go: <out>/_slurm/<kind>-<UTC time>/ (a dry run: a temporary dir)."""
    return dry_run_dir(kind) if cfg.dry_run else (Path(cfg.out) / "_slurm" / f"{kind}-{utc_stamp()}").resolve()


def write_files(files: dict[Path, str]) -> None:
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def _task(req, where: Path, name: str, what: str, gap: str, planned: list[EvalJob] = (), discover: dict | None = None) -> tuple[Path, str]:
    """One evaluation job's config (the one format: the checkpoints `planned` at submission, a run's or the anchor's to
    `discover` when the job starts, and what these hold now by identity, `held`: tasks_report's results should it write no outcome)."""
    data = {"name": what, "eval_opts": req.eval_opts, "anchor_dir": str(Path(req.anchor_dir).resolve()),
            "outcome": str(where / f"outcome-{name.removeprefix('eval-')}.json"), "no_outcome": gap,
            "planned": [j.record() for j in planned], "discover": discover}
    with no_network():   # (the harness's rule, decided here: the aggregation does not import it; never waiting on the hub)
        left = {j.out: j.benches for j in plan(req.h, _candidates(data))} if discover else {}
    data["held"] = {j.out: {b: recorded_identity(j.out, b) for b in j.benches if b not in left.get(j.out, ())} for j in _candidates(data) if discover}
    return where / f"{name}.json", json_text(data)


def _evaluation(req, name: str, configs: list[str], notes: list[str], **after) -> Job:
    """An evaluation job (an array when `name` is `eval`) on `configs`, after what `after` says (waits, after,
    after_task); it needs the data evaluate reads and what its backend imports."""
    opts = {**(load_profile(req.profile)["evaluate"] if req.profile else {}), **req.eval_opts}   # eval.* (those set) over the profile's
    array, gpus = name == "eval", req.cfg.slurm.gpus_per_task
    if gpus is None:   # what evaluate's engines take: data_parallel engines of tensor_parallel_size GPUs (vllm) or one (hf)
        gpus = int(opts.get("data_parallel") or 1) * (int(opts.get("tensor_parallel_size") or 1) if opts.get("backend") == "vllm" else 1)
    data = tuple(str(opts[k]) for k in ("corpus", "index", "encoder", "bench_root") if opts.get(k))
    return Job(name, MODULE, python=interpreter(req.cfg.python, "eval"), cluster=Cluster.of(req.cfg.slurm),
               config=None if array else configs[0], array=tuple(configs) if array else (),
               needs=Needs(data=data, modules=tuple(eval_needs(opts.get("backend")))), notes=tuple(notes),
               resources=Resources(gpus_per_node=int(gpus), signal=WARNING, at_once=req.cfg.slurm.concurrency if array else None),
               **after)


def _aggregation(req, plan: Path, files: dict[Path, str], after: tuple[str, ...]) -> Job:
    """The job that writes the report from the outcomes of the evaluation jobs whose configs are `files` (after
    them, however they ended); its own config added to `files`."""
    path = plan / "analyze.yaml"
    files[path] = OmegaConf.to_yaml(OmegaConf.merge(req.cfg, {"launcher": "local", "eval_tasks": list(map(str, files)),
                                                              "dry_run": False, "slurm": {"runs": None, "runs_after": None}}))
    return Job("aggregate", "launch.analyze", python=interpreter(req.cfg.python, "eval"), cluster=Cluster.of(req.cfg.slurm),
               config=str(path), after=after, after_any=True, needs=Needs(modules=("pandas",)),
               notes=("the report, from the evaluation jobs' outcomes",))


def runs_plan(req, plan: Path, runs: list[str], after: list) -> tuple[list[Job], dict[Path, str]]:
    """`runs` (slurm.runs) as Jobs and their configs (unwritten): one evaluation job per run dir after `after[i]` (an
    sbatch dependency, or (job name, array task) of a training job planned before it), the anchor's, then the
    aggregation (afterany). Each job plans its run's checkpoints when it starts: they appear while the run trains."""
    entries = [(f"run {i}", str(Path(r).resolve()), None, a) for i, (r, a) in enumerate(zip(runs, after))]
    entries += [("the anchor", None, req.anchor, None)] if req.anchor is not None else []
    jobs, files = [], {}
    for i, (who, run, anchor, dep) in enumerate(entries):
        name, what = f"eval-run-{i}", f"{who} ({run or anchor})"
        link, shown = ({"after": (dep[0],), "after_task": dep[1]}, f"{dep[0]} task {dep[1]}") if isinstance(dep, tuple) \
            else ({"waits": dep}, dep)   # a training task planned before it in the same plan, or a dependency string
        cause = f"cancelled because its dependency {shown} failed, i.e. its training did not finish, or " if dep else ""
        path, files[path] = _task(req, plan, name, what, f"{who}'s evaluation job wrote no outcome ({cause}killed, out "
                                  "of time or not run; see its slurm-*.out log)",
                                  discover={"run": run, "anchor": anchor, "runs_root": str(req.cfg.runs_root), "profile":
                                            req.profile, "benches": list(req.benches), "prompt": req.cfg.eval.prompt})
        jobs.append(_evaluation(req, name, [str(path)], [f"{what}: its checkpoints when this job starts, by evaluation "
                                                         "identity"], **link))
    return [*jobs, _aggregation(req, plan, files, tuple(j.name for j in jobs))], files


def submit(req, jobs: list[EvalJob]) -> None:
    """`analyze launcher=slurm`: the evaluation jobs, then the aggregation (afterany), submitted (dry_run: written and
    printed): with `slurm.runs` runs_plan's, else one array, task i evaluating `jobs[i]` (planned here) after slurm.after."""
    cfg, runs = req.cfg, req.cfg.slurm.runs is not None
    where = plan_dir(cfg, "runs" if runs else "analyze")
    if runs:
        plan, files = runs_plan(req, where, list(cfg.slurm.runs), list(cfg.slurm.runs_after or [None] * len(cfg.slurm.runs)))
    else:
        files = dict(_task(req, where, f"eval-{i}", j.label, f"Slurm array task {i} wrote no outcome (killed, out of time "
                           f"or not run; see {where}/slurm-eval-*_{i}.out)", planned=[j]) for i, j in enumerate(jobs))
        plan = [_evaluation(req, "eval", list(map(str, files)), [f"{j.label} {j.benches} <- {j.ckpt}" for j in jobs],
                            waits=cfg.slurm.after), _aggregation(req, where, files, ("eval",))]
    runner = backend(cfg.launcher)(f"analyze launcher={cfg.launcher}")
    write_files(files)
    ids = runner.run(plan, where, dry_run=bool(cfg.dry_run))
    if cfg.dry_run:
        return None
    shown = [(f"{len(j.array)} evaluation(s) as Slurm job array {ids[j.name]}" if j.array else
              f"{j.notes[0].split(': ')[0]} as job {ids[j.name]}") + (f" (after {j.waits})" if j.waits else "")
             for j in plan[:-1]]
    print(f"[analyze] submitted {', '.join(shown)} and the aggregation as job {ids['aggregate']} "
          f"(afterany:{':'.join(ids[j.name] for j in plan[:-1])}); plan and logs in {where}\n"
          f"[analyze] {watch(ids.values())}", flush=True)
    if cfg.slurm.jobs_file:   # a study's analyze job: its submissions join the study's job ids
        record_jobs(Path(cfg.slurm.jobs_file), ids, os.environ.get("SLURM_JOB_ID"))


def record_jobs(path: Path, ids: dict[str, str], submitter: str | None = None) -> None:
    """Add `ids` (job name -> id) to `path`, a study's jobs.json, under a lock on its directory (the study and
    the analyze job it submitted both write it, in either order); `submitter`: the id of the job that submitted
    them, whose name there prefixes theirs (`report.eval`; `analyze.eval` when the file does not name it)."""
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        held = read_json_object(path) if path.is_file() else {}
        name = next((k for k, v in held.items() if v == submitter), "analyze") if submitter else None
        write_json(path, {**held, **{f"{name}.{k}" if name else k: v for k, v in ids.items()}})
    except ValueError as exc:   # (after submitting them: said, not a traceback)
        raise AnalysisError(f"{exc}; jobs {','.join(ids.values())} are queued all the same, not recorded in it") from None
    finally:
        os.close(fd)


# an evaluation job's config (_task's), its `discover` (a run's or the anchor's checkpoints), a job's record
# (EvalJob.record) and its outcome (run_task's): their shapes (a type; [shape]: a list of such; {key: shape})
TEXT = (str, type(None))
JOB = {"arm": str, "seed": int, "step": int, "ckpt": str, "out": str, "benches": [str], "prompt": str}
TASK = {"name": str, "eval_opts": dict, "anchor_dir": str, "outcome": str, "no_outcome": str, "planned": [JOB],
        "discover": (dict, type(None)), "held": dict}
DISCOVER = {"run": TEXT, "anchor": TEXT, "runs_root": str, "profile": TEXT, "benches": [str], "prompt": str}
OUTCOME = {"jobs": [JOB], "failures": [{"job": JOB, "benches": [str], "error": str}]}


def _check(got: Any, shape, at: str = "") -> Any:
    """`got` when it has `shape` (above; an object may hold more keys); else ValueError naming where (`at`) it has not."""
    where = at.rstrip(".")
    if isinstance(shape, dict) and isinstance(got, dict):
        for k, s in shape.items():
            if k not in got:
                raise ValueError(f"{at}no {k!r}")
            _check(got[k], s, f"{at}{k}.")
    elif isinstance(shape, list) and isinstance(got, list):
        for i, x in enumerate(got):
            _check(x, shape[0], f"{where}[{i}].")
    elif isinstance(shape, (dict, list)) or not isinstance(got, shape):
        raise ValueError(f"{where}: {got!r}" + (", not an object" if isinstance(shape, dict) else ""))
    return got


def read_task(path: Path) -> dict:
    """An evaluation job's config, checked (AnalysisError: one line naming the file)."""
    try:
        data = _check({"held": {}, **read_json_object(path)}, TASK)   # (a config written before `held`: nothing held)
        _check(data["discover"], type(None) if data["discover"] is None else DISCOVER, "discover.")
        [EvalJob(**r) for r in data["planned"]]   # (unknown keys: a TypeError)
        return data
    except (OSError, ValueError, TypeError) as exc:
        raise AnalysisError(f"{path}: not an evaluation job's config ({exc})") from exc


def _candidates(data: dict) -> list[EvalJob]:
    """What an evaluation job is to evaluate, every bench of it: the checkpoints planned at submission, and
    every checkpoint now on disk of the run (or the anchor) it discovers."""
    jobs, found = [EvalJob(**r) for r in data["planned"]], data["discover"]
    if found is None:
        return jobs
    runs = [r for r in discover_runs(Path(found["runs_root"]), found["profile"])
            if Path(r.path).resolve() == Path(found["run"])] if found["run"] is not None else []
    return jobs + candidates(runs, found["benches"], found["prompt"], found["anchor"], Path(data["anchor_dir"]),
                             found["profile"])


class TimeLimitWarning(KeyboardInterrupt):
    """WARNING received: stop the evaluation now. A KeyboardInterrupt, so that it passes every `except Exception` (run_job's
    included) and the async driver re-raises it as itself; the rows already appended stay, and evaluate resumes from them."""


def _stop(signum, frame):
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)   # one stop; a second warning must not break the wind-down
    raise TimeLimitWarning()


def _rows(jobs: list[EvalJob]) -> int:
    """Rows held in the jobs' eval dirs (every `<bench>.jsonl`, data_parallel's shards included): a segment's progress."""
    return sum(path.read_bytes().count(b"\n") for j in jobs for path in Path(j.out).rglob("*.jsonl"))


def run_task(config: Path, evaluator=None) -> int:
    """One Slurm segment of an evaluation job: what its checkpoints have left by identity, evaluated, then its outcome
    (failed: exit 1); stopped by the time-limit warning, it requeues itself (exit 0) only when this segment made
    progress (docs/how-to/slurm.md, "Time limits")."""
    data = read_task(Path(config))
    what, opts, h = data["name"], data["eval_opts"], harness(evaluator)

    def todo() -> list[EvalJob]:   # the settings resolved once (a refused one: each evaluation says why, a gap)
        jobs = _candidates(data)
        with suppress(ConfigError):
            check_settings(h, opts, list(dict.fromkeys(b for j in jobs for b in j.benches)))
        return plan(h, jobs)

    jobs, failures, before, status = [], [], 0, "evaluated"
    old = signal.signal(signal.SIGUSR1, _stop)
    try:
        if not (jobs := todo()):
            print(f"[analyze] {what}: every bench is already evaluated under this identity; nothing to do", flush=True)
            status = "done"
        before = _rows(jobs)   # (0 when there is nothing to do)
        for job in jobs:
            failures += run_job(job, h, Path(data["anchor_dir"]))
    except TimeLimitWarning:
        left = todo()
        pending, error = sum(len(j.benches) for j in left), None
        if not left:
            print(f"[analyze] {what}: the time-limit warning came after the work was done", flush=True)
        elif _rows(jobs) > before or pending < sum(len(j.benches) for j in jobs):
            # this job as scontrol names it (`<array>_<task>` for an array task)
            array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
            ref = f"{array}_{task}" if array and task else os.environ.get("SLURM_JOB_ID") or None
            print(f"[analyze] {what}: stopped by the time-limit warning with {pending} bench(es) of "
                  f"{len(left)} checkpoint(s) left ({_rows(jobs) - before} row(s) written in this segment, "
                  f"kept); requeueing {ref}", flush=True)
            scontrol = shutil.which("scontrol")
            proc = subprocess.run([scontrol, "requeue", ref], capture_output=True, text=True) if ref and scontrol else None
            if proc is not None and proc.returncode == 0:
                return 0
            why = ("not a Slurm job (no SLURM_JOB_ID), so nothing to requeue" if ref is None else "scontrol not found on PATH"
                   if proc is None else f"scontrol requeue {ref} failed (exit {proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
            error = f"stopped by the time-limit warning with {pending} bench(es) left; could not requeue: {why}"
        else:
            error = ("stopped by the time-limit warning with no progress in this segment (no row written); "
                     "not requeued again: raise slurm.time (or lower eval.batch_size) and run analyze again")
        failures = [EvalFailure(j, list(j.benches), error) for j in left] if error else failures
    finally:
        signal.signal(signal.SIGUSR1, old)
    for f in failures:
        print(f"[analyze] {f.job.label} {f.benches}: {f.error}", file=sys.stderr, flush=True)
    write_json(Path(data["outcome"]), {
        "name": what, "status": "failed" if failures else status, "jobs": [j.record() for j in jobs],
        "failures": [{"job": f.job.record(), "benches": f.benches, "error": f.error} for f in failures]})
    return 1 if failures else 0


def tasks_report(tasks) -> EvalReport:
    """The outcomes of the evaluation jobs of `tasks` (their configs, read_task's) as a local analyze would have reported them: a
    job that failed, or wrote no outcome (killed, out of time, never ran, cancelled), a failure of its work (but what it `held`)."""
    report = EvalReport()
    for data in tasks:
        planned = [EvalJob(**r) for r in data["planned"]]
        report.jobs += planned
        if not Path(data["outcome"]).exists():   # (written atomically: one that is there but does not read is corrupt)
            report.failures += [EvalFailure(j, gaps, data["no_outcome"]) for j in _candidates(data) if (gaps := [   # (held: _task's)
                b for b in j.benches if data["held"].get(j.out, {}).get(b, "not held") != recorded_identity(j.out, b)])]
            continue
        try:
            outcome = _check(read_json_object(Path(data["outcome"])), OUTCOME)
            done = [EvalJob(**r) for r in outcome["jobs"]]
            report.failures += [EvalFailure(EvalJob(**f["job"]), f["benches"], f["error"]) for f in outcome["failures"]]
        except (ValueError, TypeError) as exc:
            raise AnalysisError(f"{data['outcome']}: not an evaluation job's outcome ({exc})") from None
        report.jobs += [j for j in done if j.label not in {p.label for p in planned}]
    return report


def _main(argv: list[str]) -> int:
    if len(argv) != 1 or "=" in argv[0]:
        raise AnalysisError("usage: python -m launch.eval_slurm CONFIG (an evaluation job's config, written by "
                            "analyze launcher=slurm)")
    return run_task(Path(argv[0]))


def main(argv: list[str] | None = None) -> int:
    return run_cli(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
