"""launch.torchrun: torch's torchrun with a failed worker in one line and its own exit code. The
oracle for "what torchrun does otherwise" is torch's own `python -m torch.distributed.run`."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _torchrun(module: str, script: Path, nproc: int = 1):
    return subprocess.run([sys.executable, "-m", module, "--standalone", "--nnodes=1", f"--nproc_per_node={nproc}",
                           str(script)], cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("body, code, line", [
    ('import sys\nprint("error: refused for a reason", file=sys.stderr)\nsys.exit(2)\n', 2, "exited with code 2"),
    ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", 137, "was killed by signal 9"),
])
def test_a_failed_worker_is_one_line_with_its_own_exit_code(tmp_path, body, code, line):
    script = tmp_path / "worker.py"
    script.write_text(body)
    theirs = _torchrun("torch.distributed.run", script)
    assert theirs.returncode == 1 and "ChildFailedError" in theirs.stderr and "Traceback" in theirs.stderr
    ours = _torchrun("launch.torchrun", script)
    assert ours.returncode == code, ours.stderr
    assert "Traceback" not in ours.stderr and "ChildFailedError" not in ours.stderr, ours.stderr
    summary = [s for s in ours.stderr.splitlines() if s.startswith("[torchrun]")]
    assert len(summary) == 1 and line in summary[0] and "worker.py: rank 0" in summary[0], ours.stderr
    if code == 2:   # the worker's own message is untouched
        assert "error: refused for a reason" in ours.stderr


def test_a_clean_run_is_torchruns(tmp_path):
    script = tmp_path / "worker.py"
    # one write per line: print() of several pieces under PYTHONUNBUFFERED writes each piece on its own, and two
    # ranks' pieces can interleave on the shared pipe ('rankrank 0 of 2', a fresh-clone run at fa2d65d)
    script.write_text('import os\nos.write(1, f"rank {os.environ[\'RANK\']} of {os.environ[\'WORLD_SIZE\']}\\n".encode())\n')
    ours = _torchrun("launch.torchrun", script, nproc=2)
    assert ours.returncode == 0, ours.stderr
    assert sorted(s for s in ours.stdout.splitlines() if s.startswith("rank")) == ["rank 0 of 2", "rank 1 of 2"]
