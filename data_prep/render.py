"""Chat-template rendering and loss masks.

Trainable text is exactly what the model generates at inference for each assistant turn:
everything after the generation prompt (`<|im_start|>assistant\\n<think>\\n` for Qwen3
Thinking-2507, `<|start_header_id|>assistant<|end_header_id|>\\n\\n` for Llama-3.1) up to and
including the end-of-turn marker (`<|im_end|>` / `<|eot_id|>`). Nothing from system, user or tool
turns.

Method (default `history_reasoning=exact`): for each assistant turn i, its prompt is
`render(messages[:i], add_generation_prompt=True)` and its generation is `render(messages[:i+1])`
minus that prompt, through the end-of-turn marker — exactly what the model saw and wrote at that
turn (for Thinking-2507, a turn without reasoning generates an empty think block `\n</think>\n\n`
before its content). A row is the render up to some turn; every earlier turn whose prompt +
generation is a prefix of it is trained there too, so a conversation the template renders
consistently is one row, and each turn the template later rewrites (Qwen3 drops the reasoning of
turns before the last real user query, and renders a non-final turn without reasoning without its
think block) is trained once, in its own row, as the model generated it. Each assistant turn is
trainable in exactly one row. Tokens are then labelled by their character offsets.

`keep_as_rendered` (opt-in, inexact) trains the single full render as the template rewrites it and
counts the turns and tokens that differ from what the model generated; `reject` quarantines records
that need more than one row. Thoughts a template cannot render (Llama-3.1 drops `content` beside a
tool call and has no reasoning channel) reject the record (`thought_before_call`,
`reasoning_not_rendered`) unless `thoughts=drop`, which trains without them and counts them inexact.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from common.io import sha256_text
from data_prep.config import HISTORY_POLICIES, THOUGHT_POLICIES
from data_prep.jinja_env import compile_template
from data_prep.schema import ROW_SEP, RecordError
from data_prep.terminators import epilogue_text
from data_prep.errors import DataPrepError

END_MARKERS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "</s>")
# `exact` (default): every trainable token is what the model generated, in its own context.
# `keep_as_rendered` (inexact, opt-in): one row, the full render, trained as the template rewrites it.
# `reject`: quarantine records that need more than one row to be exact.
# Thoughts a template cannot render (Llama-3.1: content beside a tool call, any reasoning_content):
# `reject` the record (default) or `drop` them (the turn's tokens are counted inexact).
# (HISTORY_POLICIES and THOUGHT_POLICIES: the data keys' values, defined with their fields in data_prep.config.)
_PROBE_Q, _PROBE_A, _PROBE_Q2 = "PROBE-QUESTION-7f3a", "PROBE-ANSWER-7f3a", "PROBE-NEXT-7f3a"


class TemplateError(DataPrepError):
    """A chat template whose turn structure can't be derived."""


@dataclass(frozen=True)
class TemplateInfo:
    gen_prompt: str   # what add_generation_prompt appends
    header: str       # the part of the generation prompt every rendered assistant turn starts with
    end_marker: str   # end-of-turn text, trainable (the model must learn to stop)
    template_hash: str


@dataclass
class Turn:
    """One assistant turn as generated: `prompt` is what the model saw, `gen` what it wrote
    (through the end-of-turn marker); `tail` is what the template renders after the marker when
    the turn is the last message; `dropped`: a thought the template cannot render was left out."""

    index: int
    prompt: str
    gen: str
    tail: str
    dropped: bool = False


@dataclass
class Row:
    """One rendered training row: text plus trainable character spans, and per span whether it is
    exact (the text before it is the turn's prompt, the span its generation)."""

    id: str
    text: str
    spans: list[tuple[int, int]]
    exact: list[bool] = field(default_factory=list)
    withheld: str = ""  # epilogue=false: the epilogue the row would carry with epilogue=true
    epilogue: tuple[int, int] | None = None  # the epilogue's (start, end) in `text`, in the record's last row

    @property
    def checks(self) -> dict[str, int]:
        n_exact = sum(self.exact)
        return {k: v for k, v in (("exact", n_exact), ("as_rendered", len(self.exact) - n_exact)) if v}


