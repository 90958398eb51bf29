"""build_arm / cache_key / data-prep CLI: outputs, determinism, totals, bad input, decontam."""
from __future__ import annotations

import json
import shutil
import socket
import time
from pathlib import Path

import huggingface_hub
import pytest

from data_prep import build
from data_prep.arms import ArmError
from data_prep.cli import main as cli_main
from data_prep.config import DATA_DEFAULTS
from tests.test_data_prep_readers import BAD_ROWS, write_bad_file

ROOT = Path(__file__).resolve().parents[1]
SMALL = {"kind": "synthetic", "n": 12, "synthetic": {"n_entities": 40}}


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    out = tmp_path_factory.mktemp("arm") / "mixed"
    m = build.build_arm(SMALL, arm="mixed", seed=3, tokenizer="tiny", out=out, progress=False)
    return out, m


def test_defaults_are_the_sft_configs_data_section():
    from common import fields
    from sft.config import SFT

    assert fields.defaults(SFT)["data"] == DATA_DEFAULTS


def test_dataset_contract(mixed):
    import datasets

    out, m = mixed
    ds = datasets.load_from_disk(str(out))
    assert set(ds.column_names) == {"id", "source", "domain", "input_ids", "labels", "num_tokens", "num_trainable", "messages"}
    assert len(ds) == 12 and sorted(ds["domain"]) == ["code"] * 6 + ["search"] * 6
    assert ds["domain"] != sorted(ds["domain"])  # mixed is shuffled
    for row in ds:
        assert len(row["labels"]) == len(row["input_ids"]) == row["num_tokens"]
        assert row["num_trainable"] == sum(l != -100 for l in row["labels"]) > 0
        assert all(l in (-100, i) for l, i in zip(row["labels"], row["input_ids"]))
        rec = json.loads(row["messages"])
        assert rec["id"] == row["id"] and (rec.get("epilogue", "").startswith("\nFinal answer: ") if row["domain"] == "code" else True)
    assert (out / "rejected.jsonl").exists()
    assert json.loads((out / "manifest.json").read_text())["fingerprint"] == m["fingerprint"]
    for key in ("sources", "counts", "rejected_by_reason", "tokens", "tokenizer", "template", "fingerprint", "cache_key", "config", "seed"):
        assert key in m
    assert m["tokens"]["p50"] > 0 and 0 < m["tokens"]["trainable_fraction"] < 1
    assert m["render"]["epilogue_rows"] == 6 and m["render"]["assistant_turns_as_rendered"] == 0
    assert m["render"]["trainable_tokens_as_rendered"] == 0 and m["render"]["trainable_tokens_exact"] == m["tokens"]["trainable_total"]
    c = m["counts"]
    assert c["kept"] + c["rejected"] + c["not_selected"] == c["read"] and c["kept"] == 12
    assert all(len(s["files"][0]["sha256"]) == 64 for s in m["sources"])


def test_determinism(mixed, tmp_path):
    out, m = mixed
    m2 = build.build_arm(SMALL, arm="mixed", seed=3, tokenizer="tiny", out=tmp_path / "again", progress=False)
    assert m2["fingerprint"] == m["fingerprint"] and m2["cache_key"] == m["cache_key"]
    assert build.cache_key(SMALL, arm="mixed", seed=3, tokenizer="tiny") == m["cache_key"]
    assert build.cache_key(SMALL, arm="mixed", seed=4, tokenizer="tiny") != m["cache_key"]
    assert build.cache_key({**SMALL, "epilogue": False}, arm="mixed", seed=3, tokenizer="tiny") != m["cache_key"]
    # the number of worker processes never changes the output
    m4 = build.build_arm({**SMALL, "n": 80}, arm="mixed", seed=3, tokenizer="tiny", out=tmp_path / "p1", progress=False, num_proc=1)
    m5 = build.build_arm({**SMALL, "n": 80}, arm="mixed", seed=3, tokenizer="tiny", out=tmp_path / "p2", progress=False, num_proc=2)
    assert m4["fingerprint"] == m5["fingerprint"] and m4["counts"] == m5["counts"]
    m3 = build.build_arm(SMALL, arm="mixed", seed=4, tokenizer="tiny", out=tmp_path / "other", progress=False)
    assert m3["fingerprint"] != m["fingerprint"]


# Per search format: its synthetic file's place in write_sources' list, the fields that make a row's gold no gold, the fields
# that make golds and the record's gold from them, and the gold of a row left as written.
GOLD_ROWS = {
    "openseeker": (0, [{"answer": {"a": 1}}, {"answer": None}, {"answer": []}, {"answer": True}],
                   [({"answer": 1603}, "1603"), ({"answer": ["Bard", "Shakespeare"]}, ["Bard", "Shakespeare"])],
                   lambda row: row["answer"]),
    "search-r1": (1, [{"golden_answers": None}, {"golden_answers": []}, {"golden_answers": [{"a": 1}]}],
                  [({"golden_answers": ["Bard", "Shakespeare"]}, ["Bard", "Shakespeare"]),
                   ({"reward_model": {"style": "rule", "ground_truth": {"target": ["Ann", "Anne"]}}}, ["Ann", "Anne"])],
                  lambda row: row["golden_answers"][0]),
}


@pytest.mark.parametrize("fmt", sorted(GOLD_ROWS))
def test_search_rows_without_a_usable_gold_are_counted_and_golds_kept(tmp_path, fmt):
    """Search rows whose gold is missing or no gold (seen failing: kept, with the model's own <answer> as gold) are
    refused as `bad_gold`, counted in the manifest and listed in rejected.jsonl; a number is a gold, and every gold of
    a list is kept (seen failing for search-r1: the first alone)."""
    import datasets

    from data_prep.synthetic import SyntheticConfig, write_sources

    place, bad, good, plain = GOLD_ROWS[fmt]
    p = tmp_path / "rows.jsonl"
    spec = write_sources(tmp_path / "src", seed=0, code_n=0, search_n=12, cfg=SyntheticConfig())["search"][place]
    assert spec.startswith(f"{fmt}:")
    rows = [json.loads(x) for x in Path(spec.split(":", 1)[1]).read_text().splitlines()]
    for row, fields in zip(rows, bad + [f for f, _ in good]):
        row |= fields
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    m = build.build_arm({"sources": {"search": [f"{fmt}:{p}"]}, "n": len(rows), "allow_fewer": True}, arm="search",
                        seed=0, tokenizer="tiny", out=tmp_path / "arm", progress=False)
    assert m["rejected_by_reason"] == {"bad_gold": len(bad)} and m["counts"]["kept"] == len(rows) - len(bad)
    assert sorted(json.loads(x)["id"] for x in (tmp_path / "arm" / "rejected.jsonl").read_text().splitlines()) == \
        sorted(r["id"] for r in rows[:len(bad)])
    golds = {json.loads(x)["id"]: json.loads(x)["answer"] for x in datasets.load_from_disk(str(tmp_path / "arm"))["messages"]}
    assert [golds[r["id"]] for r in rows[len(bad):len(bad) + len(good)]] == [g for _, g in good]
    assert all(golds[r["id"]] == plain(r) for r in rows[len(bad) + len(good):])


