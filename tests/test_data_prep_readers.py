"""Readers on the real example rows (../shared/formats/examples) and on synthetic rows."""
from __future__ import annotations

import json

import pytest

from data_prep.readers import parse_source, read_source, SourceError
from data_prep.readers.common import parse_xml_calls
from data_prep.schema import validate_record
from data_prep.terminators import epilogue_text, extract_answer_tag, headline
from tests.conftest import shared_path


def _one(spec):
    outs = list(read_source(spec))
    assert len(outs) == 1
    assert outs[0].reason is None, (outs[0].reason, outs[0].detail)
    rec = outs[0].record
    validate_record(rec)
    return rec


def _assert_tool_roles(rec):
    calls = {}
    for m in rec["messages"]:
        for c in m.get("tool_calls") or []:
            assert isinstance(c["function"]["arguments"], dict)
            calls[c["id"]] = c["function"]["name"]
        if m["role"] == "tool":
            assert calls[m["tool_call_id"]] == m["name"]
        assert m["content"] is not None


def test_r2e_gym_example():
    rec = _one(f"r2e-gym:{shared_path('formats', 'examples', 'r2egym_sft.constructed_skeleton.json')}")
    _assert_tool_roles(rec)
    roles = [m["role"] for m in rec["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert "We have access to the following functions" not in rec["messages"][0]["content"]
    names = {t["function"]["name"] for t in rec["tools"]}
    assert names == {"file_editor", "execute_bash", "search", "finish"}
    fe = next(t for t in rec["tools"] if t["function"]["name"] == "file_editor")
    assert "command" in fe["function"]["parameters"]["required"]
    a = rec["messages"][2]
    assert a["reasoning_content"].startswith("I need to understand") and a["content"] == ""
    assert a["tool_calls"][0]["function"]["arguments"] == {"command": "view", "path": "/testbed"}
    assert "Steps Remaining" not in rec["messages"][3]["content"]
    assert rec["messages"][-1]["tool_calls"][0]["function"]["name"] == "finish"
    assert headline(rec["task"]) == "<issue title>"


def test_swe_gym_raw_example(tmp_path):
    src = shared_path('formats', 'examples', 'swegym_openhands_sampled_raw.example.json')
    rec = _one(f"swe-gym:{src}")
    _assert_tool_roles(rec)
    assert rec["id"] == "Project-MONAI__MONAI-5686_4"
    assert "null" not in json.dumps(rec["tools"])  # parquet-union nulls stripped
    assert rec["messages"][2]["tool_calls"][0]["function"]["arguments"]["view_range"] == [0, 50]
    assert rec["messages"][-1]["tool_calls"][0]["function"] == {"name": "finish", "arguments": {}}
    assert headline(rec["task"]) == "SSIMLoss result does not have gradient"
    # the `tools` column is what OpenHands gave the model (it refuses any other name), and the real row's is complete:
    # a call to a tool it lacks is refused, not given an inferred spec (seen failing: kept, with a made-up `browser` spec)
    row = json.loads(src.read_text())
    row["messages"][2]["tool_calls"][0]["function"]["name"] = row["messages"][3]["name"] = "browser"
    p = tmp_path / "t.json"
    p.write_text(json.dumps(row))
    (out,) = read_source(f"swe-gym:{p}")
    assert (out.reason, out.detail) == ("unparseable_tool_call", "message 2: a call to 'browser', which the row's tools column "
                                        "lacks (execute_bash, finish, str_replace_editor)")


def test_swe_smith_xml_example():
    rec = _one(f"swe-smith:{shared_path('formats', 'examples', 'swesmith_xml.example.json')}")
    _assert_tool_roles(rec)
    assert all("\r\n" not in m["content"] for m in rec["messages"] if m["role"] == "tool")
    assert rec["messages"][-1]["tool_calls"][0]["function"]["name"] == "submit"
    assert {t["function"]["name"] for t in rec["tools"]} >= {"bash", "submit", "str_replace_editor"}
    assert headline(rec["task"]).startswith("f-string formatting with empty format string")


def test_swe_smith_tool_split_json_string(tmp_path):
    msgs = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "<pr_description>\nFix the parser\n</pr_description>"},
        {"role": "assistant", "content": "look", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{\"command\": \"ls\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "bash", "content": "a\r\nb"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c2", "type": "function", "function": {"name": "submit", "arguments": "{}"}}]},
    ]
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps({"instance_id": "x1", "messages": json.dumps(msgs)}) + "\n")
    rec = _one(f"swe-smith:{p}")
    assert rec["messages"][3]["content"] == "a\nb"
    assert [t["function"]["name"] for t in rec["tools"]] == ["bash", "submit"]  # the split ships no schemas: inferred
    assert rec["messages"][2]["reasoning_content"] == "look"
    # a row that does carry a `tools` column is held to it: a call to a tool it lacks is refused (seen failing: the column
    # was ignored and every spec inferred)
    bash = {"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}
    p.write_text(json.dumps({"instance_id": "x1", "messages": json.dumps(msgs), "tools": [bash]}) + "\n")
    (out,) = read_source(f"swe-smith:{p}")
    assert (out.reason, out.detail) == ("unparseable_tool_call", "message 4: a call to 'submit', which the row's tools column lacks (bash)")
    tools = [bash, {"type": "function", "function": {"name": "submit"}}]
    p.write_text(json.dumps({"instance_id": "x1", "messages": json.dumps(msgs), "tools": tools}) + "\n")
    assert _one(f"swe-smith:{p}")["tools"] == tools  # the declared specs, none inferred beside them
    # a null observation or query is refused, not read as empty text (an assistant's null content beside a call is "")
    for k in (1, 3):
        p.write_text(json.dumps({"instance_id": "x1", "messages": json.dumps([*msgs[:k], {**msgs[k], "content": None}, *msgs[k + 1:]])}) + "\n")
        (out,) = read_source(f"swe-smith:{p}")
        assert (out.reason, out.detail) == ("non_string_content", f"message {k} ({msgs[k]['role']}) content is NoneType")
    p.write_text(json.dumps({"instance_id": "x1", "messages": json.dumps([*msgs, {"role": "user", "content": "more?"}])}) + "\n")
    (out,) = read_source(f"swe-smith:{p}")
    assert (out.reason, out.detail) == ("no_finish_call", "the conversation ends with a user turn, not a finish/submit call")


def test_swe_gym_text_form(tmp_path):
    row = {"messages": [
        {"role": "system", "content": "You are helpful.\n\nYou have access to the following functions:\n\n---- BEGIN FUNCTION #1: execute_bash ----\nDescription: Run.\n\nParameters:\n  (1) command (string, required): The command.\n---- END FUNCTION #1 ----\n"},
        {"role": "user", "content": "<pr_description>\nBug in foo\n</pr_description>"},
        {"role": "assistant", "content": "Run it.\n<function=execute_bash>\n<parameter=command>\npython a.py\n</parameter>\n</function>"},
        {"role": "user", "content": "EXECUTION RESULT of [execute_bash]:\nok"},
        {"role": "assistant", "content": "Done.\n<function=finish>\n</function>"},
    ]}
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps(row) + "\n")
    rec = _one(f"swe-gym:{p}")
    assert rec["messages"][0]["content"] == "You are helpful."
    assert rec["messages"][2]["tool_calls"][0]["function"]["arguments"] == {"command": "python a.py"}
    assert rec["messages"][3]["role"] == "tool"
    spec = rec["tools"][0]["function"]
    assert spec["name"] == "execute_bash" and spec["parameters"]["required"] == ["command"]


