"""export-checkpoint / verify-checkpoint: exact round trips, vocab trimming, tied heads,
state-dir export, and one distinct finding per kind of corruption."""
from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess

import pytest
import torch

from common.io import write_sha256sums
from sft.export import export_checkpoint, export_main
from sft.export_source import ExportError
from sft.verify import verify_checkpoint, verify_main
from tests.conftest import ROOT

INPUT = torch.tensor([[4071, 17, 300, 2048, 9, 4000, 123, 5]])
UP = "model.layers.0.mlp.up_proj.weight"


def logits(model_dir, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).eval()
    with torch.no_grad():
        return model(INPUT).logits


@pytest.fixture(scope="module")
def exported_fp32(tiny_model_dir, tmp_path_factory):
    """The tiny model exported in fp32 with 1MB shards, so the index is exercised."""
    out = tmp_path_factory.mktemp("export") / "fp32"
    export_checkpoint(tiny_model_dir, out, dtype="fp32", max_shard_size="1MB")
    return out


def test_qwen3_4b_layout_is_398_tensors():
    from transformers import Qwen3Config

    from sft.ckpt_layout import expected_layout

    cfg = Qwen3Config(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                      head_dim=128, intermediate_size=9728, vocab_size=151936, tie_word_embeddings=True)
    layout = expected_layout(cfg)
    assert len(layout.shapes) == 398 == 36 * 11 + 2
    assert layout.tied and "lm_head.weight" not in layout.shapes
    assert layout.shapes["model.embed_tokens.weight"] == (151936, 2560)
    assert layout.shapes["model.layers.35.mlp.down_proj.weight"] == (2560, 9728)


def test_fp32_export_round_trips_logits_exactly(tiny_model_dir, exported_fp32):
    index = json.loads((exported_fp32 / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert "lm_head.weight" not in index["weight_map"] and len(index["weight_map"]) == 46
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        assert (exported_fp32 / name).read_bytes() == (tiny_model_dir / name).read_bytes()
    assert verify_checkpoint(exported_fp32) == []
    assert torch.equal(logits(tiny_model_dir), logits(exported_fp32))
    if shutil.which("sha256sum"):
        subprocess.run(["sha256sum", "--quiet", "-c", "SHA256SUMS"], cwd=exported_fp32, check=True)


def test_bf16_export_is_default_and_loads(tiny_model_dir, tmp_path):
    out = tmp_path / "bf16"
    summary = export_checkpoint(tiny_model_dir, out)
    assert summary["weight_files"] == ["model.safetensors"] and not (out / "model.safetensors.index.json").exists()
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    assert verify_checkpoint(out) == []
    got = logits(out, dtype="auto")
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), logits(tiny_model_dir), atol=0.1, rtol=0.05)


@pytest.fixture(scope="module")
def padded_dir(tmp_path_factory):
    """A tiny model whose vocab tensors were padded to 4160 rows (config says 4160 too)."""
    from sft.tiny import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("padded") / "model", seed=1, vocab_size=4160)


def test_padded_vocab_is_trimmed_to_vocab_size(padded_dir, tmp_path):
    out = tmp_path / "trimmed"
    summary = export_checkpoint(padded_dir, out, dtype="fp32", vocab_size=4096)
    assert any("trimmed 64 padded vocab rows from model.embed_tokens.weight" in n for n in summary["notes"])
    assert json.loads((out / "config.json").read_text())["vocab_size"] == 4096
    assert verify_checkpoint(out) == []
    assert torch.equal(logits(out), logits(padded_dir)[..., :4096])


def test_padded_rows_beyond_config_vocab_are_trimmed(padded_dir, tmp_path):
    # A checkpoint whose tensors carry more rows than its config.vocab_size says.
    src = shutil.copytree(padded_dir, tmp_path / "src")
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "vocab_size": 4096}))
    out = tmp_path / "out"
    export_checkpoint(src, out, dtype="fp32")
    assert verify_checkpoint(out) == []
    assert torch.equal(logits(out), logits(padded_dir)[..., :4096])


def test_export_is_deterministic(tiny_model_dir, tmp_path):
    for name in ("a", "b"):
        export_checkpoint(tiny_model_dir, tmp_path / name, max_shard_size="1MB")
    assert (tmp_path / "a" / "SHA256SUMS").read_text() == (tmp_path / "b" / "SHA256SUMS").read_text()


