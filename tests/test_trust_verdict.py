"""Issue 62 (Trust V): a command never ends green with a wrong, stale or missing result. An interpreter is
one only if it answers a Python probe; analyze's exit status is the analysis' verdict; the readers of an
eval dir's rows report a torn or mistyped row in one line."""
from __future__ import annotations

import sys

import pytest

from common import interpreter
from launch.analyze import main as analyze_main
from launch.cli import main as launch_main


# ------------------------------------------------------------------ interpreters answer a probe
@pytest.mark.parametrize("program", ["/bin/true", "/bin/echo"])
def test_a_program_that_is_not_python_is_refused_as_an_interpreter_in_one_line(capfd, tmp_path, program):
    """`/bin/true` exits 0 printing nothing, `/bin/echo` prints its arguments back: neither is a Python (both
    passed before: /bin/true as an interpreter holding everything, /bin/echo as `KeyError: '-c'`)."""
    interpreter.missing_modules.cache_clear()
    why = interpreter.check("sft", program, {"torch": "training"})
    assert why is not None and why.startswith(f"python.sft={program} is not a Python interpreter: it exited 0")
    assert analyze_main([f"runs_root={tmp_path / 'runs'}", "launcher=slurm", f"python.eval={program}",
                         "dry_run=true"]) == 2
    err = capfd.readouterr().err
    assert err.startswith(f"error: python.eval={program} is not a Python interpreter") and err.count("\n") == 1
    assert "Traceback" not in err
    assert launch_main(["arm=r2e", "launcher=slurm", "data=synthetic", f"runs_root={tmp_path / 'runs'}",
                        f"python.sft={program}", "dry_run=true"]) == 2
    err = capfd.readouterr().err
    assert err.startswith(f"error: python.sft={program} is not a Python interpreter") and err.count("\n") == 1
    assert not (tmp_path / "runs").exists()


def test_a_python_interpreter_answers_the_probe_with_its_missing_modules():
    interpreter.missing_modules.cache_clear()
    assert interpreter.missing_modules(sys.executable, ("json", "no_such_module_62")) == ("no_such_module_62",)
    assert interpreter.check("eval", sys.executable, {"json": "x"}) is None
