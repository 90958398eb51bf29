"""QA metrics exactly as the field defines them (SQuAD normalization, max over golden answers).

`exact_match`, `f1` and `cover_em` take one prediction (None = the model gave no answer, which
scores 0) and a list of golden answers (the aliases) and return a float in [0, 1]. The per-bench
aggregation (`bench_means`) and the unweighted mean over benches are plain averages. `METRICS` holds
the summary metric names every kind of bench shares, with their ranges (evals.registry.metric_problem
checks a value against them and its kind's own).
"""
from __future__ import annotations

import re
import string
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Sequence


_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)  # ASCII punctuation only, as in the SQuAD script
# F1's special answers: token overlap is meaningless for them, so a mismatch scores 0.
_SPECIAL = ("yes", "no", "noanswer")


def normalize_answer(text: str) -> str:
    """SQuAD normalization: lowercase, drop ASCII punctuation, drop articles, collapse whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _golds(golden_answers: str | Sequence[str]) -> list[str]:
    if isinstance(golden_answers, str):
        return [golden_answers]
    return [g for g in golden_answers if isinstance(g, str)]


def exact_match(prediction: str | None, golden_answers: str | Sequence[str]) -> float:
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in _golds(golden_answers)))


def cover_em(prediction: str | None, golden_answers: str | Sequence[str]) -> float:
    """1 when some normalized gold answer is a substring of the normalized prediction."""
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    return float(any(normalize_answer(g) in pred for g in _golds(golden_answers)))


def _f1_single(pred: str, gold: str) -> float:
    p, g = normalize_answer(pred), normalize_answer(gold)
    if (p in _SPECIAL or g in _SPECIAL) and p != g:
        return 0.0
    p_toks, g_toks = p.split(), g.split()
    common = Counter(p_toks) & Counter(g_toks)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(p_toks)
    recall = same / len(g_toks)
    return 2 * precision * recall / (precision + recall)


def f1(prediction: str | None, golden_answers: str | Sequence[str]) -> float:
    if prediction is None:
        return 0.0
    return max((_f1_single(prediction, g) for g in _golds(golden_answers)), default=0.0)


def qa_metrics(prediction: str | None, strict_prediction: str | None, golden_answers) -> dict[str, float]:
    """The per-example metrics written to `<bench>.jsonl` (strict_em scores the strict prediction)."""
    return {
        "em": exact_match(prediction, golden_answers),
        "f1": f1(prediction, golden_answers),
        "cover_em": cover_em(prediction, golden_answers),
        "strict_em": exact_match(strict_prediction, golden_answers),
    }


def mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def unweighted_mean(per_bench: dict[str, dict], benches: Sequence[str], key: str) -> float | None:
    """Mean of `key` over `benches` (each bench counts once); None unless every bench is present."""
    if not benches or any(b not in per_bench or per_bench[b].get(key) is None for b in benches):
        return None   # a bench without the value (or with a null one, a mean over no items) is a gap
    return mean(per_bench[b][key] for b in benches)


def empty_gold(golden_answers) -> bool:
    """Whether some gold alias normalizes to nothing (NQ has `*`, `---`, `)`): cover-EM then gives
    any prediction 1, and EM any prediction that normalizes to nothing. Scored as is by default
    (parity with Search-R1); counted per bench, and `skip_empty_golds=true` drops such aliases."""
    return any(not normalize_answer(g) for g in _golds(golden_answers))


def nonempty_golds(golden_answers) -> list[str]:
    """The gold aliases that normalize to something."""
    return [g for g in _golds(golden_answers) if normalize_answer(g)]


# ---------------------------------------------------------------- the metric registry
# Every number a `summary.json` bench entry may carry, with its valid range: what analysis checks
# each value it reads against (NaN, inf, out of range, wrong type -> a listed problem, never a row).
# These are the names every kind shares (QA's, the episode counts, any game's); a metric of one kind
# of bench alone is registered on its kind (`BenchKind.metrics`, evals.registry), which checks both.


@dataclass(frozen=True)
class MetricSpec:
    lo: float
    hi: float | None = None     # None: unbounded above
    integer: bool = False
    what: str = ""


RATE = MetricSpec(0.0, 1.0, what="a rate in [0, 1]")
COUNT = MetricSpec(0.0, what="a mean count >= 0")
SIZE = MetricSpec(1, integer=True, what="a positive integer")
METRICS: dict[str, MetricSpec] = {
    "em": RATE, "f1": RATE, "cover_em": RATE, "strict_em": RATE, "format_failure_rate": RATE,
    "mean_turns": COUNT, "mean_tool_calls": COUNT, "mean_tool_errors": COUNT, "mean_generated_tokens": COUNT,
    "n": SIZE,
    # QA benches: items whose gold answers include one that normalizes to nothing (see empty_gold)
    "empty_gold_items": MetricSpec(0, integer=True, what="a count of items >= 0"),
    "skipped_empty_gold_items": MetricSpec(0, integer=True, what="a count of items >= 0"),
    # QA benches: items with `answerable: false` (MuSiQue-Full) left out before sampling
    "unanswerable_excluded": MetricSpec(0, integer=True, what="a count of items >= 0"),
    # any game (a kind with `game`): episode means
    "success": RATE, "invalid_action_rate": RATE, "mean_steps": COUNT,
}
# Why a bench's means are null in its summary: each is over zero items, which is no number (never 0.0).
NULL_REASON = "null_reason"
# Items that stopped at `context_limit` before their first generated token (evals.results.prompt_too_long):
# {items, longest_prompt_tokens, max_model_len}; only in a summary where some did.
PROMPT_TOO_LONG = "prompt_too_long"
# Summary fields that are descriptions or breakdowns, not metrics.
NON_METRIC_FIELDS = ("source", "stop_reasons", "extract_rules", "per_task", "action_rules", "return_ci95", NULL_REASON,
                     PROMPT_TOO_LONG)