def test_export_records_its_source_absolute(tiny_model_dir, tmp_path, monkeypatch):
    """`ckpt=` given relative to the working directory: export_info.json (and the model card that quotes it) names the
    source by its absolute path (seen failing: `model`, which names nothing from any other directory)."""
    monkeypatch.chdir(tiny_model_dir.parent)
    summary = export_checkpoint("model", tmp_path / "out", dtype="fp32")
    monkeypatch.chdir(tmp_path)
    info = json.loads((tmp_path / "out" / "export_info.json").read_text())
    assert info["source"] == summary["source"] == str(tiny_model_dir), info
    assert f"{info['source']} (step" in (tmp_path / "out" / "README.md").read_text().replace("\\_", "_")


def test_source_without_tokenizer_is_refused(tiny_model_dir, tmp_path):
    src = shutil.copytree(tiny_model_dir, tmp_path / "src")
    (src / "tokenizer.json").unlink()
    with pytest.raises(ExportError, match="no tokenizer files"):
        export_checkpoint(src, tmp_path / "out")


def test_vocab_smaller_than_tokenizer_is_refused(padded_dir, tmp_path):
    with pytest.raises(ExportError, match="smaller than the tokenizer"):
        export_checkpoint(padded_dir, tmp_path / "out", vocab_size=4000)
    assert not (tmp_path / "out").exists()


