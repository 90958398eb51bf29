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


def test_an_uncached_hub_id_while_the_hub_is_unreachable_is_one_line_at_once(tmp_path, monkeypatch, capsys):
    """The trainer's model and tokenizer and evaluate's checkpoint, as data-prep's tokenizer (common.hub): the hub asked
    once, no retries (seen failing: huggingface_hub's 5 retries with backoff per file, ~80 s, for evaluate's one line);
    offline refused at once; a copy in the local hub cache loads from it."""
    import shutil
    import time
    from types import SimpleNamespace

    import huggingface_hub.constants

    from common.hub import hub_cache
    from evals.cli import main as evaluate_main
    from sft.checkpoint import generation_config_for
    from sft.errors import SftError
    from sft.model import build_model, load_tokenizer, model_config

    def unreachable(*args, **kw):
        raise socket.gaierror(-2, "Name or service not known")
    slept = []   # huggingface_hub's backoff before each retry
    monkeypatch.setattr(socket, "getaddrinfo", unreachable)
    monkeypatch.setattr(time, "sleep", slept.append)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    gone = r"=nobody/no-model: not in the local Hugging Face cache .* and the Hugging Face Hub is unreachable \(ConnectError: .*Name or service"
    with pytest.raises(SftError, match="^model.tokenizer" + gone):
        load_tokenizer("nobody/no-model")
    cfg = SimpleNamespace(seed=0, model=SimpleNamespace(path="nobody/no-model", config={}, init="pretrained"))
    with pytest.raises(SftError, match="^model.path" + gone):
        model_config(cfg, "sdpa")
    assert evaluate_main(["ckpt=nobody/no-model", "benches=[search_plan_ood]", "n=1", f"out={tmp_path / 'e'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("error: ckpt=nobody/no-model: not in the local Hugging Face cache"), err
    from evals.dense import DenseError, E5Encoder

    with pytest.raises(DenseError, match="^encoder" + gone):
        E5Encoder("nobody/no-model")
    from rl.checkpoint import CheckpointError, write_start_checkpoint

    with pytest.raises(CheckpointError, match="^model.path" + gone):   # GRPO's start from a hub id
        write_start_checkpoint("nobody/no-model", tmp_path / "start")
    assert not slept
    # a copy in the local hub cache: loaded from it, without retries
    # (huggingface_hub fixed its cache dir at its first import, maybe under another test's HF_HOME: this process's env's)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub_cache()))
    repo = hub_cache() / "models--nobody--cached-model"
    shutil.copytree(TINY_BASE_DIR, repo / "snapshots" / ("0" * 40), ignore=shutil.ignore_patterns("generation_config.json"))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    cfg.model.path = "nobody/cached-model"
    assert len(load_tokenizer("nobody/cached-model")) == 4096
    conf = model_config(cfg, "sdpa")
    assert build_model(cfg, conf, rank=0, device=None).config.vocab_size == 4096
    assert generation_config_for("nobody/cached-model", conf).eos_token_id == [conf.eos_token_id]   # (a file the repo lacks)
    assert write_start_checkpoint("nobody/cached-model", tmp_path / "start")["source"] == "nobody/cached-model"
    assert not slept
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")   # offline: refused without asking
    with pytest.raises(SftError, match="^model.tokenizer=nobody/no-model: not in the local Hugging Face cache .* and HF_HUB_OFFLINE=1"):
        load_tokenizer("nobody/no-model")
