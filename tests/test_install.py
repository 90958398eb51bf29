"""A plain (non-editable) install carries the recipes: `launch ... dry_run=true` runs from it.

Cheap on purpose: a fresh venv that sees this interpreter's packages (for torch & co.), the
project's wheel, built by its build backend from a copy of the checkout, installed into it with --no-deps,
then run from a directory outside any checkout with PYTHONPATH unset.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow
# (".venv*": the vLLM and TRL 1.9.2 environments too; .venv-vllm is ~4 GB, copied for nothing once `make venv-vllm` ran)
SKIP_DIRS = (".git", ".venv*", "venv", "runs", "reports", ".cache", "__pycache__", "build", "*.egg-info",
             ".pytest_cache", "wandb", ".whl", "site")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*SKIP_DIRS))
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    # The venv's base interpreter is not this one: make this interpreter's packages (torch, omegaconf,
    # setuptools, ...) visible behind the venv's own, which is where the project gets installed.
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "_parent_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # The wheel from the project's build backend (PEP 517 build_wheel, the hook pip calls), then installed by
    # the venv's pip: one backend process instead of pip's metadata and wheel processes, no bytecode compiled.
    built = subprocess.run([str(py), "-c", "import sys; from setuptools import build_meta; print(build_meta.build_wheel(sys.argv[1]))",
                            str(tmp / "wheel")], cwd=src, capture_output=True, text=True, env=env, check=False)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    wheel = tmp / "wheel" / built.stdout.split()[-1]
    out = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-compile", str(wheel)],
                         capture_output=True, text=True, env=env, check=False)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    shutil.rmtree(src)   # nothing may come from the copy once installed
    return venv, env, tmp


def test_installed_launch_dry_run(installed):
    venv, env, tmp = installed
    cwd = tmp / "elsewhere"
    cwd.mkdir()
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import launch.compose as c; print(c.RECIPES)"],
                           cwd=cwd, env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where).is_relative_to(venv) and (Path(where) / "arm" / "r2e.yaml").is_file(), where
    out = subprocess.run([str(venv / "bin" / "launch"), "arm=r2e", "model=tiny", "data=synthetic", "dry_run=true",
                          f"runs_root={tmp / 'runs'}"], cwd=cwd, env=env, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    command = out.stdout.split("# command\n", 1)[1].strip()
    assert command.endswith(f"-m sft.train {tmp / 'runs' / 'r2e' / 'seed0' / 'config.yaml'}"), out.stdout[-2000:]
    assert "\n  path: tiny\n" in out.stdout
    assert not (tmp / "runs").exists()