def test_a_dataset_without_its_manifest_keeps_its_fingerprint(mixed, tmp_path):
    """The trainer knows a dataset dir without manifest.json by its rows' content: the very digest data_prep
    records in the manifest (common.fingerprint.rows_fingerprint), so the manifest's absence changes no identity."""
    import hashlib

    import datasets
    import numpy as np

    from sft.data import load_train_data

    out, m = mixed
    ds = datasets.load_from_disk(str(out))
    h = hashlib.sha256()   # the manifest's digest as data_prep wrote it before it was shared with the trainer
    for r in ds:
        h.update(r["id"].encode() + b"\0")
        h.update(np.asarray(r["input_ids"], dtype=np.int32).tobytes() + np.asarray(r["labels"], dtype=np.int32).tobytes())
        h.update(hashlib.sha256(r["messages"].encode()).digest())
    assert h.hexdigest() == m["fingerprint"]
    shutil.copytree(out, tmp_path / "copy")
    (tmp_path / "copy" / "manifest.json").unlink()
    assert load_train_data(tmp_path / "copy", global_batch_size=2, max_tokens_per_micro_batch=4096).fingerprint == m["fingerprint"]


def test_cache_key_tracks_local_file_content(tmp_path):
    p = write_bad_file(tmp_path / "src.jsonl")
    cfg = {"sources": {"code": [f"r2e-gym:{p}"]}, "n": 1}
    k1 = build.cache_key(cfg, arm="r2e", seed=0, tokenizer="tiny")
    p.write_text(p.read_text() + "\n{}\n")
    assert build.cache_key(cfg, arm="r2e", seed=0, tokenizer="tiny") != k1
    # a tokenizer dir by its files, unloaded: the same files give the same key, any file transformers reads changes it
    from common.tiny import TOKENIZER_DIR

    tok = shutil.copytree(TOKENIZER_DIR, tmp_path / "tok")
    keys = [build.cache_key(cfg, arm="r2e", seed=0, tokenizer=str(tok)), build.cache_key(cfg, arm="r2e", seed=0, tokenizer=str(tok))]
    for name in ("chat_template.jinja", "tokenizer_config.json", "additional_chat_templates/tool_use.jinja", "special_tokens_map.json"):
        (tok / name).parent.mkdir(exist_ok=True)
        (tok / name).write_text(((tok / name).read_text() if (tok / name).exists() else "{}") + " ")
        keys.append(build.cache_key(cfg, arm="r2e", seed=0, tokenizer=str(tok)))
    assert keys[0] == keys[1] and len(set(keys)) == 5, keys


def test_bad_input_totals_and_strict(tmp_path, capsys):
    p = write_bad_file(tmp_path / "bad.jsonl")
    cfg = {"sources": {"code": [f"r2e-gym:{p}"]}, "n": 5, "allow_fewer": True}
    m = build.build_arm(cfg, arm="r2e", seed=0, tokenizer="tiny", out=tmp_path / "o", progress=False)
    assert m["counts"]["read"] == 1 + len(BAD_ROWS)
    assert m["counts"]["kept"] + m["counts"]["rejected"] == m["counts"]["read"]
    assert m["rejected_by_reason"] == {r: 1 for r in BAD_ROWS}
    lines = [json.loads(x) for x in (tmp_path / "o" / "rejected.jsonl").read_text().splitlines()]
    assert sorted(x["reason"] for x in lines) == sorted(BAD_ROWS) and all(x["source"] and x["id"] for x in lines)
    # allow_fewer still needs a usable record of each domain (a "mixed" arm of code only would be mislabelled)
    q = tmp_path / "all_bad.jsonl"
    q.write_text("".join(line + "\n" for line in BAD_ROWS.values()))
    with pytest.raises(ArmError, match=r"code: 0 usable of 5 needed\); add sources \(allow_fewer=true still needs"):
        build.build_arm({**cfg, "sources": {"code": [f"r2e-gym:{q}"]}}, arm="r2e", seed=0, tokenizer="tiny", out=tmp_path / "o4", progress=False)
    assert not (tmp_path / "o4").exists()
    # too few without allow_fewer: an error that says how many were found
    with pytest.raises(ArmError, match="1 usable of 5 needed"):
        build.build_arm({**cfg, "allow_fewer": False}, arm="r2e", seed=0, tokenizer="tiny", out=tmp_path / "o2", progress=False)
    # strict=true: non-zero exit listing the reasons, no dataset written
    rc = cli_main(["arm=r2e", f"out={tmp_path / 'o3'}", f"sources.code=[r2e-gym:{p}]", "n=1", "strict=true"])
    err = capsys.readouterr().err
    assert rc == 1 and "unparseable_tool_call" in err and "no_finish_call" in err
    assert not (tmp_path / "o3").exists()


