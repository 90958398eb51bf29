"""Issue 23: a checkpoint is never deleted once written. A redone step (a crash between a checkpoint
and its state, then a relaunch) renames the old checkpoint and every evaluation of that step aside
(SFT and GRPO alike) unless it wrote the same files; `analyze` re-evaluates a checkpoint whose content
no longer matches the evaluation identity its results were recorded under."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from common.io import REPLACED_MARK, read_sha256sums, write_sha256sums
from common.layout import new_checkpoint


def _digest_tree(d: Path) -> dict[str, str]:
    return {p.relative_to(d).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file()}


def _run_with_evals(tmp_path) -> Path:
    run = tmp_path / "runs" / "r2e" / "seed0"
    for sub in ("eval/step-000002", "eval/rl_ood/step-000002", "eval/step-000001"):
        (run / sub).mkdir(parents=True)
        (run / sub / "summary.json").write_text(json.dumps({"nq": {"em": 0.5, "n": 2}}))
    return run


def _aside(parent: Path, name: str) -> list[Path]:
    return sorted(p for p in parent.iterdir() if p.name.startswith(name + REPLACED_MARK))


def test_new_checkpoint_sets_the_old_one_and_its_evaluations_aside(tmp_path):
    run = _run_with_evals(tmp_path)
    out = run / "checkpoints" / "step-000002"
    reports: list[str] = []
    with new_checkpoint(out, report=reports.append) as tmp:
        (tmp / "model.safetensors").write_bytes(b"old weights")
        write_sha256sums(tmp)
    assert reports == [] and (out / "model.safetensors").read_bytes() == b"old weights"
    old = _digest_tree(out)
    # The same files again (a deterministic redo): the old dir and its evaluations stay.
    with new_checkpoint(out, report=reports.append) as tmp:
        (tmp / "model.safetensors").write_bytes(b"old weights")
        write_sha256sums(tmp)
    assert len(reports) == 1 and "kept as it is" in reports[0]
    assert (run / "eval" / "step-000002" / "summary.json").is_file() and not _aside(out.parent, out.name)
    # Other weights: old checkpoint and both evaluations of step 2 renamed aside, nothing deleted.
    reports.clear()
    with new_checkpoint(out, report=reports.append) as tmp:
        (tmp / "model.safetensors").write_bytes(b"new weights")
        write_sha256sums(tmp)
    assert (out / "model.safetensors").read_bytes() == b"new weights"
    [ck_aside] = _aside(out.parent, out.name)
    assert _digest_tree(ck_aside) == old
    for parent in (run / "eval", run / "eval" / "rl_ood"):
        assert not (parent / "step-000002").exists()
        [ev_aside] = _aside(parent, "step-000002")
        assert json.loads((ev_aside / "summary.json").read_text())["nq"]["n"] == 2
    assert (run / "eval" / "step-000001" / "summary.json").is_file()   # another step: untouched
    assert len(reports) == 3 and all("renamed to" in r and "never deleted" in r for r in reports)
    # A failed write leaves the checkpoint in place and no temp dir behind.
    with pytest.raises(RuntimeError):
        with new_checkpoint(out, report=reports.append) as tmp:
            (tmp / "model.safetensors").write_bytes(b"partial")
            raise RuntimeError("disk full")
    assert (out / "model.safetensors").read_bytes() == b"new weights"
    assert sorted(p.name for p in out.parent.iterdir() if ".tmp-" in p.name) == []


def _tiny(tmp_path, seed: int):
    from transformers import AutoModelForCausalLM

    from sft.tiny import save_tiny_model

    d = save_tiny_model(tmp_path / f"tiny{seed}", seed=seed)
    return d, AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32)


def test_sft_redone_checkpoint_is_set_aside_not_deleted(tmp_path):
    from transformers import GenerationConfig

    from common.tiny import tiny_tokenizer
    from sft.checkpoint import save_hf_checkpoint

    run = _run_with_evals(tmp_path)
    out = run / "checkpoints" / "step-000002"
    tok = tiny_tokenizer()
    gen = GenerationConfig(eos_token_id=[tok.eos_token_id], pad_token_id=tok.pad_token_id)
    kw = dict(out=out, dtype=torch.float32, tokenizer=tok, generation_config=gen, device=torch.device("cpu"), rank=0)
    save_hf_checkpoint(_tiny(tmp_path, 1)[1], **kw)
    first = read_sha256sums(out)
    save_hf_checkpoint(_tiny(tmp_path, 1)[1], **kw)   # the same weights again: kept
    assert not _aside(out.parent, out.name) and (run / "eval" / "step-000002").is_dir()
    save_hf_checkpoint(_tiny(tmp_path, 2)[1], **kw)   # other weights: the old ones set aside
    [aside] = _aside(out.parent, out.name)
    assert read_sha256sums(aside) == first != read_sha256sums(out)
    assert not (run / "eval" / "step-000002").exists() and _aside(run / "eval", "step-000002")
    assert _aside(run / "eval" / "rl_ood", "step-000002")


def test_grpo_redone_checkpoint_is_set_aside_not_deleted(tmp_path):
    peft = pytest.importorskip("peft")
    from rl.checkpoint import save_merged_checkpoint

    run = _run_with_evals(tmp_path)
    start, model = _tiny(tmp_path, 0)
    lora = peft.get_peft_model(model, peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"]))
    out = run / "checkpoints" / "step-000002"
    save_merged_checkpoint(lora, start_dir=start, out=out, dtype=torch.float32)
    first = read_sha256sums(out)
    with torch.no_grad():   # the redone step trained to other weights
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.add_(0.01)
    save_merged_checkpoint(lora, start_dir=start, out=out, dtype=torch.float32)
    [aside] = _aside(out.parent, out.name)
    assert read_sha256sums(aside) == first != read_sha256sums(out)
    assert (aside / "adapter").is_dir() and not (run / "eval" / "step-000002").exists()
    assert _aside(run / "eval", "step-000002") and _aside(run / "eval" / "rl_ood", "step-000002")


def test_analyze_re_evaluates_a_checkpoint_whose_weights_changed(tmp_path, tiny_tokenizer):
    """The defect: new weights at step 2 (SHA256SUMS changed) while eval/step-000002 still held the
    old weights' results; analyze said 'evaluated 0 checkpoint(s)' and reported the deleted model."""
    pytest.importorskip("minigrid")
    from launch.analyze import run_analysis
    from evals.run import evaluate
    from tests.test_evals_babyai import Replies

    runs = tmp_path / "runs"
    ck = runs / "grpo_qa" / "seed0" / "checkpoints" / "step-000002"
    ck.mkdir(parents=True)
    (ck / "config.json").write_text("{}")
    (ck / "model.safetensors").write_bytes(b"first weights")
    write_sha256sums(ck)
    calls = []

    def evaluator(cfg):
        calls.append(cfg)
        return evaluate(cfg, backend=Replies(tiny_tokenizer, "turn left"))

    cfg = {"runs_root": str(runs), "out": str(tmp_path / "rep"), "benches": ["babyai"],
           "eval": {"bench_n": {"babyai": 2}, "babyai_max_steps": 1, "progress": False}}
    run_analysis(cfg, evaluator=evaluator)
    run_analysis(cfg, evaluator=evaluator)
    assert len(calls) == 1   # the same weights: nothing left to evaluate
    (ck / "model.safetensors").write_bytes(b"other weights")   # changed in place, sums rewritten
    write_sha256sums(ck)
    res = run_analysis(cfg, evaluator=evaluator)
    assert len(calls) == 2 and calls[-1]["overwrite"] is True and not res.evaluated.failures
    out = runs / "grpo_qa" / "seed0" / "eval" / "step-000002"
    meta = json.loads((out / "meta.json").read_text())
    assert meta["identities"]["babyai"]["keys"]["checkpoint.digest"] == hashlib.sha256(
        (ck / "SHA256SUMS").read_bytes()).hexdigest()
    assert _aside(out, "babyai.jsonl")   # the old weights' rows: renamed aside, not deleted
