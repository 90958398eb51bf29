"""The Job model and its runners (launch/jobs.py): a plan is an ordered list of Jobs, each a module run on one
config file; the Runner interface is enough for a third backend (a recording test double implements it here),
the local runner runs jobs here in order (in this process or as a child) and stops at the first failure, the
Slurm runner writes one sbatch template for every kind of job."""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from common.cli import ConfigError
from common.fields import IDENTITY, field, list_of
from launch.errors import LaunchError
from launch.jobs import REPO, Job, JobFailed, Needs, Resources, Runner, table


class RecordingRunner(Runner):
    """A third backend, as a test double: one file implementing the two methods. It records what it is asked
    to start and answers ids r1, r2, ..."""
    suffix = ".txt"

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.started: list[tuple[str, str, dict]] = []

    def script(self, job, ids, where):
        return "\n".join([f"after {','.join(ids[a] for a in job.after) or '-'}",
                          *(" ".join(self.task_command(job, c)) for c in job.configs)]) + "\n"

    def start(self, job, script, ids):
        self.started.append((job.name, script.read_text(), dict(ids)))
        return f"r{len(self.started)}"


class Submitting(RecordingRunner):
    """The double registered as a backend (as launch/<kind>.py would be, an entry of launch.jobs.BACKENDS): its jobs run
    later, elsewhere, on `launcher.nodes` nodes (Runner's defaults), on its own setting launcher.hosts (its script
    names them); each runner made is kept in `made`."""
    submits = True
    made: list[RecordingRunner] = []
    keys = {"launcher.hosts": field("recording: where its jobs go", [], (), list_of(lambda h: isinstance(h, str), "a list of host names"))}

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        Submitting.made.append(self)

    def script(self, job, ids, where):
        return super().script(job, ids, where) + f"hosts {job.cluster.backend['hosts']}\n"


class OnNodes(RecordingRunner):
    """A registered backend that runs a job itself on `launcher.nodes` nodes (no submission, e.g. torchrun over
    ssh): its own task command carries the rendezvous of the job's first node (here a fixed one)."""

    def task_command(self, job, config):
        return [job.python, "-m", "launch.torchrun", f"--nnodes={job.resources.nodes}", "--rdzv_backend=c10d",
                "--rdzv_endpoint=node-1:29400", f"--rdzv_id=dtsft-{job.name}", "-m", job.module, config]


def test_a_backend_registered_by_its_file_is_what_launch_plans_and_submits_with(tmp_path, monkeypatch, capsys):
    """`launcher=KIND` of a registered backend needs no recipe and no schema edit: compose accepts it (nodes > 1
    too: its jobs run on nodes) and its own keys (checked by their rules, listed by --help, its jobs carry them,
    never run identity), the training job takes its nodes x GPUs, the launch submits through it and the manifest
    records the submission; an unknown kind names the backends. A backend that runs a multi-node job itself gives
    the command launch prints (Runner.task_command)."""
    import json

    from omegaconf import OmegaConf

    from common import fingerprint
    from common.schema import TRAINER_SEMANTICS
    from launch import jobs
    from launch.cli import help_text
    from launch.compose import compose
    from launch.run import SFT, launch_one
    from sft.config import EXCLUDED_KEYS

    monkeypatch.setitem(jobs.BACKENDS, "recording", f"{__name__}:Submitting")
    monkeypatch.setattr(Submitting, "made", [])
    assert compose(["launcher=recording", "nodes=2"]).cfg.launcher.kind == "recording"
    for argv in (["launcher.kind=recordin"], ["launcher=recordin"]):   # (the group selector: recipes and backends)
        with pytest.raises(ConfigError, match=r"(expected one of|choices:) local, (recording, )?slurm(, \w+)*.*\. Did you mean: recording\?"):
            compose(argv)
    with pytest.raises(LaunchError, match=r"launcher.hosts must be a list of host names, got \[1\]"):
        compose(["launcher.hosts=[1]"])
    assert re.search(r"^  launcher\.hosts=\[\] +recording: where its jobs go$", help_text(), re.M)
    monkeypatch.setitem(Submitting.keys, "launcher.zone", field("a zone", "z", (IDENTITY,)))
    with pytest.raises(LaunchError, match=r"launcher.zone: a launcher backend's own key \(Runner.keys\) must be a launcher.<name> key outside run identity"):
        compose([])
    del Submitting.keys["launcher.zone"]
    assert jobs.BACKENDS.items() >= {"local": "launch.local:LocalRunner", "slurm": "launch.slurm:SlurmRunner"}.items(), "found by their files"

    def build(data_cfg, *, arm, seed, tokenizer, out, final):   # a stand-in dataset
        (Path(out) / "manifest.json").write_text(json.dumps({"fingerprint": "fp"}))
        return {"fingerprint": "fp"}

    monkeypatch.setattr("data_prep.build.build_arm", build)
    monkeypatch.setattr("data_prep.build.cache_key", lambda cfg, **kw: "k")
    argv = ["arm=search", "launcher=recording", "gpus_per_node=3", "data=synthetic", f"runs_root={tmp_path}", "launcher.hosts=[n1]"]
    assert launch_one(SFT, argv) == 0
    (runner,) = Submitting.made
    rd = tmp_path / "search" / "seed0"
    assert [(name, ids) for name, _, ids in runner.started] == [("launch", {})]
    assert f"--nproc_per_node=3 -m sft.train {rd}/config.yaml" in runner.started[0][1] and "hosts ['n1']" in runner.started[0][1]
    identity, config = json.loads((rd / "manifest.json").read_text())["identity"], OmegaConf.load(rd / "config.yaml")
    assert config.launcher.hosts == ["n1"] and "launcher.hosts" not in identity["keys"]
    assert identity == fingerprint.identity(config, EXCLUDED_KEYS, trainer_semantics=TRAINER_SEMANTICS, data_fingerprint="fp"), \
        "the identity sft.train computes from config.yaml (without launch/): the same"
    assert json.loads((rd / "manifest.json").read_text())["launcher"] == {
        "kind": "recording", "nodes": 1, "gpus_per_node": 3, "script": str(rd / "launch.txt"), "job_id": "r1"}
    # one that runs a 2-node job itself: launch prints (and would record) its task command, with its rendezvous
    monkeypatch.setitem(jobs.BACKENDS, "onnodes", f"{__name__}:OnNodes")
    assert launch_one(SFT, ["arm=search", "launcher=onnodes", "nodes=2", "model=tiny", "data=synthetic", f"runs_root={tmp_path}/n",
                            "dry_run=true"]) == 0
    assert "--nnodes=2 --rdzv_backend=c10d --rdzv_endpoint=node-1:29400 --rdzv_id=dtsft-launch" in capsys.readouterr().out