def test_length_policy(tmp_path):
    base = {**SMALL, "n": 4, "max_seq_len": 1200, "allow_fewer": True}
    m = build.build_arm(base, arm="r2e", seed=0, tokenizer="tiny", out=tmp_path / "drop", progress=False)
    assert m["rejected_by_reason"].get("too_long", 0) > 0 and m["tokens"]["max"] <= 1200
    rej = [json.loads(x) for x in (tmp_path / "drop" / "rejected.jsonl").read_text().splitlines()]
    assert rej and all(r["reason"] == "too_long" and "r2e_gym.jsonl:" in r["where"] and "> max_seq_len 1200" in r["detail"] for r in rej)
    m = build.build_arm({**base, "length_policy": "truncate"}, arm="r2e", seed=0, tokenizer="tiny", out=tmp_path / "trunc", progress=False)
    assert m["render"]["truncated_rows"] > 0 and m["tokens"]["max"] == 1200 and m["counts"]["kept"] == 4
    # epilogue_rows counts the rows that still train the whole epilogue, not those truncation cut it from
    import datasets
    from transformers import AutoTokenizer
    from common.tiny import tiny_tokenizer_path

    tok = AutoTokenizer.from_pretrained(tiny_tokenizer_path())
    ds = datasets.load_from_disk(str(tmp_path / "trunc"))
    from data_prep import worker
    from data_prep.readers import read_source
    from data_prep.synthetic import SyntheticConfig, code_rows
    from data_prep.terminators import epilogue_text

    whole = [json.loads(r["messages"]).get("epilogue") == epilogue_text(json.loads(r["messages"])["task"]) for r in ds]
    assert 0 < m["render"]["epilogue_rows"] == sum(whole) < len(ds)
    # a row's messages JSON carries the epilogue it trains: whole, the part a cut leaves, or none (seen failing:
    # the whole epilogue stayed in the JSON of a row truncation cut it from)

    src = tmp_path / "one.jsonl"
    src.write_text(json.dumps(code_rows(1, 0, SyntheticConfig())[0]) + "\n")
    worker._init(tok, build.renderer_kwargs(DATA_DEFAULTS), False)
    ((_, rec, encs),) = worker.process_chunk([next(read_source(f"r2e-gym:{src}")).record])
    n, epi = len(encs[-1].input_ids), rec["epilogue"]   # the row ends with the epilogue, `<|im_end|>`, `\n`
    for cut in (n, n - 2, n - 3, n - 3 - len(epi)):
        r = build._finish_row(rec, encs[-1], {"max_seq_len": cut, "length_policy": "truncate"}, worker.record_json(rec))
        kept, trained = json.loads(r["messages"]).get("epilogue", ""), tok.decode([i for i, l in zip(r["input_ids"], r["labels"]) if l != -100])
        assert r["_epilogue"] == (kept == epi) == (cut >= n - 2) and epi.startswith(kept) and trained.removesuffix("<|im_end|>").endswith(kept)
        assert (0 < len(kept) < len(epi)) == (cut == n - 3) and (kept == "") == (cut < n - 3), (cut, kept)
    # assistant_turns_exact counts the turns still trained (a run of labels each), not those truncation cut away
    runs = sum(sum(1 for k, l in enumerate(r["labels"]) if l != -100 and (k == 0 or r["labels"][k - 1] == -100)) for r in ds)
    assert m["render"]["assistant_turns_exact"] == runs