def test_search_readers_on_synthetic(tmp_path):
    from data_prep.synthetic import SyntheticConfig, write_sources

    specs = write_sources(tmp_path, seed=0, code_n=0, search_n=6, cfg=SyntheticConfig(search_extra=(1, 1)))
    for spec in specs["search"]:
        outs = list(read_source(spec))
        assert len(outs) == 3 and all(o.reason is None for o in outs)
        for o in outs:
            rec = o.record
            _assert_tool_roles(rec)
            assert rec["domain"] == "search" and rec["terminator"] == "final_answer"
            assert rec["messages"][-1]["content"] == f"Final answer: {rec['answer']}"
            calls = [c for m in rec["messages"] for c in m.get("tool_calls") or []]
            assert len(calls) == 2 and all(c["function"]["name"] == "search" and isinstance(c["function"]["arguments"]["query"], str) for c in calls)
            tool_msgs = [m for m in rec["messages"] if m["role"] == "tool"]
            assert tool_msgs[-1]["content"].startswith("Doc 1(Title: ")
            assert rec["tools"][0]["function"]["parameters"]["properties"] == {"query": {"type": "string", "description": "The search query."}}


def test_search_r1_uses_last_answer_and_question(tmp_path):
    row = {"prompt": [{"role": "user", "content": "Use tags, e.g. <answer> Beijing </answer>. Question: who wrote hamlet?"}],
           "reward_model": {"ground_truth": {"target": ["Shakespeare"]}},
           "response": "<think>search</think><search> hamlet author </search>\n\n<information>Doc 1(Title: Hamlet) by Shakespeare</information>\n\n<answer> William Shakespeare </answer>"}
    p = tmp_path / "r1.jsonl"
    p.write_text(json.dumps(row) + "\n")
    rec = _one(f"search-r1:{p}")
    assert rec["task"] == "who wrote hamlet?" and rec["answer"] == "Shakespeare"
    assert rec["messages"][-1]["content"] == "Final answer: William Shakespeare"
    assert rec["messages"][2]["tool_calls"][0]["function"]["arguments"] == {"query": "hamlet author"}
    assert extract_answer_tag("x <answer>a</answer> y <answer> b </answer>") == ("x <answer>a</answer> y ", "b")
    # an empty or blank query is a search all the same: Search-R1's rollout (generation.py postprocess_predictions /
    # execute_predictions) reads `<search> </search>` as action search with query "" and returns its <information>
    for blank in ("", " \n "):
        p.write_text(json.dumps({**row, "response": row["response"].replace(" hamlet author ", blank)}) + "\n")
        assert _one(f"search-r1:{p}")["messages"][2]["tool_calls"][0]["function"]["arguments"] == {"query": ""}
    # an empty answer is refused, not trained as a bare `Final answer: `
    p.write_text(json.dumps({**row, "response": row["response"].replace(" William Shakespeare ", " \n ")}) + "\n")
    (out,) = read_source(f"search-r1:{p}")
    assert (out.reason, out.detail, out.where) == ("no_final_answer", "the <answer> is empty", f"{p}:1")
    # a <search> never closed is no search (Search-R1 runs `<search>q</search>` only), nor thought to train:
    # refused, as is an <information> block no search asked for (seen failing: both kept in the final turn's thought)
    for response, what in [("<think>a</think><search> hamlet author\n\n<information>Doc 1(Title: H) x</information>\n\n<answer> W </answer>",
                            "a <search> with no </search> ('hamlet author"),
                           (row["response"].replace("</information>", "</information><search> more"), "a <search> with no </search> ('more')"),
                           ("<think>a</think>\n<information>Doc 1(Title: H) x</information>\n<answer> W </answer>",
                            "an <information> block with no <search> before it"),
                           # a stray closing tag, an answer left open, or before another answer/search: Search-R1's episode ends
                           # at the first closed <answer> (seen failing: each kept in a turn's thought)
                           ("<think>t</think> hamlet </search> " + row["response"], "a stray </search>"),
                           (row["response"].replace("<answer>", "x </information> <answer>"), "a stray </information>"),
                           ("<answer> W " + row["response"], "a stray <answer>"),
                           (row["response"].replace("<answer>", "<answer> A </answer> <answer>"), "a stray <answer>"),
                           ("<answer> A </answer>" + row["response"], "a stray <answer>"),
                           (row["response"].replace("</information>", "<search> b </search><information>c</information>"),
                            "search 0 ('hamlet author'): an <information> with no </information>")]:
        p.write_text(json.dumps({**row, "response": response}) + "\n")
        (out,) = read_source(f"search-r1:{p}")
        assert out.reason == "unparseable_tool_call" and out.detail.startswith(what), out.detail



