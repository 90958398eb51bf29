"""A newcomer's first hour, replayed on a fresh clone: `.ci/run`'s newcomer tier.

    python3 tools/newcomer_walk.py [--keep]

Clones this checkout's HEAD (`git clone`, committed work only) into a temp dir with no test data directory beside it, and
there, in a shell that activated nothing (no VIRTUAL_ENV, no PYTHONPATH, no virtual environment's bin dir on PATH),
with a home dir, caches and $TMPDIR of its own under the temp dir:

1. runs README.md's set-up line for the test environment (`make venv`, read from README.md);
2. runs every `<!-- runnable: cpu -->` block (tools/docs_blocks.py, the parser tests/test_docs_blocks.py uses) of
   docs/getting-started.md, docs/how-to/own-trajectories.md and docs/how-to/evaluate-a-model.md exactly as
   written, each with `bash -euo pipefail` after README's activation line, the blocks of one page in order in one
   scratch dir;

with HF_HUB_OFFLINE (and every other HF_*, TRANSFORMERS_*, DTSFT_* variable) unset but the hub unreachable:
HF_ENDPOINT and DTSFT_DATA_ENDPOINT point at a loopback port this script holds bound and never listens on, so
any connection is refused at once. Prints each step's time and the total; stops at the first failure, naming the
page and the block's line, with the output's tail, and exits 1. The uv cache is $UV_CACHE_DIR when set (.ci/run
sets one for its run, so the main tier's downloads are reused), else one in the temp dir. The temp dir (the clone,
its .venv, the caches) is removed at the end, whatever happened (`--keep`: kept and named, for a post-mortem).
Standard library only.
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from docs_blocks import activation_line, cpu_blocks, outcome_problem, setup_command  # noqa: E402

ROOT = HERE.parent
PAGES = ["docs/getting-started.md", "docs/how-to/own-trajectories.md", "docs/how-to/evaluate-a-model.md"]
BLOCK_TIMEOUT_S = 600
SETUP_TIMEOUT_S = 1200
# What a newcomer's shell does not have: this machine's or a test run's settings for the project, the hub, caches.
DROP_PREFIXES = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_", "DTSFT_", "XDG_", "WANDB_", "TORCH_HOME", "PYTEST_")
DROP = {"VIRTUAL_ENV", "VIRTUAL_ENV_PROMPT", "PYTHONPATH", "PYTHONHOME", "PYTHONDONTWRITEBYTECODE", "CONDA_PREFIX",
        "PIP_CACHE_DIR", "MPLCONFIGDIR", "TMPDIR"}


def venv_free_path(path: str) -> str:
    """PATH without the bin dir of any virtual environment (a dir whose parent holds pyvenv.cfg)."""
    return os.pathsep.join(d for d in path.split(os.pathsep) if d and not (Path(d).parent / "pyvenv.cfg").is_file())


def newcomer_env(base: dict, tmp: Path, dead_endpoint: str) -> dict:
    env = {k: v for k, v in base.items() if k not in DROP and not k.startswith(DROP_PREFIXES)}
    for d in ("home", "tmp"):
        (tmp / d).mkdir()
    env.update(PATH=venv_free_path(base.get("PATH", "")), HOME=str(tmp / "home"), TMPDIR=str(tmp / "tmp"),
               HF_ENDPOINT=dead_endpoint, DTSFT_DATA_ENDPOINT=dead_endpoint,
               UV_CACHE_DIR=base.get("UV_CACHE_DIR") or str(tmp / "uv-cache"))
    return env


def run(cmd: list[str], cwd: Path, env: dict, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)


def fail(what: str, proc: subprocess.CompletedProcess) -> int:
    tail = proc.stdout.strip().splitlines()[-20:]
    print(f"newcomer: FAILED {what}: exit {proc.returncode}\n" + "\n".join("  " + x for x in tail), flush=True)
    return 1


def walk(tmp: Path) -> int:
    t_all = time.monotonic()
    clone = tmp / "dtsft"    # no test data directory beside it: tmp holds nothing else of the project's
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(ROOT), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "--quiet", "--detach", head], check=True)
    head = head[:7]
    readme = (clone / "README.md").read_text(encoding="utf-8")
    setup, activate = setup_command(readme, "venv"), activation_line(readme)
    if not setup or not activate:
        print("newcomer: README.md's set-up gives no `make venv` line or no activation line", flush=True)
        return 1
    hold = socket.socket()    # bound, never listening: a connection to it is refused at once
    hold.bind(("127.0.0.1", 0))
    try:
        env = newcomer_env(dict(os.environ), tmp, f"http://127.0.0.1:{hold.getsockname()[1]}")
        print(f"newcomer: clone of {head} in {clone}; hub {env['HF_ENDPOINT']} (refused)", flush=True)
        t0 = time.monotonic()
        proc = run(["bash", "-euo", "pipefail", "-c", setup], clone, env, SETUP_TIMEOUT_S)
        if proc.returncode:
            return fail(f"README.md's set-up line `{setup}`", proc)
        print(f"newcomer: {time.monotonic() - t0:6.1f} s  README.md: {setup}", flush=True)
        for page in PAGES:
            scratch = tmp / "work" / Path(page).stem
            scratch.mkdir(parents=True)
            for line, body, stop in cpu_blocks((clone / page).read_text(encoding="utf-8")):
                script = f"cd {shlex.quote(str(clone))}\n{activate}\ncd {shlex.quote(str(scratch))}\n{body}"
                t0 = time.monotonic()
                proc = run(["bash", "-euo", "pipefail", "-c", script], scratch, env, BLOCK_TIMEOUT_S)
                if why := outcome_problem(stop, proc.returncode, proc.stdout):   # stderr joined into stdout
                    return fail(f"{page}:{line} (its runnable block: {why})", proc)
                print(f"newcomer: {time.monotonic() - t0:6.1f} s  {page}:{line}", flush=True)
    finally:
        hold.close()
    print(f"newcomer: passed in {time.monotonic() - t_all:.1f} s (clone {head})", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (clone, .venv, caches) and name it")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="dtsft-newcomer-"))
    t0 = time.monotonic()
    try:
        return walk(tmp)
    except subprocess.TimeoutExpired as e:
        print(f"newcomer: FAILED: timed out after {e.timeout} s: {e.cmd[-1].splitlines()[-1]}", flush=True)
        return 1
    finally:
        if args.keep:
            print(f"newcomer: kept {tmp}", flush=True)
        else:
            t1 = time.monotonic()
            shutil.rmtree(tmp, ignore_errors=True)
            print(f"newcomer: {time.monotonic() - t1:6.1f} s  temp dir removed"
                  + (f" ({tmp} NOT removed)" if tmp.exists() else "")
                  + f"; {time.monotonic() - t0:.1f} s in all", flush=True)


if __name__ == "__main__":
    sys.exit(main())
