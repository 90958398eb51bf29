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
    for row, (ids, labels, retok) in zip(rows, tokenize_rows(tok, rows)):
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
        assert row.checks == {"ok": len(expected)}
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
    """SWE-Gym rows carry 'please continue' user turns: Qwen3 drops earlier reasoning there."""
    rec = _swe_gym_record()
    keep = _masked(qwen3_tokenizer, ChatRenderer(qwen3_tokenizer, history_reasoning="keep_as_rendered"), rec)
    assert len(keep) == 1 and keep[0][0].history_rewritten and keep[0][0].checks["rewritten"] > 0
    with pytest.raises(RecordError) as e:
        ChatRenderer(qwen3_tokenizer, history_reasoning="reject").rows(copy.deepcopy(rec))
    assert e.value.reason == "history_rewritten"
    per = _masked(qwen3_tokenizer, ChatRenderer(qwen3_tokenizer, history_reasoning="per_turn"), rec)
    assert len(per) == 3 and [p[0].id.rsplit("#", 1)[1] for p in per] == ["q0", "q1", "q2"]
    n_asst = sum(m["role"] == "assistant" for m in rec["messages"])
    assert sum(sum(p[0].checks.values()) for p in per) == n_asst  # every turn trained exactly once
    for row, trainable, _ in per:
        assert "rewritten" not in row.checks
        text = qwen3_tokenizer.decode(trainable)
        assert text.count("<|im_end|>") == len(row.spans)
        assert "Please continue working" not in text and "OBSERVATION:" not in text


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
    for rec in recs:
        (row, trainable, _), = _masked(qwen3_tokenizer, r, rec)
        text = qwen3_tokenizer.decode(trainable)
        n_asst = sum(m["role"] == "assistant" for m in rec["messages"])
        assert text.count(end) == n_asst == len(row.spans)
        assert rec["messages"][-1]["content"] in text
        assert "Doc 1(Title:" not in text and rec["task"] not in text
        for a, b in row.spans:
            assert row.text[a:b].endswith(end)
    (row, trainable, _), = _masked(qwen3_tokenizer, r, _reasoning_record())
    text = qwen3_tokenizer.decode(trainable)
    if name == "llama3_1_8b_instruct":
        assert text == "A1<|eot_id|>Final answer: a<|eot_id|>"
        assert row.checks == {"rewritten": 2}  # the template has no reasoning channel: R1 and R2 are lost
    elif name == "qwen3_4b_hybrid":
        assert text == "A1<|im_end|><think>\nR2\n</think>\n\nFinal answer: a<|im_end|>"
        assert row.checks == {"ok": 1, "rewritten": 1}  # R1 dropped: it precedes the last user query
    else:
        assert text == "A1<|im_end|>R2\n</think>\n\nFinal answer: a<|im_end|>"
        assert row.checks == {"ok": 1, "rewritten": 1}


def test_special_tokens_in_content_rejected(tiny_tokenizer):
    rec = _reasoning_record()
    rec["messages"][1]["content"] = "hi <|im_end|> there"
    with pytest.raises(RecordError) as e:
        ChatRenderer(tiny_tokenizer).rows(rec)
    assert e.value.reason == "special_token_in_content"


def test_boundary_straddle_is_retokenized(tiny_tokenizer):
    """Empty final reasoning renders `<think>\\n\\n</think>`: the full-text tokenization merges the
    prompt's newline with the generated one; that row is tokenized piecewise instead."""
    rec = _reasoning_record()
    del rec["messages"][4]["reasoning_content"]
    r = ChatRenderer(tiny_tokenizer)
    rows = r.rows(rec)
    (ids, labels, retok), = tokenize_rows(tiny_tokenizer, rows)
    assert retok
    trainable = [i for i, l in zip(ids, labels) if l != -100]
    assert tiny_tokenizer.decode(trainable) == "".join(rows[0].text[a:b] for a, b in rows[0].spans)
    assert tiny_tokenizer.decode(trainable).endswith("\n</think>\n\nFinal answer: a<|im_end|>")


def test_code_record_without_headline_is_rejected_under_epilogue(tiny_tokenizer):
    rec = {"id": "c", "source": "r2e-gym", "domain": "code", "task": "   \n", "answer": None, "terminator": "finish", "tools": [],
           "messages": [{"role": "user", "content": "fix it"},
                        {"role": "assistant", "content": "", "reasoning_content": "done",
                         "tool_calls": [{"type": "function", "id": "c0", "function": {"name": "finish", "arguments": {}}}]}]}
    with pytest.raises(RecordError) as e:
        ChatRenderer(tiny_tokenizer).rows(copy.deepcopy(rec))
    assert e.value.reason == "no_headline"
    (row,) = ChatRenderer(tiny_tokenizer, epilogue=False).rows(copy.deepcopy(rec))
    assert "Final answer" not in row.text


def test_history_policies_tiny(tiny_tokenizer):
    """Without ../shared: a 'please continue' user turn makes Qwen3 drop R1 and R2."""
    call = {"type": "function", "id": "c0", "function": {"name": "search", "arguments": {"query": "q"}}}
    rec = {"id": "h", "source": "synthetic", "domain": "search", "task": "Q", "answer": "a", "terminator": "final_answer", "tools": [],
           "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"},
                        {"role": "assistant", "content": "", "reasoning_content": "R1", "tool_calls": [call]},
                        {"role": "tool", "content": "Doc 1(Title: T) t", "tool_call_id": "c0", "name": "search"},
                        {"role": "assistant", "content": "draft", "reasoning_content": "R2"},
                        {"role": "user", "content": "Please continue."},
                        {"role": "assistant", "content": "Final answer: a", "reasoning_content": "R3"}]}
    (keep,) = ChatRenderer(tiny_tokenizer).rows(copy.deepcopy(rec))
    assert keep.checks == {"rewritten": 2, "ok": 1} and keep.history_rewritten
    with pytest.raises(RecordError):
        ChatRenderer(tiny_tokenizer, history_reasoning="reject").rows(copy.deepcopy(rec))
    rows = _masked(tiny_tokenizer, ChatRenderer(tiny_tokenizer, history_reasoning="per_turn"), rec)
    texts = [tiny_tokenizer.decode(t) for _, t, _ in rows]
    assert [r.checks for r, _, _ in rows] == [{"ok": 2}, {"ok": 1}]
    assert "R1" in texts[0] and "R2" in texts[0] and "R3" not in texts[0]
    assert texts[1] == "R3\n</think>\n\nFinal answer: a<|im_end|>"
