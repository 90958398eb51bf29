"""In-process sft tests: packing, data checks, config errors, schedule, guards, metrics."""
from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from common.cli import ConfigError
from sft import train
from sft.checkpoint import COMPLETE, complete_states, prune_states
from common.plan import save_points, schedule
from common.schema import TRAINER_SEMANTICS
from sft.config import load_config
from sft.data import (
    DataError, collate, epoch_order, global_batch, load_train_data, pack_best_fit_decreasing, plan_step, split_across_ranks,
)
from common.tracking import MetricsLog
from sft.metrics import lookup_peak_tflops, step_flops
from sft.optim import NonFiniteError, NonFiniteGuard, lr_factor, warmup_steps
from sft_helpers import make_dataset_dir, read_metrics, write_config


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return make_dataset_dir(tmp_path_factory.mktemp("unitdata") / "ds", n=24)


# ---------------------------------------------------------------- packing and the loss


def _packed_vs_hf_reference(model, rows) -> None:
    """Raises AssertionError unless the packed micro-batch's per-token losses equal plain HF:
    `model(input_ids=one sequence, labels=its labels)` (HF shifts the labels itself)."""
    packed = collate(rows)
    with torch.no_grad():
        logits = model(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False).logits[0]
        ours = torch.nn.functional.cross_entropy(logits, packed.shift_labels[0], reduction="sum", ignore_index=-100)
        ref_sum, ref_n = 0.0, 0
        for ids, labels in rows:
            lab = torch.as_tensor(labels, dtype=torch.long)[None]
            n = int((lab[0, 1:] != -100).sum())
            ref_sum += model(input_ids=torch.as_tensor(ids, dtype=torch.long)[None], labels=lab, use_cache=False).loss.item() * n
            ref_n += n
        assert packed.num_trainable == ref_n
        assert ours.item() == pytest.approx(ref_sum, rel=1e-5)
        # and the model's own loss with shift_labels + num_items_in_batch is the exact sum / N
        loss = model(input_ids=packed.input_ids, position_ids=packed.position_ids, labels=packed.labels,
                     shift_labels=packed.shift_labels, num_items_in_batch=packed.num_trainable, use_cache=False).loss
        assert loss.item() == pytest.approx(ref_sum / ref_n, rel=1e-5)


def test_packed_forward_equals_unpacked_per_token_loss(data_dir, monkeypatch):
    from transformers import AutoModelForCausalLM

    import sft.data
    from common.tiny import tiny_config

    torch.manual_seed(0)
    conf = tiny_config()
    conf._attn_implementation = "sdpa"
    model = AutoModelForCausalLM.from_config(conf).eval()
    data = load_train_data(data_dir, global_batch_size=8, max_tokens_per_micro_batch=512)
    rows = [(data.ds[i]["input_ids"], data.ds[i]["labels"]) for i in (0, 1, 2)]
    packed = collate(rows)
    # the last position of each sequence predicts nothing (no leak into the next sequence)
    ends = np.cumsum(packed.seq_lens) - 1
    assert (packed.shift_labels[0, ends] == -100).all()
    _packed_vs_hf_reference(model, rows)
    # the check can fail: without the label shift (or shifting across sequences) it does
    monkeypatch.setattr(sft.data, "shift_per_sequence", lambda labels: np.asarray(labels).copy())
    with pytest.raises(AssertionError):
        _packed_vs_hf_reference(model, rows)

    def across(labels):  # one shift over the packed row would leak into the next sequence; emulate per row
        out = np.asarray(labels).copy()
        out[:-1] = out[1:]
        return out  # the last label is kept: it predicts the next sequence's first position
    monkeypatch.setattr(sft.data, "shift_per_sequence", across)
    with pytest.raises(AssertionError):
        _packed_vs_hf_reference(model, rows)


