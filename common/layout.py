"""The run-directory layout (DESIGN.md), defined once: `<runs_root>/<arm>/[<name>/]seed<seed>/`.

`name=` adds a level for variants of an arm (another configuration of the same arm), so a run dir
always holds one run identity; analysis labels a variant `<arm>/<name>` and never pools it with the
unnamed arm. Directories renamed aside by `resume=never` / `overwrite=true`
(`<dir>.replaced-<UTC time>`, common.io.replace_aside) are kept but are not runs.
"""
from __future__ import annotations

import re
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from common.io import REPLACED_MARK, SHA256SUMS, atomic_dir, replace_aside, write_json

# The trainer's run-dir lock (fcntl, held by the training process's rank 0 for its whole life; SFT and
# RL trainers take it, launch only checks it) and launch's own lock.
TRAIN_LOCK = ".train.lock"
LAUNCH_LOCK = ".launch.lock"
MANIFEST_LOCK = ".manifest.lock"   # every read-modify-write of manifest.json (common.lock.manifest_lock)
SEED_DIR = re.compile(r"^seed(\d+)$")
# Letters, digits, `_` and `-`, starting with a letter or digit: no dots (so never `.replaced-`),
# no path separators; `seed<N>` is taken by the seed level.
VARIANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")


def variant_name_problem(name) -> str | None:
    """Why `name` cannot be a variant name, or None when it can (None itself: no variant)."""
    if name is None:
        return None
    if not isinstance(name, str) or not VARIANT_NAME.match(name):
        return "a name of letters, digits, '_' and '-' (starting with a letter or digit), or null"
    if SEED_DIR.match(name):
        return "a name that is not seed<N> (that level holds the seeds)"
    return None


def run_dir_path(runs_root: str | Path, arm: str, seed: int, name: str | None = None) -> Path:
    root = Path(runs_root).expanduser() / str(arm)
    return (root / name if name else root) / f"seed{seed}"


def variant_label(arm: str, name: str | None) -> str:
    return f"{arm}/{name}" if name else arm


def is_replaced(path: str | Path) -> bool:
    return REPLACED_MARK in Path(path).name


# ---------------------------------------------------------------- inside a run dir
# `config.yaml` (resolved), `manifest.json`, `metrics.jsonl`, `checkpoints/step-NNNNNN/` (an RL
# checkpoint also holds `adapter/`), `state/step-NNNNNN/` (resumable: `SHA256SUMS`, `meta.json`, then
# `COMPLETE` last), `rollouts/` (RL), `eval/[<profile>/]step-NNNNNN/`, and `DONE` when training finished;
# `FAILED` or `REQUEUED` (an end record: how the last segment ended short of DONE) while it is not.
CONFIG = "config.yaml"
MANIFEST = "manifest.json"       # also the name of a dataset dir's manifest (data_prep)
METRICS = "metrics.jsonl"
DONE = "DONE"
CHECKPOINTS = "checkpoints"
STATES = "state"
EVAL = "eval"
ROLLOUTS = "rollouts"
ADAPTER = "adapter"
LOGS = "logs"
TRAINER_EXIT = "trainer-exit.json"   # logs/<this>: {"code", "error", "launch"} of a trainer's refusal, read by launch
LAUNCH_ID_ENV = "DTSFT_LAUNCH_ID"    # set by launch for its trainer: the "launch" a refusal is recorded under
# End records (JSON: "state", "reason", "by", "launch", "job", "time"): why a run has no DONE. `FAILED`: the
# trainer raised (written by its rank 0) or its job ended non-zero / was killed (written by the Slurm batch
# script or a local launch: an OOM kill or SIGKILL leaves Python no chance). `REQUEUED`: a Slurm segment
# stopped at a preemption / time-limit warning and its job was requeued. `STOPPED`: a local launch's trainer
# stopped at a signal (SIGTERM, Ctrl-C) with its state saved: resumable. A segment or trainer that starts
# removes them; at most one is there.
FAILED = "FAILED"
REQUEUED = "REQUEUED"
STOPPED = "STOPPED"
END_RECORDS = (FAILED, REQUEUED, STOPPED)
COMPLETE = "COMPLETE"            # written last into a state dir: the state is whole
STATE_META = "meta.json"
STEP_DIR = re.compile(r"^step-(\d+)$")


