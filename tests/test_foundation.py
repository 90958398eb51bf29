"""The pieces every stage relies on: CLI convention, checksums, schema, tiny tokenizer/model."""
import json

import pytest
from omegaconf import OmegaConf

from common.cli import ConfigError, apply_overrides
from common.cli import shown
from common.io import check_sha256sums, write_sha256sums
from data_prep.schema import RecordError, make_record, tool_call, validate_record


def test_overrides_apply_and_unknown_key_suggests():
    base = OmegaConf.create({"train": {"lr": 1e-5, "steps": None}, "seed": 0})
    cfg = apply_overrides(base, ["lr=2e-5", "seed=3"], aliases={"lr": "train.lr"})
    assert cfg.train.lr == 2e-5 and cfg.seed == 3
    with pytest.raises(ConfigError, match="Did you mean: seed"):
        apply_overrides(base, ["sede=1"])
    with pytest.raises(ConfigError, match="key=value"):
        apply_overrides(base, ["seed"])
    # a section given one value (analyze slurm=5 was a traceback later); a mapping still merges
    with pytest.raises(ConfigError, match=r"^train=5: train is a section: give train\.KEY=VALUE \(train\.lr, train\.steps\)$"):
        apply_overrides(base, ["train=5"])
    assert apply_overrides(base, ["train={steps: 4}"]).train == {"lr": 1e-5, "steps": 4}
    # a mapping as a study hands a stage's file argument on (shown: it became the key 'steps:4'), and 24:00:00 as
    # text, not YAML 1.1's base-60 86400 (analyze slurm.time=24:00:00 asked Slurm for 60 days)
    assert apply_overrides(base, [f"train={shown({'steps': 4}, dotlist=True)}", "seed=24:00:00"]) == \
        {"train": {"lr": 1e-5, "steps": 4}, "seed": "24:00:00"}


def test_sha256sums_detects_changes(tmp_path):
    (tmp_path / "a.txt").write_text("hello")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.bin").write_bytes(b"\x00\x01")
    write_sha256sums(tmp_path)
    assert check_sha256sums(tmp_path) == []
    (tmp_path / "a.txt").write_text("hellO")
    (tmp_path / "extra").write_text("x")
    problems = check_sha256sums(tmp_path)
    assert any("a.txt: checksum mismatch" in p for p in problems)
    assert any("extra: present but not listed" in p for p in problems)


def _rec(**kw):
    base = dict(
        id="x1", source="search-r1", domain="search", task="q?", answer="a", terminator="final_answer",
        tools=[{"type": "function", "function": {"name": "search", "description": None, "parameters": {}}}],
        messages=[
            {"role": "user", "content": "q?"},
            {"role": "assistant", "content": "", "tool_calls": [tool_call("search", {"query": "q"}, "c0")]},
            {"role": "tool", "content": "doc", "tool_call_id": "c0", "name": "search"},
            {"role": "assistant", "content": "Final answer: a"},
        ],
    )
    base.update(kw)
    return base


def test_schema_strips_none_and_validates():
    rec = make_record(**_rec())
    assert "description" not in rec["tools"][0]["function"]
    json.dumps(rec)
    for bad, reason in [
        (dict(messages=[]), "empty_conversation"),
        (dict(messages=[{"role": "user", "content": "q"}]), "no_assistant_turn"),
        (dict(messages=[{"role": "robot", "content": "q"}]), "unknown_role"),
        (dict(messages=[{"role": "assistant", "content": None}]), "non_string_content"),
    ]:
        with pytest.raises(RecordError) as e:
            validate_record(_rec(**bad))
        assert e.value.reason == reason


def test_tiny_tokenizer_has_qwen3_tokens_and_template(tiny_tokenizer):
    tok = tiny_tokenizer
    assert len(tok) == 4096
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    ids = tok.convert_tokens_to_ids(["<|im_start|>", "<tool_call>", "<think>", "</think>"])
    assert len(set(ids)) == 4 and all(i >= 4070 for i in ids)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("<|im_start|>assistant\n<think>\n")
    # round trip, special tokens survive as single ids
    enc = tok(text)["input_ids"]
    assert tok.decode(enc) == text


def test_tiny_model_loads(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert m.config.model_type == "qwen3" and m.config.vocab_size == 4096
