"""The structured plan of a study's dry run (`launch study=NAME [launcher=slurm] dry_run=true`), recorded
in-process by spies on the planner (launch/study.py `resolve_stages`, `plan_jobs`; not from its printed text):
each stage as resolved (each training run's config, each other stage's one config and interpreter) and every Job
of the plan (its module, interpreter, config, order, resources and needs; on Slurm its sbatch resources and
dependency, locally its command). A config is recorded as the plan decides it: a key at its field's default
(common.fields, the command's table) is left out, so a new key with a default changes no golden plan. Paths,
interpreters and timestamps are normalised (`<cwd>`, `<repo>`, `<python>`, `<data>`, `<time>`, a dry run's
temporary directory `<dry run KIND>`), so the plan is the same on every machine.

tests/test_study_plans.py compares it with the golden files under tests/snapshots/plans/;
`python -m tests.plan_capture` rewrites them (only where a plan changes on purpose: say why in the commit).
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import json
import os
import re
import sys
from pathlib import Path

from tests.hub_stand_ins import shipped_stand_ins

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


def _spec(script: str) -> dict:
    """A Slurm job's resources and order, read back from the sbatch script the SlurmRunner writes (its #SBATCH
    lines, torchrun's processes per node, launcher.setup), without its log file's place."""
    own = dict(line[len("#SBATCH --"):].partition("=")[::2] for line in script.splitlines()
               if line.startswith("#SBATCH --") and line[len("#SBATCH --"):].partition("=")[0] in _OWN)
    setup = script.partition("set +u  # launcher.setup\n")[2].partition("\nset -u  # end of launcher.setup")[0]
    nproc = re.search(r"--nproc_per_node=(\d+)", script)
    return {"job_name": own["job-name"], "nodes": int(own["nodes"]), "gpus_per_node": int(own.get("gpus-per-node", 0)),
            "nproc_per_node": int(nproc.group(1)) if nproc else 1,
            **{k: own.get(k) for k in ("partition", "time", "account", "qos", "array", "dependency")},
            "exclusive": "exclusive" in own, "signal": own.get("signal") == "USR1@120" or own.get("signal", False),
            "setup": setup or None, "extra": [line[len("#SBATCH "):] for line in script.splitlines()
                                              if line.startswith("#SBATCH ") and line[len("#SBATCH --"):].partition("=")[0] not in _OWN]}


_OWN = ("job-name", "nodes", "ntasks-per-node", "gpus-per-node", "exclusive", "signal", "requeue", "open-mode", "output",
        "partition", "time", "account", "qos", "array", "dependency")


def _config(path: str):
    """A job's config file as read back (YAML or JSON), None when it is not one (an unresolved stage's note)."""
    import yaml

    p = Path(path)
    if not p.is_file() or p.suffix not in (".yaml", ".json"):
        return None
    return yaml.safe_load(p.read_text(encoding="utf-8"))


def _tables() -> dict[str, dict]:
    """The key table of each command a plan holds a config of: by stage run, by job module, by a run's `stage`."""
    from launch.analyze import KEYS as ANALYZE
    from rl.config import GRPO
    from sft.export import KEYS as EXPORT

    from sft.config import SFT

    return {"sft": SFT, "sweep": SFT, "grpo": GRPO, "analyze": ANALYZE,
            "launch.analyze": ANALYZE, "export": EXPORT}


def decided(config, table: dict | None, prefix: str = ""):
    """`config` (nested) without the keys of `table` whose value is their field's default, and without a section
    left empty by that; everything else (a key no field defines, a changed value) as it is."""
    if table is None or not isinstance(config, dict):
        return config
    out = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if name in table:
            if json.dumps(value, sort_keys=True, default=str) != json.dumps(table[name].default, sort_keys=True, default=str):
                out[key] = value
        elif isinstance(value, dict) and any(k.startswith(f"{name}.") for k in table):
            if kept := decided(value, table, f"{name}."):
                out[key] = kept
        else:
            out[key] = value
    return out


