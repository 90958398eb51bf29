"""Chat-template rendering and loss masks.

Trainable text is exactly what the model generates at inference for each assistant turn:
everything after the generation prompt (`<|im_start|>assistant\\n<think>\\n` for Qwen3
Thinking-2507, `<|start_header_id|>assistant<|end_header_id|>\\n\\n` for Llama-3.1) up to and
including the end-of-turn marker (`<|im_end|>` / `<|eot_id|>`). Nothing from system, user or tool
turns.

Method: the whole conversation is rendered once with the model's own template; assistant spans are
found as character ranges in that string (the k-th assistant header starts the k-th assistant
turn, which ends at the first end-of-turn marker after it) and checked against
`render(messages[:i], add_generation_prompt=True)`, which must be a string prefix of the full render
(string operations only, no re-tokenization). Tokens are then labelled by their character offsets.

Check outcomes per assistant turn:
- `ok`: the prefix render plus the generation prompt is a prefix of the full render;
- `no_gen_suffix`: the context is intact but the turn does not start with the generation prompt's
  tail (Thinking-2507 renders a non-final turn without reasoning as `<|im_start|>assistant\\n`
  without `<think>`): trained on what is rendered, counted;
- `rewritten`: the template rewrote history (Qwen3 drops the reasoning of turns before the last
  real user query): the turn's own reasoning is missing from its rendered span, or the context
  before it differs from what the model saw when generating it. Handled by the `history_reasoning` policy:
  `keep_as_rendered` (train on the full render as is, count), `per_turn` (one row per user query,
  each rendered as the model saw it, earlier turns masked), `reject` (quarantine the record).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import numpy as np

from common.io import sha256_text
from data_prep.jinja_env import compile_template
from data_prep.schema import RecordError
from data_prep.terminators import epilogue_text

END_MARKERS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "</s>")
HISTORY_POLICIES = ("keep_as_rendered", "per_turn", "reject")
_PROBE_Q, _PROBE_A, _PROBE_Q2 = "PROBE-QUESTION-7f3a", "PROBE-ANSWER-7f3a", "PROBE-NEXT-7f3a"


class TemplateError(ValueError):
    """A chat template whose turn structure can't be derived."""


@dataclass(frozen=True)
class TemplateInfo:
    gen_prompt: str   # what add_generation_prompt appends
    header: str       # the part of the generation prompt every rendered assistant turn starts with
    end_marker: str   # end-of-turn text, trainable (the model must learn to stop)
    template_hash: str


@dataclass
class Row:
    """One rendered training row: text plus trainable character spans."""

    id: str
    text: str
    spans: list[tuple[int, int]]
    checks: dict[str, int] = field(default_factory=dict)
    history_rewritten: bool = False


def _common_prefix(a: str, b: str) -> str:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return a[:n]


