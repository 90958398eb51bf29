"""Multi-hop QA with the benchmarks' own paragraphs: the original MuSiQue-Ans / 2WikiMultihopQA /
HotpotQA-distractor readers on the real rows in ../shared/benchmarks-context (oracle: the raw JSON
of those files), the context modes `given` (paragraphs in the prompt, no tools) and `item` (search
over the item's own paragraphs), their refusals, identities and the tiny model end to end."""
from __future__ import annotations

import json
import re

import pytest

from common.benchmarks import BenchError, read_bench_file
from evals.backends import Generation
from evals.benches import load_bench
from evals.cli import main as cli_main
from evals.run import evaluate
from evals.tasks import SearchTools, qa_episode
from tests.conftest import ROOT, shared_path

CTX = "benchmarks-context"
FILES = {"musique": "musique/dev_ans_paragraphs_20.jsonl", "2wikimultihopqa": "2wikimultihopqa/dev_context_20.jsonl",
         "hotpotqa": "hotpotqa/dev_distractor_30.jsonl"}


def raw_rows(rel: str) -> list[dict]:
    return [json.loads(line) for line in shared_path(CTX, rel).read_text(encoding="utf-8").splitlines() if line.strip()]


def raw_paragraphs(row: dict) -> list[tuple[str, str]]:
    """(title, text) per paragraph straight from the raw row (the oracle)."""
    if "paragraphs" in row:
        return [(p["title"], p["paragraph_text"]) for p in row["paragraphs"]]
    return [(t, " ".join(s.strip() for s in sents if s.strip())) for t, sents in row["context"]]


VARIANTS = {"musique": "variants/musique_ans_dev_fixture_2.jsonl",
            "2wikimultihopqa": "variants/2wiki_dev_hipporag2_2_reserialized.jsonl"}


@pytest.mark.parametrize("bench,rel", sorted(FILES.items()) + sorted(VARIANTS.items()))
def test_readers_keep_every_paragraph_in_order_and_the_golds(bench, rel):
    rows = raw_rows(rel)
    items = read_bench_file(shared_path(CTX, rel), bench)
    assert [it.id for it in items] == [str(r.get("id", r.get("_id"))) for r in rows]
    for row, it in zip(rows, items):
        assert [(p.title, p.text) for p in it.paragraphs] == raw_paragraphs(row)
        assert it.golden_answers == [row["answer"]] + [a for a in row.get("answer_aliases", []) if a != row["answer"]]
        if "paragraphs" in row:
            assert [p.is_supporting for p in it.paragraphs] == [p["is_supporting"] for p in row["paragraphs"]]
        else:
            titles = {f[0] for f in row["supporting_facts"]}
            assert {p.title for p in it.paragraphs if p.is_supporting} == titles & {t for t, _ in row["context"]}
    if rel in VARIANTS.values():
        return
    if bench == "musique":
        assert all(len(it.paragraphs) == 20 for it in items)
        aliased = next(it for it in items if len(it.golden_answers) > 1)
        assert "Orioles" in aliased.golden_answers
    if bench == "hotpotqa":
        assert sorted(len(it.paragraphs) for it in items)[0] == 2  # the 2-paragraph row is kept as it is
        assert {"yes", "no"} <= {it.golden_answers[0] for it in items}
        raw = shared_path(CTX, rel).read_text(encoding="utf-8")
        assert "\\/" in raw and not any("\\/" in p.text for it in items for p in it.paragraphs)


def test_hub_layout_of_hotpotqa_reads_like_the_original(tmp_path):
    row = raw_rows(FILES["hotpotqa"])[1]
    hub = {"id": row["_id"], "question": row["question"], "answer": row["answer"], "type": row["type"],
           "level": row["level"],
           "supporting_facts": {"title": [f[0] for f in row["supporting_facts"]],
                                "sent_id": [f[1] for f in row["supporting_facts"]]},
           "context": {"title": [c[0] for c in row["context"]], "sentences": [c[1] for c in row["context"]]}}
    (tmp_path / "a.jsonl").write_text(json.dumps(row) + "\n")
    (tmp_path / "b.jsonl").write_text(json.dumps(hub) + "\n")
    assert read_bench_file(tmp_path / "a.jsonl", "hotpotqa") == read_bench_file(tmp_path / "b.jsonl", "hotpotqa")


