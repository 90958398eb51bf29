"""evals: metrics (hand-computed), the extractor cascade and the tool-call parsing table."""
from __future__ import annotations

import pytest

from evals.extract import extract_answer, strict_answer
from evals.metrics import cover_em, exact_match, f1, normalize_answer, unweighted_mean
from evals.toolcalls import detect_style, parse_tool_calls, strip_tool_calls


# ---- metrics ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text, norm", [
    ("  The  Beatles'  ", "beatles"),
    ("U.S.A.", "usa"),
    ("An apple, a day", "apple day"),
    ("Wilhelm Conrad Röntgen", "wilhelm conrad röntgen"),  # non-ASCII letters are kept
    ("theatre", "theatre"),                                # articles only as whole words
    ("rock–and–roll", "rock–and–roll"),                    # en dash is not ASCII punctuation
])
def test_normalize(text, norm):
    assert normalize_answer(text) == norm


def test_exact_match_cases():
    assert exact_match("The Eiffel Tower!", ["eiffel tower"]) == 1.0
    assert exact_match("Paris, France", ["Paris"]) == 0.0
    assert exact_match("Sam Clemens", ["Mark Twain", "Sam Clemens"]) == 1.0  # max over aliases
    assert exact_match("sam clemens.", "Sam Clemens") == 1.0                # a bare string gold
    assert exact_match(None, ["x"]) == 0.0
    assert exact_match("", [""]) == 1.0


def test_cover_em_cases():
    assert cover_em("Paris, France", ["Paris"]) == 1.0
    assert cover_em("It was the Eiffel Tower.", ["Eiffel tower", "x"]) == 1.0
    assert cover_em("Paris", ["Paris, France"]) == 0.0
    assert cover_em(None, ["Paris"]) == 0.0


def test_f1_cases():
    # pred tokens {paris, france}, gold {paris}: P=1/2, R=1 -> 2/3
    assert f1("Paris, France", ["Paris"]) == pytest.approx(2 / 3)
    # repeated tokens count with multiplicity: common {red:1, blue:1}; P=R=2/3
    assert f1("red red blue", ["red blue green"]) == pytest.approx(2 / 3)
    assert f1("new york city", ["york", "New York City"]) == 1.0
    assert f1("the cat", ["a dog"]) == 0.0
    assert f1(None, ["x"]) == 0.0


def test_f1_yes_no_rule():
    assert f1("yes", ["no"]) == 0.0
    assert f1("yes it is", ["yes"]) == 0.0   # gold is special and differs -> 0, not 2/4
    assert f1("no", ["no answer"]) == 0.0    # "no" vs "no answer": special mismatch
    assert f1("Yes.", ["yes"]) == 1.0
    assert f1("noanswer", ["noanswer"]) == 1.0


def test_unweighted_mean():
    s = {"a": {"em": 0.2}, "b": {"em": 0.6}}
    assert unweighted_mean(s, ["a", "b"], "em") == pytest.approx(0.4)
    assert unweighted_mean(s, ["a", "b", "c"], "em") is None


# ---- answer extraction -----------------------------------------------------------------------

