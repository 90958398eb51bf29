"""The Slurm tier (`make test-slurm`): the project's Slurm paths against a real scheduler, a private one-node
cluster (tests/slurm_cluster.py) brought up for this module and torn down after it. Every test drives the
command lines (`launch`, `analyze`) as a user would, with SLURM_CONF pointing at the private cluster, and
waits for the cluster's queue to empty; Slurm's own records (jobcomp/filetxt) say how each job ended."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from tests.slurm_cluster import SlurmCluster, free_port

    if os.geteuid() != 0:
        pytest.skip("the test cluster needs root (slurmd starts each job as its user)")
    c = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    # the trainers' c10d rendezvous port too (sbatch passes the environment on): another run's jobs may use 29500
    env = dict(c.env(), DTSFT_RDZV_PORT=str(free_port()))
    old = {k: os.environ.get(k) for k in env}
    try:
        c.up()
        os.environ.update(env)
        yield c
    finally:
        c.down()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# How long a test waits for its jobs: long enough for a box shared with other work (the tier's wall time, not
# this, is what .ci/run holds to its target); a job that hangs still fails the test.
PATIENCE = 1800


def _env(**more) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled", **more}


def _vllm_stand_in(where: Path) -> dict[str, str]:
    """The commands' environment with an empty stand-in `vllm` package on its PYTHONPATH: the preflight's probe
    of the submitting interpreter (backend=vllm) finds it, and the evaluation itself then fails where it imports
    vLLM's engine (no vllm.v1), as these tests intend."""
    site = where / "vllm_stand_in"
    (site / "vllm").mkdir(parents=True, exist_ok=True)
    (site / "vllm" / "__init__.py").write_text('"""A stand-in: the preflight finds it; the engine import fails."""\n')
    return {"PYTHONPATH": os.pathsep.join((str(site), str(ROOT)))}


def _cli(cwd: Path, module: str, *argv: str, timeout: int = PATIENCE, **env) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", module, *argv], cwd=cwd, env=_env(**env), capture_output=True,
                          text=True, timeout=timeout)
    return proc


def _ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc.stdout


def settle(cluster, timeout: float = PATIENCE, logs: Path | None = None) -> None:
    """Wait until the cluster's queue is empty (every job submitted so far ended)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not cluster.alive():
            pytest.fail(f"the test cluster stopped:\n{cluster.log_tail()}")
        if not cluster.jobs():
            return
        time.sleep(1)
    left = cluster.jobs()
    text = "\n".join(f"--- {p}\n{p.read_text(errors='replace')[-2000:]}" for p in sorted((logs or cluster.root).rglob("*.out")))
    pytest.fail(f"jobs still queued after {timeout:.0f} s: {left}\n{text}")


def records(cluster) -> list[dict[str, str]]:
    """Slurm's completion records (JobCompType=jobcomp/filetxt), one dict per ended job segment."""
    path = cluster.root / "jobcomp.txt"
    out = []
    for line in (path.read_text().splitlines() if path.is_file() else []):
        out.append(dict(m.groups() for m in re.finditer(r"(\w+)=(\S*)", line)))
    return out


def missing_points(report: str) -> str:
    """The report's "Missing points" section (empty when it has none)."""
    if "## Missing points" not in report:
        return ""
    return report[report.index("## Missing points"):].split("\n## ", 1)[0]


def _log(paths) -> str:
    return "\n".join(f"--- {p}\n{Path(p).read_text(errors='replace')[-3000:]}" for p in paths)


def _tables(reports: Path) -> dict[str, bytes]:
    return {p.relative_to(reports).as_posix(): p.read_bytes() for p in sorted(reports.rglob("*"))
            if p.is_file() and p.suffix in (".md", ".tex", ".csv") and p.name != "report.md"}


def _smoke() -> list[str]:
    from common.study import load_study

    return [t.replace("=docs/", f"={ROOT / 'docs'}/") for t in load_study("dual_terminator_sft").cpu_smoke]


@pytest.fixture(scope="module")
def data_cache(tmp_path_factory):
    """$DTSFT_DATA pre-filled by `fetch-data from=DIR` (tests/test_study.py's way); nothing is downloaded."""
    from tests.conftest import shared_path

    cache = tmp_path_factory.mktemp("data")
    env = {"DTSFT_DATA": str(cache), "DTSFT_DATA_ENDPOINT": "http://127.0.0.1:9"}
    fill = subprocess.run([sys.executable, "-m", "common.datafetch", f"from={shared_path('benchmarks')}"],
                          env=_env(**env), capture_output=True, text=True, timeout=120)
    assert fill.returncode == 0, fill.stderr
    return env


