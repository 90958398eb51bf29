"""launch dry runs: the torchrun command and the sbatch scripts (1 node, 4 nodes, sweep array),
compared with committed snapshots under tests/snapshots/ after normalizing machine paths.

Regenerate after an intended change: UPDATE_SNAPSHOTS=1 pytest tests/test_launch_slurm.py
"""
from __future__ import annotations

import os
import re
import stat
import sys
from pathlib import Path

import pytest

from launch.cli import main
from launch_helpers import fake_cluster
from launch_helpers import requeued as requeued_jobs
from launch.jobs import REPO

SNAPSHOTS = Path(__file__).parent / "snapshots"


def _dry(capsys, tmp_path, *argv) -> str:
    assert main([*argv, "dry_run=true", f"runs_root={tmp_path}"]) == 0
    out = capsys.readouterr().out
    return out.replace(str(tmp_path.resolve()), "<RUNS>").replace(sys.executable, "<PYTHON>").replace(str(REPO), "<REPO>")


def _evaluation_scripts(out: str, tmp_path: Path) -> list[str]:
    """The scripts of the evaluation jobs and the aggregation a sweep's dry run wrote (in the directory it
    names), with the paths shown as `_dry` shows them."""
    where = Path(re.findall(r"config and script is written under (\S+) \(nothing started", out)[-1])   # the analysis's
    return [(where / f"{name}.sbatch").read_text().replace(str(tmp_path.resolve()), "<RUNS>")
            .replace(sys.executable, "<PYTHON>").replace(str(REPO), "<REPO>")
            for name in [*sorted(p.stem for p in where.glob("eval-run-*.sbatch")), "aggregate"]]


def _script(out: str) -> str:
    return out[out.index("#!/bin/bash"):]