def test_trainer_gradient_equals_plain_hf_reference(tmp_path, tiny_model_dir):
    """The trainer's gradient for one global batch (records split into several rows included)
    equals plain HF per-sequence cross-entropy summed over the batch's sequences / its trainable
    tokens, computed here with transformers and torch only."""
    import datasets
    from transformers import AutoModelForCausalLM

    from sft_grad_worker import global_batch_grads

    src = make_dataset_dir(tmp_path / "src", n=24)
    ds = datasets.load_from_disk(str(src))
    out = tmp_path / "multi"
    ds.remove_columns("id").add_column("id", _multi_row_ids(len(ds))).save_to_disk(str(out))
    (out / "manifest.json").write_text(json.dumps({"fingerprint": "m"}))
    cfg = write_config(tmp_path / "run", out, **{"model.path": str(tiny_model_dir), "model.init": "pretrained",
                                                   "global_batch_size": 4, "max_tokens_per_micro_batch": 200})
    got = global_batch_grads(cfg, ["200"])["200"]
    data = load_train_data(out, global_batch_size=4, max_tokens_per_micro_batch=200)
    rows = plan_step(data, 0, rank=0, world=1, global_batch_size=4, seed=0, capacity=200).indices
    assert len(rows) > 4  # split records: more sequences than trajectories
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32, attn_implementation="sdpa")
    model.train()
    total, n_total = 0.0, 0
    for i in rows:
        ids = torch.as_tensor(data.ds[int(i)]["input_ids"], dtype=torch.long)[None]
        lab = torch.as_tensor(data.ds[int(i)]["labels"], dtype=torch.long)[None]
        n = int((lab[0, 1:] != -100).sum())
        total = total + model(input_ids=ids, labels=lab, use_cache=False).loss * n
        n_total += n
    (total / n_total).backward()
    assert got["n_trainable"] == n_total and got["loss"] == pytest.approx((total / n_total).item(), rel=1e-5)
    strip = lambda k: k.replace("_fsdp_wrapped_module.", "").replace("_checkpoint_wrapped_module.", "")  # noqa: E731
    mine = {strip(k): g for k, g in got["grads"].items()}
    ref = {k: p.grad for k, p in model.named_parameters() if p.grad is not None}
    assert mine.keys() == ref.keys()
    for k, g in ref.items():
        torch.testing.assert_close(mine[k], g, rtol=1e-5, atol=1e-7, msg=k)


def test_pack_budget_follows_the_attention_kernel(data_dir):
    """flash_attention_2 packs up to the capacity; sdpa and eager at most SDPA_PACK_TOKENS, a longer
    row alone; over the same rows, with the same capacity check."""
    from sft.data import SDPA_PACK_TOKENS, pack_budget

    assert pack_budget("flash_attention_2", 4096) == 4096
    assert pack_budget("sdpa", 4096) == pack_budget("eager", 4096) == SDPA_PACK_TOKENS == 512
    assert pack_budget("sdpa", 256) == 256
    # rows of 600, 300, 200, 100 and 50 tokens, capacity 4096, budget 512: 600 alone, the rest best-fit
    assert pack_best_fit_decreasing(range(5), [600, 300, 200, 100, 50], 4096, 512) == [[0], [1, 2], [3, 4]]
    assert pack_best_fit_decreasing(range(5), [600, 300, 200, 100, 50], 4096) == [[0, 1, 2, 3, 4]]
    with pytest.raises(ValueError, match="row 1 has 7000 tokens > micro-batch capacity 4096"):
        pack_best_fit_decreasing([0, 1], [3, 7000], 4096, 512)
    data = load_train_data(data_dir, global_batch_size=8, max_tokens_per_micro_batch=256)
    packed = plan_step(data, 0, rank=0, world=1, global_batch_size=8, seed=0, capacity=256)
    single = plan_step(data, 0, rank=0, world=1, global_batch_size=8, seed=0, capacity=256, budget=1)
    assert sorted(packed.indices) == sorted(single.indices) and single.num_trainable == packed.num_trainable
    assert len(packed.micro_batches) < len(single.micro_batches) == len(single.indices)
    assert [mb.num_tokens for mb in single.micro_batches] == sorted((int(data.num_tokens[i]) for i in single.indices), reverse=True)


def test_best_fit_decreasing_and_rank_split():
    lengths = [7, 5, 4, 3, 1]
    assert pack_best_fit_decreasing(range(5), lengths, 10) == [[0, 3], [1, 2, 4]]
    lengths = np.random.default_rng(0).integers(1, 50, size=40)
    bins = pack_best_fit_decreasing(range(40), lengths, 64)
    assert sorted(i for b in bins for i in b) == list(range(40))
    assert all(sum(lengths[i] for i in b) <= 64 for b in bins)
    assert len(bins) <= math.ceil(lengths.sum() / 64) + 3  # near the lower bound
    shares = split_across_ranks(range(40), lengths, 3)
    assert sorted(i for s in shares for i in s) == list(range(40))
    loads = [sum(lengths[i] for i in s) for s in shares]
    assert max(loads) - min(loads) <= max(lengths)
    with pytest.raises(ValueError, match="row 0 has 70 tokens"):
        pack_best_fit_decreasing([0], [70], 64)


def test_epoch_order_and_global_batches_deterministic():
    assert (epoch_order(50, 1, 0) == epoch_order(50, 1, 0)).all()
    assert not (epoch_order(50, 1, 0) == epoch_order(50, 1, 1)).all()
    seen = np.concatenate([global_batch(s, n=50, global_batch_size=16, seed=1)[1] for s in range(3)])
    assert len(set(seen.tolist())) == 48  # floor(50/16)=3 steps per epoch, no repeats
    assert global_batch(3, n=50, global_batch_size=16, seed=1)[0] == 1


