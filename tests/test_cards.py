"""Model cards (common.cards): huggingface_hub is the oracle of the card's metadata and its model-index;
the run tree is built from files (a real tiny model as the final checkpoint, evaluation records as
evaluate writes them), no training."""
from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from common.cards import checkpoint_card, write_report_cards
from common.io import dir_identity, write_json, write_sha256sums

huggingface_hub = pytest.importorskip("huggingface_hub")
from huggingface_hub import ModelCard  # noqa: E402
from huggingface_hub.repocard_data import eval_results_to_model_index, model_index_to_eval_results  # noqa: E402

FINAL = {"synthqa": {"em": 0.55, "f1": 0.6125, "n": 40}, "search_plan_ood": {"reward": 0.25, "n": 40}}
ANCHOR = {"synthqa": {"em": 0.2, "f1": 0.31, "n": 40}, "search_plan_ood": {"reward": 0.0, "n": 40}}


def _checkpoint(d: Path, tiny: Path | None = None) -> Path:
    import shutil

    if tiny is not None:
        shutil.copytree(tiny, d)
    else:
        d.mkdir(parents=True)
        (d / "config.json").write_text("{}")
    write_sha256sums(d)
    return d


def _eval(run: Path, step: int, summary: dict, digest: str) -> None:
    d = run / "eval" / f"step-{step:06d}"
    d.mkdir(parents=True)
    write_json(d / "summary.json", summary)
    write_json(d / "meta.json", {
        "checkpoint_identity": {"kind": "sha256sums", "digest": digest},
        "identities": {b: {"fingerprint": f"fp-{b}", "keys": {"checkpoint.digest": digest}} for b in summary},
        "config": {"backend": "hf", "retriever": "bm25", "topk": 3, "max_model_len": 2048, "prompt": "tool_agent"}})


