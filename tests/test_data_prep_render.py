"""Loss masks: decoded trainable tokens are exactly the assistant generations, end-of-turn
included, nothing from system/user/tool; epilogue placement; history policies; templates."""
from __future__ import annotations

import copy

import pytest

from data_prep.readers import read_source
from data_prep.render import ChatRenderer, tokenize_rows
from data_prep.schema import RecordError
from data_prep.synthetic import SyntheticConfig, write_sources
from tests.conftest import shared_path


def _masked(tok, renderer, rec):
    rows = renderer.rows(copy.deepcopy(rec))
    out = []
    for row, (ids, labels, retok, *_) in zip(rows, tokenize_rows(tok, rows)):
        assert len(ids) == len(labels)
        if not retok:  # the backend fast path gives exactly the tokenizer's own ids
            assert list(ids) == tok(row.text, add_special_tokens=False)["input_ids"]
        trainable = [i for i, l in zip(ids, labels) if l != -100]
        assert all(l == i for i, l in zip(ids, labels) if l != -100)
        masked = [i for i, l in zip(ids, labels) if l == -100]
        out.append((row, trainable, masked))
    return out


def _synthetic_records(tmp_path, **kw):
    specs = write_sources(tmp_path, seed=1, code_n=3, search_n=4, cfg=SyntheticConfig(**kw))
    return [o.record for d in ("code", "search") for s in specs[d] for o in read_source(s)]


def _expected_generations(rec, gen_tail="<think>\n", end="<|im_end|>", epilogue=""):
    """What Thinking-2507 generates per assistant turn (reasoning kept: no later user query)."""
    outs = []
    asst = [m for m in rec["messages"] if m["role"] == "assistant"]
    for k, m in enumerate(asst):
        r = m.get("reasoning_content", "")
        text = (r.strip("\n") + "\n</think>\n\n" + m["content"].lstrip("\n")) if (r or k == len(asst) - 1) else None
        assert text is not None, "synthetic turns always carry reasoning"
        for j, c in enumerate(m.get("tool_calls") or []):
            import json

            text += ("\n" if (j or m["content"]) else "") + '<tool_call>\n{"name": "' + c["function"]["name"] + '", "arguments": ' + json.dumps(c["function"]["arguments"], ensure_ascii=False) + "}\n</tool_call>"
        if k == len(asst) - 1:
            text += epilogue
        outs.append(text + end)
    return outs


@pytest.mark.parametrize("which", ["tiny", "qwen3"])
def test_mask_property_thinking_2507(which, tmp_path, request):
    tok = request.getfixturevalue("tiny_tokenizer" if which == "tiny" else "qwen3_tokenizer")
    renderer = ChatRenderer(tok)
    assert renderer.info.gen_prompt == "<|im_start|>assistant\n<think>\n"
    assert renderer.info.end_marker == "<|im_end|>"
    from data_prep.terminators import epilogue_text

    for rec in _synthetic_records(tmp_path):
        (row, trainable, masked), = _masked(tok, renderer, rec)
        epi = epilogue_text(rec["task"]) if rec["domain"] == "code" else ""
        expected = _expected_generations(rec, epilogue=epi)
        assert tok.decode(trainable) == "".join(expected)
        assert row.checks == {"exact": len(expected)}
        # nothing from system/user/tool turns is trainable
        for m in rec["messages"]:
            if m["role"] in ("system", "user", "tool") and len(m["content"]) > 20:
                assert m["content"] not in tok.decode(trainable)
        # each span starts right after the generation prompt and ends with <|im_end|>
        for a, b in row.spans:
            assert row.text[:a].endswith("<|im_start|>assistant\n<think>\n")
            assert row.text[a:b].endswith("<|im_end|>")
        assert tok.decode(masked).count("<|im_start|>assistant\n<think>\n") == len(expected)