def _check(name: str, text: str) -> None:
    path = SNAPSHOTS / name
    if os.environ.get("UPDATE_SNAPSHOTS"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.is_file(), f"missing snapshot {path} (run with UPDATE_SNAPSHOTS=1)"
    assert text == path.read_text(), f"{name} differs from its snapshot"


def test_local_torchrun_command(capsys, tmp_path):
    out = _dry(capsys, tmp_path, "arm=r2e", "model=tiny", "data=synthetic", "nproc=2", "steps=218")
    command = out.split("# command\n", 1)[1].strip()
    _check("launch_torchrun_local.txt", command + "\n")
    assert not (tmp_path / "r2e").exists(), "dry_run must not create the run directory"


def test_sbatch_one_node(capsys, tmp_path):
    out = _dry(capsys, tmp_path, "arm=r2e", "launcher=slurm", "data=synthetic", "nodes=1")
    _check("launch_sbatch_1node.sbatch", _script(out))


def test_a_cpu_only_partition_gets_a_job_without_gpus(capsys, tmp_path):
    """gpus_per_node=0: a CPU job (no --gpus-per-node line, one trainer process per node); below 0 is refused."""
    script = _script(_dry(capsys, tmp_path, "arm=r2e", "launcher=slurm", "data=synthetic", "model=tiny", "gpus_per_node=0"))
    assert "--gpus-per-node" not in script and "--nproc_per_node=1 " in script, script
    assert main(["arm=r2e", "launcher=slurm", "data=synthetic", "model=tiny", "gpus_per_node=-1", "dry_run=true",
                 f"runs_root={tmp_path}"]) == 2
    assert "launcher.gpus_per_node must be an integer >= 0" in capsys.readouterr().err


def test_sbatch_four_nodes(capsys, tmp_path):
    out = _dry(capsys, tmp_path, "arm=mixed", "seed=1", "launcher=slurm", "data=synthetic", "nodes=4",
               "gpus_per_node=8", "partition=gpu", "time=24:00:00", "account=proj42")
    script = _script(out)
    _check("launch_sbatch_4nodes.sbatch", script)
    # The pieces a multi-node run depends on, spelled out (the snapshot pins the rest).
    for needle in ("#SBATCH --nodes=4", "#SBATCH --signal=USR1@120", "#SBATCH --requeue", "#SBATCH --time=24:00:00",
                   "--rdzv_backend=c10d", '--rdzv_endpoint="$1"', '"$HEAD_NODE:$RDZV_PORT"', "--nnodes=4 --nproc_per_node=8",
                   'scontrol requeue "$JOB_REF"', 'trap "" USR1'):
        assert needle in script


def test_sbatch_extra_options_and_setup(capsys, tmp_path):
    """launcher.sbatch adds #SBATCH lines to the header (qos= has its own key); launcher.setup runs before srun."""
    setup = "module load cuda/12.4; source /opt/envs/dtsft/bin/activate"
    out = _dry(capsys, tmp_path, "arm=r2e", "launcher=slurm", "data=synthetic", "nodes=2",
               "qos=high", "launcher.sbatch=[--constraint=h100,--mem=0,--gres=gpu:8]", f"launcher.setup={setup}")
    script = _script(out)
    _check("launch_sbatch_extras.sbatch", script)
    lines = script.splitlines()
    header_end = next(i for i, line in enumerate(lines) if not line.startswith("#"))
    for opt in ("--qos=high", "--constraint=h100", "--mem=0", "--gres=gpu:8"):
        assert lines.index(f"#SBATCH {opt}") < header_end
    assert lines.index(setup) < next(i for i, line in enumerate(lines) if line.startswith("srun "))


@pytest.mark.parametrize("arg,needle", [("launcher.sbatch=[--time=1:00:00]", "use launcher.time="),
                                        ("launcher.sbatch=[qos=high]", "not one sbatch option"),
                                        ("launcher.sbatch=--qos=high", "must be a list"),
                                        ("time={}", "launcher.time must be null or a time sbatch --time takes"),
                                        ("time=x", "launcher.time must be null or a time sbatch --time takes"),
                                        ("time=1-2-3", "(0: no limit), got '1-2-3'")])
def test_sbatch_extra_options_refused(capsys, tmp_path, arg, needle):
    """Seen failing before the rule: time={} was written as `#SBATCH --time={}`; time=x and time=1-2-3 (which
    sbatch refuses) were planned, the dry run's exit 0."""
    assert main(["arm=r2e", "launcher=slurm", "data=synthetic", arg, "dry_run=true", f"runs_root={tmp_path}"]) == 2
    assert needle in capsys.readouterr().err


def test_sweep_array_dry_run(capsys, tmp_path):
    out = _dry(capsys, tmp_path, "sweep", "arms=[r2e,search,mixed]", "seeds=[0,1,2]", "launcher=slurm",
               "data=synthetic", "nodes=1")
    script = _script(out)
    assert "#SBATCH --array=0-8" in script
    runs = [line.strip() for line in script.splitlines() if line.startswith("  <RUNS>/")]
    assert runs == [f"<RUNS>/{a}/seed{s}" for a in ("r2e", "search", "mixed") for s in (0, 1, 2)]
    _check("launch_sweep_array.sbatch", re.sub(r"sweep-\d{8}T\d{6}Z", "sweep-<TIME>", script))


def _fake_sbatch(tmp_path: Path, monkeypatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "submitted.txt"
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(f"#!/bin/sh\necho \"$@\" >> {record}\necho 4242\n")
    sbatch.chmod(sbatch.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return record


def test_slurm_submission_writes_script_config_and_manifest(tmp_path, monkeypatch, capsys):
    """Real submission path with a stand-in `sbatch` and a stand-in data builder."""
    import json

    from common.cli import ConfigError

    from launch.run import SFT, launch_one

    record = _fake_sbatch(tmp_path, monkeypatch)
    _stand_in_data_prep(monkeypatch)
    runs = tmp_path / "runs"
    argv = ["arm=search", "launcher=slurm", "nodes=4", "data=synthetic", f"runs_root={runs}"]
    rc = launch_one(SFT, argv)
    assert rc == 0
    rd = runs / "search" / "seed0"
    script = (rd / "launch.sbatch").read_text()
    assert f"RUN_DIR={rd}" in script and "--nnodes=4" in script
    assert record.read_text().split() == ["--parsable", str(rd / "launch.sbatch")]
    man = json.loads((rd / "manifest.json").read_text())
    assert man["launcher"]["job_id"] == "4242" and man["data"]["fingerprint"] == "fp-search"
    assert "Slurm job 4242" in capsys.readouterr().out
    # Still queued (squeue knows job 4242): a second submission is refused, nothing is rewritten.
    squeue = record.parent / "bin" / "squeue"
    squeue.write_text('#!/bin/sh\n[ "$5" = 4242 ] && echo PENDING\nexit 0\n')
    squeue.chmod(0o755)
    with pytest.raises(ConfigError, match="already PENDING as Slurm job 4242"):
        launch_one(SFT, argv)
    (rd / "DONE").write_text("")
    assert launch_one(SFT, argv) == 0
    assert len(record.read_text().splitlines()) == 1, "a finished run must not be submitted again"



def test_a_trainer_starting_before_sbatch_returns_finds_its_launch_recorded(tmp_path, monkeypatch):
    """A run dir's first submission: the job can start (and its trainer record the commit it loads its Hub-id base
    at, common.layout.record_base) before sbatch returns. The trainer does so here while sbatch runs, the interleaving
    forced, not raced. Seen: manifest.json was written only after sbatch returned, so the trainer found none, recorded
    nothing, and the manifest launch then wrote had no `base`. Now the launch is recorded before the submission, its
    job id added after; a failed submission says so in its entry."""
    import json

    from common import layout
    from common.cli import ConfigError
    from launch import slurm
    from launch.run import SFT, launch_one

    _fake_sbatch(tmp_path, monkeypatch)
    _stand_in_data_prep(monkeypatch)
    runs, base = tmp_path / "runs", {"model.path": {"repo": "org/model", "revision": "b" * 40}}
    rd = runs / "search" / "seed0"
    real_start = slurm.SlurmRunner.start

    def start(self, job, script, ids):
        layout.record_base(rd, base)   # the trainer, started before sbatch returned
        return real_start(self, job, script, ids)

    monkeypatch.setattr(slurm.SlurmRunner, "start", start)
    assert launch_one(SFT, ["arm=search", "launcher=slurm", "data=synthetic", f"runs_root={runs}"]) == 0
    man = json.loads((rd / "manifest.json").read_text())
    assert man.get("base") == base, f"the trainer's base record was lost: {sorted(man)}"
    assert man["launcher"]["job_id"] == "4242" and [e["launcher"]["job_id"] for e in man["launches"]] == ["4242"]
    # sbatch refusing the resubmission: its entry is kept, without a job id, and names why (the launch fails)
    (tmp_path / "bin" / "sbatch").write_text("#!/bin/sh\necho 'sbatch: error: invalid partition' >&2\nexit 1\n")
    with pytest.raises(ConfigError, match="invalid partition"):
        launch_one(SFT, ["arm=search", "launcher=slurm", "data=synthetic", f"runs_root={runs}"])
    failed = json.loads((rd / "manifest.json").read_text())["launches"][-1]["launcher"]
    assert "job_id" not in failed and "invalid partition" in failed["submit_error"]
    assert json.loads((rd / "manifest.json").read_text()).get("base") == base
    # interrupted while sbatch runs (Ctrl-C): the job may be queued, and its entry says so (seen: neither a job id
    # nor an error, an entry that reads as a launch still being submitted)
    def interrupted(self, job, script, ids):
        raise KeyboardInterrupt

    monkeypatch.setattr(slurm.SlurmRunner, "start", interrupted)
    with pytest.raises(KeyboardInterrupt):
        launch_one(SFT, ["arm=search", "launcher=slurm", "data=synthetic", f"runs_root={runs}"])
    cut = json.loads((rd / "manifest.json").read_text())["launches"][-1]["launcher"]
    assert "job_id" not in cut and "may be queued" in cut.get("submit_error", ""), cut


def test_the_packages_recorded_are_the_trainers_interpreters(tmp_path, monkeypatch):
    """python.sft= names the environment that trains: manifest.json's `packages` (a card's torch / transformers, and
    TRL where DONE has none) are that interpreter's, not launch's own (seen: launch's torch recorded for a run trained
    in another environment)."""
    import json

    from launch.run import SFT, launch_one

    _fake_sbatch(tmp_path, monkeypatch)
    _stand_in_data_prep(monkeypatch)
    other = tmp_path / "other-env"
    (other / "site" / "torch-9.9.9.dist-info").mkdir(parents=True)   # its torch: first on its path
    (other / "site" / "torch-9.9.9.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 9.9.9\n")
    (other / "site" / "trl-1.9.2.dist-info").mkdir()   # and its TRL (a GRPO environment's pin): recorded too
    (other / "site" / "trl-1.9.2.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: trl\nVersion: 1.9.2\n")
    python = other / "bin" / "python"
    python.parent.mkdir()
    python.write_text(f'#!/bin/sh\nPYTHONPATH={other / "site"} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    runs = tmp_path / "runs"
    assert launch_one(SFT, ["arm=search", "launcher=slurm", "data=synthetic", f"runs_root={runs}", f"python.sft={python}"]) == 0
    man = json.loads((runs / "search" / "seed0" / "manifest.json").read_text())
    assert man["packages"]["torch"] == "9.9.9" and man["packages"]["interpreter"] == str(python)
    assert man["packages"]["trl"] == "1.9.2"   # (seen failing: TRL was not among the packages recorded)
    assert man["launches"][-1]["packages"] == man["packages"]


def test_sbatch_missing_is_a_clear_error(tmp_path, monkeypatch):
    from common.cli import ConfigError
    from launch.run import SFT, launch_one

    monkeypatch.setenv("PATH", str(tmp_path))
    _stand_in_data_prep(monkeypatch)
    with pytest.raises(ConfigError, match="sbatch not found on PATH"):
        launch_one(SFT, ["launcher=slurm", "data=synthetic", f"runs_root={tmp_path}"])


def _stand_in_data_prep(monkeypatch):
    """data_prep.build's `build_arm` (a manifest only) and `cache_key` ("k<seed>"), as launch.cache calls them."""
    import json

    def build(data_cfg, *, arm, seed, tokenizer, out, final):
        (Path(out) / "manifest.json").write_text(json.dumps({"fingerprint": f"fp-{arm}"}))
        return {"fingerprint": f"fp-{arm}"}

    monkeypatch.setattr("data_prep.build.build_arm", build)
    monkeypatch.setattr("data_prep.build.cache_key", lambda cfg, **kw: "k" + str(kw["seed"]))


# ------------------------------------------------------------------ the sbatch script's control flow
def _script_for(run_dirs: list[Path], array: bool = False) -> str:
    from launch import slurm

    from launch.jobs import Job, Resources

    configs = [str(d / "config.yaml") for d in run_dirs]   # one template: a run or an array over runs
    job = Job("t", "sft.train", **({"array": tuple(configs)} if array else {"config": configs[0]}), torchrun=1,
              resources=Resources(gpus_per_node=1), logs="/dev")
    return slurm.SlurmRunner("launch").script(job, {}, run_dirs[0])


REFUSE = ('mkdir -p "$RUN_LOGS"; printf \'{{"code": 2, "error": "train.lr=-1: expected\\\\na number > 0", '
          '"launch": "%s"}}\' "{launch}" > "$RUN_LOGS/trainer-exit.json"; exit 1\n')


@pytest.mark.parametrize("srun_body, done_before, rc, requeued", [
    ("exit 0\n", False, 0, ["77"]),                       # stopped early (USR1 / preemption): requeue
    ('touch "$RUN_MARK"; exit 0\n', False, 0, []),        # finished in this segment: no requeue
    ("exit 3\n", False, 3, []),                           # crashed: fail, no requeue loop
    ("echo should-not-run; exit 9\n", True, 0, []),       # already finished: srun never runs
    # a trainer that refused (as torchrun reports it: exit 1): the segment exits with the trainer's code
    (REFUSE.format(launch="$DTSFT_LAUNCH_ID"), False, 2, []),
    (REFUSE.format(launch="slurm-76-0"), False, 1, []),   # another segment's refusal: not this one's code
])
def test_sbatch_script_requeues_only_an_unfinished_clean_stop(tmp_path, srun_body, done_before, rc, requeued):
    import subprocess

    rd = tmp_path / "run"
    rd.mkdir()
    if done_before:
        (rd / "DONE").write_text("")
    script = tmp_path / "launch.sbatch"
    script.write_text(_script_for([rd]))
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    env = dict(fake_cluster(tmp_path, srun_body), RUN_MARK=str(rd / "DONE"), RUN_LOGS=str(rd / "logs"))
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == rc, proc.stdout + proc.stderr
    assert requeued_jobs(tmp_path) == requeued
    assert "should-not-run" not in proc.stdout
    refused = "error: train.lr=-1: expected a number > 0" in proc.stderr
    assert refused == (rc == 2), proc.stderr
    if rc == 2:
        assert "slurm-77-0" in (rd / "logs" / "trainer-exit.json").read_text()   # this segment's id


def test_sweep_array_task_picks_its_run_and_requeues_itself(tmp_path):
    import subprocess

    dirs = [tmp_path / f"run{i}" for i in range(3)]
    for d in dirs:
        d.mkdir()
    script = tmp_path / "sweep.sbatch"
    script.write_text(_script_for(dirs, array=True))
    env = dict(fake_cluster(tmp_path, 'for last; do :; done; echo "trained $last"; exit 0\n'), SLURM_ARRAY_JOB_ID="5", SLURM_ARRAY_TASK_ID="1")
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert f"trained {dirs[1]}/config.yaml" in proc.stdout
    assert requeued_jobs(tmp_path) == ["5_1"]


# ------------------------------------------------------------------ sweep eval_profile=: the evaluation after the training
def _sbatch_opts(script: str) -> dict[str, str]:
    return dict(line[len("#SBATCH --"):].split("=", 1) for line in script.splitlines()
                if line.startswith("#SBATCH --") and "=" in line)


def _counting_sbatch(tmp_path: Path, monkeypatch) -> Path:
    """sbatch on PATH recording each script it is given, answering job ids 5001, 5002, ..."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    record = tmp_path / "submitted.txt"
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\nfor last; do :; done\necho "$last" >> {record}\n'
                                    f'echo $((5000 + $(wc -l < {record})))\n')
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return record


def test_sweep_eval_profile_chains_each_runs_evaluation_to_its_training_task(capfd, tmp_path, monkeypatch, prefilled):
    """Each training array task i gets its own evaluation job (afterok:<array>_<i>, cancelled if that task
    fails), then one aggregation after all of them (afterany): one failed training run no longer holds back
    the others' evaluation. `analyze.KEY=VALUE` goes to the analysis."""
    argv = ["sweep", "arms=[r2e]", "seeds=[0,1]", "launcher=slurm", "data=synthetic", "eval_profile=rl_ood",
            "analyze.slurm.time=02:00:00"]
    out = _dry(capfd, tmp_path, *argv)
    heads = re.findall(r"^# (\S+) \(not written: dry_run=true\)", out, flags=re.M)
    assert [Path(h).name for h in heads] == ["sweep.sbatch"]
    train = re.split(r"^# \S+ \(not written: dry_run=true\).*$", out, flags=re.M)[1]
    run0, run1, agg = _evaluation_scripts(out, tmp_path)
    assert "#SBATCH --array=0-1" in train and "dependency" not in _sbatch_opts(train)
    for i, script in enumerate((run0, run1)):
        opts = _sbatch_opts(script)
        assert opts["dependency"] == f"afterok:<job id of sweep>_{i}" and opts["kill-on-invalid-dep"] == "yes"
        assert opts["time"] == "02:00:00" and opts["gpus-per-node"] == "1" and opts["signal"] == "B:USR1@120"
        assert f"run {i} (<RUNS>/r2e/seed{i})" in script
        assert re.search(rf"^exec \S+ -m launch\.eval_slurm \S+/eval-run-{i}\.json$", script, flags=re.M)
    assert _sbatch_opts(agg)["dependency"] == "afterany:<job id of eval-run-0>:<job id of eval-run-1>"
    assert not (tmp_path / "_reports").exists()
    assert main(["sweep", "arms=[r2e]", "launcher=slurm", "data=synthetic", "eval_profile=nope", "dry_run=true",
                 f"runs_root={tmp_path}"]) == 2
    assert "no recipes/eval/nope.yaml" in capfd.readouterr().err
    # Submitted (stand-in sbatch: 5001, 5002, ...): the array, then one job per run, then the aggregation.
    from launch.sweep import run_sweep

    record = _counting_sbatch(tmp_path, monkeypatch)
    runs = tmp_path / "runs"
    _stand_in_data_prep(monkeypatch)
    # A bad analysis setting is refused before anything is submitted, as typed (was slurm.); a compared arm neither
    # trained here nor under runs_root too (seen failing: refused by the aggregation, after all the training).
    for bad, line in (("analyze.slurm.concurrency=0", "error: analyze.slurm.concurrency=0"),
                      ("analyze.compare=[[r2e,bogus]]", "error: analyze.compare: no run of arm 'bogus' under")):
        assert run_sweep([*argv[1:], bad, f"runs_root={runs}"]) == 2
        assert line in capfd.readouterr().err and not record.exists()
    (runs / "search" / "seed0").mkdir(parents=True)   # (an arm already there may be compared with the trained one)
    import evals.config   # the evaluate config resolved once for the whole sweep (issue #60), counted by a spy

    resolved = []
    real_resolve = evals.config.resolve
    monkeypatch.setattr(evals.config, "resolve", lambda *a, **k: (resolved.append(1), real_resolve(*a, **k))[1])
    assert run_sweep([*argv[1:], "analyze.compare=[[r2e,search]]", f"runs_root={runs}"]) == 0
    assert len(resolved) == 1
    said = capfd.readouterr().out
    sweep, e0, e1, aggregate = (Path(line) for line in record.read_text().split())
    assert sweep.name == "sweep.sbatch" and "Slurm job array 5001" in said
    assert [_sbatch_opts(p.read_text())["dependency"] for p in (e0, e1, aggregate)] == [
        "afterok:5001_0", "afterok:5001_1", "afterany:5002:5003"]
    assert f"run 1 ({runs.resolve()}/r2e/seed1)" in e1.read_text()
    assert "squeue -j 5001,5002,5003,5004" in said


def test_analyze_keys_reach_the_sweeps_analysis_and_need_a_profile():
    from launch.errors import LaunchError
    from launch.sweep import analysis_config, parse_sweep

    runs, profile, analyze = parse_sweep(["arms=[r2e]", "eval_profile=rl_ood", "analyze.eval.corpus=/d/w.jsonl",
                                          "analyze.slurm.time=04:00:00", "steps=2"])
    assert (runs, profile, analyze) == ([["arm=r2e", "seed=0", "steps=2"]], "rl_ood",
                                        ["eval.corpus=/d/w.jsonl", "slurm.time=04:00:00"])
    from omegaconf import OmegaConf

    first = OmegaConf.create({"runs_root": "runs", "python": {}, "launcher": {"kind": "local"}})
    cfg = analysis_config(first, profile, analyze)   # locally too: the analysis after the last run, resolved once
    assert (cfg.eval.corpus, cfg.slurm.time, cfg.out, cfg.profile) == ("/d/w.jsonl", "04:00:00",
                                                                       str(Path("runs") / "_reports" / "rl_ood"), "rl_ood")
    with pytest.raises(LaunchError, match="give eval_profile=PROFILE"):
        parse_sweep(["arms=[r2e]", "analyze.eval.n=5"])


CLUSTER = ("account=A", "partition=P", "qos=Q", "time=01:00:00", "launcher.sbatch=[--constraint=h100]")
CLUSTER_LINES = ("#SBATCH --account=A", "#SBATCH --partition=P", "#SBATCH --qos=Q", "#SBATCH --constraint=h100")


def _scripts(out: str) -> list[str]:
    """The header (its #SBATCH lines) of every sbatch script a dry run prints."""
    return re.findall(r"^#!/bin/bash\n((?:#.*\n)+)", out, flags=re.M)


def test_one_set_of_cluster_settings_reaches_every_job_of_a_sweep(capfd, tmp_path, prefilled):
    """Issue 38: partition, account, qos, time and the extra #SBATCH lines reach the training array, each
    run's evaluation job and the aggregation; `analyze.slurm.time=` overrides the time of the evaluation's."""
    out = _dry(capfd, tmp_path, "sweep", "arms=[r2e]", "seeds=[0,1]", "launcher=slurm", "data=synthetic",
               "eval_profile=rl_ood", *CLUSTER)
    scripts = _scripts(out) + _scripts("".join(_evaluation_scripts(out, tmp_path)))
    assert len(scripts) == 4   # the training array, two runs' evaluation jobs, the aggregation
    for script in scripts:
        assert all(line in script.splitlines() for line in (*CLUSTER_LINES, "#SBATCH --time=01:00:00")), script
    out = _dry(capfd, tmp_path, "sweep", "arms=[r2e]", "launcher=slurm", "data=synthetic", "eval_profile=rl_ood",
               *CLUSTER, "analyze.slurm.time=04:00:00", "analyze.slurm.qos=low")
    train, *evaluation = _scripts(out) + _scripts("".join(_evaluation_scripts(out, tmp_path)))
    assert _sbatch_opts(train)["time"] == "01:00:00" and _sbatch_opts(train)["qos"] == "Q"
    assert [(_sbatch_opts(s)["time"], _sbatch_opts(s)["qos"], _sbatch_opts(s)["account"]) for s in evaluation] == \
        [("04:00:00", "low", "A")] * 2


def test_qos_has_its_own_key_not_an_sbatch_line(capfd, tmp_path):
    assert main(["arm=r2e", "launcher=slurm", "data=synthetic", "launcher.sbatch=[--qos=high]", "dry_run=true",
                 f"runs_root={tmp_path}"]) == 2
    assert "'--qos=high' is set by launch itself; use launcher.qos=" in capfd.readouterr().err


def test_each_job_of_a_sweep_runs_the_interpreter_named_for_its_kind(capfd, tmp_path, monkeypatch, prefilled):
    """Issue 38: python.sft= runs the training array, python.eval= each run's evaluation job and the aggregation
    (and the analysis that submits them); both are recorded in the runs' manifests."""
    import json

    from launch.sweep import run_sweep
    from launch_helpers import named_interpreter

    sft, ev = named_interpreter(tmp_path / "train-env" / "python"), named_interpreter(tmp_path / "eval-env" / "python")
    argv = ["arms=[r2e]", "seeds=[0,1]", "launcher=slurm", "data=synthetic", "eval_profile=rl_ood",
            f"python.sft={sft}", f"python.eval={ev}"]
    out = _dry(capfd, tmp_path, "sweep", *argv)
    train = re.split(r"^# \S+ \(not written: dry_run=true\).*$", out, flags=re.M)[1]
    run0, run1, agg = _evaluation_scripts(out, tmp_path)
    shown = {p: str(p).replace(str(tmp_path.resolve()), "<RUNS>") for p in (sft, ev)}   # as _dry prints paths
    assert f"  {shown[sft]} \"$HEAD_NODE:$RDZV_PORT\" \"$RUN_DIR/config.yaml\"" in train
    for script in (run0, run1, agg):
        assert re.search(rf"^exec {re.escape(shown[ev])} -m launch\.(eval_slurm|analyze) ", script, flags=re.M)
    record = _counting_sbatch(tmp_path, monkeypatch)
    runs = tmp_path / "runs"
    _stand_in_data_prep(monkeypatch)
    assert run_sweep([*argv, f"runs_root={runs}"]) == 0
    assert len(record.read_text().split()) == 4
    launch = json.loads((runs / "r2e" / "seed1" / "manifest.json").read_text())["launches"][-1]
    assert launch["interpreters"] == {"sft": str(sft), "grpo": sys.executable, "eval": str(ev)}
    plan = next((runs / "_sweeps").glob("sweep-*"))   # the one plan's scripts: the array's, then the evaluation's
    evaluation = [p for p in plan.glob("*.sbatch") if p.name != "sweep.sbatch"]
    assert len(evaluation) == 3 and all(re.search(rf"^exec {re.escape(str(ev))} -m ", p.read_text(), flags=re.M)
                                        for p in evaluation)


def test_a_named_interpreter_without_what_its_jobs_need_is_refused_before_anything(capfd, tmp_path, monkeypatch, prefilled):
    """python.eval= without vllm for backend=vllm, python.sft= without flash-attn when asked for: one line,
    exit 2, nothing submitted."""
    from launch_helpers import named_interpreter

    record = _counting_sbatch(tmp_path, monkeypatch)
    here = named_interpreter(tmp_path / "env" / "python")   # this environment: no vllm, no flash-attn here
    base = ["sweep", "arms=[r2e]", "launcher=slurm", "data=synthetic", f"runs_root={tmp_path / 'runs'}"]
    assert main([*base, "eval_profile=rl_ood", "analyze.eval.backend=vllm", f"python.eval={here}"]) == 2
    err = capfd.readouterr().err.strip().splitlines()   # the sweep's preflight: one line for its evaluation's interpreter
    assert err == [f"error: preflight: analyze: python.eval={here} lacks vllm (backend=vllm): name an environment that "
                   "has it (python.eval=.../bin/python)",
                   "error: the preflight found 1 problem(s) (above): nothing was started, submitted or written"]
    assert main([*base, "model.attn_implementation=flash_attention_2", f"python.sft={here}"]) == 2
    assert "lacks flash_attn (model.attn_implementation=flash_attention_2)" in capfd.readouterr().err
    assert main(["arm=r2e", "launcher=slurm", "data=synthetic", f"runs_root={tmp_path / 'runs'}",
                 "python.sft=/nonexistent/bin/python"]) == 2
    assert "python.sft=/nonexistent/bin/python could not be run" in capfd.readouterr().err
    assert not record.exists() and not (tmp_path / "runs").exists()