def record_refusal(config_path: str | Path, code: int, message: str) -> None:
    """A trainer's rank 0 records why it refused to run in `<run_dir>/logs/trainer-exit.json`
    (run_dir read from its config file), so launch can report it as one line with this exit code:
    torchrun turns any worker failure into its own exit 1. Best effort: the message is on stderr anyway."""
    import os

    if int(os.environ.get("RANK", "0")) != 0:
        return
    try:
        from omegaconf import OmegaConf

        rd = OmegaConf.load(str(config_path)).get("run_dir")
        if rd:
            (Path(str(rd)) / LOGS).mkdir(parents=True, exist_ok=True)
            write_json(Path(str(rd)) / LOGS / TRAINER_EXIT,
                       {"code": int(code), "error": message, "launch": os.environ.get(LAUNCH_ID_ENV)})
    except Exception:  # noqa: BLE001 - an unreadable config or run dir
        pass


def trainer_refusal(run_dir: str | Path, launch_id: str | None) -> tuple[int, str] | None:
    """(exit code, message) of the refusal `record_refusal` wrote for launch `launch_id`, else None."""
    import json

    try:
        rec = json.loads((Path(run_dir) / LOGS / TRAINER_EXIT).read_text(encoding="utf-8"))
        return (int(rec["code"]), str(rec["error"])) if rec.get("launch") == launch_id else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def record_end(run_dir: str | Path, name: str, reason: str, by: str, **more) -> None:
    """Write the end record `name` (FAILED or REQUEUED) into `run_dir` atomically, removing the other one.
    `launch` is this process's launch id ($DTSFT_LAUNCH_ID), `more` adds keys (e.g. code=)."""
    import os
    import time

    if name not in END_RECORDS:
        raise ValueError(f"end record {name!r}: expected one of {', '.join(END_RECORDS)}")
    rd = Path(run_dir)
    write_json(rd / name, {"state": name.lower(), "reason": " ".join(str(reason).split()), "by": by,
                           "launch": os.environ.get(LAUNCH_ID_ENV), **more,
                           "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    for other in END_RECORDS:
        if other != name:
            (rd / other).unlink(missing_ok=True)


def clear_end(run_dir: str | Path) -> None:
    """A run (segment) starts again: its stale end records go."""
    for name in END_RECORDS:
        (Path(run_dir) / name).unlink(missing_ok=True)


def record_base(run_dir: str | Path, base: dict) -> None:
    """A trainer's record of the commit it loads each Hub-id base at (`base`: {key: {"repo", "revision"}}, {} for
    none) as `base` in the run dir's manifest.json, beside launch's record of the run; nothing where launch wrote no
    manifest (the states' meta.json and DONE carry it too) or the manifest does not read as a JSON object (launch's
    to report). Under the manifest lock: launch may be recording a launch in it at the same time."""
    import json

    from common.lock import manifest_lock

    path = Path(run_dir) / MANIFEST
    if not path.is_file():
        return
    with manifest_lock(Path(run_dir) / MANIFEST_LOCK):
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return
        if isinstance(manifest, dict) and manifest.get("base") != base:
            write_json(path, {**manifest, "base": base})


def end_record(run_dir: str | Path) -> dict | None:
    """The run's end record (FAILED before REQUEUED; its "state" key says which), None when it has none or
    it does not read as a JSON object (analysis.discover reads it with a problem recorded instead)."""
    import json

    for name in END_RECORDS:
        try:
            rec = json.loads((Path(run_dir) / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict):
            return {**rec, "state": name.lower()}
    return None


def record_trainer_failure(config_path: str | Path, reason: str, by: str, code: int | None = None) -> None:
    """A trainer's rank 0 records that it ended with an error: `FAILED` in the run dir its config names.
    Best effort (the error is on stderr anyway): an unreadable config or run dir records nothing."""
    import os

    if int(os.environ.get("RANK", "0")) != 0:
        return
    try:
        from omegaconf import OmegaConf

        rd = OmegaConf.load(str(config_path)).get("run_dir")
        if rd and Path(str(rd)).is_dir():
            record_end(Path(str(rd)), FAILED, reason, by, **({"code": int(code)} if code is not None else {}))
    except Exception:  # noqa: BLE001 - an unreadable config or run dir
        pass


def step_name(step: int) -> str:
    return f"step-{int(step):06d}"


def parse_step(name: str) -> int | None:
    """The step of a `step-NNNNNN` directory name, None for any other name."""
    m = STEP_DIR.match(name)
    return int(m.group(1)) if m else None


def step_dirs(parent: str | Path) -> list[tuple[int, Path]]:
    """(step, dir) of every `step-NNNNNN` directory under `parent` (symlinks excluded), by step."""
    parent = Path(parent)
    if not parent.is_dir():
        return []
    return sorted((s, d) for d in parent.iterdir()
                  if (s := parse_step(d.name)) is not None and d.is_dir() and not d.is_symlink())


def checkpoints_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


def checkpoint_dir(run_dir: str | Path, step: int) -> Path:
    return checkpoints_dir(run_dir) / step_name(step)


def states_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / STATES


def eval_subdir(profile: str | None = None) -> Path:
    """A run's evaluations: `eval/` for the default profile, `eval/<profile>/` for a named one
    (`evaluate profile=NAME`), so two profiles of one checkpoint never share a directory."""
    return Path(EVAL) / profile if profile else Path(EVAL)


def eval_dir(run_dir: str | Path, step: int, profile: str | None = None) -> Path:
    return Path(run_dir) / eval_subdir(profile) / step_name(step)


def checkpoint_of(ckpt: str | Path) -> tuple[Path, int] | None:
    """(run_dir, step) of `<run_dir>/checkpoints/step-NNNNNN`, else None (a model outside a run)."""
    p = Path(ckpt)
    if (step := parse_step(p.name)) is not None and p.parent.name == CHECKPOINTS:
        return p.parent.parent, step
    return None


def is_complete_state(state: str | Path) -> bool:
    """The one rule for a usable state dir: `COMPLETE` (written last) and its `meta.json`."""
    return (Path(state) / COMPLETE).is_file() and (Path(state) / STATE_META).is_file()


def complete_states(state_root: str | Path) -> list[tuple[int, Path]]:
    """(step, dir) of the complete states under `state_root`, oldest first."""
    return [(s, d) for s, d in step_dirs(state_root) if is_complete_state(d)]


def latest_complete_state(state_root: str | Path) -> Path | None:
    states = complete_states(state_root)
    return states[-1][1] if states else None


# ---------------------------------------------------------------- a checkpoint is never deleted
class _Unchanged(Exception):
    """The redone step wrote exactly the files the existing checkpoint holds."""


def step_eval_dirs(run_dir: str | Path, step: int) -> list[Path]:
    """Every evaluation of one step: `eval/step-NNNNNN` and each profile's `eval/<profile>/step-NNNNNN`."""
    root = Path(run_dir) / EVAL
    if not root.is_dir():
        return []
    subdirs = [root] + sorted(d for d in root.iterdir()
                              if d.is_dir() and not d.is_symlink() and parse_step(d.name) is None and not is_replaced(d))
    return [d / step_name(step) for d in subdirs if (d / step_name(step)).exists()]


def set_aside_checkpoint(ckpt: str | Path) -> list[tuple[Path, Path]]:
    """Rename a checkpoint dir aside (common.io.replace_aside) and, for `<run_dir>/checkpoints/step-NNNNNN`,
    every evaluation of that step first (they belong to the weights being set aside); returns (old, new)."""
    ckpt = Path(ckpt)
    step = parse_step(ckpt.name)
    evals = step_eval_dirs(ckpt.parent.parent, step) if step is not None and ckpt.parent.name == CHECKPOINTS else []
    return [(d, replace_aside(d)) for d in [*evals, ckpt]]


@contextmanager
def new_checkpoint(out: str | Path, report: Callable[[str], object] = print) -> Iterator[Path]:
    """Write the checkpoint dir `out` in a temp dir (common.io.atomic_dir) that the caller fills.

    A checkpoint is never deleted once written. When `out` is already there (a redone step: a crash
    between a checkpoint and its state, then a relaunch), a new one with the same SHA256SUMS leaves
    the old dir (and its evaluations) as they are; any other replaces it only after the old
    checkpoint and every `eval/[<profile>/]step-NNNNNN` of its step are renamed aside
    (`<dir>.replaced-<UTC time>`), each move reported through `report`.
    """
    out = Path(out)
    try:
        with atomic_dir(out) as tmp:
            yield tmp
            if out.is_dir() and not out.is_symlink() and any(out.iterdir()):
                old, new = out / SHA256SUMS, tmp / SHA256SUMS
                if old.is_file() and new.is_file() and old.read_bytes() == new.read_bytes():
                    raise _Unchanged
                for was, now in set_aside_checkpoint(out):
                    report(f"redone step: {was} renamed to {now.name} (a checkpoint, or an evaluation of one, "
                           "is never deleted)")
    except _Unchanged:
        report(f"redone step: {out} holds the same files (SHA256SUMS); kept as it is")
