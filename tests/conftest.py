"""Shared pytest fixtures. `../shared` is optional: tests that need it skip with the reason."""
from __future__ import annotations

import atexit
import getpass
import importlib.util
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("DTSFT_SHARED", ROOT.parent / "shared"))

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Under pytest-xdist the cores are shared among the workers: each worker (and every trainer, evaluate or CLI it
# starts, which inherit the variables) gets cores/workers intra-op threads, not all of them. N workers x all
# cores oversubscribes the machine, and OpenMP's spinning threads then slow every test several-fold. Set before
# anything imports torch; a value the caller exported wins.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    _THREADS = str(max(1, (os.cpu_count() or 1) // _WORKERS))
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, _THREADS)
# Every cache a test run fills is this session's own, never the developer's ~/.cache: the data cache
# (common.datafetch, $DTSFT_DATA) and $XDG_CACHE_HOME (the BM25 and e5 indexes, the file-digest cache, and what
# matplotlib and the HF libraries keep there; wandb's: $WANDB_CACHE_DIR, $WANDB_DATA_DIR), in one temp dir the
# process that made it removes at exit (trainers, CLIs and Slurm jobs the tests start inherit the variables). vLLM's own cache stays where vLLM keeps it
# ($VLLM_CACHE_ROOT, default ~/.cache/vllm: facts about a model class it would otherwise work out in a
# subprocess for every engine). No download leaves this machine: a test that needs a cached file pre-fills it
# from ../shared or serves it on a loopback port. pytest_sessionfinish fails a run that wrote into the
# developer's ~/.cache/dtsft anyway.
# The temp dir ($TMPDIR, tempfile's) is the session's too: what a test run's processes make there and never
# remove (torchrun's empty torchelastic_* log dirs, vLLM's IPC sockets, chromium's profiles) goes with it, not into
# the machine's /tmp. pytest's own tmp_path dirs stay under the caller's temp dir (PYTEST_DEBUG_TEMPROOT), kept the
# way pytest keeps them, and short enough for the Slurm tests' munge socket; so does the cache of the kernels
# torch's inductor compiles for vLLM's sampler (its default, /tmp/torchinductor_<user>: a cache, like vLLM's).
_STARTED = time.time()
# (the caller's cache and temp dir, kept for xdist's workers, which start with this process's variables)
_USER_CACHE = Path(os.environ.setdefault("DTSFT_TESTS_USER_CACHE", os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")))
_USER_TMP = os.environ.setdefault("DTSFT_TESTS_USER_TMP", tempfile.gettempdir())
USER_PROJECT_CACHE = _USER_CACHE / "dtsft"
_SESSION_TMP = tempfile.mkdtemp(prefix="dtsft-tests-", dir=_USER_TMP)
atexit.register(shutil.rmtree, _SESSION_TMP, ignore_errors=True)
os.environ.setdefault("VLLM_CACHE_ROOT", str(_USER_CACHE / "vllm"))
os.environ["XDG_CACHE_HOME"] = os.path.join(_SESSION_TMP, "cache")
# wandb's system monitor keeps its debug logs in $WANDB_CACHE_DIR, else ~/.cache/wandb (not $XDG_CACHE_HOME); its
# artefact staging is $WANDB_DATA_DIR, else ~/.local/share/wandb
os.environ["WANDB_CACHE_DIR"] = os.path.join(_SESSION_TMP, "cache", "wandb")
os.environ["WANDB_DATA_DIR"] = os.path.join(_SESSION_TMP, "data-wandb")
os.environ["DTSFT_DATA"] = os.path.join(_SESSION_TMP, "data")
os.makedirs(os.environ["DTSFT_DATA"])
# The session's Hugging Face caches (under $XDG_CACHE_HOME, where HF_HOME and its parts are not set) hold the
# shipped data=hub sources as a user who loaded them once has them: offline, the preflight asks for them before
# a launch, sweep or study of data=hub starts (tests/hub_stand_ins.py). A test that wants a cold cache sets its
# own HF_HOME (tests/test_preflight_hub.py).
if not any(os.environ.get(v) for v in ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_DATASETS_CACHE")):
    from tests.hub_stand_ins import shipped_stand_ins

    shipped_stand_ins(Path(os.environ["XDG_CACHE_HOME"]) / "huggingface")
os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", _USER_TMP)
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(_USER_TMP, "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())))
os.environ["TMPDIR"] = tempfile.tempdir = os.path.join(_SESSION_TMP, "tmp")
os.makedirs(tempfile.tempdir)
os.environ.setdefault("DTSFT_DATA_ENDPOINT", "http://127.0.0.1:9")

# The read-only guard: a test that writes into an artefact other tests read in place is an error.
pytest_plugins = ["tests.shared_guard"]


def shared_path(*parts: str) -> Path:
    """Path under ../shared, or skip the test naming what is missing."""
    p = SHARED.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"needs {p} (the ../shared fixtures are not present on this machine)")
    return p


def installed_or_skip(module: str) -> None:
    """Skip unless `module` is installed, without importing it (pytest.importorskip imports it): for a test
    that only uses it in a subprocess. Importing vLLM costs a pytest worker ~15 s of CPU."""
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed in the environment of {sys.executable}")


@pytest.fixture(scope="session")
def qwen3_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(shared_path("fixtures", "qwen3_tokenizer")))


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from transformers import AutoTokenizer

    from common.tiny import tiny_tokenizer_path

    return AutoTokenizer.from_pretrained(tiny_tokenizer_path())


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, shared_artefacts):
    """One random tiny model for the whole session: read-only (the guard checks every test that uses it)."""
    from sft.tiny import save_tiny_model

    return shared_artefacts.register(save_tiny_model(tmp_path_factory.mktemp("tiny_model") / "model", seed=0), "tiny_model_dir")


# The tiers where a skip fails: the vLLM tier (`make test-vllm` sets DTSFT_VLLM_TIER=1), the browser tier
# (`make test-browser` sets DTSFT_BROWSER_TIER=1) and the Slurm tier (`make test-slurm`: DTSFT_SLURM_TIER=1). A
# test of the tier's marker that skips (vLLM, chromium, Slurm or a fixture missing, a broken import) is reported
# as a failure, never passes as "skipped".
SKIP_FAILS = {"vllm": ("DTSFT_VLLM_TIER", "vLLM"), "browser": ("DTSFT_BROWSER_TIER", "browser"),
              "slurm": ("DTSFT_SLURM_TIER", "Slurm")}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not report.skipped:
        return
    for marker, (env, tier) in SKIP_FAILS.items():
        if os.environ.get(env) == "1" and item.get_closest_marker(marker) is not None:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            report.outcome = "failed"
            report.longrepr = f"{marker}-tier test skipped, which the {tier} tier counts as a failure: {reason}"
            return


def written_since(root: Path, since: float) -> list[Path]:
    """Files and dirs under `root` created or changed (ctime: a copy that keeps the source's mtime counts too)
    at or after `since`."""
    if not root.exists():
        return []
    return sorted(p for p in [root, *root.rglob("*")] if p.lstat().st_ctime >= since)


def pytest_sessionfinish(session, exitstatus):
    """The run (this process; under xdist, the controller, after its workers) left the developer's
    ~/.cache/dtsft as it was, or it fails naming what it wrote there."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    wrote = written_since(USER_PROJECT_CACHE, _STARTED)
    if wrote:
        shown = "\n  ".join(map(str, wrote[:20])) + (f"\n  ... and {len(wrote) - 20} more" if len(wrote) > 20 else "")
        tw = session.config.get_terminal_writer()
        tw.line()
        tw.line(
            f"error: the test run wrote into the developer's cache {USER_PROJECT_CACHE} (a test's caches are the "
            f"session's $XDG_CACHE_HOME and $DTSFT_DATA, tests/conftest.py):\n  {shown}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(autouse=True)
def _root_logging_as_it_was():
    """A trainer run in-process (sft.train's `logging.basicConfig(force=True)`) leaves a root handler on that test's
    captured stderr, closed once the test ends: a later test whose code logs (matplotlib's font subsetting at
    INFO) then printed "--- Logging error --- Traceback" into its own output. Each test gets the root logger
    back as it found it."""
    import logging

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture(autouse=True)
def _hub_answers_forgotten():
    """common.hub remembers the Hub's answer per repo and endpoint for the process; a test's Hub (a loopback port,
    a patched resolver) is its own, so each test starts with none remembered, as each command does."""
    import common.hub

    common.hub._ANSWERS.clear()
    yield
    common.hub._ANSWERS.clear()


@pytest.fixture
def prefilled(tmp_path_factory, monkeypatch):
    """A data cache of this test's own holding the unpinned sets a user pre-fills (one-row stand-ins:
    tests/plan_capture.py): the preflight of a sweep with eval_profile=rl_ood asks for its 2WikiMultihopQA set."""
    from tests.plan_capture import unpinned_stand_ins

    where = tmp_path_factory.mktemp("prefilled")
    monkeypatch.setenv("DTSFT_DATA", str(where / "data"))
    unpinned_stand_ins(where)


def unrendered_figures(monkeypatch) -> None:
    """Figures are drawn but not rendered to PDF/PNG (the slow part): empty files under their names."""
    import matplotlib.pyplot as plt

    import analysis.figures

    def save(fig, info, out_stem, rows):
        for ext in ("pdf", "png"):
            out_stem.with_suffix(f".{ext}").write_bytes(b"")
            info.paths.append(out_stem.with_suffix(f".{ext}"))
        plt.close(fig)

    monkeypatch.setattr(analysis.figures, "save_figure", save)


@pytest.fixture
def fast_figures(monkeypatch):
    """For a test that checks the tables and the figures' names and panels, never a figure file."""
    unrendered_figures(monkeypatch)


_HANDLED = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2"))


@pytest.fixture(autouse=True)
def _signal_handlers_as_they_were(request):
    """Code run in-process must give back the signal handlers it installed: a test that left one made a later
    test's forked workers keep it (launch.completion's forwarding; the data build's pool then never stopped and
    `make test` hung). A test that changes one fails here, naming the signal; the handler is put back."""
    before = {sig: signal.getsignal(sig) for sig in _HANDLED}
    yield
    changed = [sig for sig in _HANDLED if signal.getsignal(sig) is not before[sig]]
    for sig in changed:
        signal.signal(sig, before[sig])
    if changed:
        pytest.fail(f"{request.node.nodeid} left its handler for {', '.join(signal.Signals(s).name for s in changed)} "
                    "installed (restore it when done)", pytrace=False)
