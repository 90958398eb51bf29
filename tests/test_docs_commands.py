"""Every shell command in README.md and docs/**/*.md is accounted for, and the ones that cannot run here are
dry-run.

The inventory: each command line (continuation lines joined, comments and blank lines left out; in a `console`
fence, the `$ ` lines) of each bash / sh / shell / console / info-less fence is in a block marked, on the line
right above its fence, with one of
- `<!-- runnable: cpu -->` (or `<!-- runnable: cpu, stops-at: preflight -->`): tests/test_docs_blocks.py runs
  the block as it is (tiny model, synthetic data);
- `<!-- dry-run -->`: a GPU / cluster / hub example; this file runs each of its commands in this process with
  `dry_run=true` added (a command without that key: `--help`, and every key and name it uses must be in the
  help; `make TARGET`: `make -n TARGET`), in an empty scratch directory with an empty data cache and the hub
  offline, and asserts exit 0 and that nothing was written there, nor in the checkout;
- `<!-- not-run: REASON -->`: an install or a shell step on a GPU host; the reason is shown to no one (a comment)
  but must be given. Kept few.
A lone `...` in a command stands for keys left out and is dropped, as is a trailing `&` (run in the background);
`export NAME=VALUE` sets NAME for the block's later commands; `$PWD` is the scratch directory. The user's own
files a docs command names (`/data/wiki18.jsonl`, `nq_rollouts.jsonl`, `my.yaml`, a checkpoint, the GPU
environments' interpreters, ...) are small stand-ins in the scratch directory (STAND_INS; `/data/` is its
`data/`): a dry run checks that an input exists and reads as its kind, not what a real one holds. The stand-in
interpreters are this one with `vllm`, `flash_attn` and `liger_kernel` findable (empty packages: the check that
asks an environment for its modules only looks them up; tests/test_launch_slurm.py tests that check).
The preflight (launch/preflight.py) of a study's dry run exits 2 on what a real run would lack: the dry-run
blocks are given what they need, none is marked as stopping there (only two runnable blocks are, the GPU
studies' dry runs on a CPU: tests/test_docs_blocks.py's STOPS_AT_PREFLIGHT): the data cache holds a one-row stand-in of each unpinned set
(never downloaded: a user pre-fills it with `fetch-data NAME from=DIR`), the Hugging Face caches a one-row stand-in
of each source of the shipped data=hub recipe (tests/hub_stand_ins.py: offline, a launch reads what a user who
loaded them once has, its pin and its copy), and each study command on a GPU host
names the environments its stages need (`python.eval=` with vllm, `python.grpo=` with the pinned trl), as a
user's must; a dry run that forgets them exits 2 here, as the user's would.
"""
from __future__ import annotations

import contextlib
import importlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from launch.local import run_main

from tests.hub_stand_ins import shipped_stand_ins
from tests.plan_capture import unpinned_stand_ins
from tests.test_docs_blocks import PAGES, cpu_blocks, is_marker   # the runner of the runnable blocks

ROOT = Path(__file__).resolve().parents[1]

DRY_RUN = "<!-- dry-run -->"
NOT_RUN = re.compile(r"^<!-- not-run:(?P<why>.*)-->$")
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<mark>`{3,}|~{3,})[ \t]*(?P<info>[^`\s]*)")
SHELL = {"bash", "sh", "shell", "console", ""}
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
PYTHON_M = {"demo": "demo.run:main", "launch.grpo": "launch.grpo:main",
            "envs.search_plan_act": "envs.search_plan_act.__main__:main"}
HELP_ONLY = {"verify-checkpoint", "serve-retriever", "fetch-data", "envs.search_plan_act", "data-prep show"}  # no dry_run
CORPUS = ('{"id": "1", "contents": "\\"Seine\\"\\nThe Seine flows through Paris."}\n'
          '{"id": "2", "contents": "\\"Hamlet\\"\\nHamlet is a tragedy by William Shakespeare."}\n')
QUESTIONS = ('{"id": "q1", "question": "Which river flows through Paris?", "golden_answers": ["Seine"]}\n'
             '{"id": "q2", "question": "Who wrote Hamlet?", "golden_answers": ["William Shakespeare"]}\n')
HOTPOT = ('[{"_id": "h1", "question": "Which river flows through Paris?", "answer": "Seine", "type": "bridge", '
          '"level": "easy", "supporting_facts": [["Seine", 0]], "context": [["Seine", ["The Seine flows through '
          'Paris."]]]}]\n')