@pytest.mark.parametrize("text, answer, rule", [
    ("reasoning\nFinal answer: Paris\n", "Paris", "final_answer"),
    ("Final answer: A\nthen\nFinal Answer: B", "B", "final_answer"),            # last occurrence
    ("Final answer: Paris. More text\nnext line", "Paris. More text", "final_answer"),
    ("<answer>A</answer>\nFinal answer: B", "B", "final_answer"),              # rule order wins
    ("Final answer:   \n<answer> Rome </answer>", "Rome", "answer_tag"),       # empty -> next rule
    ("<answer> A </answer> x <answer>B</answer>", "B", "answer_tag"),
    ("<answer>A</answer> and <answer> C", "A", "answer_tag"),                   # closed before unclosed
    ("so <answer> Lyon\n", "Lyon", "answer_tag_unclosed"),
    ("x = \\boxed{\\frac{1}{2}} done", "\\frac{1}{2}", "boxed"),
    ("\\boxed{unbalanced", None, "none"),
    ("so \\boxed{\\text{Eiffel Tower}}", "Eiffel Tower", "boxed"),                # LaTeX text wrapper dropped
    ("Final answer: $\\boxed{\\textbf{Paris}}$", "Paris", "final_answer"),
    ("no answer here", None, "none"),
    # the answer ends where call or answer markup starts on its line (rl reads content without it)
    ('Final answer: Paris <tool_call>{"name": "finish", "arguments": {}}</tool_call>', "Paris", "final_answer"),
    ('Final answer: Paris<|python_tag|>{"name": "finish", "parameters": {}}', "Paris", "final_answer"),
    ('Final answer: Paris {"name": "finish", "parameters": {}}', "Paris", "final_answer"),
    ("<answer>Final answer: Paris</answer>", "Paris", "final_answer"),
    ("**Final answer**: Paris", "Paris", "final_answer"),                       # markdown around the label
    ("**Final Answer:** **Paris**", "Paris", "final_answer"),
    ("Final answer\uff1aParis", "Paris", "final_answer"),                        # full-width colon
    ("**Final Answer:**\n\nParis\nmore", "Paris", "final_answer"),               # nothing after the label: next line
    ("Final answer: $\\boxed{Paris}$", "Paris", "final_answer"),
    ("Final answer: x = \\boxed{\\frac{1}{2}}", "\\frac{1}{2}", "final_answer"),
    # reasoning never counts: an unclosed <think> (cut off while thinking) holds no answer
    ("<think>so Final answer: A, check <answer>A</answer>", None, "none"),
    ("Final answer: B\n<think>no, Final answer: A", "B", "final_answer"),
    ("<think>Final answer: A</think>\nno idea", None, "none"),
    ("", None, "none"),
    (None, None, "none"),
])
def test_extract_cascade(text, answer, rule):
    assert extract_answer(text) == (answer, rule)


def test_strict_answer_only_trusts_final_answer():
    assert strict_answer("x", "final_answer") == "x"
    assert strict_answer("x", "answer_tag") is None


# ---- tool-call parsing table -----------------------------------------------------------------

S = '{"name": "search", "arguments": {"query": "%s"}}'
L = '{"name": "search", "parameters": {"query": "%s"}}'


def _q(calls):
    return [c["arguments"].get("query") for c in calls]


QWEN_CASES = [
    # (text, queries, n_errors)
    ("<tool_call>\n" + S % "a" + "\n</tool_call>", ["a"], 0),
    ("think first <tool_call>" + S % "a" + "</tool_call>\n<tool_call>" + S % "b" + "</tool_call> trailing", ["a", "b"], 0),
    ('<tool_call>{"name": "search", "arguments": {"query": }</tool_call>', [], 1),
    ("<tool_call>" + S % "a" + "</tool_call><tool_call>{bad json}</tool_call>", ["a"], 1),
    ('<tool_call>{"name": "search", "arguments": "{\\"query\\": \\"s\\"}"}</tool_call>', ["s"], 0),  # string args
    ('<tool_call>{"arguments": {"query": "a"}}</tool_call>', [], 1),                                # no name
    ('<tool_call>{"name": "search", "arguments": [1]}</tool_call>', [], 1),                        # args not object
    ("<tool_call>" + S % "a", ["a"], 0),                                       # unclosed at the end: vLLM's hermes calls it too
    ("<tool_call>" + S % "a" + " and more", [], 1),                                                 # unclosed, not JSON
    ('<tool_call>{"name": "search", "arguments": {"query": "a } b {"}}</tool_call>', ["a } b {"], 0),
    ("just an answer, no call", [], 0),
]


