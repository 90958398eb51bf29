"""rl's typed errors: every bad-input error of the GRPO stage (a key or value, a chat template that
cannot be trained multi-turn, a checkpoint or start model that does not verify) is an `RlError`,
itself a `common.cli.ConfigError` (exit 2, one line, at the command line). Callers match the type,
never a class name; errors a stage does not own (a `common.benchmarks.BenchError`, another stage's)
pass through as they are."""
from __future__ import annotations

from common.cli import ConfigError


class RlError(ConfigError):
    """Bad input to rl: the message names the key, file or record and the reason."""
