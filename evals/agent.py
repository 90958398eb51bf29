"""The multi-turn agent loop: per-turn step functions, and the lockstep driver over them.

The rules of one episode (render, fit the context, read a generation, run its tools) are step
functions on one unit of play (an `Episode` here, a BabyAI game in evals.babyai), gathered in a
*steps* object with this interface:

    turn_prompt(unit) -> str          the next prompt, rendered by the chat template
    sampling(unit) -> (temperature, seed | None)   per-request decoding (seed None: greedy)
    on_generation(unit, gen, cap)     reads a generation into the unit; returns the tool work the
                                      turn asks for (None: no tool round, maybe the episode ended)
    execute(batch) -> responses       runs the tool work of several units in one call (one
                                      retriever query for every search of the batch)
    on_tools(unit, work, responses)   appends the tool results; may end the episode

Two drivers play them, with the same results: `run_lockstep` (here: every active unit advances one
turn per batched `generate`, the reference and the hf backend's driver) and the asynchronous
driver of evals.scheduler (one coroutine per episode over an async engine). A unit's turn depends
only on its own prompt and its own seed, never on which other units share a batch, so the drivers
write the same rows.

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
    """The conversation as the model's chat template writes it, ready for the next assistant turn
    (`template_kwargs`: extra chat-template arguments, e.g. enable_thinking)."""
    return tokenizer.apply_chat_template(messages, tools=tools or None, add_generation_prompt=True, tokenize=False,
                                         **(template_kwargs or {}))


def fit(n_prompt: int, *, max_model_len: int, max_new_tokens: int) -> int | None:
    """The cap on new tokens of a prompt of `n_prompt` tokens, or None when it no longer fits."""
    room = max_model_len - n_prompt
    return min(max_new_tokens, room) if room > 0 else None


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


class AgentSteps:
    """The step functions of a tool-calling episode (QA benches, search_plan_ood). `execute` maps
    (episode, calls) pairs to one response string per call; `is_done` lets an environment end an
    episode after a tool round."""

    def __init__(self, tokenizer, execute: Callable[[list[tuple[Episode, list[dict]]]], list[list[str]]], *,
                 style: str, max_turns: int, max_new_tokens: int,
                 is_done: Callable[[Episode], bool] = lambda ep: False, template_kwargs: dict | None = None):
        self.tokenizer, self.execute, self.style, self.max_turns = tokenizer, execute, style, max_turns
        self.max_new_tokens, self.is_done, self.template_kwargs = max_new_tokens, is_done, template_kwargs

    def turn_prompt(self, ep: Episode) -> str:
        return render(self.tokenizer, ep.messages, ep.tools, self.template_kwargs)

    def sampling(self, ep: Episode) -> tuple[float, int | None]:
        return 0.0, None

    def on_generation(self, ep: Episode, gen, cap: int):
        ep.turns += 1
        ep.generated_tokens += gen.num_tokens
        reasoning, content = split_reasoning(gen.text)
        calls, errors = parse_tool_calls(content, self.style)
        ep.messages.append(_assistant_message(reasoning, content, calls, errors, self.style, ep.turns))
        ep.final_content = content
        _, rule = extract_answer(content)
        if gen.finish_reason == "length":
            ep.stop_reason = "context_limit" if cap < self.max_new_tokens else "length"
        elif not calls and not errors:
            ep.stop_reason = "answer" if rule != "none" else "no_answer"
        elif rule in CLOSED_RULES:
            ep.stop_reason = "answer"
        elif ep.turns >= self.max_turns:
            ep.stop_reason = "max_turns"
        else:
            return calls, errors
        return None

    def tool_batch(self, ep: Episode, work) -> list[dict]:
        """The calls of `work` that go to `execute` (errors are answered without it)."""
        return work[0]

    def on_tools(self, ep: Episode, work, responses: list[str]) -> None:
        calls, errors = work
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
        if self.is_done(ep):
            ep.stop_reason = "env_done"


def generate_round(backend, active: list, steps, *, max_model_len: int, max_new_tokens: int) -> list[tuple[Any, Any, int]]:
    """One batched `generate` for every unit in `active` (anything with a `stop_reason`) whose next
    prompt still fits `max_model_len`; a unit that no longer fits stops with `context_limit`.
    Returns (unit, generation, its cap on new tokens) for the others. Sampled units (temperature > 0)
    each sample with their own seed; every unit of a round decodes at the same temperature."""
    batch, prompt_ids, caps, seeds, temps = [], [], [], [], set()
    for unit in active:
        ids = backend.encode(steps.turn_prompt(unit))
        cap = fit(len(ids), max_model_len=max_model_len, max_new_tokens=max_new_tokens)
        if cap is None:
            unit.stop_reason = "context_limit"
            continue
        temperature, seed = steps.sampling(unit)
        batch.append(unit)
        prompt_ids.append(ids)
        caps.append(cap)
        seeds.append(seed)
        temps.add(float(temperature))
    if len(temps) > 1:
        raise ValueError(f"one lockstep round decodes at one temperature, got {sorted(temps)}")
    temperature = temps.pop() if temps else 0.0
    if not batch:
        gens = []
    elif temperature > 0:
        gens = backend.generate(prompt_ids, caps, temperature=temperature, seeds=seeds)
    else:
        gens = backend.generate(prompt_ids, caps)
    return list(zip(batch, gens, caps))


def run_lockstep(units: list, backend, steps, *, max_model_len: int, max_new_tokens: int,
                 on_turn: Callable[[int], None] | None = None) -> list:
    """Play `units` to completion in lockstep: each round one batched generate for every active
    unit, then one `steps.execute` call for the tool work of the whole round."""
    active = [u for u in units if u.stop_reason is None]
    while active:
        turn = generate_round(backend, active, steps, max_model_len=max_model_len, max_new_tokens=max_new_tokens)
        pending = []
        for unit, gen, cap in turn:
            work = steps.on_generation(unit, gen, cap)
            if work is not None:
                pending.append((unit, work))
        responses = steps.execute([(u, steps.tool_batch(u, w)) for u, w in pending]) if pending else []
        for (unit, work), resp in zip(pending, responses):
            steps.on_tools(unit, work, resp)
        if on_turn:
            on_turn(len(turn))
        active = [u for u in active if u.stop_reason is None]
    return units


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
    """Run agent `episodes` to completion in lockstep (`AgentSteps` under `run_lockstep`)."""
    steps = AgentSteps(backend.tokenizer, execute, style=style, max_turns=max_turns, max_new_tokens=max_new_tokens,
                       is_done=is_done, template_kwargs=template_kwargs)
    return run_lockstep(episodes, backend, steps, max_model_len=max_model_len, max_new_tokens=max_new_tokens,
                        on_turn=on_turn)
