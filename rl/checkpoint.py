"""GRPO checkpoints and resumable state.

`checkpoints/step-000000/`  the starting model as a real directory: every file of a local start
    copied (a reflink where the filesystem offers one; never a hard link) or a hub model saved with
    `save_pretrained`, plus its own SHA256SUMS. A local start that carries SHA256SUMS (an SFT
    checkpoint) is verified first. Training loads the model from this directory, so the step-0
    evaluation is exactly the model GRPO started from.
`checkpoints/step-NNNNNN/`  merged full weights: the adapter is merged into a fresh fp32 copy of
    step-000000 with PEFT (`merge_and_unload`), then cast to the training dtype and saved in the base
    layout (tied output embedding stored once, no LoRA keys); the original tokenizer files and chat
    template and the generation config are copied from step-000000; `adapter/` holds the raw PEFT
    adapter; SHA256SUMS over everything. Written in a temp dir and renamed (common.io.atomic_dir);
    a redone step never deletes the old one: it and its evaluations are renamed aside unless the
    same files were written (common.layout.new_checkpoint).
`state/step-NNNNNN/`  what resuming needs, stored without pickle: `adapter.safetensors` (the LoRA
    tensors by PEFT name), `optimizer.safetensors` + `optimizer.json` (AdamW moments per parameter
    index, and the param groups), `rng/rank-NNNNN.safetensors` (each rank's RNG), `meta.json` (step,
    rows consumed, the lr scheduler's state), then SHA256SUMS, then COMPLETE (last) — sft.checkpoint's state contract, whose
    helpers it uses; loading verifies every checksum first.
"""
from __future__ import annotations

import contextlib
import json
import logging
import shutil
import warnings
from pathlib import Path

import torch

from common import layout
from common.io import SHA256SUMS, atomic_dir, check_sha256sums, write_json, write_sha256sums
from sft.checkpoint import (STATE_META, commit_state, StateError, newest_verified_state, read_rng, rng_file, tied_output_keys, verify_state)
from sft.hfconfig import save_config
from rl.errors import RlError

log = logging.getLogger("rl.checkpoint")

# Files of a model dir that are not weights/config: copied from step-000000 into every checkpoint.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "chat_template.json",
                   "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt",
                   "tokenizer.model", "generation_config.json")


class CheckpointError(RlError):
    """A starting model that can't be used (the message names the file and why; exit 2)."""


def _copy(src: Path, dst: Path) -> str:
    """A copy of the user's file: a reflink (copy-on-write clone, no data copied) where the filesystem
    offers one, else a plain copy. Never a hard link: writing into the run's step-000000 must never
    write into the user's source model."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl

        with open(src, "rb") as fin, open(dst, "wb") as fout:
            fcntl.ioctl(fout.fileno(), 0x40049409, fin.fileno())   # FICLONE
        shutil.copystat(src, dst)
        return "reflink"
    except (OSError, ImportError):
        shutil.copy2(src, dst)
        return "copy"


def write_start_checkpoint(model_path: str, out: Path) -> dict:
    """`checkpoints/step-000000` from a local model dir or a hub id; returns {"source", "files", "reflinked"}."""
    src = Path(model_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        if (src / SHA256SUMS).is_file():
            problems = check_sha256sums(src)
            if problems:
                raise CheckpointError(f"starting model {src} fails its SHA256SUMS: {problems[0]}")
        files = sorted(p for p in src.rglob("*")
                       if p.is_file() and p.name != SHA256SUMS and ".tmp-" not in p.relative_to(src).as_posix())
        if not files:
            raise CheckpointError(f"starting model {src} has no files")
        reflinked = 0
        with atomic_dir(out) as tmp:
            for p in files:
                reflinked += _copy(p, tmp / p.relative_to(src)) == "reflink"
            write_sha256sums(tmp)
        return {"source": str(src.resolve()), "files": len(files), "reflinked": reflinked}
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from common.hub import source

    # a hub id while the hub cannot answer: its cached copy, or one line now (huggingface_hub would retry ~25 s per file);
    # every file at the one commit hub_revision names (the Hub's main when it answers), recorded in the returned dict
    kw = source(model_path, "model.path", CheckpointError)
    with atomic_dir(out) as tmp:  # a hub id: the snapshot as transformers saves it (not verified offline)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype="auto", **kw, adapter_kwargs={"local_files_only": kw["local_files_only"]})
        model.save_pretrained(tmp, safe_serialization=True)
        save_config(model.config, tmp)
        AutoTokenizer.from_pretrained(model_path, **kw).save_pretrained(tmp)
        try:
            GenerationConfig.from_pretrained(model_path, **kw).save_pretrained(tmp)
        except (OSError, ValueError):
            pass
        write_sha256sums(tmp)
    return {"source": model_path, "revision": kw["revision"], "files": None, "reflinked": 0}


@contextlib.contextmanager
def peft_reading_old_flag():
    """Around a peft or TRL call that reads transformers' deprecated `is_gradient_checkpointing` (peft_model.py,
    trl/models/utils.py): that FutureWarning is for their authors, nothing this project or a user calls; scoped to
    the call, every other warning still shows."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        yield


