"""The held-out split (data_prep.heldout) and the teacher-forced benches of `evaluate` (tf_code, tf_search)."""
import json
import shutil

import numpy as np
import pytest
import torch

SYNTH = {"kind": "synthetic", "max_seq_len": 4096}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A held-out split (seed 1000), an arm that excludes it, and an arm built from the held-out seed
    without excluding it (so it holds held-out content)."""
    from data_prep.build import build_arm, build_heldout

    root = tmp_path_factory.mktemp("tfb")
    held = root / "heldout"
    build_heldout(SYNTH, n=2, domains=["code", "search"], seed=1000, tokenizer="tiny", out=held, progress=False)
    clean = root / "arm_clean"
    man = build_arm({**SYNTH, "n": 6, "heldout": str(held)}, arm="mixed", seed=1000, tokenizer="tiny", out=clean,
                    progress=False, num_proc=1)
    leaky = root / "arm_leaky"
    build_arm({**SYNTH, "n": 6}, arm="mixed", seed=1000, tokenizer="tiny", out=leaky, progress=False, num_proc=1)
    return {"root": root, "heldout": held, "clean": clean, "clean_manifest": man, "leaky": leaky}


def test_heldout_dir_is_verified_and_disjoint_from_an_arm_that_excludes_it(built):
    import datasets

    from data_prep import heldout

    held = heldout.load(built["heldout"])
    assert {d: len(v) for d, v in held.digests.items()} == {"code": 2, "search": 2}
    ds = datasets.load_from_disk(str(built["heldout"]))
    # the digests are of the records the dir holds (an independent recomputation from the rows)
    assert {heldout.content_digest(json.loads(m)) for m in ds["messages"]} == set(held.by_digest())
    # the arm from the same generator seed met held-out content and dropped it, counted
    man = built["clean_manifest"]
    assert man["heldout"]["excluded"] > 0 and man["rejected_by_reason"].get("heldout") == man["heldout"]["excluded"]
    assert heldout.check_disjoint(held, built["clean"]) > 0
    # a changed file is refused before anything is read
    copy = built["root"] / "heldout_changed"
    shutil.copytree(built["heldout"], copy)
    (copy / "rejected.jsonl").write_text("[]\n")
    with pytest.raises(heldout.HeldoutError, match="SHA256SUMS"):
        heldout.load(copy)


def test_check_heldout_refuses_training_data_holding_a_heldout_record(built, capsys):
    from data_prep.cli import main

    assert main(["check-heldout", f"heldout={built['heldout']}", f"train=[{built['clean']}]"]) == 0
    assert main(["check-heldout", f"heldout={built['heldout']}", f"train=[{built['clean']},{built['leaky']}]"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert str(built["heldout"] / "manifest.json") in err[0] and str(built["leaky"]) in err[0]
    assert "held-out record 'syn" in err[0] or "held-out record 'synth" in err[0] or "held-out record '" in err[0]


@pytest.fixture(scope="module")
def run_ckpt(built):
    """The tiny base as step 0 of a run whose manifest names the clean arm as its training data."""
    from common.tiny import resolve_model_path

    run = built["root"] / "run"
    ckpt = run / "checkpoints" / "step-000000"
    shutil.copytree(resolve_model_path("tiny-base"), ckpt)
    (run / "manifest.json").write_text(json.dumps({"data": {"dir": str(built["clean"])}}))
    return ckpt


@pytest.fixture(scope="module")
def trained(built):
    """A tiny mixed-arm run (2 steps, checkpoints at 1 and 2) built with data.heldout= the held-out split (launch
    run in this process: the trainer is its torchrun child either way)."""
    from launch.cli import main
    from tests.conftest import ROOT

    runs = built["root"] / "runs"
    argv = ["arm=mixed", "seed=0", "steps=2", "save_steps=[1]", "model=tiny", "data=synthetic", "n=8",
            "state_every=100", f"data.heldout={built['heldout']}", f"runs_root={runs}",
            "data.synthetic.code_turns=[1,2]", "data.synthetic.long_fraction=0.0"]
    with pytest.MonkeyPatch.context() as mp:
        for k, v in {"OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}.items():
            mp.setenv(k, v)
        mp.delenv("RANK", raising=False)
        mp.chdir(ROOT)
        assert main(argv) == 0
    return runs


@pytest.fixture(scope="module")
def analysed(built, trained, tmp_path_factory):
    """analyze over the trained run with the teacher-forced benches: evaluates its two checkpoints (no test reads a
    figure file: drawn, not rendered)."""
    from launch.analyze import run_analysis
    from tests.conftest import unrendered_figures

    rep = tmp_path_factory.mktemp("rep")
    with pytest.MonkeyPatch.context() as mp:
        unrendered_figures(mp)
        res = run_analysis({"runs_root": str(trained), "out": str(rep), "benches": ["tf_code", "tf_search"],
                            "eval": {"heldout": str(built["heldout"]), "progress": False}})
    assert not res.evaluated.failures, res.evaluated.failures
    return res, rep


def test_tf_bench_rows_are_the_trainers_loss_on_each_heldout_record(built, trained, analysed):
    import datasets
    from transformers import AutoModelForCausalLM

    from data_prep.schema import trajectory_id
    from sft.data import collate
    from sft.train import micro_batch_loss

    ckpt = trained / "mixed" / "seed0" / "checkpoints" / "step-000002"
    out = trained / "mixed" / "seed0" / "eval" / "step-000002"   # evaluate's rows, written by analyze
    summary = json.loads((out / "summary.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32).eval()
    ds = datasets.load_from_disk(str(built["heldout"]))
    oracle: dict[str, tuple[float, int]] = {}
    for row in ds:   # the trainer's own loss on each held-out row, summed per record
        mb = collate([(np.asarray(row["input_ids"]), np.asarray(row["labels"]))])
        with torch.no_grad():
            loss = micro_batch_loss(model, mb, torch.tensor(mb.num_trainable)).loss.item() * mb.num_trainable
        s, n = oracle.get(trajectory_id(row["id"]), (0.0, 0))
        oracle[trajectory_id(row["id"])] = (s + loss, n + mb.num_trainable)
    for bench, dom in (("tf_code", "code"), ("tf_search", "search")):
        rows = [json.loads(x) for x in (out / f"{bench}.jsonl").read_text().splitlines()]
        assert len(rows) == 2 and {r["domain"] for r in rows} == {dom}
        for r in rows:
            s, n = oracle[r["id"]]
            assert r["total_tokens"] == n == sum(r["tokens"].values())
            assert r["total_loss"] / n == pytest.approx(s / n, rel=1e-6)
        tokens = sum(r["total_tokens"] for r in rows)
        assert summary[bench]["loss"] == pytest.approx(sum(r["total_loss"] for r in rows) / tokens, rel=1e-12)
        assert summary[bench]["tokens"] == tokens
    meta = json.loads((out / "meta.json").read_text())
    assert meta["teacher_forced"]["fingerprint"] == json.loads((built["heldout"] / "manifest.json").read_text())["fingerprint"]
    assert meta["identities"]["tf_code"]["fingerprint"] != meta["identities"]["tf_search"]["fingerprint"]


def test_evaluate_refuses_a_checkpoint_trained_on_heldout_records(built, run_ckpt, tmp_path):
    from evals.errors import EvalError
    from evals.run import evaluate

    run = run_ckpt.parent.parent
    (run / "manifest.json").write_text(json.dumps({"data": {"dir": str(built["leaky"])}}))
    try:
        with pytest.raises(EvalError, match="held-out record .* is training record"):
            evaluate({"ckpt": str(run_ckpt), "benches": ["tf_code"], "heldout": str(built["heldout"]),
                      "out": str(tmp_path / "e"), "progress": False, "wandb": False})
    finally:
        (run / "manifest.json").write_text(json.dumps({"data": {"dir": str(built["clean"])}}))


def test_evaluate_opens_the_heldout_set_once(built, run_ckpt, tmp_path, monkeypatch):
    """One evaluate call over both teacher-forced benches loads and verifies the held-out dir once, and
    checks the checkpoint's training data against it once: items, rows and meta.json read that one set."""
    from data_prep import heldout
    from evals.run import evaluate

    calls = dict.fromkeys(("load", "check_disjoint"), 0)
    for name in calls:
        def counted(*args, _name=name, _real=getattr(heldout, name), **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)
        monkeypatch.setattr(heldout, name, counted)
    summary = evaluate({"ckpt": str(run_ckpt), "benches": ["tf_code", "tf_search"], "heldout": str(built["heldout"]),
                        "n": 1, "out": str(tmp_path / "e"), "progress": False, "wandb": False})
    assert calls == {"load": 1, "check_disjoint": 1}
    assert summary["tf_code"]["n"] == summary["tf_search"]["n"] == 1
    meta = json.loads((tmp_path / "e" / "meta.json").read_text())
    assert meta["teacher_forced"]["fingerprint"] == heldout.load(built["heldout"]).fingerprint
    # the identity is the held-out content's, not where it was built: the same set written elsewhere (its
    # manifest names other raw paths) finds the out dir complete; other content is another identity
    from data_prep.build import build_heldout
    from evals.errors import IdentityError

    for seed, where in ((1000, "elsewhere"), (1001, "other")):
        build_heldout(SYNTH, n=2, domains=["code", "search"], seed=seed, tokenizer="tiny", out=tmp_path / where / "h", progress=False)
    assert (tmp_path / "elsewhere" / "h" / "manifest.json").read_bytes() != (built["heldout"] / "manifest.json").read_bytes()
    again = evaluate({"ckpt": str(run_ckpt), "benches": ["tf_code", "tf_search"], "heldout": str(tmp_path / "elsewhere" / "h"),
                      "n": 1, "out": str(tmp_path / "e"), "progress": False, "wandb": False})
    assert json.loads((tmp_path / "e" / "meta.json").read_text())["identities"] == meta["identities"]
    # where each call read the set is information beside the identity
    assert {b: {**s, "source": None} for b, s in again.items()} == {b: {**s, "source": None} for b, s in summary.items()}
    assert again["tf_code"]["source"] == str(tmp_path / "elsewhere" / "h" / "manifest.json")
    with pytest.raises(IdentityError, match="bench.source_digest"):
        evaluate({"ckpt": str(run_ckpt), "benches": ["tf_code"], "heldout": str(tmp_path / "other" / "h"),
                  "n": 1, "out": str(tmp_path / "e"), "progress": False, "wandb": False})


