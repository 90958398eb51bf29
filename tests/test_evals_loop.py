"""evals: the agent loop and evaluate() with a scripted backend (loop + scoring, independent of
model quality), resume after interruption, stop reasons, default out, sample checks."""
from __future__ import annotations

import json
import random
import re

import pytest

from common.cli import ConfigError
from evals.agent import render
from evals.backends import Generation
from evals.benches import load_bench
from evals.errors import IdentityError
from evals.run import evaluate, format_table
from evals.tasks import SearchTools, qa_episode

SYLL = ["qua", "zor", "vex", "lim", "tor", "bex", "nal", "rup", "sid", "mok", "fen", "daw"]


def make_world(root, n=6, seed=0):
    """A tiny wiki-18 style corpus + FlashRAG bench: one made-up country per doc, with its capital."""
    rng = random.Random(seed)
    names = set()
    while len(names) < 2 * n:
        names.add("".join(rng.choice(SYLL) for _ in range(3)).capitalize())
    names = sorted(names)
    countries, capitals = names[:n], names[n:]
    corpus = root / "corpus.jsonl"
    with open(corpus, "w") as f:
        for i, (c, k) in enumerate(zip(countries, capitals)):
            f.write(json.dumps({"id": str(i), "contents": f'"{c}"\n{c} is a country. The capital of {c} is {k}.'}) + "\n")
    (root / "bench" / "synthqa").mkdir(parents=True)
    with open(root / "bench" / "synthqa" / "test.jsonl", "w") as f:
        for i, (c, k) in enumerate(zip(countries, capitals)):
            f.write(json.dumps({"id": f"q{i}", "question": f"What is the capital of {c}?", "golden_answers": [k]}) + "\n")
    return corpus, root / "bench"


