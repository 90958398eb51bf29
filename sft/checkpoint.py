"""Checkpoints: consolidated HF model dirs (for evals) and sharded resumable state (for resume).

HF checkpoint `<run_dir>/checkpoints/step-NNNNNN/`: full state dict gathered to rank 0,
cast to the training dtype, `save_pretrained` + tokenizer/chat template + generation
config + SHA256SUMS, written into a temp dir and renamed (common.io.atomic_dir), so a
crash never leaves a complete-looking directory. A checkpoint is never deleted: a redone step (a
crash between a checkpoint and its state) renames the old one and its evaluations aside unless it
wrote the same files (common.layout.new_checkpoint).

Resumable state `<run_dir>/state/step-NNNNNN/`: torch.distributed.checkpoint shards of
{"model", "optim"} keyed by plain HF names (get_state_dict strips the FSDP/checkpoint
wrapper prefixes), `meta.json` (step, data position, scheduler, counters), per-rank RNG
(safetensors), `hf/` (config + tokenizer so export can rebuild the model), `SHA256SUMS`, and
`COMPLETE`, written last. A state dir without COMPLETE is torn and never resumed from; one that
fails its SHA256SUMS is skipped for the previous one (see "the state contract" below).
"""
from __future__ import annotations

import functools
import json
import logging
import os
import pickle
import random
import shutil
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from common import layout
from common.io import (
    SHA256SUMS,
    check_sha256_entry,
    fsync_dir,
    read_sha256sums,
    tree_entries,
    write_json,
    write_sha256sums,
)
from common.layout import COMPLETE, STATE_META, step_name  # noqa: F401  (the trainer names its dirs with these)
from sft.hfconfig import save_config
from sft.errors import SftError

log = logging.getLogger("sft.checkpoint")
KEEP_STATES = 2  # older complete states are pruned; a 4B model + AdamW is ~50 GB each


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


# ---------------------------------------------------------------- HF model directory


def full_state_dict(model, device: torch.device) -> dict:
    """Consolidated {HF name: tensor}. On CUDA it is offloaded to CPU on rank 0 only; on CPU
    offload is off (FSDP's CPU offload of an already-CPU model segfaults) and every rank
    gets the dict."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    on_gpu = device.type == "cuda"
    with warnings.catch_warnings():  # NO_SHARD (a world of one) returning a full dict is expected
        warnings.filterwarnings("ignore", message="When using ``NO_SHARD``")
        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=on_gpu))


def save_hf_checkpoint(model, *, out: Path, dtype: torch.dtype, tokenizer, generation_config, device, rank: int) -> None:
    sd = full_state_dict(model, device)
    if rank == 0:
        hf_model = getattr(model, "module", model)
        sd = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in sd.items()}
        for key in tied_output_keys(hf_model):
            sd.pop(key, None)  # stored once, as the input embedding; from_pretrained re-ties it
        out.parent.mkdir(parents=True, exist_ok=True)
        with layout.new_checkpoint(out, report=log.warning) as tmp:  # a redone step sets the old one aside
            hf_model.save_pretrained(tmp, state_dict=sd, safe_serialization=True)
            # save_pretrained declares the dtype of the live (fp32 master) parameters; the
            # tensors written are in the training dtype, so config.json must say that.
            hf_model.config.dtype = dtype
            save_config(hf_model.config, tmp)
            tokenizer.save_pretrained(tmp)
            generation_config.save_pretrained(tmp)
            write_sha256sums(tmp)
        log.info("checkpoint written: %s", out)
    del sd
    _barrier()


WRAPPER_PARTS = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")


def tied_output_keys(hf_model) -> list[str]:
    """State-dict names of the output embedding when the config ties it to the input one."""
    if not getattr(hf_model.config, "tie_word_embeddings", False):
        return []
    out = hf_model.get_output_embeddings()
    for name, mod in hf_model.named_modules():
        if mod is out:
            for part in WRAPPER_PARTS:
                name = name.replace(part, "")
            return [f"{name}.{p}" for p, _ in mod.named_parameters(recurse=False)]
    return []


def generation_config_for(model_path: str, conf):
    """The source model's generation_config when it has one, else eos/pad from the config."""
    from transformers import GenerationConfig

    if model_path != "tiny":
        from common.hub import source

        try:
            return GenerationConfig.from_pretrained(model_path, **source(model_path, "model.path", SftError))
        except (OSError, ValueError):
            pass
    eos = conf.eos_token_id if isinstance(conf.eos_token_id, list) else [conf.eos_token_id]
    return GenerationConfig(eos_token_id=eos, pad_token_id=conf.pad_token_id)