def test_the_dual_terminator_smoke_on_slurm_equals_the_local_one(cluster, data_cache, tmp_path):
    """cpu_smoke with launcher=slurm (gpus_per_node=0: CPU jobs) end to end: the training array, the report
    job, its evaluation array and aggregation, all run by Slurm; the tables equal the same smoke run locally
    (run here meanwhile)."""
    on_slurm, local = tmp_path / "slurm", tmp_path / "local"
    on_slurm.mkdir()
    local.mkdir()
    argv = ["study=dual_terminator_sft", "runs_root=runs", "reports=rep", *_smoke()]
    here = subprocess.Popen([sys.executable, "-m", "launch.cli", *argv], cwd=local, env=_env(**data_cache),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out = _ok(_cli(on_slurm, "launch.cli", *argv, "launcher=slurm", "gpus_per_node=0", **data_cache))
        assert "launcher=slurm" not in out or "submitted" in out
        settle(cluster, PATIENCE, on_slurm)
    finally:
        text, _ = here.communicate(timeout=PATIENCE)
    assert here.returncode == 0, text[-4000:]
    ledger = next((on_slurm / "runs" / "_slurm").glob("study-*"))
    logs = sorted(on_slurm.rglob("*.out"))
    ids = json.loads((ledger / "jobs.json").read_text())   # the plan's jobs (the training array, the report job) and
    assert sorted(ids) == ["report", "report.aggregate", "report.eval", "train"], ids   # the report job's own
    mine = [r for r in records(cluster) if r.get("WorkDir") == str(on_slurm)]
    # the plan's two jobs, and the report job's own: its evaluation array and its aggregation
    assert {r.get("Name") for r in mine} >= {"dtsft-sweep", "dtsft-dual_terminator_sft-report", "dtsft-eval",
                                              "dtsft-aggregate"}, (mine, _log(logs))
    for r in mine:
        assert r["JobState"] == "COMPLETED", (r, _log(logs))
    sweep = (ledger / "train.sbatch").read_text()   # the study's plan: every job's script in its ledger
    assert "--gpus-per-node" not in sweep and "--nproc_per_node=1" in sweep   # a CPU-only job: one process
    assert (on_slurm / "rep" / "report.md").is_file(), _log(logs)
    report = (on_slurm / "rep" / "report.md").read_text()
    assert "`failed=0`" in report and "evaluation failed" not in report, report
    got, want = _tables(on_slurm / "rep"), _tables(local / "rep")
    assert want and sorted(got) == sorted(want)
    assert [k for k in want if got[k] != want[k]] == [], {k: (got[k].decode()[:800], want[k].decode()[:800]) for k in want if got[k] != want[k]}


def _wait_for(cond, what: str, timeout: float = PATIENCE) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.5)
    pytest.fail(f"no {what} after {timeout:.0f} s")


def _job_id(out: str, pattern: str) -> str:
    m = re.search(pattern, out)
    assert m, out[-3000:]
    return m.group(1)


