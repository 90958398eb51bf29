"""The docs' own commands, run from their text: the one place README/docs commands are tested.

- Every runnable block in README.md or docs/**/*.md (a plain ```bash fence on the line right after the
  marker `<!-- runnable: cpu -->`, which renders as code on the site and on GitHub and is hidden there) is
  executed, the blocks of one page in order in one scratch directory (a later block may read what an
  earlier one wrote), with bash -euo pipefail and a timeout: a renamed key or a changed default fails here.
  Each must exit 0, but one marked `<!-- runnable: cpu, stops-at: preflight -->` (a GPU study's dry run on a
  CPU; STOPS_AT_PREFLIGHT lists them) must stop at the study's preflight: exit 2, the preflight's lines and
  count printed, no other error (tools/docs_blocks.py).
  Each runs as a reader's shell would: the venv's bin directory taken off PATH, then the README's own
  activation line (`. .venv/bin/activate`) run in the repository, so a page whose commands need more than
  that line fails here; every page that runs commands says that line before its first command.
  tools/check_site.py (run by `make docs`) checks that each of them renders as code on the built site.
- Every line of the README's code blocks as frozen before the docs move (tests/data/readme_lines.json)
  still appears in the README or a docs page, or is listed as dropped with its reason.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from docs_blocks import MARKER, activation_line as readme_activation_line, cpu_blocks, is_marker, outcome_problem  # noqa: E402,F401

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
TIMEOUT_S = 300

# The pages a newcomer follows: each says the activation line before its first command.
COMMAND_PAGES = [ROOT / "README.md", ROOT / "docs" / "getting-started.md", *sorted((ROOT / "docs" / "how-to").glob("*.md"))]


def activation_line() -> str:
    """The one line README.md's set-up gives to put the commands on PATH (`make venv` prints it too)."""
    line = readme_activation_line((ROOT / "README.md").read_text(encoding="utf-8"))
    assert line, "README.md's set-up gives no line that activates .venv"
    return line


def reader_env() -> dict:
    """This environment as a shell that activated nothing: no venv on PATH, no VIRTUAL_ENV, no PYTHONPATH."""
    venvs = {os.path.realpath(sys.prefix), os.path.realpath(ROOT / ".venv")}
    path = [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and not any(os.path.realpath(d).startswith(v + os.sep) for v in venvs)]
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    return dict(env, PATH=os.pathsep.join(path), WANDB_MODE="disabled")


def run_block(body: str, cwd: Path, activate: str | None = None) -> subprocess.CompletedProcess:
    """`body` in bash -euo pipefail in `cwd`, after the documented activation line ran in the repository
    (`activate=""`: none)."""
    activate = activation_line() if activate is None else activate
    script = f"cd {shlex.quote(str(ROOT))}\n{activate}\ncd {shlex.quote(str(cwd))}\n{body}"
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=reader_env(), capture_output=True,
                          text=True, timeout=TIMEOUT_S)


def _pages_with_blocks() -> list[Path]:
    return [p for p in PAGES if cpu_blocks(p.read_text(encoding="utf-8"))]


def test_there_are_runnable_blocks():
    assert {p.name for p in _pages_with_blocks()} >= {"getting-started.md", "data-prep.md", "launch.md"}


@pytest.mark.parametrize("page", _pages_with_blocks(), ids=lambda p: str(p.relative_to(ROOT)))
def test_cpu_blocks_run(page, tmp_path):
    for line, body, stop in cpu_blocks(page.read_text(encoding="utf-8")):
        proc = run_block(body, tmp_path)
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
        why = outcome_problem(stop, proc.returncode, proc.stderr)
        assert why is None, f"{page.relative_to(ROOT)}:{line}: {why}\n" + "\n".join(tail)


# The blocks marked `<!-- runnable: cpu, stops-at: preflight -->`: a GPU study's dry run on a CPU, which its
# preflight stops (exit 2) since no environment here has vllm or trl 1.9.2; the dry run shows its plan first.
STOPS_AT_PREFLIGHT = {("docs/studies.md", "launch study=qwen3_4b_spa_grpo model=tiny_base train:grpo.enable_thinking=auto dry_run=true"),
                      ("docs/how-to/slurm.md", "launch study=dual_terminator_sft launcher=slurm")}


def test_the_blocks_expected_to_stop_at_the_preflight_are_the_gpu_studies_dry_runs():
    marked = {(str(p.relative_to(ROOT)), body) for p in PAGES
              for _, body, stop in cpu_blocks(p.read_text(encoding="utf-8")) if stop == "preflight"}
    assert {(page, next(x for x in body.splitlines() if x.startswith("launch study="))[:len(start)])
            for page, body in marked for p, start in STOPS_AT_PREFLIGHT if p == page} == STOPS_AT_PREFLIGHT
    assert len(marked) == len(STOPS_AT_PREFLIGHT)


