"""analysis.html without a browser: escaping (the inline index, the shards, the static part), sharding (one list
shard per eval dir × bench, transcripts in CHUNK-row chunks, stale shards removed), the transcripts' shape,
and the paired counts the page computes from the list shards against the report's paired ΔEM."""
from __future__ import annotations

import html
import json
import re

import pytest
from report_html_rows import BENCHES, PAYLOAD, XSS_ID, babyai_row, qa_row, rows_of, write_eval_dir, write_study
from test_analysis_helpers import make_run

from analysis.html import CHUNK, DATA_DIR, js_json, transcript, write_shards
from common.io import write_json


def shard(path) -> object:
    text = path.read_text(encoding="utf-8")
    m = re.fullmatch(r"window\.dtsftShard\((\"[^\"]+\"),(.*)\);\n", text, re.S)
    assert m, text[:200]
    return json.loads(m.group(2))


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    from launch.analyze import run_analysis

    root = tmp_path_factory.mktemp("html_unit")
    write_study(root / "runs")
    write_json(root / "runs" / "r2e" / "seed0" / "manifest.json", {"git": {"commit": PAYLOAD, "dirty": False}})
    ckpt = root / "runs" / "search" / "seed0" / "checkpoints" / "step-000020"   # a checkpoint not evaluated: missing points
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text("{}")
    # two seeds whose final checkpoints differ (20, 10), the 20 with nq only: the paired table's final row is
    # seed0@20 + seed1@10, a gap for the benches seed0@20 lacks (not seed0's last step that has them)
    for seed, steps in ((0, [10, 20]), (1, [10])):
        run = make_run(root / "runs", "two", seed, steps)
        for s in steps:
            write_eval_dir(run / "eval" / f"step-{s:06d}", "two", s + seed)
    last = root / "runs" / "two" / "seed0" / "eval" / "step-000020"
    for bench in ("search_plan_ood", "babyai"):
        (last / f"{bench}.jsonl").unlink()
    summary = json.loads((last / "summary.json").read_text())
    write_json(last / "summary.json", {"nq": summary["nq"]})
    res = run_analysis({"runs_root": str(root / "runs"), "out": str(root / "reports"), "benches": BENCHES,
                        "evaluate": False, "wandb": False})
    return root, res


def index_of(page: str) -> dict:
    m = re.search(r'<script id="dtsft-index" type="application/json">(.*?)</script>', page, re.S)
    return json.loads(m.group(1))


def test_js_json_cannot_close_a_script_and_round_trips():
    value = {"t": "</script><script>alert(1)</script> & <!-- \u2028\u2029", "n": [1, 2.5, None]}
    text = js_json(value)
    assert not set("<>&") & set(text) and "\u2028" not in text and "\u2029" not in text
    assert json.loads(text) == value


def test_page_and_shards_hold_the_payload_only_as_data(study):
    root, res = study
    page = res.html.read_text(encoding="utf-8")
    assert res.html == root / "reports" / "report.html"
    assert "window.__pwned" not in page.replace("&lt;script&gt;window.__pwned=1&lt;/script&gt;", "").replace(
        "onerror=&quot;window.__pwned=1&quot;", "")   # in provenance, escaped; nowhere else
    assert "<code>&lt;script&gt;window.__pwned=1&lt;/script&gt;&lt;img src=x onerror=&quot;window.__pwned=1&quot;&gt;</code>" in page
    assert "innerHTML" not in page.replace("never innerHTML", "")
    assert 'src="http' not in page and "fetch(" not in page and "XMLHttpRequest" not in page
    data = root / "reports" / DATA_DIR
    for f in data.iterdir():
        assert "<" not in f.read_text(encoding="utf-8"), f
    assert len(re.findall(r'<img alt="[^"]+" src="data:image/png;base64,', page)) == len(res.figures)
    for name in ("main_em", "main_f1", "paired_em", "paired_f1", "prepost"):
        assert f'id="table-{name}"' in page
    assert len(res.missing) == 5 and f"Missing points ({len(res.missing)})" in page
    assert all(f"<li>{html.escape(m.line())}</li>" in page for m in res.missing)


def test_one_list_shard_per_eval_dir_and_bench_with_the_rows_own_values(study):
    root, res = study
    index = index_of(res.html.read_text(encoding="utf-8"))
    entries = index["entries"]
    assert [(e["run"], e["step"]) for e in entries[:13:3]] == [("anchor", 0), ("r2e/seed0", 10), ("r2e/seed0", 20),
                                                              ("search/seed0", 10), ("two/seed0", 10)]
    assert [e["bench"] for e in entries] == BENCHES * 5 + ["nq"] + BENCHES and index["benches"] == BENCHES
    data = root / "reports" / DATA_DIR
    assert len(list(data.glob("e*_t*.js"))) == len(entries) and len(list(data.glob("e*.js"))) == 2 * len(entries)
    e = next(e for e in entries if (e["run"], e["step"], e["bench"]) == ("r2e/seed0", 20, "nq"))
    rows = rows_of(root / "runs" / "r2e" / "seed0" / "eval" / "step-000020", "nq")
    items = shard(data / f"{e['key']}.js")
    assert [i["id"] for i in items] == [r["id"] for r in rows] and e["n"] == len(rows)
    assert [i["m"] for i in items] == [r["metrics"] for r in rows]
    assert [i["ok"] for i in items] == [int(r["metrics"]["em"]) for r in rows]
    full = shard(data / f"{e['key']}_t0.js")
    xss = next(t for t in full if t["id"] == XSS_ID)
    assert PAYLOAD in xss["messages"][-1]["content"] and xss["golds"] == ["answer 3"]