HEADLINE_CASES = {
    # R2E-Gym synthetic issue
    "r2e": ("[ISSUE]\n**Title:** `np.unique` fails on empty object arrays\n\n**Description:**\nWhen calling ...\n[/ISSUE]",
            "`np.unique` fails on empty object arrays"),
    # R2E block whose title is empty: the description's text, never the label itself
    "r2e_empty_title": ("[ISSUE]\n**Title:** \n\n**Description:**\nImage.resize ignores the reducing_gap argument\n\n"
                        "**Expected Behavior:**\nx\n[/ISSUE]", "Image.resize ignores the reducing_gap argument"),
    # GitHub bug-report template: comment, heading, then the text
    "github_template": ("<!--\nPlease fill the template below.\nThanks for contributing!\n-->\n\n### Describe the bug\n\n"
                        "SSIMLoss result does not have gradient\n\n### To Reproduce\n```python\nimport torch\n```\n",
                        "SSIMLoss result does not have gradient"),
    "comment_line": ("<!-- Please fill the template -->\nGroupBy.first drops categories\n", "GroupBy.first drops categories"),
    # pandas-style: checkboxes, a code block first, then the description under a template heading
    "pandas": ("### Pandas version checks\n\n- [X] I have checked that this issue has not already been reported.\n"
               "- [ ] I have confirmed this bug exists on the main branch.\n\n### Reproducible Example\n\n```python\n"
               "import pandas as pd\npd.DataFrame().sum()\n```\n\n### Issue Description\n\nDataFrame.sum raises on an empty frame\n",
               "DataFrame.sum raises on an empty frame"),
    "code_first": ("```python\n>>> np.linspace(0, 1, 0)\nTraceback ...\n```\nlinspace with num=0 raises instead of returning []\n",
                   "linspace with num=0 raises instead of returning []"),
    "old_template": ("#### Code Sample, a copy-pastable example if possible\n\n```python\ns.str.cat()\n```\n"
                     "#### Problem description\n\nstr.cat ignores na_rep\n", "str.cat ignores na_rep"),
    # SWE-Gym problem statement: the first line is the title; a **Title:** deep in the body loses
    "swe_gym": ("SSIMLoss result does not have gradient\n**Describe the bug**\nSSIMLoss result does not have gradient\n\n"
                "**To Reproduce**\n```\nx\n```\n", "SSIMLoss result does not have gradient"),
    "deep_title": ("Crash when the config file is empty\n\nSteps:\n1. a\n2. b\n3. c\n\n**Title:** unrelated quoted text\n",
                   "Crash when the config file is empty"),
    "title_near_top": ("[ISSUE]\nFixes #123\n**Title:** Use the declared dtype\n", "Use the declared dtype"),
}


@pytest.mark.parametrize("case", sorted(HEADLINE_CASES))
def test_headlines_on_real_looking_issues(case):
    text, want = HEADLINE_CASES[case]
    assert headline(text) == want


def test_headline_rules():
    assert headline("[ISSUE]\n**Title:**   Foo   bar\tbaz \n\n**Description:** x") == "Foo bar baz"
    assert headline("**Title:**\n\n<!-- c -->\n```\ncode\n```\n") == ""  # nothing usable: no_headline
    assert headline("\n\n  # First   line here\nsecond") == "First line here"
    long = "word " * 100
    h = headline(long)
    assert len(h) <= 200 and h.endswith("word") and not h.endswith(" ")
    # one word longer than the limit (a URL, a path) is cut inside it, never between a letter and its
    # combining marks or inside an emoji sequence (seen failing: `e` kept, its U+0301 cut off)
    assert headline("x" * 199 + "e\u0301" + "y" * 50) == "x" * 199
    assert headline("e\u0301" * 150) == "e\u0301" * 100
    assert headline("a" * 198 + "\U0001F44D\U0001F3FD" + "b") == "a" * 198 + "\U0001F44D\U0001F3FD"
    assert headline("a" * 199 + "\U0001F44D\U0001F3FD" + "b") == "a" * 199
    assert headline("http://x.org/" + "p" * 300 + " tail") == ("http://x.org/" + "p" * 300)[:200]
    assert headline("Fix " + "a" * 196 + "\u0301 tail") == "Fix"  # a space before a combining sequence that does not fit
    assert epilogue_text("**Title:** T") == "\nFinal answer: T"


