"""data_prep's typed errors: every bad-input error of this stage is a `DataPrepError`, itself a
`common.cli.ConfigError` (exit 2, one line, at the command line); callers such as launch's dataset
cache match the type, never a class name."""
from __future__ import annotations

from common.cli import ConfigError


class DataPrepError(ConfigError):
    """Bad input to data_prep: a data key, a source, a record, an arm's quota, a chat template."""
