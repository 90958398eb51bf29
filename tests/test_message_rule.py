"""One rule turns a generation into a chat message, for GRPO (rl.chat.parse_completion, what TRL's
parse_response returns) and for evaluation (the assistant turns of evals.agent.play_agent): the same
message for the same text. The cases where GRPO's reading changed when the two were made one:
  - `reasoning_content` is always set ("" without a think block), as evaluation always had it;
  - the text is split at `</think>` whatever the tool-call style (GRPO split only for qwen3);
  - several Llama-3.1 calls in one turn stay text, with the reason under `tool_call_errors`: the
    Llama-3.1 template renders one call per assistant message and refuses two (checked here with
    the published template)."""
from __future__ import annotations

import asyncio

import pytest

from evals.agent import AgentRules, Episode, play_agent
from evals.backends import Generation
from rl import chat
from tests.conftest import shared_path

TWO_CALLS = ('{"name": "search", "parameters": {"query": "a"}}; {"name": "search", "parameters": {"query": "b"}}'
             '<|eom_id|>')
TEXTS = [
    ("qwen3", 'Look.\n</think>\n\n<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n</tool_call><|im_end|>'),
    ("qwen3", 'Hm.\n</think>\n\n<tool_call>\n{"name": "search", "arguments": {"query": }\n</tool_call>'),
    ("qwen3", "No think block. Final answer: Paris"),
    ("llama3", '{"name": "search", "parameters": {"query": "x"}}<|eom_id|>'),
    ("llama3", "I reckon.</think>The answer is 4.<|eot_id|>"),
    ("llama3", TWO_CALLS),
]


class _Table:
    """One scripted turn for play_agent: `gen` as the generation, every call answered "ok"."""

    def __init__(self, gen: Generation):
        self.gen, self.tools = gen, self

    async def generate(self, unit, messages, tools, **kwargs):
        return self.gen, 100

    async def submit(self, ep, calls):
        return ["ok"] * len(calls)


@pytest.mark.parametrize("style, text", TEXTS, ids=[f"{s}-{i}" for i, (s, _) in enumerate(TEXTS)])
def test_grpo_and_evaluation_read_a_generation_into_the_same_message(style, text):
    ep = Episode("e", [{"role": "user", "content": "q"}], [])
    asyncio.run(play_agent(ep, _Table(Generation(text, "stop", 5)), AgentRules(style, max_turns=1, max_new_tokens=100)))
    evaluated = dict(ep.messages[1])
    for call in evaluated.get("tool_calls", []):   # evaluation numbers its calls (tool_call_id); GRPO has no turn
        assert call.pop("id").startswith("call_1_")
    assert evaluated == chat.parse_completion(text, style)


def test_reasoning_content_is_always_set():
    msg = chat.parse_completion("Final answer: 4<|eot_id|>", "llama3")
    assert msg == {"role": "assistant", "reasoning_content": "", "content": "Final answer: 4"}


def test_the_text_is_split_at_think_whatever_the_style():
    msg = chat.parse_completion("I reckon.</think>The answer is 4.<|eot_id|>", "llama3")
    assert msg["reasoning_content"] == "I reckon." and msg["content"] == "The answer is 4."


def test_two_llama3_calls_stay_text_with_the_reason():
    msg = chat.parse_completion(TWO_CALLS, "llama3")
    assert "tool_calls" not in msg
    assert msg["content"] == TWO_CALLS.removesuffix("<|eom_id|>")
    assert msg["tool_call_errors"] and "one call per assistant message" in msg["tool_call_errors"][0]


def test_the_llama31_template_refuses_two_calls_in_one_message():
    """Why: had the two calls been stored structurally, the next render would fail."""
    from jinja2.exceptions import TemplateError
    from transformers import AutoTokenizer

    from common.tiny import tiny_tokenizer_path

    tok = AutoTokenizer.from_pretrained(tiny_tokenizer_path())
    tok.chat_template = shared_path("fixtures", "chat_templates", "llama3_1_8b_instruct.jinja").read_text()
    calls = [{"type": "function", "function": {"name": "search", "arguments": {"query": q}}} for q in "ab"]
    conv = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": calls}]
    with pytest.raises(TemplateError, match="single tool-calls"):
        tok.apply_chat_template(conv, tokenize=False)
    tok.apply_chat_template(conv[:1] + [{**conv[1], "tool_calls": calls[:1]}], tokenize=False)   # one renders


@pytest.mark.parametrize("template, opens", [("qwen3_4b_thinking_2507.jinja", True), ("qwen3_4b_hybrid.jinja", False),
                                             ("llama3_1_8b_instruct.jinja", False)])
def test_a_turn_inside_the_think_block_its_prompt_opened_holds_no_answer(template, opens, monkeypatch):
    """Thinking-2507's prompt ends in `<think>`: a turn cut off (or ended) before `</think>` is all
    reasoning, so a `Final answer:` drafted there is no answer (scored 0, a format failure) and a call
    written there is not made — in evaluation and, read by the same rule, in GRPO: the tokenizer
    rl.chat.install prepares is what TRL parses each completion with, and its QA reward equals the score."""
    from evals.toolcalls import opens_think
    from evals.benches import BenchItem
    from evals.tasks import qa_row
    from rl.envs import reward_funcs_for
    from tests.test_rl_thinking import _tok

    tok = _tok(shared_path("fixtures", "chat_templates", template).read_text(encoding="utf-8"))
    rules = AgentRules("qwen3", max_turns=2, max_new_tokens=100, opens_think=opens_think(tok))
    assert rules.opens_think is opens
    monkeypatch.setattr(chat, "check_template", lambda *a: None)   # TRL's acceptance (test_rl_units), a slow import
    chat.install(tok)
    em = reward_funcs_for("qa")[0][0]
    call = '<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n</tool_call>'
    for text, finish, answered, calls in [("so\nFinal answer: Paris\nbut check", "length", not opens, 0),
                                          ("so Final answer: Paris", "stop", not opens, 0),
                                          ("hm</think>\n\nFinal answer: Paris", "stop", True, 0),
                                          (f"look it up\n{call}", "stop", False, 0 if opens else 1)]:
        ep = asyncio.run(play_agent(Episode("e", [{"role": "user", "content": "q"}], []),
                                    _Table(Generation(text, finish, 5)), rules))
        score = qa_row(ep, BenchItem("e", "q", ["Paris"]))
        grpo = tok.parse_response(tok(text, add_special_tokens=False)["input_ids"])
        reward = em(completions=[[grpo]], golden_answers=[["Paris"]])[0]
        assert (score["metrics"]["em"], score["extract_rule"] != "none", reward) == (float(answered), answered, float(answered))
        assert (ep.tool_calls, len(grpo.get("tool_calls", []))) == (calls, calls), (template, text)