def test_parse_xml_calls_and_source_errors(tmp_path, monkeypatch):
    thought, calls = parse_xml_calls("think\n\n<function=file_editor>\n  <parameter=command>view</parameter>\n  <parameter=view_range>[1, 5]</parameter>\n</function>")
    assert thought.strip() == "think" and calls == [("file_editor", {"command": "view", "view_range": "[1, 5]"})]
    with pytest.raises(SourceError, match="unknown format"):
        parse_source("nope:/x.jsonl")
    with pytest.raises(SourceError, match="no such file"):
        parse_source("r2e-gym:/does/not/exist.jsonl")
    # a path in the home directory, as launch reads it (was: "expected SOURCE~SHARE ..., got '/h.jsonl'")
    monkeypatch.setenv("HOME", str(home := tmp_path / "home"))
    home.mkdir()
    (home / "h.jsonl").write_text("{}\n")
    assert parse_source("r2e-gym:~/h.jsonl~0.5").location == str(home / "h.jsonl")
    with pytest.raises(SourceError, match=f"^source 'r2e-gym:~/nope#test': no such file {home}/nope$"):
        parse_source("r2e-gym:~/nope#test")
    # a directory reads the data files directly in it (seen failing: a dir of none read nothing, or all its subdirs' files)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.jsonl").write_text("{}\n")
    with pytest.raises(SourceError, match=f"^source 'search-r1:{tmp_path}~0.5': {tmp_path} is a directory holding no .jsonl"):
        parse_source(f"search-r1:{tmp_path}~0.5")
    assert parse_source(f"search-r1:{tmp_path / 'sub'}").files() == [tmp_path / "sub" / "a.jsonl"]
    # a file of another suffix: one line naming it and the accepted suffixes (was pyarrow's "Parquet magic bytes not found")
    (tmp_path / "README.md").write_text("# notes\n")
    with pytest.raises(SourceError, match=f"^source 'search-r1:{tmp_path}/README.md': {tmp_path}/README.md is not a "
                                          r"\.jsonl, \.json or \.parquet file$"):
        parse_source(f"search-r1:{tmp_path}/README.md")
    # a directory in the Hub's layout reads one split (was: every file, train and test alike); the split of a name is
    # datasets' rule (datasets.data_files.get_data_patterns puts these names in train, test, validation, train, and
    # train_test.jsonl in both train and test)
    hub = tmp_path / "hub"
    hub.mkdir()
    for name in ("train.jsonl", "test.jsonl", "my_dev-0.jsonl", "training-x.json", "train_test.jsonl", "contest.jsonl"):
        (hub / name).write_text("{}\n")
    with pytest.raises(SourceError, match=f"^source 'search-r1:{hub}': {hub}/contest.jsonl names no split"):
        parse_source(f"search-r1:{hub}")
    (hub / "contest.jsonl").unlink()
    assert parse_source(f"search-r1:{hub}").files() == [hub / "train.jsonl", hub / "train_test.jsonl", hub / "training-x.json"]
    assert parse_source(f"search-r1:{hub}#test").files() == [hub / "test.jsonl", hub / "train_test.jsonl"]
    assert parse_source(f"search-r1:{hub}#validation+test").files() == [hub / "my_dev-0.jsonl", hub / "test.jsonl", hub / "train_test.jsonl"]
    with pytest.raises(SourceError, match=f"^source 'search-r1:{hub}#dev': {hub} has no 'dev' split \\(its files name test, train, validation\\)"):
        parse_source(f"search-r1:{hub}#dev")
    with pytest.raises(SourceError, match=f"^source 'search-r1:{tmp_path / 'sub'}#test': {tmp_path / 'sub'} is read whole"):
        parse_source(f"search-r1:{tmp_path / 'sub'}#test")


XML_SYSTEM = """You are a programming agent.

We have access to the following functions:

---- BEGIN FUNCTION #1: file_editor ----
Description: Edit files
Parameters:
  (1) command (string, required): The command.
  (2) path (string, required): The path.
  (3) new_str (string, optional): The new text.
  (4) view_range (array, optional): Lines to view.
  (5) insert_line (integer, optional): Line number.
  (6) dry (boolean, optional): Only show.
---- END FUNCTION #1 ----

---- BEGIN FUNCTION #2: finish ----
Description: Finish
Parameters:
  (1) command (string, required): submit
---- END FUNCTION #2 ----
"""


def test_xml_parameters_typed_by_declared_schema(tmp_path):
    """String parameters stay byte-exact (a `new_str` that looks like JSON is not decoded and its
    whitespace kept); non-string parameters are decoded; parameters of a tool with no declared
    schema stay strings; CRLF in what the model wrote is kept (only observations are normalised)."""
    edit = ("Edit it.\n\n<function=file_editor>\n  <parameter=command>str_replace</parameter>\n  <parameter=path>/a.json</parameter>\n"
            '  <parameter=new_str>{"debug": true,   "level": 1}</parameter>\n  <parameter=view_range>[1, 5]</parameter>\n'
            "  <parameter=insert_line>7</parameter>\n  <parameter=dry>false</parameter>\n</function>")
    crlf_edit = "Again.\n\n<function=file_editor>\n  <parameter=command>create</parameter>\n  <parameter=path>/b</parameter>\n  <parameter=new_str>a\r\nb</parameter>\n</function>"
    undeclared = "Look.\n\n<function=grep_tool>\n  <parameter=pattern>[1, 2]</parameter>\n  <parameter=n>5</parameter>\n</function>"
    row = {"id": "x", "messages": [
        {"role": "system", "content": XML_SYSTEM}, {"role": "user", "content": "<github_issue>\n**Title:** T\n</github_issue>"},
        {"role": "assistant", "content": edit}, {"role": "user", "content": "ok\r\ndone"},
        {"role": "assistant", "content": crlf_edit}, {"role": "user", "content": "ok"},
        {"role": "assistant", "content": undeclared}, {"role": "user", "content": "ok"},
        {"role": "assistant", "content": "Done.\n\n<function=finish>\n  <parameter=command>submit</parameter>\n</function>"}]}
    for fmt in ("r2e-gym", "swe-gym", "swe-smith"):
        p = tmp_path / f"{fmt}.jsonl"
        p.write_text(json.dumps(row) + "\n")
        rec = _one(f"{fmt}:{p}")
        args = [m["tool_calls"][0]["function"]["arguments"] for m in rec["messages"] if m.get("tool_calls")]
        assert args[0] == {"command": "str_replace", "path": "/a.json", "new_str": '{"debug": true,   "level": 1}',
                           "view_range": [1, 5], "insert_line": 7, "dry": False}
        assert args[1]["new_str"] == "a\r\nb"
        assert args[2] == {"pattern": "[1, 2]", "n": "5"}
        if fmt != "r2e-gym":  # the readers with CRLF observations normalise tool output only
            assert rec["messages"][3]["content"] == "ok\ndone"


