"""launch's typed errors: every refusal of a launch (a recipe key or value, a run identity that differs,
a run dir that is busy or queued, hardware that cannot run the request) is a `LaunchError`,
itself a `common.cli.ConfigError` (exit 2, one line, at the command line). Callers match the type,
never a class name; errors a stage does not own (a `common.benchmarks.BenchError`, another stage's)
pass through as they are."""
from __future__ import annotations

from common.cli import ConfigError


class LaunchError(ConfigError):
    """Bad input to launch: the message names the key, file or record and the reason."""