def test_a_block_expected_to_stop_at_the_preflight_must_stop_there(tmp_path):
    """The marker's check: exit 2 with the preflight's lines and count passes; exit 0, another error, or a
    count that does not match fails."""
    text = "<!-- runnable: cpu, stops-at: preflight -->\n```bash\n{}\n```\n"
    stopped = ("echo 'error: preflight: stage report (analyze): lacks vllm' >&2; "
               "echo 'preflight: 1 problem(s); the plan follows, and the dry run exits 2' >&2; exit 2")
    cases = {stopped: True, "true": False, stopped.replace("preflight: 1", "preflight: 2"): False,
             "echo 'error: unknown key' >&2; " + stopped: False, "echo 'error: unknown key' >&2; exit 2": False}
    for body, ok in cases.items():
        [(line, got, stop)] = cpu_blocks(text.format(body))
        proc = run_block(got, tmp_path, activate="")
        assert (line, stop) == (1, "preflight") and (outcome_problem(stop, proc.returncode, proc.stderr) is None) == ok, body


def test_the_commands_need_the_documented_activation_and_nothing_else(tmp_path):
    """Issue 65 item 1: a shell that activated nothing finds no `launch`; after README's line it does."""
    if not (ROOT / ".venv" / "bin" / "activate").is_file() or \
            os.path.realpath(sys.prefix) != os.path.realpath(ROOT / ".venv"):
        pytest.skip(f"the tests run outside {ROOT / '.venv'} (the environment README's set-up makes)")
    bare = run_block("command -v launch", tmp_path, activate="")
    assert bare.returncode != 0, f"launch found without activation: {bare.stdout}"
    active = run_block("command -v launch data-prep evaluate analyze", tmp_path)
    assert active.returncode == 0 and active.stdout.count(str(ROOT / ".venv" / "bin")) == 4, active.stderr


def first_command_end(text: str) -> int:
    """Where the page's first code block that runs a project command ends (the page's end if none does)."""
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    words = re.compile(r"^\s*(?:" + "|".join(map(re.escape, scripts)) + r"|python -m)\b", re.M)
    for m in re.finditer(r"^```bash[ \t]*\n(.*?)^```", text, re.M | re.S):
        if words.search(m.group(1)):
            return m.end()
    return len(text)


@pytest.mark.parametrize("page", COMMAND_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_each_page_says_how_to_activate_before_its_first_command(page):
    text = page.read_text(encoding="utf-8")
    head = text[:first_command_end(text)]
    line = activation_line()
    assert line in head, f"{page.relative_to(ROOT)}: `{line}` is not before its first command"


def test_a_block_with_a_renamed_key_fails(tmp_path):
    """The runner reports a broken command: one key renamed in an otherwise good block."""
    text = f"{MARKER}\n```bash\ndata-prep arm=mixed tokenizer=tiny out=m data=synthetic nn=8\n```\n"
    [(line, body, stop)] = cpu_blocks(text)
    proc = run_block(body, tmp_path)
    assert line == 1 and stop is None and proc.returncode == 2 and "unknown key 'nn'" in proc.stderr


def test_frozen_readme_lines_are_kept_or_dropped_with_a_reason():
    fixture = json.loads((ROOT / "tests" / "data" / "readme_lines.json").read_text(encoding="utf-8"))
    corpus = "\n".join(" ".join(line.split()) for p in PAGES for line in p.read_text(encoding="utf-8").splitlines())
    dropped = fixture["dropped"]
    assert all(reason.strip() for reason in dropped.values()), "a dropped line needs its reason"
    lost = [x for x in fixture["lines"] if x not in dropped and " ".join(x.split()) not in corpus]
    assert not lost, "README command lines in no page and not dropped with a reason:\n" + "\n".join(lost)


def test_the_newcomer_walk_s_shell_activated_nothing_and_reaches_no_hub(tmp_path):
    """tools/newcomer_walk.py (.ci/run's newcomer tier): README's set-up line is `make venv`; its shell has no
    virtual environment on PATH, no VIRTUAL_ENV, no HF_HUB_OFFLINE or other hub/project setting, a home of its own,
    and a hub endpoint that refuses connections."""
    import socket

    from newcomer_walk import newcomer_env, venv_free_path
    from docs_blocks import setup_command

    assert setup_command((ROOT / "README.md").read_text(encoding="utf-8"), "venv") == "make venv"
    venv = tmp_path / "v"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    assert venv_free_path(f"{venv / 'bin'}{os.pathsep}/usr/bin") == "/usr/bin"
    base = {"PATH": f"{venv / 'bin'}{os.pathsep}/usr/bin", "VIRTUAL_ENV": str(venv), "HF_HUB_OFFLINE": "1",
            "HF_HOME": "/somewhere", "DTSFT_SHARED": "/work/shared", "XDG_CACHE_HOME": "/c", "LANG": "C.UTF-8"}
    hold = socket.socket()
    hold.bind(("127.0.0.1", 0))
    try:
        url = f"http://127.0.0.1:{hold.getsockname()[1]}"
        env = newcomer_env(base, tmp_path, url)
        assert env["PATH"] == "/usr/bin" and env["LANG"] == "C.UTF-8" and env["HF_ENDPOINT"] == url
        assert not {"VIRTUAL_ENV", "HF_HUB_OFFLINE", "HF_HOME", "DTSFT_SHARED", "XDG_CACHE_HOME"} & set(env)
        assert Path(env["HOME"]).is_relative_to(tmp_path) and Path(env["TMPDIR"]).is_relative_to(tmp_path)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", hold.getsockname()[1]), timeout=5)
    finally:
        hold.close()
