"""`launch`'s commands: one registry (launch/cli.py COMMANDS / KEYED, as vLLM's CLI_COMMANDS), the same
dispatch and messages as before."""
from __future__ import annotations

import pytest

from common.cli import ConfigError
from launch import cli


def test_every_command_is_one_registry_entry_with_its_help_line(monkeypatch):
    """launch's commands: one entry each (name: what runs it); each named in `launch --help`."""
    assert set(cli.COMMANDS) == {"show", "sweep"} and set(cli.KEYED) == {"study"}
    text = cli.help_text()
    assert all(f"launch {name}" in text or f"launch {name}=" in text for name in (*cli.COMMANDS, *cli.KEYED))
    ran = []
    for name in ("sweep", "show"):
        monkeypatch.setitem(cli.COMMANDS, name, lambda argv, n=name: ran.append((n, argv)) or 0)
    monkeypatch.setitem(cli.KEYED, "study", lambda argv: ran.append(("study", argv)) or 0)
    assert cli.launch_main(["sweep", "arms=[r2e]"]) == 0 and cli.launch_main(["show", "arm=r2e"]) == 0
    assert cli.launch_main(["seed=1", "study=demo"]) == 0
    assert ran == [("sweep", ["arms=[r2e]"]), ("show", ["arm=r2e"]), ("study", ["seed=1", "study=demo"])]
    with pytest.raises(ConfigError, match=r"^launch sweep is for SFT arms; for GRPO use `launch stage=grpo"):
        cli.launch_main(["stage=grpo", "sweep", "arms=[r2e]"])