def _multi_row_ids(n_rows: int) -> list[str]:
    """Row ids where every third record was split into two or three rows (`<id>#row<k>`)."""
    ids, r = [], 0
    while len(ids) < n_rows:
        k = (2 if r % 6 == 0 else 3) if r % 3 == 0 else 1
        ids += [f"rec{r}#row{j}" for j in range(k)] if k > 1 else [f"rec{r}"]
        r += 1
    return ids[:n_rows]


def test_a_step_is_global_batch_size_trajectories():
    """3500 records, some split into several rows, still give 218 steps/epoch; each step holds
    whole records (all their rows) and an epoch covers every row exactly once."""
    from sft.data import TrainData

    ids = []
    for r in range(3500):
        k = 1 + (r % 3 == 0) + (r % 6 == 0)
        ids += [f"rec{r}#row{j}" for j in range(k)] if k > 1 else [f"rec{r}"]
    assert len(ids) > 3500 * 1.4
    data = TrainData(Path("x"), None, ids, np.ones(len(ids)), np.ones(len(ids)), None, 0)
    assert data.n == 3500 and data.n_rows == len(ids)
    assert schedule(steps=None, epochs=2, n_examples=data.n, global_batch_size=16) == (218, 436)
    seen = []
    for step in range(218):
        _, traj = global_batch(step, n=data.n, global_batch_size=16, seed=0)
        rows = data.rows_of(traj)
        recs = {ids[i].split("#")[0] for i in rows}
        assert len(recs) == 16  # 16 trajectories, with every row of each
        assert sorted(rows.tolist()) == sorted(i for i, x in enumerate(ids) if x.split("#")[0] in recs)
        seen += rows.tolist()
    leftover = 3500 - 218 * 16
    assert len(seen) == len(set(seen)) and len(set(seen)) <= len(ids)
    assert len({ids[i].split("#")[0] for i in seen}) == 3500 - leftover


