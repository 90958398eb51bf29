"""analysis's typed errors: every bad-input error of the analysis (a key or value, an eval output or
results file that does not read) is an `AnalysisError`,
itself a `common.cli.ConfigError` (exit 2, one line, at the command line). Callers match the type,
never a class name; errors a stage does not own (a `common.benchmarks.BenchError`, another stage's)
pass through as they are."""
from __future__ import annotations

from common.cli import ConfigError


class AnalysisError(ConfigError):
    """Bad input to analysis: the message names the key, file or record and the reason."""
