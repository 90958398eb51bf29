"""The interpreter each kind of job runs, and asking it for what its jobs need.

`python.sft=PATH` (SFT training), `python.grpo=PATH` (GRPO training), `python.eval=PATH` (evaluation and
analysis: evaluation tasks, aggregations, a study's analyze / evaluate stage): training (CUDA torch +
flash-attn) and vLLM (its own torch) live in separate environments, so each job kind names its own.
null: the interpreter running the command (`sys.executable`).

Before anything is submitted or started, each interpreter named is asked, by a subprocess of that
interpreter running `importlib.util.find_spec` (no import, no GPU), whether it holds the modules its jobs
need (`sft_needs`, `grpo_needs`, `eval_needs`); a missing one is refused in one line (`check`). The answer
must be a Python's: one JSON line carrying a sentinel the probe computes (so a program that merely exits 0,
`/bin/true`, or echoes its arguments, `/bin/echo`, is refused), its version (Python 3.11 or later) and the
missing modules.
"""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

KINDS = ("sft", "grpo", "eval")
# The sentinel is computed, not written out: a program echoing its arguments never prints it.
SENTINEL = "dtsft-interpreter-probe"
_ASK = ("import importlib.util, json, sys; print(json.dumps({'probe': 'dtsft-' + 'interpreter-probe', "
        "'version': list(sys.version_info[:3]), "
        "'missing': [m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]}))")
MIN_VERSION = (3, 11)


def named(section, kind: str) -> str | None:
    """The interpreter `python.<kind>` names in a config's `python` section (a mapping; None: not named)."""
    value = None if section is None else section.get(kind)
    if value in (None, ""):
        return None
    # a relative path is the one from here (jobs start elsewhere); a bare name is looked up on PATH
    return os.path.abspath(str(value)) if os.sep in str(value) else str(value)


def interpreter(section, kind: str) -> str:
    """The interpreter `kind`'s jobs run: the one named, else this one."""
    return named(section, kind) or sys.executable


def interpreters(section) -> dict[str, str]:
    """Every kind's interpreter, as manifests record them."""
    return {kind: interpreter(section, kind) for kind in KINDS}