# ---------------------------------------------------------------- resumable state
#
# The state contract (the RL stage's states follow it too):
# - nothing in a state dir is unpickled except DCP's `.metadata`, through `SafeUnpickler`'s
#   allow-list of DCP metadata classes; per-rank RNG is safetensors + JSON (`write_rng`), DCP's
#   non-tensor items (optimizer hyper-parameters) load with torch.load(weights_only=True);
# - `write_state_sums(d)` writes SHA256SUMS over every file, then the writer writes COMPLETE;
# - `verify_state(d)` checks meta.json first, then the rest split over the ranks (collective when
#   a process group is up); `newest_verified_state` is the newest state that verifies, with the
#   reason for each newer one skipped.

RNG_DIR = "rng"


def rng_file(d: Path, rank: int) -> Path:
    return Path(d) / RNG_DIR / f"rank-{rank:05d}.safetensors"


def seed_rngs(seed: int) -> None:
    """Seed what write_rng saves (torch on every device, numpy, Python) with `seed`: a run's draws (dropout) are a
    function of its seed, not of whatever the process drew before (a pretrained model is loaded, never seeded)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def write_rng(path: Path) -> None:
    """This process's torch / CUDA / numpy / Python RNG state as tensors (safetensors) plus a JSON
    header entry; restoring it needs no unpickling."""
    from safetensors.torch import save_file

    version, py_state, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    tensors = {"torch": torch.get_rng_state(), "python": torch.tensor(py_state, dtype=torch.int64),
               "numpy": torch.from_numpy(keys.astype(np.int64))}
    if torch.cuda.is_available():
        for i, st in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"cuda.{i}"] = st
    extra = {"python_version": version, "python_gauss": gauss, "numpy_kind": kind, "numpy_pos": int(pos),
             "numpy_has_gauss": int(has_gauss), "numpy_cached_gaussian": float(cached)}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata={"rng": json.dumps(extra)})


def read_rng(path: Path) -> None:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        extra = json.loads(f.metadata()["rng"])
        t = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (a safe_open handle, not a dict)
    torch.set_rng_state(t["torch"])
    random.setstate((extra["python_version"], tuple(int(v) for v in t["python"].tolist()), extra["python_gauss"]))
    np.random.set_state((extra["numpy_kind"], t["numpy"].numpy().astype(np.uint32), extra["numpy_pos"],
                         extra["numpy_has_gauss"], extra["numpy_cached_gaussian"]))
    cuda = [t[f"cuda.{i}"] for i in range(len(t)) if f"cuda.{i}" in t]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)


class StateError(SftError):
    """A state directory that must not be loaded; the message says which file and why (exit 2)."""


@functools.lru_cache(maxsize=1)
def _dcp_allow_list() -> dict[tuple[str, str], object]:
    """The only globals a DCP `.metadata` pickle may name: DCP's metadata dataclasses/enums,
    torch.Size, dtypes, layouts and a relative path."""
    import pathlib

    import torch.distributed.checkpoint.filesystem as fs
    import torch.distributed.checkpoint.metadata as md

    allowed = {("torch", "Size"): torch.Size, ("torch.serialization", "_get_layout"): torch.serialization._get_layout,
               ("pathlib", "PosixPath"): pathlib.PosixPath, ("pathlib", "PurePosixPath"): pathlib.PurePosixPath,
               ("collections", "OrderedDict"): __import__("collections").OrderedDict}
    for name in ("Metadata", "MetadataIndex", "ChunkStorageMetadata", "TensorProperties", "TensorStorageMetadata",
                 "BytesStorageMetadata", "StorageMeta", "_MEM_FORMAT_ENCODING"):
        if hasattr(md, name):
            allowed[(md.__name__, name)] = getattr(md, name)
    for name in ("_StorageInfo", "_StoragePrefix"):
        if hasattr(fs, name):
            allowed[(fs.__name__, name)] = getattr(fs, name)
    for name in dir(torch):
        if isinstance(getattr(torch, name, None), torch.dtype):
            allowed[("torch", name)] = getattr(torch, name)
    return allowed


class SafeUnpickler(pickle.Unpickler):
    """Unpickles DCP metadata only: any global outside `_dcp_allow_list` is refused."""

    def find_class(self, module: str, name: str):
        obj = _dcp_allow_list().get((module, name))
        if obj is None:
            raise pickle.UnpicklingError(f"{module}.{name} is not a DCP metadata class; refusing to load it")
        return obj


def safe_load_dcp_metadata(path: Path):
    """A DCP `.metadata` file through the allow-list (StateError on anything else)."""
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        with open(path, "rb") as f:
            md = SafeUnpickler(f).load()
    except Exception as exc:  # a refused global, a truncated or garbled pickle
        raise StateError(f"{path}: not loadable DCP metadata ({type(exc).__name__}: {exc})") from exc
    if not isinstance(md, Metadata):
        raise StateError(f"{path}: expected DCP Metadata, found {type(md).__name__}")
    return md


def safe_reader(dcp_dir: Path):
    """A FileSystemReader whose metadata goes through `safe_load_dcp_metadata`."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class _SafeReader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            rank = kwargs.get("rank")
            path = Path(self._get_metadata_path(rank)) if hasattr(self, "_get_metadata_path") else Path(self.path) / ".metadata"
            md = safe_load_dcp_metadata(path)
            if getattr(md, "storage_meta", None) is None:
                md.storage_meta = StorageMeta()
            md.storage_meta.load_id = self.load_id
            return md

    return _SafeReader(str(dcp_dir))


