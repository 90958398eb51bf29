"""sft's typed errors: every bad-input error of the trainer (a config value, a dataset, a state that
does not belong to this run or does not verify) is an `SftError`,
itself a `common.cli.ConfigError` (exit 2, one line, at the command line). Callers match the type,
never a class name; errors a stage does not own (a `common.benchmarks.BenchError`, another stage's)
pass through as they are."""
from __future__ import annotations

from common.cli import ConfigError


class SftError(ConfigError):
    """Bad input to sft: the message names the key, file or record and the reason."""