_OS_CALL = '<tool_call>{"name": "search", "arguments": {"query": ["hamlet"]}}</tool_call>'
_OS_RESP = {"role": "user", "content": "<tool_response>Doc</tool_response>"}
_OS_FIN = {"role": "assistant", "content": "<think>ok</think><answer>W</answer>"}


def _os(*turns):
    return {"id": "os1", "question": "who wrote hamlet?", "answer": "W", "trajectory": [{"role": "user", "content": "who wrote hamlet?"}, *turns]}


def _asst(text):
    return {"role": "assistant", "content": "<think>a</think>" + text}


# OpenSeeker rows its environment would not have run as written (seen failing: each trained, the stray text as thought)
MALFORMED_AGENT_ROWS = {
    "os_unclosed_second_call": (_os(_asst(_OS_CALL + '<tool_call>{"name": "search"'), _OS_RESP, _OS_FIN),
                                "unparseable_tool_call", "message 1: a stray <tool_call>"),
    "os_stray_close": (_os(_asst(_OS_CALL + " oops</tool_call>"), _OS_RESP, _OS_FIN), "unparseable_tool_call", "message 1: a stray </tool_call>"),
    "os_only_stray_close": (_os(_asst("x</tool_call>"), _OS_FIN), "unparseable_tool_call", "message 1: a stray </tool_call>"),
    "os_undeclared_tool": (_os(_asst('<tool_call>{"name": "python", "arguments": {"code": "1"}}</tool_call>'), _OS_RESP, _OS_FIN),
                           "unparseable_tool_call", "message 1 call 0: OpenSeeker has no tool 'python' (its tools: search, visit)"),
    "os_search_without_query": (_os(_asst('<tool_call>{"name": "search", "arguments": {"q": ["hamlet"]}}</tool_call>'), _OS_RESP, _OS_FIN),
                                "unparseable_tool_call", "message 1 call 0: a search call without its required parameter(s) query"),
    "os_visit_without_goal": (_os(_asst('<tool_call>{"name": "visit", "arguments": {"url": "https://x.org"}}</tool_call>'), _OS_RESP, _OS_FIN),
                              "unparseable_tool_call", "message 1 call 0: a visit call without its required parameter(s) goal"),
    "os_response_in_call_turn": (_os(_asst(_OS_CALL + "<tool_response>Doc</tool_response>"), _OS_RESP, _OS_FIN),
                                 "tool_response_mismatch", "message 1: a stray <tool_response>"),
    "os_unclosed_response": (_os(_asst(_OS_CALL), {"role": "user", "content": "<tool_response>Doc ..."}, _OS_FIN),
                             "tool_response_mismatch", "message 2: a stray <tool_response>"),
    "os_call_no_response": (_os(_asst(_OS_CALL), _OS_FIN), "tool_response_mismatch", "message 2: 1 call(s) of message 1 have no <tool_response>"),
    "os_call_no_response_then_call": (_os(_asst(_OS_CALL), _asst(_OS_CALL), _OS_RESP, _OS_FIN),
                                      "tool_response_mismatch", "message 2: 1 call(s) of message 1 have no <tool_response>"),
    "os_two_answers": (_os(_asst(_OS_CALL), _OS_RESP, _asst("<answer>A</answer><answer>W</answer>")), "no_final_answer", "message 3: a stray <answer>"),
    "os_answer_beside_call": (_os(_asst(_OS_CALL + "<answer>W</answer>"), _OS_RESP, _OS_FIN), "no_final_answer", "message 1: a stray <answer>"),
    "os_answer_then_more": (_os(_asst(_OS_CALL), _OS_RESP, _OS_FIN, _asst(_OS_CALL), _OS_RESP, _OS_FIN),
                            "no_final_answer", "message 4: a turn after the <answer> of message 3"),
}


def _code(*turns, system=XML_SYSTEM):
    return {"id": "c1", "messages": [{"role": "system", "content": system}, {"role": "user", "content": "<github_issue>\n**Title:** T\n</github_issue>"}, *turns]}


_EDIT = {"role": "assistant", "content": "Look.\n\n<function=file_editor>\n  <parameter=command>view</parameter>\n  <parameter=path>/a</parameter>\n</function>"}
_OBS = {"role": "user", "content": "ok"}


def _native(*turns):
    fin = {"role": "assistant", "content": "done", "tool_calls": [{"id": "f", "type": "function", "function": {"name": "finish", "arguments": "{}"}}]}
    return {"id": "n1", "messages": [{"role": "user", "content": "fix it"}, *turns, fin]}


def _ncall(cid, args="{}", name="bash"):
    return {"role": "assistant", "content": "", "tool_calls": [{"id": cid, "type": "function", "function": {"name": name, "arguments": args}}]}


