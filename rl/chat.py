"""The chat side of GRPO under TRL 1.16: a training template TRL accepts, and the tool-call parser.

Why a training template. TRL's multi-turn loop builds each next prompt by concatenating token ids
(prompt + generated completion + the rendered tool turn), and it refuses a template that is not
*prefix-preserving* (an earlier turn must render the same once more messages follow) unless it is one
of the templates it knows how to patch. The Qwen3 templates (Qwen3-4B-Thinking-2507's, the hybrid
Qwen3-4B's, and the tiny models', which is the Thinking-2507 one) are not prefix-preserving: the
`<think>…</think>` block of an assistant turn after the last user query is rendered when the turn is
the last message or has reasoning, and dropped otherwise. TRL knows the hybrid template but patches
it into a different rendering; it does not know the Thinking-2507 one and raises.

`training_template` makes that one condition unconditional: every assistant turn after the last user
query renders its think block. For every conversation whose assistant turns carry reasoning (what a
rollout of a thinking model produces: the generation prompt opens `<think>`), the training template
renders byte for byte what the model's own template renders (tests/test_rl_units.py checks every
prompt TRL builds over 20+ episodes). The one case they differ is an assistant turn with *empty*
reasoning that is not the last message: the own template drops its (empty) think block, the training
template keeps it — which is what the model actually generated and what TRL's token concatenation
holds. The training template only lives on the tokenizer object the trainer uses; checkpoints copy the
original tokenizer files (rl.checkpoint), so they keep the model's own template.

Why our parser. TRL parses completions with `tokenizer.parse_response` and a pattern per known
template; an unknown template raises, and TRL's Llama-3.1 pattern needs the call's closing brace
right before the end-of-turn token (a model that continues, or ends a call with `<|eom_id|>`, is
silently read as a final answer). `install` binds `parse_response` to `evals.toolcalls` — the parser
evals uses, one implementation — so training and evaluation read a completion the same way.
A completion is read into a message by evaluation's own rule (evals.toolcalls.generation_message),
with evaluation's `opens_think` computed once per run from the model's template: a turn of
Qwen3-Thinking-2507 that never closes the `<think>` its prompt opened has no content (no answer, so no
reward) and makes no call.
A completion whose call markup does not parse, or that makes several Llama-3.1 calls in one turn
(its template renders one per message), ends the rollout (TRL treats a turn without calls as final);
the reason is kept on the message under `tool_call_errors` and counted in metrics.jsonl, never
dropped silently.
"""
from __future__ import annotations

import json
import types

import jinja2

from common import thinking
from evals.toolcalls import detect_style, generation_message, opens_think
from rl.errors import RlError

# (the own template's text, its training-side replacement). Applied only when present.
_QWEN3_THINK_CONDITION = "{%- if loop.last or (not loop.last and reasoning_content) %}"
PATCHES = ((_QWEN3_THINK_CONDITION, "{%- if true %}"),)

class TemplateError(RlError):
    """The model's chat template can't be used for multi-turn GRPO (the message says why)."""


def training_template(own: str) -> str:
    """The training-side template for the model's own template `own` (unchanged if no patch applies)."""
    out = own
    for old, new in PATCHES:
        out = out.replace(old, new)
    return out


def check_template(tokenizer, template: str) -> None:
    """TRL's own acceptance checks, run on `template`: tool calls render, prefixes are preserved (tool_calls_render,
    prefix_preserving: TRL 1.16's, restated so that a launch's checks import no TRL)."""
    saved = tokenizer.chat_template
    tokenizer.chat_template = template
    try:
        if not tool_calls_render(tokenizer):
            raise TemplateError("the chat template cannot render a tool-calling conversation "
                                "(user -> assistant with tool_calls -> tool), which GRPO with tools needs")
        if not prefix_preserving(tokenizer):
            raise TemplateError("the chat template is not prefix-preserving and rl.chat has no patch for it "
                                "(add one to rl.chat.PATCHES and a parity test)")
    finally:
        tokenizer.chat_template = saved


def _tool_chat(render, user: str, name: str, arguments: dict, content: str):
    """render(user -> assistant calling `name` with `arguments` -> tool answering `content`); a template that refuses
    the arguments as a mapping (TypeError) gets them as JSON text, as TRL retries."""
    for args in (arguments, json.dumps(arguments)):
        call = {"type": "function", "function": {"name": name, "arguments": args}}
        try:
            return render([{"role": "user", "content": user}, {"role": "assistant", "content": "", "tool_calls": [call]},
                           {"role": "tool", "name": name, "content": content}])
        except TypeError:
            if isinstance(args, str):
                raise