def _plan(tmp_path: Path) -> list[Job]:
    return [Job("train", "sft.train", config=str(tmp_path / "run" / "config.yaml"), torchrun=2),
            Job("eval", "launch.eval_slurm", array=("a.json", "b.json"), after=("train",), python="/envs/vllm/python",
                needs=Needs(data=("corpus:wiki18",), modules=("vllm",))),
            Job("aggregate", "launch.analyze", config="analyze.yaml", after=("eval",), after_any=True)]


def test_a_third_runner_is_the_two_methods_and_runs_a_plan_in_order(tmp_path):
    runner = RecordingRunner()
    assert runner.run(_plan(tmp_path), tmp_path / "plan") == {"train": "r1", "eval": "r2", "aggregate": "r3"}
    assert [(name, ids) for name, _, ids in runner.started] == [
        ("train", {}), ("eval", {"train": "r1"}), ("aggregate", {"train": "r1", "eval": "r2"})]
    assert runner.started[1][1] == ("after r1\n/envs/vllm/python -m launch.eval_slurm a.json\n"
                                    "/envs/vllm/python -m launch.eval_slurm b.json\n")
    assert f"--nproc_per_node=2 -m sft.train {tmp_path}/run/config.yaml" in runner.started[0][1]
    assert sorted(p.name for p in (tmp_path / "plan").iterdir()) == ["aggregate.txt", "eval.txt", "train.txt"]


def test_a_plan_names_each_job_once_and_runs_it_after_earlier_ones(tmp_path):
    a = Job("a", "m", config="c")
    with pytest.raises(LaunchError, match="two jobs are named a"):
        RecordingRunner().run([a, a], tmp_path)
    with pytest.raises(LaunchError, match=r"job b runs after \['c'\], which is no earlier job"):
        RecordingRunner().run([a, Job("b", "m", config="c", after=("c",))], tmp_path)
    assert not list(tmp_path.iterdir()), "a refused plan writes nothing"
    with pytest.raises(ValueError, match="one config file or an array"):
        Job("x", "m", config="c", array=("d",))
    with pytest.raises(ValueError, match="letters, digits"):
        Job("x y", "m", config="c")


def test_the_dry_run_writes_every_script_under_the_dir_it_names_and_prints_one_table(tmp_path, capsys):
    plan = _plan(tmp_path)
    RecordingRunner().run(plan, tmp_path, dry_run=True)
    out = capsys.readouterr().out
    assert f"written under {tmp_path}" in out and table(plan) in out
    rows = [line.split() for line in table(plan).splitlines()]
    assert [r[:3] for r in rows] == [["job", "module", "after"], ["train", "sft.train", "-"],
                                     ["eval", "launch.eval_slurm", "ok:train"], ["aggregate", "launch.analyze", "any:eval"]]
    assert "corpus:wiki18, import vllm" in table(plan) and "2 tasks" in table(plan) and "torchrun 1x2" in table(plan)
    assert (tmp_path / "aggregate.txt").read_text().startswith("after <job id of eval>\n")