# code trajectories: a call the scaffold would not have run as written; its text would be dropped or trained as thought
MALFORMED_AGENT_ROWS |= {
    "r2e_finish_param_unclosed": (_code(_EDIT, _OBS, {"role": "assistant", "content": "Done.\n<function=finish>\n<parameter=command>submit\n</function>"}),
                                  "unparseable_tool_call", "message 4: <function=finish> holds '<parameter=command>submit'"),
    "r2e_finish_bare_text": (_code(_EDIT, _OBS, {"role": "assistant", "content": "Done.\n<function=finish>\nsubmit\n</function>"}),
                             "unparseable_tool_call", "message 4: <function=finish> holds 'submit'"),
    "r2e_finish_no_command": (_code(_EDIT, _OBS, {"role": "assistant", "content": "Done.\n<function=finish>\n</function>"}),
                              "unparseable_tool_call", "message 4: a finish call without its required parameter(s) command"),
    "r2e_two_calls_in_a_turn": (_code({**_EDIT, "content": _EDIT["content"] * 2}, _OBS, {"role": "assistant", "content": "<function=finish>\n<parameter=command>submit</parameter>\n</function>"}),
                                "unparseable_tool_call", "message 2: 2 <function=...> calls in one turn"),
    "r2e_call_no_observation": (_code(_EDIT, {"role": "assistant", "content": "<function=finish>\n<parameter=command>submit</parameter>\n</function>"}),
                                "bad_tool_message", "message 3: the call of message 2 has no observation"),
    "r2e_stray_function_close": (_code(_EDIT, _OBS, {"role": "assistant", "content": "Done.\n<function=finish>\n<parameter=command>submit</parameter>\n</function>\n</function>"}),
                                 "unparseable_tool_call", "message 4: a stray </function>"),
    "r2e_stray_parameter_close": (_code(_EDIT, _OBS, {"role": "assistant", "content": "x</parameter>\n<function=finish>\n<parameter=command>submit</parameter>\n</function>"}),
                                  "unparseable_tool_call", "message 4: a stray </parameter>"),
    "swegym_finish_args_list": ({"id": "n1", "messages": [{"role": "user", "content": "fix it"}, _ncall("f", "[1]", "finish")]},
                                "unparseable_tool_call", "message 1 call 0: arguments are list, not an object"),
    "swegym_result_of_no_call": (_native(_ncall("a"), {"role": "tool", "content": "x", "tool_call_id": "zzz", "name": "bash"}),
                                 "bad_tool_message", "message 2: a result of bash for call 'zzz', which no call awaiting a result is"),
    "swegym_result_named_otherwise": (_native(_ncall("a"), {"role": "tool", "content": "x", "tool_call_id": "a", "name": "grep"}),
                                      "bad_tool_message", "message 2: a result of grep for call 'a', which no call awaiting a result is"),
    "swegym_call_no_result": (_native(_ncall("a")), "bad_tool_message", "message 2: call(s) a of message 1 have no tool result"),
}