ROLLOUTS = (ROOT / "docs" / "examples" / "nq_rollouts_example.jsonl").read_text(encoding="utf-8")
STAND_INS = {"data/wiki18.jsonl": CORPUS, "wiki18.jsonl": CORPUS, "data/nq_rollouts.jsonl": ROLLOUTS,
             "nq_rollouts.jsonl": ROLLOUTS, "my_trajectories.jsonl": ROLLOUTS, "traj.jsonl": ROLLOUTS,
             "hotpotqa/train.jsonl": QUESTIONS, "hotpot_train_v1.1.json": HOTPOT,
             "data/my_benches/mybench/test.jsonl": QUESTIONS, "e5_Flat.index": "",
             "my.yaml": "train:\n  lr: 3.0e-4\n", "my_grpo.yaml": "grpo:\n  num_generations: 2\n"}
CHECKPOINTS = ("runs/r2e/seed0/checkpoints/step-000218", "runs/search/seed0/checkpoints/step-000218")
INTERPRETERS = (".venv-train", ".venv-vllm", ".venv-trl1.9.2")


@dataclass
class Block:
    page: Path
    line: int                   # of the fence
    info: str
    marker: str                 # the line above the fence, stripped
    commands: list[tuple[int, str]] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def commands(body: list[str], first: int, console: bool) -> list[tuple[int, str]]:
    """(line, command) of a fence's body: continuations joined; comments, blank lines (and in a console fence,
    output lines) left out."""
    out, pending, start = [], "", 0
    for i, raw in enumerate(body):
        line = raw.strip()
        if not pending:
            if console:
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            start = first + i
        pending += line
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        try:
            words = shlex.split(pending, comments=True)
        except ValueError:   # an unbalanced quote: still a command (the dry run reports it)
            words = [pending]
        if words:
            out.append((start, " ".join(pending.split())))
        pending = ""
    if pending.strip():
        out.append((start, pending.strip()))
    return out


def shell_blocks(page: Path, text: str | None = None) -> list[Block]:
    lines = (page.read_text(encoding="utf-8") if text is None else text).splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        close = re.compile(rf"^[ \t]*{re.escape(m['mark'][0])}{{{len(m['mark'])},}}[ \t]*$")
        j = i + 1
        while j < len(lines) and not close.match(lines[j]):
            j += 1
        if m["info"] in SHELL:
            b = Block(page, i + 1, m["info"], lines[i - 1].strip() if i else "")
            b.commands = commands(lines[i + 1:j], i + 2, m["info"] == "console")
            blocks.append(b)
        i = j + 1
    return blocks


def unaccounted(page: Path, text: str | None = None) -> list[str]:
    """The commands of a page in no runnable, dry-run or (with a reason) not-run block."""
    text = page.read_text(encoding="utf-8") if text is None else text
    run = {line for line, *_ in cpu_blocks(text)}   # marker lines the docs runner picks up
    bad = []
    for b in shell_blocks(page, text):
        if is_marker(b.marker) and b.line - 1 in run:
            continue
        if b.marker == DRY_RUN or ((m := NOT_RUN.match(b.marker)) and m["why"].strip()):
            continue
        why = ("a runnable marker the docs runner does not pick up (the marker must be the line right above a "
               "```bash fence, not indented)" if is_marker(b.marker) else
               "a not-run marker without its reason" if NOT_RUN.match(b.marker) else "no marker")
        bad += [f"{b.page.relative_to(ROOT)}:{line}: {cmd}  <- {why}" for line, cmd in b.commands]
    return bad


def test_every_docs_command_is_run_dry_run_or_marked_not_run():
    blocks = [b for p in PAGES for b in shell_blocks(p)]
    assert sum(len(b.commands) for b in blocks) > 100      # the extraction finds the commands
    bad = [x for p in PAGES for x in unaccounted(p)]
    assert bad == [], "commands the docs test neither runs nor dry-runs (mark each block):\n" + "\n".join(bad)
    not_run = [b for b in blocks if NOT_RUN.match(b.marker)]
    assert len(not_run) <= 8, "not-run blocks are for installs on a GPU host only: " + ", ".join(b.where for b in not_run)


def test_the_inventory_catches_an_unmarked_or_misplaced_block():
    text = ("# p\n\n```bash\nlaunch arm=r2e \\\n    steps=3   # one command\n# a comment\n\nanalyze x=1\n```\n\n"
            "<!-- not-run: -->\n```sh\nmake venv\n```\n\n"
            "  <!-- runnable: cpu -->\n  ```bash\n  data-prep --help\n  ```\n\n"
            "<!-- not-run: a GPU host -->\n```bash\npip install flash-attn\n```\n\n"
            "```console\n$ evaluate --help\nusage: evaluate ...\n```\n\n```text\nnot a command\n```\n")
    bad = unaccounted(ROOT / "docs" / "p.md", text)
    assert [x.split("  <- ")[0] for x in bad] == [
        "docs/p.md:4: launch arm=r2e steps=3 # one command", "docs/p.md:8: analyze x=1", "docs/p.md:13: make venv",
        "docs/p.md:18: data-prep --help", "docs/p.md:27: evaluate --help"]
    assert "not-run marker without its reason" in bad[2] and "does not pick up" in bad[3] and "no marker" in bad[4]


