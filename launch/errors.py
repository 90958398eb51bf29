"""launch's typed error: every refusal of a launch (a recipe key or value, a differing run identity, a busy or
queued run dir, hardware that cannot run the request) is a `LaunchError`, a `common.cli.ConfigError` (exit 2,
one line); another stage's errors pass through as they are."""
from __future__ import annotations

from common.cli import ConfigError


class LaunchError(ConfigError):
    """Bad input to launch: the message names the key, file or record and the reason."""