def _canonical(*turns):
    from common.tools import SEARCH_TOOL

    msgs = [{"role": "user", "content": "who?"}, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c0", "type": "function", "function": {"name": "search", "arguments": {"query": "q"}}}]}, *turns, {"role": "assistant", "content": "Final answer: W"}]
    return {"id": "k1", "source": "s", "domain": "search", "messages": msgs, "tools": [SEARCH_TOOL], "task": "who?", "answer": "W", "terminator": "final_answer"}


# canonical rows (e.g. an envs export edited by hand): the same pairing, and only the record's own tools
MALFORMED_AGENT_ROWS |= {
    "canonical_call_no_result": (_canonical(), "bad_tool_message", "message 2: call(s) c0 of message 1 have no tool result"),
    "canonical_result_of_no_call": (_canonical({"role": "tool", "content": "d", "tool_call_id": "zz", "name": "search"}),
                                    "bad_tool_message", "message 2: a result of search for call 'zz'"),
    "canonical_undeclared_tool": (_canonical({"role": "tool", "content": "d", "tool_call_id": "c0", "name": "search"}) | {"tools": []},
                                  "unparseable_tool_call", "message 1: a call to 'search', which the record's tools lack"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED_AGENT_ROWS))
def test_malformed_agent_rows_are_refused(tmp_path, case):
    row, reason, detail = MALFORMED_AGENT_ROWS[case]
    p = tmp_path / "x.jsonl"
    p.write_text(json.dumps(row) + "\n")
    (out,) = read_source(f"{dict(os='openseeker', r2e='r2e-gym', swegym='swe-gym', canonical='canonical')[case.split('_')[0]]}:{p}")
    assert (out.reason, out.detail[:len(detail)]) == (reason, detail), out.detail

# What an OpenSeeker row's `answer` may hold, and the record's gold (seen failing: every non-string became the model's own
# `<answer>`, "W" here, so a held-out item's gold could be the prediction it scores): a string as is, a number as its text
# (the golds evaluate's EM compares are strings), a list of strings whole (each one a gold, as FlashRAG's golden_answers),
# a list of one its string (one gold, one form: the record's content digest is the same for ["Bard"] and "Bard").
OS_GOLDS = {"str": ("Shakespeare", "Shakespeare"), "int": (1603, "1603"), "float": (3.5, "3.5"),
            "list": (["William Shakespeare", "Shakespeare"], ["William Shakespeare", "Shakespeare"]), "one": (["Bard"], "Bard")}
OS_BAD_GOLDS = {"absent": ..., "null": None, "dict": {"text": "W"}, "bool": True, "empty_list": [], "mixed_list": ["W", 1],
                "nan": float("nan")}


@pytest.mark.parametrize("case", sorted(OS_GOLDS))
def test_openseeker_gold_is_the_rows_answer_in_its_own_form(tmp_path, case):
    from evals.metrics import exact_match

    value, gold = OS_GOLDS[case]
    p = tmp_path / "os.jsonl"
    p.write_text(json.dumps(_os(_asst(_OS_CALL), _OS_RESP, _OS_FIN) | {"answer": value}) + "\n")
    rec = _one(f"openseeker:{p}")
    assert rec["answer"] == gold and rec["messages"][-1]["content"] == "Final answer: W"
    assert exact_match(gold[-1] if isinstance(gold, list) else gold, gold) == 1.0 and exact_match("W", gold) == 0.0


@pytest.mark.parametrize("case", sorted(OS_BAD_GOLDS))
def test_openseeker_row_without_a_usable_gold_is_refused(tmp_path, case):
    row = _os(_asst(_OS_CALL), _OS_RESP, _OS_FIN)
    row.pop("answer") if OS_BAD_GOLDS[case] is ... else row.update(answer=OS_BAD_GOLDS[case])
    p = tmp_path / "os.jsonl"
    p.write_text(json.dumps(row) + "\n")
    (out,) = read_source(f"openseeker:{p}")
    assert out.record is None and out.reason == "bad_gold" and out.detail.startswith("answer "), (out.reason, out.detail)


# A Search-R1 row's gold is Search-R1's own field (its verl rows: reward_model.ground_truth.target = FlashRAG's
# golden_answers, a list of strings), else `golden_answers`, else `answer`, under OpenSeeker's rule (seen failing: the first
# of several golds kept alone, and a row with none given the model's own <answer>, "Marlowe" here, as its gold). One gold
# is its string, so a row's record keeps its content digest whether it wrote ["x"] or "x".
_R1 = {"question": "who wrote hamlet?",
       "response": "<search> hamlet </search>\n\n<information>Doc 1(Title: Hamlet) x</information>\n\n<answer> Marlowe </answer>"}
R1_GOLDS = {"golden_answers": ({"golden_answers": ["Shakespeare", "William Shakespeare"]}, ["Shakespeare", "William Shakespeare"]),
            "target": ({"reward_model": {"style": "rule", "ground_truth": {"target": ["Shakespeare", "Bard"]}},
                        "golden_answers": ["other"]}, ["Shakespeare", "Bard"]),
            "target_one": ({"reward_model": {"ground_truth": {"target": ["Shakespeare"]}}}, "Shakespeare"),
            "one": ({"golden_answers": ["Shakespeare"]}, "Shakespeare"), "str": ({"golden_answers": "Shakespeare"}, "Shakespeare"),
            "number": ({"golden_answers": 1603}, "1603"), "answer_field": ({"answer": ["Shakespeare", "Will"]}, ["Shakespeare", "Will"])}
R1_BAD_GOLDS = {"absent": ({}, "no gold: the row has none of reward_model.ground_truth.target, golden_answers, answer"),
                "null": ({"golden_answers": None}, "no gold: "),
                "empty_list": ({"golden_answers": []}, "golden_answers list []: not a gold"),
                "empty_target": ({"reward_model": {"ground_truth": {"target": []}}, "golden_answers": ["x"]},
                                 "reward_model.ground_truth.target list []: not a gold"),
                "mixed_list": ({"golden_answers": ["W", 1]}, "golden_answers list "),
                "blank": ({"golden_answers": "  "}, "golden_answers str "), "blank_in_list": ({"golden_answers": ["W", ""]}, "golden_answers list "),
                "dict": ({"answer": {"text": "W"}}, "answer dict "), "nan": ({"golden_answers": float("nan")}, "golden_answers float "),
                "ground_truth_str": ({"reward_model": {"ground_truth": "Shakespeare"}}, "reward_model.ground_truth str "),
                "reward_model_list": ({"reward_model": ["Shakespeare"]}, "reward_model list ")}


@pytest.mark.parametrize("case", sorted(R1_GOLDS))
def test_search_r1_keeps_every_gold(tmp_path, case):
    fields, gold = R1_GOLDS[case]
    p = tmp_path / "r1.jsonl"
    p.write_text(json.dumps(_R1 | fields) + "\n")
    rec = _one(f"search-r1:{p}")
    assert rec["answer"] == gold and rec["messages"][-1]["content"] == "Final answer: Marlowe"


@pytest.mark.parametrize("case", sorted(R1_BAD_GOLDS))
def test_search_r1_row_without_a_usable_gold_is_refused(tmp_path, case):
    fields, detail = R1_BAD_GOLDS[case]
    p = tmp_path / "r1.jsonl"
    p.write_text(json.dumps(_R1 | fields) + "\n")
    (out,) = read_source(f"search-r1:{p}")
    assert out.record is None and out.reason == "bad_gold" and out.detail.startswith(detail), (out.reason, out.detail)


def test_search_r1_verl_parquet_row_keeps_its_target(tmp_path):
    """A row in Search-R1's own verl parquet shape (scripts/data_process/nq_search.py), with a `response` beside it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    prompt = [{"role": "user", "content": "Answer the given question. ... Question: who wrote hamlet?\n"}]
    row = {"data_source": "nq", "prompt": prompt, "ability": "fact-reasoning", "response": _R1["response"],
           "reward_model": {"style": "rule", "ground_truth": {"target": ["Shakespeare", "William Shakespeare"]}},
           "extra_info": {"split": "train", "index": 0}}
    p = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist([row]), p)
    rec = _one(f"search-r1:{p}")
    assert rec["task"] == "who wrote hamlet?" and rec["answer"] == ["Shakespeare", "William Shakespeare"]


def test_a_canonical_records_answer_is_a_string_a_list_of_strings_or_null(tmp_path):
    from data_prep.schema import RecordError

    rec = _canonical({"role": "tool", "content": "d", "tool_call_id": "c0", "name": "search"})
    for answer in ("W", ["W", "Will"], None):
        validate_record(rec | {"answer": answer})
    p = tmp_path / "c.jsonl"
    p.write_text(json.dumps(rec | {"answer": ["W", "Will"]}) + "\n")
    assert _one(f"canonical:{p}")["answer"] == ["W", "Will"]
    for answer in ([], ["W", 1], 5, {"a": "W"}):
        with pytest.raises(RecordError, match="answer is .*expected a str, a non-empty list of str or null"):
            validate_record(rec | {"answer": answer})


BAD_ROWS = {
    "malformed_json": '{"messages": [ this is not json',
    "empty_conversation": json.dumps({"id": "e", "messages": []}),
    "no_assistant_turn": json.dumps({"id": "na", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}),
    "unparseable_tool_call": json.dumps({"id": "up", "messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "x <function=bash>\n<parameter=cmd>ls"}]}),
    "no_finish_call": json.dumps({"id": "nf", "messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "x\n<function=execute_bash>\n  <parameter=cmd>ls</parameter>\n</function>"}, {"role": "user", "content": "out"}]}),
    "unknown_role": json.dumps({"id": "ur", "messages": [{"role": "narrator", "content": "u"}]}),
    "non_string_content": json.dumps({"id": "ns", "messages": [{"role": "user", "content": 5}]}),
}


def write_bad_file(path):
    from data_prep.synthetic import SyntheticConfig, code_rows

    good = code_rows(1, 0, SyntheticConfig())[0]
    lines = [json.dumps(good)] + list(BAD_ROWS.values())
    path.write_text("\n".join(lines) + "\n")
    return path


def test_every_bad_input_kind_is_quarantined(tmp_path):
    p = write_bad_file(tmp_path / "bad.jsonl")
    outs = list(read_source(f"r2e-gym:{p}"))
    assert len(outs) == 1 + len(BAD_ROWS)
    reasons = sorted(o.reason for o in outs if o.reason)
    assert reasons == sorted(BAD_ROWS)
    assert sum(o.record is not None for o in outs) == 1
    bad = next(o for o in outs if o.reason == "malformed_json")
    assert bad.where.endswith("bad.jsonl:2")


def test_canonical_source_roundtrip_and_envs_export(tmp_path):
    from data_prep.synthetic import SyntheticConfig, write_sources

    specs = write_sources(tmp_path, seed=0, code_n=2, search_n=2, cfg=SyntheticConfig())
    recs = [o.record for d in ("code", "search") for s in specs[d] for o in read_source(s)]
    p = tmp_path / "canon.jsonl"
    blank = {**recs[2], "id": "blank", "messages": [*recs[2]["messages"][:-1], {"role": "assistant", "content": "Final answer: \n"}]}
    p.write_text("".join(json.dumps(r) + "\n" for r in [*recs, {**recs[0], "id": "bad", "messages": []}, blank]))
    outs = list(read_source(f"canonical:{p}"))
    assert [o.record for o in outs[:-2]] == recs
    assert [o.reason for o in outs[-2:]] == ["empty_conversation", "no_final_answer"]  # a `Final answer:` line with no answer
    envs = pytest.importorskip("envs.search_plan_act")
    q = tmp_path / "spa.jsonl"
    assert envs.export_trajectories(q, 2, seed=0) == 2
    got = list(read_source(f"canonical:{q}"))
    assert all(o.reason is None and o.record["domain"] == "search" for o in got)


def test_hub_id_goes_through_datasets(monkeypatch):
    """Hub ids (optionally ID#split) are loaded with datasets.load_dataset (stubbed: no network)."""
    import datasets

    from data_prep.synthetic import SyntheticConfig, code_rows

    calls = []

    def fake_load(path, split=None):
        calls.append((path, split))
        return code_rows(2, 0, SyntheticConfig())

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    src = parse_source("r2e-gym:R2E-Gym/R2EGym-SFT-Trajectories#train")
    assert not src.is_local and src.identity() == {"format": "r2e-gym", "hub_id": "R2E-Gym/R2EGym-SFT-Trajectories", "split": "train"}
    outs = list(read_source(src))
    assert calls == [("R2E-Gym/R2EGym-SFT-Trajectories", "train")]
    assert [o.id for o in outs] == ["R2E-Gym/R2EGym-SFT-Trajectories#train[0]", "R2E-Gym/R2EGym-SFT-Trajectories#train[1]"]
    assert all(o.record for o in outs)


def test_reasoning_switch_content():
    rec = next(read_source(f"r2e-gym:{shared_path('formats', 'examples', 'r2egym_sft.constructed_skeleton.json')}",
                           reasoning="content")).record
    a = rec["messages"][2]
    assert "reasoning_content" not in a and a["content"].startswith("I need to understand")


def test_json_lines_in_a_json_file_are_rows(tmp_path):
    """A .json file holding JSON Lines (as the Hub names many, and datasets.load_dataset reads them) was one
    malformed row: 3 records read as 1, rejected as malformed_json. Each line is a row (a bad one rejected alone,
    naming its line); a .json file of one value is read as before, and one that is neither is one rejection."""
    from data_prep.synthetic import SyntheticConfig, code_rows

    rows = code_rows(3, 0, SyntheticConfig())
    p = tmp_path / "train.json"
    p.write_text(json.dumps(rows[0]) + "\n\n" + json.dumps(rows[1]) + "\n{oops\n" + json.dumps(rows[2]) + "\n")
    out = list(read_source(f"r2e-gym:{p}"))
    assert [(o.where, o.reason) for o in out] == [(f"{p}:1", None), (f"{p}:3", None), (f"{p}:4", "malformed_json"), (f"{p}:5", None)]
    assert [o.id for o in out] == ["train.json:1", "train.json:3", "train.json:4", "train.json:5"]
    p.write_text(json.dumps(rows, indent=2))   # one value: a list of rows
    assert [(o.where, o.reason) for o in read_source(f"r2e-gym:{p}")] == [(f"{p}[{i}]", None) for i in range(3)]
    p.write_text("{not json at all\n")
    assert [(o.where, o.reason) for o in read_source(f"r2e-gym:{p}")] == [(str(p), "malformed_json")]


def test_a_compressed_data_file_in_a_source_dir_is_refused_not_skipped(tmp_path):
    """A source directory holding part-0.jsonl and part-1.jsonl.gz read part-0 only: 3 of 6 rows, the other 3 counted
    nowhere. A data file it does not read (compressed, or .arrow) is refused naming it; other files (README.md,
    .gitattributes) are not data and are left alone, as before."""
    import gzip

    from data_prep.synthetic import SyntheticConfig, code_rows

    rows = code_rows(6, 0, SyntheticConfig())
    d = tmp_path / "src"
    d.mkdir()
    (d / "part-0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:3]))
    (d / "README.md").write_text("# a dataset\n")
    assert len(list(read_source(f"r2e-gym:{d}"))) == 3
    with gzip.open(d / "part-1.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows[3:]))
    with pytest.raises(SourceError, match=rf"{d / 'part-1.jsonl.gz'}: a data file .*not read.*decompress it or move it out"):
        parse_source(f"r2e-gym:{d}")
    (d / "part-1.jsonl.gz").unlink()
    (d / "cache-0.arrow").write_bytes(b"")
    with pytest.raises(SourceError, match="cache-0.arrow: a data file"):
        parse_source(f"r2e-gym:{d}")