def test_real_qwen3_tokenizer_padded_152064_rows_trimmed_to_151936(tmp_path):
    """The case from the field: 152064 embedding rows, config and serving size 151936, tokenizer 151669."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    from tests.conftest import shared_path

    tok_dir = shared_path("fixtures", "qwen3_tokenizer")
    cfg = Qwen3Config(vocab_size=152064, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=4, tie_word_embeddings=True)
    torch.manual_seed(0)
    src = tmp_path / "src"
    AutoModelForCausalLM.from_config(cfg).save_pretrained(str(src))
    for p in tok_dir.iterdir():
        shutil.copy(p, src / p.name)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "vocab_size": 151936}))
    summary = export_checkpoint(src, tmp_path / "out")
    assert "trimmed 128 padded vocab rows from model.embed_tokens.weight (152064 -> 151936)" in summary["notes"]
    assert (tmp_path / "out" / "chat_template.jinja").read_bytes() == (tok_dir / "chat_template.jinja").read_bytes()
    assert verify_checkpoint(tmp_path / "out") == []


def test_untied_model_keeps_both_matrices(tmp_path):
    from sft.tiny import save_tiny_model

    src = save_tiny_model(tmp_path / "untied", seed=2, tie_word_embeddings=False)
    (src / "generation_config.json").unlink()  # derived from config.json when the source has none
    summary = export_checkpoint(src, tmp_path / "out", dtype="fp32")
    assert any("no generation_config.json" in n for n in summary["notes"])
    assert json.loads((tmp_path / "out" / "generation_config.json").read_text())["eos_token_id"] == 4072
    assert verify_checkpoint(tmp_path / "out") == []
    assert torch.equal(logits(tmp_path / "out"), logits(src))
    from safetensors import safe_open

    with safe_open(str(tmp_path / "out" / "model.safetensors"), "pt") as f:
        assert {"lm_head.weight", "model.embed_tokens.weight"} <= set(f.keys())


def _with_tensors(src_dir, dst, extra):
    """A copy of `src_dir` whose model.safetensors also holds `extra(state_dict)`."""
    from safetensors.torch import load_file, save_file

    dst = shutil.copytree(src_dir, dst)
    sd = load_file(str(dst / "model.safetensors"))
    sd.update(extra(sd))
    save_file(sd, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def _with_lm_head(src_dir, dst, delta):
    return _with_tensors(src_dir, dst, lambda sd: {"lm_head.weight": sd["model.embed_tokens.weight"].clone() + delta})


def test_tied_lm_head_dropped_only_when_equal(tiny_model_dir, tmp_path):
    same = _with_lm_head(tiny_model_dir, tmp_path / "same", 0.0)
    summary = export_checkpoint(same, tmp_path / "out", dtype="fp32")
    assert any(n.startswith("dropped lm_head.weight") for n in summary["notes"])
    assert verify_checkpoint(tmp_path / "out") == []
    differs = _with_lm_head(tiny_model_dir, tmp_path / "differs", 1e-3)
    with pytest.raises(ExportError, match="lm_head.weight differs from model.embed_tokens.weight"):
        export_checkpoint(differs, tmp_path / "out2")


def test_tensors_transformers_ignores_on_load_are_dropped_and_listed(tiny_model_dir, tmp_path, monkeypatch):
    """An older checkpoint's per-layer `rotary_emb.inv_freq` buffers: transformers' own load of the source ignores them
    (the oracle: its loading report), so the export drops them and lists them; any other extra tensor is still refused
    (seen failing: the inv_freq source was refused as "unexpected tensor"). The export asks transformers' public loading
    report, never its private `_adjust_missing_and_unexpected_keys` (which any release may change or drop: before, the
    export called it), and a loading report that fails is a one-line ExportError."""
    import sys

    from transformers import AutoModelForCausalLM, PreTrainedModel

    private = PreTrainedModel._adjust_missing_and_unexpected_keys

    def transformers_only(self, *args, **kwargs):
        caller = sys._getframe(1).f_globals["__name__"]
        assert caller.startswith("transformers."), f"{caller} calls transformers' private _adjust_missing_and_unexpected_keys"
        return private(self, *args, **kwargs)

    monkeypatch.setattr(PreTrainedModel, "_adjust_missing_and_unexpected_keys", transformers_only)
    n_layers = json.loads((tiny_model_dir / "config.json").read_text())["num_hidden_layers"]
    old = {f"model.layers.{i}.self_attn.rotary_emb.inv_freq": torch.arange(16.0) for i in range(n_layers)}
    stray = "model.layers.0.self_attn.extra.weight"
    src = _with_tensors(tiny_model_dir, tmp_path / "old", lambda sd: old)
    both = _with_tensors(src, tmp_path / "stray", lambda sd: {stray: torch.zeros(2)})
    assert AutoModelForCausalLM.from_pretrained(str(both), output_loading_info=True)[1]["unexpected_keys"] == {stray}
    summary = export_checkpoint(src, tmp_path / "out", dtype="fp32")
    assert f"dropped {n_layers} tensor(s) Qwen3ForCausalLM ignores on load: {', '.join(sorted(old))}" in summary["notes"]
    assert json.loads((tmp_path / "out" / "export_info.json").read_text())["ignored_on_load"] == sorted(old)
    assert verify_checkpoint(tmp_path / "out") == []  # loads with no missing or unexpected key, every tensor as stored
    with pytest.raises(ExportError, match=f"for this config:\n  unexpected tensor {stray}$"):
        export_checkpoint(both, tmp_path / "out2")
    # a base-model name transformers loads into model.layers.0.mlp.up_proj.weight is no ignored tensor: none is then
    from transformers import AutoConfig

    from sft.export import ignored_on_load

    assert ignored_on_load(AutoConfig.from_pretrained(src), [*old, "layers.0.mlp.up_proj.weight"], "src") == []
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: (_ for _ in ()).throw(OSError("no space left")))
    with pytest.raises(ExportError, match=r"transformers' loading report .* failed \(OSError: no space left\)$"):
        export_checkpoint(src, tmp_path / "out3")


def _save_state(step_dir, model_dir, step, complete=True, key_prefix=""):
    """A resumable state in the trainer's layout: DCP {"model", "optim"}, meta.json, hf/, COMPLETE."""
    import torch.distributed.checkpoint as dcp
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    sd = {key_prefix + k: v for k, v in model.state_dict().items()}
    optim = {"state": {"exp_avg": torch.zeros(3)}, "step": torch.tensor(float(step))}
    with pytest.warns(UserWarning):  # DCP warns that it saves without a process group
        dcp.save({"model": sd, "optim": optim}, checkpoint_id=str(step_dir), no_dist=True)
    (step_dir / "hf").mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        shutil.copy(model_dir / name, step_dir / "hf" / name)
    (step_dir / "meta.json").write_text(json.dumps({"step": step}))
    from sft.checkpoint import write_state_sums

    write_state_sums(step_dir)
    if complete:
        (step_dir / "COMPLETE").write_text("")


def test_export_from_latest_complete_state_of_a_run(tiny_model_dir, tmp_path):
    from sft.tiny import save_tiny_model

    run = tmp_path / "run"
    _save_state(run / "state" / "step-000010", tiny_model_dir, 10)
    other = save_tiny_model(tmp_path / "other", seed=7)
    _save_state(run / "state" / "step-000020", other, 20, complete=False)  # torn: must be skipped
    summary = export_checkpoint(run, tmp_path / "out", dtype="fp32")
    assert summary["kind"] == "state" and summary["step"] == 10
    assert any("skipped torn state" in n and "step-000020" in n for n in summary["notes"])
    # evaluations record checkpoints/step-N's digest, not a state's: the card says whose digest it is
    assert "(sha256sums; the digest an evaluation of the source directory records)" in (tmp_path / "out" / "README.md").read_text()
    assert verify_checkpoint(tmp_path / "out") == []
    assert torch.equal(logits(tmp_path / "out"), logits(tiny_model_dir))


