"""Helpers shared by the study tests: `launch` as a user starts it, and a data cache pre-filled the way a user
fills one (`fetch-data from=DIR`) with no download possible."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, shared_path


def launch(cwd: Path, *argv: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """`python -m launch.cli ARGV` in `cwd` (wandb off), its output captured."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
               WANDB_MODE="disabled")
    return subprocess.run([sys.executable, "-m", "launch.cli", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def prefilled_data_cache(cache: Path, monkeypatch) -> None:
    """$DTSFT_DATA filled by `fetch-data from=DIR` (the tests' benchmark files); no download can happen (the
    endpoint is a closed loopback port)."""
    monkeypatch.setenv("DTSFT_DATA", str(cache))
    monkeypatch.setenv("DTSFT_DATA_ENDPOINT", "http://127.0.0.1:9")
    fill = subprocess.run([sys.executable, "-m", "common.datafetch", f"from={shared_path('benchmarks')}"],
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=120)
    assert fill.returncode == 0, fill.stderr