def _common_prefix(a: str, b: str) -> str:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return a[:n]


class ChatRenderer:
    """Renders canonical records with a tokenizer's chat template (or an override template)."""

    def __init__(self, tokenizer, chat_template: str | None = None, history_reasoning: str = "exact", epilogue: bool = True,
                 thoughts: str = "reject"):
        if history_reasoning not in HISTORY_POLICIES:
            raise ValueError(f"history_reasoning must be one of {HISTORY_POLICIES}, got {history_reasoning!r}")
        if thoughts not in THOUGHT_POLICIES:
            raise ValueError(f"thoughts must be one of {THOUGHT_POLICIES}, got {thoughts!r}")
        self.thoughts = thoughts
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

    def _render_record(self, msgs: list[dict], tools: list[dict] | None, add_generation_prompt: bool = False) -> str:
        """`render` for a record's messages. A template that refuses parallel tool calls (Llama-3.1)
        rejects that record as `parallel_tool_calls_unsupported`; any other exception the template
        raises propagates (the build quarantines the record with its type and message)."""
        try:
            return self.render(msgs, tools, add_generation_prompt)
        except Exception as exc:
            if any(len(m.get("tool_calls") or []) > 1 for m in msgs):
                raise RecordError("parallel_tool_calls_unsupported",
                                  f"the chat template refuses this conversation's parallel tool calls: {exc}") from None
            raise

    def generations(self, rec: dict) -> list[Turn]:
        """Per assistant turn: the prompt the model saw (`render(messages[:i], add_generation_prompt=True)`)
        and what it generated (`render(messages[:i+1])` minus that prompt, through the end-of-turn
        marker). Thoughts the template cannot render (Llama-3.1 drops `content` beside a tool call and
        has no reasoning channel) reject the record, or with `thoughts=drop` are left out and the
        turn counted inexact."""
        msgs, tools, end = rec["messages"], rec["tools"], self.info.end_marker
        turns = []
        for i, m in enumerate(msgs):
            if m["role"] != "assistant":
                continue
            prompt = self._render_record(msgs[:i], tools, add_generation_prompt=True)
            full = self._render_record(msgs[: i + 1], tools)
            start = self._gen_start(msgs, i, prompt, full)
            e = full.find(end, start)
            if e < 0:
                raise RecordError("template_span_mismatch", f"assistant turn {i} has no end-of-turn marker")
            gen = full[start: e + len(end)]
            lost = self._unrendered_thought(msgs[: i + 1], tools, full, gen)
            if lost and self.thoughts == "reject":
                raise RecordError(lost, f"assistant turn {i}: the chat template does not render its "
                                  f"{'thought before the tool call' if lost == 'thought_before_call' else 'reasoning'} "
                                  "(thoughts=drop trains without it, counted inexact)")
            turns.append(Turn(i, prompt, gen, full[e + len(end):], dropped=bool(lost)))
        if not turns:
            raise RecordError("no_assistant_turn", "no assistant turn to train on")
        return turns

    def _gen_start(self, msgs: list[dict], i: int, prompt: str, full: str) -> int:
        """Where turn i's generation starts in `full` (the render through it): after `prompt`, or, when
        the turn before is an assistant turn the template renders anew once another follows it (Qwen3:
        a turn without reasoning loses its think block), after this turn's own generation prompt."""
        if full.startswith(prompt):
            return len(prompt)
        at = full.rfind(self.info.gen_prompt)
        if msgs[i - 1]["role"] != "assistant" or at < 0:
            raise RecordError("template_span_mismatch", f"assistant turn {i}: the chat template renders the conversation before "
                              f"it differently once the turn follows (after message {i - 1}, a {msgs[i - 1]['role']} turn), "
                              "so what the model saw at this turn is not defined")
        return at + len(self.info.gen_prompt)

    def _unrendered_thought(self, msgs: list[dict], tools, full: str, gen: str) -> str | None:
        """Why the last turn's own thought is missing from its render, or None. A thought whose text
        is absent from the render is lost; a short one that appears (it may occur by chance) is lost
        if rendering without it changes nothing."""
        m = msgs[-1]
        for key, reason, applies in (("content", "thought_before_call", bool(m.get("tool_calls"))),
                                     ("reasoning_content", "reasoning_not_rendered", True)):
            text = (m.get(key) or "").strip()
            if not (text and applies):
                continue
            if text not in gen or (
                    len(text) < 64 and self._render_record([*msgs[:-1], {**m, key: ""}], tools) == full):
                return reason
        return None

    def rows(self, rec: dict) -> list[Row]:
        """Rendered rows for one canonical record (raises RecordError to quarantine it).

        `exact` (default): each assistant turn is trainable in exactly one row, in which the text
        before it is its own prompt and its span is its own generation. Rows are the fewest
        possible: the latest untrained turn heads a row (its prompt + generation), and every
        earlier untrained turn whose prompt + generation is a prefix of that row is trained there
        too. A single row when the template never rewrites history (the usual case); one more row
        per rewritten turn otherwise (Qwen3: a turn before a later user query, or a non-final
        turn without reasoning)."""
        self.check_content(rec)
        turns = self.generations(rec)
        if self.history_reasoning == "keep_as_rendered":
            rows = [self._as_rendered_row(rec, turns)]
        else:
            rows = self._exact_rows(rec, turns)
            if len(rows) > 1 and self.history_reasoning == "reject":
                raise RecordError("history_rewritten", f"{len(rows) - 1} assistant turn(s) render differently later in the "
                                  "conversation than when generated (history_reasoning=exact trains them in extra rows)")
        if rec["domain"] == "code" and rec["terminator"] == "finish":  # checked with epilogue=false too: r2e_v5 holds r2e's records
            epi = epilogue_text(rec.get("task") or "")
            if not epi:
                raise RecordError("no_headline", "the task has no title or non-empty first line for the epilogue")
            if self._forbidden_re.search(epi):
                raise RecordError("special_token_in_content", "the epilogue headline contains a template control string")
            if self.epilogue:
                rec["epilogue"] = epi  # recorded in the row's `messages` JSON
                _append_epilogue(rows[-1], epi, self.info.end_marker)
            else:  # its tokens still count against max_seq_len (length_policy=drop), as they do for r2e
                rows[-1].withheld = epi
        return rows

    def _exact_rows(self, rec: dict, turns: list[Turn]) -> list[Row]:
        left = list(range(len(turns)))
        heads: list[tuple[int, list[int]]] = []
        while left:
            h = left[-1]
            head_text = turns[h].prompt + turns[h].gen
            members = [k for k in left if k == h or _fits(head_text, turns[k])]
            heads.append((h, members))
            left = [k for k in left if k not in members]
        heads.reverse()  # chronological: the final turn (and its epilogue) is in the last row
        rows = []
        for r, (h, members) in enumerate(heads):
            t = turns[h]
            spans = [(len(turns[k].prompt), len(turns[k].prompt) + len(turns[k].gen)) for k in members]
            rid = rec["id"] if len(heads) == 1 else f"{rec['id']}{ROW_SEP}{r}"
            # the head's own render (with what the template writes after its end marker, e.g. Qwen3's
            # newline, as context), so a single-row record is exactly the full render
            rows.append(Row(rid, t.prompt + t.gen + t.tail, spans, [not turns[k].dropped for k in members]))
        return rows

    def _as_rendered_row(self, rec: dict, turns: list[Turn]) -> Row:
        """keep_as_rendered (opt-in, inexact): the whole conversation rendered once, each assistant
        turn trained as it appears there; a turn is exact only if the text before its span is its
        prompt and the span its generation."""
        msgs, info = rec["messages"], self.info
        text = self._render_record(msgs, rec["tools"])
        tail = info.gen_prompt[len(info.header):]
        spans, exact, pos = [], [], 0
        for t in turns:
            h = text.find(info.header, pos)
            if h < 0:
                raise RecordError("template_span_mismatch", f"assistant turn {t.index} not found in the render")
            start = h + len(info.header)
            if tail and text.startswith(tail, start):
                start += len(tail)
            e = text.find(info.end_marker, start)
            if e < 0:
                raise RecordError("template_span_mismatch", f"assistant turn {t.index} has no end-of-turn marker")
            end = e + len(info.end_marker)
            spans.append((start, end))
            exact.append(not t.dropped and start == len(t.prompt) and text.startswith(t.prompt + t.gen))
            pos = end
        if text.find(info.header, pos) >= 0:
            raise RecordError("template_span_mismatch", "more assistant headers rendered than assistant turns")
        return Row(rec["id"], text, spans, exact)


