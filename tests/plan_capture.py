"""The structured plan of a study's dry run (`launch study=NAME [launcher=slurm] dry_run=true`), recorded
in-process by spies on the points where today's planner decides (not from its printed text): each stage's
command line and what it waits for, each training run's resolved config, each local trainer command, each
analysis's evaluations and resolved evaluate config, and every Slurm job (its module, interpreter, resources,
dependency, array). Paths, interpreters and timestamps are normalised (`<cwd>`, `<repo>`, `<python>`,
`<data>`, `<time>`, a dry run's temporary directory `<dry run KIND>`), so the plan is the same on every machine.

tests/test_study_plans.py compares it with the golden files under tests/snapshots/plans/;
`python -m tests.plan_capture` rewrites them (only where a plan changes on purpose: say why in the commit).
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import os
import re
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "snapshots" / "plans"
STUDY_FILES = ("browsecomp_worker_export", "dual_terminator_sft", "llama3_1_8b_spa_grpo",
               "qwen3_4b_multihop_sft_grpo", "qwen3_4b_spa_grpo", "variants/dual_terminator_vs_v5")
LAUNCHERS = ("local", "slurm")


def stand_ins(cwd: Path) -> dict[str, list[str]]:
    """A stand-in file for every data slot of every study (made under `cwd`), as the slot's command-line values."""
    for name in ("traj.jsonl", "questions.jsonl", "e5_Flat.index"):
        (cwd / name).write_text("")
    (cwd / "corpus.jsonl").write_text('{"id": "0", "contents": "x"}\n')
    (cwd / "nq_rollouts.jsonl").write_text((ROOT / "docs" / "examples" / "nq_rollouts_example.jsonl").read_text())
    (cwd / "ckpt").mkdir(exist_ok=True)   # what a dry run of the export reads: an HF model dir's two files
    (cwd / "ckpt" / "config.json").write_text("{}")
    (cwd / "ckpt" / "model.safetensors").write_bytes(b"")
    return {
        "dual_terminator_sft": ["corpus=corpus.jsonl", "nq_rollouts=nq_rollouts.jsonl", "report:eval.index=e5_Flat.index"],
        "variants/dual_terminator_vs_v5": ["corpus=corpus.jsonl"],
        "qwen3_4b_multihop_sft_grpo": ["hotpotqa_trajectories=canonical:traj.jsonl", "hotpotqa_questions=questions.jsonl"],
        "browsecomp_worker_export": ["checkpoint=ckpt", f"tokenizer={ROOT / 'common' / 'tiny_tokenizer'}"],
    }


TRL_PIN = "1.9.2"   # the GRPO studies' grpo.trl