def test_state_with_fsdp_wrapper_prefixes_exports(tiny_model_dir, tmp_path):
    step_dir = tmp_path / "step-000004"
    _save_state(step_dir, tiny_model_dir, 4, key_prefix="_fsdp_wrapped_module.")
    summary = export_checkpoint(step_dir, tmp_path / "out", dtype="fp32")
    assert summary["kind"] == "state" and summary["step"] == 4
    assert torch.equal(logits(tmp_path / "out"), logits(tiny_model_dir))


def test_run_without_complete_state_is_refused(tiny_model_dir, tmp_path):
    _save_state(tmp_path / "run" / "state" / "step-000005", tiny_model_dir, 5, complete=False)
    with pytest.raises(ExportError, match="no complete resumable state"):
        export_checkpoint(tmp_path / "run", tmp_path / "out")


# ---------------------------------------------------------------- corruptions

def _shard_of(d, key):
    return d / json.loads((d / "model.safetensors.index.json").read_text())["weight_map"][key]


def _edit_header(path, edit):
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    edit(header)
    hb = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(hb)) + hb + raw[8 + n:])


def _edit_index(d, edit):
    p = d / "model.safetensors.index.json"
    index = json.loads(p.read_text())
    edit(index)
    p.write_text(json.dumps(index))


def _edit_tensors(d, key, edit):
    """Rewrite the shard holding `key` with edit(tensors) applied, and the index to match."""
    from safetensors.torch import load_file, save_file

    shard = _shard_of(d, key)
    sd = load_file(str(shard))
    edit(sd)
    save_file(sd, str(shard), metadata={"format": "pt"})

    def fix(index):
        wm = {k: v for k, v in index["weight_map"].items() if v != shard.name}
        wm.update({k: shard.name for k in sd})
        index["weight_map"] = wm
        index["metadata"]["total_size"] = sum(t.nbytes for f in set(wm.values()) for t in load_file(str(d / f)).values())
    _edit_index(d, fix)


def _truncate(d):
    shard = _shard_of(d, UP)
    shard.write_bytes(shard.read_bytes()[:-100])


def _flip_byte(d):
    shard = _shard_of(d, UP)
    raw = bytearray(shard.read_bytes())
    raw[-50] ^= 0xFF
    shard.write_bytes(bytes(raw))


def _set_entry(field, value):
    return lambda d: _edit_header(_shard_of(d, UP), lambda h: h[UP].__setitem__(field, value))


def _overlap(d):
    def edit(h):
        second = sorted((v["data_offsets"][0], k) for k, v in h.items() if k != "__metadata__")[1][1]
        h[second]["data_offsets"] = [o - 8 for o in h[second]["data_offsets"]]
    _edit_header(_shard_of(d, UP), edit)


def test_config_without_architectures_is_reported(exported_fp32, tmp_path):
    d = shutil.copytree(exported_fp32, tmp_path / "ckpt")
    cfg = json.loads((d / "config.json").read_text())
    del cfg["architectures"]
    (d / "config.json").write_text(json.dumps(cfg))
    write_sha256sums(d)
    assert verify_checkpoint(d, load=False) == [f"{d / 'config.json'}: architectures expected ['Qwen3ForCausalLM'], found None"]


def test_repeated_header_key_is_reported(exported_fp32, tmp_path):
    d = shutil.copytree(exported_fp32, tmp_path / "ckpt")
    shard = _shard_of(d, UP)
    raw = shard.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    entry = json.dumps({UP: json.loads(raw[8:8 + n])[UP]})[1:-1]
    hb = raw[8:8 + n].rstrip()[:-1] + b"," + entry.encode() + b"}"  # the same name again, last
    shard.write_bytes(struct.pack("<Q", len(hb)) + hb + raw[8 + n:])
    assert f"header key expected once, found repeated: {UP} (2 times)" in "\n".join(verify_checkpoint(d))


CORRUPTIONS = {
    # name: (corrupt(dir), re-sign SHA256SUMS afterwards?, the finding it must produce)
    "truncated payload": (_truncate, False, "(truncated payload)"),
    "flipped byte": (_flip_byte, False, "checksum mismatch"),
    "missing tensor": (lambda d: _edit_tensors(d, UP, lambda sd: sd.pop(UP)), True, f"missing tensor {UP}"),
    "extra tensor": (lambda d: _edit_tensors(d, UP, lambda sd: sd.__setitem__("model.layers.0.mlp.extra.weight", torch.ones(4))),
                     True, "unexpected tensor model.layers.0.mlp.extra.weight"),
    "wrong dtype": (_set_entry("dtype", "I32"), True, f"tensor {UP}: dtype expected F32 (config dtype float32), found I32"),
    "wrong shape": (_set_entry("shape", [128, 384]), True, f"tensor {UP}: shape expected [384, 128], found [128, 384]"),
    "overlapping offsets": (_overlap, True, "overlap tensor"),
    "index -> missing file": (lambda d: _edit_index(d, lambda i: i["weight_map"].__setitem__(UP, "model-00099-of-00099.safetensors")),
                              True, "to model-00099-of-00099.safetensors: expected the file, found it missing"),
}