def _fits(text: str, t: Turn) -> bool:
    """Turn `t` can be trained inside a row of `text`: its prompt + generation are a prefix of it, and the
    boundary between them is not whitespace on both sides, where a token could join them and change the
    tokens of the later context (Qwen3: a kept empty think block, `<think>\n` + `\n</think>`)."""
    return (text.startswith(t.prompt) and text.startswith(t.gen, len(t.prompt))
            and not (t.prompt[-1:].isspace() and t.gen[:1].isspace()))


def _append_epilogue(row: Row, epi: str, end_marker: str) -> None:
    """Insert the dual-terminator epilogue after the final call, before the end-of-turn marker,
    inside the final turn's trainable span (the templates render content before tool calls, so it
    can't be expressed as message content)."""
    start, end = row.spans[-1]
    at = end - len(end_marker)
    row.text = row.text[:at] + epi + row.text[at:]
    row.spans[-1] = (start, end + len(epi))
    row.epilogue = (at, at + len(epi))


class Tokenized(NamedTuple):
    input_ids: list[int]
    labels: list[int]            # the token id inside a trainable span, -100 elsewhere
    retokenized: bool            # cut at a span boundary a token would otherwise cross
    inexact: np.ndarray | None   # per token: inside an inexact span (None: every span exact)
    epilogue_chars: tuple[tuple[int, int], ...] = ()  # (token, characters of the epilogue through it) per epilogue token


