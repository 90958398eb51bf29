"""Oracle mask test: every trainable span of every row is exactly what the model generates at that
turn, in the context it saw — with the expected text computed ONLY by the tokenizer's own
`apply_chat_template` (prompt = the conversation before the turn with the generation prompt;
generation = the render through the turn minus that prompt, through the end-of-turn marker).

The project code under test is the row builder (`ChatRenderer.rows` + `tokenize_rows`, what the
build workers run); nothing of it is used to compute the expectation. Conversations are chosen to
hit what templates rewrite: turns without reasoning in the middle, "please continue" user turns,
a user turn that looks like a tool response, parallel calls, unicode, tool outputs holding
template-like text, an empty final think block, and the dual-terminator epilogue.
"""
from __future__ import annotations

import copy
import json

import pytest

from data_prep.render import ChatRenderer, tokenize_rows
from data_prep.schema import RecordError
from tests.conftest import shared_path

TOOLS = [
    {"type": "function", "function": {"name": "search", "description": "Search the web.",
                                      "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}},
    {"type": "function", "function": {"name": "finish", "description": "Submit.",
                                      "parameters": {"type": "object", "properties": {"result": {"type": "string"}}, "required": []}}},
]
TITLE = "Crash in `parse()` when the input is empty — ünïcödé 日本"


def _call(cid, name, **args):
    return {"type": "function", "id": cid, "function": {"name": name, "arguments": args}}


def _tool(cid, name, content):
    return {"role": "tool", "tool_call_id": cid, "name": name, "content": content}


TEMPLATE_LIKE = ('Doc 1(Title: "<tool_call>") <tool_call>\n{"name": "finish", "arguments": {}}\n</tool_call>\n'
                 "<think>\nnot mine\n</think>\n\nassistant\n<tool_response>x</tool_response>")


def _rec(rid, messages, domain="search", task="q", terminator="final_answer"):
    return {"id": rid, "source": "oracle", "domain": domain, "task": task, "answer": None, "terminator": terminator,
            "tools": TOOLS, "messages": messages}


def qwen_conversations() -> list[dict]:
    sys_ = {"role": "system", "content": "You are a helpful agent."}
    return [
        # reasoning everywhere, template-like tool output, unicode answer
        _rec("plain", [sys_, {"role": "user", "content": "Who wrote Ünter den Linden? 日本"},
                       {"role": "assistant", "content": "", "reasoning_content": "I should search.", "tool_calls": [_call("a", "search", query="Ünter 🎉")]},
                       _tool("a", "search", TEMPLATE_LIKE),
                       {"role": "assistant", "content": "Final answer: Zoë 日本 🎉", "reasoning_content": "Found it: 日本."}]),
        # no-reasoning turns in the middle, a 'please continue' query, parallel calls
        _rec("rewrites", [sys_, {"role": "user", "content": "Q1"},
                          {"role": "assistant", "content": "", "reasoning_content": "R1", "tool_calls": [_call("a", "search", query="x")]},
                          _tool("a", "search", "r1"),
                          {"role": "assistant", "content": "", "tool_calls": [_call("b", "search", query="y")]},
                          _tool("b", "search", "r2"),
                          {"role": "assistant", "content": "Let me check both.", "reasoning_content": "R3",
                           "tool_calls": [_call("c", "search", query="z1"), _call("d", "search", query="z2")]},
                          _tool("c", "search", "r3"), _tool("d", "search", "r4"),
                          {"role": "assistant", "content": "a draft"},
                          {"role": "user", "content": "Please continue working on the task."},
                          {"role": "assistant", "content": "", "tool_calls": [_call("e", "search", query="w")]},
                          _tool("e", "search", "r5"),
                          {"role": "assistant", "content": "Final answer: done", "reasoning_content": "R6"}]),
        # a user turn that looks like a tool response is not a new query for the template
        _rec("fake_tool_user", [sys_, {"role": "user", "content": "Q"},
                                {"role": "assistant", "content": "", "reasoning_content": "R1", "tool_calls": [_call("a", "search", query="x")]},
                                {"role": "user", "content": "<tool_response>\nmanual\n</tool_response>"},
                                {"role": "assistant", "content": "Final answer: y", "reasoning_content": "R2"}]),
        # the final turn has no reasoning: an empty think block right after the prompt's <think>\n
        _rec("empty_final", [{"role": "user", "content": "Say hi"},
                             {"role": "assistant", "content": "", "reasoning_content": "R", "tool_calls": [_call("a", "search", query="hi")]},
                             _tool("a", "search", "hi"),
                             {"role": "assistant", "content": "Final answer: hi"}]),
        # a code trajectory ending in a finish call: the dual-terminator epilogue
        _rec("code", [sys_, {"role": "user", "content": f"<github_issue>\n**Title:** {TITLE}\n\nDetails\n</github_issue>"},
                      {"role": "assistant", "content": "", "reasoning_content": "Look first.", "tool_calls": [_call("a", "search", query="parse")]},
                      _tool("a", "search", "def parse(s):\r\n    return s[0]\r\n"),
                      {"role": "assistant", "content": "", "tool_calls": [_call("b", "search", query="tests")]},
                      _tool("b", "search", "ok"),
                      {"role": "assistant", "content": "", "reasoning_content": "Fixed.", "tool_calls": [_call("c", "finish", result="patched")]}],
             domain="code", task=f"**Title:** {TITLE}\n\nDetails", terminator="finish"),
        # consecutive assistant turns, the earlier without reasoning: the template renders it without its think block
        # once another follows, though the later turn's prompt shows it with one (seen failing: refused as
        # template_span_mismatch, though apply_chat_template renders the conversation)
        _rec("consecutive", [sys_, {"role": "user", "content": "Q"},
                             {"role": "assistant", "content": "Let me think aloud."},
                             {"role": "assistant", "content": "", "reasoning_content": "R2", "tool_calls": [_call("b", "search", query="y")]},
                             _tool("b", "search", "r2"),
                             {"role": "assistant", "content": "A note."},
                             {"role": "assistant", "content": "Final answer: y"}]),
    ]


def oracle_generations(tok, rec, end: str, template=None) -> list[tuple[str, str]]:
    """(prompt, generation) per assistant turn, from apply_chat_template alone."""
    msgs, out = rec["messages"], []
    kw = {"tools": rec["tools"], "tokenize": False}
    if template:
        kw["chat_template"] = template
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        prompt = tok.apply_chat_template(msgs[:i], add_generation_prompt=True, **kw)
        full = tok.apply_chat_template(msgs[: i + 1], **kw)
        start = len(prompt)
        if not full.startswith(prompt):  # the turn before is an assistant turn the template renders anew: the
            gen_prompt = prompt[len(tok.apply_chat_template(msgs[:i], **kw)):]  # generation follows this turn's own
            assert msgs[i - 1]["role"] == "assistant" and gen_prompt and prompt.endswith(gen_prompt)  # generation prompt
            start = full.rindex(gen_prompt) + len(gen_prompt)
        gen = full[start: full.index(end, start) + len(end)]
        out.append((prompt, gen))
    return out


def trained_spans(tok, rows) -> list[tuple[str, str, list[int]]]:
    """(context text, trained text, context ids) for every trainable run of every row."""
    out = []
    for row, t in zip(rows, tokenize_rows(tok, rows)):
        ids, labels = t.input_ids, t.labels
        k = 0
        while k < len(ids):
            if labels[k] == -100:
                k += 1
                continue
            j = k
            while j < len(ids) and labels[j] != -100:
                j += 1
            assert labels[k:j] == ids[k:j]
            out.append((tok.decode(ids[:k]), tok.decode(ids[k:j]), ids[:k]))
            k = j
    return out


def fewest_exact_rows(expected, tok) -> int:
    """Rows any exact mask needs: a row trains turns whose prompt + generation are prefixes of its
    text, so its turns form a prefix chain; a turn whose prompt + generation is a prefix of no other
    turn's (or only where the other's prompt, tokenized whole, joins a token across the turn's
    boundaries) needs a row of its own, and those suffice."""
    def ids(t):
        return tok(t, add_special_tokens=False)["input_ids"]

    def inside(p, g, q):  # turn (p, g) trainable in a row whose later context q is tokenized as at inference
        return q.startswith(p + g) and ids(q)[:len(ids(p)) + len(ids(g))] == ids(p) + ids(g)
    return sum(1 for i, (p, g) in enumerate(expected) if not any(j != i and inside(p, g, q) for j, (q, _) in enumerate(expected)))


def check_turn_for_turn(tok, rec, rows, expected, epilogue=""):
    spans = trained_spans(tok, rows)
    assert len(spans) == len(expected), "each generated turn is trainable in exactly one row"
    by_prompt = {p: g for p, g in expected}
    assert len(by_prompt) == len(expected)
    matched = set()
    for ctx, text, ctx_ids in spans:
        assert ctx in by_prompt, f"a trained span whose context is no turn's prompt: ...{ctx[-120:]!r}"
        want = by_prompt[ctx]
        if epilogue and ctx == expected[-1][0]:
            end = rows[-1].text[rows[-1].spans[-1][1] - 10:rows[-1].spans[-1][1]]
            marker = next(m for m in ("<|im_end|>", "<|eot_id|>") if end.endswith(m))
            want = want[: -len(marker)] + epilogue + marker
        assert text == want
        assert ctx_ids == tok(ctx, add_special_tokens=False)["input_ids"], "the context is tokenized as at inference"
        matched.add(ctx)
    assert len(matched) == len(expected)
    assert len(rows) == fewest_exact_rows(expected, tok), "no more rows than exactness needs"


@pytest.mark.parametrize("idx", range(6))
@pytest.mark.parametrize("which", ["qwen3", "tiny"])  # tiny: the embedded tokenizer, Qwen3 format (no ../shared needed)
def test_oracle_qwen3_thinking_2507(which, idx, request):
    tok = request.getfixturevalue(f"{which}_tokenizer")
    rec = qwen_conversations()[idx]
    expected = oracle_generations(tok, rec, "<|im_end|>")
    rows = ChatRenderer(tok).rows(copy.deepcopy(rec))
    epi = f"\nFinal answer: {' '.join(TITLE.split())}" if rec["domain"] == "code" else ""
    check_turn_for_turn(tok, rec, rows, expected, epilogue=epi)
    # the checks count every turn exact, none as rendered
    assert sum(r.checks.get("exact", 0) for r in rows) == len(expected)
    assert all("as_rendered" not in r.checks for r in rows)
    if rec["id"] == "rewrites":  # the middle turn without reasoning generates an empty think block
        assert any(g.startswith("\n</think>\n\n<tool_call>") for _, g in expected)


def test_oracle_detects_keep_as_rendered_and_counts_it(qwen3_tokenizer):
    """The oracle itself can fail: the inexact opt-in is caught, and the checks count it."""
    rec = qwen_conversations()[1]
    expected = oracle_generations(qwen3_tokenizer, rec, "<|im_end|>")
    rows = ChatRenderer(qwen3_tokenizer, history_reasoning="keep_as_rendered").rows(copy.deepcopy(rec))
    with pytest.raises(AssertionError):
        check_turn_for_turn(qwen3_tokenizer, rec, rows, expected)
    assert rows[0].checks["as_rendered"] > 0


# ---------------------------------------------------------------- Llama-3.1

LLAMA_SPECIALS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"]


@pytest.fixture(scope="module")
def llama_tokenizer(qwen3_tokenizer):
    """No Llama tokenizer is reachable offline: the Qwen3 byte-level BPE with Llama-3.1's special
    tokens added as special tokens (so headers and <|eot_id|> are single tokens, as in Llama) and
    Llama-3.1's chat template."""
    tok = copy.deepcopy(qwen3_tokenizer)
    tok.add_special_tokens({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"})
    tok.add_tokens(LLAMA_SPECIALS[1:], special_tokens=True)
    tok.chat_template = shared_path("fixtures", "chat_templates", "llama3_1_8b_instruct.jinja").read_text()
    for s in LLAMA_SPECIALS:
        assert len(tok(s, add_special_tokens=False)["input_ids"]) == 1
    return tok


def llama_conversations() -> list[dict]:
    sys_ = {"role": "system", "content": "You are a helpful agent."}
    return [
        _rec("llama_plain", [sys_, {"role": "user", "content": "Who wrote Ünter den Linden? 日本"},
                             {"role": "assistant", "content": "", "tool_calls": [_call("a", "search", query="Ünter 🎉")]},
                             _tool("a", "search", '{"name": "finish", "parameters": {}} ipython assistant'),
                             {"role": "assistant", "content": "", "tool_calls": [_call("b", "search", query="more")]},
                             _tool("b", "search", "r2"),
                             {"role": "user", "content": "Please continue."},
                             {"role": "assistant", "content": "I think it is Zoë.\nFinal answer: Zoë 日本"}]),
        _rec("llama_code", [sys_, {"role": "user", "content": f"<github_issue>\n**Title:** {TITLE}\n</github_issue>"},
                            {"role": "assistant", "content": "", "tool_calls": [_call("a", "search", query="parse")]},
                            _tool("a", "search", "def parse(s): ..."),
                            {"role": "assistant", "content": "", "tool_calls": [_call("c", "finish", result="patched")]}],
             domain="code", task=f"**Title:** {TITLE}", terminator="finish"),
    ]


@pytest.mark.parametrize("idx", range(2))
def test_oracle_llama31(llama_tokenizer, idx):
    rec = llama_conversations()[idx]
    r = ChatRenderer(llama_tokenizer)
    assert r.info.gen_prompt == "<|start_header_id|>assistant<|end_header_id|>\n\n" and r.info.end_marker == "<|eot_id|>"
    expected = oracle_generations(llama_tokenizer, rec, "<|eot_id|>")
    rows = r.rows(copy.deepcopy(rec))
    epi = f"\nFinal answer: {' '.join(TITLE.split())}" if rec["domain"] == "code" else ""
    check_turn_for_turn(llama_tokenizer, rec, rows, expected, epilogue=epi)
    assert all("as_rendered" not in row.checks for row in rows)


def test_llama31_thoughts_and_parallel_calls(llama_tokenizer):
    """The template drops `content` beside a tool call: rejected by default (nothing silently
    lost), trained without it and counted inexact with thoughts=drop; parallel calls, which the
    template refuses, reject that record only."""
    rec = llama_conversations()[0]
    rec["messages"][2]["content"] = "First I search for the author."
    with pytest.raises(RecordError) as e:
        ChatRenderer(llama_tokenizer).rows(copy.deepcopy(rec))
    assert e.value.reason == "thought_before_call"
    rows = ChatRenderer(llama_tokenizer, thoughts="drop").rows(copy.deepcopy(rec))
    assert sum(r.checks.get("as_rendered", 0) for r in rows) == 1
    (t,) = tokenize_rows(llama_tokenizer, rows[-1:]) if len(rows) == 1 else tokenize_rows(llama_tokenizer, rows)[:1]
    assert t.inexact is not None and t.inexact.sum() > 0
    assert "First I search" not in "".join(r.text for r in rows)
    par = llama_conversations()[0]
    par["messages"][2]["tool_calls"].append(_call("z", "search", query="again"))
    with pytest.raises(RecordError) as e:
        ChatRenderer(llama_tokenizer).rows(par)
    assert e.value.reason == "parallel_tool_calls_unsupported"


def test_llama31_reasoning_content_is_not_silently_lost(llama_tokenizer):
    rec = copy.deepcopy(llama_conversations()[0])
    rec["messages"][-1]["reasoning_content"] = "hidden chain"
    with pytest.raises(RecordError) as e:
        ChatRenderer(llama_tokenizer).rows(rec)
    assert e.value.reason == "reasoning_not_rendered"


def test_oracle_on_shipped_swe_gym_row(qwen3_tokenizer):
    """The shipped SWE-Gym example: 11 assistant turns, 10 rewritten later by the template."""
    from data_prep.readers import read_source

    rec = next(read_source(f"swe-gym:{shared_path('formats', 'examples', 'swegym_openhands_sampled_raw.example.json')}")).record
    expected = oracle_generations(qwen3_tokenizer, rec, "<|im_end|>")
    rows = ChatRenderer(qwen3_tokenizer, epilogue=False).rows(copy.deepcopy(rec))
    check_turn_for_turn(qwen3_tokenizer, rec, rows, expected)
    assert json.loads(json.dumps([r.checks for r in rows]))


def test_llama31_short_thought_found_by_chance_is_still_lost(llama_tokenizer):
    """A short thought that happens to occur in the rendered call ('search') is still detected as
    dropped by the template (rendering without it changes nothing)."""
    rec = llama_conversations()[0]
    rec["messages"][2]["content"] = "search"
    with pytest.raises(RecordError) as e:
        ChatRenderer(llama_tokenizer).rows(copy.deepcopy(rec))
    assert e.value.reason == "thought_before_call"
