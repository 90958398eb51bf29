"""Integrity under hostile or careless input (issue 13): nothing a user owns is lost, nothing in a
run directory is executed, corruption is detected, one bad record never kills a build."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from common.io import atomic_dir, replace_aside  # noqa: F401  (replace_aside: the overwrite meaning)

ROOT = Path(__file__).resolve().parents[1]
SMALL = {"kind": "synthetic", "n": 4, "synthetic": {"n_entities": 40}}


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


# ---------------------------------------------------------------- never delete what we did not write


def test_data_prep_out_holding_user_files_and_its_source_is_refused(tmp_path, capsys):
    from data_prep.cli import main

    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("my notes")
    src = out / "src.jsonl"
    src.write_text("{}\n")
    code = main(["arm=search", "data=synthetic", "n=4", "out=" + str(out), "overwrite=true",
                 f"sources.search=[canonical:{src}]"])
    err = capsys.readouterr().err
    assert code == 2 and "contains the input" in err and err.count("\n") == 1
    (out / "src.jsonl").unlink()  # no source inside any more: still not a data-prep output
    code = main(["arm=search", "data=synthetic", "n=4", "out=" + str(out), "overwrite=true"])
    err = capsys.readouterr().err
    assert code == 2 and "not an output of this command" in err and "notes.txt" in err
    assert (out / "notes.txt").read_text() == "my notes"
    (tmp_path / "afile").write_text("x")
    assert main(["arm=search", "data=synthetic", "n=4", "out=" + str(tmp_path / "afile")]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_data_prep_overwrite_renames_the_old_output_aside(tmp_path, capsys):
    from data_prep import build
    from data_prep.cli import main

    out = tmp_path / "arm"
    build.build_arm(SMALL, arm="search", seed=0, tokenizer="tiny", out=out, progress=False)
    first = (out / "manifest.json").read_text()
    (out / "user-added.txt").write_text("keep me")
    assert main(["arm=search", "data=synthetic", "n=4", "synthetic.n_entities=40", "out=" + str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
    build.build_arm(SMALL, arm="search", seed=1, tokenizer="tiny", out=out, progress=False, overwrite=True)
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("arm.replaced-")]
    assert len(aside) == 1 and (aside[0] / "manifest.json").read_text() == first
    assert (aside[0] / "user-added.txt").read_text() == "keep me"
    assert json.loads((out / "manifest.json").read_text())["seed"] == 1


def test_atomic_dir_cleans_only_this_hosts_dead_temp_dirs(tmp_path):
    final = tmp_path / "out"
    host = socket.gethostname()
    dead = tmp_path / f"out.tmp-{host}-{_dead_pid()}"
    live = tmp_path / f"out.tmp-{host}-{os.getppid()}"
    other = tmp_path / f"out.tmp-othernode-{_dead_pid()}"
    for d in (dead, live, other):
        d.mkdir()
    with atomic_dir(final) as tmp:
        assert tmp.name == f"out.tmp-{host}-{os.getpid()}"
        (tmp / "f").write_text("1")
    assert not dead.exists() and live.is_dir() and other.is_dir()
    with pytest.raises(FileExistsError), atomic_dir(final) as tmp:
        (tmp / "f").write_text("2")
    assert (final / "f").read_text() == "1" and not tmp.exists()


def test_export_out_over_its_own_checkpoints_dir_is_refused(tiny_model_dir, tmp_path, capsys):
    import shutil

    from sft.export import export_main

    ckpts = tmp_path / "runs" / "checkpoints"
    src = ckpts / "step-000002"
    shutil.copytree(tiny_model_dir, src)
    shutil.copytree(tiny_model_dir, ckpts / "step-000001")
    (ckpts / "notes.md").write_text("notes")
    before = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    assert export_main([f"ckpt={src}", f"out={ckpts}", "overwrite=true"]) == 2
    assert "contains the input" in capsys.readouterr().err
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == before
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "x").write_text("x")
    assert export_main([f"ckpt={src}", f"out={tmp_path / 'mine'}", "overwrite=true"]) == 2
    assert (tmp_path / "mine" / "x").read_text() == "x"
    # An earlier export is renamed aside, never deleted.
    assert export_main([f"ckpt={src}", f"out={tmp_path / 'exp'}", "dtype=fp32", "verify=false"]) == 0
    assert export_main([f"ckpt={src}", f"out={tmp_path / 'exp'}", "dtype=fp32", "verify=false", "overwrite=true"]) == 0
    assert len(list(tmp_path.glob("exp.replaced-*/model.safetensors"))) == 1
