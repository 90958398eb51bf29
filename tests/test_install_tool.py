"""tools/install.py, the Makefile's installer: uv installs into the environment that runs it, from the sources
pip is configured with (pip.conf / PIP_*: the index, local wheels, constraints), which uv itself would ignore.

Offline: a fresh venv (ensurepip), the uv that `make venv` put beside this interpreter linked into it, and two
hand-built wheels of a one-module project in a local folder that only pip's configuration names.
"""
from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow
UV = Path(sys.executable).parent / "uv"


def _wheel(folder: Path, version: str) -> None:
    name = f"dtsft_tinypkg-{version}"
    files = {
        "dtsft_tinypkg.py": f"VERSION = {version!r}\n",
        f"{name}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: dtsft-tinypkg\nVersion: {version}\n",
        f"{name}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},"
              f"{len(text.encode())}" for path, text in files.items()]
    files[f"{name}.dist-info/RECORD"] = "\n".join([*record, f"{name}.dist-info/RECORD,,"]) + "\n"
    with zipfile.ZipFile(folder / f"{name}-py3-none-any.whl", "w") as whl:
        for path, text in files.items():
            whl.writestr(path, text)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    if not UV.is_file():
        pytest.skip(f"no uv beside {sys.executable} (`make venv` installs it there through tools/install.py)")
    tmp = tmp_path_factory.mktemp("installer")
    wheels = tmp / "wheels"
    wheels.mkdir()
    for version in ("0.9", "1.0"):
        _wheel(wheels, version)
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    (venv / "bin" / "uv").symlink_to(UV)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    base |= {"UV_OFFLINE": "1", "UV_CACHE_DIR": str(tmp / "uv-cache")}
    return tmp, venv, wheels, base


def _install(env, conf: str, *args: str) -> subprocess.CompletedProcess:
    tmp, venv, wheels, base = env
    (tmp / "pip.conf").write_text(conf.format(wheels=wheels, tmp=tmp))
    return subprocess.run([str(venv / "bin" / "python"), str(ROOT / "tools" / "install.py"), *args],
                          env=base | {"PIP_CONFIG_FILE": str(tmp / "pip.conf")}, capture_output=True, text=True)


def _version(env, *where: str) -> str:
    """The installed release: its dist-info, and its module's text (read, not imported: a cached .pyc of the other
    release, same size, could stand in for it)."""
    _, venv, _, base = env
    code = ("import sys, importlib.metadata as m, pathlib\n"
            "dists = list(m.distributions(name='dtsft-tinypkg', path=sys.argv[1:] or sys.path))\n"
            "assert len(dists) == 1, [d._path for d in dists]\n"
            "print(dists[0].version, dists[0].locate_file('dtsft_tinypkg.py').read_text().strip())")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code, *where], env=base, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    version, text = out.stdout.split(" ", 1)
    assert text.strip() == f"VERSION = {version!r}", out.stdout
    return version


def test_the_installer_uses_pips_links_and_constraints(env):
    tmp = env[0]
    # Without pip's configuration naming the folder, uv cannot find the project: the folder reaches uv only from it.
    out = _install(env, "[global]\nno-index = true\n", "dtsft-tinypkg")
    assert out.returncode != 0 and "dtsft-tinypkg" in out.stderr, out.stdout + out.stderr
    (tmp / "constraints.txt").write_text("dtsft-tinypkg<1.0\n")
    out = _install(env, "[global]\nno-index = true\nfind-links = {wheels}\nconstraint = {tmp}/constraints.txt\n",
                   "dtsft-tinypkg")
    assert out.returncode == 0, out.stdout + out.stderr
    assert _version(env) == "0.9"   # pip's constraint held uv back from 1.0
    # The environment variable wins over the config file, as in pip: its constraint replaces the file's.
    _, venv, wheels, base = env
    (tmp / "newer.txt").write_text("dtsft-tinypkg>=1.0\n")
    conf = tmp / "pip.conf"
    conf.write_text(f"[global]\nno-index = true\nfind-links = {wheels}\nconstraint = {tmp}/constraints.txt\n")
    out = subprocess.run([str(venv / "bin" / "python"), str(ROOT / "tools" / "install.py"), "--upgrade",
                          "dtsft-tinypkg"], capture_output=True, text=True,
                         env=base | {"PIP_CONFIG_FILE": str(conf), "PIP_CONSTRAINT": str(tmp / "newer.txt")})
    assert out.returncode == 0, out.stdout + out.stderr
    assert _version(env) == "1.0", out.stdout + out.stderr


def test_the_installer_installs_into_a_target_folder(env):
    """The Makefile's .venv-trl layering: `--no-deps --upgrade --target DIR`."""
    target = env[0] / "target"
    out = _install(env, "[global]\nno-index = true\nfind-links = {wheels}\n", "--no-deps", "--upgrade", "--target",
                   str(target), "dtsft-tinypkg==0.9")
    assert out.returncode == 0, out.stdout + out.stderr
    assert (target / "dtsft_tinypkg.py").is_file() and _version(env, str(target)) == "0.9"


def test_the_installer_names_its_arguments_when_given_none(env):
    out = subprocess.run([str(env[1] / "bin" / "python"), str(ROOT / "tools" / "install.py")], capture_output=True,
                         text=True, env=env[3])
    assert out.returncode == 2 and "pip install" in out.stderr
