"""`analyze launcher=slurm`: one array task per checkpoint still to evaluate (by evaluation identity), then
an aggregation job after the array. The dry run's scripts are checked line by line; a stand-in sbatch
records the submissions and the array tasks then run on this machine (as Slurm would run them, one
process per task), and the aggregate equals a sequential `analyze` of the same runs."""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from launch.analyze import main
from launch.analyze import parse_argv, run_analysis
from test_analysis import FakeEvaluator
from test_analysis_helpers import make_run
from launch_helpers import fake_cluster
from launch_helpers import requeued as requeued_jobs


@contextlib.contextmanager
def _usr1_must_be_handled():
    """SIGUSR1 in this process: a task that installs no handler of its own fails the test (instead of
    the default action, which kills pytest)."""
    def unhandled(signum, frame):
        raise AssertionError("SIGUSR1 (Slurm's time-limit warning) reached no handler of the evaluation task")

    old = signal.signal(signal.SIGUSR1, unhandled)
    try:
        yield
    finally:
        signal.signal(signal.SIGUSR1, old)


def _sbatch_lines(script: str) -> dict[str, str]:
    return dict(line[len("#SBATCH --"):].split("=", 1) for line in script.splitlines()
                if line.startswith("#SBATCH --") and "=" in line)


def _dry_dir(out: str) -> Path:
    """Where a dry run wrote its jobs' configs and scripts (it names it)."""
    return Path(re.search(r"config and script is written under (\S+) \(nothing started", out)[1])


def _scripts(out: str) -> tuple[str, str]:
    where = _dry_dir(out)
    return (where / "eval.sbatch").read_text(), (where / "aggregate.sbatch").read_text()