def test_multi_row_trajectories_share_one_loss_denominator(tmp_path):
    """Rows of one record in a step across ranks: the loss denominator is every trainable token
    of the step's trajectories (all their rows)."""
    import datasets

    src = make_dataset_dir(tmp_path / "src", n=40)
    ds = datasets.load_from_disk(str(src))
    ids = _multi_row_ids(len(ds))
    out = tmp_path / "multi"
    ds.remove_columns("id").add_column("id", ids).save_to_disk(str(out))
    (out / "manifest.json").write_text(json.dumps({"fingerprint": "m"}))
    data = load_train_data(out, global_batch_size=4, max_tokens_per_micro_batch=128)
    assert data.n_rows == 40 and data.n == len({i.split("#")[0] for i in ids})
    for step in range(data.n // 4):
        plans = [plan_step(data, step, rank=r, world=3, global_batch_size=4, seed=0, capacity=128) for r in range(3)]
        rows = sorted(i for p in plans for i in p.indices)
        recs = {ids[i].split("#")[0] for i in rows}
        assert len(recs) == 4 and rows == [i for i, x in enumerate(ids) if x.split("#")[0] in recs]
        assert all(p.global_trainable == int(data.num_trainable[rows].sum()) for p in plans)
        assert sum(p.num_trainable for p in plans) == plans[0].global_trainable


def test_plan_step_covers_global_batch_across_ranks(data_dir):
    data = load_train_data(data_dir, global_batch_size=8, max_tokens_per_micro_batch=128)
    plans = [plan_step(data, 1, rank=r, world=3, global_batch_size=8, seed=0, capacity=128) for r in range(3)]
    _, idx = global_batch(1, n=24, global_batch_size=8, seed=0)
    assert sorted(i for p in plans for i in p.indices) == sorted(idx.tolist())
    assert sum(p.num_trainable for p in plans) == int(data.num_trainable[idx].sum())
    for p in plans:
        for mb in p.micro_batches:
            assert mb.num_tokens <= 128 and mb.position_ids[0, 0] == 0


# ---------------------------------------------------------------- data validation


def _write_ds(path: Path, **changes):
    import datasets

    cols = {"id": ["a", "b"], "source": ["s", "s"], "domain": ["code", "search"],
            "input_ids": [[1, 2, 3], [4, 5, 6, 7]], "labels": [[-100, 2, 3], [-100, -100, 6, 7]],
            "num_tokens": [3, 4], "num_trainable": [2, 2], "messages": ["{}", "{}"]}
    cols.update(changes)
    for k in [k for k, v in changes.items() if v is None]:
        cols.pop(k)
    datasets.Dataset.from_dict(cols).save_to_disk(str(path))
    return path


@pytest.mark.parametrize("changes,gbs,cap,msg", [
    ({"messages": None}, 2, 64, "missing column"),
    ({"labels": [[-100, 2], [-100, -100, 6, 7]]}, 2, 64, "labels length != input_ids length.*'a'"),
    ({"num_tokens": [3, 5]}, 2, 64, "num_tokens column"),
    ({"labels": [[-100, 2, 3], [-100, -100, -100, -100]]}, 2, 64, "no trainable token.*'b'"),
    ({}, 3, 64, "fewer than train.global_batch_size=3"),
    ({}, 2, 3, "longer than train.max_tokens_per_micro_batch=3.*'b'"),
    ({"input_ids": [[1, 2, 3], [4, -5, 6, 7]]}, 2, 64, "a token id < 0 or a label < 0 other than -100.*'b'"),
    ({"labels": [[-100, 2, -7], [-100, -100, 6, 7]]}, 2, 64, "a token id < 0 or a label < 0 other than -100.*'a'"),
])
def test_bad_dataset_dirs_name_the_problem(tmp_path, changes, gbs, cap, msg):
    d = _write_ds(tmp_path / "ds", **changes)
    with pytest.raises(DataError, match=msg):
        load_train_data(d, global_batch_size=gbs, max_tokens_per_micro_batch=cap)


def test_missing_dataset_dir_or_a_manifest_that_is_no_object(tmp_path):
    with pytest.raises(DataError, match="data.dir: .*does not exist"):
        load_train_data(tmp_path / "nope", global_batch_size=2, max_tokens_per_micro_batch=8)
    (_write_ds(tmp_path / "ds") / "manifest.json").write_text("[1, 2]")
    with pytest.raises(DataError, match=r"manifest.json: expected a JSON object, found list"):
        load_train_data(tmp_path / "ds", global_batch_size=2, max_tokens_per_micro_batch=8)


# ---------------------------------------------------------------- config and CLI


def test_config_errors_name_the_key(tmp_path, data_dir):
    cfg = write_config(tmp_path / "run", data_dir)
    with pytest.raises(ConfigError, match="unknown key 'train.lrr'.*Did you mean: train.lr"):
        load_config(cfg, ["train.lrr=1"])
    with pytest.raises(ConfigError, match="train.lr must be a positive number, got .abc."):
        load_config(cfg, ["train.lr=abc"])
    with pytest.raises(ConfigError, match="train.global_batch_size must be a positive integer, got 0"):
        load_config(cfg, ["train.global_batch_size=0"])
    with pytest.raises(ConfigError, match="data.dir: must be set"):
        load_config(cfg, ["data.dir=null"])
    with pytest.raises(ConfigError, match="model.attn_implementation"):
        load_config(cfg, ["model.attn_implementation=fast"])
    (tmp_path / "torn.yaml").write_text("a: [1\nb: 2\n")   # one line, not the YAML parser's four
    with pytest.raises(ConfigError, match=r"torn.yaml: not a valid YAML config \(while parsing a flow sequence in .* column 2\)$"):
        load_config(tmp_path / "torn.yaml")
    with pytest.raises(ConfigError, match="run: a directory, not a config file"):   # was "config file not found"
        load_config(tmp_path / "run")


def test_cli_fails_before_model_work(tmp_path, data_dir, capsys, monkeypatch):
    cfg = write_config(tmp_path / "run", data_dir)
    monkeypatch.setattr(train, "prepare_model", lambda *a, **k: pytest.fail("model built despite a bad config"))
    assert train.cli([str(cfg), "model.gpu_only=true"]) == 2
    assert "model.gpu_only=true but CUDA is not available" in capsys.readouterr().err
    # the refusal is recorded for launch, which reports it as one line with exit 2 (torchrun says 1)
    from launch.run import report_end

    rd = cfg.parent
    assert json.loads((rd / "logs" / "trainer-exit.json").read_text())["code"] == 2
    assert report_end(rd, 1, rd / "logs" / "x.log") == 2
    assert "model.gpu_only=true but CUDA is not available" in capsys.readouterr().err
    assert train.cli([str(cfg), f"data.dir={tmp_path}/missing"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert train.cli([str(tmp_path / "none.yaml")]) == 2
    # a label beyond the vocabulary is refused as an input id is (seen failing: an IndexError in the loss)
    big = _write_ds(tmp_path / "big", labels=[[-100, 2, 3], [-100, -100, 6, 99999]])
    assert train.cli([str(cfg), f"data.dir={big}", "train.global_batch_size=2"]) == 2
    assert "token id 99999 >= the model's vocab_size 4096" in capsys.readouterr().err
    assert train.cli(["--help"]) == 0
    assert "usage: python -m sft.train" in capsys.readouterr().out


def test_schedule_and_save_points(tmp_path, data_dir):
    cfg = load_config(write_config(tmp_path / "run", data_dir), ["train.steps=null", "train.epochs=2", "train.global_batch_size=16",
                                                                   "train.save_steps=[50,100]", "train.save_epoch_ends=true"])
    t = cfg.train
    assert schedule(steps=t.steps, epochs=t.epochs, n_examples=3500, global_batch_size=t.global_batch_size) == (218, 436)
    assert save_points(save_steps=t.save_steps, save_epoch_ends=t.save_epoch_ends, per_epoch=218, total=436) == [50, 100, 218, 436]
    assert warmup_steps(218, 0.03) == 7  # 6.54 rounded up
    f = [lr_factor(s, total=218, warmup=7, schedule="cosine", min_ratio=0.0) for s in range(218)]
    assert f[0] == 0.0 and f[1] == pytest.approx(1 / 7) and f[7] == 1.0 and f[8] < 1.0  # peak once
    assert all(a >= b for a, b in zip(f[7:], f[8:])) and 0 < f[-1] < 1e-3


def _lrs_used(make_scheduler, total: int) -> list[float]:
    """The lr each optimizer step runs with (read before that step's scheduler.step())."""
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-5)
    sched = make_scheduler(opt)
    used = []
    for _ in range(total):
        used.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return used


@pytest.mark.parametrize("total", [218, 436])
@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant"])
def test_schedule_equals_transformers(total, schedule):
    """The oracle is transformers' own scheduler with the Trainer's warmup count ceil(0.03 x total)."""
    import transformers

    from sft.optim import build_scheduler

    warm = math.ceil(0.03 * total)
    hf_make = {"cosine": transformers.get_cosine_schedule_with_warmup, "linear": transformers.get_linear_schedule_with_warmup,
               "constant": lambda o, w, t: transformers.get_constant_schedule_with_warmup(o, w)}[schedule]
    ours = _lrs_used(lambda o: build_scheduler(o, total=total, warmup_ratio=0.03, schedule=schedule, min_ratio=0.0), total)
    ref = _lrs_used(lambda o: hf_make(o, warm, total), total)
    assert ours == pytest.approx(ref, rel=1e-12, abs=1e-18)
    assert ours[0] == 0.0 and ours[warm] == 1e-5
    if schedule == "cosine":  # the min-lr variant too
        ours = _lrs_used(lambda o: build_scheduler(o, total=total, warmup_ratio=0.03, schedule="cosine", min_ratio=0.1), total)
        ref = _lrs_used(lambda o: transformers.get_cosine_with_min_lr_schedule_with_warmup(o, warm, total, min_lr_rate=0.1), total)
        assert ours == pytest.approx(ref, rel=1e-12, abs=1e-18)


# ---------------------------------------------------------------- guards, resume bookkeeping


def test_nonfinite_guard():
    g = NonFiniteGuard(3)
    assert g.check(1.0, 1) and not g.check(float("nan"), 2) and not g.check(float("inf"), 3)
    assert g.check(2.0, 4) and g.consecutive == 0
    g.check(float("nan"), 5), g.check(float("nan"), 6)
    with pytest.raises(NonFiniteError, match="step 7: .*3 consecutive"):
        g.check(float("nan"), 7)


def test_nonfinite_step_is_skipped_then_too_many_stop_the_run(tmp_path, data_dir, monkeypatch, capsys):
    real = train.clip_grad_norm
    calls = {"n": 0}

    def nan_at_step_two(model, max_norm):
        calls["n"] += 1
        norm = real(model, max_norm)
        return float("nan") if calls["n"] == 2 else norm

    monkeypatch.setattr(train, "clip_grad_norm", nan_at_step_two)
    cfg = write_config(tmp_path / "a", data_dir, steps=3, save_steps=[], state_every=100, activation_checkpointing=False)
    assert train.cli([str(cfg)]) == 0
    rows = read_metrics(tmp_path / "a")
    assert [r["skipped"] for r in rows] == [False, True, False]
    monkeypatch.setattr(train, "clip_grad_norm", lambda model, max_norm: float("inf"))
    cfg = write_config(tmp_path / "b", data_dir, steps=3, max_consecutive_nonfinite=2, state_every=100)
    assert train.cli([str(cfg)]) == train.EXIT_NONFINITE
    assert "non-finite for 2 consecutive steps" in capsys.readouterr().err
    assert not (tmp_path / "b" / "DONE").exists()
    assert train.cli([str(cfg)]) == train.EXIT_NONFINITE  # DONE absent: it does not pretend to be finished


def test_torn_states_are_ignored(tmp_path):
    root = tmp_path / "state"
    for step, complete in ((2, True), (4, True), (6, False)):
        d = root / f"step-{step:06d}"
        d.mkdir(parents=True)
        (d / "meta.json").write_text("{}")
        if complete:
            (d / COMPLETE).write_text(f"{step}\n")
    assert [s for s, _ in complete_states(root)] == [2, 4]
    assert complete_states(root)[-1][1].name == "step-000004"
    (root / "step-000003").mkdir()  # torn, older than the newest complete state
    prune_states(root, keep=1)
    assert sorted(p.name for p in root.iterdir()) == ["step-000004", "step-000006"]


def test_resume_refuses_different_data(tmp_path, data_dir):
    cfg = load_config(write_config(tmp_path / "run", data_dir))
    data = load_train_data(data_dir, global_batch_size=8, max_tokens_per_micro_batch=256)
    meta = {"n": 20, "global_batch_size": 8, "seed": 0, "data_fingerprint": "other"}   # a state from before identity
    with pytest.raises(ConfigError, match="n: 20 -> 24\n  data_fingerprint: 'other' -> 'test-fp'"):
        train.validate_resume_meta(meta, cfg, data, tmp_path)


def _without_manifest(out: Path, seed: int) -> Path:
    """The copy-task dataset dir of `seed`, as a user's own dir: no manifest.json."""
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    (make_dataset_dir(out, n=24, seed=seed) / "manifest.json").unlink()
    return out


def test_a_dataset_dir_without_manifest_is_known_by_its_content(tmp_path):
    """A dir with no manifest.json (seen failing: fingerprint None on both sides, so a resume after its rows were
    rewritten, same count, went on over two datasets) carries the digest of its rows: the same rows the same
    digest, edited rows another, and a resume over the edit is refused as for a dataset with a manifest."""
    d = _without_manifest(tmp_path / "mine", seed=0)
    cfg = load_config(write_config(tmp_path / "run", d))
    before = load_train_data(d, global_batch_size=8, max_tokens_per_micro_batch=256)
    assert isinstance(before.fingerprint, str) and len(before.fingerprint) == 64
    assert load_train_data(d, global_batch_size=8, max_tokens_per_micro_batch=256).fingerprint == before.fingerprint
    meta = {"n": before.n, "identity": train.run_identity(cfg, before)}
    train.validate_resume_meta(meta, cfg, load_train_data(d, global_batch_size=8, max_tokens_per_micro_batch=256), tmp_path)
    after = load_train_data(_without_manifest(d, seed=1), global_batch_size=8, max_tokens_per_micro_batch=256)
    assert after.n == before.n and after.fingerprint != before.fingerprint
    with pytest.raises(ConfigError, match=f"data_fingerprint: '{before.fingerprint}' -> '{after.fingerprint}'"):
        train.validate_resume_meta(meta, cfg, after, tmp_path)
    legacy = {"n": before.n, "global_batch_size": 8, "seed": 0, "data_fingerprint": before.fingerprint}   # a state from before identity
    with pytest.raises(ConfigError, match="data_fingerprint: "):
        train.validate_resume_meta(legacy, cfg, after, tmp_path)
    (d / "manifest.json").write_text(json.dumps({"n": 24}))   # a manifest naming no fingerprint: the same
    assert load_train_data(d, global_batch_size=8, max_tokens_per_micro_batch=256).fingerprint == after.fingerprint


def test_a_state_that_recorded_no_data_fingerprint_resumes_with_a_warning(tmp_path, caplog):
    """A state saved from a dir without a manifest before such a dir was known by its content recorded the data
    fingerprint null: nothing to compare the data with, so it resumes on its other checks (a warning says so);
    its other keys are still compared."""
    d = _without_manifest(tmp_path / "mine", seed=0)
    cfg = load_config(write_config(tmp_path / "run", d))
    data = load_train_data(d, global_batch_size=8, max_tokens_per_micro_batch=256)
    old = {"n": data.n, "identity": dict(train.run_identity(cfg, data), data_fingerprint=None)}
    with caplog.at_level(logging.WARNING, logger="sft.train"):
        train.validate_resume_meta(old, cfg, data, tmp_path / "state")
    assert "recorded no data fingerprint" in caplog.text and str(tmp_path / "state") in caplog.text
    other = load_config(tmp_path / "run" / "config.yaml", ["train.lr=1e-4"])
    with pytest.raises(ConfigError, match=r"train.lr: 0.003 -> 0.0001"):
        train.validate_resume_meta(old, other, data, tmp_path)
    with pytest.raises(ConfigError, match="n: 20 -> 24"):
        train.validate_resume_meta(dict(old, n=20), cfg, data, tmp_path)
    legacy = {"n": data.n, "global_batch_size": 8, "seed": 0, "data_fingerprint": None}   # from before identity: its
    with pytest.raises(ConfigError) as err:                                                # semantics differ, its data no
        train.validate_resume_meta(legacy, cfg, data, tmp_path)
    assert f"trainer_semantics: 1 -> {TRAINER_SEMANTICS}" in str(err.value) and "data_fingerprint" not in str(err.value)


def test_resume_refuses_a_state_of_another_identity_naming_each_key(tmp_path, data_dir):
    """The state's meta.json carries the run identity; every result-changing key that differs is
    named old -> new, keys that may change on resume are not."""
    from omegaconf import OmegaConf

    data = load_train_data(data_dir, global_batch_size=8, max_tokens_per_micro_batch=256)
    old = load_config(write_config(tmp_path / "run", data_dir))
    meta = {"n": data.n, "identity": train.run_identity(old, data)}
    train.validate_resume_meta(meta, old, data, tmp_path)  # same config: accepted
    same = load_config(tmp_path / "run" / "config.yaml", ["train.state_every=9", "logging.wandb=true", "train.log_every=2"])
    train.validate_resume_meta(meta, same, data, tmp_path)
    new = load_config(tmp_path / "run" / "config.yaml", ["train.lr=1e-4", "train.lr_schedule=constant", "train.steps=9"])
    with pytest.raises(ConfigError) as err:
        train.validate_resume_meta(meta, new, data, tmp_path)
    assert str(err.value).splitlines()[1:4] == ["  train.lr: 0.003 -> 0.0001", "  train.lr_schedule: 'cosine' -> 'constant'",
                                                "  train.steps: 6 -> 9"]
    monkey = dict(meta, identity=dict(meta["identity"], trainer_semantics=0))
    with pytest.raises(ConfigError, match=f"trainer_semantics: 0 -> {TRAINER_SEMANTICS}"):
        train.validate_resume_meta(monkey, old, data, tmp_path)
    assert OmegaConf.select(old.raw, "train.lr") == 3e-3


def test_finished_run_is_not_retrained(tmp_path, data_dir, monkeypatch):
    cfg = write_config(tmp_path / "run", data_dir)
    (tmp_path / "run" / "DONE").write_text("{}")
    monkeypatch.setattr(train, "load_train_data", lambda *a, **k: pytest.fail("DONE run retrained"))
    assert train.cli([str(cfg)]) == 0


# ---------------------------------------------------------------- metrics, kernels


def test_flops_and_peak():
    from common.tiny import tiny_config

    from sft.model import matmul_params

    conf = tiny_config()
    n = matmul_params(conf)
    assert isinstance(n, int) and n > 0
    layers, d_attn = conf.num_hidden_layers, conf.num_attention_heads * conf.head_dim
    assert step_flops(n, conf, [10, 20]) == 6 * n * 30 + 6 * layers * d_attn * (100 + 400)
    assert lookup_peak_tflops(torch.device("cpu"), None) is None
    assert lookup_peak_tflops(torch.device("cpu"), 50.0) == 50.0


def test_matmul_params_counts_tied_head_once_as_matmul():
    from transformers import AutoModelForCausalLM

    from sft.model import matmul_params
    from common.tiny import tiny_config

    conf = tiny_config()
    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(conf)
    total = sum(p.numel() for p in m.parameters())
    assert conf.tie_word_embeddings and matmul_params(conf) == total  # embedding lookup out, tied head in


def test_metrics_log_truncates_on_resume(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, 6)))
    log = MetricsLog(p, resume_step=3, rank=0)
    log.write({"step": 4, "loss": 1.0})
    assert [json.loads(l)["step"] for l in p.read_text().splitlines()] == [1, 2, 3, 4]