def gpu_env_stand_in(where: Path, monkeypatch) -> None:
    """What the preflight asks of a GPU environment, for a dry run on this CPU box: a stand-in `vllm` package
    (an empty module; none where this interpreter has vLLM, which it would hide) and a stand-in record of the
    pinned trl release (a dist-info), under `where`, on the PYTHONPATH of the interpreter probe's subprocess only
    (this process never imports them), so `eval.backend=vllm` and `grpo.trl` pass the check of the implicit
    interpreter."""
    from common import interpreter

    site = where / "gpu_env_stand_in"
    site.mkdir(parents=True, exist_ok=True)
    if importlib.util.find_spec("vllm") is None:   # never over a real one (the vLLM tier's interpreter has vLLM)
        (site / "vllm").mkdir(exist_ok=True)
        (site / "vllm" / "__init__.py").write_text('"""A stand-in: the interpreter probe finds it."""\n')
    (site / f"trl-{TRL_PIN}.dist-info").mkdir(exist_ok=True)
    (site / f"trl-{TRL_PIN}.dist-info" / "METADATA").write_text(f"Metadata-Version: 2.1\nName: trl\nVersion: {TRL_PIN}\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(site), str(ROOT), os.environ.get("PYTHONPATH")) if p))
    for name in ("missing_modules", "package_version"):   # answers cached afresh, the earlier ones back on undo
        monkeypatch.setattr(interpreter, name, functools.lru_cache(maxsize=None)(getattr(interpreter, name).__wrapped__))


def unpinned_stand_ins(where: Path) -> None:
    """A user's copy of every unpinned data set (never downloaded: pre-filled with `fetch-data NAME from=DIR`),
    as a one-row stand-in, put into $DTSFT_DATA the way a user puts theirs."""
    from common import datafetch

    src = where / "unpinned_copies"
    for name, f in datafetch.UNPINNED.items():
        (src / f.rel.split("/", 1)[1]).parent.mkdir(parents=True, exist_ok=True)
        (src / f.rel.split("/", 1)[1]).write_text('{"_id": "0", "question": "q", "answer": "a"}\n')
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        datafetch.fill(src, list(datafetch.UNPINNED))


def _spec(spec) -> dict:
    """A Slurm job's resources and order (launch.slurm.SlurmSpec), without its log file's place."""
    keep = ("job_name", "nodes", "gpus_per_node", "nproc_per_node", "partition", "time", "account", "qos", "array",
            "dependency", "exclusive", "signal", "setup")
    return {**{k: getattr(spec, k) for k in keep}, "extra": list(spec.extra)}


def _execs(lines: list[str]) -> list[list[str]]:
    """The Python commands a command script's shell lines run (`exec python -m ...`, `python -m ...`)."""
    out = []
    for line in lines:
        for part in re.split(r"\s*(?:&&|\|\||;)\s*", line.strip()):
            words = shlex.split(part.removeprefix("exec "), comments=True) if "-m" in part else []
            if len(words) > 2 and words[1] == "-m":
                out.append(words)
    return out


def capture(monkeypatch, cwd: Path, argv: list[str]) -> dict:
    """The plan of `launch ARGV` (a study's dry run) run here in `cwd`: {"exit", "stages": [...]}."""
    from omegaconf import OmegaConf

    import launch.analyze as analyze
    import launch.local as local
    import launch.study as study
    from launch import slurm
    from launch.cli import main
    from launch import run, sweep
    from launch.jobs import Job, Torchrun
    from launch.run import Prepared

    stages: list[dict] = []
    preps: list[tuple[dict, Prepared]] = []

    def current() -> dict:
        return stages[-1] if stages else {"jobs": []}

    real_stage_command = study.stage_command

    def stage_command(st, stage, extra):
        cmd = real_stage_command(st, stage, extra)
        if not stages or stages[-1]["name"] != stage.name:
            stages.append({"name": stage.name, "run": stage.run, "jobs": []})
        stages[-1].update(interpreter=cmd[0], module=cmd[2], args=cmd[3:])
        return cmd

    real_run_stage = study.run_stage

    def run_stage(cmd, env, launch, quiet=False):
        current()["waits_for"] = env.get(slurm.AFTER_ENV)
        return real_run_stage(cmd, env, launch, quiet)

    real_init = Prepared.__init__

    def prepared(self, *a, **kw):
        real_init(self, *a, **kw)
        preps.append((current(), self))

    def dry_run(trainer, preps, argv, *args, **kw):
        # what a launch's / sweep's dry run shows as the local torchrun command of each run (GRPO's: always)
        first = preps[0]
        if first.cfg.launcher.kind != "slurm" or trainer.stage == "grpo":
            for prep in preps:
                config = str(prep.run_dir / "config.yaml")
                local_job = Job("train", trainer.module, config=config, python=trainer.python(prep),
                                wrapper=Torchrun(1, prep.nproc))
                current()["jobs"].append({"kind": "local training", "module": trainer.module,
                                          "interpreter": local_job.python, "config": config,
                                          "nproc_per_node": prep.nproc, "command": local_job.command(config)})
        return real_dry_run(trainer, preps, argv, *args, **kw)

    real_dry_run = run.dry_run

    def run_script(spec, run_dir, repo, python, command, module="sft.train"):
        array = not isinstance(run_dir, str)
        current()["jobs"].append({"kind": "slurm training array" if array else "slurm training", "module": module,
                                  "interpreter": python, "run_dirs": list(run_dir) if array else [run_dir],
                                  "resources": _spec(spec)})
        return real_run_script(spec, run_dir, repo, python, command, module=module)

    real_run_script = slurm.render_run_script

    def command_script(spec, workdir, command, lines, repo=None):
        current()["jobs"].append({"kind": "slurm command", "runs": _execs(list(lines)), "workdir": workdir,
                                  "resources": _spec(spec)})
        return real_command_script(spec, workdir, command, lines, repo=repo)

    real_command_script = slurm.render_command_script

    def plan(runs, benches, anchor, anchor_dir, prompt, profile, **kw):
        jobs = real_plan(runs, benches, anchor, anchor_dir, prompt, profile, **kw)
        current()["jobs"].append({"kind": "evaluations", "benches": list(benches), "anchor": anchor,
                                  "profile": profile, "runs": [f"{r.arm}/seed{r.seed}" for r in runs],
                                  "evaluations": [{"label": j.label, "benches": list(j.benches), "prompt": j.prompt,
                                                   "out": str(j.out)} for j in jobs]})
        return jobs

    real_plan = analyze.plan

    def check_settings(h, eval_opts, benches):
        resolved = real_check_settings(h, eval_opts, benches)
        if resolved is not None:
            current()["jobs"].append({"kind": "evaluate config", "config": OmegaConf.to_container(resolved)
                                      if not isinstance(resolved, dict) else dict(resolved)})
        return resolved

    real_check_settings = analyze.check_settings

    monkeypatch.setattr(study, "stage_command", stage_command)
    monkeypatch.setattr(study, "run_stage", run_stage)
    monkeypatch.setattr(Prepared, "__init__", prepared)
    monkeypatch.setattr(run, "dry_run", dry_run)
    monkeypatch.setattr(sweep, "dry_run", dry_run)
    monkeypatch.setattr(local, "cuda_device_count", lambda: 0)   # the plan of a machine without GPUs, everywhere
    monkeypatch.setattr(slurm, "render_run_script", run_script)
    monkeypatch.setattr(slurm, "render_command_script", command_script)
    monkeypatch.setattr(analyze, "plan", plan)
    monkeypatch.setattr(analyze, "check_settings", check_settings)
    monkeypatch.chdir(cwd)
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()) as err:
        rc = main(argv)
    # each run's config as resolved last (a sweep resolves each run twice: one job per run dir)
    by_dir: dict[str, tuple[dict, dict]] = {}
    for stage, prep in preps:
        by_dir[str(prep.run_dir)] = (stage, OmegaConf.to_container(prep.cfg))
    for run_dir, (stage, cfg) in by_dir.items():
        stage.setdefault("runs", []).append({"run_dir": run_dir, "config": cfg})
    for stage in stages:   # its command first, then its jobs and runs
        for key in ("jobs", "runs"):
            if key in stage:
                stage[key] = stage.pop(key)
    if rc != 0:
        raise AssertionError(f"launch {' '.join(argv)}: exit {rc}\n{out.getvalue()[-3000:]}\n{err.getvalue()[-3000:]}")
    return {"argv": argv, "exit": rc, "stages": stages}