def test_paired_counts_equal_the_reports_paired_delta(study):
    """(A-only − B-only)/n over the list shards, as the page counts it, is the paired ΔEM of the report's table
    (one seed: the arm's final checkpoint vs the anchor over the same items)."""
    root, res = study
    index = index_of(res.html.read_text(encoding="utf-8"))
    data = root / "reports" / DATA_DIR
    by = {(e["run"], e["step"], e["bench"]): e["key"] for e in index["entries"]}
    by_key = {e["key"]: (e["run"], e["step"]) for e in index["entries"]}
    a = {i["id"]: i["ok"] for i in shard(data / f"{by[('r2e/seed0', 20, 'nq')]}.js")}
    b = {i["id"]: i["ok"] for i in shard(data / f"{by[('anchor', 0, 'nq')]}.js")}
    a_only = sum(a[k] == 1 and b[k] == 0 for k in a)
    b_only = sum(a[k] == 0 and b[k] == 1 for k in a)
    assert a_only and b_only
    delta = (a_only - b_only) / len(a)
    cells = dict(res.tables["paired_em"].rows)["r2e"]
    assert cells[0].startswith(f"{delta:+.3f} ["), cells
    # a two-seed arm's seed mean at "final": each seed's final checkpoint as the table takes it (seed0@20, seed1@10),
    # per item the seeds' EM averaged; where the table has a gap (seed0@20 has no babyai), the page has its reason
    means, cells = index["means"], dict(zip([c.label for c in res.tables["paired_em"].columns], dict(res.tables["paired_em"].rows)["two"]))
    assert set(means["nq"]) == {"two"} and [by_key[k] for k in means["nq"]["two"]["keys"]] == [("two/seed0", 20), ("two/seed1", 10)]
    per_seed = [{i["id"]: i["ok"] for i in shard(data / f"{k}.js")} for k in means["nq"]["two"]["keys"]]
    delta = sum(sum(s[k] for s in per_seed) / 2 - b[k] for k in b) / len(b)
    assert cells["nq (open)"].startswith(f"{delta:+.3f} ["), cells
    for bench in ("babyai", "search_plan_ood"):
        why = "not evaluated at two/seed0/step-000020"
        assert means[bench]["two"] == {"seeds": [0, 1], "why": why} and cells[next(c for c in cells if c.startswith(bench))] == f"– ({why})"


def test_transcripts_chunked_and_stale_shards_removed(tmp_path):
    d = tmp_path / "eval"
    write_eval_dir(d, "r2e", 10, n=2 * CHUNK + 7)
    data = tmp_path / "out" / DATA_DIR
    data.mkdir(parents=True)
    (data / "e99.js").write_text("stale")
    (data / "mine.txt").write_text("mine")   # not a shard: the user's, kept aside with the dir it was in
    problems: list[str] = []
    with (d / "nq.jsonl").open("a") as f:
        f.write("{not json\n")
    entries = write_shards(data, [("r2e", 0, 10, d)], ["nq", "babyai", "musique"], problems)
    assert [(e["bench"], e["n"], e["chunks"]) for e in entries] == [("nq", 2 * CHUNK + 7, 3), ("babyai", 2 * CHUNK + 7, 3)]
    assert not (data / "e99.js").exists() and not (data / "mine.txt").exists()
    assert [p.read_text() for p in data.parent.glob("report_data.replaced-*/mine.txt")] == ["mine"]
    write_shards(data, [("r2e", 0, 10, d)], ["nq"], [])   # shards only: this writer's own, replaced
    assert len(list(data.parent.iterdir())) == 2 and not (data / "e1.js").exists()
    assert [len(shard(data / f"e0_t{c}.js")) for c in range(3)] == [CHUNK, CHUNK, 7]
    assert [i["c"] for i in shard(data / "e0.js")][CHUNK - 1:CHUNK + 1] == [0, 1]
    assert len(problems) == 1 and "nq.jsonl" in problems[0] and "not shown in report.html" in problems[0]


def test_transcript_shapes():
    qa = transcript("nq", qa_row("r2e", 10, 1))
    assert [m["role"] for m in qa["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert qa["messages"][2]["calls"] == [{"name": "search", "args": json.dumps({"query": "book 1 author"}, indent=1)}]
    assert qa["messages"][2]["reasoning"] == "I should search for book 1." and qa["messages"][3]["name"] == "search"
    game = transcript("babyai", babyai_row("r2e", 10, 2))
    roles = [m["role"] for m in game["messages"]]
    assert roles == ["user", "user", "assistant", "env", "user", "assistant", "env"]
    assert game["messages"][2]["reasoning"] == "<think>step 0</think>turn left"
    assert game["messages"][5]["calls"] == [{"name": "action", "args": "go forward"}]
    assert game["answer"] == "turn left go forward" and game["golds"] == ["goal: go to the red ball (2)"]
