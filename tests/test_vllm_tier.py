"""The vLLM and browser tiers' rules, as pytest applies them with this project's conftest and pytest options:
a vllm- or browser-marked test is deselected in the main suite, runs with `-m vllm` / `-m browser`, and there
(DTSFT_VLLM_TIER=1 / DTSFT_BROWSER_TIER=1) a skip fails."""
from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CASES = '''
import pytest

@pytest.mark.vllm
def test_engine():
    pass

@pytest.mark.vllm
def test_engine_missing():
    pytest.importorskip("no_such_module_dtsft")

@pytest.mark.browser
def test_page():
    pass

@pytest.mark.browser
def test_page_missing():
    pytest.importorskip("no_such_module_dtsft")

def test_plain():
    pass
'''


def _pytest(tmp_path: Path, *args: str, tier: bool = False, tier_env: str = "DTSFT_VLLM_TIER",
            cases: str = CASES) -> subprocess.CompletedProcess:
    opts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    markers = "\n".join(f"    {m}" for m in opts["markers"])
    (tmp_path / "pytest.ini").write_text(f"[pytest]\naddopts = {opts['addopts']}\nmarkers =\n{markers}\n")
    (tmp_path / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    (tmp_path / "test_cases.py").write_text(cases)
    env = {k: v for k, v in os.environ.items() if k not in ("DTSFT_VLLM_TIER", "DTSFT_BROWSER_TIER", "DTSFT_SLURM_TIER")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])  # the conftest's plugin, tests.shared_guard
    if tier:
        env[tier_env] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)


def test_main_suite_deselects_vllm_tests(tmp_path):
    r = _pytest(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 passed, 4 deselected" in r.stdout


def test_vllm_tier_counts_a_skip_as_a_failure(tmp_path):
    r = _pytest(tmp_path, "-m", "vllm", tier=True)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "1 failed, 1 passed, 3 deselected" in r.stdout
    assert "vllm-tier test skipped" in r.stdout and "no_such_module_dtsft" in r.stdout
    # outside the tier (a developer running `-m vllm` by hand) a skip stays a skip
    r = _pytest(tmp_path, "-m", "vllm")
    assert r.returncode == 0 and "1 passed, 1 skipped" in r.stdout, r.stdout


def test_vllm_tier_with_no_test_fails(tmp_path):
    r = _pytest(tmp_path, "-m", "vllm", "-k", "nothing_matches", tier=True)
    assert r.returncode == 5  # .ci/run runs under `set -e`: exit 5 ("no tests ran") fails CI


def test_browser_tier_counts_a_skip_as_a_failure(tmp_path):
    r = _pytest(tmp_path, "-m", "browser", tier=True, tier_env="DTSFT_BROWSER_TIER")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "1 failed, 1 passed, 3 deselected" in r.stdout
    assert "browser-tier test skipped" in r.stdout and "no_such_module_dtsft" in r.stdout
    # the vLLM tier's switch does not turn a browser test's skip into a failure, nor the other way round
    r = _pytest(tmp_path, "-m", "browser", tier=True)
    assert r.returncode == 0 and "1 passed, 1 skipped" in r.stdout, r.stdout
    r = _pytest(tmp_path, "-m", "vllm", tier=True, tier_env="DTSFT_BROWSER_TIER")
    assert r.returncode == 0 and "1 passed, 1 skipped" in r.stdout, r.stdout


def test_ci_runs_the_browser_tier_where_a_skip_fails():
    """.ci/run runs `make test-browser` as a timed tier (target 180 s), and that target sets the tier's switch."""
    ci = (ROOT / ".ci" / "run").read_text()
    assert "\ntier browser make test-browser\n" in ci and "[browser]=180" in ci
    make = (ROOT / "Makefile").read_text()
    recipe = make[make.index("\ntest-browser:"):].split("\n\n")[0]
    assert "DTSFT_BROWSER_TIER=1" in recipe and "-m browser" in recipe and "SE_OFFLINE=true" in recipe
    assert "apt-get install" in recipe and ".[browser]" in recipe


SLURM_CASES = '''
import pytest

@pytest.mark.slurm
def test_cluster():
    pass

@pytest.mark.slurm
def test_cluster_missing():
    pytest.skip("no slurmctld")

def test_plain():
    pass
'''


def test_slurm_tier_deselected_in_the_main_suite_and_a_skip_fails_there(tmp_path):
    r = _pytest(tmp_path, cases=SLURM_CASES)
    assert r.returncode == 0 and "1 passed, 2 deselected" in r.stdout, r.stdout + r.stderr
    r = _pytest(tmp_path, "-m", "slurm", tier=True, tier_env="DTSFT_SLURM_TIER", cases=SLURM_CASES)
    assert r.returncode == 1 and "1 failed, 1 passed, 1 deselected" in r.stdout, r.stdout
    assert "slurm-tier test skipped" in r.stdout and "no slurmctld" in r.stdout
    r = _pytest(tmp_path, "-m", "slurm", "-k", "nothing_matches", tier=True, tier_env="DTSFT_SLURM_TIER", cases=SLURM_CASES)
    assert r.returncode == 5
    ci = (ROOT / ".ci" / "run").read_text()
    assert "\ntier slurm make test-slurm\n" in ci and "[slurm]=360" in ci
    make = (ROOT / "Makefile").read_text()
    recipe = make[make.index("\ntest-slurm:"):].split("\n\n")[0]
    assert "DTSFT_SLURM_TIER=1" in recipe and "-m slurm" in recipe and "apt-get install" in recipe and "slurm-wlm munge" in recipe


def test_installed_or_skip_skips_a_missing_module_and_imports_none():
    """The vLLM tests that only use vLLM in a subprocess check for it with installed_or_skip: a skip (a failure
    in the tier) when it is missing, and no import in the pytest worker when it is there."""
    import pytest

    from tests.conftest import installed_or_skip

    with pytest.raises(pytest.skip.Exception, match="no_such_module_dtsft is not installed"):
        installed_or_skip("no_such_module_dtsft")
    sys.modules.pop("colorsys", None)
    installed_or_skip("colorsys")
    assert "colorsys" not in sys.modules
