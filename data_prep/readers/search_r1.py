"""Search-R1 / NQ-style rollouts: one assistant turn holding `<think>`, `<search> q </search>`,
the environment's `<information>Doc 1(Title: T) ...</information>` and a final `<answer>`.
Converted to multi-turn tool form: each search becomes a `search` call, each information block
its tool result, the answer `Final answer: X`. An empty or blank `<search> </search>` stays a search of `""`: Search-R1's
rollout (search_r1/llm_agent/generation.py@a14dc3a, `postprocess_predictions`) reads it as action `search` with
content `""`, and `execute_predictions` sends that query to the retriever and appends its `<information>`.

Row: `prompt` ([{role: user, content}]) or `question`, plus `response` (the rollout text) — or
`messages` [user, assistant]. The gold is the first of `reward_model.ground_truth.target` (Search-R1's verl rows hold
FlashRAG's `golden_answers` list there, scripts/data_process/nq_search.py@a14dc3a), `golden_answers`, `answer` that the
row has, under the search readers' rule (`data_prep.readers.search.gold`: every gold of a list kept). Every Search-R1
row has one (its reward, qa_em, scores against the target), so a row with none is refused (`bad_gold`), never given the
model's own `<answer>` as its gold."""
from __future__ import annotations

import re

from data_prep.readers.common import require_str, thought_message
from data_prep.readers.search import SEARCH_TOOL, clean_thought, described, final_turn, gold, search_record
from data_prep.schema import RecordError, tool_call
from data_prep.terminators import extract_answer_tag

SOURCE = "search-r1"
_SEARCH_RE = re.compile(r"<search>(.*?)</search>", re.DOTALL)
_INFO_RE = re.compile(r"\s*<information>(.*?)</information>", re.DOTALL)
_STRAY_RE = re.compile(r"</?answer>|</search>|</information>")


def _question_and_response(row: dict) -> tuple[str, str]:
    prompt, response = row.get("prompt"), row.get("response")
    if response is None and isinstance(row.get("messages"), list):
        msgs = row["messages"]
        if not msgs:
            raise RecordError("empty_conversation")
        asst = [m for m in msgs if isinstance(m, dict) and m.get("role") == "assistant"]
        if not asst:
            raise RecordError("no_assistant_turn")
        response = asst[-1].get("content")
        prompt = [m for m in msgs if isinstance(m, dict) and m.get("role") == "user"]
    if response is None:
        raise RecordError("no_assistant_turn", "row has no `response` / assistant message")
    response = require_str(response, "response")
    question = row.get("question")
    if not isinstance(question, str):
        user = prompt[-1].get("content") if isinstance(prompt, list) and prompt else prompt
        user = require_str(user, "prompt")
        # Search-R1 prompts end with "Question: <q>" after the tag instructions.
        question = user.rsplit("Question:", 1)[1] if "Question:" in user else user
    return question.strip(), response


_GOLD_FIELDS = ("reward_model.ground_truth.target", "golden_answers", "answer")


def _gold(row: dict) -> str | list[str]:
    """The row's gold: the first of `_GOLD_FIELDS` it holds (not null), by `gold`'s rule; a `reward_model` or its
    `ground_truth` that is no object, or a row with none of the fields, is refused (`bad_gold`)."""
    rm = row.get("reward_model")
    truth = rm.get("ground_truth") if isinstance(rm, dict) else None
    for field, value in (("reward_model", rm), ("reward_model.ground_truth", truth)):
        if value is not None and not isinstance(value, dict):
            raise RecordError("bad_gold", f"{field} {described(value)}: not Search-R1's {{ground_truth: {{target: [golds]}}}}")
    values = ((truth or {}).get("target"), row.get("golden_answers"), row.get("answer"))
    for field, value in zip(_GOLD_FIELDS, values):
        if value is not None:
            return gold(value, field)
    raise RecordError("bad_gold", f"no gold: the row has none of {', '.join(_GOLD_FIELDS)} (or each is null)")


def _thought(text: str) -> str:
    """`text` between searches, to be trained as thought: a `<search>` left open is no search (Search-R1's
    environment runs only `<search>q</search>`), and an `<information>` block no search asked for is
    the environment's text, so neither is the model's thought; nor is a stray closing tag or an `<answer>` before
    the last (the episode ends at the first closed one): the record is refused."""
    if (k := text.find("<search>")) >= 0:
        query = text[k + len("<search>"):].split("<", 1)[0].strip()
        raise RecordError("unparseable_tool_call", f"a <search> with no </search> ({query[:60]!r}): Search-R1 runs closed "
                          "<search>...</search> only, so it is neither a search nor thought to train")
    if "<information>" in text:
        raise RecordError("unparseable_tool_call", "an <information> block with no <search> before it: the environment's "
                          "results are never the model's thought")
    if stray := _STRAY_RE.search(text):
        raise RecordError("unparseable_tool_call", f"a stray {stray.group()} in {text[max(0, stray.start() - 40):stray.end() + 40]!r}: "
                          "the episode ends at the first closed <answer>, and every tag pairs up, so it is no thought to train")
    return clean_thought(text)


def parse(row: dict, *, rid: str, reasoning: str) -> dict:
    question, response = _question_and_response(row)
    if not response.strip():
        raise RecordError("empty_conversation", "empty response")
    turns: list[dict] = []
    pos = 0
    for k, s in enumerate(_SEARCH_RE.finditer(response)):
        if s.start() < pos:
            continue
        info = _INFO_RE.match(response, s.end())
        if info is None:
            raise RecordError("unparseable_tool_call", f"search {k} ({s.group(1).strip()[:60]!r}) has no <information> result")
        if "<information>" in info.group(1):  # the environment writes whole blocks: this one was never closed
            raise RecordError("unparseable_tool_call", f"search {k} ({s.group(1).strip()[:60]!r}): an <information> with no </information>")
        msg = thought_message(_thought(response[pos:s.start()]), reasoning)
        call_id = f"call_{k}"
        msg["tool_calls"] = [tool_call("search", {"query": s.group(1).strip()}, call_id)]
        turns.append(msg)
        turns.append({"role": "tool", "content": info.group(1).strip(), "tool_call_id": call_id, "name": "search"})
        pos = info.end()
    before, ans = extract_answer_tag(response[pos:])
    if ans is None:
        raise RecordError("no_final_answer", "no <answer> after the last search")
    turns.append(final_turn(_thought(before), ans, reasoning))
    return search_record(rid, SOURCE, question, _gold(row), turns, [SEARCH_TOOL])
