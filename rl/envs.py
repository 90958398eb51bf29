"""The two GRPO tasks as TRL environments, their reward functions and their training-row streams.

TRL 1.16 (`GRPOTrainer.__init__`, `_generate_and_score_completions`) lists the environment's tools
with `inspect.getmembers(type(env), predicate=inspect.isfunction)`: every public *function on the
class* except `reset` and `get_reward`; when the class defines `get_reward`, TRL adds it as a reward
(weight 1, named after the class). Before 1.15 it listed the bound methods of the *instance*, which
would also expose `SearchPlanActEnv`'s Python API; under such a TRL (the search_plan_act references' 1.9.2,
`grpo.trl`) the trainer gets `tools_only(SearchPlanActEnv)`, which hides that API from the listing.

    spa  `envs.search_plan_act.SearchPlanActEnv` itself: exactly its five tools; reward = the env's
         total (`get_reward`), each component (outcome / grounding / stop) logged as a zero-weight
         reward. Rows: train-split task seeds from the stream `grpo-train`, offset by 2**31 so they
         can never equal an SFT-export or eval seed (those are drawn from range(2**31)).
    qa   `QaEnv`: one `search` tool over an evals retriever (BM25 over a wiki-18 corpus or
         `serve-retriever`), rendered to the model exactly as `data_prep.schema.SEARCH_TOOL`.
         Reward = EM of the `evals.extract` answer of the last assistant turn under
         `evals.metrics` against every gold alias (F1 logged at weight 0). Rows: a question file
         of the bench format (`common.benchmarks`). `grpo.qa_mode` takes evals' context modes, so
         training matches evaluation: `open` the corpus retriever; `item` the search tool over the
         row's own paragraphs (evals.retrievers.ItemRetriever, built in `reset` from the row's
         `paragraphs` column); `given` the paragraphs in the prompt (common.prompts) and no
         environment (no tools). Rows with `answerable: false` are left out.
"""
from __future__ import annotations

from collections.abc import Callable

from common.benchmarks import BenchError, check_context_mode, read_bench_file
from common.prompts import given_context_message, initial_messages
from envs.search_plan_act import SearchPlanActEnv
from envs.search_plan_act.env import not_a_tool
from envs.search_plan_act.goals import episode_seeds
from evals.extract import extract_answer
from evals.metrics import exact_match, f1
from evals.retrievers import ItemRetriever, format_docs

TASKS = ("spa", "qa")
SPA_SEED_OFFSET = 2**31
SPA_STREAM = "grpo-train"
SPA_COMPONENTS = ("outcome", "grounding", "stop")
QA_PROMPT = "tool_agent"
# What GRPO makes of a rollout (the envs' reward rules, how a turn is read: rl.chat, evals.toolcalls.split_turn),
# bumped when a change alters a rollout's reward, so a run dir trained under older rules is refused, not resumed
# (GRPO's run identity, rl.config.run_identity; absent there: before it was recorded). 2: a call after finish costs
# the stop penalty whatever its arguments; a turn that never closes its template-opened <think> is all reasoning.
REWARD_SEMANTICS = 2


# ---------------------------------------------------------------- spa


def spa_rows(seed: int, start: int, n: int, split: str = "train") -> list[dict]:
    """Rows `start .. start+n-1` of the run's task stream (resuming continues the same stream)."""
    seeds = episode_seeds(seed, start + n, SPA_STREAM)[start:]
    prompt = initial_messages(QA_PROMPT, "", task="ood")  # evals' search_plan_ood prompt; reset appends the task
    return [{"prompt": prompt, "seed": SPA_SEED_OFFSET + s, "split": split} for s in seeds]


def _component(name: str) -> Callable:
    def reward(environments=None, **_) -> list[float]:
        return [float(env.reward_components()[name]) for env in environments]

    reward.__name__ = name
    return reward


def spa_reward_funcs() -> tuple[list[Callable], list[float]]:
    """The logged components at weight 0; TRL adds `SearchPlanActEnv.get_reward` (the total) at weight 1."""
    return [_component(c) for c in SPA_COMPONENTS], [0.0] * len(SPA_COMPONENTS)


# ---------------------------------------------------------------- qa


class QaEnv:
    """A `search` tool over a retriever. Use `qa_env_factory` (TRL calls the factory with no args)."""

    retriever = None
    topk = 3
    per_item = False  # context mode item: search only the row's own paragraphs

    def reset(self, **row):
        """Start an episode; the question is already in the row's prompt, so nothing is appended."""
        self.queries: list[str] = []
        if self.per_item:
            self.retriever = ItemRetriever(row["paragraphs"])

    def search(self, query: str):
        """Search the document corpus. Returns the top documents as lines `Doc i(Title: T) text`.

        Args:
            query: The search query.
        """
        if not isinstance(query, str) or not query.strip():
            return "Error: search needs a non-empty string argument \"query\"."
        self.queries.append(query)
        return format_docs(self.retriever.search([query], self.topk)[0])


