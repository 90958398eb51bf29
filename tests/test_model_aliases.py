"""Issue 65 item 2: one spelling per model alias, resolved without any network call (common.tiny).

`tiny_base` (the spelling of launch, the glossary and the docs) is the embedded pretrained tiny base for every
command; the older `tiny-base` is read as it with a "did you mean" note; `tiny` (random init, no weights) is
refused where weights are loaded, naming the alias that has them; a name close to an alias is refused with a
"did you mean" before anything asks the hub for it. The hub here is a real loopback server that accepts
connections and never answers: a command that asked it would hang until the test's timeout.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from common.cli import ConfigError
from common.tiny import TINY_BASE_DIR, resolve_model_path

ROOT = Path(__file__).resolve().parents[1]
EVALUATE = str(Path(sys.executable).with_name("evaluate"))


@pytest.fixture
def silent_hub():
    """HF_ENDPOINT at a loopback port that accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(64)
        yield f"http://127.0.0.1:{srv.getsockname()[1]}"


def _evaluate(tmp_path, hub, *args):
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_ENDPOINT=hub, WANDB_MODE="disabled")
    return subprocess.run([EVALUATE, *args, "benches=[search_plan_ood]", "n=1", "out=e"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)


def test_each_alias_resolves_locally_in_one_spelling(capsys):
    import common.tiny

    common.tiny._note_old_spelling.cache_clear()   # the note is said once per process: another test may have had it
    assert resolve_model_path("tiny_base") == str(TINY_BASE_DIR)
    assert resolve_model_path("tiny-base") == str(TINY_BASE_DIR)          # the older spelling, normalised
    assert "did you mean tiny_base?" in capsys.readouterr().err
    assert resolve_model_path("tiny", random_ok=True) == "tiny"            # the SFT trainer initialises it
    with pytest.raises(ConfigError, match=r"no weights to load; did you mean tiny_base"):
        resolve_model_path("tiny")
    for near in ("tinybase", "Tiny_Base", "tiny-bse", "tiny_bas"):
        with pytest.raises(ConfigError, match=rf"model {near}: .*did you mean tiny_base\?"):
            resolve_model_path(near)
    for other in ("Qwen/Qwen3-4B", "gpt2", str(TINY_BASE_DIR)):             # hub ids and paths pass through
        assert resolve_model_path(other) == other


def test_evaluate_takes_tiny_base_and_refuses_near_names_before_the_hub(tmp_path, silent_hub):
    ok = _evaluate(tmp_path, silent_hub, "ckpt=tiny_base", "dry_run=true")
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert f"ckpt: {TINY_BASE_DIR}" in ok.stdout
    for name, alias in (("tiny-bas", "tiny_base"), ("tiny", "tiny_base")):
        bad = _evaluate(tmp_path, silent_hub, f"ckpt={name}")   # a real run: today's code asked the hub here
        assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr[-2000:]
        assert f"did you mean {alias}" in bad.stderr