def test_tf_benches_refuse_vllm_and_a_missing_heldout(built, run_ckpt):
    from evals.config import resolve
    from evals.errors import EvalError

    with pytest.raises(EvalError, match="backend=hf only"):
        resolve({"ckpt": str(run_ckpt), "benches": ["tf_code"], "heldout": str(built["heldout"]), "backend": "vllm"})
    with pytest.raises(EvalError, match="need heldout=DIR"):
        resolve({"ckpt": str(run_ckpt), "benches": ["tf_search"]})


def test_the_curves_values_are_the_rows_own_at_every_checkpoint(trained, analysed):
    import pandas as pd

    res, rep = analysed
    points = {(r.arm, r.seed, r.step, r.bench, r.span): r.loss
              for r in pd.read_csv(rep / "tables" / "teacher_forced_points.csv").itertuples()}
    checked = 0
    for step in (1, 2):
        d = trained / "mixed" / "seed0" / "eval" / f"step-{step:06d}"
        for bench in ("tf_code", "tf_search"):
            rows = [json.loads(x) for x in (d / f"{bench}.jsonl").read_text().splitlines()]
            assert len(rows) == 2
            for span in ("all", "reasoning", "tool_arguments", "final_answer", "template"):
                if span == "all":
                    want = sum(r["total_loss"] for r in rows) / sum(r["total_tokens"] for r in rows)
                else:
                    toks = sum(r["tokens"][span] for r in rows)
                    if not toks:
                        assert ("mixed", 0, step, bench, span) not in points
                        continue
                    want = sum(r["loss"][span] for r in rows) / toks
                assert points[("mixed", 0, step, bench, span)] == pytest.approx(want, rel=1e-12)
                checked += 1
    assert checked >= 12
    fig = next(f for f in res.figures if f.paths[0].stem == "teacher_forced")
    assert any(t.startswith("tf_code [") and t.endswith(": all") for t in fig.panels)
    assert all(fig.series[t] == ["mixed/seed0"] for t in fig.panels)
    report = (rep / "report.md").read_text()
    assert "### teacher_forced" in report and "figures/teacher_forced.png" in report
    assert "teacher_forced" in (rep / "report.html").read_text()


def test_a_heldout_records_golds_are_its_answer_string_or_each_of_its_list():
    """A record's answer list is its golds, each one (seen failing: the list itself as one gold, which EM skips)."""
    from evals.metrics import exact_match
    from evals.teacher_forced import HeldoutItem

    def golds(answer):
        return HeldoutItem("r", {"task": "q", "answer": answer}, "d").golden_answers

    assert golds("W") == ["W"] and golds(None) == [] and golds(["Bard", "Shakespeare"]) == ["Bard", "Shakespeare"]
    assert exact_match("shakespeare", golds(["Bard", "Shakespeare"])) == 1.0