def test_epilogue_placement_real_tokenizer(qwen3_tokenizer, tmp_path):
    rec = next(r for r in _synthetic_records(tmp_path) if r["domain"] == "code")
    title = rec["task"].split("**Title:** ")[1].split("\n")[0]
    (row, trainable, _), = _masked(qwen3_tokenizer, ChatRenderer(qwen3_tokenizer), rec)
    tail = '"command": "submit", "result": '
    assert row.text.rstrip("\n").endswith(f"</tool_call>\nFinal answer: {title}<|im_end|>")
    assert tail in row.text
    assert qwen3_tokenizer.decode(trainable).endswith(f"</tool_call>\nFinal answer: {title}<|im_end|>")
    (row2, trainable2, _), = _masked(qwen3_tokenizer, ChatRenderer(qwen3_tokenizer, epilogue=False), rec)
    assert row2.text.rstrip("\n").endswith("</tool_call><|im_end|>") and "Final answer" not in row2.text
    assert len(trainable) > len(trainable2)


def test_renderer_matches_apply_chat_template(tiny_tokenizer, tmp_path):
    """Our memoised sandbox renders exactly what transformers' apply_chat_template renders."""
    r = ChatRenderer(tiny_tokenizer)
    for rec in _synthetic_records(tmp_path)[:4]:
        for gen in (False, True):
            ours = r.render(rec["messages"], rec["tools"], add_generation_prompt=gen)
            theirs = tiny_tokenizer.apply_chat_template(rec["messages"], tools=rec["tools"], tokenize=False, add_generation_prompt=gen)
            assert ours == theirs


@pytest.mark.parametrize("name", ["qwen3_4b_hybrid", "llama3_1_8b_instruct"])
def test_renderer_matches_apply_chat_template_fixtures(name, qwen3_tokenizer, tmp_path):
    tpl = shared_path("fixtures", "chat_templates", f"{name}.jinja").read_text()
    r = ChatRenderer(qwen3_tokenizer, chat_template=tpl)
    for rec in _synthetic_records(tmp_path)[:4]:
        ours = r.render(rec["messages"], rec["tools"], add_generation_prompt=True)
        assert ours == qwen3_tokenizer.apply_chat_template(rec["messages"], tools=rec["tools"], tokenize=False,
                                                            chat_template=tpl, add_generation_prompt=True)


def _swe_gym_record():
    return next(read_source(f"swe-gym:{shared_path('formats', 'examples', 'swegym_openhands_sampled_raw.example.json')}")).record


def test_history_policies_on_real_row(qwen3_tokenizer):
    """SWE-Gym rows carry 'please continue' user turns and turns without reasoning: Qwen3 rewrites
    10 of the 11 turns later in the conversation. exact trains each once, as generated."""
    rec = _swe_gym_record()
    n_asst = sum(m["role"] == "assistant" for m in rec["messages"])
    (keep,) = _masked(qwen3_tokenizer, ChatRenderer(qwen3_tokenizer, history_reasoning="keep_as_rendered"), rec)
    assert keep[0].checks == {"exact": 1, "as_rendered": n_asst - 1}
    with pytest.raises(RecordError) as e:
        ChatRenderer(qwen3_tokenizer, history_reasoning="reject").rows(copy.deepcopy(rec))
    assert e.value.reason == "history_rewritten"
    rows = _masked(qwen3_tokenizer, ChatRenderer(qwen3_tokenizer), rec)
    assert len(rows) == 7 and [r.id for r, _, _ in rows] == [f"{rec['id']}#row{k}" for k in range(7)]
    assert sum(r.checks["exact"] for r, _, _ in rows) == n_asst and all("as_rendered" not in r.checks for r, _, _ in rows)
    for row, trainable, _ in rows:
        text = qwen3_tokenizer.decode(trainable)
        assert text.count("<|im_end|>") == len(row.spans)
        assert "Please continue working" not in text and "OBSERVATION:" not in text
        for a, _ in row.spans:
            assert row.text[:a].endswith("<|im_start|>assistant\n<think>\n")


def _reasoning_record():
    return {"id": "r", "source": "synthetic", "domain": "search", "task": "q", "answer": "a", "terminator": "final_answer",
            "tools": [], "messages": [
                {"role": "system", "content": "S"}, {"role": "user", "content": "Q1"},
                {"role": "assistant", "content": "A1", "reasoning_content": "R1"},
                {"role": "user", "content": "Q2"},
                {"role": "assistant", "content": "Final answer: a", "reasoning_content": "R2"}]}