def test_liger_skipped_on_cpu_and_refused_when_forced(caplog):
    from sft.model import apply_liger

    with caplog.at_level(logging.INFO, logger="sft.model"):
        assert apply_liger(torch.nn.Linear(1, 1), "auto", torch.device("cpu")) == []
    assert "liger: skipped on cpu" in caplog.text
    with pytest.raises(ConfigError, match="model.liger=true needs CUDA"):
        apply_liger(torch.nn.Linear(1, 1), "true", torch.device("cpu"))


def test_liger_guard_rejects_materialized_logits(data_dir):
    """With Liger active the loop insists the model returned no logits (the fused loss ran);
    a plain model (logits materialized) must trip that check."""
    import torch.distributed as dist

    from transformers import AutoModelForCausalLM

    from common.tiny import tiny_config

    conf = tiny_config()
    conf._attn_implementation = "sdpa"
    model = AutoModelForCausalLM.from_config(conf).train()
    data = load_train_data(data_dir, global_batch_size=8, max_tokens_per_micro_batch=512)
    plan = plan_step(data, 0, rank=0, world=1, global_batch_size=8, seed=0, capacity=512)
    _, _, owns = train.init_distributed("cpu")
    try:
        with pytest.raises(RuntimeError, match="Liger fused linear cross-entropy is not active"):
            train.forward_backward(model, plan, device=torch.device("cpu"), world=1, liger_active=True)
        loss, n_train, _, stop = train.forward_backward(model, plan, device=torch.device("cpu"), world=1)
        assert n_train == plan.global_trainable and not stop and loss > 0
    finally:
        if owns:
            dist.destroy_process_group()


