"""The lockstep multi-turn agent loop.

Every episode of a batch advances one assistant turn at a time, so each turn is a single batched
`generate` call and each tool round a single batched retriever call. An episode stops when:

    answer         the turn has no tool call and an answer was extracted, or it has tool calls
                   but also a closed answer (`Final answer:` / `<answer>…</answer>` / `\\boxed{}`),
                   e.g. a dual-terminator `finish` call followed by `Final answer: X`
    no_answer      the turn has no tool call and no answer
    env_done       the environment finished the task (search_plan_ood's `finish` tool)
    max_turns      it used `max_turns` assistant turns and still asked for tools
    length         a turn hit `max_new_tokens` without ending
    context_limit  the conversation no longer fits in `max_model_len`

The generated text is split at `</think>` into `reasoning_content` / `content` the way the Qwen3
templates do, answers are extracted from `content` only, and tool results go back as role `tool`
messages rendered by the model's own chat template.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from evals.extract import extract_answer, split_reasoning
from evals.toolcalls import parse_tool_calls, strip_tool_calls

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
    extra: dict = field(default_factory=dict)


def render(tokenizer, messages: list[dict], tools: list[dict], template_kwargs: dict | None = None) -> str:
    """The next prompt (`template_kwargs`: extra chat-template arguments, e.g. enable_thinking)."""
    return tokenizer.apply_chat_template(messages, tools=tools or None, add_generation_prompt=True, tokenize=False,
                                         **(template_kwargs or {}))


def _assistant_message(reasoning: str, content: str, calls: list[dict], errors: list[str], style: str, turn: int) -> dict:
    msg: dict = {"role": "assistant", "reasoning_content": reasoning}
    # Store calls structurally (re-rendered by the template) only when the turn parsed cleanly and
    # the template can render them (Llama-3.1's allows one call per message); otherwise keep the
    # raw text, so the model always sees exactly what it wrote.
    if calls and not errors and (style != "llama3" or len(calls) == 1):
        msg["content"] = strip_tool_calls(content, style)
        msg["tool_calls"] = [
            {"type": "function", "id": f"call_{turn}_{k}", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for k, c in enumerate(calls)
        ]
    else:
        msg["content"] = content
    return msg


def generate_round(backend, active: list, prompt_of: Callable[[Any], str], *, max_model_len: int,
                   max_new_tokens: int, temperature: float = 0.0,
                   seed_of: Callable[[Any], int] | None = None) -> list[tuple[Any, Any, int]]:
    """One batched `generate` for every unit in `active` (anything with a `stop_reason`) whose prompt
    `prompt_of(unit)` still fits `max_model_len`; a unit that no longer fits stops with
    `context_limit`. Returns (unit, generation, its cap on new tokens) for the others. With
    `temperature > 0` each unit samples with its own seed, `seed_of(unit)`; else decoding is greedy."""
    batch, prompt_ids, caps = [], [], []
    for unit in active:
        ids = backend.encode(prompt_of(unit))
        room = max_model_len - len(ids)
        if room <= 0:
            unit.stop_reason = "context_limit"
            continue
        batch.append(unit)
        prompt_ids.append(ids)
        caps.append(min(max_new_tokens, room))
    if not batch:
        gens = []
    elif temperature > 0:
        gens = backend.generate(prompt_ids, caps, temperature=temperature, seeds=[seed_of(u) for u in batch])
    else:
        gens = backend.generate(prompt_ids, caps)
    return list(zip(batch, gens, caps))


def run_episodes(
    episodes: list[Episode],
    backend,
    execute: Callable[[list[tuple[Episode, list[dict]]]], list[list[str]]],
    *,
    style: str,
    max_turns: int,
    max_model_len: int,
    max_new_tokens: int,
    is_done: Callable[[Episode], bool] = lambda ep: False,
    on_turn: Callable[[int], None] | None = None,
    template_kwargs: dict | None = None,
) -> list[Episode]:
    """Run `episodes` to completion in lockstep. `execute` maps (episode, calls) pairs to one
    response string per call; `is_done` lets an environment end an episode after a tool round."""
    tok = backend.tokenizer
    active = [ep for ep in episodes if ep.stop_reason is None]
    while active:
        turn = generate_round(backend, active, lambda ep: render(tok, ep.messages, ep.tools, template_kwargs),
                              max_model_len=max_model_len, max_new_tokens=max_new_tokens)
        pending = []
        for ep, gen, cap in turn:
            ep.turns += 1
            ep.generated_tokens += gen.num_tokens
            reasoning, content = split_reasoning(gen.text)
            calls, errors = parse_tool_calls(content, style)
            ep.messages.append(_assistant_message(reasoning, content, calls, errors, style, ep.turns))
            ep.final_content = content
            _, rule = extract_answer(content)
            if gen.finish_reason == "length":
                ep.stop_reason = "context_limit" if cap < max_new_tokens else "length"
            elif not calls and not errors:
                ep.stop_reason = "answer" if rule != "none" else "no_answer"
            elif rule in CLOSED_RULES:
                ep.stop_reason = "answer"
            elif ep.turns >= max_turns:
                ep.stop_reason = "max_turns"
            else:
                pending.append((ep, calls, errors))
        responses = execute([(ep, calls) for ep, calls, _ in pending]) if pending else []
        for (ep, calls, errors), resp in zip(pending, responses):
            call_ids = [c.get("id") for c in ep.messages[-1].get("tool_calls", [])]
            for k, (call, text) in enumerate(zip(calls, resp)):
                msg = {"role": "tool", "name": call["name"], "content": text}
                if k < len(call_ids):
                    msg["tool_call_id"] = call_ids[k]
                ep.messages.append(msg)
            for err in errors:
                ep.messages.append({"role": "tool", "name": "error", "content": f"Error: {err}"})
            ep.tool_calls += len(calls)
            ep.tool_errors += len(errors)
            if is_done(ep):
                ep.stop_reason = "env_done"
        if on_turn:
            on_turn(len(turn))
        active = [ep for ep in active if ep.stop_reason is None]
    return episodes
