"""The tiny model: the real Qwen3 architecture scaled down, random init from a config.

`model=tiny` in the recipes resolves to these numbers; tests and the CPU demo use
`save_tiny_model` to get a loadable Hugging Face model directory without any hub access.
"""
from __future__ import annotations

import functools
from pathlib import Path

# ~1.3M parameters: big enough to learn the synthetic tasks in a few hundred CPU steps.
TINY_CONFIG = dict(
    vocab_size=4096,
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=8192,
    rope_theta=10000.0,
    tie_word_embeddings=True,
    rms_norm_eps=1e-6,
)


@functools.lru_cache(maxsize=1)
def _tiny_tokenizer():
    from transformers import AutoTokenizer

    from data_prep.tiny import tiny_tokenizer_path

    return AutoTokenizer.from_pretrained(tiny_tokenizer_path())


def tiny_config(**overrides):
    from transformers import Qwen3Config

    tok = _tiny_tokenizer()
    kw = dict(TINY_CONFIG)
    kw.update(overrides)
    return Qwen3Config(
        **kw,
        bos_token_id=None,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.pad_token_id,
    )


def save_tiny_model(out: str | Path, seed: int = 0, **overrides) -> Path:
    """Write a random-init tiny Qwen3 + the tiny tokenizer as a Hugging Face model dir."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    out = Path(out)
    torch.manual_seed(seed)
    cfg = tiny_config(**overrides)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.save_pretrained(out)
    _tiny_tokenizer().save_pretrained(out)
    GenerationConfig(eos_token_id=[cfg.eos_token_id], pad_token_id=cfg.pad_token_id).save_pretrained(out)
    return out
