"""The embedded pretrained tiny base: its corpus, packing, the pretraining script and the committed weights."""
from __future__ import annotations

import json

import pytest
import torch

from data_prep.synthetic import SyntheticConfig, make_world, reading_texts
from common.tiny import TINY_BASE_DIR, TINY_CONFIG, resolve_model_path
from sft.tiny_pretrain import PretrainConfig, pack_rows, pretrain


def test_reading_texts_are_deterministic_and_answerable_from_the_text():
    cfg = SyntheticConfig(world_seed=5, n_entities=50)
    a, b = reading_texts(200, 1, cfg), reading_texts(200, 1, cfg)
    assert a == b and a != reading_texts(200, 2, cfg)
    facts = {f"The {k} of {e.name} is {v}." for e in make_world(cfg) for k, v in e.attrs.items()}
    for t in a:
        if "\nAnswer: " in t:
            body, ans = t.rsplit("\nAnswer: ", 1)
            q = body.rsplit("Question: What is the ", 1)[1].rstrip("?")
            attr, name = q.split(" of ", 1)
            # the answer is stated in one of the passage's documents, as a true fact of the world
            fact = f"The {attr} of {name} is {ans}."
            assert fact in body and fact in facts, t


def test_pack_rows_restarts_positions_and_never_targets_across_passages():
    seqs = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    ids, pos, labels = pack_rows(seqs, seq_len=6, pad_id=0)
    assert ids.tolist() == [[1, 2, 3, 4, 5, 0], [6, 7, 8, 9, 0, 0]]
    assert pos.tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 1]]
    # HF shifts labels: label[i] is predicted from token i-1, so a passage's first token is never a target
    assert labels.tolist() == [[-100, 2, 3, -100, 5, -100], [-100, 7, 8, 9, -100, -100]]
    with pytest.raises(ValueError, match="7 tokens > seq_len 6"):
        pack_rows([[1] * 7], seq_len=6, pad_id=0)


def test_pretrain_writes_a_loadable_base_and_its_record(tmp_path):
    from transformers import AutoModelForCausalLM

    info = pretrain(tmp_path / "base", PretrainConfig(steps=4, batch=2, seq_len=512, warmup=2, eval_every=4,
                                                      eval_n=5, n_entities=100), log=lambda *_: None)
    assert info["loss_last25"] < info["loss_first"]  # 4 steps at lr 3e-3 already move a random init
    assert [e["step"] for e in info["evals"]] == [4]
    rec = json.loads((tmp_path / "base" / "pretrain.json").read_text())
    assert rec["config"]["steps"] == 4 and rec["corpus_sha256"] == info["corpus_sha256"]
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    assert model.config.hidden_size == TINY_CONFIG["hidden_size"]


def test_pretrain_is_deterministic(tmp_path):
    cfg = PretrainConfig(steps=3, batch=2, seq_len=512, warmup=1, eval_every=3, eval_n=4, n_entities=100)
    a = pretrain(tmp_path / "a", cfg, log=lambda *_: None)
    b = pretrain(tmp_path / "b", cfg, log=lambda *_: None)
    assert a["loss_curve_every_25"] == b["loss_curve_every_25"] and a["corpus_sha256"] == b["corpus_sha256"]
    # the mean of the (here 3) last losses, not their sum over 25 (seen failing: 3/25 of the mean)
    assert a["loss_first"] / 2 < a["loss_last25"] < a["loss_first"] * 1.5
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()


@pytest.mark.parametrize("args,needle", [(["--steps", "0"], "--steps 0"), (["--batch", "-2"], "--batch -2"),
                                         (["--eval-every", "0"], "--eval-every 0"), (["--min-lr-ratio", "2"], "--min-lr-ratio 2.0"),
                                         (["--out", "FILE"], "is a file")])
def test_pretrain_command_refuses_a_bad_value_before_any_work(tmp_path, capsys, args, needle):
    """Seen failing: IndexError, ZeroDivisionError or an AssertionError from save_pretrained, after minutes of work."""
    from sft.tiny_pretrain import main

    (tmp_path / "f").write_text("mine")
    argv = ["--out", str(tmp_path / "base"), *[str(tmp_path / "f") if a == "FILE" else a for a in args]]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and not (tmp_path / "base").exists(), err
    assert (tmp_path / "f").read_text() == "mine"


def test_tokenizer_rebuild_command_takes_one_dir_or_help(tmp_path, monkeypatch, capsys):
    """`python -m data_prep.tiny --help` printed `wrote --help` after building a tokenizer into ./--help."""
    from data_prep.tiny import main

    monkeypatch.chdir(tmp_path)
    assert main(["--help"]) == 0 and "usage: python -m data_prep.tiny" in capsys.readouterr().out
    assert main(["a", "b"]) == 2 and main(["-x"]) == 2 and list(tmp_path.iterdir()) == []


def test_committed_tiny_base_loads_and_reads():
    """The committed weights are the tiny architecture, load in transformers, and their record shows
    they learned to read (held-out world) - the reason the demo starts from them."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sft.tiny_pretrain import reading_accuracy

    path = resolve_model_path("tiny-base")
    assert path == str(TINY_BASE_DIR)
    rec = json.loads((TINY_BASE_DIR / "pretrain.json").read_text())
    assert rec["evals"][-1]["heldout_reading_accuracy"]["all"] >= 0.5
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    for k in ("hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads"):
        assert getattr(model.config, k) == TINY_CONFIG[k]
    tok = AutoTokenizer.from_pretrained(path)
    assert reading_accuracy(model, tok, n=60, seed=7)["all"] >= 0.4  # re-measured here, on fresh items


def test_model_tiny_base_recipe_resolves_to_the_committed_dir(tmp_path):
    from launch.compose import compose
    from sft.config import from_dictconfig

    cfg = compose(["model=tiny_base"]).cfg
    assert cfg.model.path == "tiny_base" and cfg.model.init == "pretrained"
    cfg.run_dir, cfg.data.dir = str(tmp_path / "run"), str(tmp_path / "data")
    assert from_dictconfig(cfg).model.path == str(TINY_BASE_DIR)