@functools.lru_cache(maxsize=None)
def missing_modules(python: str, modules: tuple[str, ...]) -> tuple[str, ...] | str:
    """The modules of `modules` that `python` cannot find, or why it could not be asked (a string)."""
    try:
        proc = subprocess.run([python, "-c", _ASK, *modules], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"could not be run ({exc.__class__.__name__}: {exc})"
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return f"could not be asked for its modules (exit {proc.returncode}: {last})"
    return _answer(proc.stdout, modules)


def _answer(stdout: str, modules: tuple[str, ...]) -> tuple[str, ...] | str:
    """The missing modules the probe's last line reports, or why that line is no Python's answer."""
    last = (stdout.strip().splitlines() or [""])[-1]
    try:
        answer = json.loads(last)
    except ValueError:
        answer = None
    if not (isinstance(answer, dict) and answer.get("probe") == SENTINEL):
        shown = repr(last[:80]) if last else "nothing"
        return f"is not a Python interpreter: it exited 0 but answered the probe with {shown}"
    version, missing = answer.get("version"), answer.get("missing")
    if not (isinstance(version, list) and len(version) == 3 and all(isinstance(v, int) for v in version)
            and isinstance(missing, list) and set(missing) <= set(modules)):
        return f"answered the probe with a malformed line {last[:80]!r}"
    if tuple(version[:2]) < MIN_VERSION:
        return (f"is Python {'.'.join(map(str, version))}; dtsft needs "
                f"{'.'.join(map(str, MIN_VERSION))} or later")
    return tuple(missing)


@functools.lru_cache(maxsize=None)
def package_version(python: str, name: str) -> str | None:
    """The installed release of distribution `name` in `python` (None: not installed, or `python` not runnable)."""
    ask = ("import importlib.metadata as m, sys\ntry: print(m.version(sys.argv[1]))\n"
           "except m.PackageNotFoundError: pass")
    try:
        proc = subprocess.run([python, "-c", ask, name], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def installed_trl() -> str | None:
    """The trl release this interpreter (the running one) imports (None: not installed): package_version's in-process form."""
    try:
        return metadata.version("trl")
    except metadata.PackageNotFoundError:
        return None


def trl_problem(want, have: str | None, python: str = sys.executable) -> str | None:
    """Why a run pinned to `grpo.trl=want` cannot train in `python` (whose trl is `have`), or None."""
    if want in (None, "") or str(want) == have:
        return None
    return (f"grpo.trl={want}: {python} has {'trl ' + have if have else 'no trl'}; train in an environment holding "
            f"trl {want}: python.grpo=.venv-trl{want}/bin/python (`make venv-trl TRL_REF={want}` builds it beside "
            "the project's .venv), or grpo.trl=null for the installed one")


# The device nodes a GPU's driver makes: NVIDIA /dev/nvidiaN (beside /dev/nvidiactl: nvidia-modprobe(1)), Jetson's nvgpu
# /dev/nvhost-ctrl-gpu, WSL2's GPU paravirtualization /dev/dxg, ROCm's compute interface /dev/kfd (ROCm docs, "Running
# ROCm Docker containers"). CUDA_VISIBLE_DEVICES shows only the devices before its first invalid index (CUDA Programming
# Guide, "CUDA Environment Variables"); ROCm's torch reads HIP_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES before it.
GPU_NODES = ("nvidia[0-9]*", "nvhost-ctrl-gpu", "dxg", "kfd")


def gpus_visible(dev: Path = Path("/dev")) -> bool:
    """Whether this machine may show a GPU to torch: a GPU device node under `dev`, and CUDA_VISIBLE_DEVICES not hiding
    every device (empty, or -1 first). False: none here, known without importing torch (seconds) or asking it."""
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() in ("", "-1") \
        and not os.environ.keys() & {"HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"}
    return not hidden and any(next(dev.glob(node), None) for node in GPU_NODES)


@functools.lru_cache(maxsize=None)
def cuda_problem(python: str) -> str | None:
    """Why `python`'s torch cannot use a GPU here (None: torch.cuda.is_available() is true in it)."""
    ask = "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)"
    try:
        proc = subprocess.run([python, "-c", ask], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{python} could not be asked for CUDA ({exc.__class__.__name__})"
    if proc.returncode == 3:
        return f"{python}: torch sees no CUDA GPU although this machine shows one (a CPU-only torch?)"
    if proc.returncode:
        return f"{python} could not be asked for CUDA (exit {proc.returncode}: " \
               f"{(proc.stderr.strip().splitlines() or ['no output'])[-1]})"
    return None


def check(kind: str, python: str, needs: dict[str, str]) -> str | None:
    """None when `python` holds every module of `needs` (module -> what needs it), else the one line refusing it."""
    found = missing_modules(python, tuple(needs))
    if isinstance(found, str):
        return f"python.{kind}={python} {found}"
    if found:
        return (f"python.{kind}={python} lacks {', '.join(f'{m} ({needs[m]})' for m in found)}: name an environment "
                f"that has {'it' if len(found) == 1 else 'them'} (python.{kind}=.../bin/python)")
    return None


def sft_needs(cfg) -> dict[str, str]:
    """What an SFT run's interpreter must hold: torch and transformers, flash-attn / liger when asked for."""
    needs = {"torch": "training", "transformers": "training", "omegaconf": "the config"}
    if cfg.model.get("attn_implementation") == "flash_attention_2":
        needs["flash_attn"] = "model.attn_implementation=flash_attention_2"
    if cfg.model.get("liger") is True:
        needs["liger_kernel"] = "model.liger=true"
    return needs


def grpo_needs(cfg) -> dict[str, str]:
    """What a GRPO run's interpreter must hold: SFT's, peft (LoRA), vllm for vLLM colocate generation."""
    needs = {**sft_needs(cfg), "peft": "LoRA"}
    if cfg.grpo.get("use_vllm") is True:
        needs["vllm"] = "grpo.use_vllm=true"
    return needs


def eval_needs(backend: str | None) -> dict[str, str]:
    """What an evaluation / analysis job's interpreter must hold: vllm for backend=vllm."""
    needs = {"omegaconf": "the config", "torch": "evaluation", "transformers": "evaluation",
             "pandas": "the report"}
    if backend == "vllm":
        needs["vllm"] = "backend=vllm"
    return needs