# ---- the dry runs -------------------------------------------------------------------------------------------

def program(words: list[str]) -> tuple[str, list[str]]:
    """(the program's name as the docs call it, its arguments) of one command's words."""
    if words[0] in ("python", "python3") and len(words) > 2 and words[1] == "-m":
        return words[2], words[3:]
    return words[0], words[1:]


def entry(name: str):
    target = SCRIPTS.get(name) or PYTHON_M.get(name)
    if target is None:
        raise AssertionError(f"{name!r} is not a project command (pyproject [project.scripts] or {sorted(PYTHON_M)}):"
                             " a dry-run block holds project commands only; mark an install step not-run")
    module, func = target.split(":")
    return getattr(importlib.import_module(module), func)


def dry_argv(name: str, args: list[str]) -> tuple[list[str], list[str]]:
    """(the argv the dry run calls, the words the help must name: empty unless the command has no dry_run)."""
    args = [a for a in args if a != "..."]
    if any(a in ("-h", "--help") for a in args):
        return args, []
    sub = args[:1] if args and "=" not in args[0] and f"{name} {args[0]}" in HELP_ONLY else []
    if name in HELP_ONLY or sub:
        sub = args[:1] if name == "envs.search_plan_act" and args else sub
        named = [a.split("=", 1)[0] for a in args[len(sub):] if "=" in a]
        named += [a for a in args[len(sub):] if "=" not in a and ":" in a and "/" not in a]   # fetch-data NAMEs
        return [*sub, "--help"], named
    return [*args, *([] if any(a.startswith("dry_run=") for a in args) else ["dry_run=true"])], []


def files_under(path: Path) -> list[str]:
    """Every file and folder under `path`, with its size and modification time (a rewrite shows)."""
    return sorted(f"{p.relative_to(path)} {p.lstat().st_size} {p.lstat().st_mtime_ns}" for p in path.rglob("*"))


def _dry_run_blocks() -> list[Block]:
    return [b for p in PAGES for b in shell_blocks(p) if b.marker == DRY_RUN]


@pytest.fixture(scope="module")
def checkout_status():
    """The checkout is as it was after the dry runs: git's status, and its top-level entries (runs/, reports/ and
    the like are git-ignored, so a dry run writing one there would not show in the status)."""
    def status() -> tuple[str, list[str]]:
        git = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT,
                             capture_output=True, text=True).stdout if (ROOT / ".git").exists() else ""
        return git, sorted(p.name for p in ROOT.iterdir() if p.name not in ("__pycache__", ".pytest_cache"))
    before = status()
    yield before
    assert status() == before, "a dry run wrote into the checkout"


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """(the scratch directory the dry runs start in, their environment): built once for the module (every dry
    run asserts that it leaves the directory as it found it, so one run cannot change the next; the named
    interpreters keep one path, so each is asked for its modules once)."""
    from sft.tiny import save_tiny_model

    top = tmp_path_factory.mktemp("docs_dry_runs")
    work, cache, hf = top / "work", top / "cache", top / "hf"
    for d in (cache, hf):
        d.mkdir()
    for rel, text in STAND_INS.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(text, encoding="utf-8")
    save_tiny_model(work / CHECKPOINTS[0], seed=0)
    for rel in CHECKPOINTS[1:]:
        shutil.copytree(work / CHECKPOINTS[0], work / rel)
    stubs = top / "stubs"
    for module in ("vllm", "flash_attn", "liger_kernel"):
        (stubs / module).mkdir(parents=True)
        (stubs / module / "__init__.py").write_text("")
    trl = top / "stubs-trl"   # the references' trl release, as `make venv-trl` layers it
    (trl / "trl-1.9.2.dist-info").mkdir(parents=True)
    (trl / "trl-1.9.2.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: trl\nVersion: 1.9.2\n")
    for venv in INTERPRETERS:
        python = work / venv / "bin" / "python"
        python.parent.mkdir(parents=True)
        path = f"{trl}{os.pathsep}{stubs}" if "trl" in venv else str(stubs)
        python.write_text(f'#!/bin/sh\nPYTHONPATH="{path}" exec {sys.executable} "$@"\n')
        python.chmod(0o755)
    with pytest.MonkeyPatch.context() as mp:   # the unpinned sets a user pre-fills from their copy (the preflight asks)
        mp.setenv("DTSFT_DATA", str(cache))
        unpinned_stand_ins(top)
    shipped_stand_ins(hf)   # data=hub's sources as a user who loaded them once has them (offline, the preflight asks)
    env = dict(os.environ, DTSFT_DATA=str(cache), HF_HOME=str(hf), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               WANDB_MODE="disabled", PWD=str(work))
    return work, env