@pytest.mark.parametrize("kind", list(CORRUPTIONS))
def test_each_corruption_has_its_own_finding(kind, exported_fp32, tmp_path):
    corrupt, resign, finding = CORRUPTIONS[kind]
    d = shutil.copytree(exported_fp32, tmp_path / "ckpt")
    corrupt(d)
    if resign:  # a consistently re-signed bad file: only the structural check can catch it
        write_sha256sums(d)
    problems = verify_checkpoint(d)
    text = "\n".join(problems)
    assert finding in text, text
    assert resign == ("checksum" not in text), text
    others = [f for k, (_, _, f) in CORRUPTIONS.items() if k != kind and f != "checksum mismatch"]
    assert not any(f in text for f in others if f.startswith("missing") or f.startswith("unexpected")), text


# ---------------------------------------------------------------- command lines

def test_verify_cli_exit_codes_and_lines(exported_fp32, tmp_path, capsys):
    assert verify_main([str(exported_fp32), "load=false"]) == 0
    assert "OK" in capsys.readouterr().out
    d = shutil.copytree(exported_fp32, tmp_path / "bad")
    _flip_byte(d)
    _truncate(d)
    assert verify_main([str(d)]) == 1
    out = capsys.readouterr().out.splitlines()
    fails = [line for line in out if line.startswith("FAIL ")]
    assert len(fails) == 2 and "truncated payload" in fails[0] + fails[1] and "checksum mismatch" in fails[0] + fails[1]
    assert verify_main([str(d), str(d)]) == 2
    assert verify_main(["lod=false", str(d)]) == 2
    # a value its key's rule refuses, or a path given twice: one line naming it, never read as true or dropped
    for argv, line in (([str(d), "load=maybe"], "load='maybe': expected true or false"), (["path=5"], "path=5: expected a string"),
                       ([str(d), f"path={exported_fp32}"], "one checkpoint PATH, found 2"),
                       # a PATH that is not there is a user mistake, as export-checkpoint's ckpt (seen: exit 1, a FAIL line)
                       ([str(tmp_path / "nope")], f"{tmp_path / 'nope'}: does not exist"), ([f"path={tmp_path / 'nope'}"], "does not exist")):
        capsys.readouterr()
        assert verify_main(argv) == 2
        err = capsys.readouterr().err
        assert line in err and err.count("\n") == 1, (argv, err)
    assert verify_main(["--help"]) == 0