def normalise(value, subs: list[tuple[str, str]]):
    """`value` with every path of this machine replaced by its placeholder and UTC stamps by `<time>`."""
    if isinstance(value, dict):
        return {k: normalise(v, subs) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [normalise(v, subs) for v in value]
    if isinstance(value, str):
        for real, name in subs:
            value = value.replace(real, name)
        value = re.sub(r"[^\s'\"]*/dtsft-dry-run-([a-z]+)-[a-z0-9_]{8}", r"<dry run \1>", value)   # launch.jobs.dry_run_dir
        return re.sub(r"\d{8}T\d{6}Z", "<time>", value)
    return value


def substitutions(cwd: Path) -> list[tuple[str, str]]:
    subs = [(str(cwd.resolve()), "<cwd>"), (str(cwd), "<cwd>"), (str(ROOT), "<repo>"), (sys.executable, "<python>")]
    if os.environ.get("DTSFT_DATA"):
        subs.insert(0, (os.environ["DTSFT_DATA"], "<data>"))
    return sorted(subs, key=lambda s: -len(s[0]))   # the longest first: a path inside another


def golden_name(study: str, launcher: str) -> str:
    return f"{study.replace('/', '__')}.{launcher}.yaml"


def study_argv(study: str, launcher: str, slots: dict[str, list[str]]) -> list[str]:
    spec = f"recipes/study/{study}.yaml" if "/" in study else study
    return [f"study={spec}", *([] if launcher == "local" else ["launcher=slurm"]), "dry_run=true",
            *slots.get(study, [])]


def plans(monkeypatch, cwd: Path) -> dict[str, dict]:
    """Every study file's plan, local and on Slurm, normalised: golden file name -> plan."""
    slots, subs, out = stand_ins(cwd), substitutions(cwd), {}
    gpu_env_stand_in(cwd.parent, monkeypatch)   # the GPU environment's vllm and trl (the implicit interpreter's)
    unpinned_stand_ins(cwd.parent)           # the unpinned sets a user pre-fills
    for study in STUDY_FILES:
        for launcher in LAUNCHERS:
            argv = study_argv(study, launcher, slots)
            with monkeypatch.context() as mp:
                plan = capture(mp, cwd, [a.replace("recipes/study/", f"{ROOT}/recipes/study/") for a in argv])
            plan["argv"] = argv
            if launcher == "slurm":   # a training dry run also prints the local command it would run (not a job)
                for stage in plan["stages"]:
                    stage["jobs"] = [j for j in stage["jobs"] if j["kind"] != "local training"]
            out[golden_name(study, launcher)] = normalise(plan, subs)
    return out


def dump(plan: dict) -> str:
    import yaml

    return yaml.safe_dump(plan, sort_keys=False, width=120, allow_unicode=True)


if __name__ == "__main__":   # rewrite the golden plans (python -m tests.plan_capture)
    import tempfile

    import pytest

    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        os.environ.setdefault("WANDB_MODE", "disabled")
        mp.setenv("DTSFT_DATA", str(Path(tmp) / "data"))
        mp.setenv("DTSFT_DATA_ENDPOINT", "http://127.0.0.1:9")
        mp.setenv("XDG_CACHE_HOME", str(Path(tmp) / "cache"))   # the digests a dry run records: not the developer's
        (Path(tmp) / "data").mkdir()
        cwd = Path(tmp) / "cwd"
        cwd.mkdir()
        GOLDEN.mkdir(parents=True, exist_ok=True)
        for name, plan in plans(mp, cwd).items():
            (GOLDEN / name).write_text(dump(plan), encoding="utf-8")
            print(f"wrote {GOLDEN / name}")