def _results(report: Path, points: dict, extra: dict | None = None) -> None:
    """results.csv as analyze writes it (arm, seed, step, bench, metric, value, n), plus `extra` columns."""
    report.mkdir(parents=True, exist_ok=True)
    cols = ["arm", "seed", "step", "bench", "metric", "value", "n", *(extra or {})]
    with open(report / "results.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        for (arm, seed, step), summary in points.items():
            for bench, metrics in summary.items():
                for metric, value in metrics.items():
                    if metric != "n":
                        w.writerow([arm, seed, step, bench, metric, value, metrics["n"],
                                    *[f(arm, bench, metric, value) for f in (extra or {}).values()]])


@pytest.fixture
def tree(tmp_path):
    return build_tree(tmp_path)


def build_tree(tmp_path: Path, model: Path | None = None):
    """runs/search/seed0 (SFT, checkpoints of stand-in files at steps 2 and 4, or `model` at step 4),
    runs/r2e/seed0, a dataset manifest, evaluation records of step 4 and the report's results.csv."""
    runs = tmp_path / "runs"
    run = runs / "search" / "seed0"
    data = runs / "_data" / "abc"
    data.mkdir(parents=True)
    write_json(data / "manifest.json", {
        "arm": "search", "seed": 0, "n": 40, "config": {"kind": "synthetic", "epilogue": True},
        "sources": [{"spec": "openseeker:OpenSeeker/traj@v1", "domain": "search", "read": 23, "kept": 21, "rejected": 0},
                    {"spec": "search-r1:/data/sr1.jsonl", "domain": "search", "read": 23, "kept": 19, "rejected": 0}],
        "counts": {"rows": 40, "rows_by_domain": {"search": 40}}, "tokens": {"total": 33940, "trainable_total": 5170}})
    _checkpoint(run / "checkpoints" / "step-000002")
    final = _checkpoint(run / "checkpoints" / "step-000004", model)
    (run / "config.yaml").write_text(yaml.safe_dump({
        "arm": "search", "seed": 0, "runs_root": str(runs), "name": None, "run_dir": str(run),
        "model": {"name": "qwen3_4b", "path": "Qwen/Qwen3-4B", "tokenizer": "Qwen/Qwen3-4B", "license": "apache-2.0",
                  "attn_implementation": "sdpa", "liger": False},
        "data": {"kind": "synthetic", "n": 40, "epilogue": True, "dir": str(data)},
        "train": {"global_batch_size": 4, "lr": 0.001, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0,
                  "lr_schedule": "cosine", "warmup_ratio": 0.03, "grad_clip": 1.0, "steps": 4, "save_steps": [2],
                  "precision": "fp32"}}))
    write_json(run / "manifest.json", {"command": "launch arm=search seed=0 steps=4", "git": {"commit": "c0ffee", "dirty": False},
                                       "recipes": {"model": "qwen3_4b"}, "launcher": {"nproc": 1},
                                       "hardware": {"cpu_count": 2, "gpus": []},
                                       "packages": {"torch": "2.x", "transformers": "5.x"}})
    _checkpoint(runs / "r2e" / "seed0" / "checkpoints" / "step-000004")
    _eval(run, 4, FINAL, dir_identity(final)["digest"])
    _eval(runs / "_anchor", 0, ANCHOR, "b" * 64)   # analyze's evaluation of the anchor (here under the same settings)
    report = tmp_path / "reports"
    _results(report, {("anchor", 0, 0): ANCHOR, ("search", 0, 2): FINAL, ("search", 0, 4): FINAL})
    return final, report


def _csv_rows(report: Path, arm="search", seed=0, step=4) -> dict:
    with open(report / "results.csv", newline="") as fh:
        return {(r["bench"], r["metric"]): (float(r["value"]), int(r["n"])) for r in csv.DictReader(fh)
                if (r["arm"], int(r["seed"]), int(r["step"])) == (arm, seed, step)}


def index_matches(card_text: str, expected: dict) -> bool:
    """huggingface_hub's reading of the card's model-index: one result per (bench, metric) of `expected`,
    each with its value and n, and nothing else."""
    data = ModelCard(card_text).data
    got = [((r.dataset_type, r.metric_type), (r.metric_value, (r.dataset_args or {}).get("n")))
           for r in data.eval_results or []]
    return len(got) == len(dict(got)) and dict(got) == expected


def test_card_parses_and_its_model_index_is_the_report(tree):
    final, report = tree
    text = checkpoint_card(final, report=report)
    card = ModelCard(text)
    assert card.data.base_model == "Qwen/Qwen3-4B" and card.data.license == "apache-2.0"
    assert card.data.library_name == "transformers" and card.data.pipeline_tag == "text-generation"
    assert card.data.datasets == ["OpenSeeker/traj"]   # the hub source; a local file is no dataset id
    expected = _csv_rows(report)
    assert len(expected) == 3 and index_matches(text, expected)
    # the library's own writer gives back the same model-index
    name, results = model_index_to_eval_results(card.data.to_dict()["model-index"])
    assert eval_results_to_model_index(name, results) == yaml.safe_load(text.split("---")[1])["model-index"]
    # the check is sensitive: one value perturbed, or one entry dropped, no longer matches
    perturbed = text.replace("value: 0.6125", "value: 0.6126")
    assert perturbed != text and not index_matches(perturbed, expected)
    assert not index_matches(text, {**expected, ("search_plan_ood", "reward_stop"): (0.25, 40)})
    fm = yaml.safe_load(text.split("---")[1])
    fm["model-index"][0]["results"].pop()
    dropped = "---\n" + yaml.safe_dump(fm) + "---\n" + text.split("---\n", 2)[2]
    assert not index_matches(dropped, expected)
    body = card.text
    for fact in ("seed 0, step 4", "| world size | 1 |", "33940", "openseeker", "c0ffee", "launch arm=search seed=0 steps=4", "+0.35",
                 "No interval in the report", "fp-synthqa", "max\\_model\\_len=2048", "search (this checkpoint's run) | 0 | 2, 4",
                 "| r2e | 0 | 4 |", "| config.json | 2 |", dir_identity(final)["digest"], "No study file given"):
        assert fact in body, fact
    # an arm trained by epochs (train.steps null, as recipes/arm/*.yaml): its total is the one DONE records, or the
    # epochs while it has none (seen: "step 4 of None" and "| steps | not recorded |")
    run = final.parents[1]
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["train"].update(steps=None, epochs=2)
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    body = ModelCard(checkpoint_card(final)).text
    assert "step 4 of 2 epochs (the run has no DONE yet)" in body and "| steps | 2 epochs (the run has no DONE yet) |" in body
    write_json(run / "DONE", {"step": 8, "checkpoint": str(run / "checkpoints" / "step-000008")})
    body = ModelCard(checkpoint_card(final)).text
    assert "step 4 of 8, trained" in body and "| steps | 8 | DONE step |" in body and "None" not in body


def test_rerun_is_byte_identical(tree):
    final, report = tree
    finals = [("search", 0, final)]
    first = [p.read_bytes() for p in write_report_cards(report, finals)]
    again = write_report_cards(report, finals)
    assert [p.name for p in again] == ["search-s0-step4.md"]
    assert [p.read_bytes() for p in again] == first
    # the cards dir holds this analysis's cards only (seen: another arm's card of an earlier analysis stayed);
    # a file no analysis writes is renamed aside, never deleted
    write_report_cards(report, [*finals, ("r2e", 0, final)])
    (report / "cards" / "notes.txt").write_text("mine")
    write_report_cards(report, finals)
    assert [p.name for p in (report / "cards").iterdir()] == ["search-s0-step4.md"]
    [aside] = report.glob("cards.replaced-*")
    assert (aside / "notes.txt").read_text() == "mine"
    write_report_cards(report, [("r2e", 0, final)])
    assert [p.name for p in (report / "cards").iterdir()] == ["r2e-s0-step4.md"]


def test_a_result_of_another_checkpoint_is_left_out_and_named(tree):
    final, report = tree
    meta_path = final.parent.parent / "eval" / "step-000004" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["identities"]["search_plan_ood"]["keys"]["checkpoint.digest"] = "f" * 64
    write_json(meta_path, meta)
    text = checkpoint_card(final, report=report)
    expected = {k: v for k, v in _csv_rows(report).items() if k[0] != "search_plan_ood"}
    assert index_matches(text, expected)
    assert "search\\_plan\\_ood reward = 0.25: its evaluation" in text and "ffffffffffffffff…" in text
    # a value in results.csv that no evaluation record holds is left out too
    _results(report, {("search", 0, 4): {"synthqa": {"em": 0.9, "f1": 0.6125, "n": 40}}})
    text = checkpoint_card(final, report=report)
    assert index_matches(text, {("synthqa", "f1"): (0.6125, 40)})
    assert "synthqa em = 0.9: no evaluation record of step 4" in text


def test_interval_columns_are_shown_and_read(tree):
    final, report = tree
    _results(report, {("anchor", 0, 0): ANCHOR, ("search", 0, 4): FINAL},
             extra={"ci_lo": lambda a, b, m, v: round(v - 0.4, 4), "ci_hi": lambda a, b, m, v: round(v + 0.05, 4)})
    text = checkpoint_card(final, report=report)
    assert "ci\\_lo" in text and "No interval in the report" not in text
    # anchor within [v - 0.4, v + 0.05] for em (0.2 in [0.15, 0.6]) and f1 (0.31 in [0.2125, 0.6625]), not reward (0 < -0.15? no: in)
    assert "lies within this checkpoint's interval (ci\\_lo, ci\\_hi) on 3 of 3" in text


HOSTILE = "<script>alert(1)</script>**x**|y\n---\nlicense: evil\n[link](javascript:x) " + "A" * 10_000


def test_hostile_fields_cannot_break_the_front_matter_or_inject_html(tree):
    final, report = tree
    summary = {HOSTILE: {"em": 0.5, "n": 40}, "synthqa": {"em": 0.55, "n": 40}}
    run = final.parent.parent
    (run / "eval" / "step-000004" / "summary.json").unlink()
    (run / "eval" / "step-000004" / "meta.json").unlink()
    (run / "eval" / "step-000004").rmdir()
    _eval(run, 4, summary, dir_identity(final)["digest"])
    _results(report, {("search", 0, 4): summary})
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["model"]["path"] = HOSTILE
    del cfg["model"]["license"]
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    text = checkpoint_card(final, report=report)
    card = ModelCard(text)
    assert card.data.to_dict().get("license") is None   # no key of the record's making
    assert index_matches(text, {(HOSTILE, "em"): (0.5, 40), ("synthqa", "em"): (0.55, 40)})
    front, body = text.split("\n---\n", 1)
    assert len(re.findall(r"(?m)^---$", text)) == 2   # the front matter's own two markers only
    assert "<" not in body and "\n---\n" not in body
    assert "\\*\\*x\\*\\*\\|y" in body and "(10" in body   # escaped, and its length stated where cut


def test_export_carries_its_card_and_still_verifies(tmp_path):
    """export-checkpoint report= study=: README.md in the export (listed in SHA256SUMS, verify-checkpoint
    passes), the source's and the export's digests, tensor keys, rows trimmed, the restored tokenizer."""
    import shutil

    from common.io import read_sha256sums, sha256_file
    from sft.export import export_main
    from sft.tiny import save_tiny_model
    from sft.verify import verify_checkpoint
    from tests.conftest import ROOT

    padded = save_tiny_model(tmp_path / "padded", seed=1, vocab_size=4160)
    final, report = build_tree(tmp_path, padded)
    tok = shutil.copytree(ROOT / "common" / "tiny_tokenizer", tmp_path / "pinned_tok")
    out = tmp_path / "export"
    assert export_main([f"ckpt={final}", f"out={out}", "dtype=fp32", "vocab_size=4096", f"tokenizer={tok}",
                        f"report={report}", "study=browsecomp_worker_export", "verify=false"]) == 0
    assert verify_checkpoint(out) == []
    sums, problems = read_sha256sums(out)
    assert not problems and sums["README.md"] == sha256_file(out / "README.md")
    text = (out / "README.md").read_text()
    assert index_matches(text, _csv_rows(report))
    body = ModelCard(text).text
    info = json.loads((out / "export_info.json").read_text())
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as fh:
        assert info["tensors"] == len(list(fh.keys())) and info["trimmed"]
    for fact in (f"source digest {dir_identity(final)['digest']}", f"tensor keys {info['tensors']}",
                 "trimmed 64 padded vocab rows from model.embed\\_tokens.weight (4160 -&gt; 4096)",
                 f"tokenizer.json {sha256_file(tok / 'tokenizer.json')}", "The RL training is not reproduced",
                 "| model.safetensors |", 'from_pretrained(".")'):
        assert fact in body, fact
    assert "| README.md |" not in body   # never its own digest
    digest = re.search(r"export digest ([0-9a-f]{64})", body).group(1)
    lines = (out / "SHA256SUMS").read_text().splitlines()
    from common.io import sha256_text

    assert digest == sha256_text("".join(f"{x}\n" for x in lines if not x.endswith("  README.md")))
    # a report dir without results.csv is refused before any work (exit 2, one line)
    assert export_main([f"ckpt={final}", f"out={tmp_path / 'x'}", f"report={tmp_path}"]) == 2
    assert not (tmp_path / "x").exists()


def test_export_section_names_the_tensors_the_export_dropped(tmp_path):
    """Tensors the export left out because transformers ignores them (export_info.json ignored_on_load) are named in
    the card, never dropped without a word."""
    from types import SimpleNamespace

    from common.cards import _export_section

    keys = [f"model.layers.{i}.self_attn.rotary_emb.inv_freq" for i in range(2)]
    (tmp_path / "export_info.json").write_text(json.dumps({"kind": "hf", "source": "s", "step": 3, "ignored_on_load": keys}))
    lines = _export_section(tmp_path, SimpleNamespace(step=3, digest={"digest": "d", "kind": "k"}))
    assert [x for x in lines if "transformers ignores" in x] == [
        "- tensors dropped because transformers ignores them on load: " + ", ".join(keys).replace("_", "\\_")]
    (tmp_path / "export_info.json").write_text(json.dumps({"kind": "hf", "source": "s", "step": 3, "ignored_on_load": []}))
    assert not [x for x in _export_section(tmp_path, SimpleNamespace(step=3, digest={})) if "ignores" in x]


def test_analyze_cards_true_writes_a_card_per_evaluated_final_checkpoint(tree, capsys):
    from launch.analyze import main

    final, report = tree
    runs = final.parents[3]
    shutil.rmtree(runs / "_anchor")   # no anchor evaluated
    argv = [f"runs_root={runs}", f"out={report}", "evaluate=false", "benches=[synthqa,search_plan_ood]",
            "cards=true", "wandb=false"]
    (report / "cards").mkdir()   # a user's own file where a card goes, in an out no analysis wrote (seen: overwritten)
    (report / "cards" / "search-s0-step4.md").write_text("my notes")
    assert main(argv) == 0
    [aside] = report.glob("cards.replaced-*")
    assert (aside / "search-s0-step4.md").read_text() == "my notes"
    # search/seed0's final step 4 is evaluated; r2e/seed0's final checkpoint is not: no card for it
    assert sorted(p.name for p in (report / "cards").iterdir()) == ["search-s0-step4.md"]
    text = (report / "cards" / "search-s0-step4.md").read_text()
    assert index_matches(text, _csv_rows(report))   # results.csv as analyze wrote it now
    assert len(_csv_rows(report)) == 3
    # no anchor evaluated: the paired table's gap, and the card's vs-anchor cell gives its reason (seen: a bare -)
    assert "| search | – (the anchor: not evaluated) |" in (report / "tables" / "paired_em.md").read_text()
    assert "| synthqa | em | 0.55 | 40 | not in the report | - | none (one seed and no per-item file) | " \
           "none (the anchor: not evaluated) |" in text
    # a rerun with cards=false leaves no card of the earlier analysis quoting results no longer in results.csv
    assert main([*argv[:-2], "cards=false", "wandb=false"]) == 0 and not (report / "cards").exists()


def test_a_grpo_card_states_lora_trl_and_compares_with_its_own_step_0(tree):
    final, report = tree
    run = final.parents[1]
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg.update(stage="grpo", task="spa", grpo={"completions_per_step": 32, "num_generations": 8, "split": "train", "beta": 0.001},
               lora={"r": 32, "alpha": 64, "target_modules": ["q_proj", "v_proj"]})
    del cfg["model"]["tokenizer"], cfg["model"]["license"]   # as a GRPO run's config.yaml holds its model (rl.config)
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    write_json(run / "DONE", {"step": 4, "trl": "1.9.2"})
    pre = {"synthqa": {"em": 0.5, "f1": 0.6, "n": 40}, "search_plan_ood": {"reward": 0.25, "n": 40}}
    _results(report, {("anchor", 0, 0): ANCHOR, ("search", 0, 0): pre, ("search", 0, 4): FINAL})
    _eval(run, 0, pre, "c" * 64)   # its step 0's evaluation: the same settings as step 4's
    card = ModelCard(checkpoint_card(final, report=report))
    assert card.data.base_model == "Qwen/Qwen3-4B"   # model.path, a hub id (seen: no base_model in a GRPO card)
    # the licence is the starting model's (seen: none, a GRPO config records none): here the model recipe that
    # config.yaml model.name names, whose model.path is the one the run started from
    assert card.data.license == "apache-2.0" and "| license | apache-2.0 | recipes/model/qwen3\\_4b.yaml" in card.text
    sft = final.parents[3] / "r2e" / "seed0"   # GRPO from an SFT checkpoint: that run's base, that run's licence
    (sft / "config.yaml").write_text(yaml.safe_dump({"model": {"path": "meta-llama/Llama-3.1-8B-Instruct", "license": "llama3.1"}}))
    (run / "config.yaml").write_text(yaml.safe_dump({**cfg, "model": {"name": "qwen3_4b", "path": str(sft / "checkpoints" / "step-000004")}}))
    from_sft = ModelCard(checkpoint_card(final))
    assert from_sft.data.base_model == "meta-llama/Llama-3.1-8B-Instruct" and from_sft.data.license == "llama3.1"
    assert f"| license | llama3.1 | {sft}/config.yaml model.license" in from_sft.text.replace("\\", "")
    local = final.parents[3] / "base"   # a local model dir: its own card's licence
    local.mkdir()
    (local / "README.md").write_text("---\nlicense: mit\n---\n# base\n")
    (run / "config.yaml").write_text(yaml.safe_dump({**cfg, "model": {"name": "qwen3_4b", "path": str(local)}}))
    assert ModelCard(checkpoint_card(final)).data.license == "mit"
    # a hub id the recipe of model.name does not name: no licence claimed, and the card says so
    (run / "config.yaml").write_text(yaml.safe_dump({**cfg, "model": {"name": "qwen3_4b", "path": "Org/Other-4B"}}))
    other = ModelCard(checkpoint_card(final))
    assert other.data.license is None and "| license | not recorded |" in other.text
    qa = {**cfg, "task": "qa", "grpo": {**cfg["grpo"], "prompts_file": "/d/hotpot_train.json", "qa_mode": "item", "retriever": "bm25"}}
    (run / "config.yaml").write_text(yaml.safe_dump(qa))
    assert "GRPO task: qa (questions from /d/hotpot\\_train.json, context mode item, retriever bm25)." in checkpoint_card(final)
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    body = card.text
    assert "None" not in body   # (seen: "prompts file None" for task=spa)
    for fact in ("A GRPO checkpoint", "| LoRA r / alpha | 32 / 64 |", "| TRL | 1.9.2 |", "| pre-RL (step 0) |",
                 "| LoRA targets | q\\_proj, v\\_proj |", "| KL coefficient | 0.001 |", "search\\_plan\\_act, split train",
                 "| synthqa | em | 0.55 | 40 | 0.5 | +0.0500 |",
                 "Against the pre-RL (step 0), 3 (bench, metric) pairs compared: higher on 2, lower on 0, equal on 1"):
        assert fact in body, fact
    assert ("- the pre-RL (step 0)'s synthqa value: model this run's step 0 (step-000000, the checkpoint it started from), "
            f"the same settings; record {run / 'eval' / 'step-000000'}") in body.replace("\\", "")


def test_the_reports_intervals_csv_is_shown_as_printed_and_counted(tree):
    """analyze's intervals.csv (one row per interval: kind, arm, vs, step, bench, metric, estimate, lo, hi, conf,
    covers, ...): this arm at this step, and its final checkpoint minus the anchor; other rows are not used."""
    final, report = tree
    cols = ["kind", "arm", "vs", "step", "bench", "metric", "estimate", "lo", "hi", "conf", "covers", "n_items",
            "n_seeds", "df", "method", "note"]
    rows = [("curve", "search", "", "4", "synthqa", "em", 0.55, 0.4, 0.7),
            ("curve", "search", "", "2", "synthqa", "f1", 0.9, 0.8, 1.0),          # another step: not this card's
            ("vs_anchor", "search", "anchor", "4", "synthqa", "em", 0.35, 0.2, 0.5),
            ("vs_anchor", "search", "anchor", "4", "synthqa", "f1", 0.3, -0.05, 0.6),
            # the seeds' final checkpoints differ (seed 0: 4, another seed: 2): the step the paired table names
            ("vs_anchor", "search", "anchor", "2/4", "search_plan_ood", "reward", 0.25, 0.1, 0.4),
            ("vs_anchor", "r2e", "anchor", "4", "synthqa", "em", -0.2, -0.3, -0.1)]   # another arm
    with open(report / "intervals.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        for k, arm, vs, step, bench, metric, est, lo, hi in rows:
            w.writerow([k, arm, vs, step, bench, metric, est, lo, hi, 0.95, "items", 40, 1, "", "bootstrap", ""])
    body = ModelCard(checkpoint_card(final, report=report)).text
    assert "| synthqa | em | 0.55 | 40 | 0.2 | +0.3500 | 0.55 \\[0.4, 0.7\\] 0.95 (items) | 0.35 \\[0.2, 0.5\\] 0.95 (items) |" in body
    # a cell without an interval says why (seen: a bare -, and so for a vs-anchor row of step 2/4)
    assert "| synthqa | f1 | 0.6125 | 40 | 0.31 | +0.3025 | none (not in intervals.csv) | 0.3 \\[-0.05, 0.6\\] 0.95 (items) |" in body
    assert "| search\\_plan\\_ood | reward | 0.25 | 40 | 0 | +0.2500 | none (not in intervals.csv) | 0.25 \\[0.1, 0.4\\] 0.95 " \
        "(items; the seeds' final steps 2/4) |" in body
    assert "lies above 0 on 2 of 3, below 0 on 0, and includes 0 on 1" in body
    assert "No interval in the report" not in body
    step2 = final.parent / "step-000002"   # not this seed's final checkpoint: not the report's comparison
    _eval(final.parents[1], 2, FINAL, dir_identity(step2)["digest"])
    body = ModelCard(checkpoint_card(step2, report=report)).text
    assert "| synthqa | em | 0.55 | 40 | 0.2 | +0.3500 | none (not in intervals.csv) | none (the report's is of each " \
           "seed's final checkpoint (steps 4): this seed's is step 4) |" in body


def test_a_hostile_variant_name_is_escaped_in_the_card_and_its_file_name(tree):
    final, report = tree
    bad = "v<img src=x onerror=alert(1)>*[x](y)*|`z`"
    run = final.parents[1]
    moved = run.parent / bad / "seed0"
    moved.parent.mkdir()
    run.rename(moved)
    final = moved / "checkpoints" / final.name
    _eval_dir = moved / "eval" / "step-000004"
    assert _eval_dir.is_dir()
    _results(report, {("anchor", 0, 0): ANCHOR, (f"search/{bad}", 0, 4): FINAL})
    [path] = write_report_cards(report, [(f"search/{bad}", 0, final)])
    assert re.fullmatch(r"[A-Za-z0-9._-]+\.md", path.name)
    text = path.read_text()
    card = ModelCard(text)
    assert card.data.tags[-1] == "search-v-img-src-x-onerror-alert-1-x-y-z"   # a tag of safe characters
    assert card.data.to_dict()["model-index"][0]["name"] == f"search-{bad}-s0-step4"
    assert index_matches(text, _csv_rows(report, arm=f"search/{bad}"))
    prose = re.sub(r"(?ms)^(`{3,})[^\n]*\n.*?^\1$", "", card.text)   # code blocks show the path as it is
    assert "<" not in prose and "`z`" not in prose
    # the snippets load the very path: a Python literal with escapes, a shell word in a fence it cannot close
    literal = re.search(r"AutoTokenizer.from_pretrained\((\"[^\n]*\")\)", card.text).group(1)
    assert "<" not in literal and eval(literal) == str(final)   # noqa: S307 - the card's own Python literal
    assert f"vllm serve '{final}' --port 8000\n```\n" in card.text


def test_numbers_keep_their_first_digits():
    """A value below 0.001 is not shown as 0 (seen: 1e-05 -> "0", -4e-05 -> "-0")."""
    from common.cards import number

    assert [number(v) for v in (1e-05, -4e-05, 0.00012345, 0.6125, 0.55, 1 / 3, 2.0, 0.0)] == \
        ["1e-05", "-4e-05", "0.0001234", "0.6125", "0.55", "0.3333", "2", "0"]


def test_cards_of_two_labels_with_one_file_name_are_both_kept(tree):
    """Labels a file name cannot tell apart (search/v1 and search-v1; x:y and x#y) get a card each (seen: the
    second overwrote the first); a label no other shares keeps its plain name."""
    final, report = tree
    paths = write_report_cards(report, [("search/v1", 0, final), ("search-v1", 0, final), ("x:y", 0, final),
                                        ("x#y", 0, final), ("search", 0, final)])
    assert len(set(paths)) == 5 and all(p.is_file() for p in paths) and paths[-1].name == "search-s0-step4.md"
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+-s0-step4\.md", p.name) for p in paths)
    assert write_report_cards(report, [("search/v1", 0, final), ("search-v1", 0, final)]) == paths[:2]   # stable names


def test_a_run_that_records_no_seed_is_not_matched_to_a_report_row(tree):
    """A run dir not named seedN whose config.yaml has no seed: the card says so (seen: a TypeError traceback)."""
    final, report = tree
    run = final.parents[1]
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    del cfg["seed"]
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    moved = run.rename(run.parent / "myrun")
    text = checkpoint_card(moved / "checkpoints" / final.name, report=report)
    assert "not evaluated: the run records no seed" in text and "model-index" not in text and "None" not in text


def test_an_anchor_value_of_another_n_is_not_compared(tree):
    """The anchor's synthqa at n=100, this checkpoint's at n=40: no difference of two item sets is stated
    (seen: +0.3500 and counted in the findings)."""
    final, report = tree
    _results(report, {("anchor", 0, 0): {**ANCHOR, "synthqa": {"em": 0.2, "f1": 0.31, "n": 100}}, ("search", 0, 4): FINAL})
    body = ModelCard(checkpoint_card(final, report=report)).text
    assert "| synthqa | em | 0.55 | 40 | 0.2 at n=100: not compared | - |" in body
    assert "Against the anchor, 1 (bench, metric) pairs compared: higher on 1" in body


@pytest.mark.parametrize("profile", ["long", None])
def test_a_result_is_credited_to_the_evaluation_profile_the_report_read(tree, profile):
    """The same values in eval/step-N and eval/long/step-N: the card names the evaluation (and its settings) of
    the profile report.md's settings name (seen: always eval/step-N's, backend=hf, for a profile=long report)."""
    final, report = tree
    run = final.parents[1]
    d = run / "eval" / "long" / "step-000004"
    d.mkdir(parents=True)
    write_json(d / "summary.json", FINAL)
    meta = json.loads((run / "eval" / "step-000004" / "meta.json").read_text())
    write_json(d / "meta.json", {**meta, "config": {"backend": "vllm", "max_turns": 8}})
    (report / "report.md").write_text("# Transfer-curve report\n\nGenerated by `analyze`.\n\nSettings: `runs_root=runs`, "
                                      f"`profile={profile or 'none (evaluations in eval/)'}`, `benches=[synthqa]`\n")
    body = ModelCard(checkpoint_card(final, report=report)).text
    want, other = ("backend=vllm, max\\_turns=8", "backend=hf") if profile else ("backend=hf", "backend=vllm")
    assert want in body and other not in body
    assert index_matches(checkpoint_card(final, report=report), _csv_rows(report))


def test_each_result_is_stated_with_its_own_benchs_settings_not_the_last_calls(tree):
    """An eval dir evaluated twice: synthqa at max_new_tokens=512 (kept, its identity recorded), then search_plan_ood
    alone under vllm at 1024 (meta.json's config: that last call's). synthqa's line states its identity's settings
    and no backend (none recorded for it); search_plan_ood's the last call's (seen: both max_new_tokens=1024,
    backend=vllm)."""
    final, report = tree
    d = final.parents[1] / "eval" / "step-000004"
    meta = json.loads((d / "meta.json").read_text())
    for bench, tokens in (("synthqa", 512), ("search_plan_ood", 1024)):
        meta["identities"][bench]["keys"].update({"evaluate.max_new_tokens": tokens, "evaluate.max_model_len": 2048,
                                                  "bench.seed": 42})
    write_json(d / "meta.json", {**meta, "benches": ["search_plan_ood"],
                                 "config": {"backend": "vllm", "max_new_tokens": 1024, "max_model_len": 2048, "seed": 42}})
    lines = [x for x in ModelCard(checkpoint_card(final, report=report)).text.splitlines() if x.startswith("- synthqa: identity")
             or x.startswith("- search\\_plan\\_ood: identity")]
    assert len(lines) == 2
    assert "max\\_model\\_len=2048, max\\_new\\_tokens=512, seed=42;" in lines[0] and "backend" not in lines[0]
    assert "backend=vllm, max\\_model\\_len=2048, max\\_new\\_tokens=1024, seed=42;" in lines[1]


def test_each_bench_is_shown_with_the_settings_of_the_evaluation_that_scored_it(tree, tmp_path, tiny_tokenizer):
    """Two evaluate calls into the checkpoint's eval dir, each of one bench with its own max_turns and topk: the
    card states each bench's own (seen: both with the last call's max_turns=2, topk=2, meta.json's config)."""
    import shutil

    from evals.run import evaluate
    from tests.test_evals_loop import ScriptedBackend, make_world

    final, report = tree
    run = final.parents[1]
    shutil.rmtree(run / "eval")
    corpus, bench_root = make_world(tmp_path, n=3)
    shutil.copytree(bench_root / "synthqa", bench_root / "otherqa")
    base = {"ckpt": str(final), "n": 3, "bench_root": str(bench_root), "corpus": str(corpus),
            "index_dir": str(tmp_path / "idx"), "progress": False}
    first = evaluate({**base, "benches": ["synthqa"], "max_turns": 3, "topk": 1}, backend=ScriptedBackend(tiny_tokenizer))
    second = evaluate({**base, "benches": ["otherqa"], "max_turns": 2, "topk": 2}, backend=ScriptedBackend(tiny_tokenizer))
    assert set(second) == {"synthqa", "otherqa"} and second["synthqa"] == first["synthqa"]
    _results(report, {("search", 0, 4): {b: {"em": second[b]["em"], "n": 3} for b in second}})
    body = ModelCard(checkpoint_card(final, report=report)).text
    lines = {b: next(line for line in body.splitlines() if line.startswith(f"- {b}: identity ")) for b in second}
    assert "max\\_turns=3" in lines["synthqa"] and "topk=1" in lines["synthqa"], lines["synthqa"]
    assert "max\\_turns=2" in lines["otherqa"] and "topk=2" in lines["otherqa"], lines["otherqa"]
    # synthqa evaluated again under other settings (overwrite=true), the call stopped in its next bench: the card
    # states the settings of the rows summary.json holds (seen: the replaced evaluation's max_turns=3, kept in meta.json)
    with pytest.raises(KeyboardInterrupt):
        evaluate({**base, "benches": ["synthqa", "otherqa"], "max_turns": 4, "topk": 1, "overwrite": True},
                 backend=ScriptedBackend(tiny_tokenizer, fail_at=3))
    held = json.loads((run / "eval" / "step-000004" / "summary.json").read_text())
    _results(report, {("search", 0, 4): {"synthqa": {"em": held["synthqa"]["em"], "n": 3}}})
    body = ModelCard(checkpoint_card(final, report=report)).text
    line = next(line for line in body.splitlines() if line.startswith("- synthqa: identity "))
    assert "max\\_turns=4" in line and "topk=1" in line, line
    # a meta.json written before evaluate recorded each bench's settings: the bench's identity keys say them
    meta_path = run / "eval" / "step-000004" / "meta.json"
    meta = json.loads(meta_path.read_text())
    del meta["settings"]
    write_json(meta_path, meta)
    body = ModelCard(checkpoint_card(final, report=report)).text
    line = next(line for line in body.splitlines() if line.startswith("- synthqa: identity "))
    assert "max\\_turns=4" in line and "topk=1" in line and "seed=42" in line, line


def test_the_base_models_revision_is_the_trainers_record_of_it(tree):
    """The commit a Hub-id base was loaded at: the run's manifest.json base, else DONE's; a GRPO run from an SFT
    checkpoint: that run's; a run that records none and a local base say so."""
    final, _ = tree
    run = final.parents[1]
    manifest = json.loads((run / "manifest.json").read_text())
    assert "| base model revision | not recorded | the run records none" in checkpoint_card(final)
    write_json(run / "DONE", {"step": 4, "base": {"model.path": {"repo": "Qwen/Qwen3-4B", "revision": "d" * 40}}})
    assert f"| base model revision | {'d' * 40} | DONE base |" in checkpoint_card(final)
    write_json(run / "manifest.json", {**manifest, "base": {"model.path": {"repo": "Qwen/Qwen3-4B", "revision": "e" * 40}}})
    assert f"| base model revision | {'e' * 40} | manifest.json base |" in checkpoint_card(final)
    grpo = final.parents[3] / "r2e" / "seed0"   # a GRPO run from this SFT run's final checkpoint: the SFT run's record
    grpo_final = grpo / "checkpoints" / "step-000004"
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    (grpo / "config.yaml").write_text(yaml.safe_dump({**cfg, "stage": "grpo", "run_dir": str(grpo),
                                                      "model": {"name": "qwen3_4b", "path": str(final)}}))
    assert f"| base model revision | {'e' * 40} | {run}/manifest.json base (the run it started from) |" \
        in checkpoint_card(grpo_final).replace("\\", "")
    (run / "config.yaml").write_text(yaml.safe_dump({**cfg, "model": {**cfg["model"], "path": str(final.parents[3] / "base")}}))
    (final.parents[3] / "base").mkdir()
    assert "| base model revision | not recorded | the base is no Hub id" in checkpoint_card(final)


def test_the_data_section_is_of_the_dataset_the_run_trained_on(tree):
    """A dataset rebuilt at the run's data.dir after training (`data-prep out=DIR overwrite=true`: the old one renamed
    aside) is not the run's: the card states the one whose fingerprint the run's manifest.json records, found where it
    was renamed to, or says it is not there (seen: the rebuilt dataset's rows and sources stated as the run's data)."""
    from common.io import replace_aside

    final, _ = tree
    run = final.parents[1]
    data = Path(yaml.safe_load((run / "config.yaml").read_text())["data"]["dir"])
    trained = json.loads((data / "manifest.json").read_text())
    write_json(data / "manifest.json", {**trained, "fingerprint": "a" * 64})
    manifest = json.loads((run / "manifest.json").read_text())
    write_json(run / "manifest.json", {**manifest, "data": {"dir": str(data), "cache_key": None, "fingerprint": "a" * 64}})
    assert "40 rows built of n = 40 asked" in checkpoint_card(final)
    aside = replace_aside(data)
    data.mkdir()
    write_json(data / "manifest.json", {**trained, "n": 12, "fingerprint": "b" * 64, "counts": {"rows": 12},
                                        "sources": [{"spec": "openseeker:Other/set@v2", "domain": "search", "kept": 12}]})
    card = checkpoint_card(final)
    assert "40 rows built of n = 40 asked" in card and "12 rows" not in card and "Other/set" not in card
    assert f"read from {aside}: the dataset at {data} was rebuilt" in card.replace("\\", "")
    assert ModelCard(card).data.datasets == ["OpenSeeker/traj"]
    shutil.rmtree(aside)   # the run's dataset is nowhere: nothing of the rebuilt one is stated as its
    card = checkpoint_card(final)
    assert "12 rows" not in card and "Other/set" not in card and ModelCard(card).data.datasets is None
    assert f"the dataset at {data} is not the one this run trained on" in card.replace("\\", "")


def test_the_comparison_value_is_stated_with_its_own_evaluations_settings(tree):
    """The anchor's value beside this checkpoint's comes from another evaluation (analyze's: the base model with
    prompt=anchor_nudge): the card names its model and the settings in which it differs, from its record in the
    anchor dir (seen: the only settings stated were the checkpoint's, prompt=tool_agent, under a column comparing
    with anchor_nudge numbers); no record holding the anchor's value: the card says its settings are not known."""
    final, report = tree
    anchor = final.parents[3] / "_anchor"
    assert "the anchor's synthqa value: model not recorded (no anchor.json), the same settings; record" \
        in checkpoint_card(final, report=report).replace("\\", "")
    shutil.rmtree(anchor)
    card = checkpoint_card(final, report=report).replace("\\", "")
    assert "the anchor's synthqa value: its evaluation record is not found" in card
    assert "Against the anchor (its evaluation's settings not known; see Evaluation), 3 (bench, metric) pairs" in card
    _eval(anchor, 0, ANCHOR, "b" * 64)
    meta = json.loads((anchor / "eval" / "step-000000" / "meta.json").read_text())
    meta["settings"] = {b: {**meta["config"], "prompt": "anchor_nudge", "max_new_tokens": 64} for b in ANCHOR}
    write_json(anchor / "eval" / "step-000000" / "meta.json", meta)
    write_json(anchor / "anchor.json", {"model": "Qwen/Qwen3-4B", "prompt": "anchor_nudge"})
    card = checkpoint_card(final, report=report).replace("\\", "")
    line = next(x for x in card.splitlines() if x.startswith("- the anchor's synthqa value"))
    assert "model Qwen/Qwen3-4B" in line and "prompt=anchor_nudge (this checkpoint's: tool_agent)" in line, line
    assert "max_new_tokens=64 (this checkpoint's: not recorded)" in line and "backend" not in line, line
    assert f"record {anchor / 'eval' / 'step-000000'}" in line, line
    assert "(evaluated under other settings: max_new_tokens, prompt; see Evaluation)" in card
    # a setting both record, other than the anchor's prompt, differs: its value is shown, not compared, as the report's
    # paired table does not pair them (seen: +0.3500 at max_new_tokens 32 against the anchor's at 64)
    mine = final.parents[1] / "eval" / "step-000004" / "meta.json"
    write_json(mine, {**json.loads(mine.read_text()), "settings": {b: {**meta["config"], "max_new_tokens": 32} for b in FINAL}})
    card = checkpoint_card(final, report=report).replace("\\", "")
    assert "| synthqa | em | 0.55 | 40 | 0.2 under other settings (max_new_tokens): not compared | - |" in card
    assert "the anchor's values were evaluated under other settings (max_new_tokens): not compared." in card
    assert "max_new_tokens=64 (this checkpoint's: 32), prompt=anchor_nudge (this checkpoint's: tool_agent)" in card
    # a record of the anchor dir that does not hold the value the report compares with is not its evaluation
    _results(report, {("anchor", 0, 0): {**ANCHOR, "synthqa": {"em": 0.3, "f1": 0.31, "n": 40}}, ("search", 0, 4): FINAL})
    card = checkpoint_card(final, report=report).replace("\\", "")
    assert "the anchor's synthqa value: its evaluation record is not found" in card


def test_provenance_names_each_launch_whose_code_differs_from_the_first(tree):
    """manifest.json's top-level git is its first launch's; a resume from other code (another commit, a dirty tree)
    appends to `launches`: the card names those (seen: "dirty: False" for a checkpoint trained after a resume from a
    dirty tree)."""
    final, _ = tree
    run = final.parents[1]
    manifest = json.loads((run / "manifest.json").read_text())
    first = {"time": "2026-12-01T00:00:00Z", "git": {"commit": "c0ffee", "dirty": False}}
    write_json(run / "manifest.json", {**manifest, "launches": [first, {**first, "time": "2026-12-01T01:00:00Z"}]})
    body = checkpoint_card(final).replace("\\", "")
    assert "- commit c0ffee (dirty: False)\n" in body and "launch 2" not in body
    write_json(run / "manifest.json", {**manifest, "launches": [
        first, {"time": "2026-12-01T01:00:00Z", "git": {"commit": "c0ffee", "dirty": True}},
        {"time": "2026-12-01T02:00:00Z", "git": {"commit": "beef", "dirty": False}}]})
    body = checkpoint_card(final).replace("\\", "")
    assert "- commit c0ffee (dirty: False) at its first launch" in body
    assert ("- the run resumed from other code (the checkpoints written after a resume were trained by its code too): "
            "launch 2 at 2026-12-01T01:00:00Z: commit c0ffee (dirty: True); launch 3 at 2026-12-01T02:00:00Z: commit beef "
            "(dirty: False)") in body


def test_world_size_is_each_launchs_when_a_resume_changed_it(tree):
    """launcher.* is outside the run identity: a run resumed on another number of processes (launch nproc=1, stopped,
    resumed with nproc=2) trained its later checkpoints on that world size (seen: "| world size | 1 |" for a checkpoint
    trained from step 8 to 40 on 2 processes)."""
    final, _ = tree
    run = final.parents[1]
    manifest = json.loads((run / "manifest.json").read_text())
    one = {"time": "2026-12-01T00:00:00Z", "launcher": {"kind": "local", "nproc": 1}}
    write_json(run / "manifest.json", {**manifest, "launches": [one, {**one, "time": "2026-12-01T01:00:00Z"}]})
    assert "| world size | 1 | manifest.json" in checkpoint_card(final)
    write_json(run / "manifest.json", {**manifest, "launches": [one, {"time": "2026-12-01T01:00:00Z",
                                                                      "launcher": {"kind": "local", "nproc": 2}}]})
    assert "| world size | launch 1: 1; launch 2: 2 (a resume on another world size) |" in checkpoint_card(final)


def test_hardware_and_packages_are_each_launchs_when_a_resume_changed_them(tree, monkeypatch):
    """manifest.json's `packages` and `hardware` are written when its first launch creates it: a run resumed in
    another environment (another torch) or on another machine trained its later checkpoints there (seen: a resume
    under torch 2.6 on an H100 card-stated as the first launch's torch 2.5, CPU only). Each launch records its own;
    the card names each launch's where they differ, the first's alone where none does."""
    import launch.manifest

    final, _ = tree
    run = final.parents[1]
    (run / "manifest.json").unlink()
    env = {"packages": {"torch": "2.5.1", "transformers": "4.57.0"},
           "hardware": {"hostname": "a", "cpu_count": 8, "cuda": False, "gpus": []}}
    monkeypatch.setattr(launch.manifest, "package_versions", lambda python=None: dict(env["packages"]))
    monkeypatch.setattr(launch.manifest, "hardware", lambda: dict(env["hardware"]))

    def resume():
        launch.manifest.write_manifest(run, argv=["seed=0"], choices={}, launcher={"kind": "local", "nproc": 1}, data={})
        return checkpoint_card(final).replace("\\", "")

    resume()
    env["hardware"] = {**env["hardware"], "hostname": "b"}   # another machine of the same kind: nothing to say
    card = resume()
    assert "| hardware | CPU only (8 cores) | manifest.json hardware" in card
    assert "| torch / transformers | 2.5.1 / 4.57.0 | manifest.json packages" in card
    env.update(packages={"torch": "2.6.0", "transformers": "4.57.0"},
               hardware={"hostname": "c", "cpu_count": 32, "cuda": True, "gpus": ["NVIDIA H100 80GB HBM3"]})
    card = resume()
    assert ("| hardware | launch 1: CPU only (8 cores); launch 2: CPU only (8 cores); launch 3: 1 GPU(s) NVIDIA H100 80GB "
            "HBM3 (a resume on other hardware) |") in card
    assert ("| torch / transformers | launch 1: 2.5.1 / 4.57.0; launch 2: 2.5.1 / 4.57.0; launch 3: 2.6.0 / 4.57.0 "
            "(a resume in another environment) |") in card


def test_a_slurm_runs_hardware_is_its_jobs_not_the_submitting_hosts(tree):
    """launch records `hardware` where it runs: for a Slurm launch that is the host that ran sbatch (a login node), not
    the nodes that trained (seen: "CPU only (2 cores)" for a run trained on 2 nodes of 4 GPUs). The card states the
    job's request instead, and that the nodes' GPU model is not recorded."""
    final, _ = tree
    run = final.parents[1]
    manifest = json.loads((run / "manifest.json").read_text())
    slurm = {"kind": "slurm", "nodes": 2, "gpus_per_node": 4, "script": "launch.sbatch", "job_id": "7"}
    write_json(run / "manifest.json", {**manifest, "launcher": slurm,
                                       "launches": [{"launcher": slurm, "hardware": manifest["hardware"]}]})
    card = checkpoint_card(final).replace("\\", "")
    assert "CPU only" not in card
    assert "| hardware | Slurm job of 2 node(s) x 4 GPU(s) (the nodes' GPU model is not recorded) |" in card
    local = {"kind": "local", "nproc": 1}   # a run started here, resumed on Slurm
    write_json(run / "manifest.json", {**manifest, "launcher": local, "launches": [
        {"launcher": local, "hardware": manifest["hardware"]}, {"launcher": slurm, "hardware": manifest["hardware"]}]})
    card = checkpoint_card(final).replace("\\", "")
    assert ("| hardware | launch 1: CPU only (2 cores); launch 2: Slurm job of 2 node(s) x 4 GPU(s) (the nodes' GPU model "
            "is not recorded) (a resume on other hardware) |") in card
