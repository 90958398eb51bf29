"""End-to-end trainer tests with 2 gloo ranks on CPU (tiny model, few steps).

Two run directories are shared by several tests to keep process start-ups few:
`reference` is an uninterrupted 2-rank run; `interrupted` is the same config preempted
with SIGTERM (one rank only), resumed, killed with -9, and resumed again.
"""
from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
import torch

from sft_helpers import kill_all, launch, make_dataset_dir, read_metrics, run_ranks, wait_all, write_config

pytestmark = pytest.mark.slow
STEPS = 8


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return make_dataset_dir(tmp_path_factory.mktemp("sftdata") / "ds", n=48)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data_dir):
    run_dir = tmp_path_factory.mktemp("ref") / "run"
    cfg = write_config(run_dir, data_dir, steps=STEPS, **{"logging.wandb": True})
    codes = run_ranks(cfg)
    assert codes == [0, 0], (run_dir / "rank0.log").read_text()[-3000:]
    return run_dir


def _wait_for(pred, procs, what, timeout=240):
    deadline = time.time() + timeout
    while not pred():
        if time.time() > deadline or all(p.poll() is not None for p in procs):
            kill_all(procs)
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.02)


def _metric_lines(run_dir: Path) -> int:
    p = run_dir / "metrics.jsonl"
    return len(p.read_text().splitlines()) if p.exists() else 0


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory, data_dir):
    run_dir = tmp_path_factory.mktemp("int") / "run"
    cfg = write_config(run_dir, data_dir, steps=STEPS)
    args = ["-m", "sft.train", str(cfg)]
    info = {}
    # 1. SIGTERM to rank 1 only, with no cadence states: the only state must come from the signal.
    procs = launch(args + ["train.state_every=1000"], 2, run_dir)
    _wait_for(lambda: _metric_lines(run_dir) >= 1, procs, "the first step")
    procs[1].send_signal(signal.SIGTERM)
    info["sigterm_codes"] = wait_all(procs)
    info["sigterm_states"] = sorted(p.name for p in (run_dir / "state").iterdir()) if (run_dir / "state").exists() else []
    info["sigterm_done"] = (run_dir / "DONE").exists()
    # 2. Resume, then kill -9 both ranks two steps later (whatever state that leaves).
    start = int(info["sigterm_states"][-1][5:]) if info["sigterm_states"] else 0
    procs = launch(args, 2, run_dir)
    _wait_for(lambda: _metric_lines(run_dir) >= min(start + 2, STEPS - 1), procs, "two resumed steps")
    kill_all(procs)
    info["killed_done"] = (run_dir / "DONE").exists()
    # 3. Resume to the end.
    info["final_codes"] = run_ranks(cfg)
    return run_dir, info


def test_loss_falls_and_metrics_complete(reference):
    rows = read_metrics(reference)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert rows[-1]["loss"] < rows[0]["loss"] - 1.0, [r["loss"] for r in rows]
    for key in ("loss", "lr", "grad_norm", "tokens", "trainable_tokens", "tokens_per_s_per_gpu",
                "trainable_tokens_per_s_per_gpu", "mfu", "step_time_s", "data_wait_s", "peak_mem_gb"):
        assert key in rows[0], key
    assert rows[0]["mfu"] is None  # CPU, no peak configured
    assert 0 < rows[0]["trainable_tokens"] < rows[0]["tokens"]
    assert json.loads((reference / "DONE").read_text())["step"] == STEPS


def test_wandb_offline_run_files(reference):
    runs = list((reference / "wandb").glob("offline-run-*"))
    assert runs, list((reference).iterdir())
    assert list(runs[0].glob("run-*.wandb"))


