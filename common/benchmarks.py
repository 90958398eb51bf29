"""The benchmark names and the QA bench file format, one definition for every stage: evals scores
the benches, rl trains on QA files of the same format, data_prep decontaminates training data
against the 7-bench.

A bench file is jsonl, one item per line; each row's format is detected by its content:

    FlashRAG       {"id", "question", "golden_answers": [str, ...]}  (no paragraphs; FlashRAG's MuSiQue
                   rows carry only the *supporting* paragraphs in `metadata`, which are not the item's
                   context, so such rows are open-only too)
    R1-Searcher    {"idx", "question", "answer"}  -> id f"{bench}_dev_{idx}", golden_answers [answer]
    MuSiQue        {"id", "question", "answer", "answer_aliases", "answerable",
                    "paragraphs": [{"idx", "title", "paragraph_text", "is_supporting"}]}
                   -> golden_answers [answer, *answer_aliases]
    2Wiki          {"_id", "question", "answer", "type", "evidences", "supporting_facts",
                    "context": [[title, [sentence, ...]], ...]}
    HotpotQA       {"_id", "question", "answer", "type", "level", "supporting_facts", "context"}, or the
                   Hugging Face layout of the same rows (`id`, `context: {title: [...], sentences: [...]}`)

The last three keep the item's paragraphs (in the dataset's order; a paragraph's text is its
sentences joined), which the `item` and `given` context modes need (`bench@mode`, see
`parse_bench_key`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from common.cli import ConfigError
from common.io import JsonLineError, parse_json_line, read_jsonl

SEARCH7 = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
# How a QA bench's evidence reaches the model: `open` the search tool over a corpus (the default,
# the bench's plain name), `item` the search tool over only the item's own paragraphs, `given` all of
# them in the prompt and no tools. A non-default mode is part of the bench's name: `musique@given`.
CONTEXT_MODES = ("open", "item", "given")
DEFAULT_MODE = "open"
FLASHRAG_MUSIQUE_REASON = (
    "FlashRAG's MuSiQue rows keep only the supporting paragraphs (metadata.question_decomposition"
    "[].support_paragraph), not the item's 20 with their distractors; given as context they would hand "
    "the model the answer's evidence and nothing else. Use the original MuSiQue-Ans dev file "
    "(musique_ans_v1.0_dev.jsonl)")


class BenchError(ConfigError):
    """A bench that can't be loaded: missing, ambiguous or malformed (the message names the file)."""


@dataclass(frozen=True)
class Paragraph:
    title: str
    text: str
    is_supporting: bool = False


@dataclass
class BenchItem:
    id: str
    question: str
    golden_answers: list[str]
    extra: dict = field(default_factory=dict)
    paragraphs: list[Paragraph] | None = None  # the item's own context, in the dataset's order
    answerable: bool = True                    # MuSiQue-Full's unanswerable rows are False
    row_format: str = "flashrag"                # flashrag | r1searcher | musique | 2wiki | hotpotqa
    open_only_reason: str | None = None         # why a row without paragraphs has none (FlashRAG MuSiQue)


def parse_bench_key(key: str) -> tuple[str, str]:
    """`musique@given` -> ("musique", "given"); a plain name is the default mode `open`."""
    if not isinstance(key, str) or not key.strip():
        raise BenchError(f"bench {key!r}: expected a bench name such as musique or musique@given")
    name, _, mode = key.strip().partition("@")
    mode = mode or DEFAULT_MODE
    if not name or mode not in CONTEXT_MODES:
        raise BenchError(f"bench {key!r}: expected NAME or NAME@MODE with MODE one of {', '.join(CONTEXT_MODES)}")
    return name, mode


def bench_key(name: str, mode: str = DEFAULT_MODE) -> str:
    """The one name of bench `name` in mode `mode` (results file, summary key, table column)."""
    return name if mode == DEFAULT_MODE else f"{name}@{mode}"


def bench_label(key: str, env_benches=()) -> str:
    """A table header naming the context mode: `musique@given` -> `musique (given)`, `nq` -> `nq (open)`;
    a bench in `env_benches` (its own environment, no mode) as it is."""
    if key in env_benches:
        return key
    name, mode = parse_bench_key(key)
    return f"{name} ({mode})"


