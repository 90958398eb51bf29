"""`<run_dir>/manifest.json`: what ran — code version, packages, hardware, data, command line. A run dir's first
launch writes the full record; every later one (a resume, a requeued Slurm segment submitted again) appends an entry
to `launches`: the whole history of the run, the original never lost. Each entry holds its launch's own code version,
packages and hardware (a resume may run from other code, in another environment, on another machine). Every read-modify-write of it holds
common.lock.manifest_lock, as the trainers' record of their base does."""
from __future__ import annotations

import contextlib
import json
import os
import platform
import shlex
import socket
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from common import layout
from common.fingerprint import file_digest
from common.io import write_json
from common.lock import manifest_lock
from common.study import STUDY_ENV
from launch.paths import REPO

PACKAGES = ("torch", "transformers", "datasets", "tokenizers", "accelerate", "safetensors", "omegaconf",
            "liger-kernel", "flash-attn", "wandb", "numpy", "trl", "dtsft")


def git_state(repo: Path = REPO) -> dict:
    """Commit and dirty flag of the checkout the code runs from (None outside a git checkout)."""
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": git("rev-parse", "HEAD") or None, "dirty": bool(status) if status is not None else None,
            "branch": git("rev-parse", "--abbrev-ref", "HEAD") or None}


_VERSIONS = """import importlib.metadata as m, json, platform, sys
versions = {"python": platform.python_version()}
for name in sys.argv[1:]:
    try:
        versions[name] = m.version(name)
    except m.PackageNotFoundError:
        versions[name] = None
print(json.dumps(versions))
"""


def package_versions(python: str | None = None) -> dict:
    """The Python and PACKAGES releases of `python` (None: not installed), the interpreter that trains; this one's in
    process where it is this one. One that cannot be asked: its versions None and why, in `unreadable`."""
    if python is None or os.path.realpath(python) == os.path.realpath(sys.executable):
        versions = {"interpreter": python or sys.executable, "python": platform.python_version(), **dict.fromkeys(PACKAGES)}
        for name in PACKAGES:
            with contextlib.suppress(metadata.PackageNotFoundError):
                versions[name] = metadata.version(name)
        return versions
    try:
        out = subprocess.run([python, "-c", _VERSIONS, *PACKAGES], capture_output=True, text=True, timeout=120)
        answer = json.loads(out.stdout) if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        out, answer = exc, None
    if not isinstance(answer, dict):
        why = f"exit {out.returncode}: {out.stderr.strip()[-300:]}" if isinstance(out, subprocess.CompletedProcess) else str(out)
        return {"interpreter": python, "python": None, **dict.fromkeys(PACKAGES), "unreadable": why}
    return {"interpreter": python, **answer}


def hardware() -> dict:
    info = {"hostname": socket.gethostname(), "platform": platform.platform(), "machine": platform.machine(),
            "cpu_count": os.cpu_count(), "cuda": False, "gpus": []}
    try:
        import torch

        if torch.cuda.is_available():
            info.update(cuda=True, cuda_version=torch.version.cuda,
                        gpus=[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
    except Exception as exc:  # a broken CUDA install must not stop the record being written
        info["cuda_error"] = repr(exc)
    return info


def read(run_dir: Path) -> dict:
    """A run dir's `manifest.json` as written ({} for a run dir without one)."""
    path = Path(run_dir) / layout.MANIFEST
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def write_manifest(run_dir: Path, *, argv: list[str], choices: dict, launcher: dict, data: dict,
                   identity: dict | None = None, python: dict | None = None, trains: str | None = None) -> dict:
    """Create `manifest.json` on the first launch; append this launch to `launches` afterwards. `data`: the dataset
    record (or GRPO's starting model); `identity`: the run identity checked; `python`: each job kind's interpreter;
    `trains`: the kind that trains the run (its interpreter's packages are recorded; None: this interpreter's)."""
    entry = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": shlex.join(["launch", *argv]),
             "argv": list(argv), "cwd": os.getcwd(), "python": sys.executable, "interpreters": dict(python or {}),
             "git": git_state(), "hostname": socket.gethostname(), "launcher": launcher, "data": data,
             "packages": package_versions((python or {}).get(trains)), "hardware": hardware()}   # each launch's: a resume may run elsewhere
    path = Path(run_dir) / layout.MANIFEST
    recipes = dict(choices)
    if choices.get("recipe"):   # the user's recipe file by content (its values are in config.yaml too)
        entry["recipe_sha256"] = recipes["recipe_sha256"] = file_digest(choices["recipe"])
    try:
        study = json.loads(os.environ.get(STUDY_ENV) or "null")
    except ValueError:
        study = {"unreadable": os.environ[STUDY_ENV]}
    if study is not None:  # launched as a stage of `launch study=NAME`: the study file's name and digest
        entry["study"] = study
    with manifest_lock(Path(run_dir) / layout.MANIFEST_LOCK):   # a trainer may be recording its base in it now (common.layout.record_base)
        manifest = read(run_dir) if path.is_file() else {
            "run_dir": str(run_dir), "created": entry["time"], "command": entry["command"], "recipes": recipes, "git": entry["git"],
            "packages": entry["packages"], "hardware": entry["hardware"], "data": data, "launcher": launcher, "launches": []}
        manifest.setdefault("launches", []).append(entry)
        if identity is not None:
            manifest["identity"] = identity
        if study is not None:
            manifest.setdefault("study", study)
        write_json(path, manifest)
    return manifest


def add_to_launch(run_dir: Path, index: int, **launcher) -> None:
    """Add `launcher` to the record of launch `index` (0: the first, whose record is also the top-level `launcher`):
    a submission's job id, known once sbatch returns, which is after the launch is recorded (its job may start before
    sbatch returns, and its trainer then records its base in the manifest: common.layout.record_base)."""
    with manifest_lock(Path(run_dir) / layout.MANIFEST_LOCK):
        manifest = read(run_dir)
        manifest["launches"][index]["launcher"].update(launcher)
        if index == 0:
            manifest["launcher"].update(launcher)
        write_json(Path(run_dir) / layout.MANIFEST, manifest)