class ScriptedBackend:
    """Plays a search agent: turn 1 calls `search` with the question, then answers from the
    retrieved passage. `mode` picks how it answers; `fail_at` raises on that generate call."""

    name = "scripted"

    def __init__(self, tokenizer, mode="final_answer", fail_at=None, always_search=False, bad_first_call=False):
        self.tokenizer, self.mode, self.fail_at = tokenizer, mode, fail_at
        self.always_search, self.bad_first_call = always_search, bad_first_call
        self.generate_calls, self.episodes_generated, self.prompts = 0, 0, []

    def encode(self, text):
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _policy(self, prompt: str) -> str:
        question = re.search(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", prompt, re.S).group(1)
        responses = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", prompt, re.S)
        call = '<tool_call>\n{"name": "search", "arguments": {"query": %s}}\n</tool_call>' % json.dumps(question)
        if self.bad_first_call and not responses:
            return 'I will search.</think>\n\n<tool_call>\n{"name": "search", "arguments": {"query": }\n</tool_call>'
        if self.always_search or not responses or responses[-1].startswith("Error"):
            return "I need to search.</think>\n\n" + call
        m = re.search(r"The capital of \w+ is (\w+)\.", responses[-1])
        answer = m.group(1) if m else "unknown"
        if self.mode == "wrong":
            answer = "Atlantis"
        if self.mode == "answer_tag":
            return f"Found it.</think>\n\n<answer>{answer}</answer>"
        if self.mode == "silent":
            return "Found it.</think>\n\nI think I know."
        return f"Found it.</think>\n\nThe passage says so.\nFinal answer: {answer}"

    def generate(self, prompt_ids, caps):
        self.generate_calls += 1
        if self.fail_at is not None and self.generate_calls >= self.fail_at:
            raise KeyboardInterrupt("simulated interruption")
        out = []
        for ids in prompt_ids:
            prompt = self.tokenizer.decode(ids)
            self.prompts.append(prompt)
            out.append(Generation(self._policy(prompt), "stop", 7))
        self.episodes_generated += len(prompt_ids)
        return out


@pytest.fixture()
def world(tmp_path):
    corpus, bench_root = make_world(tmp_path)
    return {"corpus": str(corpus), "bench_root": str(bench_root), "index_dir": str(tmp_path / "idx"),
            "ckpt": str(tmp_path / "model"), "benches": ["synthqa"], "n": 6, "progress": False}


def _rows(out, bench="synthqa"):
    return [json.loads(line) for line in open(out / f"{bench}.jsonl")]


def test_scripted_correct_scores_one(world, tmp_path, tiny_tokenizer):
    backend = ScriptedBackend(tiny_tokenizer)
    out = tmp_path / "out"
    summary = evaluate({**world, "out": str(out)}, backend=backend)
    s = summary["synthqa"]
    assert (s["em"], s["f1"], s["cover_em"], s["strict_em"]) == (1.0, 1.0, 1.0, 1.0)
    assert s["format_failure_rate"] == 0.0 and s["n"] == 6
    assert s["mean_turns"] == 2.0 and s["mean_tool_calls"] == 1.0
    assert s["stop_reasons"] == {"answer": 6}
    assert backend.generate_calls == 2  # lockstep: one batched call per turn for all 6 episodes
    rows = _rows(out)
    assert sorted(r["id"] for r in rows) == [f"q{i}" for i in range(6)]
    msgs = rows[0]["messages"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "assistant"]
    assert msgs[2]["tool_calls"][0]["function"] == {"name": "search", "arguments": {"query": rows[0]["question"]}}
    assert msgs[2]["reasoning_content"] == "I need to search." and msgs[2]["content"] == ""
    assert msgs[3]["content"].startswith('Doc 1(Title: "') and msgs[3]["tool_call_id"] == msgs[2]["tool_calls"][0]["id"]
    assert rows[0]["extract_rule"] == "final_answer" and rows[0]["metrics"]["em"] == 1.0
    # The second-turn prompt was rendered by the chat template: tools in the system prompt,
    # the call re-rendered, the retrieved docs as a tool response.
    second = backend.prompts[-1]
    assert '<tools>\n{"type": "function", "function": {"name": "search"' in second
    assert '<tool_call>\n{"name": "search", "arguments": {"query": "What is the capital of' in second
    assert "<|im_start|>user\n<tool_response>\nDoc 1(Title: " in second
    assert second.endswith("<|im_start|>assistant\n<think>\n")
    files = json.loads((out / "meta.json").read_text())
    assert files["backend"] == "hf" and files["seed"] == 42 and files["prompt"] == "tool_agent"
    assert files["empty_gold_items"] == {"synthqa": 0} and files["skip_empty_golds"] is False
    ids = json.loads((out / "sampled_ids" / "synthqa.json").read_text())["ids"]
    assert sorted(ids) == sorted(r["id"] for r in rows)
    assert json.loads((out / "summary.json").read_text())["synthqa"]["em"] == 1.0


@pytest.mark.parametrize("mode, em, strict, rule", [
    ("wrong", 0.0, 0.0, "final_answer"),
    ("answer_tag", 1.0, 0.0, "answer_tag"),
    ("silent", 0.0, 0.0, "none"),
])
def test_scripted_other_answers(world, tmp_path, tiny_tokenizer, mode, em, strict, rule):
    summary = evaluate({**world, "out": str(tmp_path / "out"), "n": 3}, backend=ScriptedBackend(tiny_tokenizer, mode))
    s = summary["synthqa"]
    assert (s["em"], s["strict_em"]) == (em, strict)
    assert s["extract_rules"] == {rule: 3}
    assert s["format_failure_rate"] == (1.0 if rule == "none" else 0.0)
    assert s["stop_reasons"] == {("no_answer" if rule == "none" else "answer"): 3}


def test_invalid_tool_call_goes_back_to_the_model(world, tmp_path, tiny_tokenizer):
    out = tmp_path / "out"
    s = evaluate({**world, "out": str(out), "n": 2}, backend=ScriptedBackend(tiny_tokenizer, bad_first_call=True))["synthqa"]
    assert s["em"] == 1.0 and s["mean_tool_errors"] == 1.0 and s["mean_turns"] == 3.0
    msgs = _rows(out)[0]["messages"]
    assert "tool_calls" not in msgs[2] and "<tool_call>" in msgs[2]["content"]  # raw text kept
    assert msgs[3]["role"] == "tool" and msgs[3]["content"].startswith("Error: invalid JSON in <tool_call>")


def test_max_turns_and_context_limit(world, tmp_path, tiny_tokenizer):
    s = evaluate({**world, "out": str(tmp_path / "a"), "n": 2, "max_turns": 3},
                 backend=ScriptedBackend(tiny_tokenizer, always_search=True))["synthqa"]
    assert s["stop_reasons"] == {"max_turns": 2} and s["mean_turns"] == 3.0 and s["mean_tool_calls"] == 2.0
    backend = ScriptedBackend(tiny_tokenizer)
    # Room for the first prompt but not for the second one (it carries the retrieved passages).
    item = load_bench("synthqa", world["bench_root"], 1, 42)[0][0]
    n_first = len(backend.encode(render(tiny_tokenizer, qa_episode(item, "tool_agent").messages, SearchTools.tools)))
    s = evaluate({**world, "out": str(tmp_path / "b"), "n": 1, "max_model_len": n_first + 40}, backend=backend)["synthqa"]
    assert s["stop_reasons"] == {"context_limit": 1} and s["mean_turns"] == 1.0


def test_resume_after_interruption(world, tmp_path, tiny_tokenizer):
    out = tmp_path / "out"
    cfg = {**world, "out": str(out), "batch_size": 2}
    with pytest.raises(KeyboardInterrupt):
        evaluate(cfg, backend=ScriptedBackend(tiny_tokenizer, fail_at=3))  # dies in the 2nd batch
    assert len(_rows(out)) == 2  # the first batch was written; only the batch in flight is lost
    # A torn last line (killed mid-write) is dropped and that example runs again.
    with open(out / "synthqa.jsonl", "a") as f:
        f.write('{"id": "q9", "quest')
    backend = ScriptedBackend(tiny_tokenizer)
    s = evaluate(cfg, backend=backend)["synthqa"]
    assert backend.episodes_generated == 2 * 4  # 4 remaining episodes x 2 turns
    rows = _rows(out)
    assert len(rows) == 6 and len({r["id"] for r in rows}) == 6 and s["em"] == 1.0 and s["n"] == 6
    again = ScriptedBackend(tiny_tokenizer)
    evaluate(cfg, backend=again)
    assert again.generate_calls == 0  # nothing left to do


def test_resume_rejects_a_different_sample(world, tmp_path, tiny_tokenizer):
    out = tmp_path / "out"
    evaluate({**world, "out": str(out), "n": 2}, backend=ScriptedBackend(tiny_tokenizer))
    with pytest.raises(IdentityError, match="bench.n: 2 -> 3"):
        evaluate({**world, "out": str(out), "n": 3}, backend=ScriptedBackend(tiny_tokenizer))
    meta = json.loads((out / "meta.json").read_text())
    del meta["identities"]   # an out dir from before evaluation identity: the sample check still holds
    (out / "meta.json").write_text(json.dumps(meta))
    rows = [{k: v for k, v in r.items() if k != "identity"} for r in _rows(out)]
    (out / "synthqa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(IdentityError, match="rows without an identity digest"):
        evaluate({**world, "out": str(out), "n": 2}, backend=ScriptedBackend(tiny_tokenizer))


# ---------------------------------------------------------------- evaluation identity


def _model_dir(root, content: str):
    """A stand-in checkpoint dir (the scripted backend never reads it): files + SHA256SUMS."""
    from common.io import write_sha256sums

    root.mkdir(parents=True)
    (root / "config.json").write_text(content)
    write_sha256sums(root)
    return str(root)


def test_another_checkpoint_into_the_same_out_is_refused_and_overwrite_keeps_the_old_rows(world, tmp_path, tiny_tokenizer,
                                                                                          monkeypatch):
    out = tmp_path / "out"
    first = _model_dir(tmp_path / "m1", '{"a": 1}')
    evaluate({**world, "ckpt": first, "out": str(out)}, backend=ScriptedBackend(tiny_tokenizer))
    meta = json.loads((out / "meta.json").read_text())
    digest = meta["identities"]["synthqa"]["fingerprint"]
    rows = _rows(out)
    assert len(rows) == 6 and {r["identity"] for r in rows} == {digest}, "every row carries its identity digest"
    assert meta["identities"]["synthqa"]["ckpt_path"] == first
    old_bytes = (out / "synthqa.jsonl").read_bytes()

    second = _model_dir(tmp_path / "m2", '{"a": 2}')
    backend = ScriptedBackend(tiny_tokenizer, "wrong")
    with pytest.raises(IdentityError, match=r"checkpoint\.digest: '[0-9a-f]{64}' -> '[0-9a-f]{64}'") as err:
        evaluate({**world, "ckpt": second, "out": str(out)}, backend=backend)
    assert "overwrite=true" in str(err.value) and backend.generate_calls == 0
    import evals.backends

    monkeypatch.setattr(evals.backends, "make_backend", lambda cfg: pytest.fail("model loaded before the refusal"))
    with pytest.raises(IdentityError):
        evaluate({**world, "ckpt": second, "out": str(out)})
    assert (out / "synthqa.jsonl").read_bytes() == old_bytes
    assert json.loads((out / "summary.json").read_text())["synthqa"]["em"] == 1.0

    s = evaluate({**world, "ckpt": second, "out": str(out), "overwrite": True}, backend=backend)["synthqa"]
    aside = list(out.glob("synthqa.jsonl.replaced-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == old_bytes, "the old rows are kept aside, not deleted"
    assert list((out / "sampled_ids").glob("synthqa.json.replaced-*"))
    new_digest = json.loads((out / "meta.json").read_text())["identities"]["synthqa"]["fingerprint"]
    assert new_digest != digest and {r["identity"] for r in _rows(out)} == {new_digest} and len(_rows(out)) == 6
    assert s["em"] == 0.0 and json.loads((out / "summary.json").read_text())["synthqa"]["em"] == 0.0


def test_identity_keys_prompt_vs_operational_and_a_moved_checkpoint(world, tmp_path, tiny_tokenizer, monkeypatch):
    import shutil

    out = tmp_path / "out"
    ckpt = _model_dir(tmp_path / "runs" / "m", '{"a": 1}')
    evaluate({**world, "ckpt": ckpt, "out": str(out)}, backend=ScriptedBackend(tiny_tokenizer))
    with pytest.raises(IdentityError, match="evaluate.prompt: 'tool_agent' -> 'anchor_nudge'"):
        evaluate({**world, "ckpt": ckpt, "out": str(out), "prompt": "anchor_nudge"}, backend=ScriptedBackend(tiny_tokenizer))
    moved = tmp_path / "moved" / "m"
    shutil.copytree(ckpt, moved)   # a moved runs tree: same content, another path
    again = ScriptedBackend(tiny_tokenizer)
    evaluate({**world, "ckpt": str(moved), "out": str(out), "batch_size": 2, "micro_batch": 1}, backend=again)
    assert again.generate_calls == 0, "same identity: nothing re-evaluated"
    # rows an older evaluation code scored (another EVAL_SEMANTICS, or none recorded) are refused, not resumed or mixed
    import types

    import evals.identity
    from common import fingerprint

    def older(version):   # bench_identity as the code of that version recorded it
        return lambda body, exclude: fingerprint.identity({**{k: v for k, v in body.items() if k != "eval_semantics"},
                                                           **({"eval_semantics": version} if version else {})}, exclude)
    for version, shown in ((1, "1"), (None, "'<absent>'")):
        with monkeypatch.context() as m:
            m.setattr(evals.identity, "fingerprint", types.SimpleNamespace(identity=older(version)))
            evaluate({**world, "ckpt": ckpt, "out": str(tmp_path / f"old{version}")}, backend=ScriptedBackend(tiny_tokenizer))
        with pytest.raises(IdentityError, match=rf"eval_semantics: {shown} -> {evals.identity.EVAL_SEMANTICS}\n.*the evaluation "
                           r"code changed what a config's rows are \(evals.identity.EVAL_SEMANTICS\)"):
            evaluate({**world, "ckpt": ckpt, "out": str(tmp_path / f"old{version}")}, backend=ScriptedBackend(tiny_tokenizer))


def test_summary_is_recomputed_from_the_rows(world, tmp_path, tiny_tokenizer):
    """summary.json is never carried over: this call's benches and the out dir's other complete
    benches are summarized from their rows; a bench with no rows is not reported."""
    import shutil
    from pathlib import Path

    shutil.copytree(Path(world["bench_root"]) / "synthqa", Path(world["bench_root"]) / "synthqb")
    out = tmp_path / "out"
    evaluate({**world, "out": str(out), "n": 3, "benches": ["synthqa", "synthqb"]}, backend=ScriptedBackend(tiny_tokenizer))
    summary = json.loads((out / "summary.json").read_text())
    summary["synthqa"]["em"] = summary["synthqb"]["em"] = 0.123
    summary["ghost"] = {"em": 1.0, "n": 3}
    (out / "summary.json").write_text(json.dumps(summary))
    got = evaluate({**world, "out": str(out), "n": 3}, backend=ScriptedBackend(tiny_tokenizer))
    assert got["synthqa"]["em"] == 1.0 and got["synthqb"]["em"] == 1.0 and got["synthqb"]["n"] == 3
    assert "ghost" not in got and json.loads((out / "summary.json").read_text()) == got
    # An out dir from before evaluation identity (rows without digests, no identities in meta.json):
    # its complete benches are still summarized from their rows, not dropped.
    meta = json.loads((out / "meta.json").read_text())
    del meta["identities"]["synthqb"]
    (out / "meta.json").write_text(json.dumps(meta))
    rows = [{k: v for k, v in r.items() if k != "identity"} for r in _rows(out, "synthqb")]
    (out / "synthqb.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = evaluate({**world, "out": str(out), "n": 3}, backend=ScriptedBackend(tiny_tokenizer))
    assert got["synthqb"]["em"] == 1.0 and got["synthqb"]["n"] == 3


def test_a_bench_another_checkpoint_left_in_out_is_not_reported_as_this_ones(world, tmp_path, tiny_tokenizer, monkeypatch):
    """out= given twice, model A on synthqa then model B on synthqb: B's call returns, prints and logs (wandb) B's
    bench only (seen: A's synthqa in B's table and B's wandb row), saying what else out holds; summary.json keeps
    both, each labelled by its identity in meta.json."""
    import shutil
    from pathlib import Path

    import evals.wandb_log

    shutil.copytree(Path(world["bench_root"]) / "synthqa", Path(world["bench_root"]) / "synthqb")
    models = {}
    for name in ("A", "B"):
        (d := tmp_path / f"model{name}").mkdir()
        (d / "config.json").write_text(json.dumps({"model": name}))
        models[name] = str(d)
    logged = []
    monkeypatch.setattr(evals.wandb_log, "log_summary", lambda cfg, summary: logged.append(sorted(summary)))
    out = tmp_path / "out"
    first = evaluate({**world, "ckpt": models["A"], "out": str(out), "n": 3}, backend=ScriptedBackend(tiny_tokenizer))
    got = evaluate({**world, "ckpt": models["B"], "out": str(out), "n": 3, "benches": ["synthqb"]},
                   backend=ScriptedBackend(tiny_tokenizer))
    assert sorted(got) == ["synthqb"] and logged == [["synthqa"], ["synthqb"]]
    assert "synthqa" not in format_table(got)
    held = json.loads((out / "summary.json").read_text())
    assert held == {"synthqa": first["synthqa"], "synthqb": got["synthqb"]}
    meta = json.loads((out / "meta.json").read_text())
    assert {b: i["ckpt_path"] for b, i in meta["identities"].items()} == {"synthqa": models["A"], "synthqb": models["B"]}
    # the same checkpoint again: its kept bench is its own, returned as before
    again = evaluate({**world, "ckpt": models["A"], "out": str(out), "n": 3}, backend=ScriptedBackend(tiny_tokenizer))
    assert sorted(again) == ["synthqa"] and again["synthqa"] == first["synthqa"]


def test_default_out_inside_a_run(world, tmp_path, tiny_tokenizer):
    ckpt = tmp_path / "runs" / "search" / "seed0" / "checkpoints" / "step-000050"
    evaluate({**world, "ckpt": str(ckpt), "n": 1}, backend=ScriptedBackend(tiny_tokenizer))
    assert (tmp_path / "runs" / "search" / "seed0" / "eval" / "step-000050" / "summary.json").is_file()
    with pytest.raises(ConfigError, match="pass out=DIR"):
        evaluate({**world, "n": 1}, backend=ScriptedBackend(tiny_tokenizer))


def test_config_errors(world):
    with pytest.raises(ConfigError):
        evaluate({**world, "out": "x", "promt": "tool_agent"})
    with pytest.raises(ConfigError, match="prompt="):
        evaluate({**world, "out": "x", "prompt": "chatty"})
    with pytest.raises(ConfigError, match="corpus=PATH"):
        evaluate({**world, "out": "x", "corpus": None})


class LlamaScripted(ScriptedBackend):
    """The same agent speaking Llama-3.1's JSON tool-call format."""

    def _policy(self, prompt: str) -> str:
        responses = re.findall(r"<\|start_header_id\|>ipython<\|end_header_id\|>\n\n(.*?)<\|eot_id\|>", prompt, re.S)
        if not responses:
            q = re.findall(r"What is the capital of \w+\?", prompt)[-1]
            return '<|python_tag|>{"name": "search", "parameters": {"query": %s}}' % json.dumps(q)
        m = re.search(r"The capital of \w+ is (\w+)\.", responses[-1])
        return f"Final answer: {m.group(1) if m else 'unknown'}"


def test_llama3_style_through_the_loop(world, tmp_path, tiny_tokenizer):
    import copy

    from tests.conftest import shared_path

    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = shared_path("fixtures", "chat_templates", "llama3_1_8b_instruct.jinja").read_text()
    out = tmp_path / "out"
    s = evaluate({**world, "out": str(out), "n": 3}, backend=LlamaScripted(tok))["synthqa"]
    assert s["em"] == 1.0 and s["mean_tool_calls"] == 1.0 and s["mean_tool_errors"] == 0.0
    assert json.loads((out / "meta.json").read_text())["tool_style"] == "llama3"
    msgs = _rows(out)[0]["messages"]
    assert msgs[2]["tool_calls"][0]["function"]["name"] == "search" and msgs[2]["content"] == ""


# ---------------------------------------------------------------- a context window too small for the prompt


def test_a_bench_whose_every_prompt_is_too_long_is_not_measured_not_scored_zero(world, tmp_path, tiny_tokenizer):
    """max_model_len below every item's first prompt: no item generates a token. Its means are null with a reason
    naming max_model_len and the longest prompt (before: EM 0.0, read downstream as the checkpoint's score), the
    rows say which prompt did not fit, meta.json and the console count the items."""
    backend = ScriptedBackend(tiny_tokenizer)
    out = tmp_path / "out"
    s = evaluate({**world, "out": str(out), "n": 3, "max_model_len": 64}, backend=backend)["synthqa"]
    assert backend.generate_calls == 0
    assert s["em"] is None and s["f1"] is None and s["format_failure_rate"] is None and s["n"] == 3
    longest = max(r["refused_prompt"]["tokens"] for r in _rows(out))
    assert longest > 64 and all(r["refused_prompt"]["max_model_len"] == 64 for r in _rows(out))
    assert s["prompt_too_long"] == {"items": 3, "longest_prompt_tokens": longest, "max_model_len": 64}
    assert "not measured" in s["null_reason"] and f"{longest} tokens" in s["null_reason"], s["null_reason"]
    assert "max_model_len=64" in s["null_reason"]
    assert json.loads((out / "meta.json").read_text())["prompt_too_long_items"] == {"synthqa": 3}
    line = next(line for line in format_table({"synthqa": s}).splitlines() if line.startswith("synthqa"))
    assert "no score: not measured" in line and "0.0" not in line


def test_items_whose_first_prompt_is_too_long_are_counted(world, tmp_path, tiny_tokenizer):
    """Some items' first prompt does not fit: they are scored 0 as before (the sample stays the sample), and the
    summary, meta.json and the console table say how many of them never generated a token."""
    from pathlib import Path

    bench = Path(world["bench_root"]) / "synthqa" / "test.jsonl"
    with open(bench, "a") as f:
        f.write(json.dumps({"id": "long", "question": "What is the capital of " + "Vexlim " * 400 + "?",
                            "golden_answers": ["x"]}) + "\n")
    backend = ScriptedBackend(tiny_tokenizer)
    item = next(it for it in load_bench("synthqa", world["bench_root"], 7, 42)[0] if it.id == "long")
    n_long = len(backend.encode(render(tiny_tokenizer, qa_episode(item, "tool_agent").messages, SearchTools.tools)))
    out = tmp_path / "out"
    s = evaluate({**world, "out": str(out), "n": 7, "max_model_len": n_long - 1}, backend=backend)["synthqa"]
    assert s["n"] == 7 and s["em"] == pytest.approx(6 / 7)
    assert s["prompt_too_long"] == {"items": 1, "longest_prompt_tokens": n_long, "max_model_len": n_long - 1}
    assert "null_reason" not in s
    assert json.loads((out / "meta.json").read_text())["prompt_too_long_items"] == {"synthqa": 1}
    assert f"1 of 7 items never generated a token: a first prompt of up to {n_long} tokens" in format_table({"synthqa": s})
    # a bench where every item generated carries no such field
    s = evaluate({**world, "out": str(tmp_path / "fine"), "n": 3}, backend=ScriptedBackend(tiny_tokenizer))["synthqa"]
    assert "prompt_too_long" not in s