def test_bf16_precision_writes_bf16_checkpoint(tmp_path, data_dir, capsys):
    """train.precision=bf16 (FSDP mixed precision; the GPU default) saves bf16 tensors and says so."""
    from safetensors import safe_open

    cfg = write_config(tmp_path / "run", data_dir, steps=1, save_steps=[4], precision="bf16", activation_checkpointing=False)
    assert train.cli([str(cfg)]) == 0
    assert "train.save_steps: 4 is past the run's last step 1 (train.steps=1): no checkpoint" in capsys.readouterr().err   # named
    ck = tmp_path / "run" / "checkpoints" / "step-000001"
    assert json.loads((ck / "config.json").read_text())["dtype"] == "bfloat16"
    with safe_open(str(ck / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}
    assert math.isfinite(read_metrics(tmp_path / "run")[0]["loss"])


def test_resume_never_starts_over(tmp_path, data_dir):
    """resume=never on a finished run dir: stale states and DONE are renamed aside (kept), the run
    trains from step 1."""
    run_dir = tmp_path / "run"
    cfg = write_config(run_dir, data_dir, steps=1, save_steps=[], activation_checkpointing=False, resume="never")
    stale = run_dir / "state" / "step-000009"
    stale.mkdir(parents=True)
    (stale / COMPLETE).write_text("9\n")
    (stale / "meta.json").write_text("{}")
    (run_dir / "DONE").write_text("{}")
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 9}) + "\n")
    assert train.cli([str(cfg)]) == 0
    assert not (run_dir / "state").exists()
    aside = list(run_dir.glob("state.replaced-*/step-000009/COMPLETE"))
    assert len(aside) == 1 and len(list(run_dir.glob("DONE.replaced-*"))) == 1
    assert [r["step"] for r in read_metrics(run_dir)] == [1]
    assert json.loads((run_dir / "DONE").read_text())["step"] == 1


