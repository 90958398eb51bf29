"""Span kinds: what each trainable token of a rendered record is part of, from the record's message fields.

    reasoning        the assistant turn's `reasoning_content`
    assistant_text   its `content`, except a `Final answer:` line
    final_answer     a `Final answer: …` line of the content, and the dual-terminator epilogue
    tool_name        a tool call's function name (not finish/submit)
    tool_arguments   that call's arguments (the JSON object the template renders)
    finish_call      the name and arguments of a `finish`/`submit` call
    template         everything else the model generates: think/tool-call tags, the end-of-turn marker

A record is rendered and masked exactly as in training (`data_prep.render.ChatRenderer.rows` +
`tokenize_rows`); `SpanTokenizer` gives, per training row of a record, its input ids, its labels and
each token's kind. A token takes the kind of its first non-space character (its first character when
it is all space). The kinds partition the trainable tokens (the teacher-forced benches,
evals.teacher_forced, sum their losses per kind). The renderer is imported where it is used, so
reading SPAN_KINDS loads no chat-template machinery.
"""
from __future__ import annotations

import json
import re
from typing import NamedTuple

import numpy as np

from data_prep.errors import DataPrepError
from data_prep.terminators import FINISH_TOOLS   # the calls that end an episode: `finish_call`

SPAN_KINDS = ("reasoning", "assistant_text", "final_answer", "tool_name", "tool_arguments", "finish_call", "template")
_FINAL_LINE = re.compile(r"final answer\s*:[^\n]*", re.IGNORECASE)
_TEMPLATE = SPAN_KINDS.index("template")


class SpanError(DataPrepError):
    """A message field that cannot be found in its rendered turn (the kinds would be guesses)."""


def _label_turn(kinds: np.ndarray, text: str, start: int, end: int, msg: dict, epilogue: str | None) -> None:
    """Label the characters of one assistant turn's generation `text[start:end]` from its message fields."""
    cur = start

    def find(piece: str, what: str) -> int:
        at = text.find(piece, cur, end)
        if at < 0:
            raise SpanError(f"{what} {piece[:40]!r} not found in its rendered turn")
        return at

    reasoning = (msg.get("reasoning_content") or "").strip()
    if reasoning:
        at = find(reasoning, "reasoning_content")
        kinds[at:at + len(reasoning)] = SPAN_KINDS.index("reasoning")
        cur = at + len(reasoning)
    content = (msg.get("content") or "").strip()
    if content:
        at = find(content, "content")
        kinds[at:at + len(content)] = SPAN_KINDS.index("assistant_text")
        for m in _FINAL_LINE.finditer(content):
            kinds[at + m.start():at + m.end()] = SPAN_KINDS.index("final_answer")
        cur = at + len(content)
    for call in msg.get("tool_calls") or []:
        fn = call.get("function") or {}
        name = str(fn.get("name", ""))
        finish = name in FINISH_TOOLS
        at = find(name, "tool-call name")
        kinds[at:at + len(name)] = SPAN_KINDS.index("finish_call" if finish else "tool_name")
        cur = at + len(name)
        brace = text.find("{", cur, end)
        if brace >= 0:  # the arguments: the JSON value the template renders after the name
            try:
                _, stop = json.JSONDecoder().raw_decode(text, brace)
            except json.JSONDecodeError:
                raise SpanError(f"tool call {name!r}: its arguments are not a JSON object in the rendered turn") from None
            kinds[brace:stop] = SPAN_KINDS.index("finish_call" if finish else "tool_arguments")
            cur = stop
    if epilogue:
        at = find(epilogue.strip(), "epilogue")
        kinds[at:at + len(epilogue.strip())] = SPAN_KINDS.index("final_answer")


def char_kinds(renderer, rec: dict):
    """[(row, per-character kind index)] for a canonical record, its rows as training renders them."""
    rec = json.loads(json.dumps(rec))  # rows() records the epilogue on the record: work on a copy
    rows = renderer.rows(rec)
    turns = renderer.generations(rec)
    msgs = rec["messages"]
    out = []
    for r, row in enumerate(rows):
        kinds = np.full(len(row.text), -1, dtype=np.int64)  # -1: not trainable
        for s, (a, b) in enumerate(row.spans):
            kinds[a:b] = _TEMPLATE
            # exact rows: a span starts where its own turn's prompt ends (prompts grow, so one turn fits)
            turn = next((t for t in turns if len(t.prompt) == a and row.text.startswith(t.prompt)), None)
            if turn is None:
                raise SpanError(f"record {rec.get('id')!r}: row {r} span {s} matches no assistant turn's generation")
            last = r == len(rows) - 1 and s == len(row.spans) - 1
            _label_turn(kinds, row.text, a, b, msgs[turn.index], rec.get("epilogue") if last else None)
        out.append((row, kinds))
    return out


def token_kinds(kinds: np.ndarray, text: str, offsets: np.ndarray) -> np.ndarray:
    """Per token: the kind of its first non-space character (its first character if all space)."""
    out = np.full(len(offsets), -1, dtype=np.int64)
    for k, (a, b) in enumerate(offsets):
        if a >= b:
            continue
        piece = text[a:b]
        lead = len(piece) - len(piece.lstrip())
        out[k] = kinds[a + lead] if lead < len(piece) else kinds[a]
    return out


class SpanRow(NamedTuple):
    """One training row of a record: `input_ids` and `labels` as `tokenize_rows` gives them (labels
    -100 where not trained) and per token its kind's index in SPAN_KINDS (-1: a token without one)."""
    input_ids: np.ndarray
    labels: np.ndarray
    kinds: np.ndarray


class SpanTokenizer:
    """Renders and tokenizes canonical records exactly as training does (`ChatRenderer(tokenizer,
    **render_settings)`: a dataset manifest's `render_settings`), each token with its span kind."""

    def __init__(self, tokenizer, **render_settings):
        from data_prep.render import ChatRenderer

        self.tokenizer = tokenizer
        self.renderer = ChatRenderer(tokenizer, **render_settings)

    def __call__(self, rec: dict) -> list[SpanRow]:
        """Every row training makes of `rec`, in order; refused (SpanError) where the tokens labelled by
        character offsets are not the training tokens."""
        from data_prep.render import token_offsets, tokenize_rows

        out = []
        for row, kinds in char_kinds(self.renderer, rec):
            (tok,) = tokenize_rows(self.tokenizer, [row])
            ids, offsets = token_offsets(self.tokenizer, row)
            if list(ids) != list(tok.input_ids):
                raise SpanError(f"record {rec.get('id')!r}: token offsets disagree with the training tokens")
            out.append(SpanRow(np.asarray(ids, dtype=np.int64), np.asarray(tok.labels, dtype=np.int64),
                               token_kinds(kinds, row.text, offsets)))
        return out
