"""envs' typed errors: a bad environment request (an unknown split or task, a bad export request) is
an `EnvsError`,
itself a `common.cli.ConfigError` (exit 2, one line, at the command line). Callers match the type,
never a class name; errors a stage does not own (a `common.benchmarks.BenchError`, another stage's)
pass through as they are."""
from __future__ import annotations

from common.cli import ConfigError


class EnvsError(ConfigError):
    """Bad input to envs: the message names the key, file or record and the reason."""