def capture(monkeypatch, cwd: Path, argv: list[str]) -> dict:
    """The plan of `launch ARGV` (a study's dry run) run here in `cwd`: {"exit", "stages": [...], "jobs": [...]},
    from the planner itself: each stage as resolved (training runs' configs, a stage's one config, its
    interpreter) and each Job of the plan (module, interpreter, config read back, order, resources, needs; on
    Slurm the job's sbatch resources and dependency as the SlurmRunner writes them, locally its command)."""
    from omegaconf import OmegaConf

    import launch.study as study
    from launch.cli import main

    seen: dict = {}
    tables = _tables()
    real_resolve, real_plan = study.resolve_stages, study.plan_jobs

    def resolve_stages(req):
        seen["stages"] = real_resolve(req)
        return seen["stages"]

    def plan_jobs(req, stages, where):
        planned = real_plan(req, stages, where)
        seen["plan"], seen["where"], seen["slurm"] = planned[0], where, req.launcher == "slurm"
        return planned

    monkeypatch.setattr(study, "resolve_stages", resolve_stages)
    monkeypatch.setattr(study, "plan_jobs", plan_jobs)
    monkeypatch.setattr("launch.jobs.cuda_device_count", lambda: 0)   # the plan of a machine without GPUs, everywhere
    monkeypatch.chdir(cwd)
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()) as err:
        rc = main(argv)
    if rc != 0:
        raise AssertionError(f"launch {' '.join(argv)}: exit {rc}\n{out.getvalue()[-3000:]}\n{err.getvalue()[-3000:]}")
    stages = []
    for r in seen["stages"]:
        stage = {"name": r.stage.name, "run": r.stage.run}
        if r.unset:
            stage["unresolved"] = list(r.unset)
        elif r.preps:
            stage["runs"] = [{"run_dir": str(p.run_dir), "config": decided(OmegaConf.to_container(p.cfg), tables[
                "grpo" if p.cfg.get("stage") == "grpo" else "sft"])} for p in r.preps]
        if r.cfg is not None and not r.unset:
            stage.update(interpreter=r.python or sys.executable,
                         config=decided(OmegaConf.to_container(r.cfg), tables.get(r.stage.run)))
        stages.append(stage)
    jobs = []
    for job in seen["plan"]:
        entry = {"name": job.name, "module": job.module, "interpreter": job.python,
                 "configs": [decided(_config(c), tables.get(job.module)) if _config(c) is not None else c
                             for c in job.configs] if not job.torchrun
                 else list(job.configs), "after": list(job.after), "after_any": job.after_any,
                 "after_task": job.after_task, "wrapper": [job.resources.nodes, job.torchrun] if job.torchrun
                 else None, "needs": {"data": list(job.needs.data), "modules": list(job.needs.modules)},
                 "notes": list(job.notes)}
        if seen["slurm"]:   # the sbatch script the dry run wrote
            entry["slurm"] = _spec((Path(seen["where"]) / f"{job.name}.sbatch").read_text(encoding="utf-8"))
        else:
            entry["commands"] = [job.command(c) for c in job.configs]
        jobs.append(entry)
    return {"argv": argv, "exit": rc, "stages": stages, "jobs": jobs}


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
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_DATASETS_CACHE"):   # data=hub's sources as a user who
        monkeypatch.delenv(var, raising=False)                                  # loaded them once has them (offline,
    monkeypatch.setenv("HF_HOME", str(cwd.parent / "hf"))                       # the preflight asks)
    shipped_stand_ins(cwd.parent / "hf")
    for study in STUDY_FILES:
        for launcher in LAUNCHERS:
            argv = study_argv(study, launcher, slots)
            with monkeypatch.context() as mp:
                plan = capture(mp, cwd, [a.replace("recipes/study/", f"{ROOT}/recipes/study/") for a in argv])
            plan["argv"] = argv
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