LLAMA_CASES = [
    (L % "x", ["x"], 0),
    ("<|python_tag|>" + L % "x" + "<|eom_id|>", ["x"], 0),
    (L % "x" + "<|eot_id|>", ["x"], 0),
    ('{"name": "search", "parameters": {"filter": {"a": {"b": 1}}, "query": "x"}}', ["x"], 0),  # nested
    ('{"name": "search", "parameters": {"query": "f(x) = {y} }"}}', ["f(x) = {y} }"], 0),        # braces in strings
    (L % "a" + "; " + L % "b", ["a", "b"], 0),
    (L % "a" + "\n" + L % "b" + "<|eot_id|>", ["a", "b"], 0),
    ('{"name": "search", "arguments": {"query": "x"}}', ["x"], 0),                              # "arguments" too
    ('{"name": "search", "parameters": {"query": "x"}', [], 1),                                  # missing brace
    ('The set {"a": 1} is not a call.', [], 0),
    ("no call at all", [], 0),
]


@pytest.mark.parametrize("style, text, queries, n_errors",
                         [("qwen3", *c) for c in QWEN_CASES] + [("llama3", *c) for c in LLAMA_CASES])
def test_parse_tool_calls_table(style, text, queries, n_errors):
    calls, errors = parse_tool_calls(text, style)
    assert _q(calls) == queries
    assert len(errors) == n_errors
    assert all(c["name"] == "search" and isinstance(c["arguments"], dict) for c in calls)
    assert all(isinstance(e, str) and e for e in errors)


def test_parse_unknown_style():
    with pytest.raises(ValueError, match="unknown tool-call style"):
        parse_tool_calls("x", "mistral")


def test_strip_tool_calls():
    assert strip_tool_calls("hi <tool_call>" + S % "a" + "</tool_call> bye", "qwen3") == "hi  bye"
    assert strip_tool_calls("ok " + L % "a" + "<|eot_id|>", "llama3") == "ok"


def test_detect_style_from_templates():
    from tests.conftest import shared_path

    tdir = shared_path("fixtures", "chat_templates")
    assert detect_style((tdir / "llama3_1_8b_instruct.jinja").read_text()) == "llama3"
    assert detect_style((tdir / "qwen3_4b_thinking_2507.jinja").read_text()) == "qwen3"


def test_prompt_variants():
    from common.prompts import initial_messages, system_prompt
    from common.tools import SEARCH_TOOL

    assert "Final answer:" not in system_prompt("tool_agent")
    assert system_prompt("anchor_nudge").startswith(system_prompt("tool_agent"))
    assert system_prompt("anchor_nudge").endswith("Final answer: <your short answer>")
    msgs = initial_messages("anchor_nudge", "Who?")
    assert [m["role"] for m in msgs] == ["system", "user"] and msgs[1]["content"] == "Who?"
    assert SEARCH_TOOL["function"]["name"] == "search"
    assert SEARCH_TOOL["function"]["parameters"]["required"] == ["query"]
    with pytest.raises(ValueError, match="unknown prompt"):
        system_prompt("chatty")


def _vllm_cases():
    import json
    from pathlib import Path

    return json.loads((Path(__file__).parent / "data" / "vllm_toolcall_cases.json").read_text(encoding="utf-8"))["cases"]


@pytest.mark.parametrize("case", _vllm_cases(), ids=[f"{c['style']}-{i}" for i, c in enumerate(_vllm_cases())])
def test_never_stricter_than_vllm_parsers(case):
    """Every completion vLLM's hermes / llama3_json parser turns into calls parses to the same
    calls; where vLLM voids the whole completion, the documented leniency holds."""
    calls, errors = parse_tool_calls(case["text"], case["style"])
    assert case["source"].startswith("vllm-project/vllm@") and len(case["source"].split("@")[1].split(":")[0]) == 40
    if case["vllm_calls"]:
        assert calls == case["vllm_calls"] and errors == []
    elif case["ours"] is not None:  # deliberate leniency
        assert calls == case["ours"]["calls"] and len(errors) == case["ours"]["errors"]
    else:
        assert calls == []


