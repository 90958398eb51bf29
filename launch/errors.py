"""launch's typed error; another stage's errors pass through as they are."""
from common.cli import ConfigError


class LaunchError(ConfigError):
    """Every refusal of a launch (a recipe key or value, a differing run identity, a busy or queued run dir, hardware
    that cannot run the request), a `common.cli.ConfigError` (exit 2, one line): the message names the key, file or
    record and the reason."""
