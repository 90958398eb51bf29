"""Checkpoints: consolidated HF model dirs (for evals) and sharded resumable state (for resume).

HF checkpoint `<run_dir>/checkpoints/step-NNNNNN/`: full state dict gathered to rank 0,
cast to the training dtype, `save_pretrained` + tokenizer/chat template + generation
config + SHA256SUMS, written into a temp dir and renamed (common.io.atomic_dir), so a
crash never leaves a complete-looking directory.

Resumable state `<run_dir>/state/step-NNNNNN/`: torch.distributed.checkpoint shards of
{"model", "optim"} keyed by plain HF names (get_state_dict strips the FSDP/checkpoint
wrapper prefixes), `meta.json` (step, data position, scheduler, counters), per-rank RNG,
`hf/` (config + tokenizer so export can rebuild the model) and `COMPLETE`, written last.
A state dir without COMPLETE is torn and never resumed from.
"""
from __future__ import annotations

import json
import logging
import random
import shutil
import signal
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from common.io import atomic_dir, fsync_dir, write_json, write_sha256sums
from sft.hfconfig import save_config

log = logging.getLogger("sft.checkpoint")
COMPLETE = "COMPLETE"
KEEP_STATES = 2  # older complete states are pruned; a 4B model + AdamW is ~50 GB each


def step_name(step: int) -> str:
    return f"step-{step:06d}"


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
        with atomic_dir(out) as tmp:
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
        try:
            return GenerationConfig.from_pretrained(model_path)
        except (OSError, ValueError):
            pass
    eos = conf.eos_token_id if isinstance(conf.eos_token_id, list) else [conf.eos_token_id]
    return GenerationConfig(eos_token_id=eos, pad_token_id=conf.pad_token_id)


# ---------------------------------------------------------------- resumable state


def _rng_state() -> dict:
    st = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def _set_rng_state(st: dict) -> None:
    torch.set_rng_state(st["torch"])
    random.setstate(st["python"])
    np.random.set_state(st["numpy"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def save_state(model, optimizer, *, run_dir: Path, step: int, meta: dict, hf_writer, rank: int) -> Path:
    """Write the resumable state for `step` (all ranks call this)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    d = Path(run_dir) / "state" / step_name(step)
    if rank == 0 and d.exists():
        shutil.rmtree(d)  # a torn attempt at the same step
    _barrier()
    msd, osd = get_state_dict(model, optimizer)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(d))
    (d / "rng").mkdir(parents=True, exist_ok=True)
    torch.save(_rng_state(), d / "rng" / f"rank-{rank:05d}.pt")
    _barrier()
    if rank == 0:
        hf_writer(d / "hf")
        write_json(d / "meta.json", meta)
        _fsync_tree(d)
        (d / COMPLETE).write_text(f"{step}\n", encoding="utf-8")
        _fsync_tree(d)
        prune_states(Path(run_dir) / "state", keep=KEEP_STATES)
        log.info("resumable state written: %s", d)
    _barrier()
    return d


def _fsync_tree(d: Path) -> None:
    for sub in [p for p in d.rglob("*") if p.is_dir()] + [d]:
        fsync_dir(sub)


def complete_states(state_root: Path) -> list[tuple[int, Path]]:
    out = []
    if not state_root.is_dir():
        return out
    for d in state_root.iterdir():
        if d.is_dir() and d.name.startswith("step-") and d.name[5:].isdigit():
            if (d / COMPLETE).is_file() and (d / "meta.json").is_file():
                out.append((int(d.name[5:]), d))
            else:
                log.warning("ignoring torn state %s (no %s marker)", d, COMPLETE)
    return sorted(out)


def prune_states(state_root: Path, keep: int) -> None:
    """Keep the newest `keep` complete states; drop older ones and torn ones they supersede."""
    states = complete_states(state_root)
    for _, d in states[:-keep]:
        shutil.rmtree(d, ignore_errors=True)
    newest = states[-1][0] if states else -1
    for d in state_root.iterdir():
        step = d.name[5:]
        if d.is_dir() and step.isdigit() and int(step) < newest and not (d / COMPLETE).is_file():
            shutil.rmtree(d, ignore_errors=True)


def latest_state(run_dir: Path) -> Path | None:
    states = complete_states(Path(run_dir) / "state")
    return states[-1][1] if states else None


def load_state(model, optimizer, d: Path, *, rank: int) -> dict:
    """Restore model + optimizer shards and this rank's RNG; returns meta.json."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    if not (d / COMPLETE).is_file():
        raise RuntimeError(f"{d}: not a complete state (no {COMPLETE} marker)")
    msd, osd = get_state_dict(model, optimizer)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=str(d))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    rng = d / "rng" / f"rank-{rank:05d}.pt"
    if rng.is_file():
        _set_rng_state(torch.load(rng, weights_only=False))
    else:
        log.warning("%s missing (world size changed?): RNG not restored", rng)
    return json.loads((d / "meta.json").read_text(encoding="utf-8"))


# ---------------------------------------------------------------- preemption


class PreemptionFlag:
    """SIGTERM / SIGUSR1 set a flag; the loop saves state at the next step boundary and exits.

    The handler only flips a bool (safe at any point); ranks agree on stopping through an
    all-reduce in the loop, so a signal delivered to one rank stops all at the same step.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous = {}

    def install(self) -> "PreemptionFlag":
        for s in self.SIGNALS:
            self._previous[s] = signal.signal(s, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.signum = signum

    def restore(self) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)

    @property
    def set(self) -> bool:
        return self.signum is not None