def test_the_slurm_template_writes_a_training_job_as_the_run_script_and_chains_the_others(tmp_path):
    """One template: a torchrun Job is the training run script (its run dir, torchrun on each node under srun,
    requeue or an end record); any other job execs `python -m MODULE CONFIG`, an array task its own config; `after` becomes the
    dependency (afterok, or afterany), with --kill-on-invalid-dep=yes where a failed dependency cancels it."""
    from launch import slurm

    runner = slurm.SlurmRunner("test")
    run_dir = tmp_path / "runs" / "r2e" / "seed0"
    cluster = slurm.Cluster(partition="P", sbatch=("--constraint=h100",))
    train = Job("train", "sft.train", config=str(run_dir / "config.yaml"), torchrun=4, cluster=cluster,
                resources=Resources(nodes=2, gpus_per_node=4))
    script = runner.script(train, {}, tmp_path)
    for line in ("# Written by: test", "#SBATCH --nodes=2", "#SBATCH --gpus-per-node=4", "#SBATCH --exclusive",
                 "#SBATCH --signal=USR1@120", "#SBATCH --requeue", f"#SBATCH --output={tmp_path}/slurm-train-%j.out",
                 "#SBATCH --partition=P", "#SBATCH --constraint=h100", f"RUN_DIR={run_dir}", f"cd {REPO}",
                 "srun --nodes=2 --ntasks-per-node=1 --kill-on-bad-exit=1 \\", 'scontrol requeue "$JOB_REF" || end_record FAILED'):
        assert line in script.splitlines() or line in script, line
    assert "--nnodes=2 --nproc_per_node=4" in script and "-m sft.train" in script
    ev = Job("eval", "launch.eval_slurm", array=("e0.json", "e1.json"), after=("train",), waits="afterok:7_1",
             resources=Resources(gpus_per_node=1, signal="B:USR1@120", at_once=1), notes=("x", "y"))
    script = runner.script(ev, {"train": "42"}, tmp_path)
    opts = dict(re.findall(r"^#SBATCH --([\w-]+)=(.*)$", script, flags=re.M))
    assert opts["dependency"] == "afterok:42,afterok:7_1" and opts["kill-on-invalid-dep"] == "yes"
    assert opts["array"] == "0-1%1" and opts["signal"] == "B:USR1@120" and opts["job-name"] == "dtsft-eval"
    assert "# task 1: y" in script and "--exclusive" not in script
    assert script.rstrip().endswith('-m launch.eval_slurm "${CONFIGS[$SLURM_ARRAY_TASK_ID]}"')
    assert "CONFIGS=(\n  e0.json\n  e1.json\n)" in script
    agg = runner.script(Job("aggregate", "launch.analyze", config="a.yaml", after=("eval",), after_any=True),
                        {"eval": "43"}, tmp_path)
    assert "#SBATCH --dependency=afterany:43" in agg and "kill-on-invalid-dep" not in agg
    assert agg.rstrip().endswith(f"exec {sys.executable} -m launch.analyze a.yaml")


