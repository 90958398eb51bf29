"""The tiny model: the real Qwen3 architecture scaled down, random init from a config, and the
committed pretrained tiny base.

`model=tiny` in the recipes resolves to these numbers (random init); tests use `save_tiny_model`
to get a loadable Hugging Face model directory without any hub access. `model=tiny_base` loads
`sft/tiny_base/`, the same architecture after `python -m sft.tiny_pretrain` taught it to read.
"""
from __future__ import annotations

import functools
from pathlib import Path

# The committed pretrained tiny base (`model=tiny_base`, made by `python -m sft.tiny_pretrain`).
TINY_BASE_DIR = Path(__file__).with_name("tiny_base")
EMBEDDED_MODELS = {"tiny-base": TINY_BASE_DIR}

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
def tiny_tokenizer():
    from transformers import AutoTokenizer

    from data_prep.tiny import tiny_tokenizer_path

    return AutoTokenizer.from_pretrained(tiny_tokenizer_path())


def resolve_model_path(name: str) -> str:
    """A model path or hub id as the trainer loads it: `tiny-base` is the embedded pretrained dir."""
    if name not in EMBEDDED_MODELS:
        return name
    path = EMBEDDED_MODELS[name]
    if not (path / "model.safetensors").is_file():
        from common.cli import ConfigError

        raise ConfigError(f"model.path={name}: {path}/model.safetensors is missing "
                          "(it is committed; rebuild it with `python -m sft.tiny_pretrain`)")
    return str(path)


def tiny_config(**overrides):
    from transformers import Qwen3Config

    tok = tiny_tokenizer()
    kw = dict(TINY_CONFIG)
    kw.update(overrides)
    return Qwen3Config(
        **kw,
        bos_token_id=None,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.pad_token_id,
    )


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