def test_a_malformed_row_names_file_and_line(tmp_path):
    rows = raw_rows(FILES["musique"])[:3]
    del rows[1]["paragraphs"][4]["paragraph_text"]
    bad = tmp_path / "musique.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(BenchError, match=re.escape(f"{bad}:2: paragraphs[4]")):
        read_bench_file(bad, "musique")
    rows = raw_rows(FILES["2wikimultihopqa"])[:2]
    rows[1]["context"][0] = ["title only"]
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(BenchError, match=re.escape(f"{bad}:2: context[0]")):
        read_bench_file(bad, "2wikimultihopqa")


def test_bench_keys():
    from common.benchmarks import parse_bench_key

    assert parse_bench_key("musique") == ("musique", "open")
    assert parse_bench_key("musique@given") == ("musique", "given")
    with pytest.raises(BenchError, match="MODE one of open, item, given"):
        parse_bench_key("musique@oracle")


def test_open_only_files_are_refused_for_item_and_given(tmp_path):
    root = shared_path(CTX)
    flashrag = tmp_path / "musique"
    flashrag.mkdir()
    (flashrag / "dev.jsonl").write_bytes((root / "variants" / "musique_flashrag_dev_11_transcribed.jsonl").read_bytes())
    for mode in ("given", "item"):
        with pytest.raises(BenchError, match=rf"{flashrag / 'dev.jsonl'}: cannot evaluate in context mode '{mode}'.*"
                                             "only the supporting paragraphs"):
            load_bench(f"musique@{mode}", tmp_path, 4, 42)
    assert len(load_bench("musique", tmp_path, 4, 42)[0]) == 4  # open mode still reads it
    r1 = shared_path("benchmarks", "nq")
    with pytest.raises(BenchError, match=r"cannot evaluate in context mode 'given'.*carry no paragraphs"):
        load_bench("nq@given", r1.parent, 4, 42)


def test_given_puts_exactly_the_items_paragraphs_in_the_first_user_message():
    for bench, rel in FILES.items():
        items = read_bench_file(shared_path(CTX, rel), bench)
        for it, row in zip(items, raw_rows(rel)):
            ep = qa_episode(it, "tool_agent", mode="given")
            assert ep.tools == []
            user = ep.messages[1]["content"]
            assert ep.messages[1]["role"] == "user" and user.endswith(f"\n\nQuestion: {row['question'].strip()}")
            blocks = re.findall(r"Paragraph (\d+): (.*?)\n(.*?)(?=\n\nParagraph \d+: |\n\nQuestion: )", user, re.S)
            assert [(int(i), t, x) for i, t, x in blocks] == [(k, t, x) for k, (t, x) in enumerate(raw_paragraphs(row), 1)]
            assert "search" not in ep.messages[0]["content"]


def test_item_search_holds_only_the_items_paragraphs_and_ranks_the_copied_one_first():
    from evals.retrievers import ItemRetriever

    for bench, rel in FILES.items():
        items = read_bench_file(shared_path(CTX, rel), bench)
        tools = SearchTools(None, 3)
        for it in items:
            retriever = ItemRetriever(it.paragraphs)
            target = next(p for p in it.paragraphs if p.is_supporting and len(p.text.split()) >= 8)
            query = target.text  # copied from a supporting paragraph
            top = retriever.search([query], 3)[0]
            assert top[0]["contents"] == f'"{target.title}"\n{target.text}'
            ep = qa_episode(it, "tool_agent", mode="item")
            [[response]] = tools([(ep, [{"name": "search", "arguments": {"query": query}}])])
            # the response is exactly 3 of the item's own paragraphs, rendered as corpus docs, target first
            pos, shown = 0, []
            for i in range(1, min(3, len(it.paragraphs)) + 1):
                match = [p for p in it.paragraphs if response.startswith(f'Doc {i}(Title: "{p.title}") {p.text}\n', pos)]
                assert match, response[pos:pos + 200]
                shown.append(match[0])
                pos += len(f'Doc {i}(Title: "{match[0].title}") {match[0].text}\n')
            assert pos == len(response) and shown[0] == target
            # a query that matches no paragraph finds none (as Lucene, Search-R1's BM25): no unearned evidence
            assert retriever.search(["zzzq qqzz", "the of"], 3) == [[], []]


