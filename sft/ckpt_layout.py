"""What a checkpoint of a given config must contain: tensor names, shapes, vocab tensors.

The expected key set is derived, not listed: the architecture is instantiated on
the `meta` device (no memory, no download) and its state_dict names are taken,
minus the output embedding when the config ties it to the input embedding (the
serving copy stores a tied matrix once). For Qwen3-4B this gives 398 tensors:
36 layers x 11 + embedding + final norm.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

# torch dtype <-> safetensors dtype name.
TORCH_TO_ST = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
}
ST_TO_TORCH = {v: k for k, v in TORCH_TO_ST.items()}

# The `dtype=` choices of export-checkpoint.
EXPORT_DTYPES = {
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16,
    "fp32": torch.float32, "float32": torch.float32,
}

# Prefixes FSDP / activation-checkpoint wrappers add to parameter names; a state
# saved without cleaning them still maps onto the plain Hugging Face names.
WRAPPER_PARTS = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")


@dataclass
class ExpectedLayout:
    """The tensors a serving checkpoint of `config` holds, in state_dict order."""

    shapes: dict[str, tuple[int, ...]]
    floating: dict[str, bool]  # whether the tensor takes the checkpoint's float dtype
    input_embedding: str  # e.g. model.embed_tokens.weight
    output_embedding: str | None  # e.g. lm_head.weight (None if the model has none)
    vocab_keys: list[str]  # every tensor whose rows are the vocabulary
    tied: bool  # output embedding shares the input embedding (and is not stored)
    architecture: str  # e.g. Qwen3ForCausalLM


def meta_model(config):
    """The architecture for `config` on the meta device: shapes and names, no storage."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def _param_names(model, module) -> list[str]:
    """State-dict names of `module`'s own parameters inside `model`."""
    for prefix, mod in model.named_modules():
        if mod is module:
            dot = f"{prefix}." if prefix else ""
            return [f"{dot}{n}" for n, _ in mod.named_parameters(recurse=False)]
    return []


def expected_layout(config) -> ExpectedLayout:
    model = meta_model(config)
    sd = model.state_dict()
    in_mod, out_mod = model.get_input_embeddings(), model.get_output_embeddings()
    in_names = _param_names(model, in_mod)
    out_names = _param_names(model, out_mod) if out_mod is not None else []
    in_weight = next(n for n in in_names if n.endswith("weight"))
    out_weight = next((n for n in out_names if n.endswith("weight")), None)
    tied = bool(getattr(config, "tie_word_embeddings", False)) and out_weight is not None
    shapes = {k: tuple(v.shape) for k, v in sd.items()}
    floating = {k: v.is_floating_point() for k, v in sd.items()}
    if tied:
        shapes.pop(out_weight)
        floating.pop(out_weight)
    return ExpectedLayout(
        shapes=shapes,
        floating=floating,
        input_embedding=in_weight,
        output_embedding=out_weight,
        vocab_keys=[n for n in in_names + out_names if n in sd],
        tied=tied,
        architecture=type(model).__name__,
    )


def config_dtype(config_json: dict) -> torch.dtype | None:
    """The dtype a config.json declares (`dtype`, or the older `torch_dtype`)."""
    name = config_json.get("dtype") or config_json.get("torch_dtype")
    dt = getattr(torch, name, None) if isinstance(name, str) else None
    return dt if isinstance(dt, torch.dtype) else None


def strip_wrapper_prefixes(name: str) -> str:
    """`_fsdp_wrapped_module.model.x` -> `model.x`; DDP's `module.` only as a leading prefix."""
    for p in WRAPPER_PARTS:
        name = name.replace(p, "")
    return name.removeprefix("module.")