def safe_planner():
    """DCP's default load planner, with non-tensor items read by torch.load(weights_only=True)."""
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint._traverse import set_element

    class _SafePlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value) -> None:
            obj = torch.load(value, weights_only=True)
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
            else:
                self.state_dict[read_item.dest_index.fqn] = obj

    return _SafePlanner()


def write_state_sums(d: Path) -> Path:
    """SHA256SUMS over every file of a state dir (COMPLETE, written after it, excepted)."""
    return write_sha256sums(d, exclude=(COMPLETE,))


def _dist_world() -> tuple[int, int]:
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def verify_state(d: Path) -> list[str]:
    """Problems with state dir `d` against its SHA256SUMS; empty when it may be loaded.

    `meta.json` is checked first (a state whose meta is bad costs no shard hashing); the other
    files are split over the ranks by size and the verdict all-reduced, so every rank returns a
    non-empty list when any rank found a problem. Collective when a process group is up."""
    d = Path(d)
    rank, world = _dist_world()
    t0 = time.perf_counter()
    problems: list[str] = []
    if not (d / COMPLETE).is_file():
        problems.append(f"{d}: no {COMPLETE} marker (torn: the run stopped while writing it)")
    entries, sum_problems = read_sha256sums(d)
    problems += sum_problems
    if not problems:
        if STATE_META not in entries:
            problems.append(f"{d / STATE_META}: not listed in SHA256SUMS")
        elif (p := check_sha256_entry(d, STATE_META, entries[STATE_META])) is not None:
            problems.append(p)
        else:
            try:
                json.loads((d / STATE_META).read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError) as exc:
                problems.append(f"{d / STATE_META}: unreadable ({exc})")
    if not problems:
        files, odd = tree_entries(d)
        problems += odd
        problems += [f"{d / f}: present but not listed in SHA256SUMS" for f in files
                     if f not in entries and f not in (SHA256SUMS, COMPLETE)]
        rest = sorted((n for n in entries if n != STATE_META), key=lambda n: (-_size(d / n), n))
        for name in rest[rank::world]:
            if (p := check_sha256_entry(d, name, entries[name])) is not None:
                problems.append(p)
    mine = len(problems)
    if world > 1:
        flag = torch.tensor([mine], dtype=torch.int64)
        dist.all_reduce(flag)
        if flag.item() > mine:
            problems.append(f"{d}: {flag.item() - mine} problem(s) found by other ranks (see their logs)")
    for p in problems[:mine]:
        log.warning("state check: %s", p)
    log.info("verified %s against SHA256SUMS in %.2fs (%d ranks): %s", d, time.perf_counter() - t0, world,
             "ok" if not problems else f"{len(problems)} problem(s)")
    return problems


def _size(p: Path) -> int:
    try:
        return os.lstat(p).st_size
    except OSError:
        return 0