def test_single_terminator_arm_holds_the_same_records(tmp_path):
    """epilogue=false (r2e_v5) drops under length_policy=drop the records r2e drops, its rows counted with the
    epilogue it leaves out: the two arms differ only by the epilogue, even for a record r2e's epilogue makes too long."""
    import datasets

    base = {**SMALL, "n": 6, "allow_fewer": True}
    full = datasets.load_from_disk(str(tmp_path / "r2e")) if build.build_arm(
        base, arm="r2e", seed=0, tokenizer="tiny", out=tmp_path / "r2e", progress=False) else None
    edge = sorted(full["num_tokens"])[len(full) // 2] - 1  # the longer half of r2e's rows exceeds it by the epilogue or more
    got = {}
    for epi in (True, False):
        build.build_arm({**base, "max_seq_len": edge, "epilogue": epi}, arm="r2e", seed=0, tokenizer="tiny", out=tmp_path / str(epi), progress=False)
        got[epi] = datasets.load_from_disk(str(tmp_path / str(epi)))
    assert 0 < len(got[True]) < len(full) and got[False]["id"] == got[True]["id"]
    # the same rows but for the epilogue's tokens, just before the final `<|im_end|>\n`
    assert all(t["input_ids"][: len(f["input_ids"]) - 2] == f["input_ids"][:-2] and t["input_ids"][-2:] == f["input_ids"][-2:]
               for t, f in zip(got[True], got[False]))


def test_decontamination_planted_overlap(tmp_path):
    from data_prep.synthetic import SyntheticConfig, code_rows

    rows = code_rows(3, 0, SyntheticConfig())
    planted = "the widget factory crashes whenever the configuration file contains a trailing comma on windows"
    rows[1]["messages"][1]["content"] = rows[1]["messages"][1]["content"].replace("**Description:**\n", "**Description:**\n" + planted + " ")
    src = tmp_path / "r2e.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    bench = tmp_path / "bench" / "test.jsonl"
    bench.parent.mkdir()
    bench.write_text(json.dumps({"id": "q7", "question": "Why: " + planted.upper() + "?", "golden_answers": ["x"]}) + "\n"
                     + json.dumps({"id": "q8", "question": "who wrote hamlet", "golden_answers": ["y"]}) + "\n")
    cfg = {"sources": {"code": [f"r2e-gym:{src}"]}, "n": 3, "decontam": [str(bench)], "allow_fewer": True}
    m = build.build_arm(cfg, arm="r2e", seed=0, tokenizer="tiny", out=tmp_path / "a", progress=False)
    assert m["decontam"]["overlapping"] == {"r2e.jsonl:2": ["bench/q7"]} and m["counts"]["kept"] == 3
    m = build.build_arm({**cfg, "decontam_drop": True}, arm="r2e", seed=0, tokenizer="tiny", out=tmp_path / "b", progress=False)
    assert m["counts"]["kept"] == 2 and m["rejected_by_reason"] == {"decontaminated": 1} and m["decontam"]["dropped"] == 1
    # a 12-word shared phrase is below the 13-gram threshold when the question is longer
    from data_prep.decontam import Decontaminator

    d = Decontaminator([("q", " ".join(f"w{i}" for i in range(20)))], n=13)
    assert d.matches(" ".join(f"w{i}" for i in range(12))) == [] and d.matches(" ".join(f"w{i}" for i in range(3, 16))) == ["q"]
    # a question two benches share is reported for both (by_bench counts each)
    long_q, mid_q = " ".join(f"w{i}" for i in range(20)), "who wrote the opera carmen in paris"
    d = Decontaminator([("nq/1", long_q), ("tq/7", long_q), ("nq/2", mid_q), ("popqa/3", mid_q)], n=13)
    assert d.matches(f"x {long_q} y") == ["nq/1", "tq/7"] and d.matches(f"so {mid_q}?") == ["nq/2", "popqa/3"]
    # two files of one bench giving one item id to different questions: both kept, told apart by file and line;
    # the same question under the same id (a sample of a set also read whole) is one question
    # (seen failing: both were `nq/5`, a hit on either named the same id)
    from data_prep.decontam import load_questions

    (tmp_path / "nq").mkdir()
    for name, qs in (("dev.jsonl", ["who wrote the opera carmen in paris", "same"]), ("test.jsonl", ["what colour is the sky", "same"])):
        (tmp_path / "nq" / name).write_text("".join(json.dumps({"id": i, "question": q}) + "\n" for i, q in zip(("5", "6"), qs)))
    questions, _ = load_questions([str(tmp_path / "nq" / "dev.jsonl"), str(tmp_path / "nq" / "test.jsonl")])
    assert questions == [(f"nq/5@{tmp_path}/nq/dev.jsonl:1", "who wrote the opera carmen in paris"), ("nq/6", "same"),
                         (f"nq/5@{tmp_path}/nq/test.jsonl:1", "what colour is the sky")]
    assert Decontaminator(questions).matches("Who wrote the opera Carmen in Paris?") == [f"nq/5@{tmp_path}/nq/dev.jsonl:1"]


def test_cli_help_dry_run_and_errors(capsys, tmp_path):
    assert cli_main(["--help"]) == 0 and "data-prep arm=r2e" in capsys.readouterr().out
    assert cli_main(["out=/x", "data=synthetic", "sources.code=[r2e-gym:/data/r2e.jsonl]", "dry_run=true"]) == 0
    out = capsys.readouterr().out
    assert "kind: synthetic" in out and "r2e-gym:/data/r2e.jsonl" in out
    assert cli_main(["out=/x", "epilouge=false"]) == 2 and "epilogue" in capsys.readouterr().err
    assert cli_main(["out=/x", "dat=hub"]) == 2 and "Did you mean: data?" in capsys.readouterr().err   # data=: listed
    assert cli_main(["out=/x", "arm=r2e", "sources.code=[nope:/x.jsonl]"]) == 2   # launch's rule (a dry run's too)
    assert "sources.code must be a list of FORMAT:PATH_OR_HUB_ID with FORMAT in r2e-gym" in capsys.readouterr().err
    rc = cli_main([f"out={tmp_path / 's'}", "arm=search", "data=synthetic", "n=4", "synthetic.n_entities=30"])
    assert rc == 0 and json.loads((tmp_path / "s" / "manifest.json").read_text())["counts"]["rows_by_domain"] == {"search": 4}


def test_the_manifest_names_its_source_files_from_any_working_directory(tmp_path, monkeypatch):
    """A manifest's `sources[].files[].path`: a file the build generated (data=synthetic's raw/) relative to the dataset
    dir, so a dataset renamed aside by overwrite=true still names its own file; any other file absolute (seen failing:
    both relative to the working directory, the aside manifest naming `d1/raw/...`, by then the new dataset's file).
    The rows' fingerprint does not depend on where the build ran."""
    from common.io import sha256_file

    monkeypatch.chdir(tmp_path)
    assert cli_main(["arm=r2e", "out=d1", "data=synthetic", "n=8", "synthetic.n_entities=30"]) == 0
    first = json.loads(Path("d1/manifest.json").read_text())
    assert cli_main(["arm=r2e", "out=d1", "data=synthetic", "n=4", "synthetic.n_entities=30", "overwrite=true"]) == 0
    (aside,) = tmp_path.glob("d1.replaced-*")
    monkeypatch.chdir(tmp_path.parent)   # read from elsewhere
    for d in (aside, tmp_path / "d1"):
        m = json.loads((d / "manifest.json").read_text())
        (f,) = [f for s in m["sources"] for f in s["files"]]
        assert f["path"] == "raw/r2e_gym.jsonl" and sha256_file(d / f["path"]) == f["sha256"], (d, f)
    assert first["sources"][0]["spec"] == f"r2e-gym:{tmp_path / 'd1' / 'raw' / 'r2e_gym.jsonl'}"   # where it was written
    assert json.loads((aside / "manifest.json").read_text()) == first
    gen = json.loads((tmp_path / "d1" / "manifest.json").read_text())
    shutil.copy(tmp_path / "d1" / "raw" / "r2e_gym.jsonl", tmp_path / "own.jsonl")
    monkeypatch.chdir(tmp_path)
    assert cli_main(["arm=r2e", "out=d2", "sources.code=[r2e-gym:own.jsonl]", "n=4"]) == 0
    (src,) = json.loads(Path("d2/manifest.json").read_text())["sources"]
    assert src["spec"] == "r2e-gym:own.jsonl" and src["files"] == [{"path": str(tmp_path / "own.jsonl"), "sha256": gen["sources"][0]["files"][0]["sha256"]}]
    monkeypatch.chdir(tmp_path.parent)   # the same build elsewhere, named absolute: the same rows, the same key
    assert cli_main(["arm=r2e", f"out={tmp_path / 'd3'}", "data=synthetic", "n=4", "synthetic.n_entities=30"]) == 0
    again = json.loads((tmp_path / "d3" / "manifest.json").read_text())
    assert (again["fingerprint"], again["cache_key"], again["sources"][0]["files"]) == (gen["fingerprint"], gen["cache_key"], gen["sources"][0]["files"])


def test_synthetic_bench_is_held_out(tmp_path):
    from data_prep.synthetic import write_synthetic_bench

    info = write_synthetic_bench(tmp_path / "b", seed=0, n=20)
    test = [json.loads(x) for x in Path(info["test"]).read_text().splitlines()]
    corpus = [json.loads(x) for x in Path(info["corpus"]).read_text().splitlines()]
    assert len(test) == 20 and set(test[0]) == {"id", "question", "golden_answers"}
    assert corpus[0]["contents"].startswith('"') and "\n" in corpus[0]["contents"]
    build.build_arm({"kind": "synthetic", "n": 60}, arm="search", seed=0, tokenizer="tiny", out=tmp_path / "s", progress=False)
    import datasets

    trained = {json.loads(r)["task"] for r in datasets.load_from_disk(str(tmp_path / "s"))["messages"]}
    assert trained and not trained & {t["question"] for t in test}
    for t in test:  # every answer is in the corpus
        assert any(t["golden_answers"][0] in c["contents"] for c in corpus)


def test_decontam_against_shared_benchmarks(tmp_path):
    from tests.conftest import shared_path

    bench = shared_path("benchmarks")
    files = [str(bench / "nq" / "test_seed42_1000.jsonl"), str(bench / "hotpotqa" / "dev_r1searcher_500.jsonl")]
    hotpot = json.loads(Path(files[1]).read_text().splitlines()[0])
    row = {"question": hotpot["question"], "golden_answers": [hotpot["answer"]],
           "response": "<think>look it up</think><search> q </search>\n\n<information>Doc 1(Title: T) x</information>\n\n<answer> y </answer>"}
    src = tmp_path / "r1.jsonl"
    src.write_text(json.dumps({**row, "id": "leak"}) + "\n" + json.dumps({**row, "id": "clean", "question": "what colour is the synthetic sky today"}) + "\n")
    m = build.build_arm({"sources": {"search": [f"search-r1:{src}"]}, "n": 2, "decontam": files, "decontam_drop": True, "allow_fewer": True},
                        arm="search", seed=0, tokenizer="tiny", out=tmp_path / "o", progress=False)
    assert m["decontam"]["overlapping"] == {"leak": ["hotpotqa/1"]} and m["counts"]["kept"] == 1
    assert m["decontam"]["questions"] == 1500


def test_synthetic_arm_also_reads_listed_sources(tmp_path):
    """data=synthetic plus sources.search=[canonical:...] (e.g. envs exports): both feed the pool,
    and the listed file is part of the cache key."""
    from envs.search_plan_act import export_trajectories

    exported = tmp_path / "spa.jsonl"
    export_trajectories(exported, n=6, seed=0)
    cfg = {**SMALL, "n": 20, "synthetic": {"n_entities": 40, "search_n": 14}, "sources": {"search": [f"canonical:{exported}"]}}
    m = build.build_arm(cfg, arm="search", seed=0, tokenizer="tiny", out=tmp_path / "arm", progress=False)
    assert m["counts"]["kept_by_source"].get("canonical") == 6 and m["counts"]["kept"] == 20
    key = build.cache_key(cfg, arm="search", seed=0, tokenizer="tiny")
    assert key != build.cache_key(SMALL | {"n": 20}, arm="search", seed=0, tokenizer="tiny")
    export_trajectories(exported, n=5, seed=1)
    assert build.cache_key(cfg, arm="search", seed=0, tokenizer="tiny") != key


def _bench_root(tmp_path, skip=()):
    """A dir laid out as ../shared/benchmarks with one tiny FlashRAG-format file per bench."""
    from common.benchmarks import SEARCH7

    root = tmp_path / "benchmarks"
    for k, b in enumerate(SEARCH7):
        if b in skip:
            continue
        (root / b).mkdir(parents=True)
        qs = [{"id": f"{b}-0", "question": "who wrote hamlet", "golden_answers": ["x"]},
              {"id": f"{b}-1", "question": f"which river flows through the capital city of country number {k} today", "golden_answers": ["y"]}]
        (root / b / "test.jsonl").write_text("".join(json.dumps(q) + "\n" for q in qs))
    return root


def _search_source(tmp_path, questions):
    rows = [{"id": f"r{i}", "question": q, "golden_answers": ["a"],
             "response": "<think>look</think><search> q </search>\n\n<information>Doc 1(Title: T) x</information>\n\n<answer> a </answer>"}
            for i, q in enumerate(questions)]
    src = tmp_path / "r1.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f"search-r1:{src}"


def test_decontam_bench_root_counts_per_bench(tmp_path):
    """All seven benches are checked; report mode lists overlaps per bench; short questions
    (< 6 words) match on normalized equality only."""
    root = _bench_root(tmp_path)
    src = _search_source(tmp_path, ["Who wrote Hamlet?",                                   # equal to the short question
                                    "who wrote hamlet and the other plays of that era",   # contains it: no match
                                    "Which river flows through the capital city of country number 3 today?",  # whole 6+ word question
                                    "what colour is the sky"])
    cfg = {"sources": {"search": [src]}, "n": 4, "decontam_bench_root": str(root)}
    m = build.build_arm(cfg, arm="search", seed=0, tokenizer="tiny", out=tmp_path / "a", progress=False)
    d = m["decontam"]
    assert d["bench_root"] == str(root) and len(d["files"]) == 7 and d["questions"] == 14
    assert sorted(d["overlapping"]) == ["r0", "r2"] and m["counts"]["kept"] == 4  # report mode keeps them
    assert len(d["overlapping"]["r0"]) == 7 and d["overlapping"]["r2"] == ["hotpotqa/hotpotqa-1"]
    assert d["by_bench"]["hotpotqa"] == {"questions": 2, "records": 2, "dropped": 0}
    assert d["by_bench"]["nq"] == {"questions": 2, "records": 1, "dropped": 0}
    m = build.build_arm({**cfg, "decontam_drop": True, "allow_fewer": True}, arm="search", seed=0, tokenizer="tiny",
                        out=tmp_path / "b", progress=False)
    assert m["counts"]["kept"] == 2 and m["decontam"]["by_bench"]["hotpotqa"]["dropped"] == 2


def test_decontam_bench_root_missing_bench_exits_2_naming_the_key(tmp_path, capsys, monkeypatch):
    root = _bench_root(tmp_path, skip=("bamboogle",))
    src = _search_source(tmp_path, ["what colour is the sky"])
    from common.cli import ConfigError

    with pytest.raises(ConfigError, match="data.decontam_bench_root"):
        build.build_arm({"sources": {"search": [src]}, "n": 1, "decontam_bench_root": str(root)}, arm="search", seed=0,
                        tokenizer="tiny", out=tmp_path / "x", progress=False)
    rc = cli_main([f"out={tmp_path / 'y'}", "arm=search", f"sources.search=[{src}]", "n=1", f"decontam_bench_root={root}"])
    err = capsys.readouterr().err
    # the key as typed here, bare (seen failing: data-prep named it data.decontam_bench_root, launch's form)
    assert rc == 2 and err.startswith(f"error: decontam_bench_root={root}: ") and "bamboogle" in err and "(decontam_sets)" in err
    assert not (tmp_path / "y").exists()
    # a missing held-out dir, named as typed: launch's data.heldout, data-prep's heldout (seen failing: `heldout=` under launch)
    with pytest.raises(ConfigError, match=f"^data.heldout={tmp_path}/nowhere: no such directory"):
        build.build_arm({"sources": {"search": [src]}, "n": 1, "heldout": str(tmp_path / "nowhere")}, arm="search", seed=0,
                        tokenizer="tiny", out=tmp_path / "x", progress=False)
    assert cli_main([f"out={tmp_path / 'y'}", "arm=search", f"sources.search=[{src}]", "n=1", f"heldout={tmp_path}/nowhere"]) == 2
    assert capsys.readouterr().err.startswith(f"error: heldout={tmp_path}/nowhere: no such directory")
    # so is a tokenizer that does not load: launch's model.tokenizer, data-prep's tokenizer (seen failing: `tokenizer=` under launch)
    with pytest.raises(ConfigError, match=f"^model.tokenizer={tmp_path}: cannot load a tokenizer"):
        build.cache_key({"sources": {"search": [src]}, "n": 1}, arm="search", seed=0, tokenizer=str(tmp_path))
    # a hub id the local cache lacks: offline, refused at once; online with the hub unreachable, asked once, without
    # huggingface_hub's retries (seen failing: 5 retries with backoff per file, ~80 s, for one line)
    def key(tok):
        return build.cache_key({"sources": {"search": [src]}, "n": 1}, arm="search", seed=0, tokenizer=tok)
    with pytest.raises(ConfigError, match="^model.tokenizer=nobody/no-tok: not in the local Hugging Face cache .* and HF_HUB_OFFLINE=1"):
        key("nobody/no-tok")
    slept = []   # huggingface_hub's backoff before each retry

    def unreachable(*args, **kw):
        raise socket.gaierror(-2, "Name or service not known")
    monkeypatch.setattr(socket, "getaddrinfo", unreachable)
    monkeypatch.setattr(time, "sleep", slept.append)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(ConfigError, match="^model.tokenizer=nobody/no-tok: not in the local Hugging Face cache .* and the Hugging Face Hub is unreachable "
                                          r"\(ConnectError: .*Name or service not known"):
        key("nobody/no-tok")
    assert not slept
    # its copy in the local hub cache still loads (as huggingface_hub falls back to it), without retries too
    from common.tiny import TINY_BASE_DIR
    from data_prep.hub import hub_cache

    # (huggingface_hub fixed its cache dir at its first import, maybe under another test's HF_HOME: this process's env's)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub_cache()))
    repo = hub_cache() / "models--nobody--cached-tok"   # (a model repo: its tokenizer files and config.json)
    shutil.copytree(TINY_BASE_DIR, repo / "snapshots" / ("0" * 40), ignore=shutil.ignore_patterns("*.safetensors"))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    loaded = build.load_tokenizer("nobody/cached-tok")   # (build_arm keys by the tokenizer it loaded: launch's key)
    assert build.tokenizer_key("nobody/cached-tok", loaded) == build.tokenizer_key("nobody/cached-tok") and not slept
    assert cli_main([f"out={tmp_path / 'y'}", "data.n=1"]) == 2   # launch's spelling (seen failing: "unknown key 'n'. Did you mean: n?")
    assert capsys.readouterr().err.startswith("error: unknown key 'data.n'. Did you mean: n?")


def test_study_recipe_decontaminates_synthetic_does_not():
    from launch.compose import compose

    # data=hub, the study default: the seven benches' reference item sets, by name (the cache evaluate reads)
    from common.benchmarks import SEARCH7
    from evals.benches import DEFAULT_SETS

    assert list(compose([]).cfg.data.decontam_sets) == [DEFAULT_SETS[b] for b in SEARCH7]
    assert compose([]).cfg.data.decontam_bench_root is None
    assert list(compose(["data=synthetic"]).cfg.data.decontam_sets) == []


def test_decontam_sets_read_the_data_cache(tmp_path, monkeypatch):
    """decontam_sets: the named sets' cached files (pre-filled here from ../shared), the same files
    evaluate reads; an unknown name is refused up front with the nearest one."""
    from common import datafetch
    from data_prep.config import problems
    from tests.conftest import shared_path

    monkeypatch.setenv("DTSFT_DATA", str(tmp_path / "cache"))
    datafetch.prefill(shared_path("benchmarks"), ["bamboogle:test", "hotpotqa:r1searcher_500"])
    hotpot = json.loads(datafetch.cached("hotpotqa:r1searcher_500").read_text().splitlines()[0])
    src = _search_source(tmp_path, [hotpot["question"], "what colour is the sky"])
    cfg = {"sources": {"search": [src]}, "n": 2, "decontam_sets": ["bamboogle:test", "hotpotqa:r1searcher_500"]}
    m = build.build_arm(cfg, arm="search", seed=0, tokenizer="tiny", out=tmp_path / "a", progress=False)
    d = m["decontam"]
    assert d["sets"] == cfg["decontam_sets"] and d["questions"] == 625 and list(d["overlapping"]) == ["r0"]
    assert [f["path"] for f in d["files"]] == [str(datafetch.cached(n)) for n in cfg["decontam_sets"]]
    assert problems({"decontam_sets": ["bamboogle:tset"]}) == [
        "data.decontam_sets: unknown data name 'bamboogle:tset'. Did you mean: bamboogle:test?"]


def _rewritten_search_records(n: int) -> list[dict]:
    """Search records a Qwen3 template rewrites: a middle turn without reasoning and a 'please
    continue' query — each needs 3 rows to stay exact."""
    from common.tools import SEARCH_TOOL  # the tool the calls name (a call to an undeclared tool is refused)

    call = lambda i, q: {"type": "function", "id": f"c{i}", "function": {"name": "search", "arguments": {"query": q}}}  # noqa: E731
    out = []
    for k in range(n):
        out.append({"id": f"rw{k}", "source": "canonical-test", "domain": "search", "task": f"question {k}", "answer": "a",
                    "terminator": "final_answer", "tools": [SEARCH_TOOL], "messages": [
                        {"role": "user", "content": f"question {k}"},
                        {"role": "assistant", "content": "", "reasoning_content": f"R{k}", "tool_calls": [call(0, "x")]},
                        {"role": "tool", "content": "doc", "tool_call_id": "c0", "name": "search"},
                        {"role": "assistant", "content": "", "tool_calls": [call(1, "y")]},
                        {"role": "tool", "content": "doc2", "tool_call_id": "c1", "name": "search"},
                        {"role": "assistant", "content": "draft"},
                        {"role": "user", "content": "Please continue."},
                        {"role": "assistant", "content": "Final answer: a", "reasoning_content": "done"}]})
    return out


def test_multi_row_records_stay_together_and_are_counted(tmp_path):
    """Exact default: rewritten records become contiguous rows `<id>#row<k>` (also under mixed's
    shuffle), each turn trained once; the trainer sees one trajectory per record. keep_as_rendered
    is one row per record and counts its inexact trainable tokens."""
    import datasets

    from data_prep.schema import trajectory_id
    from sft.data import load_train_data

    src = tmp_path / "rw.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in _rewritten_search_records(6)))
    cfg = {**SMALL, "n": 12, "sources": {"code": [], "search": [f"canonical:{src}"]}, "synthetic": {"n_entities": 40, "search_n": 2}}
    m = build.build_arm(cfg, arm="mixed", seed=1, tokenizer="tiny", out=tmp_path / "exact", progress=False)
    ds = datasets.load_from_disk(str(tmp_path / "exact"))
    ids = ds["id"]
    multi = sorted({trajectory_id(i) for i in ids if "#row" in i})
    assert multi and m["render"]["records_multi_row"] == len(multi) and m["render"]["extra_rows"] == 2 * len(multi)
    assert m["render"]["assistant_turns_as_rendered"] == 0 and m["render"]["trainable_tokens_as_rendered"] == 0
    for rec in multi:  # contiguous, in order
        pos = [k for k, i in enumerate(ids) if trajectory_id(i) == rec]
        assert pos == list(range(pos[0], pos[0] + 3)) and [ids[p] for p in pos] == [f"{rec}#row{j}" for j in range(3)]
    data = load_train_data(tmp_path / "exact", global_batch_size=2, max_tokens_per_micro_batch=4096)
    assert data.n == m["counts"]["kept"] == 12 and data.n_rows == 12 + 2 * len(multi)
    m2 = build.build_arm({**cfg, "history_reasoning": "keep_as_rendered"}, arm="mixed", seed=1, tokenizer="tiny",
                         out=tmp_path / "keep", progress=False)
    assert m2["counts"]["rows"] == 12 and m2["render"]["assistant_turns_as_rendered"] == 3 * len(multi)
    assert 0 < m2["render"]["trainable_tokens_as_rendered"] < m2["tokens"]["trainable_total"]




def test_worker_processes_stop_on_sigterm_whatever_handler_their_parent_has(tmp_path):
    """The build's worker processes are stopped by the pool's SIGTERM (Processor.close: `terminate()`, as soon as
    the arm's quota is met), so they must not keep a Python SIGTERM handler of the process that forks them
    (launch.completion's forwarding, a trainer's preemption flag): with one, a worker waiting for work runs the
    handler, goes on waiting, and close() waits for it forever. Seen so on main: `make test` hung in
    test_determinism's close() after an in-process test had left launch.completion's handler installed.
    A child process reports each worker's SIGTERM disposition, then closes its pool; a close that does not end
    is stopped here (the disposition, not the hang, is what fails)."""
    import os
    import signal
    import subprocess
    import sys

    script = (
        "import signal\n"
        "from common.tiny import tiny_tokenizer\n"
        "from data_prep import build, worker\n"
        "from data_prep.config import resolve\n"
        "def default(_):\n"
        "    return signal.getsignal(signal.SIGTERM) == signal.SIG_DFL\n"
        "signal.signal(signal.SIGTERM, lambda *a: None)\n"
        f"p = worker.Processor(tiny_tokenizer(), build.renderer_kwargs(resolve({SMALL!r})), 2)\n"
        "print(p.pool.map(default, range(4), chunksize=1), flush=True)\n"
        "p.close()\n")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    first = proc.stdout.readline().strip()
    try:
        rc = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        rc = proc.wait()
    assert first == str([True] * 4), first
    assert rc == 0


def test_a_record_id_that_reads_as_a_row_id_is_rejected(tmp_path):
    """A source id `<x>#row<k>` reads as row k of record x (schema.trajectory_id): four such records were kept, yet
    the trainer saw one trajectory of four rows and a held-out set recorded one digest (three held-out records
    excluded from no arm). Such a record is rejected, with its reason; a `#row` not followed by digits is an id."""
    from sft.data import load_train_data

    rows = [{"id": f"q7#row{k}" if k < 4 else f"q7#rowx{k}", "question": f"question number {k} about rivers", "golden_answers": ["a"],
             "response": f"<think>look {k}</think><search> q{k} </search>\n\n<information>Doc 1(Title: T) x</information>"
                         f"\n\n<answer> a{k} </answer>"} for k in range(6)]
    src = tmp_path / "r1.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = {"sources": {"search": [f"search-r1:{src}"]}, "n": 2}
    m = build.build_arm(cfg, arm="search", seed=0, tokenizer="tiny", out=tmp_path / "arm", progress=False)
    assert m["counts"]["kept"] == 2 and m["rejected_by_reason"] == {"row_id": 4}
    assert load_train_data(tmp_path / "arm", global_batch_size=1, max_tokens_per_micro_batch=4096).n == 2
    rej = [json.loads(x) for x in (tmp_path / "arm" / "rejected.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rej] == [f"q7#row{k}" for k in range(4)] and "#row" in rej[0]["detail"]
    h = build.build_heldout(cfg, n=2, domains=["search"], seed=0, tokenizer="tiny", out=tmp_path / "held", progress=False)
    assert len(h["digests"]["search"]) == h["counts"]["kept"] == 2


def test_one_file_of_both_domains_listed_under_both_is_read_once_per_record(tmp_path):
    """A canonical file holding code and search records, listed under sources.code and sources.search of a mixed arm:
    each record was read in both domains' passes, so the manifest said read 16, rejected 8 (`wrong_domain`) of 8
    records, all 8 of them kept, and rejected.jsonl named every kept record. Each record is counted once, in the
    pass of its own domain; a record of neither domain and an unreadable row once, in the first listing's."""
    import datasets

    build.build_arm({**SMALL, "n": 8}, arm="mixed", seed=1, tokenizer="tiny", out=tmp_path / "syn", progress=False)
    recs = [json.loads(m) for m in datasets.load_from_disk(str(tmp_path / "syn"))["messages"]]
    src = tmp_path / "both.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in recs) + "{not json\n")
    cfg = {"sources": {"code": [f"canonical:{src}"], "search": [f"canonical:{src}"]}, "n": 8}
    m = build.build_arm(cfg, arm="mixed", seed=0, tokenizer="tiny", out=tmp_path / "arm", progress=False)
    assert m["counts"] | {"kept_by_source": None} == {"read": 9, "kept": 8, "rejected": 1, "not_selected": 0, "rows": 8,
                                                       "kept_by_source": None, "rows_by_domain": {"code": 4, "search": 4}}
    assert [(s["domain"], s["read"], s["kept"], s["rejected"]) for s in m["sources"]] == [("code", 5, 4, 1), ("search", 4, 4, 0)]
    rej = [json.loads(x) for x in (tmp_path / "arm" / "rejected.jsonl").read_text().splitlines()]
    assert [r["reason"] for r in rej] == ["malformed_json"]
    # an arm of one domain reads only that side's listing: the other domain's records are wrong_domain there, once
    m1 = build.build_arm({**cfg, "n": 4}, arm="r2e", seed=0, tokenizer="tiny", out=tmp_path / "r2e", progress=False)
    assert m1["counts"]["read"] == 9 and m1["rejected_by_reason"] == {"malformed_json": 1, "wrong_domain": 4}


def test_heldout_strict_fails_on_a_rejected_record(tmp_path, capsys):
    """`data-prep heldout strict=true` wrote a COMPLETE held-out set and exited 0 with 7 of 8 records rejected (the arm's
    command exits 1 there): it exits 1 naming the reasons and writes nothing; without strict the set is written."""
    p = write_bad_file(tmp_path / "bad.jsonl")
    args = ["heldout", "n=1", "domains=[code]", f"sources.code=[r2e-gym:{p}]"]
    rc = cli_main([*args, f"out={tmp_path / 'h'}", "strict=true"])
    err = capsys.readouterr().err
    assert rc == 1 and "strict=true and 7 record(s) were rejected" in err and "no_finish_call" in err
    assert not (tmp_path / "h").exists()
    assert cli_main([*args, f"out={tmp_path / 'h2'}"]) == 0 and (tmp_path / "h2" / "COMPLETE").is_file()


def test_rows_without_ids_in_same_named_files_are_not_duplicates(tmp_path):
    """Rows with no id field are named by position relative to their source (`train.jsonl:1`), so two sources whose
    files share a name (r2e/train.jsonl, swegym/train.jsonl) gave their distinct records one id, and every record of
    the second was rejected as duplicate_id (3 of 6 kept). The second source's colliding ids are told apart by its
    content (`train.jsonl:1@<digest>`); the same content at another path is still a duplicate; ids and the dataset
    do not depend on where the files lie."""
    from data_prep.synthetic import SyntheticConfig, code_rows

    def sources(root):
        specs = []
        for name, seed in (("r2e", 0), ("swegym", 1), ("copy", 0)):
            (root / name).mkdir(parents=True)
            rows = [{"messages": r["messages"]} for r in code_rows(3, seed, SyntheticConfig())]
            (root / name / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            specs.append(f"r2e-gym:{root / name / 'train.jsonl'}")
        return {"sources": {"code": specs}, "n": 6}

    m = build.build_arm(sources(tmp_path / "a"), arm="r2e", seed=0, tokenizer="tiny", out=tmp_path / "arm", progress=False)
    assert m["counts"]["kept"] == 6 and m["rejected_by_reason"] == {"duplicate_id": 3}
    assert [(s["read"], s["kept"], s["rejected"]) for s in m["sources"]] == [(3, 3, 0), (3, 3, 0), (3, 0, 3)]
    import datasets

    ids = datasets.load_from_disk(str(tmp_path / "arm"))["id"]
    assert sorted(i for i in ids if "@" not in i) == ["train.jsonl:1", "train.jsonl:2", "train.jsonl:3"]
    assert sorted(i.split("@")[0] for i in ids if "@" in i) == ["train.jsonl:1", "train.jsonl:2", "train.jsonl:3"]
    moved = build.build_arm(sources(tmp_path / "b" / "elsewhere"), arm="r2e", seed=0, tokenizer="tiny", out=tmp_path / "arm2",
                            progress=False)
    assert moved["fingerprint"] == m["fingerprint"]


def test_heldout_records_are_excluded_whatever_the_arms_reasoning_mode(tmp_path):
    """A held-out set built with data.reasoning=reasoning_content (the default) and an arm of the same sources with
    data.reasoning=content (what a model without a reasoning channel needs, e.g. Llama-3.1's recipe): the thoughts sit in
    `content` instead of `reasoning_content`, so the content digests differed and the arm excluded 0 of the 2 held-out
    records, trained on them, and check_disjoint (what evaluate and `data-prep check-heldout` run) passed it. Records are
    compared with their thoughts and content as one text, wherever the reasoning mode put them."""
    from data_prep import heldout
    from data_prep.synthetic import SyntheticConfig, code_rows, search_rows

    srcs = {}
    for dom, fmt, rows in (("code", "r2e-gym", code_rows(6, 0, SyntheticConfig())),
                           ("search", "openseeker", search_rows(12, 0, SyntheticConfig())[0])):
        (tmp_path / f"{dom}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        srcs[dom] = [f"{fmt}:{tmp_path / f'{dom}.jsonl'}"]
    build.build_heldout({"sources": srcs}, n=2, domains=["code", "search"], seed=5, tokenizer="tiny", out=tmp_path / "held", progress=False)
    held = heldout.load(tmp_path / "held")
    for mode in ("reasoning_content", "content"):
        cfg = {"sources": srcs, "n": 8, "allow_fewer": True, "heldout": str(tmp_path / "held"), "reasoning": mode}
        m = build.build_arm(cfg, arm="mixed", seed=0, tokenizer="tiny", out=tmp_path / mode, progress=False)
        assert (m["heldout"]["excluded"], m["counts"]["kept"], m["rejected_by_reason"]) == (4, 8, {"heldout": 4}), mode
        assert heldout.check_disjoint(held, tmp_path / mode) == 8
        with_held = build.build_arm({**cfg, "heldout": None}, arm="mixed", seed=0, tokenizer="tiny", out=tmp_path / f"{mode}-all",
                                    progress=False)
        assert with_held["counts"]["kept"] == 8
        with pytest.raises(heldout.TrainingDataError, match="the same content"):
            heldout.check_disjoint(held, tmp_path / f"{mode}-all")


def test_the_manifest_names_its_decontamination_files_and_held_out_dir_absolute(tmp_path, monkeypatch):
    """`decontam.files[].path` and `heldout.dir` in a dataset's manifest name what the build read from any working
    directory (seen failing: both as typed, `ev.jsonl` and `h`, relative to the directory data-prep ran in)."""
    monkeypatch.chdir(tmp_path)
    assert cli_main(["heldout", "out=h", "data=synthetic", "n=2", "domains=[search]", "synthetic.n_entities=30"]) == 0
    Path("ev.jsonl").write_text(json.dumps({"id": "q1", "question": "who wrote the rivers of x", "golden_answers": ["a"]}) + "\n")
    assert cli_main(["arm=search", "out=d", "data=synthetic", "n=4", "synthetic.n_entities=30", "heldout=h", "decontam=[ev.jsonl]"]) == 0
    m = json.loads(Path("d/manifest.json").read_text())
    assert m["heldout"]["dir"] == str(tmp_path / "h")
    assert [f["path"] for f in m["decontam"]["files"]] == [str(tmp_path / "ev.jsonl")]