def test_resume_never_refused_by_a_cheap_check_moves_nothing(tmp_path, data_dir):
    """A resume=never start that a check refuses (here flash-attn on CPU) leaves the run's outputs
    where they were: they are renamed aside only once the start is going ahead."""
    run_dir = tmp_path / "run"
    cfg = write_config(run_dir, data_dir, steps=1, save_steps=[], resume="never", **{"model.attn_implementation": "flash_attention_2"})
    (run_dir / "DONE").write_text("{}")
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 9}) + "\n")
    assert train.cli([str(cfg)]) == 2
    assert (run_dir / "DONE").read_text() == "{}" and (run_dir / "metrics.jsonl").is_file()
    assert not list(run_dir.glob("*.replaced-*"))


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGUSR1"])
def test_preemption_signals_set_the_flag(sig):
    import os
    import signal

    from common.preempt import PreemptionFlag

    before = signal.getsignal(getattr(signal, sig))
    flag = PreemptionFlag().install()
    try:
        assert not flag.set
        os.kill(os.getpid(), getattr(signal, sig))
        assert flag.set and flag.signum == getattr(signal, sig)
    finally:
        flag.restore()
    assert signal.getsignal(getattr(signal, sig)) == before


def test_a_run_seeds_every_rng_so_a_model_with_dropout_trains_the_same_twice(tmp_path, tiny_model_dir):
    """A pretrained model is loaded, not seeded: without the trainer seeding torch/numpy/python from `seed` at its
    start, dropout draws from whatever RNG state the process had (here: the first run's), so a second run of the same
    config in the same process gave other losses. Two runs in one process, a model with dropout: identical losses."""
    import shutil

    model = tmp_path / "dropout_model"
    shutil.copytree(tiny_model_dir, model)
    conf = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**conf, "attention_dropout": 0.5}))
    data = make_dataset_dir(tmp_path / "ds", n=16)
    losses = []
    for name in ("a", "b"):
        cfg = write_config(tmp_path / name, data, steps=2, save_steps=[], state_every=10, activation_checkpointing=False,
                           **{"model.path": str(model), "model.init": "pretrained"})
        assert train.main(cfg) == 0
        losses.append([m["loss"] for m in read_metrics(tmp_path / name) if "loss" in m])
    assert len(losses[0]) == 2 and losses[0] == losses[1]