def test_export_cli(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert export_main([f"ckpt={tiny_model_dir}", f"out={out}", "dtype=fp32"]) == 0
    assert "verify-checkpoint" in capsys.readouterr().out
    assert export_main([f"ckpt={tiny_model_dir}", f"out={out}"]) == 2  # exists, no overwrite=true
    assert export_main([f"ckpt={tiny_model_dir}", f"out={out}", "overwrite=true", "max_shard_size=1MB"]) == 0
    assert (out / "model.safetensors.index.json").is_file() and not (out / "model.safetensors").exists()
    assert export_main([f"ckpt={tiny_model_dir}", f"out={tiny_model_dir / 'serving'}"]) == 2  # inside the source
    assert export_main([f"ckpt={tiny_model_dir}", f"out={tmp_path / 'x'}", "dtype=fp8"]) == 2
    assert export_main([f"ckpt={tiny_model_dir}", f"out={tmp_path / 'x'}", "max_shard=1GB"]) == 2
    (tmp_path / "run" / "state" / "step-000005").mkdir(parents=True)   # a run dir without a complete saved state
    capsys.readouterr()
    for ckpt, bad, line in ((tmp_path / "nope", "verify=true", "does not exist"),   # a user mistake: exit 2 (seen 1)
                            (tmp_path / "run", "verify=true", "no complete resumable state"),
                            (tiny_model_dir, "vocab_size=10", "vocab_size 10 is smaller than the tokenizer")):
        assert export_main([f"ckpt={ckpt}", f"out={tmp_path / 'x'}", bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and line in err and err.count("\n") == 1, err
    # an out among a run's step dirs would be read as a checkpoint (or a torn state) of that run (seen: exit 0,
    # analyze then found a step-99 checkpoint holding the source's weights)
    (tmp_path / "run" / "config.yaml").write_text("arm: search\n")
    for where in ("checkpoints/step-000099", "state/step-000050", "checkpoints/mine"):
        assert export_main([f"ckpt={tiny_model_dir}", f"out={tmp_path / 'run' / where}"]) == 2
        err = capsys.readouterr().err
        assert f"is inside the run dir {tmp_path / 'run'}'s {where.split('/')[0]}/" in err and err.count("\n") == 1, err
    assert not (tmp_path / "run" / "checkpoints").exists()
    assert export_main([f"ckpt={tiny_model_dir}", f"out={tmp_path / 'x'}", "dry_run=true"]) == 0
    assert not (tmp_path / "x").exists()
    capsys.readouterr()
    # each value checked by its key's rule, a dry run's too (seen failing: dtype=5, ckpt=[1], vocab_size=0 exited 0)
    for bad, line in (("dtype=5", "dtype=5: expected bf16, bfloat16, fp16"), ("vocab_size=0", "vocab_size=0: expected a positive"),
                      ("max_shard_size=x", "max_shard_size='x': expected a size like 5GB"), ("verify=5", "verify=5: expected true or false"),
                      ("ckpt=[1]", "ckpt=[1]: expected a string"),
                      # a repo id the hub refuses (huggingface_hub's validate_repo_id), seen: written into the card
                      ("repo_id=you/r2e/s0", "repo_id='you/r2e/s0': expected a hub repo id"), ("repo_id='a b'", "expected a hub repo id")):
        assert export_main([f"ckpt={tiny_model_dir}", f"out={tmp_path / 'x'}", bad, "dry_run=true"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and line in err and err.count("\n") == 1, (bad, err)
    # a study job's config file that is torn, not a mapping, or holds a key export does not know (seen failing:
    # a TypeError / ScannerError traceback, and `dry_run: true` misspelt as `dryrun:` exporting for real)
    job = tmp_path / "export.yaml"
    for text, line in (("[1, 2]", "not a mapping of export-checkpoint's keys"), ("ckpt: [", "not YAML"),
                       (f"ckpt: {tiny_model_dir}\nout: {tmp_path / 'x'}\ndryrun: true\n", "unknown key(s): dryrun")):
        job.write_text(text)
        assert export_main([str(job)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {job}: {line}") and err.count("\n") == 1, (text, err)
    assert not (tmp_path / "x").exists()


# ---------------------------------------------------------------- the trainer's own checkpoints

@pytest.fixture(scope="module")
def trainer_run(tmp_path_factory):
    """Two real `python -m sft.train` steps (1 gloo rank, FSDP, tiny model): step checkpoints and a state."""
    if not (ROOT / "sft" / "train.py").is_file():
        pytest.skip("the trainer (sft/train.py) is not in this checkout")
    from sft_helpers import make_dataset_dir, run_ranks, write_config

    base = tmp_path_factory.mktemp("trainer")
    data = make_dataset_dir(base / "ds", n=8)
    cfg = write_config(base / "run", data, steps=2, save_steps=[1], state_every=1, global_batch_size=4)
    codes = run_ranks(cfg, world=1)
    assert codes == [0], (base / "run" / "rank0.log").read_text()[-3000:]
    return base / "run"


# Known trainer bug (reported): sft.checkpoint.save_hf_checkpoint stores lm_head.weight although
# tie_word_embeddings is true; the gathered full state dict no longer shares storage between the
# embedding and the head, so save_pretrained keeps both. Only that exact finding is tolerated (as
# an xfail); anything else fails, and the test passes outright once the trainer is fixed.
KNOWN_TRAINER_FINDING = "unexpected tensor lm_head.weight: expected absent (tie_word_embeddings is true"


@pytest.mark.slow
def test_trainer_step_checkpoints_pass_verify(trainer_run):
    problems = [p for ck in sorted((trainer_run / "checkpoints").iterdir()) for p in verify_checkpoint(ck)]
    if problems and all(KNOWN_TRAINER_FINDING in p for p in problems):
        pytest.xfail(f"known trainer bug: {problems[0]}")
    assert problems == []


@pytest.mark.slow
def test_trainer_state_exports_to_the_checkpoint_weights(trainer_run, tmp_path):
    summary = export_checkpoint(trainer_run, tmp_path / "out", dtype="fp32")
    assert summary["kind"] == "state" and summary["step"] >= 1
    assert verify_checkpoint(tmp_path / "out") == []
    # CPU training is fp32, so the state and the same step's checkpoint hold the same numbers.
    same_step = trainer_run / "checkpoints" / f"step-{summary['step']:06d}"
    assert torch.equal(logits(tmp_path / "out"), logits(same_step))


def _tokenizer_dir(tmp_path, template: str):
    """The embedded tokenizer with its own chat template: a tokenizer the source checkpoint does not carry."""
    tok = shutil.copytree(ROOT / "common" / "tiny_tokenizer", tmp_path / "pinned_tok")
    (tok / "chat_template.jinja").write_text(template)
    return tok


def test_export_tokenizer_override_writes_the_given_tokenizer(padded_dir, tmp_path):
    from transformers import AutoTokenizer

    tok = _tokenizer_dir(tmp_path, "{% for m in messages %}<<{{ m['role'] }}>>{{ m['content'] }}{% endfor %}")
    out = tmp_path / "out"
    summary = export_checkpoint(padded_dir, out, dtype="fp32", vocab_size=4096, tokenizer=str(tok))
    assert any("tokenizer files from" in n for n in summary["notes"])
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (out / name).read_bytes() == (tok / name).read_bytes()
    assert (out / "generation_config.json").read_bytes() == (padded_dir / "generation_config.json").read_bytes()
    rendered = AutoTokenizer.from_pretrained(str(out)).apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert rendered == "<<user>>hi"
    info = json.loads((out / "export_info.json").read_text())["tokenizer"]
    assert info["spec"] == str(tok) and info["revision"] is None and info["tokens"] <= 4096
    assert sorted(info["files"]) == ["chat_template.jinja", "tokenizer.json", "tokenizer_config.json"]
    assert verify_checkpoint(out) == []


def test_export_tokenizer_from_a_pinned_hub_revision(padded_dir, tmp_path, monkeypatch):
    import huggingface_hub

    tok = _tokenizer_dir(tmp_path, "{{ messages[0]['content'] }}")
    calls = []

    def snapshot_download(repo_id, revision=None, allow_patterns=None, **kw):  # the network boundary
        calls.append((repo_id, revision))
        return str(tok)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    out = tmp_path / "out"
    export_checkpoint(padded_dir, out, dtype="fp32", vocab_size=4096, tokenizer="Qwen/Qwen3-4B@abc123")
    assert calls == [("Qwen/Qwen3-4B", "abc123")]
    assert (out / "chat_template.jinja").read_bytes() == (tok / "chat_template.jinja").read_bytes()
    assert json.loads((out / "export_info.json").read_text())["tokenizer"]["revision"] == "abc123"


def test_export_tokenizer_that_does_not_fit_the_embedding_is_refused(padded_dir, tmp_path, capsys):
    from tests.conftest import shared_path

    big = shared_path("fixtures", "qwen3_tokenizer")  # 151k tokens against 4096 rows
    out = tmp_path / "out"
    assert export_main([f"ckpt={padded_dir}", f"out={out}", "vocab_size=4096", f"tokenizer={big}"]) == 2
    err = capsys.readouterr().err
    assert "more than the exported embedding's 4096 rows" in err and not out.exists()
    for bad in (str(tmp_path / "nope"), "Qwen/Qwen3-4B"):  # neither a dir nor a pinned hub id
        assert export_main([f"ckpt={padded_dir}", f"out={out}", f"tokenizer={bad}"]) == 2
        assert "HUB_ID@REV" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert export_main([f"ckpt={padded_dir}", f"out={out}", f"tokenizer={empty}"]) == 2
    assert "has no tokenizer files" in capsys.readouterr().err and not out.exists()


def test_verify_reports_the_tensor_count(exported_fp32, capsys):
    from sft.verify import report

    assert report(exported_fp32) == 0
    assert "46 tensors" in capsys.readouterr().out


@pytest.fixture(scope="module")
def state_dir(tiny_model_dir, tmp_path_factory):
    step_dir = tmp_path_factory.mktemp("state") / "step-000010"
    _save_state(step_dir, tiny_model_dir, 10)
    return step_dir


@pytest.mark.parametrize("when", ["copy2", "write_card"])
def test_a_state_pruned_during_the_export_stops_it_cleanly(when, state_dir, tmp_path, monkeypatch, capsys):
    """The trainer prunes the state being exported (prune_states: rmtree) between the listing of its files and
    their copy, or after they were read (seen: a FileNotFoundError traceback; a card with the digest of an empty
    dir): one line naming the state, exit 2, nothing at out or beside it; an earlier export is left in place."""
    import sft.export

    run = tmp_path / "run"
    state = shutil.copytree(state_dir, run / "state" / "step-000010")
    where = sft.export if when == "write_card" else shutil   # the card is written after every source file is read
    real = getattr(where, when)

    def pruned_first(*args, **kw):
        shutil.rmtree(state, ignore_errors=True)
        return real(*args, **kw)

    monkeypatch.setattr(where, when, pruned_first)
    out = tmp_path / "exports" / "x"
    out.mkdir(parents=True)
    (out / "export_info.json").write_text("{}")
    assert export_main([f"ckpt={run}", f"out={out}", "dtype=fp32", "overwrite=true", "verify=false"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(state) in err and "removed or changed while it was exported" in err, err
    assert [p.name for p in out.parent.iterdir()] == ["x"] and [p.name for p in out.iterdir()] == ["export_info.json"]


@pytest.mark.parametrize("when,pruned", [("listed", 1), ("walked", 1), ("verified", 1), ("verified", 2)])
def test_a_state_pruned_while_it_is_picked_falls_back_or_stops(when, pruned, state_dir, tmp_path, monkeypatch, capsys):
    """The trainer prunes the newest state (prune_states: rmtree) after the run's states were listed, while or just
    after it was verified (seen: a note calling it torn; "hf/config.json: missing"; a FileNotFoundError traceback):
    the export falls back to the next complete state and its notes say why; with none left, one line, exit 2."""
    import sft.checkpoint

    run = tmp_path / "run"
    old, new = (shutil.copytree(state_dir, run / "state" / f"step-0000{s}0") for s in (1, 2))
    victims = [new, old][:pruned]
    real_verify, real_newest = sft.checkpoint.verify_state, sft.checkpoint.newest_verified_state

    def verify(d):
        if victims and d == victims[0]:
            shutil.rmtree(victims.pop(0))
        return real_verify(d)

    def newest(root):
        found, notes = real_newest(root)
        if victims and found == victims[0]:
            shutil.rmtree(victims.pop(0))
        return found, notes

    real_lstat = os.lstat

    def lstat(path, *a, **kw):   # the rmtree lands while verify_state walks the state's files
        if victims and str(path) == f"{victims[0]}/.metadata":   # tree_entries lstats it first
            shutil.rmtree(victims.pop(0))
        return real_lstat(path, *a, **kw)

    if when == "walked":
        monkeypatch.setattr(os, "lstat", lstat)
    else:
        monkeypatch.setattr(sft.checkpoint, "verify_state" if when == "listed" else "newest_verified_state",
                            verify if when == "listed" else newest)
    code = export_main([f"ckpt={run}", f"out={tmp_path / 'x'}", "dtype=fp32", "verify=false"])
    out, err = capsys.readouterr()
    if pruned == 2:
        assert code == 2 and err.count("\n") == 1 and "removed while" in err and str(new) in err, err
        assert not (tmp_path / "x").exists()
    else:
        assert code == 0 and f"from state {old} " in out, (out, err)
        assert f"note: skipped state {new}: removed while the export was picking it" in out, out


def test_a_weight_stored_as_integers_is_refused_before_anything_is_written(tiny_model_dir, tmp_path, capsys):
    """A source whose safetensors header says a weight is I32 (a header lying about its dtype, or a quantized /
    foreign file; seen: exported as I32 into a bf16 serving copy, exit 0 with verify=false): one line, exit 2."""
    src = shutil.copytree(tiny_model_dir, tmp_path / "src")
    _edit_header(src / "model.safetensors", lambda h: h[UP].update(dtype="I32"))
    assert export_main([f"ckpt={src}", f"out={tmp_path / 'out'}", "verify=false"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"tensor {UP}: stored as torch.int32" in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("index,says", [
    ("{not json", "unreadable"), ("[1, 2]", "unreadable"), ('{"weight_map": ["w.safetensors"]}', "unreadable"),
    ('{"weight_map": {"x": "../stray.safetensors"}}', "not a file in"),
])
def test_a_source_index_that_is_malformed_or_points_outside_is_refused(index, says, tiny_model_dir, tmp_path, capsys):
    """A source's model.safetensors.index.json that is not JSON or has no weight_map object (seen: a JSONDecodeError /
    AttributeError traceback, exit 1), or maps tensors to a file outside the checkpoint (seen: exported from that
    stray file, exit 0): one line naming the index, exit 2, nothing written."""
    src = shutil.copytree(tiny_model_dir, tmp_path / "src")
    (src / "model.safetensors").rename(tmp_path / "stray.safetensors")
    (src / "model.safetensors.index.json").write_text(index)
    assert export_main([f"ckpt={src}", f"out={tmp_path / 'out'}", "verify=false"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model.safetensors.index.json" in err and says in err, err
    assert not (tmp_path / "out").exists()