def test_checkpoint_loads_and_reproduces_training_loss(reference, data_dir):
    """The step-3 checkpoint, loaded by transformers, gives the loss the trainer logged for
    step 4 (computed in training with exactly the step-3 weights) on step 4's batch."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from common.io import check_sha256sums
    from sft.data import load_train_data, plan_step

    ck = reference / "checkpoints" / "step-000003"
    assert check_sha256sums(ck) == []
    assert sorted(p.name for p in (reference / "checkpoints").iterdir()) == ["step-000003", f"step-{STEPS:06d}"]
    from safetensors import safe_open

    with safe_open(str(ck / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in f.keys() and "model.embed_tokens.weight" in f.keys()  # tied: stored once
    model = AutoModelForCausalLM.from_pretrained(ck, attn_implementation="sdpa")
    assert model.dtype == torch.float32
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    tok = AutoTokenizer.from_pretrained(ck)
    assert "<|im_start|>" in tok.chat_template
    data = load_train_data(data_dir, global_batch_size=8, max_tokens_per_micro_batch=256)
    plan = plan_step(data, 3, rank=0, world=1, global_batch_size=8, seed=0, capacity=256)
    n = plan.num_trainable
    with torch.no_grad():
        loss = sum(model(input_ids=mb.input_ids, position_ids=mb.position_ids, labels=mb.labels, shift_labels=mb.shift_labels,
                         num_items_in_batch=n, use_cache=False).loss.item() for mb in plan.micro_batches)
    logged = read_metrics(reference)[3]
    assert logged["step"] == 4
    assert loss == pytest.approx(logged["loss"], abs=2e-5)


def test_sigterm_saves_resumable_state(interrupted):
    run_dir, info = interrupted
    assert info["sigterm_codes"] == [0, 0]
    assert not info["sigterm_done"]
    assert len(info["sigterm_states"]) == 1, info
    step = int(info["sigterm_states"][0][5:])
    assert 1 <= step < STEPS


def test_resume_after_kill_is_exact(reference, interrupted):
    run_dir, info = interrupted
    assert not info["killed_done"]
    assert info["final_codes"] == [0, 0]
    ref, got = read_metrics(reference), read_metrics(run_dir)
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    assert [r["loss"] for r in got] == [r["loss"] for r in ref]
    assert [r["grad_norm"] for r in got] == [r["grad_norm"] for r in ref]
    final = f"checkpoints/step-{STEPS:06d}/model.safetensors"
    assert (run_dir / final).read_bytes() == (reference / final).read_bytes()
    assert (run_dir / "checkpoints/step-000003/model.safetensors").read_bytes() == \
        (reference / "checkpoints/step-000003/model.safetensors").read_bytes()


def test_cumulative_counters_are_exact_and_survive_resumes(reference, interrupted, data_dir):
    """examples/rows/tokens/trainable tokens seen: the running sums of the per-step counts, the same in
    the SIGTERMed, killed and resumed run as in the uninterrupted one (the compute axes of analyze)."""
    from sft.data import SEEN_KEYS, load_train_data, seen_before

    ref, got = read_metrics(reference), read_metrics(interrupted[0])
    tokens = trainable = 0
    for r in ref:
        tokens, trainable = tokens + r["tokens"], trainable + r["trainable_tokens"]
        assert (r["tokens_seen"], r["trainable_tokens_seen"], r["examples_seen"]) == (tokens, trainable, 8 * r["step"])
    assert [[r[k] for k in SEEN_KEYS] for r in got] == [[r[k] for k in SEEN_KEYS] for r in ref]
    data = load_train_data(data_dir, global_batch_size=8, max_tokens_per_micro_batch=256)
    assert seen_before(data, STEPS, global_batch_size=8, seed=0) == {k: ref[-1][k] for k in SEEN_KEYS}


def test_state_layout(interrupted):
    """DCP shards keyed by plain HF names, meta.json, hf/ for export, SHA256SUMS, COMPLETE last."""
    run_dir, _ = interrupted
    states = sorted((run_dir / "state").iterdir())
    assert states and len(states) <= 2  # pruned to the latest two
    d = states[-1]
    for name in ("COMPLETE", "SHA256SUMS", "meta.json", "hf/config.json", "hf/tokenizer_config.json",
                 "rng/rank-00000.safetensors", "rng/rank-00001.safetensors"):
        assert (d / name).exists(), name
    from sft.checkpoint import safe_load_dcp_metadata, verify_state

    assert verify_state(d) == []
    keys = safe_load_dcp_metadata(d / ".metadata").state_dict_metadata.keys()
    assert "model.model.embed_tokens.weight" in keys
    assert not [k for k in keys if "_fsdp_wrapped_module" in k or "_checkpoint_wrapped" in k]
    assert any(k.startswith("optim.state.model.layers.0.") for k in keys)
    meta = json.loads((d / "meta.json").read_text())
    assert meta["n"] == 48 and meta["global_batch_size"] == 8 and meta["data_fingerprint"] == "test-fp"


def test_gradient_equivalence_ranks_and_budgets(tmp_path, data_dir):
    """One global batch: same gradient for 1 vs 2 ranks, for 256- vs 100-token packed micro-batches
    and for one sequence per micro-batch (what the trainer does under sdpa for sequences longer than
    sft.data.SDPA_PACK_TOKENS); with 2
    ranks the unpacked shares differ in row count, so this also runs the dummy passes that keep the
    FSDP ranks in step."""
    from sft_grad_worker import global_batch_grads

    cfg = write_config(tmp_path / "grad", data_dir)
    caps = ["256", "100", "256u"]
    one = global_batch_grads(cfg, caps)
    codes = wait_all(launch(["tests/sft_grad_worker.py", str(cfg), str(tmp_path / "g2.pt"), *caps], 2, tmp_path))
    assert codes == [0, 0], (tmp_path / "rank0.log").read_text()[-3000:]
    two = torch.load(tmp_path / "g2.pt")
    ref = one["256"]
    assert one["100"]["n_micro"] > ref["n_micro"]  # the smaller budget really splits differently
    assert ref["rows_per_micro"] > 1 and one["256u"]["rows_per_micro"] == 1  # packed vs one sequence each
    for other in (one["100"], one["256u"], two["256"], two["100"], two["256u"]):
        assert other["n_trainable"] == ref["n_trainable"]
        assert other["loss"] == pytest.approx(ref["loss"], rel=1e-6)
        assert other["grads"].keys() == ref["grads"].keys()
        for k, g in ref["grads"].items():
            torch.testing.assert_close(other["grads"][k], g, rtol=1e-5, atol=1e-6, msg=k)


def test_console_lines_match_metrics(reference):
    """Rank 0's stdout is a file (not a terminal): one plain `step i/N ...` line per step, whose
    numbers are metrics.jsonl's to the printed precision; no tqdm `\\r` bar."""
    from sft.console import parse_line

    log_text = (reference / "rank0.log").read_text()
    assert "\r" not in log_text
    lines = [p for p in map(parse_line, log_text.splitlines()) if p]
    rows = read_metrics(reference)
    assert [p["step"] for p in lines] == [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for p, r in zip(lines, rows):
        assert p["total"] == STEPS and p["skipped"] == r["skipped"]
        assert abs(p["loss"] - r["loss"]) <= 5e-5
        assert p["lr"] == pytest.approx(r["lr"], rel=1e-3, abs=1e-12)
        assert p["grad_norm"] == pytest.approx(r["grad_norm"], rel=1e-3)
        assert abs(p["tokens_per_s_per_gpu"] - r["tokens_per_s_per_gpu"]) <= 0.5
        assert p["mfu"] is None and r["mfu"] is None   # CPU: no peak FLOP/s
        assert abs(p["peak_mem_gb"] - r["peak_mem_gb"]) <= 0.005
    assert lines[-1]["eta_s"] == 0
