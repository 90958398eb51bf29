"""GRPO checkpoints and resumable state.

`checkpoints/step-000000/`  the starting model as a real directory: every file of a local start
    (hard links where the filesystem allows, else copies) or a hub model saved with
    `save_pretrained`, plus its own SHA256SUMS. A local start that carries SHA256SUMS (an SFT
    checkpoint) is verified first. Training loads the model from this directory, so the step-0
    evaluation is exactly the model GRPO started from.
`checkpoints/step-NNNNNN/`  merged full weights: the adapter is merged into a fresh fp32 copy of
    step-000000 with PEFT (`merge_and_unload`), then cast to the training dtype and saved in the base
    layout (tied output embedding stored once, no LoRA keys); the original tokenizer files and chat
    template and the generation config are copied from step-000000; `adapter/` holds the raw PEFT
    adapter; SHA256SUMS over everything. Written in a temp dir and renamed (common.io.atomic_dir).
`state/step-NNNNNN/`  what resuming needs, stored without pickle: `adapter.safetensors` (the LoRA
    tensors by PEFT name), `optimizer.safetensors` + `optimizer.json` (AdamW moments per parameter
    index, and the param groups), `rng.safetensors` + `rng.json`, `meta.json` (step, rows consumed),
    then SHA256SUMS, then COMPLETE (last). Loading checks COMPLETE and every checksum first.
    This is the state contract of sft/checkpoint.py (COMPLETE last, torn dirs ignored) with
    SHA256SUMS from common.io; nothing here is unpickled.
"""
from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch

from common.io import SHA256SUMS, atomic_dir, check_sha256sums, write_json, write_sha256sums
from sft.checkpoint import COMPLETE, complete_states, step_name, tied_output_keys
from sft.hfconfig import save_config

# Files of a model dir that are not weights/config: copied from step-000000 into every checkpoint.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "chat_template.json",
                   "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt",
                   "tokenizer.model", "generation_config.json")
KEEP_STATES = 2


class CheckpointError(RuntimeError):
    pass


def _link_or_copy(src: Path, dst: Path) -> str:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
        return "link"
    except OSError:
        shutil.copy2(src, dst)
        return "copy"


def write_start_checkpoint(model_path: str, out: Path) -> dict:
    """`checkpoints/step-000000` from a local model dir or a hub id; returns {"source", "files", "linked"}."""
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
        linked = 0
        with atomic_dir(out) as tmp:
            for p in files:
                linked += _link_or_copy(p, tmp / p.relative_to(src)) == "link"
            write_sha256sums(tmp)
        return {"source": str(src.resolve()), "files": len(files), "linked": linked}
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    with atomic_dir(out) as tmp:  # a hub id: the snapshot as transformers saves it (not verified offline)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype="auto")
        model.save_pretrained(tmp, safe_serialization=True)
        save_config(model.config, tmp)
        AutoTokenizer.from_pretrained(model_path).save_pretrained(tmp)
        try:
            GenerationConfig.from_pretrained(model_path).save_pretrained(tmp)
        except (OSError, ValueError):
            pass
        write_sha256sums(tmp)
    return {"source": model_path, "files": None, "linked": 0}


def merged_state_dict(start_dir: Path, adapter_dir: Path, dtype: torch.dtype):
    """(merged model, state dict in `dtype` without the tied output key): PEFT merge in fp32, then cast."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(start_dir), dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    sd = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in merged.state_dict().items()}
    for key in tied_output_keys(merged):
        sd.pop(key, None)
    return merged, sd


def save_merged_checkpoint(peft_model, *, start_dir: Path, out: Path, dtype: torch.dtype) -> Path:
    """`checkpoints/step-NNNNNN`: merged weights + original tokenizer/template + generation_config + adapter/."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_dir(out) as tmp:
        peft_model.save_pretrained(str(tmp / "adapter"))
        merged, sd = merged_state_dict(start_dir, tmp / "adapter", dtype)
        merged.save_pretrained(str(tmp), state_dict=sd, safe_serialization=True)
        merged.config.dtype = dtype  # the tensors written are in `dtype`, so config.json must say so
        save_config(merged.config, tmp)  # + the top-level rope fields v4 serving stacks read
        for name in TOKENIZER_FILES:
            if (start_dir / name).is_file():
                shutil.copy2(start_dir / name, tmp / name)
        write_sha256sums(tmp)
    return out


