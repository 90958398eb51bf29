"""The embedded tiny tokenizer (used by `model=tiny`, the CPU demo and the tests).

A 4096-entry byte-level BPE with the Qwen3 added tokens (same strings, same order, same
special/non-special split) and the Qwen3-4B-Thinking-2507 chat template, so the tiny path runs
exactly the rendering and masking code the real model uses. The files are committed under
`common/tiny_tokenizer/` (`common.tiny` resolves them); `python -m data_prep.tiny` rebuilds them
deterministically.
"""
from __future__ import annotations

import sys
from pathlib import Path

from common.tiny import TOKENIZER_DIR, VOCAB_SIZE

# Qwen3's added tokens in id order; True = "special" (skipped by skip_special_tokens).
QWEN3_ADDED_TOKENS = [
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
    ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False),
    ("</tool_call>", False), ("<|fim_prefix|>", False), ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False), ("<|fim_pad|>", False), ("<|repo_name|>", False),
    ("<|file_sep|>", False), ("<tool_response>", False), ("</tool_response>", False),
    ("<think>", False), ("</think>", False),
]


def _training_corpus() -> list[str]:
    """Deterministic English + code + JSON text: Python's own stdlib sources and docstrings."""
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py"))[:120]
    return [p.read_text(encoding="utf-8", errors="replace") for p in files]


def build(out: Path = TOKENIZER_DIR) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    bpe.decoder = decoders.ByteLevel()
    n_added = len(QWEN3_ADDED_TOKENS)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - n_added,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_training_corpus(), trainer=trainer)
    from tokenizers import AddedToken

    # Added in Qwen3's order so ids follow the BPE vocab contiguously, as in the real tokenizer.
    bpe.add_tokens([AddedToken(t, special=s, normalized=False) for t, s in QWEN3_ADDED_TOKENS])
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe)
    tok.add_special_tokens(
        {"additional_special_tokens": [t for t, s in QWEN3_ADDED_TOKENS if s and t != "<|endoftext|>"]}
    )
    tok.eos_token = "<|im_end|>"
    tok.pad_token = "<|endoftext|>"
    template = Path(__file__).with_name("templates").joinpath("qwen3_thinking.jinja").read_text()
    tok.chat_template = template
    tok.model_max_length = 262144
    out.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(out)
    print(f"wrote {out} (vocab {len(tok)})")


USAGE = "usage: python -m data_prep.tiny [OUT_DIR]   (default: common/tiny_tokenizer/, the committed copy)"


def main(argv: list[str]) -> int:
    if argv in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if len(argv) > 1 or (argv and argv[0].startswith("-")):
        print(USAGE, file=sys.stderr)
        return 2
    build(Path(argv[0]) if argv else TOKENIZER_DIR)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
