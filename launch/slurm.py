"""The Slurm launcher (SlurmRunner): one sbatch script per Job, submitted with sbatch in plan order. A training
job runs one torchrun per node under srun (c10d rendezvous on the first node), saves and requeues itself on
SIGUSR1 before its time limit (a crash or a refusal is not requeued), and records how a segment ended short of
DONE (common.layout FAILED / REQUEUED); why each step is there: docs/how-to/slurm.md ("Training jobs and
signals", "How a segment ended"), docs/stages/launch.md."""
from __future__ import annotations

import shlex
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from common.layout import CONFIG, LAUNCH_ID_ENV
from launch.errors import LaunchError
from launch.jobs import CLUSTER_OPTIONS, REPO, Cluster, Job, Runner
from launch.manifest import read as read_manifest

# Options the generated script sets itself; `launcher.sbatch` may not repeat them.
OWN_OPTIONS = ("job-name", "nodes", "ntasks-per-node", "gpus-per-node", "signal", "requeue", "open-mode", "output",
               "array", "dependency", *CLUSTER_OPTIONS)


def slurm_option_problems(options, key: str = "launcher.sbatch") -> list[str]:
    """What is wrong with sbatch options `options` given as `key` (a list of `--option[=value]` strings), one line each."""
    if isinstance(options, str) or not isinstance(options, Sequence):
        return [f"{key} must be a list of sbatch options, e.g. [--qos=high,--constraint=h100], got {options!r}"]
    bad = []
    for opt in options:
        if not isinstance(opt, str) or not opt.startswith("-") or "\n" in opt or opt.strip() != opt:
            bad.append(f"{key}: {opt!r} is not one sbatch option (e.g. --qos=high)")
        elif (name := opt.lstrip("-").split("=", 1)[0]) in OWN_OPTIONS:
            own = f"; use {key.rpartition('.')[0]}.{name}=" if name in CLUSTER_OPTIONS else ""
            bad.append(f"{key}: {opt!r} is set by launch itself{own}")
    return bad


