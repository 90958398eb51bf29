"""How each kind of bench becomes episodes, tools and per-example metrics.

    QA benches       question -> user message; the `search` tool runs the retriever (all calls of
                     a turn in one batched query); scored by EM/F1/cover-EM/strict-EM against every
                     gold alias. Context mode `item` (`musique@item`): the same tool, but over only
                     the item's own paragraphs (evals.retrievers.ItemRetriever, one per episode);
                     `given`: every paragraph in the first user message
                     (common.prompts.given_context_message) and no tools.
    search_plan_ood  envs.search_plan_act: one environment per episode, its own tools; scored by
                     the environment's reward components
"""
from __future__ import annotations

import json

from evals.agent import Episode
from evals.benches import BenchItem
from evals.extract import extract_answer, strict_answer
from evals.metrics import nonempty_golds, qa_metrics
from common.prompts import given_context_message, initial_messages
from common.tools import SEARCH_TOOL
from evals.retrievers import ItemRetriever, format_docs


class SearchTools:
    """Executes `search` calls against a retriever; anything else is an error for the model."""

    tools = [SEARCH_TOOL]

    def __init__(self, retriever, topk: int):
        self.retriever, self.topk = retriever, topk

    def __call__(self, batch: list[tuple[Episode, list[dict]]]) -> list[list[str]]:
        if self.retriever is None:  # context mode item: each episode searches its own paragraphs
            return [self._answer([(ep, calls)], ep.state)[0] for ep, calls in batch]
        return self._answer(batch, self.retriever)

    def _answer(self, batch: list[tuple[Episode, list[dict]]], retriever) -> list[list[str]]:
        out: list[list[str]] = [[""] * len(calls) for _, calls in batch]
        queries, where = [], []
        for b, (_, calls) in enumerate(batch):
            for c, call in enumerate(calls):
                query = call["arguments"].get("query")
                if call["name"] != "search":
                    out[b][c] = f"Error: unknown tool {call['name']!r}; the available tool is 'search'."
                elif not isinstance(query, str) or not query.strip():
                    out[b][c] = "Error: search needs a non-empty string argument \"query\"."
                else:
                    queries.append(query)
                    where.append((b, c))
        for (b, c), docs in zip(where, retriever.search(queries, self.topk) if queries else []):
            out[b][c] = format_docs(docs)
        return out


def qa_episode(item: BenchItem, prompt: str, mode: str = "open") -> Episode:
    """An episode of QA item `item` in context mode `mode` (open | item | given)."""
    if mode == "given":
        return Episode(item.id, initial_messages(prompt, given_context_message(item.question, item.paragraphs),
                                                 task="given"), [])
    state = ItemRetriever(item.paragraphs) if mode == "item" else None
    return Episode(item.id, initial_messages(prompt, item.question), list(SearchTools.tools), state=state)


def episode_row(ep: Episode, question: str, golden_answers: list[str], metrics_fn) -> dict:
    """One `<bench>.jsonl` line; `metrics_fn(answer, rule)` gives the per-example metrics."""
    answer, rule = extract_answer(ep.final_content)
    return {
        "id": ep.id,
        "question": question,
        "golden_answers": golden_answers,
        "prediction": answer,
        "extract_rule": rule,
        "stop_reason": ep.stop_reason,
        "num_turns": ep.turns,
        "num_tool_calls": ep.tool_calls,
        "num_tool_errors": ep.tool_errors,
        "generated_tokens": ep.generated_tokens,
        "metrics": metrics_fn(answer, rule),
        "messages": ep.messages,
        **({"refused_prompt": ep.refused_prompt} if ep.refused_prompt else {}),
    }


def qa_row(ep: Episode, item: BenchItem, skip_empty_golds: bool = False) -> dict:
    """With `skip_empty_golds`, gold aliases that normalize to nothing are not scored against, and
    an item left without any gold is marked `skipped_empty_gold` (left out of the bench means)."""
    golds = nonempty_golds(item.golden_answers) if skip_empty_golds else item.golden_answers
    row = episode_row(ep, item.question, item.golden_answers,
                      lambda answer, rule: qa_metrics(answer, strict_answer(answer, rule), golds))
    if skip_empty_golds and not golds:
        row["skipped_empty_gold"] = True
    return row


# ---- search_plan_ood ---------------------------------------------------------------------------

def _envs():
    try:
        from envs import search_plan_act
    except ImportError as exc:
        raise RuntimeError(
            f"bench search_plan_ood needs the envs.search_plan_act package, which failed to import: {exc}"
        ) from exc
    return search_plan_act


def ood_items(n: int | None, seed: int, split: str) -> list[BenchItem]:
    spa = _envs()
    rows = spa.make_eval_items(n if n and n > 0 else 500, seed, split)
    items = []
    for row in rows:
        row = dict(row)
        rid = str(row.get("id", f"{split}_{row.get('seed')}"))
        # The gold answer lives in the environment; ood_row reads it after the episode.
        items.append(BenchItem(rid, row.get("question", ""), [], extra=row))
    return items


def ood_episode(item: BenchItem, prompt: str) -> Episode:
    spa = _envs()
    env = spa.SearchPlanActEnv()
    reset_kwargs = {k: v for k, v in item.extra.items() if k not in ("id", "answer", "question")}
    observation = env.reset(**reset_kwargs)
    return Episode(item.id, initial_messages(prompt, observation, task="ood"), spa.tool_schemas(), state=env)


def env_tools(batch: list[tuple[Episode, list[dict]]]) -> list[list[str]]:
    out = []
    for ep, calls in batch:
        res = []
        for call in calls:
            try:
                res.append(str(ep.state.call_tool(call["name"], call["arguments"])))
            except Exception as exc:  # a bad call is the model's mistake: report it, keep going
                res.append(f"Error: {type(exc).__name__}: {exc}")
        out.append(res)
    return out


def env_done(ep: Episode) -> bool:
    return bool(getattr(ep.state, "done", False))


def _finish_answer(env) -> str | None:
    """The answer the accepted `finish` call carried (what the environment scores)."""
    for call in env.transcript():
        if call["name"] == "finish" and not str(call["response"]).startswith("Error"):
            return call["arguments"].get("answer")
    return None


def ood_row(ep: Episode, item: BenchItem) -> dict:
    components = {k: float(v) for k, v in ep.state.reward_components().items()}
    metrics = {"reward": components.get("total", float(ep.state.get_reward()))}
    metrics.update({f"reward_{k}": v for k, v in components.items() if k != "total"})
    row = episode_row(ep, ep.messages[1]["content"], [str(ep.state.task.answer)], lambda answer, rule: metrics)
    row["finish_answer"] = _finish_answer(ep.state)
    row["reset"] = json.loads(json.dumps(item.extra, default=str))
    return row