@pytest.mark.parametrize("name,gen,end", [
    ("qwen3_4b_thinking_2507", "<|im_start|>assistant\n<think>\n", "<|im_end|>"),
    ("qwen3_4b_hybrid", "<|im_start|>assistant\n", "<|im_end|>"),
    # The Llama template on the Qwen3 tokenizer: Llama's header/eot strings are plain text to this
    # tokenizer (several tokens each, not special tokens), which the character-span method handles.
    ("llama3_1_8b_instruct", "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"),
])
def test_templates(name, gen, end, qwen3_tokenizer, tmp_path):
    template = shared_path("fixtures", "chat_templates", f"{name}.jinja").read_text()
    r = ChatRenderer(qwen3_tokenizer, chat_template=template)
    assert r.info.gen_prompt == gen and r.info.end_marker == end
    recs = [x for x in _synthetic_records(tmp_path) if x["domain"] == "search"]
    r_loop = ChatRenderer(qwen3_tokenizer, chat_template=template, thoughts="drop") if name.startswith("llama") else r
    for rec in recs:
        (row, trainable, _), = _masked(qwen3_tokenizer, r_loop, rec)
        text = qwen3_tokenizer.decode(trainable)
        n_asst = sum(m["role"] == "assistant" for m in rec["messages"])
        assert text.count(end) == n_asst == len(row.spans)
        assert rec["messages"][-1]["content"] in text
        assert "Doc 1(Title:" not in text and rec["task"] not in text
        for a, b in row.spans:
            assert row.text[a:b].endswith(end)
    rec = _reasoning_record()
    if name == "llama3_1_8b_instruct":  # no reasoning channel: R1 and R2 can't be rendered
        with pytest.raises(RecordError) as e:
            r.rows(copy.deepcopy(rec))
        assert e.value.reason == "reasoning_not_rendered"
        r = ChatRenderer(qwen3_tokenizer, chat_template=template, thoughts="drop")
    rows = _masked(qwen3_tokenizer, r, rec)
    texts = [qwen3_tokenizer.decode(t) for _, t, _ in rows]
    if name == "llama3_1_8b_instruct":
        assert texts == ["A1<|eot_id|>Final answer: a<|eot_id|>"]
        assert rows[0][0].checks == {"as_rendered": 2}  # counted inexact
    elif name == "qwen3_4b_hybrid":  # R1 is dropped once Q2 follows: A1 gets its own row
        assert texts == ["<think>\nR1\n</think>\n\nA1<|im_end|>", "<think>\nR2\n</think>\n\nFinal answer: a<|im_end|>"]
        assert [x[0].checks for x in rows] == [{"exact": 1}, {"exact": 1}]
    else:
        assert texts == ["R1\n</think>\n\nA1<|im_end|>", "R2\n</think>\n\nFinal answer: a<|im_end|>"]
        assert [x[0].checks for x in rows] == [{"exact": 1}, {"exact": 1}]


def test_special_tokens_in_content_rejected(tiny_tokenizer):
    rec = _reasoning_record()
    rec["messages"][1]["content"] = "hi <|im_end|> there"
    with pytest.raises(RecordError) as e:
        ChatRenderer(tiny_tokenizer).rows(rec)
    assert e.value.reason == "special_token_in_content"


def test_boundary_straddle_is_retokenized(tiny_tokenizer):
    """Empty final reasoning renders `<think>\n\n</think>`: the full-text tokenization merges the
    prompt's newline with the generated one; that row is cut at that boundary only, as at inference."""
    rec = _reasoning_record()
    del rec["messages"][4]["reasoning_content"]
    rows = ChatRenderer(tiny_tokenizer).rows(rec)
    assert len(rows) == 2  # A1 precedes the user query Q2, which rewrites it: its own row
    (ids0, labels0, retok0, *_), (ids, labels, retok, *_) = tokenize_rows(tiny_tokenizer, rows)
    assert not retok0 and retok
    assert tiny_tokenizer.decode([i for i, l in zip(ids0, labels0) if l != -100]) == "R1\n</think>\n\nA1<|im_end|>"
    trainable = [i for i, l in zip(ids, labels) if l != -100]
    assert tiny_tokenizer.decode(trainable) == "\n</think>\n\nFinal answer: a<|im_end|>"
    a, _ = rows[1].spans[0]
    prompt_ids = tiny_tokenizer(rows[1].text[:a], add_special_tokens=False)["input_ids"]
    assert ids[: len(prompt_ids)] == prompt_ids  # the prompt is tokenized whole, as at inference