@pytest.mark.parametrize("style", ["qwen3", "llama3"])
def test_parse_tool_calls_never_raises_on_deep_nesting(style):
    deep = "[" * 1200 + "]" * 1200
    wrap = {"qwen3": '<tool_call>{"name": "search", "arguments": {"query": %s}}</tool_call>',
            "llama3": '{"name": "search", "parameters": {"query": %s}}'}[style]
    for text in (wrap % deep, wrap % ("[" * 1200), wrap % ('"' + "[" * 1200 + '"'), "{" * 5000, "[" * 5000):
        calls, errors = parse_tool_calls(text, style)
        assert isinstance(calls, list) and isinstance(errors, list)
    calls, errors = parse_tool_calls(wrap % deep, style)
    assert calls == [] and len(errors) == 1 and "nested deeper" in errors[0]
    calls, errors = parse_tool_calls(wrap % ('"' + "[" * 1200 + '"'), style)  # brackets inside a string are text
    assert calls == [{"name": "search", "arguments": {"query": "[" * 1200}}] and errors == []
    arg_string = '<tool_call>{"name": "search", "arguments": "%s"}</tool_call>' % ("[" * 1200)
    assert parse_tool_calls(arg_string, "qwen3")[0] == []
    assert strip_tool_calls(wrap % deep, style) is not None


def test_empty_golds_counted_and_skippable():
    """NQ golds like `*` / `---` / `)` normalize to nothing: cover-EM 1 for any prediction. Default
    scoring keeps Search-R1 parity; the items are counted; skip_empty_golds drops such aliases."""
    from evals.agent import Episode
    from evals.benches import BenchItem
    from evals.metrics import cover_em, empty_gold
    from evals.results import summarize
    from evals.tasks import qa_row

    assert cover_em("anything at all", ["*"]) == 1.0 and empty_gold(["*"]) and empty_gold(["Paris", "---"])
    assert not empty_gold(["Paris", "The Paris"])
    items = [BenchItem("a", "q", ["*"]), BenchItem("b", "q", [")", "Paris"]), BenchItem("c", "q", ["Rome"])]
    ep = lambda i: Episode(i, [], [], final_content="Final answer: Lyon", stop_reason="answer")  # noqa: E731
    parity = [qa_row(ep(it.id), it) for it in items]
    s = summarize(parity, ("em", "f1", "cover_em", "strict_em"))
    assert s["cover_em"] == pytest.approx(2 / 3) and s["empty_gold_items"] == 2 and s["skipped_empty_gold_items"] == 0
    skip = [qa_row(ep(it.id), it, skip_empty_golds=True) for it in items]
    s = summarize(skip, ("em", "f1", "cover_em", "strict_em"))
    assert [r.get("skipped_empty_gold", False) for r in skip] == [True, False, False]
    assert s["cover_em"] == 0.0 and s["empty_gold_items"] == 2 and s["skipped_empty_gold_items"] == 1 and s["n"] == 3