def _training(job: Job, setup: list[str]) -> list[str]:
    """A training job's lines after the template's head: the end records (written atomically; an EXIT trap records a
    segment that ended otherwise, in setup or killed), `setup`, one segment of the run under torchrun, then requeue or finish."""
    nodes, python = job.resources.nodes, job.python
    node_cmd = (f'trap "" USR1; exec "$0" -m launch.torchrun --nnodes={nodes} --nproc_per_node={job.torchrun} --rdzv_backend=c10d'
                f' --rdzv_endpoint="$1" --rdzv_id="$SLURM_JOB_ID" -m {job.module} "$2"')
    return [
        "JOB_REF=${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}}",
        "JOB_REF=${JOB_REF:-$SLURM_JOB_ID}",
        # the id a trainer's refusal and failure are recorded under (common.layout): this segment's
        f'export {LAUNCH_ID_ENV}="slurm-$JOB_REF-${{SLURM_RESTART_COUNT:-0}}"',
        'rm -f "$RUN_DIR/FAILED" "$RUN_DIR/REQUEUED"   # an earlier segment\'s end record: this one runs',
        "ENDED= PHASE=setup",
        "end_record() {  # NAME REASON: $RUN_DIR/NAME (the other one removed)",
        '  local tmp="$RUN_DIR/.$1.tmp-$$" other=FAILED',
        '  [ "$1" = FAILED ] && other=REQUEUED',
        """  printf '{\\n  "state": "%s",\\n  "reason": "%s",\\n  "by": "slurm batch script",\\n  "launch": "%s",\\n"""
        """  "job": "%s",\\n  "time": "%s"\\n}\\n' "${1,,}" "$2" "$""" + LAUNCH_ID_ENV
        + """" "$JOB_REF" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" \\""",
        '    > "$tmp" && mv -f "$tmp" "$RUN_DIR/$1" && rm -f "$RUN_DIR/$other"',
        "  ENDED=1",
        "}",
        "on_exit() {",
        "  local rc=$?",
        '  [ -n "$ENDED" ] || [ -f "$RUN_DIR/DONE" ] && return',
        '  if [ "$PHASE" = setup ]; then end_record FAILED "the job ended (exit $rc) before training started (in launcher.setup?)"',
        '  else end_record FAILED "the batch shell was ended during training (scancel, the time limit or a node failure)"; fi',
        "}",
        "trap on_exit EXIT",
        *setup,
        'if [ -f "$RUN_DIR/DONE" ]; then echo "[launch] $RUN_DIR is finished (DONE); nothing to do"; exit 0; fi',
        'HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        # the rendezvous host: the node's address (NodeAddr), which is its name only where the cluster names
        # its nodes by hostname (a node named otherwise is not resolvable: torchrun's store would time out)
        "HEAD_ADDR=$(scontrol -o show node \"$HEAD_NODE\" 2>/dev/null | sed -n 's/.* NodeAddr=\\([^ ]*\\).*/\\1/p')",
        'HEAD_NODE=${HEAD_ADDR:-$HEAD_NODE}',
        "RDZV_PORT=${DTSFT_RDZV_PORT:-29500}",   # (torchrun's default port)
        'echo "[launch] segment ${SLURM_RESTART_COUNT:-0} of $RUN_DIR on $SLURM_JOB_NODELIST'
        ' (rendezvous $HEAD_NODE:$RDZV_PORT)"',
        # SIGUSR1 to the batch shell (`scancel --signal=USR1 --batch`, a preemption notice) would end bash and
        # the job with it: the shell passes it to srun, which forwards it to the trainers, and waits on.
        "PHASE=training",
        "trap 'echo \"[launch] SIGUSR1 to the batch shell: passed to the trainers (save and stop)\"; "
        "kill -USR1 \"$srun_pid\" 2>/dev/null' USR1",
        f"srun --nodes={nodes} --ntasks-per-node=1 --kill-on-bad-exit=1 \\",
        f"  bash -c {shlex.quote(node_cmd)} \\",
        f'  {shlex.quote(python)} "$HEAD_NODE:$RDZV_PORT" "$RUN_DIR/config.yaml" &',
        "srun_pid=$!",
        # a trapped signal ends `wait` early (status > 128) while srun runs on: wait again
        'while wait "$srun_pid"; rc=$?; [ $rc -gt 128 ] && kill -0 "$srun_pid" 2>/dev/null; do :; done',
        "trap - USR1",
        'if [ -f "$RUN_DIR/DONE" ]; then echo "[launch] $RUN_DIR finished"; exit 0; fi',
        "if [ $rc -eq 0 ]; then",
        '  echo "[launch] stopped before the end (time limit / preemption): requeueing $JOB_REF"',
        '  end_record REQUEUED "stopped before the end (time limit or preemption); Slurm job $JOB_REF requeued to resume"',
        '  scontrol requeue "$JOB_REF" || end_record FAILED "stopped before the end (time limit or preemption) and '
        'scontrol requeue $JOB_REF failed; resubmit to resume"',
        "  exit 0",
        "fi",
        # a refusal recorded by this segment's trainer: its one line, with the trainer's own code (2, or 3
        # for non-finite gradients; launch.torchrun passes a worker's code on, torch's own torchrun exits 1)
        f'if refusal=$({shlex.quote(python)} -m launch.refusal "$RUN_DIR" "${LAUNCH_ID_ENV}"); then',
        "  rc=${refusal%%$'\\t'*} ENDED=1   # its own FAILED record says why (none: another trainer holds the run)",
        "  echo \"error: ${refusal#*$'\\t'}\" >&2",
        "fi",
        'echo "[launch] trainer failed with exit code $rc; not requeueing"',
        # the trainer's own FAILED record (this segment's) says more; else this one (an OOM kill, SIGKILL, ...)
        f'if [ -n "$ENDED" ] || grep -qsF "\\"launch\\": \\"${LAUNCH_ID_ENV}\\"" "$RUN_DIR/FAILED"; then ENDED=1; else',
        '  why="the training step exited with code $rc"',
        '  [ $rc -gt 128 ] && why="$why (killed by SIG$(kill -l $((rc - 128)) 2>/dev/null || echo $((rc - 128)))"',
        '  [ $rc -eq 137 ] && why="$why: out of memory?"   # SIGKILL: what the OOM killer sends',
        '  [ $rc -gt 128 ] && why="$why)"',
        '  end_record FAILED "$why"',
        "fi",
        "exit $rc",
    ]


