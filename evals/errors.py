"""evals' typed errors: every bad-input error of evaluation (a key or value, a bench file, an output
dir whose results belong to another identity, a results file that does not read) is an `EvalError`,
itself a `common.cli.ConfigError` (exit 2, one line, at the command line). Callers match the type,
never a class name; errors a stage does not own (a `common.benchmarks.BenchError`, another stage's)
pass through as they are."""
from __future__ import annotations

from common.cli import ConfigError


class EvalError(ConfigError):
    """Bad input to evals: the message names the key, file or record and the reason."""


class IdentityError(EvalError):
    """An out dir holds a bench under another identity (the message carries the diff: evals.store)."""
