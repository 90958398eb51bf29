"""The embedded tiny model and tokenizer, shared by every stage (DESIGN.md "The tiny model").

The files are committed: `common/tiny_tokenizer/` (a 4096-entry byte-level BPE with the Qwen3 added
tokens and the Qwen3 chat template; `python -m data_prep.tiny` rebuilds it) and `common/tiny_base/`
(the pretrained tiny base, `model=tiny_base`; `python -m sft.tiny_pretrain` rebuilds it). This module
only knows where they are, how a name resolves to them, and the tiny architecture; the writers that
produce them stay in their stages (`data_prep.tiny.build`, `sft.tiny.save_tiny_model`).
"""
from __future__ import annotations

import difflib
import functools
import os
import sys
from pathlib import Path

from common.cli import ConfigError

TOKENIZER_DIR = Path(__file__).with_name("tiny_tokenizer")
VOCAB_SIZE = 4096
# The committed pretrained tiny base (`model=tiny_base`, made by `python -m sft.tiny_pretrain`).
TINY_BASE_DIR = Path(__file__).with_name("tiny_base")
# The model aliases, one spelling each: `tiny_base` has weights; `tiny` is the tiny architecture initialised at
# random by the trainer (sft.model), so there is nothing to load from it.
EMBEDDED_MODELS = {"tiny_base": TINY_BASE_DIR}
RANDOM_MODEL = "tiny"
ALIASES = (*EMBEDDED_MODELS, RANDOM_MODEL)
# An older spelling, read as the alias with a note (run configs written before keep resolving).
OLD_SPELLINGS = {"tiny-base": "tiny_base"}

# ~1.3M parameters: big enough to learn the synthetic tasks in a few hundred CPU steps.
TINY_CONFIG = dict(
    vocab_size=VOCAB_SIZE,
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


def tiny_tokenizer_path() -> str:
    return str(TOKENIZER_DIR)


def resolve_tokenizer(name: str) -> str:
    """A tokenizer path or hub id as every stage accepts it: the value `tiny` is the embedded one."""
    return tiny_tokenizer_path() if name == "tiny" else name


def checked_tokenizer(name: str, key: str = "tokenizer", error: type[ConfigError] = ConfigError) -> str:
    """resolve_tokenizer's answer, checked without any network call: `tiny` and an existing local path pass; a model's
    name (a model recipe, an alias) is refused naming the tokenizer that model uses; anything else must be shaped like a
    Hub repo id (huggingface_hub's own rule). Refusals are `error`s, one line naming `key`."""
    if name == "tiny" or Path(os.path.expanduser(name)).exists():
        return resolve_tokenizer(name)
    from common.recipes import group_choices, load_recipe

    wants = f"{key}= takes a local tokenizer dir, a Hub repo id (ORG/NAME) or tiny (the embedded tokenizer)"
    model = OLD_SPELLINGS.get(name, name)
    if model in group_choices("model"):
        uses = load_recipe("model", model).model.tokenizer
        raise error(f"{key}={name}: a model (model={model}), not a tokenizer; did you mean {key}={uses}, the tokenizer "
                    f"of model={model}? ({wants})")
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        raise error(f"{key}={name}: no such local directory, and not a Hub repo id ({wants})") from None
    return name


@functools.lru_cache(maxsize=None)
def _note_old_spelling(name: str) -> None:
    print(f"note: model {name} is read as {OLD_SPELLINGS[name]} (did you mean {OLD_SPELLINGS[name]}? "
          "the one spelling of that alias)", file=sys.stderr)


def resolve_model_path(name: str, *, random_ok: bool = False) -> str:
    """A model path or hub id as a stage loads it, resolved here without any network call: `tiny_base` is
    the embedded pretrained dir; `tiny` (random init, no weights) stays `tiny` where the caller initialises
    it (`random_ok`, the SFT trainer) and is refused elsewhere; a name that is no local path and is close to
    an alias is refused with a "did you mean" before anything asks the hub for it."""
    name = str(name)
    if name in OLD_SPELLINGS:
        _note_old_spelling(name)
        name = OLD_SPELLINGS[name]
    if name == RANDOM_MODEL:
        if random_ok:
            return name
        raise ConfigError(f"model {name}: the tiny architecture initialised at random has no weights to load; "
                          f"did you mean {next(iter(EMBEDDED_MODELS))} (the pretrained tiny base)?")
    if name in EMBEDDED_MODELS:
        path = EMBEDDED_MODELS[name]
        if not (path / "model.safetensors").is_file():
            raise ConfigError(f"model {name}: {path}/model.safetensors is missing "
                              "(it is committed; rebuild it with `python -m sft.tiny_pretrain`)")
        return str(path)
    if "/" not in name and os.sep not in name and not Path(os.path.expanduser(name)).exists():
        close = difflib.get_close_matches(name.lower(), [*EMBEDDED_MODELS, *OLD_SPELLINGS], n=1, cutoff=0.75)
        if close:
            alias = OLD_SPELLINGS.get(close[0], close[0])
            raise ConfigError(f"model {name}: no such local directory or embedded model; did you mean {alias}?")
    return name


@functools.lru_cache(maxsize=1)
def tiny_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_tokenizer_path())


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