class SlurmRunner(Runner):
    """`--dependency` from `after` (afterok, with `--kill-on-invalid-dep=yes` so that what runs afterany still runs;
    afterany for `after_any`) and `waits`; an array is one script, task i running config i. Training (a torchrun job)
    is `_training` on whole nodes, warned by SIGUSR1 120 s before the time limit (its trainers save and stop); any other
    job execs `python -m MODULE CONFIG` in the batch shell. Logs: `<where>/slurm-<name>-<job id>.out`, or in `job.logs`."""
    suffix = ".sbatch"
    submits, requeues = True, True

    @staticmethod
    def check_not_queued(run_dir: Path) -> None:
        """Refuse a run whose last submitted job (manifest.json's) is still queued or running (two jobs, one run dir)."""
        launches = read_manifest(run_dir).get("launches", [])
        jobs = [e["launcher"]["job_id"] for e in launches if (e.get("launcher") or {}).get("job_id")]
        squeue = shutil.which("squeue")   # absent, or the job no longer known (finished, purged): not queued
        out = subprocess.run([squeue, "-h", "-o", "%T", "-j", str(jobs[-1])], capture_output=True, text=True) \
            if jobs and squeue else None
        if out is not None and out.returncode == 0 and out.stdout.split():
            raise LaunchError(f"{run_dir} is already {out.stdout.split()[0]} as Slurm job {jobs[-1]}; it resumes by "
                              f"itself when requeued (scancel {jobs[-1]} first to resubmit)")

    def script(self, job: Job, ids, where: Path) -> str:
        """The one sbatch template: the #SBATCH header, a training job's run dir(s) and the checkout or any other job's
        `workdir` (its relative paths valid), then the job's lines; `launcher.setup` before them, not under `set -u`
        (environment scripts, conda activate or module load, often read unset variables)."""
        r, q, cluster = job.resources, shlex.quote, job.cluster or Cluster()
        task = "" if job.after_task is None else f"_{job.after_task}"
        own = (("afterany:" if job.after_any else "afterok:") + ":".join(ids[a] + task for a in job.after)) if job.after else None
        dep = ",".join(d for d in (own, job.waits) if d) or None
        pattern = "%A_%a.out" if job.array else "%j.out"
        log = Path(job.logs) / f"slurm-{pattern}" if job.logs else Path(where) / f"slurm-{job.name}-{pattern}"
        setup = ["set +u  # launcher.setup", *cluster.setup.strip().splitlines(),
                 "set -u  # end of launcher.setup"] if cluster.setup else []
        if job.torchrun is not None:   # training
            dirs = [str(Path(c).parent) for c in job.configs]
            if any(Path(c).name != CONFIG for c in job.configs):
                raise LaunchError(f"job {job.name}: a training job's config is its run dir's config.yaml")
            lines = [*(["RUN_DIRS=(", *(f"  {q(d)}" for d in dirs), ")", 'RUN_DIR="${RUN_DIRS[$SLURM_ARRAY_TASK_ID]}"']
                       if job.array else [f"RUN_DIR={q(dirs[0])}"]),
                     f"cd {q(str(REPO))}", "export PYTHONUNBUFFERED=1", *_training(job, setup)]
        else:   # the batch step is its one task, no srun
            task = '"$SLURM_ARRAY_TASK_ID"' if job.array else ""
            lines = [f"cd {q(self.workdir)}", "export PYTHONUNBUFFERED=1", f"export PYTHONPATH={q(str(REPO))}${{PYTHONPATH:+:$PYTHONPATH}}", *setup,
                     *(f"# task {i}: {n}" if job.array else f"# {n}" for i, n in enumerate(job.notes)),
                     *(["CONFIGS=(", *(f"  {q(c)}" for c in job.array), ")"] if job.array else []),
                     f'echo "[{job.name}]{" task " + task if task else ""} (segment ${{SLURM_RESTART_COUNT:-0}}) on '
                     '${SLURM_JOB_NODELIST:-this host}"',
                     f"exec {q(job.python)} -m {job.module} "
                     + ('"${CONFIGS[$SLURM_ARRAY_TASK_ID]}"' if job.array else q(str(job.config)))]
        options = [f"job-name={job.title or f'dtsft-{job.name}'}", f"nodes={r.nodes}", "ntasks-per-node=1",
                   *([f"gpus-per-node={r.gpus_per_node}"] if r.gpus_per_node else []),
                   *(["exclusive", "signal=USR1@120"] if job.torchrun is not None else [f"signal={r.signal}"] if r.signal else []),
                   "requeue", "open-mode=append", f"output={log}",
                   *(f"{k}={v}" for k in CLUSTER_OPTIONS if (v := getattr(cluster, k)) is not None),
                   *([f"array=0-{len(job.array) - 1}" + (f"%{r.at_once}" if r.at_once else "")] if job.array else []),
                   *([f"dependency={dep}"] if dep else [])]
        return "\n".join(["#!/bin/bash", f"# Written by: {self.command}", *(f"#SBATCH --{o}" for o in options),
                          *(f"#SBATCH {o}" for o in cluster.sbatch),
                          *(["#SBATCH --kill-on-invalid-dep=yes"] if dep and "afterok" in dep else []), "", "set -uo pipefail",
                          *lines]) + "\n"

    def start(self, job: Job, script: Path, ids) -> str:
        """`sbatch --parsable SCRIPT`; the job id."""
        sbatch = shutil.which("sbatch")
        if sbatch is None:
            raise LaunchError(f"sbatch not found on PATH; the script is written at {script} "
                              "(use dry_run=true to only print it)")
        out = subprocess.run([sbatch, "--parsable", str(script)], capture_output=True, text=True)
        if out.returncode != 0:
            raise LaunchError(f"sbatch {script} failed (exit {out.returncode}): {out.stderr.strip() or out.stdout.strip()}")
        return out.stdout.strip().split(";", 1)[0]