def _straddled(offs: np.ndarray, cuts: list[int]) -> set[int]:
    """The boundaries in `cuts` that some token crosses (starts before, ends after)."""
    if not len(offs):
        return set()
    starts, ends = offs[:, 0], offs[:, 1]
    bad = set()
    for c in cuts:
        i = int(np.searchsorted(ends, c, side="right"))  # first token ending after c
        if i < len(starts) and starts[i] < c:
            bad.add(c)
    return bad


def _encode_cut(tokenizer, text: str, cuts: set[int]) -> tuple[list[int], np.ndarray]:
    """Tokenize `text` in pieces split at `cuts`; offsets refer to `text`."""
    edges = [0, *sorted(c for c in cuts if 0 < c < len(text)), len(text)]
    pieces = [text[a:b] for a, b in zip(edges, edges[1:])]
    ids_list, offs_list = _encode(pieces, tokenizer)
    ids, offs = [], []
    for a, pid, poff in zip(edges, ids_list, offs_list):
        ids.extend(pid)
        offs.extend((x + a, y + a) for x, y in poff)
    return ids, np.asarray(offs, dtype=np.int64).reshape(-1, 2)


def _label(row: "Row", ids: list[int], offs: np.ndarray) -> tuple[list[int], np.ndarray | None]:
    labels = np.full(len(ids), -100, dtype=np.int64)
    inexact = np.zeros(len(ids), dtype=bool) if not all(row.exact) else None
    starts = offs[:, 0] if len(offs) else np.zeros(0, dtype=np.int64)
    arr = np.asarray(ids, dtype=np.int64)
    for (a, b), ok in zip(row.spans, row.exact):
        i0, i1 = int(np.searchsorted(starts, a, side="left")), int(np.searchsorted(starts, b, side="left"))
        labels[i0:i1] = arr[i0:i1]
        if not ok:
            inexact[i0:i1] = True
    return labels.tolist(), inexact


