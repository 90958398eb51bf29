"""Run-directory path rules shared by the stages that write and read evaluations."""
from __future__ import annotations

from pathlib import Path


def eval_subdir(profile: str | None = None) -> Path:
    """A run's evaluations: `eval/` for the default profile, `eval/<profile>/` for a named one
    (`evaluate profile=NAME`), so two profiles of one checkpoint never share a directory."""
    return Path("eval") / profile if profile else Path("eval")