def dry_run(block: Block, work: Path, env: dict[str, str]) -> None:
    """Each command of a dry-run block, in order, from `work`; an AssertionError naming the page, line and what
    went wrong for a command that fails, does not name its keys in its help, or writes under `work.parent`."""
    env, before = dict(env), files_under(work.parent)
    for line, cmd in block.commands:
        where = f"{block.page.relative_to(ROOT)}:{line}"
        text = re.sub(r"(?<=[=\s,\[])/data/", f"{work}/data/", cmd.replace("$PWD", str(work)))
        words = shlex.split(text, comments=True)
        words = words[:-1] if words[-1] == "&" else words
        if words[0] == "export" and len(words) == 2 and "=" in words[1]:
            env.__setitem__(*words[1].split("=", 1))
            continue
        if words[0] == "make":
            proc = subprocess.run(["make", "-n", *words[1:]], cwd=ROOT, capture_output=True, text=True, timeout=60)
            assert proc.returncode == 0, f"{where}: `make -n {shlex.join(words[1:])}` exited {proc.returncode}\n" + proc.stderr[-600:]
            continue
        name, args = program(words)
        argv, named = dry_argv(name, args)
        out, err = io.StringIO(), io.StringIO()
        cwd = os.getcwd()
        os.chdir(work)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                rc = run_main(entry(name), argv, env=env)
        finally:
            os.chdir(cwd)
        said = out.getvalue() + err.getvalue()
        tail = "\n".join(said.strip().splitlines()[-6:])
        assert rc == 0, f"{where}: `{name} {' '.join(argv)}` exited {rc}\n{tail}"
        missing = [w for w in named if not re.search(rf"(?<![\w.-]){re.escape(w)}(?![\w-])", said)]
        assert not missing, f"{where}: {name} --help does not name {missing}"
        wrote = sorted(set(files_under(work.parent)) ^ set(before))
        assert not wrote, f"{where}: the dry run wrote {wrote}"


@pytest.mark.parametrize("block", _dry_run_blocks(), ids=lambda b: b.where)
def test_dry_run_examples_run_and_write_nothing(block, scratch, checkout_status):
    dry_run(block, *scratch)


def test_a_failing_or_writing_or_misnamed_dry_run_is_reported(scratch):
    work, env = scratch
    page = ROOT / "docs" / "p.md"
    with pytest.raises(AssertionError, match=r"docs/p.md:3: `launch arm=r2e model=tiny stepz=3 dry_run=true` exited 2"):
        dry_run(Block(page, 2, "bash", DRY_RUN, [(3, "launch arm=r2e model=tiny stepz=3")]), work, env)
    with pytest.raises(AssertionError, match=r"docs/p.md:4: verify-checkpoint --help does not name \['laod'\]"):
        dry_run(Block(page, 2, "bash", DRY_RUN, [(4, "verify-checkpoint exports/x laod=false")]), work, env)
    try:   # dry_run=false given: a real export, which the check sees
        with pytest.raises(AssertionError, match=r"docs/p.md:5: the dry run wrote .*'work/exp "):
            dry_run(Block(page, 2, "bash", DRY_RUN, [(5, f"export-checkpoint ckpt={CHECKPOINTS[0]} out=exp dry_run=false")]),
                    work, env)
    finally:
        shutil.rmtree(work / "exp", ignore_errors=True)


def test_the_dry_run_argv():
    assert dry_argv("launch", ["arm=r2e", "..."]) == (["arm=r2e", "dry_run=true"], [])
    assert dry_argv("analyze", ["runs_root=runs", "dry_run=true"]) == (["runs_root=runs", "dry_run=true"], [])
    assert dry_argv("launch", ["stage=grpo", "--help"]) == (["stage=grpo", "--help"], [])
    assert dry_argv("fetch-data", ["nq:seed42_1000", "from=/mnt/x"]) == (["--help"], ["from", "nq:seed42_1000"])
    assert dry_argv("verify-checkpoint", ["exports/a", "load=false"]) == (["--help"], ["load"])
    assert dry_argv("envs.search_plan_act", ["export", "out=d.jsonl", "n=5"]) == (["export", "--help"], ["out", "n"])
    assert program(["python", "-m", "demo", "dry_run=true"]) == ("demo", ["dry_run=true"])
    with pytest.raises(AssertionError, match="not a project command"):
        entry("pip")