class ScriptedSearcher:
    """Turn 1 searches with the question, turn 2 answers with the first gold alias it is told."""

    name = "scripted"

    def __init__(self, tokenizer, answers: dict[str, str]):
        self.tokenizer, self.answers, self.calls = tokenizer, answers, 0

    def encode(self, text):
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def generate(self, prompt_ids, caps):
        self.calls += 1
        out = []
        for ids in prompt_ids:
            prompt = self.tokenizer.decode(ids)
            question = re.findall(r"Question: (.*?)<\|im_end\|>", prompt, re.S) or \
                re.findall(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", prompt, re.S)
            q = question[0].strip()
            if "<tool_response>" in prompt or "Paragraph 1:" in prompt:
                out.append(Generation(f"ok</think>\n\nFinal answer: {self.answers[q]}", "stop", 3))
            else:
                call = json.dumps({"name": "search", "arguments": {"query": q}})
                out.append(Generation(f"ok</think>\n\n<tool_call>\n{call}\n</tool_call>", "stop", 3))
        return out


def test_two_modes_coexist_score_every_alias_and_rerun_evaluates_nothing(tmp_path, tiny_model_dir, tiny_tokenizer):
    rows = raw_rows(FILES["musique"])
    rows[0] = {**rows[0], "answerable": False}  # MuSiQue-Full style: left out, counted
    root = tmp_path / "bench"
    (root / "musique").mkdir(parents=True)
    (root / "musique" / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # answer with the *last* alias, so EM needs every alias
    answers = {r["question"].strip(): ([r["answer"]] + r["answer_aliases"])[-1] for r in rows}
    out = tmp_path / "out"
    cfg = {"ckpt": str(tiny_model_dir), "bench_root": str(root), "n": 0, "out": str(out), "progress": False,
           "max_turns": 3, "max_new_tokens": 8, "max_model_len": 100000}
    summaries = {}
    for mode in ("given", "item"):
        backend = ScriptedSearcher(tiny_tokenizer, answers)
        summaries[mode] = evaluate({**cfg, "benches": [f"musique@{mode}"]}, backend=backend)
    assert {"musique@given", "musique@item"} <= set(summaries["item"])
    for key, calls in (("musique@given", 0), ("musique@item", 1)):
        s = summaries["item"][key]
        assert s["n"] == 19 and s["unanswerable_excluded"] == 1 and s["em"] == 1.0 and s["mean_tool_calls"] == calls
        lines = (out / f"{key}.jsonl").read_text().splitlines()
        assert len(lines) == 19 and rows[0]["id"] not in {json.loads(x)["id"] for x in lines}
    meta = json.loads((out / "meta.json").read_text())
    assert meta["identities"]["musique@given"]["fingerprint"] != meta["identities"]["musique@item"]["fingerprint"]
    assert meta["bench_items"]["musique@item"]["unanswerable_excluded"] == 1
    before = {p.name: p.read_bytes() for p in out.glob("*.jsonl")}
    backend = ScriptedSearcher(tiny_tokenizer, answers)
    again = evaluate({**cfg, "benches": ["musique@given"]}, backend=backend)
    assert backend.calls == 0 and again["musique@given"] == summaries["item"]["musique@given"]
    assert {p.name: p.read_bytes() for p in out.glob("*.jsonl")} == before


def test_modes_in_config(tmp_path):
    from evals.config import resolve

    (tmp_path / "c.jsonl").write_text('{"id": "0", "contents": "t"}\n')
    cfg = resolve({"ckpt": "x", "out": "o", "benches": ["musique@open", "hotpotqa@given", "babyai"],
                   "bench_n": {"hotpotqa@given": 3}, "corpus": str(tmp_path / "c.jsonl")})
    assert list(cfg.benches) == ["musique", "hotpotqa@given", "babyai"]  # musique@open is plain musique
    assert cfg.bench_n == {"hotpotqa@given": 3}
    from common.cli import ConfigError

    with pytest.raises(ConfigError, match=r"^benches \['nq'\]: retriever=bm25 needs corpus=PATH"):   # nq searches; musique@given does not
        resolve({"ckpt": "x", "out": "o", "benches": ["musique@given", "nq"]})
    assert resolve({"ckpt": "x", "out": "o", "benches": ["musique@given", "2wikimultihopqa@item"]})
    with pytest.raises(ConfigError, match="babyai brings its own environment"):
        resolve({"ckpt": "x", "out": "o", "benches": ["babyai@given"]})
    with pytest.raises(ConfigError, match="listed twice"):
        resolve({"ckpt": "x", "out": "o", "benches": ["musique@given", "musique@given"]})


@pytest.mark.parametrize("mode", ["given", "item"])
def test_done_when_tiny_base_on_cpu(tmp_path, mode):
    root = shared_path(CTX)
    out = tmp_path / "out"
    benches = [f"{b}@{mode}" for b in ("musique", "2wikimultihopqa", "hotpotqa")]
    argv = [f"ckpt={ROOT / 'common' / 'tiny_base'}", f"benches=[{','.join(benches)}]", f"bench_root={root}", "n=4", f"out={out}",
            "max_new_tokens=16", "max_turns=2", "max_model_len=8192", "progress=false"]
    assert cli_main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    for key in benches:
        rows = [json.loads(x) for x in (out / f"{key}.jsonl").read_text().splitlines()]
        assert len(rows) == 4 and summary[key]["n"] == 4
        first_user = rows[0]["messages"][1]["content"]
        assert ("Paragraph 1: " in first_user) == (mode == "given")


def test_tables_key_columns_by_bench_and_mode():
    import pandas as pd

    from analysis.collect import COLUMNS, qa_benches
    from analysis.tables import table_columns

    rows = [dict(arm="a", seed=0, step=0, bench=b, metric="em", value=0.5, n=4)
            for b in ("musique@given", "nq", "musique", "musique@item", "hotpotqa@given", "synthqa")]
    qa = qa_benches(pd.DataFrame(rows, columns=COLUMNS))
    assert qa == ["nq", "hotpotqa@given", "musique", "musique@item", "musique@given", "synthqa"]
    cols = table_columns(qa, False, [], "em")
    assert [c.bench for c in cols] == qa  # one column per (bench, mode)
    assert [c.label for c in cols] == ["nq (open)", "hotpotqa (given)", "musique (open)", "musique (item)",
                                       "musique (given)", "synthqa (open)"]
    assert [c.group for c in cols] == ["General QA"] + ["Multi-Hop QA"] * 4 + ["QA"]


def test_profiles_use_given_with_reference_sizes():
    from evals.profiles import load_profile

    rl = load_profile("rl_ood")
    assert rl["evaluate"]["benches"] == ["musique@given", "2wikimultihopqa@given", "search_plan_ood", "babyai"]
    assert rl["reference_sizes"] == {"musique@given": 2417, "2wikimultihopqa@given": 12576, "search_plan_ood": 100,
                                     "babyai": 50}
    mh = load_profile("multihop_qa")
    assert mh["evaluate"]["benches"] == ["hotpotqa@given", "musique@given", "2wikimultihopqa@given"]
    assert mh["reference_sizes"] == {"hotpotqa@given": 7405, "musique@given": 2417, "2wikimultihopqa@given": 12576}
    from evals.benches import HUB_CONTEXT

    assert {b: HUB_CONTEXT[b].rows for b in HUB_CONTEXT} == {"musique": 2417, "2wikimultihopqa": 12576, "hotpotqa": 7405}


def test_grpo_qa_task_takes_the_same_context_modes(tmp_path):
    from rl.envs import environment_for, qa_rows

    path = shared_path(CTX, FILES["musique"])
    items = read_bench_file(path, "musique")
    given = qa_rows(str(path), 0, 3, "given")
    for row, it in zip(given, items):
        assert row["prompt"] == qa_episode(it, "tool_agent", mode="given").messages and "paragraphs" not in row
        assert row["golden_answers"] == it.golden_answers
    assert environment_for("qa", qa_mode="given") is None  # no tools: the paragraphs are in the prompt
    item = qa_rows(str(path), 0, 2, "item")
    assert item[0]["prompt"] == qa_episode(items[0], "tool_agent", mode="item").messages
    env = environment_for("qa", topk=2, qa_mode="item")()
    for row, it in zip(item, items):
        env.reset(**row)
        target = next(p for p in it.paragraphs if p.is_supporting)
        assert env.search(target.text).startswith(f'Doc 1(Title: "{target.title}") {target.text}\n')
        assert env.search(target.text).count("Doc ") >= 2
    with pytest.raises(BenchError, match="only the supporting paragraphs"):
        qa_rows(str(shared_path(CTX, "variants", "musique_flashrag_dev_11_transcribed.jsonl")), 0, 2, "item")
    # a file of unanswerable questions only leaves nothing to train on: named, not a ZeroDivisionError
    unanswerable = tmp_path / "unanswerable.jsonl"
    unanswerable.write_text("".join(json.dumps({**json.loads(line), "answerable": False}) + "\n"
                                    for line in path.read_text(encoding="utf-8").splitlines()[:2]), encoding="utf-8")
    with pytest.raises(BenchError, match=r"unanswerable\.jsonl: no answerable question to train on \(all 2 are answerable: false\)"):
        qa_rows(str(unanswerable), 0, 1)


@pytest.mark.parametrize("mode", ["item", "given"])
def test_grpo_qa_modes_through_trl(tmp_path, monkeypatch, mode):
    """TRL's real rollout loop with a scripted policy: `item` searches the row's own paragraphs
    (no corpus), `given` has no tools and the paragraphs in the prompt; EM against the aliases."""
    from rl import train as rt
    from tests.rl_helpers import _Scripted, call_text
    from tests.test_rl_units import _cfg

    path = shared_path(CTX, FILES["musique"])
    items = {it.question: it for it in read_bench_file(path, "musique")}
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cfg = _cfg(tmp_path, "task=qa", f"grpo.prompts_file={path}", f"grpo.qa_mode={mode}",
               "grpo.completions_per_step=4", "grpo.num_generations=2", "grpo.topk=1", "steps=1")
    tr = rt.Run(cfg).build()
    assert [t.__name__ for t in tr.tools] == (["search"] if mode == "item" else [])

    class Policy(_Scripted):
        def completion(self, text, i, turn):
            it = next(it for q, it in items.items() if q in text)
            support = next(p for p in it.paragraphs if p.is_supporting)
            if mode == "item" and turn == 0:
                return call_text("Look it up.", "search", {"query": support.text})
            answer = it.golden_answers[-1] if i % 2 == 0 else "not this"
            return f"Done.\n</think>\n\nFinal answer: {answer}<|im_end|>"

    batch = rt.rows(cfg, 0, 1)
    tr._generate_single_turn = Policy(tr.processing_class)
    tr.model.train()
    tr._generate_and_score_completions([r for r in batch for _ in range(2)])
    assert [ro["rewards"]["em"] for ro in tr.last_rollouts] == [1.0, 0.0, 1.0, 0.0]
    for ro in tr.last_rollouts:
        it = next(it for q, it in items.items() if any(q in (m.get("content") or "") for m in ro["messages"]))
        tool = [m["content"] for m in ro["messages"] if m["role"] == "tool"]
        if mode == "given":
            assert tool == [] and "Paragraph 20: " in json.dumps(ro["messages"])
        else:
            support = next(p for p in it.paragraphs if p.is_supporting)
            assert len(tool) == 1 and tool[0].startswith(f'Doc 1(Title: "{support.title}") {support.text}\n')
            own = [f'(Title: "{p.title}") {p.text}\n' for p in it.paragraphs]
            assert sum(tool[0].count(o) for o in own) == 1 and tool[0].count("Doc ") == 1