def _files(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


TRAIN = ["arm=r2e", "model=tiny", "data=synthetic", "steps=6", "state_every=100", "save_steps=[6]", "nproc=1",
         "logging.wandb=false", "n=24", "data.synthetic.code_turns=[1,2]", "data.synthetic.long_fraction=0.0",
         "data.synthetic.n_entities=20", "data.synthetic.code_obs_lines=[1,3]"]


def test_a_training_task_sent_usr1_stops_is_requeued_and_ends_on_the_uninterrupted_bytes(cluster, tmp_path):
    """`scancel --signal=USR1 --batch` mid-training (a preemption notice to the batch shell): the trainers save a
    resumable state and stop, the script requeues the job, Slurm starts it again and it resumes to the end; its
    last checkpoint is byte for byte the one an uninterrupted local run of the same settings writes."""
    here = subprocess.Popen([sys.executable, "-m", "launch.cli", *TRAIN, f"runs_root={tmp_path / 'local'}"],
                            cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out = _ok(_cli(tmp_path, "launch.cli", *TRAIN, f"runs_root={tmp_path / 'slurm'}", "launcher=slurm",
                       "gpus_per_node=0"))
        job = _job_id(out, r"Slurm job (\d+)")
        rd = tmp_path / "slurm" / "r2e" / "seed0"
        metrics = rd / "metrics.jsonl"
        _wait_for(lambda: metrics.exists() and metrics.read_text().strip(), "first training step under Slurm")
        sig = subprocess.run(["scancel", "--signal=USR1", "--batch", job], capture_output=True, text=True)
        assert sig.returncode == 0, sig.stderr
        settle(cluster, PATIENCE, rd)
    finally:
        text, _ = here.communicate(timeout=PATIENCE)
    assert here.returncode == 0, text[-3000:]
    log = "".join(p.read_text() for p in rd.rglob("*.out"))
    assert "SIGUSR1 to the batch shell" in log and f"requeueing {job}" in log and "segment 1 of" in log, log[-4000:]
    assert "resumed from" in log, log[-4000:]
    ends = [r for r in records(cluster) if r["JobId"] == job]
    assert [r["JobState"] for r in ends][-1] == "COMPLETED", ends
    assert (rd / "DONE").is_file() and list(rd.glob("state/step-*/COMPLETE"))
    ckpt = "checkpoints/step-000006"
    got, want = _files(rd / ckpt), _files(tmp_path / "local" / "r2e" / "seed0" / ckpt)
    assert want and sorted(got) == sorted(want)
    assert [k for k in want if got[k] != want[k]] == []


# A training task that fails: the batch script's setup (launcher.setup, run before srun) exits 3 for seed 1
# (RUN_DIR is the task's run dir; the evaluation jobs, which get the same setup, have none).
FAIL_SEED1 = 'launcher.setup=case "$RUN_DIR" in */seed1) echo planted training failure; exit 3;; esac'
# A training step killed where Python cannot say so (as the OOM killer's SIGKILL would): seed 1's processes get
# a 4 s CPU-time limit (srun passes the batch shell's limits on to the step), so the kernel kills them by signal.
KILL_SEED1 = 'launcher.setup=case "$RUN_DIR" in */seed1) echo planted CPU-time limit; ulimit -c 0; ulimit -t 4;; esac'
SMOKE_EVAL = ["benches=[bamboogle]", "eval.n=2", "eval.max_new_tokens=32", "eval.max_model_len=4096", "eval.dtype=float32",
              "eval.backend=hf", "corpus=corpus:wiki18_example_10"]


def test_a_failed_training_task_cancels_its_runs_evaluation_and_the_report_lists_it_as_a_gap(cluster, data_cache, tmp_path):
    """A sweep with eval_profile= on Slurm, seed 1's training task failing: Slurm cancels that run's evaluation job
    (afterok on its task, --kill-on-invalid-dep), seed 0's is evaluated, the aggregation (afterany) runs and
    its report lists seed 1 as a gap."""
    out = _ok(_cli(tmp_path, "launch.cli", "sweep", "arms=[r2e]", "seeds=[0,1]", "model=tiny_base", "data=synthetic",
                   "data.n=8", "steps=2", "logging.wandb=false", "launcher=slurm", "gpus_per_node=0", FAIL_SEED1,
                   "eval_profile=search_r1_7bench", "analyze.out=rep", *[f"analyze.{t}" for t in SMOKE_EVAL],
                   **data_cache))
    settle(cluster, PATIENCE, tmp_path)
    logs = sorted(tmp_path.rglob("*.out"))
    plan = next((tmp_path / "rep" / "_slurm").glob("runs-*"))
    runs = [json.loads((plan / f"eval-run-{i}.json").read_text())["discover"]["run"] for i in (0, 1)]   # each job's config
    assert [Path(r).name for r in runs] == ["seed0", "seed1"], runs
    # the per-run evaluation jobs, in submission order (run 0's first), as Slurm recorded their end
    evals = sorted((int(r["JobId"]), r["JobState"]) for r in records(cluster)
                   if str(r.get("Name")).startswith("dtsft-eval-run-") and r.get("WorkDir") == str(tmp_path))
    assert [state for _, state in evals] == ["COMPLETED", "CANCELLED"], (evals, out[-2000:], _log(logs))
    assert (plan / "outcome-run-0.json").is_file() and not (plan / "outcome-run-1.json").exists()
    report = (tmp_path / "rep" / "report.md").read_text()
    gap = missing_points(report)
    assert "r2e/seed1/" in gap and "r2e/seed0/" not in gap, report
    # why: the batch script's FAILED record (launcher.setup ended the job), not "still training"
    assert "failed: the job ended (exit 3) before training started" in gap and "still training" not in gap, gap
    assert list((tmp_path / "runs" / "r2e" / "seed0" / "eval").rglob("bamboogle.jsonl"))


def test_a_study_whose_training_failed_still_reports_and_lists_the_run_as_a_gap(cluster, data_cache, tmp_path):
    """A Slurm study whose only training task is killed by a signal mid-step (no Python left to record it): the
    report stage (afterany, not afterok: it would pend forever) still runs, evaluates the anchor and lists the
    failed run as a gap, with the batch script's reason (the step's exit code and signal)."""
    smoke = [t.replace("train:seeds=[0]", "train:seeds=[1]") for t in _smoke()]
    _ok(_cli(tmp_path, "launch.cli", "study=dual_terminator_sft", "runs_root=runs", "reports=rep", *smoke,
             "launcher=slurm", "gpus_per_node=0", KILL_SEED1, **data_cache))
    settle(cluster, PATIENCE, tmp_path)
    ledger = next((tmp_path / "runs" / "_slurm").glob("study-*"))
    logs = sorted(tmp_path.rglob("*.out"))
    ended = {r["JobId"]: r["JobState"] for r in records(cluster)}
    ids = json.loads((ledger / "jobs.json").read_text())
    assert ended.get(ids["train"]) == "FAILED" and ended.get(ids["report"]) == "COMPLETED", (ended, _log(logs))
    assert "afterany:" in (ledger / "report.sbatch").read_text()
    report = (tmp_path / "rep" / "report.md").read_text()
    gap = missing_points(report)
    assert "r2e/seed1/" in gap, report
    assert re.search(r"r2e/seed1/\S+ × \w+: failed: the training step exited with code \d+ \(killed by SIG", gap), \
        (gap, _log(logs))


HOLD_RUNNER = """\
import runpy, sys, time
from pathlib import Path

import evals.results as results

HOLD = Path({hold!r})
_append = results.append_rows


def append_rows(path, rows):
    _append(path, rows)
    if HOLD.exists():   # once: the segment after the requeue runs through
        HOLD.unlink()
        HOLD.with_name("held").write_text(str(path))
        end = time.monotonic() + 600
        while time.monotonic() < end:   # the warning (SIGUSR1 -> TimeLimitWarning) ends this wait
            time.sleep(0.1)


results.append_rows = append_rows   # before evals.store imports it
module = sys.argv[1]
sys.argv = [module, *sys.argv[2:]]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def _holding_interpreter(d: Path) -> tuple[Path, Path]:
    """`python.eval=` for the evaluation jobs: this Python, whose `-m launch.eval_slurm` waits after the first
    row it appends while `<d>/hold` exists, until the time-limit warning stops it (`<d>/held` says it waits)."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "hold_runner.py").write_text(HOLD_RUNNER.format(hold=str(d / "hold")))
    wrapper = d / "python"
    wrapper.write_text(f'#!/bin/sh\nif [ "$1" = "-m" ] && [ "$2" = "launch.eval_slurm" ]; then shift; '
                       f'exec {sys.executable} {d / "hold_runner.py"} "$@"; fi\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    (d / "hold").write_text("")
    return wrapper, d / "held"


def test_an_evaluation_task_warned_of_its_time_limit_requeues_itself_and_loses_no_row(cluster, data_cache, tmp_path):
    """The time-limit warning (what --signal=B:USR1@120 sends: SIGUSR1 to the batch shell, which is the task's
    python) mid-evaluation: the task stops, keeps its rows, requeues itself; its next segment evaluates the rest.
    Every item once: no row lost, none duplicated; the report has no failed evaluation. The task waits after its
    first row until the warning arrives (python.eval= runs it so), so the warning always finds it mid-evaluation
    (it once came after a fast evaluation had finished: nothing was stopped)."""
    (tmp_path / "runs").mkdir()
    n = 6
    python, held = _holding_interpreter(tmp_path / "hold")
    out = _ok(_cli(tmp_path, "launch.analyze", "runs_root=runs", "out=rep", "profile=search_r1_7bench", "anchor=tiny-base",
                   *[t.replace("eval.n=2", f"eval.n={n}") for t in SMOKE_EVAL], "eval.batch_size=1",   # a row at a time
                   f"python.eval={python}", "launcher=slurm", **data_cache))
    array = _job_id(out, r"Slurm job array (\d+)")
    rows = lambda: sorted((tmp_path / "runs").rglob("bamboogle.jsonl"))  # noqa: E731   (the anchor: runs/_anchor)
    _wait_for(held.exists, "task waiting after its first row")
    assert rows() and rows()[0].read_text().count("\n") == 1
    sig = subprocess.run(["scancel", "--signal=USR1", "--batch", f"{array}_0"], capture_output=True, text=True)
    assert sig.returncode == 0, sig.stderr
    settle(cluster, PATIENCE, tmp_path)
    logs = sorted((tmp_path / "rep").rglob("*.out"))
    log = _log(logs)
    assert "stopped by the time-limit warning" in log and f"requeueing {array}_0" in log, log
    assert "segment 1" in log, log
    ids = [json.loads(line)["id"] for line in rows()[0].read_text().splitlines()]
    assert len(ids) == n and len(set(ids)) == n, ids
    report = (tmp_path / "rep" / "report.md").read_text()
    assert "`failed=0`" in report and "evaluation failed" not in report, report


def test_an_analysis_whose_evaluation_fails_ends_failed(cluster, data_cache, tmp_path):
    """Issue 62: the evaluation task fails (backend=vllm where vLLM is not installed), so the aggregation job
    writes the report with the gap marked PARTIAL and exits 4: Slurm records it FAILED (it said COMPLETED)."""
    from common import interpreter

    if interpreter.missing_modules(sys.executable, ("vllm",)) == ():
        pytest.skip("vLLM is installed here: backend=vllm would not fail")
    (tmp_path / "runs").mkdir()
    out = _ok(_cli(tmp_path, "launch.analyze", "runs_root=runs", "out=rep", "profile=search_r1_7bench", "anchor=tiny-base",
                   *SMOKE_EVAL, "eval.backend=vllm", "launcher=slurm", **data_cache, **_vllm_stand_in(tmp_path)))
    array = _job_id(out, r"Slurm job array (\d+)")
    settle(cluster, PATIENCE, tmp_path)
    ended = {r["JobId"]: r["JobState"] for r in records(cluster) if r.get("WorkDir") == str(tmp_path)}
    names = {r["JobId"]: r.get("Name") for r in records(cluster) if r.get("WorkDir") == str(tmp_path)}
    agg = [j for j, name in names.items() if name == "dtsft-aggregate"]
    logs = _log(sorted((tmp_path / "rep").rglob("*.out")))
    assert len(agg) == 1 and ended[agg[0]] == "FAILED", (ended, names, array, logs)
    report = (tmp_path / "rep" / "report.md").read_text()
    assert report.splitlines()[0].startswith("# Transfer-curve report: PARTIAL: "), report
    assert "evaluation failed" in missing_points(report), report


def test_a_study_whose_evaluation_fails_ends_failed(cluster, data_cache, tmp_path):
    """Issue 62: a study on Slurm whose report stage's evaluation fails (backend=vllm where vLLM is not installed):
    its report job submits the evaluation and the aggregation, which writes the report marked PARTIAL and ends
    FAILED in Slurm's records."""
    from common import interpreter

    if interpreter.missing_modules(sys.executable, ("vllm",)) == ():
        pytest.skip("vLLM is installed here: backend=vllm would not fail")
    (tmp_path / "runs").mkdir()
    study = tmp_path / "failing_report.yaml"
    study.write_text("study: failing_report\ntitle: a report stage alone\nhardware: {gpus: 0, gpu: none}\n"
                     "vars: {runs_root: runs}\nstages:\n  - name: report\n    run: analyze\n    args:\n"
                     "      runs_root: ${vars.runs_root}   # [chosen: the study's runs]\n"
                     "notes: [Nothing of a reference is reproduced; this study checks how a failed evaluation ends.]\n")
    _ok(_cli(tmp_path, "launch.cli", f"study={study}", "report:out=rep", "report:profile=search_r1_7bench",
             "report:anchor=tiny-base", *[f"report:{t}" for t in SMOKE_EVAL], "report:eval.backend=vllm",
             "launcher=slurm", **data_cache, **_vllm_stand_in(tmp_path)))
    settle(cluster, PATIENCE, tmp_path)
    mine = [r for r in records(cluster) if r.get("WorkDir") == str(tmp_path)]
    ended = {r.get("Name"): r["JobState"] for r in mine}
    logs = _log(sorted(tmp_path.rglob("*.out")))
    assert ended.get("dtsft-failing_report-report") == "COMPLETED", (ended, logs)   # it planned and submitted
    assert ended.get("dtsft-aggregate") == "FAILED", (ended, logs)
    assert (tmp_path / "rep" / "report.md").read_text().startswith("# Transfer-curve report: PARTIAL: ")


def test_an_export_job_that_exits_0_without_its_completion_record_ends_failed(cluster, tmp_path):
    """Issue 62: a Slurm submission is not a job's completion. The export study's job, whose interpreter's
    `-m sft.export` exits 0 having written nothing, ends FAILED in Slurm's records (it ended COMPLETED), its
    FAILED record in the study's ledger naming the missing export_info.json."""
    python = tmp_path / "env" / "python"   # a Python, except that its `-m sft.export` does nothing
    python.parent.mkdir()
    python.write_text(f'#!/bin/sh\n[ "$2" = "sft.export" ] && exit 0\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    out = _ok(_cli(tmp_path, "launch.cli", "study=browsecomp_worker_export", "checkpoint=ckpt",
                   f"tokenizer={ROOT / 'common' / 'tiny_tokenizer'}", f"python.sft={python}", "launcher=slurm"))
    job = _job_id(out, r"submitted export: (\d+)")
    settle(cluster, PATIENCE, tmp_path)
    ended = {r["JobId"]: r["JobState"] for r in records(cluster)}
    ledger = next((tmp_path / "exports" / "_slurm").glob("study-*"))
    assert ended.get(job) == "FAILED", (ended, _log(sorted(ledger.glob("*.out"))))
    rec = json.loads((ledger / "export.FAILED").read_text())
    assert rec["job"] == job and "wrote no exports/browsecomp_worker/export_info.json" in rec["reason"], rec


def test_a_grpo_stage_runs_under_slurm(cluster, tmp_path):
    """The smallest GRPO launch (tiny base, one step) submitted to Slurm on a CPU-only job and finished there."""
    out = _ok(_cli(tmp_path, "launch.cli", "stage=grpo", "task=spa", "model=tiny_base", "steps=1", f"runs_root={tmp_path}",
                   "grpo.max_completion_length=32", "grpo.pilot_tasks=3", "logging.wandb=false", "launcher=slurm",
                   "gpus_per_node=0"))
    job = _job_id(out, r"Slurm job (\d+)")
    rd = tmp_path / "grpo_spa" / "seed0"
    settle(cluster, PATIENCE, rd)
    ended = {r["JobId"]: r["JobState"] for r in records(cluster)}
    assert ended.get(job) == "COMPLETED", (ended, _log(sorted(rd.rglob("*.out"))))
    assert (rd / "DONE").is_file() and (rd / "checkpoints" / "step-000001" / "SHA256SUMS").is_file()
    assert "-m rl.train" in (rd / "launch.sbatch").read_text()


def test_a_study_refused_by_its_preflight_submits_nothing(cluster, data_cache, tmp_path):
    """The smoke study with its report stage on vLLM: the launching interpreter (this test's, no vllm) is every
    job's, so the preflight refuses it (exit 2) before anything is submitted: the queue and Slurm's records
    stay as they were, and so does every file in the working directory. (The passing study: the smoke test
    above, whose preflight passes.)"""
    installed = subprocess.run([sys.executable, "-c", "import importlib.util as u; print(u.find_spec('vllm') is None)"],
                               capture_output=True, text=True)
    if installed.stdout.strip() != "True":
        pytest.skip("this interpreter has vllm: the preflight would pass")
    settle(cluster)
    before_records = records(cluster)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "keep.txt").write_text("earlier work\n")
    before, dirs = _files(tmp_path), sorted(p for p in tmp_path.rglob("*") if p.is_dir())
    proc = _cli(tmp_path, "launch.cli", "study=dual_terminator_sft", "runs_root=runs", "reports=rep", *_smoke(),
                "report:eval.backend=vllm", "launcher=slurm", "gpus_per_node=0", **data_cache)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "error: preflight: stage report (analyze)" in proc.stderr and "lacks vllm" in proc.stderr
    assert cluster.jobs() == [] and records(cluster) == before_records
    assert _files(tmp_path) == before and sorted(p for p in tmp_path.rglob("*") if p.is_dir()) == dirs