def qa_env_factory(retriever, topk: int, per_item: bool = False) -> type:
    """A QaEnv subclass bound to `retriever`, or searching each row's paragraphs with `per_item`
    (the class is the factory TRL calls)."""
    return type("QaEnv", (QaEnv,), {"retriever": retriever, "topk": int(topk), "per_item": bool(per_item)})


def final_content(completion: list[dict]) -> str:
    """The content of the rollout's last assistant turn (where evals reads the answer)."""
    for msg in reversed(completion):
        if msg.get("role") == "assistant":
            return msg.get("content") or ""
    return ""


def _qa_metric(name: str, metric: Callable) -> Callable:
    def reward(completions, golden_answers, **_) -> list[float]:
        return [metric(extract_answer(final_content(c))[0], g) for c, g in zip(completions, golden_answers)]

    reward.__name__ = name
    return reward


def qa_reward_funcs() -> tuple[list[Callable], list[float]]:
    """EM (weight 1, the reward) and F1 (weight 0, logged), both from evals.metrics."""
    return [_qa_metric("em", exact_match), _qa_metric("f1", f1)], [1.0, 0.0]


def qa_rows(path: str, start: int, n: int, mode: str = "open") -> list[dict]:
    """Rows `start .. start+n-1` of the question file in context mode `mode`, cycling (epochs)
    when the file runs out."""
    items = read_bench_file(path, "train")
    check_context_mode(items, mode, str(path))
    answerable = [it for it in items if it.answerable]
    if not answerable:
        raise BenchError(f"{path}: no answerable question to train on (all {len(items)} are answerable: false)")
    items = answerable
    rows = []
    for k in range(start, start + n):
        it = items[k % len(items)]
        if mode == "given":
            prompt = initial_messages(QA_PROMPT, given_context_message(it.question, it.paragraphs), task="given")
        else:
            prompt = initial_messages(QA_PROMPT, it.question)
        row = {"prompt": prompt, "golden_answers": list(it.golden_answers), "id": it.id}
        if mode == "item":
            row["paragraphs"] = [{"title": p.title, "text": p.text} for p in it.paragraphs]
        rows.append(row)
    return rows


def lists_instance_methods(trl_version: str | None) -> bool:
    """True for a TRL that lists an environment's tools as the public bound methods of an instance (before
    1.15; the search_plan_act references' 1.9.2), False for one that lists the class's functions (1.16)."""
    from packaging.version import InvalidVersion, Version

    try:
        return trl_version is not None and Version(trl_version) < Version("1.15")
    except InvalidVersion:
        return False


def tools_only(cls: type) -> type:
    """`cls` for a TRL that lists instance methods: the Python API wrapped in `not_a_tool` (`call_tool`,
    `reward_components`, `transcript`) binds as a method, so such a TRL would offer it to the model as tools.
    This subclass leaves those names out of `dir()` (what `inspect.getmembers` reads; they stay callable) and
    keeps the class's name, which TRL's environment-reward column is named after."""
    hidden = frozenset(n for n, v in vars(cls).items() if isinstance(v, not_a_tool))

    def __dir__(self):
        return [n for n in object.__dir__(self) if n not in hidden]

    return type(cls.__name__, (cls,), {"__dir__": __dir__, "__doc__": cls.__doc__, "__module__": cls.__module__,
                                       "__qualname__": cls.__qualname__})


def environment_for(task: str, *, retriever=None, topk: int = 3, qa_mode: str = "open",
                    trl_version: str | None = None) -> type | None:
    """The TRL environment class of `task` (None for qa in context mode given: no tools); `trl_version`: the
    TRL it is given to (an older one gets `tools_only(SearchPlanActEnv)`)."""
    if task == "spa":
        return tools_only(SearchPlanActEnv) if lists_instance_methods(trl_version) else SearchPlanActEnv
    if task == "qa":
        return None if qa_mode == "given" else qa_env_factory(retriever, topk, per_item=qa_mode == "item")
    raise ValueError(f"unknown task {task!r}; expected one of {TASKS}")


def reward_funcs_for(task: str) -> tuple[list[Callable], list[float]]:
    return spa_reward_funcs() if task == "spa" else qa_reward_funcs()