class ChatRenderer:
    """Renders canonical records with a tokenizer's chat template (or an override template)."""

    def __init__(self, tokenizer, chat_template: str | None = None, history_reasoning: str = "keep_as_rendered", epilogue: bool = True):
        if history_reasoning not in HISTORY_POLICIES:
            raise ValueError(f"history_reasoning must be one of {HISTORY_POLICIES}, got {history_reasoning!r}")
        self.template = chat_template or tokenizer.chat_template
        if not self.template:
            raise TemplateError(f"tokenizer {tokenizer.name_or_path!r} has no chat template")
        self.compiled = compile_template(self.template)
        self.kwargs = {k: v for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)}
        self.history_reasoning = history_reasoning
        self.epilogue = epilogue
        self.info = self._probe(tokenizer)
        forbidden = {self.info.end_marker, self.info.header.strip()} | set(tokenizer.all_special_tokens)
        forbidden.discard("")
        self._forbidden_re = re.compile("|".join(map(re.escape, sorted(forbidden, key=len, reverse=True))))

    def render(self, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool = False) -> str:
        return self.compiled.render(messages=messages, tools=tools or None, documents=None,
                                    add_generation_prompt=add_generation_prompt, **self.kwargs)

    def _probe(self, tokenizer) -> TemplateInfo:
        q = [{"role": "user", "content": _PROBE_Q}]
        with_gen, without = self.render(q, None, True), self.render(q, None, False)
        if not with_gen.startswith(without):
            raise TemplateError("add_generation_prompt does not append to the render")
        gen = with_gen[len(without):]
        two = self.render(q + [{"role": "assistant", "content": _PROBE_A}, {"role": "user", "content": _PROBE_Q2}], None)
        if not two.startswith(without) or _PROBE_A not in two:
            raise TemplateError("template does not render a plain assistant turn after the prompt")
        header = _common_prefix(gen, two[len(without):])
        if not header.strip():
            raise TemplateError(f"no assistant header shared by the generation prompt {gen!r}")
        rest = two[two.index(_PROBE_A) + len(_PROBE_A):]
        markers = list(END_MARKERS) + ([tokenizer.eos_token] if tokenizer.eos_token else [])
        end = next((m for m in markers if rest.startswith(m)), None)
        if end is None:
            raise TemplateError(f"can't find the end-of-turn marker after an assistant turn (rendered {rest[:40]!r})")
        return TemplateInfo(gen, header, end, sha256_text(self.template))

    def check_content(self, rec: dict) -> None:
        """Template control strings inside message text would fake turn boundaries."""
        for i, m in enumerate(rec["messages"]):
            texts = [m.get("content", ""), m.get("reasoning_content", "")]
            texts += [json.dumps(c["function"]["arguments"], ensure_ascii=False) for c in m.get("tool_calls") or []]
            for t in texts:
                hit = self._forbidden_re.search(t) if t else None
                if hit:
                    raise RecordError("special_token_in_content", f"message {i} ({m['role']}) contains {hit.group(0)!r}")

    def _spans(self, text: str, msgs: list[dict], tools: list[dict]) -> tuple[list[tuple[int, int]], list[str]]:
        """Per assistant turn: (start, end) in `text` and the prefix-check outcome."""
        info = self.info
        idx = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
        spans, checks, pos = [], [], 0
        tail = info.gen_prompt[len(info.header):]
        for i in idx:
            h = text.find(info.header, pos)
            if h < 0:
                raise RecordError("template_span_mismatch", f"assistant turn {i} not found in the render")
            start = h + len(info.header)
            if tail and text.startswith(tail, start):
                start += len(tail)
            e = text.find(info.end_marker, start)
            if e < 0:
                raise RecordError("template_span_mismatch", f"assistant turn {i} has no end-of-turn marker")
            end = e + len(info.end_marker)
            prefix = self.render(msgs[:i], tools, add_generation_prompt=True)
            ctx = prefix[: len(prefix) - len(info.gen_prompt)]
            reasoning = (msgs[i].get("reasoning_content") or "").strip()
            if reasoning and reasoning not in text[start:end]:
                checks.append("rewritten")  # the template dropped this turn's own reasoning
            elif text.startswith(prefix) and start == len(prefix):
                checks.append("ok")
            elif text.startswith(ctx + info.header) and h == len(ctx) and prefix.endswith(info.gen_prompt):
                checks.append("no_gen_suffix")
            else:
                checks.append("rewritten")
            spans.append((start, end))
            pos = end
        if text.find(info.header, pos) >= 0:
            raise RecordError("template_span_mismatch", "more assistant headers rendered than assistant turns")
        return spans, checks

    def rows(self, rec: dict) -> list[Row]:
        """Rendered rows for one canonical record (raises RecordError to quarantine it)."""
        self.check_content(rec)
        msgs, tools = rec["messages"], rec["tools"]
        text = self.render(msgs, tools)
        spans, checks = self._spans(text, msgs, tools)
        rewritten = "rewritten" in checks
        if rewritten and self.history_reasoning == "reject":
            raise RecordError("history_rewritten", f"{checks.count('rewritten')} assistant turn(s) render differently in the full conversation than when generated")
        if rewritten and self.history_reasoning == "per_turn":
            rows = self._per_turn_rows(rec)
        else:
            rows = [Row(rec["id"], text, spans, _count(checks), rewritten)]
        if self.epilogue and rec["domain"] == "code" and rec["terminator"] == "finish":
            epi = epilogue_text(rec.get("task") or "")
            if not epi:
                raise RecordError("no_headline", "epilogue=true but the task has no title or non-empty first line")
            if self._forbidden_re.search(epi):
                raise RecordError("special_token_in_content", "the epilogue headline contains a template control string")
            rec["epilogue"] = epi  # recorded in the row's `messages` JSON
            _append_epilogue(rows[-1], epi, self.info.end_marker)
        return rows

    def _per_turn_rows(self, rec: dict) -> list[Row]:
        msgs, tools = rec["messages"], rec["tools"]
        users = [i for i, m in enumerate(msgs) if m["role"] == "user"]
        rows = []
        for k, u in enumerate(users):
            stop = users[k + 1] if k + 1 < len(users) else len(msgs)
            while stop > u and msgs[stop - 1]["role"] != "assistant":
                stop -= 1
            if stop <= u + 1:
                continue
            sub = msgs[:stop]
            text = self.render(sub, tools)
            spans, checks = self._spans(text, sub, tools)
            own_asst = [i for i, m in enumerate(sub) if m["role"] == "assistant"]
            own = [j for j, i in enumerate(own_asst) if i > u]
            if any(checks[j] == "rewritten" for j in own):
                raise RecordError("history_rewritten", f"turns after user message {u} still render rewritten")
            rows.append(Row(f"{rec['id']}#q{k}", text, [spans[j] for j in own], _count([checks[j] for j in own]), True))
        if not rows:
            raise RecordError("history_rewritten", "no per-turn rows could be formed")
        return rows