def save_state(model, optimizer, *, run_dir: Path, step: int, meta: dict, hf_writer, rank: int) -> Path:
    """Write the resumable state for `step` (all ranks call this).

    Torn states (no COMPLETE: a crash or a full disk while writing) are removed first, so a
    relaunch never fills the disk again with them; a write that fails removes its own torn dir."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    def shards(d: Path) -> None:
        msd, osd = get_state_dict(model, optimizer)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(d))

    return commit_state(run_dir, step, meta=meta, rank=rank, barrier=_barrier, write_each_rank=shards,
                        write_main=lambda d: hf_writer(d / "hf"))


def commit_state(run_dir: Path, step: int, *, meta: dict, rank: int, barrier, write_each_rank, write_main) -> Path:
    """The state contract's writer, shared by the SFT and RL trainers (every rank calls it):
    torn states and an earlier dir at this step removed, `write_each_rank(d)` and each rank's RNG,
    then on rank 0 `write_main(d)`, meta.json, SHA256SUMS, and COMPLETE last. A failed write
    removes its own torn dir; older states are pruned to KEEP_STATES."""
    state_root = layout.states_dir(run_dir)
    d = state_root / step_name(step)
    if rank == 0:
        remove_torn_states(state_root)
        if d.exists():  # an earlier state at this very step (e.g. one that failed its checks)
            shutil.rmtree(d)
        d.mkdir(parents=True)
    barrier()
    try:
        write_each_rank(d)
        write_rng(rng_file(d, rank))
        barrier()
        if rank == 0:
            write_main(d)
            write_json(d / STATE_META, meta)
            write_state_sums(d)
            _fsync_tree(d)
            (d / COMPLETE).write_text(f"{step}\n", encoding="utf-8")
            _fsync_tree(d)
    except BaseException:
        if rank == 0 and not (d / COMPLETE).is_file():
            shutil.rmtree(d, ignore_errors=True)
        raise
    if rank == 0:
        prune_states(state_root, keep=KEEP_STATES)
        log.info("resumable state written: %s", d)
    barrier()
    return d


def _fsync_tree(d: Path) -> None:
    for sub in [p for p in d.rglob("*") if p.is_dir()] + [d]:
        fsync_dir(sub)


def complete_states(state_root: Path) -> list[tuple[int, Path]]:
    out = layout.complete_states(state_root)
    for _, d in layout.step_dirs(state_root):
        if not layout.is_complete_state(d):
            log.warning("ignoring torn state %s (no %s marker)", d, COMPLETE)
    return out


def remove_torn_states(state_root: Path) -> None:
    """Remove step dirs without COMPLETE: this trainer's own interrupted writes."""
    for _, d in layout.step_dirs(state_root):
        if not (d / COMPLETE).is_file():
            shutil.rmtree(d, ignore_errors=True)
            log.warning("removed torn state %s (no %s marker)", d, COMPLETE)


def prune_states(state_root: Path, keep: int) -> None:
    """Keep the newest `keep` complete states; drop older ones and torn ones they supersede."""
    states = complete_states(state_root)
    for _, d in states[:-keep]:
        shutil.rmtree(d, ignore_errors=True)
    newest = states[-1][0] if states else -1
    for step, d in layout.step_dirs(state_root):
        if step < newest and not (d / COMPLETE).is_file():
            shutil.rmtree(d, ignore_errors=True)


def newest_verified_state(state_root: Path) -> tuple[Path | None, list[str]]:
    """(the newest complete state that verifies, notes on each newer one skipped and why).
    Collective when a process group is up (every rank gets the same answer)."""
    notes = []
    for _, d in reversed(complete_states(Path(state_root))):
        problems = verify_state(d)
        if not problems:
            return d, notes
        notes.append(f"skipped state {d}: {problems[0]}" + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""))
        log.warning(notes[-1])
    return None, notes


def load_state(model, optimizer, d: Path, *, rank: int, verified: bool = False) -> dict:
    """Verify `d` (StateError if it fails; `verified`: the caller just did, with verify_state or
    newest_verified_state), restore model + optimizer shards and this rank's RNG; returns meta.json.
    Nothing in `d` is unpickled outside the DCP metadata allow-list."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    d = Path(d)
    problems = [] if verified else verify_state(d)
    if problems:
        raise StateError(f"{d}: refusing to resume from a state that fails its checks: " + "; ".join(problems[:5]))
    msd, osd = get_state_dict(model, optimizer)
    state = {"model": msd, "optim": osd}
    safe_load_dcp_metadata(d / ".metadata")  # a refused pickle fails here, with its own message
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        dcp.load(state, storage_reader=safe_reader(d), planner=safe_planner())
    except (Exception, CheckpointException) as exc:  # DCP wraps every rank's failure (e.g. a refused non-tensor item)
        first = next((ln for ln in str(exc).splitlines() if "Error" in ln), str(exc).splitlines()[0] if str(exc) else "")
        raise StateError(f"{d}: refusing to load the DCP shards ({type(exc).__name__}: {first.strip()[:300]})") from exc
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    rng = rng_file(d, rank)
    if rng.is_file():
        read_rng(rng)
    else:
        log.warning("%s missing (world size changed?): RNG not restored", rng)
    return json.loads((d / STATE_META).read_text(encoding="utf-8"))