def tokenize_rows(tokenizer, rows: list[Row]) -> list[Tokenized]:
    """Tokens and labels per row.

    The whole row text is tokenized (batched) and labelled by character offsets. Where a token
    crosses a span boundary (e.g. Qwen3's `<think>\n` prompt followed by a generated `\n</think>`:
    the full text merges `\n\n` into one token, which the model never emits after the prompt), the
    row is tokenized in pieces cut at exactly those boundaries — prompt and generation separately,
    as at inference — and counted as retokenized."""
    ids_all, offs_all = _encode([r.text for r in rows], tokenizer)
    out = []
    for row, ids, offs in zip(rows, ids_all, offs_all):
        ids, offs, retok = _cut_at_spans(tokenizer, row, ids, offs)
        labels, inexact = _label(row, ids, offs)
        out.append(Tokenized(list(ids), labels, retok, inexact, _epilogue_chars(row, offs)))
    return out


def _epilogue_chars(row: Row, offs: np.ndarray) -> tuple[tuple[int, int], ...]:
    """(token index, how many characters of the epilogue a cut after that token keeps) per token of the epilogue."""
    if row.epilogue is None:
        return ()
    a, b = row.epilogue
    toks = np.flatnonzero((offs[:, 1] > a) & (offs[:, 0] < b))
    return tuple((int(k), min(int(offs[k, 1]), b) - a) for k in toks)


def _cut_at_spans(tokenizer, row: Row, ids, offs) -> tuple[list[int], np.ndarray, bool]:
    """(ids, char offsets, retokenized) of `row.text`, re-encoded in pieces where a token crosses a span boundary."""
    offs = np.asarray(offs, dtype=np.int64).reshape(-1, 2)
    bounds = sorted({x for span in row.spans for x in span})
    cuts = _straddled(offs, bounds)
    retok = bool(cuts)
    while cuts:  # cutting may (rarely) make another boundary straddled: cut there too
        ids, offs = _encode_cut(tokenizer, row.text, cuts)
        more = _straddled(offs, bounds) - cuts
        if not more:
            break
        cuts |= more
    return list(ids), offs, retok


def withheld_tokens(tokenizer, rows: list[Row]) -> list[int]:
    """Per row, the number of tokens of its withheld epilogue (0 without one)."""
    return [len(_encode([r.withheld], tokenizer)[0][0]) if r.withheld else 0 for r in rows]


def token_offsets(tokenizer, row: Row) -> tuple[list[int], np.ndarray]:
    """The token ids `tokenize_rows` gives `row` and each token's (start, end) character offsets in
    `row.text` (for labelling tokens by what part of a message they come from)."""
    (ids,), (offs,) = _encode([row.text], tokenizer)
    ids, offs, _ = _cut_at_spans(tokenizer, row, ids, offs)
    return ids, offs


def _encode(texts: list[str], tokenizer) -> tuple[list[list[int]], list[list[tuple[int, int]]]]:
    """Batch-encode without special tokens: (ids, char offsets) per text. Fast tokenizers go
    straight to the Rust backend (same ids as `tokenizer(texts)`, less wrapping)."""
    backend = getattr(tokenizer, "backend_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None
    if backend is not None:
        encs = backend.encode_batch(texts, add_special_tokens=False)
        return [e.ids for e in encs], [e.offsets for e in encs]
    enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
    return enc["input_ids"], enc["offset_mapping"]
