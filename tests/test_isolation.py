"""A test run keeps its temp files and caches in a dir of its own (tests/conftest.py), for itself and every
process it starts, and pytest's tmp_path outside it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def test_the_session_dir_holds_the_temp_dir_and_caches_of_the_tests_and_of_what_they_start(tmp_path):
    session = Path(os.environ["DTSFT_DATA"]).parent
    assert session.name.startswith("dtsft-tests-") and session.parent == Path(os.environ["DTSFT_TESTS_USER_TMP"])
    probe = ("import json, os, tempfile; print(json.dumps([tempfile.gettempdir(), tempfile.mkdtemp(prefix='torchelastic_'),"
             " os.environ['XDG_CACHE_HOME'], os.environ['DTSFT_DATA']]))")
    child = json.loads(subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True).stdout)
    for where in [tempfile.gettempdir(), tempfile.mkdtemp(), *child]:
        assert Path(where).is_relative_to(session), where
    # pytest's own dirs stay where pytest keeps them (and short: the Slurm tests put a munge socket there)
    assert not tmp_path.is_relative_to(session)
    assert tmp_path.is_relative_to(Path(os.environ["DTSFT_TESTS_USER_TMP"]))


def test_a_wandb_run_in_a_test_leaves_the_home_dir_as_it_was(tmp_path):
    """wandb's system monitor (wandb-symon) keeps its debug log in $WANDB_CACHE_DIR, else ~/.cache/wandb, whatever
    $XDG_CACHE_HOME says: the session sets $WANDB_CACHE_DIR (and $WANDB_DATA_DIR) to dirs of its own. A child with
    its home in tmp_path runs an offline wandb run; nothing is written under that home."""
    home = tmp_path / "home"
    home.mkdir()
    script = ("import sys, wandb; run = wandb.init(mode='offline', project='isolation', dir=sys.argv[1]);"
              " run.log({'x': 1}); run.finish()")
    env = {**os.environ, "HOME": str(home), "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    subprocess.run([sys.executable, "-c", script, str(tmp_path / "wandb-dir")], check=True, env=env, capture_output=True,
                   text=True, timeout=300)
    assert (tmp_path / "wandb-dir" / "wandb").is_dir()   # the run did run
    assert not [p for p in home.rglob("*")], sorted(map(str, home.rglob("*")))
    for var in ("WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        assert Path(os.environ[var]).is_relative_to(Path(os.environ["DTSFT_DATA"]).parent), var
