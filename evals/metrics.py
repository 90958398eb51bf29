"""QA metrics exactly as the field defines them (SQuAD normalization, max over golden answers).

`exact_match`, `f1` and `cover_em` take one prediction (None = the model gave no answer, which
scores 0) and a list of golden answers (the aliases) and return a float in [0, 1]. The per-bench
aggregation (`bench_means`) and the unweighted mean over benches are plain averages.
"""
from __future__ import annotations

import re
import string
from collections import Counter
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
    if not benches or any(b not in per_bench or key not in per_bench[b] for b in benches):
        return None
    return mean(per_bench[b][key] for b in benches)


def empty_gold(golden_answers) -> bool:
    """Whether some gold alias normalizes to nothing (NQ has `*`, `---`, `)`): cover-EM then gives
    any prediction 1, and EM any prediction that normalizes to nothing. Scored as is by default
    (parity with Search-R1); counted per bench, and `skip_empty_golds=true` drops such aliases."""
    return any(not normalize_answer(g) for g in _golds(golden_answers))


def nonempty_golds(golden_answers) -> list[str]:
    """The gold aliases that normalize to something."""
    return [g for g in _golds(golden_answers) if normalize_answer(g)]