def _unanswerable_bench(root, name: str, k: int) -> None:
    """A MuSiQue-style bench file of `k` rows, every one `answerable: false` (left out before sampling)."""
    import json

    (root / name).mkdir(parents=True)
    rows = [{"id": f"u{i}", "question": f"q{i}?", "answer": "a", "answer_aliases": [], "answerable": False,
             "paragraphs": [{"idx": 0, "title": "T", "paragraph_text": "text", "is_supporting": True}]}
            for i in range(k)]
    (root / name / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.parametrize("n", [2, 0])
@pytest.mark.parametrize("mode", ["given", "item"])
def test_a_bench_with_no_items_scores_null_with_a_reason_not_zero(tmp_path, capsys, mode, n):
    """A mean over zero items is no number: null with n 0 and the reason, never EM 0.0 (in summary.json,
    the terminal table and the 7-bench mean)."""
    import json

    from evals.cli import main as evaluate_main
    from tests.conftest import ROOT

    _unanswerable_bench(tmp_path / "br", "mq_unans", 3)
    out = tmp_path / "o"
    assert evaluate_main([f"ckpt={ROOT / 'common' / 'tiny_base'}", f"benches=[mq_unans@{mode}]",
                          f"bench_root={tmp_path / 'br'}", f"n={n}", f"out={out}", "progress=false"]) == 0
    s = json.loads((out / "summary.json").read_text())[f"mq_unans@{mode}"]
    assert s["n"] == 0 and s["unanswerable_excluded"] == 3
    for key in ("em", "f1", "cover_em", "strict_em", "format_failure_rate", "mean_turns", "mean_tool_calls"):
        assert s[key] is None, (key, s)
    assert "no items" in s["null_reason"] and "3 items with answerable: false" in s["null_reason"]
    assert f"mq_unans@{mode}" in capsys.readouterr().out


def test_every_item_skipped_scores_null_not_zero():
    from evals.agent import Episode
    from evals.benches import BenchItem
    from evals.metrics import METRICS, NON_METRIC_FIELDS, unweighted_mean
    from evals.results import summarize
    from evals.tasks import qa_row

    items = [BenchItem("a", "q", ["*"]), BenchItem("b", "q", ["---"])]
    ep = lambda i: Episode(i, [], [], final_content="Final answer: Lyon", stop_reason="answer")  # noqa: E731
    s = summarize([qa_row(ep(it.id), it, skip_empty_golds=True) for it in items], ("em", "f1", "cover_em", "strict_em"))
    assert s["n"] == 2 and s["skipped_empty_gold_items"] == 2
    assert s["em"] is None and s["cover_em"] is None and "skip_empty_golds" in s["null_reason"]
    assert s["format_failure_rate"] == 0.0   # a mean over the 2 items played, a number
    assert set(s) <= set(METRICS) | set(NON_METRIC_FIELDS)
    assert unweighted_mean({"nq": s, "hotpotqa": {"em": 0.5}}, ["nq", "hotpotqa"], "em") is None


def test_rows_that_never_generated_are_counted_with_or_without_the_refused_prompt():
    """A row that stopped at context_limit with no token generated counts in `prompt_too_long`; rows written before
    `refused_prompt` existed are counted too, the prompt's length then unknown. A context_limit after a generated
    turn (the conversation outgrew the window) is a result of the model's, not counted."""
    from evals.agent import Episode
    from evals.benches import BenchItem
    from evals.results import summarize
    from evals.tasks import qa_row

    item = BenchItem("a", "q", ["Lyon"])
    unplayed = qa_row(Episode("a", [], [], stop_reason="context_limit",
                              refused_prompt={"tokens": 90, "max_model_len": 64}), item)
    old = qa_row(Episode("b", [], [], stop_reason="context_limit"), item)
    outgrew = qa_row(Episode("c", [], [], stop_reason="context_limit", turns=1, generated_tokens=12,
                             refused_prompt={"tokens": 70, "max_model_len": 64}), item)
    answered = qa_row(Episode("d", [], [], final_content="Final answer: Lyon", stop_reason="answer", turns=1,
                              generated_tokens=5), item)
    assert unplayed["refused_prompt"] == {"tokens": 90, "max_model_len": 64} and "refused_prompt" not in old
    s = summarize([unplayed, outgrew, answered], ("em", "f1", "cover_em", "strict_em"))
    assert s["prompt_too_long"] == {"items": 1, "longest_prompt_tokens": 90, "max_model_len": 64}
    assert s["em"] == pytest.approx(1 / 3) and "null_reason" not in s
    s = summarize([old, old | {"id": "e"}], ("em", "f1", "cover_em", "strict_em"))
    assert s["prompt_too_long"] == {"items": 2, "longest_prompt_tokens": None, "max_model_len": None}
    assert s["em"] is None and s["null_reason"] == ("not measured: 2 of 2 items never generated a token: their first "
                                                    "prompt does not fit max_model_len (stop reason context_limit before "
                                                    "any generation); raise max_model_len or shorten the prompt")