# ---------------------------------------------------------------- resumable state


def _optimizer_to_files(optimizer) -> tuple[dict, dict]:
    sd = optimizer.state_dict()
    tensors = {}
    steps = {}
    for idx, st in sd["state"].items():
        for k, v in st.items():
            if torch.is_tensor(v):
                tensors[f"{idx}.{k}"] = v.detach().cpu().contiguous()
            else:
                steps[f"{idx}.{k}"] = v
    groups = []
    for g in sd["param_groups"]:
        groups.append({k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()})
    return tensors, {"param_groups": groups, "scalars": steps}


def _optimizer_from_files(tensors: dict, meta: dict) -> dict:
    state: dict = {}
    for key, v in tensors.items():
        idx, k = key.split(".", 1)
        state.setdefault(int(idx), {})[k] = v
    for key, v in meta["scalars"].items():
        idx, k = key.split(".", 1)
        state.setdefault(int(idx), {})[k] = v
    groups = [{k: (tuple(v) if k == "betas" else v) for k, v in g.items()} for g in meta["param_groups"]]
    return {"state": state, "param_groups": groups}


def _rng_to_files() -> tuple[dict, dict]:
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"cuda.{i}"] = s
    np_state = np.random.get_state()
    meta = {"python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
            "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])]}
    return tensors, meta


def _rng_from_files(tensors: dict, meta: dict) -> None:
    torch.set_rng_state(tensors["torch"])
    cuda = [tensors[k] for k in sorted(k for k in tensors if k.startswith("cuda."))]
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    v, state, gauss = meta["python"]
    random.setstate((v, tuple(state), gauss))
    name, keys, pos, has_gauss, cached = meta["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


def save_state(run_dir: Path, step: int, *, adapter: dict, optimizer, meta: dict) -> Path:
    """Write `state/step-NNNNNN` (SHA256SUMS, then COMPLETE last) and prune older complete states."""
    from safetensors.torch import save_file

    final = Path(run_dir) / "state" / step_name(step)
    final.parent.mkdir(parents=True, exist_ok=True)
    with atomic_dir(final) as tmp:
        save_file({k: v.detach().cpu().contiguous() for k, v in adapter.items()}, str(tmp / "adapter.safetensors"))
        opt_tensors, opt_meta = _optimizer_to_files(optimizer)
        save_file(opt_tensors, str(tmp / "optimizer.safetensors"))
        write_json(tmp / "optimizer.json", opt_meta)
        rng_tensors, rng_meta = _rng_to_files()
        save_file(rng_tensors, str(tmp / "rng.safetensors"))
        write_json(tmp / "rng.json", rng_meta)
        write_json(tmp / "meta.json", {**meta, "step": step})
        write_sha256sums(tmp)
        (tmp / COMPLETE).write_text(f"{step}\n", encoding="utf-8")
    states = complete_states(final.parent)
    for _, d in states[:-KEEP_STATES]:
        shutil.rmtree(d, ignore_errors=True)  # the trainer's own older states, not user files
    return final


def latest_state(run_dir: Path) -> Path | None:
    states = complete_states(Path(run_dir) / "state")
    return states[-1][1] if states else None


def load_state(d: Path) -> dict:
    """Verify then read a state dir: {"meta", "adapter", "optimizer" (a state_dict), "rng": (tensors, meta)}."""
    from safetensors.torch import load_file

    if not (d / COMPLETE).is_file():
        raise CheckpointError(f"{d}: not a complete state (no {COMPLETE} marker)")
    problems = [p for p in check_sha256sums(d) if not p.endswith(f"{COMPLETE}: present but not listed in SHA256SUMS")]
    if problems:
        raise CheckpointError(f"{d}: state fails its checksums: {problems[0]}")
    opt = _optimizer_from_files(load_file(str(d / "optimizer.safetensors")),
                                json.loads((d / "optimizer.json").read_text(encoding="utf-8")))
    return {
        "meta": json.loads((d / "meta.json").read_text(encoding="utf-8")),
        "adapter": load_file(str(d / "adapter.safetensors")),
        "optimizer": opt,
        "rng": (load_file(str(d / "rng.safetensors")), json.loads((d / "rng.json").read_text(encoding="utf-8"))),
    }


def restore_rng(rng: tuple[dict, dict]) -> None:
    _rng_from_files(*rng)