def tool_calls_render(tokenizer) -> bool:
    """trl.chat_template_utils.supports_tool_calling: a user -> assistant (tool call) -> tool exchange renders with its
    call's name, argument key and value and the tool's content in it (a template error: no)."""
    sentinels = ("probe_call_q7", "probe_key_k3", "probe_value_v9", "probe_answer_a5")   # four distinct words
    try:
        text = _tool_chat(lambda chat: tokenizer.apply_chat_template(chat, tokenize=False), "hi", sentinels[0],
                          {sentinels[1]: sentinels[2]}, sentinels[3])
    except jinja2.TemplateError:
        return False
    return all(s in text for s in sentinels)


def prefix_preserving(tokenizer) -> bool:
    """trl.chat_template_utils.is_chat_template_prefix_preserving: the tokens of user -> assistant (tool call) begin
    the tokens of the same followed by the tool's turn and the generation prompt."""
    ids, more = _tool_chat(lambda chat: (tokenizer.apply_chat_template(chat[:2], tokenize=True, return_dict=False),
                                         tokenizer.apply_chat_template(chat, tokenize=True, return_dict=False, add_generation_prompt=True)),
                           "look it up", "lookup", {}, "found")
    return more[:len(ids)] == ids


def parse_completion(text: str, style: str, opens_think: bool = False) -> dict:
    """One generated assistant turn (decoded with special tokens) as a chat message, by the rule
    evaluation uses (evals.toolcalls.generation_message; `opens_think`: the generation prompt opens
    `<think>`): {"role", "reasoning_content", "content", ["tool_calls"], ["tool_call_errors"]}."""
    return generation_message(text, style, opens_think=opens_think)[0]


def install(tokenizer, enable_thinking="auto", where: str = "the model") -> dict:
    """Prepare `tokenizer` (the trainer's copy) for TRL: training template + our parser; `enable_thinking`
    (grpo.enable_thinking, passed to every render by TRL's chat_template_kwargs) must be one the
    template reads (common.thinking). Returns {"style", "own_template", "training_template", "patched", "opens_think"}."""
    own = tokenizer.chat_template
    if isinstance(own, dict):
        own = own.get("default")
    if not isinstance(own, str) or not own:
        raise TemplateError("the tokenizer has no chat template")
    problem = thinking.template_problem(enable_thinking, own, "grpo.enable_thinking", where)
    if problem:
        raise TemplateError(problem)
    style = detect_style(own)
    opens = opens_think(tokenizer, thinking.template_kwargs(enable_thinking))   # once per run, as evaluate does
    train = training_template(own)
    check_template(tokenizer, train)
    tokenizer.chat_template = train

    def parse_response(self, ids, prefix=None, tools=None):  # the signature TRL calls
        return parse_completion(self.decode(list(ids), skip_special_tokens=False), style, opens)

    tokenizer.parse_response = types.MethodType(parse_response, tokenizer)
    # TRL only looks up its own pattern when neither attribute is set; this marks ours as in place.
    tokenizer.response_template = {"parser": f"evals.toolcalls:{style}"}
    return {"style": style, "own_template": own, "training_template": train, "patched": train != own, "opens_think": opens}


def prompt_lengths(tokenizer, prompts: list[list[dict]], tools: list | None, enable_thinking="auto") -> list[int]:
    """Tokens of each rollout prompt (a message list, the environment's `reset` text already appended) as TRL 1.16's
    `_tokenize_prompts` renders it: the training template, the environment's tools (bound methods, as TRL lists
    them; their JSON schemas taken once), the generation prompt and `grpo.enable_thinking`'s template arguments."""
    from transformers.utils import get_json_schema

    own = tokenizer.chat_template.get("default") if isinstance(tokenizer.chat_template, dict) else tokenizer.chat_template
    schemas = [get_json_schema(t) for t in tools] if tools else None
    texts = tokenizer.apply_chat_template(prompts, tools=schemas, chat_template=training_template(own), add_generation_prompt=True,
                                          tokenize=False, **(thinking.template_kwargs(enable_thinking) or {}))
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
