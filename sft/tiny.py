"""Write the tiny model (`common.tiny`: the real Qwen3 architecture scaled down) as a loadable
Hugging Face model directory without any hub access: random init from a seed, or given weights."""
from __future__ import annotations

from pathlib import Path

from common.tiny import tiny_config, tiny_tokenizer


def save_tiny_model(out: str | Path, seed: int = 0, model=None, **overrides) -> Path:
    """Write a tiny Qwen3 + the tiny tokenizer as a Hugging Face model dir: random init from
    `seed` (and config overrides), or the given `model`'s weights."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    out = Path(out)
    if model is None:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(tiny_config(**overrides), dtype=torch.float32)
    from .hfconfig import save_config

    cfg = model.config
    model.save_pretrained(out)
    save_config(cfg, out)   # + the top-level rope_theta transformers-4 readers need
    tiny_tokenizer().save_pretrained(out)
    GenerationConfig(eos_token_id=[cfg.eos_token_id], pad_token_id=cfg.pad_token_id).save_pretrained(out)
    return out