def test_the_local_runner_runs_here_or_as_a_child_in_order_and_stops_at_the_first_failure(tmp_path, monkeypatch, capfd):
    """A job of this interpreter runs in this process (its env and cwd changes do not leak into the next one);
    another interpreter's is a child process; the first failure stops the plan with its exit status."""
    from launch.local import LocalRunner

    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "dtsft_job_probe.py").write_text(
        "import os, sys\nfrom pathlib import Path\n\n\ndef main(argv):\n"
        "    cfg = Path(argv[0]).read_text().split()\n"
        "    print('ran', cfg[0], os.getpid(), os.environ.get('DTSFT_PROBE_LEAK'), flush=True)\n"
        "    os.environ['DTSFT_PROBE_LEAK'] = cfg[0]\n    os.chdir(Path(argv[0]).parent)\n    return int(cfg[1])\n\n\n"
        "if __name__ == '__main__':\n    sys.exit(main(sys.argv[1:]))\n")
    monkeypatch.syspath_prepend(str(mods))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(mods), os.environ.get("PYTHONPATH", "")]))
    other = tmp_path / "env" / "python"   # another interpreter: a child process
    other.parent.mkdir()
    other.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    other.chmod(0o755)
    for name, text in (("a", "a 0"), ("b", "b 0"), ("c", "c 5"), ("d", "d 0")):
        (tmp_path / f"{name}.cfg").write_text(text)
    cfg = {n: str(tmp_path / f"{n}.cfg") for n in "abcd"}
    plan = [Job("a", "dtsft_job_probe", config=cfg["a"]), Job("b", "dtsft_job_probe", config=cfg["b"], after=("a",)),
            Job("c", "dtsft_job_probe", array=(cfg["c"], cfg["d"]), python=str(other)),
            Job("d", "dtsft_job_probe", config=cfg["d"])]
    monkeypatch.chdir(tmp_path)   # where its non-training jobs run: the directory it was made in
    cwd = os.getcwd()
    with pytest.raises(JobFailed) as failed:
        LocalRunner().run(plan, tmp_path / "plan")
    assert (failed.value.job, failed.value.status) == ("c", 5)
    ran = [line.split() for line in capfd.readouterr().out.splitlines() if line.startswith("ran ")]
    assert [(r[1], r[3]) for r in ran] == [("a", "None"), ("b", "None"), ("c", "None")], ran   # d never ran
    assert ran[0][2] == ran[1][2] == str(os.getpid()) != ran[2][2]
    assert os.getcwd() == cwd and "DTSFT_PROBE_LEAK" not in os.environ
    assert (tmp_path / "plan" / "c.sh").read_text().splitlines()[-2:] == [
        f"{other} -m dtsft_job_probe {cfg['c']}", f"{other} -m dtsft_job_probe {cfg['d']}"]


@pytest.mark.parametrize("nodes, env, asked", [
    ((), {}, False),                                    # a laptop or CPU node: no GPU driver's device node
    (("nvidiactl", "nvidia-uvm"), {}, False),           # NVIDIA's driver loaded, no GPU given (a container's)
    (("nvidiactl", "nvidia0"), {}, True), (("dxg",), {}, True), (("kfd",), {}, True), (("nvhost-ctrl-gpu",), {}, True),
    (("nvidia0",), {"CUDA_VISIBLE_DEVICES": ""}, False), (("nvidia0",), {"CUDA_VISIBLE_DEVICES": "-1"}, False),
    (("nvidia0",), {"CUDA_VISIBLE_DEVICES": " -1,0"}, False),   # CUDA shows the devices before the first invalid one
    (("nvidia0",), {"CUDA_VISIBLE_DEVICES": "1,-1"}, True), (("nvidia0",), {"CUDA_VISIBLE_DEVICES": "GPU-8932f937"}, True),
    (("kfd",), {"CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": "0"}, True),   # ROCm's torch reads HIP's first
])
def test_torch_is_asked_for_gpus_only_where_the_machine_may_have_one(nodes, env, asked, tmp_path, monkeypatch):
    """A dry run here counts GPUs (launch.jobs.cuda_device_count): torch (seconds to import) is asked only where a GPU
    driver's device node exists and CUDA_VISIBLE_DEVICES does not hide every device; elsewhere the count is 0 (seen
    failing: every local dry run imported torch)."""
    import types

    from common import interpreter
    from launch import jobs

    for name in nodes:
        (tmp_path / name).touch()
    for name in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    calls = []
    cuda = types.SimpleNamespace(is_available=lambda: calls.append("is_available") or True,
                                 device_count=lambda: calls.append("device_count") or 3)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setattr(interpreter.gpus_visible, "__defaults__", (tmp_path,))   # its /dev
    assert interpreter.gpus_visible() is asked
    assert jobs.cuda_device_count() == (3 if asked else 0) and bool(calls) is asked, calls


def test_a_count_without_a_gpu_device_never_imports_torch(tmp_path):
    """In a fresh interpreter with no GPU device node, counting GPUs leaves torch unimported."""
    import subprocess

    probe = ("import sys; from pathlib import Path; from common import interpreter; from launch import jobs; "
             f"interpreter.gpus_visible.__defaults__ = (Path({str(tmp_path)!r}),); "
             "print(jobs.cuda_device_count(), 'torch' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0", "False"], out


def test_the_sft_dry_run_never_imports_torch(tmp_path):
    """A fresh interpreter's SFT dry run on the tiny base without data.dir leaves torch unimported: the dataset's cache
    key reads the tokenizer dir's files (seen failing: it loaded the tokenizer, ~15 s importing transformers and torch)."""
    import subprocess

    probe = ("import sys; from pathlib import Path; from common import interpreter; from launch.cli import main; "
             f"interpreter.gpus_visible.__defaults__ = (Path({str(tmp_path)!r}),); "
             f"code = main(['arm=r2e', 'model=tiny_base', 'data=synthetic', 'steps=2', 'dry_run=true', 'runs_root={tmp_path}']); "
             "print(code, 'torch' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split()[-2:] == ["0", "False"], out
