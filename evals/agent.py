"""The tool-calling episode: `play_agent`, one `async def` per episode over an engine.

An episode (QA benches in every context mode, search_plan_ood) renders its conversation with the
model's chat template, fits it in the context window, awaits one generation from the engine
(evals.engine: vLLM's AsyncLLM, or the lockstep adapter over a batched backend), reads it into a
message by the rule GRPO shares (evals.toolcalls.generation_message), and sends the turn's calls
to its bench's tool batcher (one retriever query for the searches of many episodes), until it
stops. The episodes of a run are played by evals.scheduler.run_async.

An agent episode stops when:

    answer         the turn has no tool call and an answer was extracted, or it has tool calls
                   but also a closed answer (`Final answer:` / `<answer>…</answer>` / `\\boxed{}`),
                   e.g. a dual-terminator `finish` call followed by `Final answer: X`
    no_answer      the turn has no tool call and no answer
    env_done       the environment finished the task (search_plan_ood's `finish` tool)
    max_turns      it used `max_turns` assistant turns and still asked for tools
    length         a turn hit `max_new_tokens` without ending
    context_limit  the conversation no longer fits in `max_model_len`

The generated text is split at `</think>` into `reasoning_content` / `content` the way the Qwen3
templates do, answers are extracted from `content` only (a turn whose prompt opened `<think>`, as
Qwen3-Thinking-2507's always does, and that never wrote `</think>` is all reasoning: no answer, no
tool call), and tool results go back as role `tool` messages rendered by the model's own chat template.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from evals.extract import extract_answer
from evals.toolcalls import generation_message, split_turn

# Rules strong enough to end an episode even when the same turn also calls tools.
CLOSED_RULES = ("final_answer", "answer_tag", "boxed")


@dataclass
class Episode:
    id: str
    messages: list[dict]
    tools: list[dict]
    state: Any = None           # per-episode tool state (an environment), if the bench has one
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    generated_tokens: int = 0
    stop_reason: str | None = None
    final_content: str = ""
    refused_prompt: dict | None = None   # the prompt that did not fit: {tokens, max_model_len} (evals.scheduler.Table)
    extra: dict = field(default_factory=dict)


def render(tokenizer, messages: list[dict], tools: list[dict], template_kwargs: dict | None = None) -> str:
    """The conversation as the model's chat template writes it, ready for the next assistant turn
    (`template_kwargs`: extra chat-template arguments, e.g. enable_thinking)."""
    return tokenizer.apply_chat_template(messages, tools=tools or None, add_generation_prompt=True, tokenize=False,
                                         **(template_kwargs or {}))


def fit(n_prompt: int, *, max_model_len: int, max_new_tokens: int) -> int | None:
    """The cap on new tokens of a prompt of `n_prompt` tokens, or None when it no longer fits."""
    room = max_model_len - n_prompt
    return min(max_new_tokens, room) if room > 0 else None


@dataclass
class AgentRules:
    """The turn rules of a tool-calling bench: its tool-call style, turn and token caps, chat-template
    arguments, and `is_done` (an environment that ends the episode after a tool round)."""
    style: str
    max_turns: int
    max_new_tokens: int
    template_kwargs: dict | None = None
    is_done: Callable[[Episode], bool] = lambda ep: False
    opens_think: bool = False   # the prompt opens `<think>` (opens_think): a turn is reasoning until `</think>`


async def play_agent(ep: Episode, table, rules: AgentRules) -> Episode:
    """Play one tool-calling episode (a QA bench in any context mode, search_plan_ood) to its end on
    `table` (evals.scheduler.Table: the engine, the bench's tool batcher, the context window)."""
    while ep.stop_reason is None:
        turn = await table.generate(ep, ep.messages, ep.tools, max_new_tokens=rules.max_new_tokens,
                                    template_kwargs=rules.template_kwargs)
        if turn is None:   # context_limit
            break
        gen, cap = turn
        ep.turns += 1
        ep.generated_tokens += gen.num_tokens
        msg, calls, errors = generation_message(gen.text, rules.style, ep.turns, rules.opens_think)
        ep.messages.append(msg)
        ep.final_content = split_turn(gen.text, rules.opens_think)[1]   # the content, call markup included
        _, rule = extract_answer(ep.final_content)
        if gen.finish_reason == "length":
            ep.stop_reason = "context_limit" if cap < rules.max_new_tokens else "length"
        elif not calls and not errors:
            ep.stop_reason = "answer" if rule != "none" else "no_answer"
        elif rule in CLOSED_RULES:
            ep.stop_reason = "answer"
        elif ep.turns >= rules.max_turns:
            ep.stop_reason = "max_turns"
        else:
            responses = await table.tools.submit(ep, calls) if calls else []
            _answer_tools(ep, calls, errors, responses)
            if rules.is_done(ep):
                ep.stop_reason = "env_done"
    return ep


def _answer_tools(ep: Episode, calls: list[dict], errors: list[str], responses: list[str]) -> None:
    """The tool round's messages: one per call (with the id of its structured call), one per error."""
    call_ids = [c.get("id") for c in ep.messages[-1].get("tool_calls", [])]
    for k, (call, text) in enumerate(zip(calls, responses)):
        msg = {"role": "tool", "name": call["name"], "content": text}
        if k < len(call_ids):
            msg["tool_call_id"] = call_ids[k]
        ep.messages.append(msg)
    for err in errors:
        ep.messages.append({"role": "tool", "name": "error", "content": f"Error: {err}"})
    ep.tool_calls += len(calls)
    ep.tool_errors += len(errors)