def test_dry_run_prints_an_array_of_the_pending_checkpoints_and_an_aggregation(tmp_path, capsys, monkeypatch):
    import launch.evaluation as ev_mod

    root, out = tmp_path / "runs", tmp_path / "rep"
    make_run(root, "r2e", 0, [10, 20, 30], evaluated={10: {"nq": 0.2}})   # step 10 is already evaluated
    make_run(root, "search", 1, [10])
    fake = FakeEvaluator()
    monkeypatch.setattr(ev_mod, "EvalsHarness", lambda evaluator=None: fake)
    argv = [f"runs_root={root}", f"out={out}", "benches=[nq]", "launcher=slurm", "slurm.gpus_per_task=1",
            "slurm.concurrency=2", "slurm.time=02:00:00", "slurm.qos=eval", "slurm.sbatch=[--constraint=a100]", "dry_run=true"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    eval_script, agg_script = _scripts(text)
    opts = _sbatch_lines(eval_script)
    # 3 checkpoints still to evaluate (r2e 20, 30; search 10), at most 2 at once, one GPU each, requeue-safe
    assert opts["array"] == "0-2%2" and opts["gpus-per-node"] == "1" and opts["nodes"] == "1"
    assert "#SBATCH --requeue" in eval_script and opts["time"] == "02:00:00" and opts["qos"] == "eval"
    assert "#SBATCH --constraint=a100" in eval_script
    assert "--exclusive" not in eval_script and "dependency" not in opts
    # The time-limit warning goes to the batch shell (the task's python, exec'd): it stops and requeues itself.
    assert opts["signal"] == "B:USR1@120"
    assert re.findall(r"^# task (\d): (\S+)", eval_script, flags=re.M) == [
        ("0", "r2e/seed0/step-000020"), ("1", "r2e/seed0/step-000030"), ("2", "search/seed1/step-000010")]
    # one job file per task: task i runs `python -m launch.eval_slurm CONFIG_i`, its checkpoint's evaluation
    assert re.search(r'^exec \S+ -m launch\.eval_slurm "\$\{CONFIGS\[\$SLURM_ARRAY_TASK_ID\]\}"$', eval_script, flags=re.M)
    where = _dry_dir(text)
    configs = re.findall(r"^  (\S+\.json)$", eval_script, flags=re.M)
    assert configs == [str(where / f"eval-{i}.json") for i in range(3)]
    assert [json.loads(Path(c).read_text())["planned"][0]["step"] for c in configs] == [20, 30, 10]
    agg = _sbatch_lines(agg_script)
    assert agg["dependency"] == "afterany:<job id of eval>" and "gpus-per-node" not in agg and "array" not in agg
    assert re.search(rf"^exec \S+ -m launch\.analyze {where}/analyze\.yaml$", agg_script, flags=re.M)
    assert OmegaConf.load(where / "analyze.yaml").eval_tasks == configs
    assert re.search(r"^eval +launch\.eval_slurm +- ", text, flags=re.M), "the plan table"
    assert not fake.calls and not out.exists(), "a dry run evaluates and writes nothing but its temporary dir"
    # A chained submission (launch sweep/study): the array waits for the training job.
    assert main(argv + ["slurm.after=afterok:4242"]) == 0
    assert _sbatch_lines(_scripts(capsys.readouterr().out)[0])["dependency"] == "afterok:4242"
    # One node per checkpoint: evaluate's data_parallel=8 engines take 8 GPUs per task unless told otherwise.
    node = [a for a in argv if not a.startswith("slurm.gpus_per_task")] + ["eval.data_parallel=8"]
    assert main(node) == 0
    assert _sbatch_lines(_scripts(capsys.readouterr().out)[0])["gpus-per-node"] == "8"
    # ... and the profile's engines when it sets them (the count read only eval.*: 1 GPU for 2 × 2 vllm engines)
    import evals.profiles

    monkeypatch.setattr(evals.profiles, "PROFILES_DIR", tmp_path / "profiles")
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "tp2.yaml").write_text("evaluate: {backend: vllm, tensor_parallel_size: 2, data_parallel: 2}\n")
    run_analysis(parse_argv(node[:-1] + ["profile=tp2"]))   # (not main: its preflight would want vllm here)
    assert _sbatch_lines(_scripts(capsys.readouterr().out)[0])["gpus-per-node"] == "4"
    # A bad setting is one line naming its key, before anything is planned (slurm.sbatch=5 was a traceback).
    for bad, line in (("slurm.concurrency=0", "slurm.concurrency=0"), ("slurm.sbatch=[--qos=x]", "use slurm.qos="),
                      ("slurm.sbatch=5", "error: slurm.sbatch must be a list of sbatch options"),
                      ("slurm.sbatch={}", "error: slurm.sbatch={}: expected a list, not a mapping"),
                      ("slurm.time=abc", "error: slurm.time='abc': expected null or a time sbatch --time takes")):
        assert main(argv[:-1] + [bad]) == 2
        assert line in capsys.readouterr().err
    assert main(argv + ["slurm.jobs_file=/nonexistent/jobs.json"]) == 2   # (a traceback once the jobs were submitted)
    assert "slurm.jobs_file=/nonexistent/jobs.json: no such directory /nonexistent" in capsys.readouterr().err
    # An empty setting is the cluster's default (it was written as `#SBATCH --partition=`).
    assert main(argv + ["slurm.partition=''"]) == 0
    assert "partition" not in _sbatch_lines(_scripts(capsys.readouterr().out)[0])
    # slurm.partition is launch's launcher.partition field (common.schema): its rule refuses a list
    assert main(argv + ["slurm.partition=[a,b]"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["error: slurm.partition=['a', 'b']: expected null or one word (not a list)"]
    # python.eval=PATH: every task and the aggregation exec it; asked first for vllm with backend=vllm.
    from launch_helpers import named_interpreter

    ev = named_interpreter(tmp_path / "eval-env" / "python")
    assert main(argv + [f"python.eval={ev}"]) == 0
    eval_script, agg_script = _scripts(capsys.readouterr().out)
    assert [re.findall(r"^exec (\S+) -m launch\.(?:eval_slurm|analyze)", s, flags=re.M) for s in (eval_script, agg_script)] \
        == [[str(ev)]] * 2
    assert main(argv + [f"python.eval={ev}", "eval.backend=vllm"]) == 2
    assert f"python.eval={ev} lacks vllm (backend=vllm)" in capsys.readouterr().err


def _fake_sbatch(tmp_path: Path) -> tuple[dict, Path]:
    """sbatch on PATH: records the script it is given and answers job ids 5001, 5002, ..."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "submitted.txt"
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\nfor last; do :; done\necho "$last" >> {record}\n'
                                    f'echo $((5000 + $(wc -l < {record})))\n')
    (bin_dir / "sbatch").chmod(0o755)
    return dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}"), record


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    from sft.tiny import save_tiny_model

    root = tmp_path_factory.mktemp("slurm_eval")
    runs = root / "runs"
    for step in (1, 2):
        save_tiny_model(runs / "r2e" / "seed0" / "checkpoints" / f"step-{step:06d}", seed=step)
    return root, runs


def _cfg(runs: Path, out: Path) -> dict:
    return {"runs_root": str(runs), "out": str(out), "benches": ["search_plan_ood"],
            "eval": {"bench_n": {"search_plan_ood": 2}, "ood_max_turns": 2, "max_model_len": 1024,
                     "max_new_tokens": 8, "dtype": "float32", "progress": False, "batch_size": 1}}


def _argv(cfg: dict) -> list[str]:
    eval_keys = [f"eval.{k}={v}" for k, v in cfg["eval"].items() if k != "bench_n"]
    return [f"runs_root={cfg['runs_root']}", f"out={cfg['out']}", "benches=[search_plan_ood]",
            "eval.bench_n={search_plan_ood:2}", *eval_keys]


@pytest.mark.slow
def test_local_stand_in_array_then_aggregate_equals_a_sequential_analyze(tiny_runs, tmp_path, monkeypatch, capsys):
    pytest.importorskip("envs.search_plan_act")
    root, runs = tiny_runs
    seq_runs, arr_runs = tmp_path / "seq", tmp_path / "arr"
    shutil.copytree(runs, seq_runs)
    shutil.copytree(runs, arr_runs)
    sequential = run_analysis(_cfg(seq_runs, tmp_path / "seq_rep"))
    assert not sequential.evaluated.failures and len(sequential.evaluated.jobs) == 2

    env, record = _fake_sbatch(tmp_path)
    monkeypatch.setenv("PATH", env["PATH"])
    cfg = _cfg(arr_runs, tmp_path / "arr_rep")
    assert main(_argv(cfg) + ["launcher=slurm"]) == 0
    said = capsys.readouterr().out
    assert "squeue -j 5001,5002" in said
    eval_sbatch, agg_sbatch = [Path(p) for p in record.read_text().split()]
    assert _sbatch_lines(eval_sbatch.read_text())["array"] == "0-1"
    assert _sbatch_lines(agg_sbatch.read_text())["dependency"] == "afterany:5001"
    assert not (tmp_path / "arr_rep" / "report.md").exists(), "the report is the aggregation job's"

    def task(i: int) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(eval_sbatch)], env=dict(env, SLURM_ARRAY_JOB_ID="5001", OMP_NUM_THREADS="1",
                              SLURM_ARRAY_TASK_ID=str(i), WANDB_MODE="disabled"),
                              capture_output=True, text=True, timeout=300)

    # Task 0's first segment gets Slurm's time-limit warning (SIGUSR1) after its first row: it stops, the row
    # stays, it requeues itself (fake scontrol) and writes no outcome; the requeued segment finishes the rest.
    import evals.store as evals_store   # the eval store appends every row (evals.store.EvalStore)
    from launch.eval_slurm import run_task

    cluster = fake_cluster(tmp_path, "exit 0\n")
    monkeypatch.setenv("PATH", f"{Path(cluster['PATH'].split(os.pathsep)[0])}{os.pathsep}{env['PATH']}")
    monkeypatch.setenv("FAKE_CLUSTER", str(tmp_path))
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "5001")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "0")
    real_append = evals_store.append_rows

    def append_then_warned(path, rows):
        real_append(path, rows)
        os.kill(os.getpid(), signal.SIGUSR1)

    monkeypatch.setattr(evals_store, "append_rows", append_then_warned)
    # As a local analyze (test_analyze_resolves_once), a task resolves its evaluate config once per plan (this segment
    # plans twice: when it starts, and what is left at the warning) and computes each checkpoint's identity once.
    import evals.config
    import evals.identity
    import evals.run

    calls = {"resolve": 0, "checkpoint_identity": 0}

    def counted(name, fn):
        return lambda *a, **kw: (calls.__setitem__(name, calls[name] + 1), fn(*a, **kw))[1]

    for name, home in (("resolve", evals.config), ("checkpoint_identity", evals.identity)):
        spy = counted(name, getattr(home, name))
        for module in (home, evals.run):
            monkeypatch.setattr(module, name, spy)
    with _usr1_must_be_handled():
        assert run_task(eval_sbatch.parent / "eval-0.json") == 0
    assert calls == {"resolve": 2, "checkpoint_identity": 1}
    monkeypatch.setattr(evals_store, "append_rows", real_append)
    assert requeued_jobs(tmp_path) == ["5001_0"]
    said = capsys.readouterr().out
    assert "requeueing 5001_0" in said, said
    step1 = arr_runs / "r2e" / "seed0" / "eval" / "step-000001"
    assert len((step1 / "search_plan_ood.jsonl").read_text().splitlines()) == 1
    assert not (eval_sbatch.parent / "outcome-0.json").exists()
    for i in (0, 1):
        proc = task(i)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = (arr_runs / "r2e" / "seed0" / "eval" / "step-000001" / "search_plan_ood.jsonl").read_bytes()
    from launch.eval_slurm import run_task

    assert run_task(eval_sbatch.parent / "eval-0.json") == 0   # requeued after it finished: nothing left by identity, exit 0
    assert "nothing to do" in capsys.readouterr().out
    assert (arr_runs / "r2e" / "seed0" / "eval" / "step-000001" / "search_plan_ood.jsonl").read_bytes() == rows
    proc = subprocess.run(["bash", str(agg_sbatch)], env=dict(env, SLURM_JOB_ID="5002", WANDB_MODE="disabled"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "evaluated 2 checkpoint(s), 0 failed" in proc.stdout
    got = pd.read_csv(tmp_path / "arr_rep" / "results.csv")
    want = pd.read_csv(tmp_path / "seq_rep" / "results.csv")
    assert len(want) > 0
    pd.testing.assert_frame_equal(got, want)
    for step in (1, 2):  # the very rows, not only the aggregate
        a, s = (r / "r2e" / "seed0" / "eval" / f"step-{step:06d}" / "search_plan_ood.jsonl" for r in (arr_runs, seq_runs))
        assert a.read_text() == s.read_text()


def test_a_task_that_never_ran_is_a_listed_gap(tmp_path, monkeypatch, capsys):
    import launch.evaluation as ev_mod

    root, out = tmp_path / "runs", tmp_path / "rep"
    make_run(root, "r2e", 0, [10, 20])
    fake = FakeEvaluator(fail_on="step-000020")
    monkeypatch.setattr(ev_mod, "EvalsHarness", lambda evaluator=None: fake)
    env, record = _fake_sbatch(tmp_path)
    monkeypatch.setenv("PATH", env["PATH"])
    assert main([f"runs_root={root}", f"out={out}", "benches=[nq]", "launcher=slurm"]) == 0
    plan = Path(record.read_text().split()[0]).parent
    from launch.eval_slurm import run_task

    def aggregate(plan: Path) -> int:   # what the aggregation job runs: python -m launch.analyze analyze.yaml
        return main([str(plan / "analyze.yaml")])

    assert run_task(plan / "eval-0.json", evaluator=fake) == 0
    assert run_task(plan / "eval-1.json", evaluator=fake) == 1   # the simulated out-of-memory: exit 1, outcome kept
    assert aggregate(plan) == 4                              # the report written, the job FAILED (issue 62)
    report = (out / "report.md").read_text()
    assert "r2e" in report and "CUDA out of memory (simulated)" in report
    (plan / "outcome-1.json").unlink()                        # killed before it wrote an outcome
    assert aggregate(plan) == 4
    assert "Slurm array task 1 wrote no outcome" in (out / "report.md").read_text()
    # A job's config that is not one: one line, exit 2 (the aggregation's, an evaluation job's).
    from evals.cli import main as evaluate_main
    from launch.eval_slurm import main as eval_job

    capsys.readouterr()
    assert main([str(plan / "nope.yaml")]) == 2 and "nope.yaml: no such file" in capsys.readouterr().err
    assert main([str(plan)]) == 2 and f"{plan}: a directory, not a config file" in capsys.readouterr().err   # was "no such file"
    for name, text, why in (("list.yaml", "[1, 2]", "not a mapping"), ("torn.yaml", "{torn", "not YAML"),
                            ("unknown.yaml", "nope: 1", "unknown key 'nope'"), ("eval.yaml", "eval: {max_turnz: 2}",
                                                                               "unknown evaluate key 'max_turnz'"),
                            ("shape.yaml", "eval: 5", "eval=5: expected its keys"),
                            ("section.yaml", "slurm: [1, 2]", "slurm=[1,2]: expected a mapping, not a list")):   # was omegaconf's words
        (plan / name).write_text(text)
        assert main([str(plan / name)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {plan / name}: ") and why in err and len(err.strip().splitlines()) == 1, err
        if why.startswith("not"):   # `evaluate CONFIG` reads its file the same way
            assert evaluate_main([str(plan / name)]) == 2 and why in capsys.readouterr().err
    (plan / "shape.yaml").write_text("ckpt: m\nbenches: {a: 1}")   # evaluate's: the key named (was omegaconf's words only)
    assert evaluate_main([str(plan / "shape.yaml")]) == 2 and "benches={'a': 1}: expected a non-empty list" in capsys.readouterr().err
    good = json.loads((plan / "eval-0.json").read_text())
    disc = {"run": None, "anchor": None, "runs_root": str(root), "profile": None, "benches": 5, "prompt": "x"}
    job = {**good["planned"][0], "benches": 5}
    for bad, key in (({"name": "x"}, "eval_opts"), ({**good, "planned": [5]}, "planned[0]: 5"), ({**good, "discover": {}}, "discover"),
                     ({**good, "outcome": None}, "outcome"), ({**good, "discover": disc}, "discover.benches: 5"),
                     ({**good, "planned": [job]}, "planned[0].benches: 5"),
                     ({**good, "discover": {**disc, "benches": ["nq", {"a": 1}]}}, "discover.benches[1]: {'a': 1}"),
                     ({**good, "planned": [{**job, "benches": [5]}]}, "planned[0].benches[0]: 5")):
        (plan / "bad.json").write_text(json.dumps(bad))
        assert eval_job([str(plan / "bad.json")]) == 2
        err = capsys.readouterr().err
        assert "bad.json: not an evaluation job's config" in err and key in err and len(err.strip().splitlines()) == 1, err
    # A corrupt outcome (what the aggregation reads): one line naming the file and the key (was a TypeError); one that
    # does not read as JSON is not "wrote no outcome (killed ...)" either (a report with that gap, exit 4, before).
    for text, why in ((json.dumps({"name": "x", "status": "failed", "jobs": [], "failures": [5]}), "failures[0]: 5, not an object"),
                      ("{torn", "unreadable JSON")):
        (plan / "outcome-0.json").write_text(text)
        assert aggregate(plan) == 2
        err = capsys.readouterr().err
        assert f"{plan / 'outcome-0.json'}: not an evaluation job's outcome (" in err and why in err, err
        assert len(err.strip().splitlines()) == 1, err
    # A study's jobs.json that does not read: the submitted ids printed, then one line saying they are queued (a traceback).
    (tmp_path / "jobs.json").write_text("{torn")
    assert main([f"runs_root={root}", f"out={out}", "benches=[nq]", "launcher=slurm", f"slurm.jobs_file={tmp_path / 'jobs.json'}"]) == 2
    said = capsys.readouterr()
    assert "squeue -j 5003,5004" in said.out and len(said.err.strip().splitlines()) == 1, said
    assert said.err.startswith(f"error: {tmp_path / 'jobs.json'}: unreadable JSON") and "5003,5004 are queued" in said.err, said.err


def test_a_warned_task_requeues_only_when_it_made_progress(tmp_path, monkeypatch, capsys):
    """The time-limit warning (SIGUSR1) mid-evaluation: with rows written this segment and benches still
    pending the task requeues itself; warned again with nothing written it is not requeued (a failed
    outcome saying why, exit 1); warned once its work is complete it just finishes."""

    import launch.evaluation as ev_mod
    from launch.eval_slurm import run_task

    root, out = tmp_path / "runs", tmp_path / "rep"
    make_run(root, "r2e", 0, [10])
    fake = FakeEvaluator()
    monkeypatch.setattr(ev_mod, "EvalsHarness", lambda evaluator=None: fake)
    env, record = _fake_sbatch(tmp_path)
    monkeypatch.setenv("PATH", fake_cluster(tmp_path, "exit 0\n")["PATH"].split(os.pathsep)[0] + os.pathsep + env["PATH"])
    monkeypatch.setenv("FAKE_CLUSTER", str(tmp_path))
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "6001")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "0")
    assert main([f"runs_root={root}", f"out={out}", "benches=[nq,hotpotqa]", "launcher=slurm"]) == 0
    plan = Path(record.read_text().split()[0]).parent
    eval_dir = root / "r2e" / "seed0" / "eval" / "step-000010"

    class Warned(FakeEvaluator):
        def __init__(self, write_rows: bool):
            super().__init__()
            self.write_rows = write_rows

        def evaluate(self, cfg):
            if self.write_rows:   # one row of the first bench, then the warning
                eval_dir.mkdir(parents=True, exist_ok=True)
                (eval_dir / f"{cfg['benches'][0]}.jsonl").write_text('{"id": 0}\n')
            os.kill(os.getpid(), signal.SIGUSR1)
            raise AssertionError("the warning did not stop the evaluation")

    with _usr1_must_be_handled():
        assert run_task(plan / "eval-0.json", evaluator=Warned(True)) == 0
        assert requeued_jobs(tmp_path) == ["6001_0"] and not (plan / "outcome-0.json").exists()
        assert run_task(plan / "eval-0.json", evaluator=Warned(False)) == 1           # a segment with no progress
    assert requeued_jobs(tmp_path) == ["6001_0"], "a segment that wrote nothing must not requeue again"
    outcome = json.loads((plan / "outcome-0.json").read_text())
    assert outcome["status"] == "failed" and "no progress" in outcome["failures"][0]["error"]
    assert "not requeued" in capsys.readouterr().err
    # Warned after the work completed (the harness holds every bench): done, exit 0, no requeue.
    class DoneThenWarned(FakeEvaluator):
        def evaluate(self, cfg):
            super().evaluate(cfg)
            os.kill(os.getpid(), signal.SIGUSR1)
            return {}

    with _usr1_must_be_handled():
        assert run_task(plan / "eval-0.json", evaluator=DoneThenWarned()) == 0
    assert requeued_jobs(tmp_path) == ["6001_0"]
    assert json.loads((plan / "outcome-0.json").read_text())["status"] == "evaluated"


# ------------------------------------------------------------------ one evaluation job per run (launch sweep)
def _dependency(script: str) -> str | None:
    return _sbatch_lines(script).get("dependency")


def _stand_in_slurm(record: Path, task_ok: dict[str, bool], run_job) -> dict[str, str]:
    """A stand-in for slurmctld over the scripts the fake sbatch recorded (job ids 5001, 5002, ... in order):
    `task_ok` says how each training array task ended ("<array>_<i>": True = exit 0). A job starts when its
    dependency is met: afterok on a task that failed can never be met, and with --kill-on-invalid-dep=yes the
    job is cancelled (without it: pending forever); afterany needs every listed job terminated. `run_job(path)`
    runs a started job (its exit code). Returns each job id's final state."""
    scripts = {str(5001 + i): Path(p) for i, p in enumerate(record.read_text().split())}
    state = {ref: ("COMPLETED" if ok else "FAILED") for ref, ok in task_ok.items()}
    for _ in range(len(scripts) + 1):
        for job, path in scripts.items():
            if job in state:
                continue
            text = path.read_text()
            dep = _dependency(text)
            kind, _, ids = (dep or "afterany:").partition(":")
            ids = [i for i in ids.split(":") if i]
            if kind == "afterok" and any(state.get(i) in ("FAILED", "CANCELLED") for i in ids):
                if "#SBATCH --kill-on-invalid-dep=yes" in text:
                    state[job] = "CANCELLED"
                continue
            if kind == "afterok" and not all(state.get(i) == "COMPLETED" for i in ids):
                continue
            if kind == "afterany" and not all(i in state for i in ids):
                continue
            assert kind in ("afterok", "afterany"), dep
            state[job] = "COMPLETED" if run_job(path) == 0 else "FAILED"
    return {job: state.get(job, "PENDING") for job in scripts}


def test_one_evaluation_job_per_run_a_failed_training_run_is_a_gap(tmp_path, monkeypatch, capsys):
    """slurm.runs (what `launch sweep eval_profile=` passes): each run's evaluation waits for its own
    training task (afterok:<array>_<i>), the aggregation for every evaluation (afterany). Training task 1
    fails: its evaluation is cancelled, run 0's is not held back, and the report lists run 1's checkpoint
    as a gap."""
    import launch.evaluation as ev_mod
    from launch.eval_slurm import run_task

    root, out = tmp_path / "runs", tmp_path / "rep"
    fake = FakeEvaluator()
    monkeypatch.setattr(ev_mod, "EvalsHarness", lambda evaluator=None: fake)
    env, record = _fake_sbatch(tmp_path)
    monkeypatch.setenv("PATH", env["PATH"])
    dirs = [root / "r2e" / "seed0", root / "r2e" / "seed1"]
    argv = [f"runs_root={root}", f"out={out}", "benches=[nq]", "launcher=slurm", "slurm.time=01:00:00",
            f"slurm.runs=[{dirs[0]},{dirs[1]}]", "slurm.runs_after=[afterok:4000_0,afterok:4000_1]"]
    assert main(argv + ["dry_run=true"]) == 0
    dry = capsys.readouterr().out
    assert not out.exists() and not fake.calls, "a dry run writes and evaluates nothing"
    where = _dry_dir(dry)
    assert sorted(p.name for p in where.glob("*.sbatch")) == ["aggregate.sbatch", "eval-run-0.sbatch", "eval-run-1.sbatch"]
    bodies = [(where / f"{n}.sbatch").read_text() for n in ("eval-run-0", "eval-run-1", "aggregate")]
    assert [_dependency(b) for b in bodies] == ["afterok:4000_0", "afterok:4000_1",
                                                "afterany:<job id of eval-run-0>:<job id of eval-run-1>"]
    # One dependency per run, or a one-line refusal before anything is written.
    assert main(argv[:-1] + ["slurm.runs_after=[afterok:4000_0]", "dry_run=true"]) == 2
    assert "one sbatch dependency (e.g. afterok:5001_0) or null per run of slurm.runs (2)" in capsys.readouterr().err
    # A run dir its job could never discover (not <runs_root>/<arm>/[<name>/]seed<N>): refused, not "nothing to do".
    assert main(argv[:-2] + [f"slurm.runs=[{tmp_path / 'r2e' / 'seed0'}]", "dry_run=true"]) == 2
    assert f"slurm.runs: {tmp_path / 'r2e' / 'seed0'} is not a run dir under runs_root=" in capsys.readouterr().err
    assert main(argv[:-2] + [f"slurm.runs=[{dirs[0]},{dirs[1]},{dirs[0]}]", "dry_run=true"]) == 2   # two jobs of one run: exit 0 before
    assert f"slurm.runs: {dirs[0]} is listed twice" in capsys.readouterr().err
    # Checkpoints appear while training runs: nothing is planned yet. Run 1 (resumed) holds step 10, evaluated
    # before under the identity asked for: recorded in the plan, a result even if its job never runs.
    make_run(root, "r2e", 1, [10], evaluated={10: {"nq": 0.3}}, horizon=20, save_steps=[10, 20])
    assert main(argv) == 0
    said = capsys.readouterr().out
    assert "squeue -j 5001,5002,5003" in said
    run0, run1, agg = (Path(p) for p in record.read_text().split())
    for i, script in enumerate((run0, run1)):
        opts = _sbatch_lines(script.read_text())
        assert opts["dependency"] == f"afterok:4000_{i}" and opts["kill-on-invalid-dep"] == "yes"
        assert opts["signal"] == "B:USR1@120" and opts["gpus-per-node"] == "1" and opts["time"] == "01:00:00"
        assert "array" not in opts and "#SBATCH --requeue" in script.read_text()
    assert _dependency(agg.read_text()) == "afterany:5001:5002"
    # Training: run 0 writes two checkpoints and succeeds; run 1 writes one more, then fails.
    make_run(root, "r2e", 0, [10, 20])
    (dirs[1] / "checkpoints" / "step-000020").mkdir()
    (dirs[1] / "checkpoints" / "step-000020" / "config.json").write_text("{}")
    plan = run0.parent

    def run_job(path: Path) -> int:   # each job runs `python -m MODULE CONFIG`, its config in the plan dir
        command = path.read_text().strip().splitlines()[-1].split()
        assert command[:3] == ["exec", command[1], "-m"] and Path(command[4]).parent == plan, command
        if command[3] == "launch.eval_slurm":
            return run_task(Path(command[4]), evaluator=fake)
        assert command[3] == "launch.analyze", command
        return main([command[4]])

    states = _stand_in_slurm(record, {"4000_0": True, "4000_1": False}, run_job)
    # the aggregation writes the report with run 1 as a gap and fails (exit 4): the study did not complete
    assert states == {"5001": "COMPLETED", "5002": "CANCELLED", "5003": "FAILED"}
    assert sorted(Path(c["ckpt"]).name for c in fake.calls) == ["step-000010", "step-000020"]
    assert all("seed0" in c["ckpt"] for c in fake.calls), "run 1's evaluation never ran"
    report = (out / "report.md").read_text()
    table = pd.read_csv(out / "results.csv")
    # run 1's step 10, held since before submission under the same identity, is a result (it was a gap)
    assert sorted(set(zip(table.seed, table.step))) == [(0, 10), (0, 20), (1, 10)]
    gap = [line for line in report.splitlines() if line.startswith("- r2e/seed1/step-000020 × nq: ")]
    assert len(gap) == 1 and "evaluation failed" in gap[0] and "run 1's evaluation job wrote no outcome" in gap[0], report
    assert not [line for line in report.splitlines() if line.startswith(("- r2e/seed0/", "- r2e/seed1/step-000010"))], report
    # ... unless it has changed since (meta.json's identity for it is not the one recorded): a gap, not shown as current
    (dirs[1] / "eval" / "step-000010" / "meta.json").write_text(json.dumps({"identities": {"nq": {"fingerprint": "x"}}}))
    assert main([str(plan / "analyze.yaml")]) == 4
    table = pd.read_csv(out / "results.csv")
    assert sorted(set(zip(table.seed, table.step))) == [(0, 10), (0, 20)]
    assert "- r2e/seed1/step-000010 × nq: evaluation failed: run 1's evaluation job wrote no outcome" in (out / "report.md").read_text()
    # a job's config written before `held` was recorded (queued across an upgrade): read, nothing held (was: exit 2)
    task = json.loads((plan / "eval-run-1.json").read_text())
    del task["held"]
    (plan / "eval-run-1.json").write_text(json.dumps(task))
    assert main([str(plan / "analyze.yaml")]) == 4
    # The same run job again (requeued, or resubmitted): nothing left by identity, nothing evaluated.
    calls = len(fake.calls)
    assert run_task(plan / "eval-run-0.json", evaluator=fake) == 0 and len(fake.calls) == calls