def merged_state_dict(start_dir: Path, adapter_dir: Path, dtype: torch.dtype):
    """(merged model, state dict in `dtype` without the tied output key): PEFT merge in fp32, then cast."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(start_dir), dtype=torch.float32)
    with peft_reading_old_flag():
        merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    sd = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in merged.state_dict().items()}
    for key in tied_output_keys(merged):
        sd.pop(key, None)
    return merged, sd


def save_merged_checkpoint(peft_model, *, start_dir: Path, out: Path, dtype: torch.dtype) -> Path:
    """`checkpoints/step-NNNNNN`: merged weights + original tokenizer/template + generation_config + adapter/."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with layout.new_checkpoint(out, report=log.warning) as tmp:  # a redone step sets the old one aside
        peft_model.save_pretrained(str(tmp / layout.ADAPTER))
        merged, sd = merged_state_dict(start_dir, tmp / layout.ADAPTER, dtype)
        merged.save_pretrained(str(tmp), state_dict=sd, safe_serialization=True)
        merged.config.dtype = dtype  # the tensors written are in `dtype`, so config.json must say so
        save_config(merged.config, tmp)  # + the top-level rope fields v4 serving stacks read
        for name in TOKENIZER_FILES:
            if (start_dir / name).is_file():
                shutil.copy2(start_dir / name, tmp / name)
        write_sha256sums(tmp)
    return out


# ---------------------------------------------------------------- resumable state
# The project's state contract (sft.checkpoint): COMPLETE written last, SHA256SUMS over every file
# (`write_state_sums`), per-rank RNG as safetensors (`write_rng` / `read_rng`), verified before loading
# (`verify_state`; resume=auto takes `newest_verified_state`, skipping a damaged newer one), torn
# states removed by the next writer. Here the payload is the LoRA adapter and the AdamW state as
# safetensors + JSON: nothing is unpickled at all.

ADAPTER = "adapter.safetensors"
OPTIMIZER = "optimizer.safetensors"
OPTIMIZER_META = "optimizer.json"


def _optimizer_to_files(optimizer) -> tuple[dict, dict]:
    sd = optimizer.state_dict()
    tensors, scalars = {}, {}
    for idx, st in sd["state"].items():
        for k, v in st.items():
            if torch.is_tensor(v):
                tensors[f"{idx}.{k}"] = v.detach().cpu().contiguous()
            else:
                scalars[f"{idx}.{k}"] = v
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in sd["param_groups"]]
    return tensors, {"param_groups": groups, "scalars": scalars}


def _optimizer_from_files(tensors: dict, meta: dict) -> dict:
    state: dict = {}
    for key, v in [*tensors.items(), *meta["scalars"].items()]:
        idx, k = key.split(".", 1)
        state.setdefault(int(idx), {})[k] = v
    groups = [{k: (tuple(v) if k == "betas" else v) for k, v in g.items()} for g in meta["param_groups"]]
    return {"state": state, "param_groups": groups}


def save_state(run_dir: Path, step: int, *, adapter: dict, optimizer, meta: dict, rank: int, barrier) -> Path:
    """Write `state/step-NNNNNN` (every rank calls this; `barrier()` syncs them): each rank's RNG,
    then on rank 0 the adapter, optimizer and meta.json, SHA256SUMS, and COMPLETE last."""
    from safetensors.torch import save_file

    def main(d: Path) -> None:
        save_file({k: v.detach().cpu().contiguous() for k, v in adapter.items()}, str(d / ADAPTER))
        opt_tensors, opt_meta = _optimizer_to_files(optimizer)
        save_file(opt_tensors, str(d / OPTIMIZER))
        write_json(d / OPTIMIZER_META, opt_meta)

    return commit_state(run_dir, step, meta={**meta, "step": step}, rank=rank, barrier=barrier,
                        write_each_rank=lambda d: None, write_main=main)


def resume_dir(run_dir: Path, resume: str) -> Path | None:
    """The state to resume from: resume=auto -> the newest that verifies (StateError when states
    exist but none does), never -> None, else that directory. Collective under a process group."""
    if resume == "never":
        return None
    if resume != "auto":
        return Path(resume)
    state_root = layout.states_dir(run_dir)
    d, skipped = newest_verified_state(state_root)
    if d is None and skipped:
        raise StateError(f"resume=auto: no state under {state_root} passes its checks ({'; '.join(skipped)}); "
                         "move the state dir aside or pass resume=PATH")
    return d


def load_state(d: Path, *, verified: bool = False) -> dict:
    """Verify (StateError naming the file and reason; `verified`: resume_dir just did), then read:
    {"meta", "adapter", "optimizer"}. Collective under a process group (verify_state)."""
    from safetensors.torch import load_file

    problems = [] if verified else verify_state(Path(d))
    if problems:
        raise StateError(f"{d}: {problems[0]}" + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""))
    return {
        "meta": json.loads((d / STATE_META).read_text(encoding="utf-8")),
        "adapter": load_file(str(d / ADAPTER)),
        "optimizer": _optimizer_from_files(load_file(str(d / OPTIMIZER)),
                                           json.loads((d / OPTIMIZER_META).read_text(encoding="utf-8"))),
    }


def restore_rng(d: Path, rank: int) -> bool:
    """This rank's RNG from a verified state (False when the state has none for this rank)."""
    if not rng_file(d, rank).is_file():
        return False
    read_rng(rng_file(d, rank))
    return True