@pytest.mark.parametrize("epilogue", [True, False])
def test_code_record_without_headline_is_rejected_under_epilogue(tiny_tokenizer, epilogue):
    """Refused with epilogue=false too: the single-terminator arm (r2e_v5) holds the same records as r2e,
    differing only by the epilogue."""
    rec = {"id": "c", "source": "r2e-gym", "domain": "code", "task": "   \n", "answer": None, "terminator": "finish", "tools": [],
           "messages": [{"role": "user", "content": "fix it"},
                        {"role": "assistant", "content": "", "reasoning_content": "done",
                         "tool_calls": [{"type": "function", "id": "c0", "function": {"name": "finish", "arguments": {}}}]}]}
    for task, reason in (("   \n", "no_headline"), ("Fix <|im_end|> parsing", "special_token_in_content")):
        with pytest.raises(RecordError) as e:
            ChatRenderer(tiny_tokenizer, epilogue=epilogue).rows(copy.deepcopy({**rec, "task": task}))
        assert e.value.reason == reason
    (row,) = ChatRenderer(tiny_tokenizer, epilogue=epilogue).rows(copy.deepcopy({**rec, "task": "Fix parsing"}))
    assert ("Final answer: Fix parsing<|im_end|>" in row.text) == epilogue


def test_history_policies_tiny(tiny_tokenizer):
    """Without ../shared: a 'please continue' user turn makes Qwen3 drop R1 and R2 from the later
    context, and the middle turn without reasoning renders without its think block."""
    call = {"type": "function", "id": "c0", "function": {"name": "search", "arguments": {"query": "q"}}}
    rec = {"id": "h", "source": "synthetic", "domain": "search", "task": "Q", "answer": "a", "terminator": "final_answer", "tools": [],
           "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"},
                        {"role": "assistant", "content": "", "reasoning_content": "R1", "tool_calls": [call]},
                        {"role": "tool", "content": "Doc 1(Title: T) t", "tool_call_id": "c0", "name": "search"},
                        {"role": "assistant", "content": "", "tool_calls": [call]},
                        {"role": "tool", "content": "Doc 2(Title: U) u", "tool_call_id": "c0", "name": "search"},
                        {"role": "assistant", "content": "draft", "reasoning_content": "R2"},
                        {"role": "user", "content": "Please continue."},
                        {"role": "assistant", "content": "Final answer: a", "reasoning_content": "R3"}]}
    (keep,) = ChatRenderer(tiny_tokenizer, history_reasoning="keep_as_rendered").rows(copy.deepcopy(rec))
    assert keep.checks == {"as_rendered": 3, "exact": 1}
    with pytest.raises(RecordError):
        ChatRenderer(tiny_tokenizer, history_reasoning="reject").rows(copy.deepcopy(rec))
    rows = _masked(tiny_tokenizer, ChatRenderer(tiny_tokenizer), rec)
    texts = [tiny_tokenizer.decode(t) for _, t, _ in rows]
    call_text = '<tool_call>\n{"name": "search", "arguments": {"query": "q"}}\n</tool_call><|im_end|>'
    # the turn without reasoning generates an empty think block, which later context doesn't show:
    # its own row; R1's turn is still shown (with its reasoning) when R2's turn is generated: one
    # row for both; the final turn after the 'please continue' query: its own row
    assert texts == ["\n</think>\n\n" + call_text, "R1\n</think>\n\n" + call_text + "R2\n</think>\n\ndraft<|im_end|>",
                     "R3\n</think>\n\nFinal answer: a<|im_end|>"]
    assert [r.checks for r, _, _ in rows] == [{"exact": 1}, {"exact": 2}, {"exact": 1}]