def canonical_bench_key(key: str) -> str:
    """`musique@open` -> `musique`: one name per (bench, mode)."""
    return bench_key(*parse_bench_key(key))


def _str_list(value, what: str, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BenchError(f"{where}: {what} must be a list of strings, got {value!r}")
    return value


def _golds(answer, aliases, where: str) -> list[str]:
    if not isinstance(answer, str):
        raise BenchError(f"{where}: \"answer\" must be a string, got {answer!r}")
    golds = [answer]
    for alias in _str_list(aliases, "\"answer_aliases\"", where):
        if alias not in golds:
            golds.append(alias)
    return golds


def _item_id(row: dict, key: str, where: str, row_format: str) -> str:
    """A row's id as its results are named: a non-empty string or an integer, never made up (`None`, a dict's text)."""
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
        raise BenchError(f"{where}: {row_format} row without an \"{key}\" (a string or an integer), got {value!r}")
    return str(value)


def _musique(row: dict, where: str) -> BenchItem:
    item_id = _item_id(row, "id", where, "MuSiQue")
    paragraphs = []
    if not isinstance(row["paragraphs"], list) or not row["paragraphs"]:
        raise BenchError(f"{where}: MuSiQue \"paragraphs\" must be a non-empty list")
    for k, p in enumerate(row["paragraphs"]):
        if (not isinstance(p, dict) or not isinstance(p.get("title"), str)
                or not isinstance(p.get("paragraph_text"), str) or not isinstance(p.get("is_supporting", False), bool)):
            raise BenchError(f"{where}: paragraphs[{k}] must be {{idx, title: str, paragraph_text: str, "
                             f"is_supporting: bool}}, got {str(p)[:120]!r}")
        paragraphs.append(Paragraph(p["title"], p["paragraph_text"], bool(p.get("is_supporting", False))))
    answerable = row.get("answerable", True)
    if not isinstance(answerable, bool):
        raise BenchError(f"{where}: \"answerable\" must be true or false, got {answerable!r}")
    golds = _golds(row.get("answer"), row.get("answer_aliases", []), where)
    return BenchItem(item_id, row["question"].strip(), golds, paragraphs=paragraphs, answerable=answerable,
                     row_format="musique")


def _context_pairs(context, where: str) -> list[tuple[str, list[str]]]:
    """`[[title, [sentences]]]` (the original files) or `{title: [...], sentences: [[...]]}` (the hub's)."""
    if isinstance(context, dict) and set(context) >= {"title", "sentences"}:
        titles, sentences = context["title"], context["sentences"]
        if not isinstance(titles, list) or not isinstance(sentences, list) or len(titles) != len(sentences):
            raise BenchError(f"{where}: \"context\" title and sentences lists differ in length")
        context = [list(pair) for pair in zip(titles, sentences)]
    if not isinstance(context, list) or not context:
        raise BenchError(f"{where}: \"context\" must be a non-empty list of [title, [sentences]]")
    pairs = []
    for k, entry in enumerate(context):
        if (not isinstance(entry, list) or len(entry) != 2 or not isinstance(entry[0], str)
                or not isinstance(entry[1], list) or not all(isinstance(s, str) for s in entry[1])):
            raise BenchError(f"{where}: context[{k}] must be [title, [sentence, ...]], got {str(entry)[:120]!r}")
        pairs.append((entry[0], entry[1]))
    return pairs


def _supporting_titles(facts, where: str) -> set[str]:
    if isinstance(facts, dict) and "title" in facts:  # the hub's {title: [...], sent_id: [...]}
        facts = [[t] for t in facts["title"]]
    if not isinstance(facts, list) or not all(isinstance(f, list) and f and isinstance(f[0], str) for f in facts):
        raise BenchError(f"{where}: \"supporting_facts\" must be a list of [title, sentence index]")
    return {f[0] for f in facts}


def _context_row(row: dict, where: str, row_format: str) -> BenchItem:
    item_id = _item_id(row, "_id" if "_id" in row else "id", where, row_format)
    supporting = _supporting_titles(row.get("supporting_facts"), where)
    # Sentences are joined with one space (HotpotQA's already start with one: not doubled).
    paragraphs = [Paragraph(title, " ".join(s.strip() for s in sentences if s.strip()), title in supporting)
                  for title, sentences in _context_pairs(row["context"], where)]
    return BenchItem(item_id, row["question"].strip(), _golds(row.get("answer"), [], where),
                     paragraphs=paragraphs, row_format=row_format)


def parse_bench_row(row, bench: str, where: str) -> BenchItem:
    if not isinstance(row, dict):
        raise BenchError(f"{where}: expected a JSON object")
    question = row.get("question")
    if not isinstance(question, str) or not question.strip():
        raise BenchError(f"{where}: missing or empty \"question\"")
    if "paragraphs" in row:
        return _musique(row, where)
    if "context" in row and "supporting_facts" in row:
        if "level" in row:
            return _context_row(row, where, "hotpotqa")
        if "evidences" in row:
            return _context_row(row, where, "2wiki")
        raise BenchError(f"{where}: a context row that is neither HotpotQA (needs \"level\") nor 2WikiMultihopQA "
                         f"(needs \"evidences\"), keys {sorted(row)}")
    open_only_reason, answerable = None, True
    if "golden_answers" in row:
        golds = row["golden_answers"]
        golds = [golds] if isinstance(golds, str) else golds
        item_id, row_format = _item_id(row, "id", where, "FlashRAG"), "flashrag"
        meta = row.get("metadata")
        if isinstance(meta, dict) and isinstance(meta.get("question_decomposition"), list):
            open_only_reason = FLASHRAG_MUSIQUE_REASON
            answerable = meta.get("answerable", True)
            if not isinstance(answerable, bool):
                raise BenchError(f"{where}: metadata.answerable must be true or false, got {answerable!r}")
    elif "answer" in row and "idx" in row:
        golds, item_id, row_format = [row["answer"]], f"{bench}_dev_{_item_id(row, 'idx', where, 'r1searcher')}", "r1searcher"
    else:
        raise BenchError(f"{where}: unknown format (need id/question/golden_answers, idx/question/answer, or an "
                         f"original MuSiQue/2Wiki/HotpotQA row with its paragraphs), keys {sorted(row)}")
    if not isinstance(golds, list) or not golds or not all(isinstance(g, str) for g in golds):
        raise BenchError(f"{where}: golden answers must be a non-empty list of strings, got {golds!r}")
    return BenchItem(item_id, question.strip(), list(golds), answerable=answerable, row_format=row_format,
                     open_only_reason=open_only_reason)


def parse_bench_rows(rows, bench: str, where) -> list[BenchItem]:
    """Items of `(where, row)` pairs, ids unique; an empty list is an error naming `where`."""
    items, seen, last = [], set(), None
    for place, row in rows:
        item = parse_bench_row(row, bench, place)
        if item.id in seen:
            raise BenchError(f"{place}: duplicate id {item.id!r}")
        seen.add(item.id)
        items.append(item)
        last = place
    if last is None:
        raise BenchError(f"{where}: no items")
    return items


def read_bench_file(path: Path, bench: str) -> list[BenchItem]:
    try:
        lines = list(read_jsonl(path))
    except JsonLineError as exc:
        raise BenchError(str(exc)) from None
    except OSError as exc:
        raise BenchError(f"{path}: cannot read ({exc.strerror or exc})") from None

    def rows():
        for lineno, line in lines:
            where = f"{path}:{lineno}"
            try:
                yield where, parse_json_line(line)
            except JsonLineError as exc:
                raise BenchError(f"{where}: {exc}") from None
    return parse_bench_rows(rows(), bench, path)


def check_context_mode(items: list[BenchItem], mode: str, source: str) -> None:
    """Refuse `item`/`given` for items without their own paragraphs (naming the file and the reason)."""
    if mode == DEFAULT_MODE:
        return
    missing = [it for it in items if not it.paragraphs]
    if not missing:
        return
    first = missing[0]
    why = first.open_only_reason or (
        f"its rows ({first.row_format} format) carry no paragraphs; context mode {mode!r} needs the original "
        "dev-set format with each question's own paragraphs (MuSiQue-Ans, 2WikiMultihopQA, HotpotQA distractor)")
    raise BenchError(f"{source}: cannot evaluate in context mode {mode!r} ({len(missing)} of {len(items)} items, "
                     f"e.g. {first.id!r}, have no paragraphs): {why}")