def _count(checks: list[str]) -> dict[str, int]:
    return {c: checks.count(c) for c in ("ok", "no_gen_suffix", "rewritten") if c in checks}


def _append_epilogue(row: Row, epi: str, end_marker: str) -> None:
    """Insert the dual-terminator epilogue after the final call, before the end-of-turn marker,
    inside the final turn's trainable span (the templates render content before tool calls, so it
    can't be expressed as message content)."""
    start, end = row.spans[-1]
    at = end - len(end_marker)
    row.text = row.text[:at] + epi + row.text[at:]
    row.spans[-1] = (start, end + len(epi))


def label_tokens(input_ids: list[int], offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[int]:
    """Labels aligned with input_ids: the token id inside a trainable span, -100 elsewhere.
    A token straddling a span boundary means the full-text tokenization differs from
    prompt + generation tokenization there: quarantined, never guessed."""
    ids = np.asarray(input_ids, dtype=np.int64)
    offs = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    labels = np.full(len(ids), -100, dtype=np.int64)
    starts, ends = offs[:, 0], offs[:, 1]
    for a, b in spans:
        i0 = int(np.searchsorted(starts, a, side="left"))
        i1 = int(np.searchsorted(ends, b, side="right"))
        if (i0 > 0 and ends[i0 - 1] > a) or (i1 < len(ids) and starts[i1] < b):
            raise RecordError("token_straddles_span_boundary", f"a token crosses the span boundary at chars {a}..{b}")
        labels[i0:i1] = ids[i0:i1]
    return labels.tolist()


class Straddle(Exception):
    pass


def _segments(row: Row) -> list[tuple[str, bool]]:
    """The row's text cut at span boundaries: (text, trainable) pieces in order."""
    out, pos = [], 0
    for a, b in row.spans:
        if a > pos:
            out.append((row.text[pos:a], False))
        out.append((row.text[a:b], True))
        pos = b
    if pos < len(row.text):
        out.append((row.text[pos:], False))
    return out


def tokenize_rows(tokenizer, rows: list[Row]) -> list[tuple[list[int], list[int], bool]]:
    """(input_ids, labels, boundary_retokenized) per row.

    The whole render is tokenized once (batched) and labelled by offsets. Where a token straddles
    a span boundary (e.g. Qwen3's `<think>\\n` prompt followed by a generated `\\n</think>`: the
    full text merges `\\n\\n` into one token, which the model never emits after the prompt), that
    row is tokenized piecewise at its span boundaries instead — prompt and generation separately,
    as at inference — and counted."""
    ids, offsets = _encode([r.text for r in rows], tokenizer)
    out: list = [None] * len(rows)
    redo = []
    for k, row in enumerate(rows):
        try:
            out[k] = (ids[k], label_tokens(ids[k], offsets[k], row.spans), False)
        except RecordError as exc:
            if exc.reason != "token_straddles_span_boundary":
                raise
            redo.append(k)
    if redo:
        pieces = [(k, seg) for k in redo for seg in _segments(rows[k])]
        piece_ids, _ = _encode([s for _, (s, _) in pieces], tokenizer)
        acc: dict[int, tuple[list[int], list[int]]] = {k: ([], []) for k in redo}
        for (k, (_, trainable)), piece in zip(pieces, piece_ids):
            acc[k][0].extend(piece)
            acc[k][1].extend(piece if trainable else [-100] * len(piece))
        for k in redo:
            out[k] = (acc[k][0], acc[k][1], True)
    return out


def _encode(texts: list[str], tokenizer) -> tuple[list[list[int]], list[list[tuple[int, int]]]]:
    """Batch-encode without special tokens: (ids, char offsets) per text. Fast tokenizers go
    straight to the Rust backend (same ids as `tokenizer(texts)`, less wrapping)."""
    backend = getattr(tokenizer, "backend_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None
    if backend is not None:
        encs = backend.encode_batch(texts, add_special_tokens=False)
        return [e.ids for e in encs], [e.offsets for e in encs]
    enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
    return enc["input_ids"], enc["offset_mapping"]
