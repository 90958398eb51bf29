"""Teacher-forced loss on gold trajectories, split by what each trained token is part of.

A record (data-prep's canonical record, the `messages` column of a dataset) is rendered and masked
exactly as in training (`data_prep.render.ChatRenderer.rows` + `tokenize_rows`); each trainable token
gets the per-token cross-entropy the trainer sums (fp32 logits; `sft.train.micro_batch_loss` is that
sum divided by the trainable-token count) and a span kind, defined from the record's message fields:

    reasoning        the assistant turn's `reasoning_content`
    assistant_text   its `content`, except a `Final answer:` line
    final_answer     a `Final answer: …` line of the content, and the dual-terminator epilogue
    tool_name        a tool call's function name (not finish/submit)
    tool_arguments   that call's arguments (the JSON object the template renders)
    finish_call      the name and arguments of a `finish`/`submit` call
    template         everything else the model generates: think/tool-call tags, the end-of-turn marker

A token takes the kind of its first non-space character (its first character when it is all space).
The kinds partition the trainable tokens, so the span totals add up to the record's total loss.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import numpy as np

from evals.errors import EvalError

SPAN_KINDS = ("reasoning", "assistant_text", "final_answer", "tool_name", "tool_arguments", "finish_call", "template")
FINISH_TOOLS = ("finish", "submit")
_FINAL_LINE = re.compile(r"final answer\s*:[^\n]*", re.IGNORECASE)
_TEMPLATE = SPAN_KINDS.index("template")


class SpanError(EvalError):
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


def per_token_losses(model, input_ids: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The cross-entropy of every token whose label is set (NaN elsewhere), as the trainer computes
    it: logits at position t (fp32) predict labels[t + 1]."""
    import torch

    from sft.data import shift_per_sequence

    device = next(model.parameters()).device
    ids = torch.as_tensor(np.asarray(input_ids, dtype=np.int64)).unsqueeze(0).to(device)
    target = torch.as_tensor(shift_per_sequence(np.asarray(labels, dtype=np.int64)))
    with torch.no_grad():
        positions = torch.arange(ids.shape[1], device=device).unsqueeze(0)
        logits = model(input_ids=ids, position_ids=positions, use_cache=False).logits[0]
        loss = torch.nn.functional.cross_entropy(logits.float(), target.to(device), ignore_index=-100, reduction="none")
    out = np.full(len(labels), np.nan)
    keep = target.numpy() != -100
    out[1:][keep[:-1]] = loss.double().cpu().numpy()[:-1][keep[:-1]]  # target t is token t + 1
    return out


@dataclass
class SpanLosses:
    """Summed token loss and token count per span kind (over one record or many)."""

    loss: dict[str, float] = field(default_factory=lambda: dict.fromkeys(SPAN_KINDS, 0.0))
    tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SPAN_KINDS, 0))

    def add(self, other: "SpanLosses") -> None:
        for k in SPAN_KINDS:
            self.loss[k] += other.loss[k]
            self.tokens[k] += other.tokens[k]

    @property
    def total(self) -> float:
        return sum(self.loss.values())

    @property
    def n(self) -> int:
        return sum(self.tokens.values())

    def means(self) -> dict[str, float | None]:
        """Mean loss per token of each kind (None for a kind with no token), and `all`."""
        out = {k: (self.loss[k] / self.tokens[k] if self.tokens[k] else None) for k in SPAN_KINDS}
        out["all"] = self.total / self.n if self.n else None
        return out


def record_losses(model, tokenizer, renderer, rec: dict) -> SpanLosses:
    """Teacher-forced losses of one canonical record, by span kind, over every row training makes of it."""
    from data_prep.render import token_offsets, tokenize_rows

    out = SpanLosses()
    for row, kinds in char_kinds(renderer, rec):
        (tok,) = tokenize_rows(tokenizer, [row])
        ids, offsets = token_offsets(tokenizer, row)
        if list(ids) != list(tok.input_ids):
            raise SpanError(f"record {rec.get('id')!r}: token offsets disagree with the training tokens")
        labels = np.asarray(tok.labels, dtype=np.int64)
        losses = per_token_losses(model, np.asarray(ids), labels)
        per_token = token_kinds(kinds, row.text, offsets)
        for j in np.flatnonzero(labels != -100):
            if j == 0:
                continue  # the first token is never a target (nothing predicts it)
            kind = SPAN_KINDS[per_token[j]] if per_token[j] >= 0 else "template"
            out.loss[kind] += float(losses[j])
            out.tokens[kind] += 1
    return out


# ---------------------------------------------------------------- the teacher-forced benches
# `tf_<domain>`: the loss at a checkpoint on the held-out gold trajectories of one domain
# (data_prep.heldout; evaluate's `heldout=DIR`), by span kind. HF backend only (it needs the logits).
BENCHES = {"tf_code": "code", "tf_search": "search"}


@dataclass(frozen=True)
class HeldoutItem:
    """One held-out record as an evaluation item: `id`, the canonical `record`, its content `digest`.
    `question` / `golden_answers` / `extra` are what evaluate's item digest reads of any item."""
    id: str
    record: dict
    digest: str

    @property
    def question(self) -> str:
        return str(self.record.get("task") or "")

    @property
    def golden_answers(self) -> list:
        return [self.record["answer"]] if self.record.get("answer") is not None else []

    @property
    def extra(self) -> dict:
        return {"digest": self.digest}


def source(cfg) -> str:
    """A teacher-forced bench's source: the held-out dir's manifest (its digest is the bench's identity)."""
    from pathlib import Path

    if not cfg.get("heldout"):
        raise EvalError("the teacher-forced benches (tf_code, tf_search) need heldout=DIR (a `data-prep heldout` dir)")
    return str(Path(cfg.heldout) / "manifest.json")


def items(bench: str, cfg, n: int | None, seed: int) -> tuple[list[HeldoutItem], str, int]:
    """The held-out records of the bench's domain (a verified held-out dir): a seeded shuffle, first n."""
    import random

    from data_prep import heldout
    from data_prep.errors import DataPrepError

    try:
        held = heldout.load(cfg.heldout)
        recs = held.records(BENCHES[bench])
    except DataPrepError as exc:
        raise EvalError(str(exc)) from None
    digests = held.digests[BENCHES[bench]]
    out = [HeldoutItem(str(r["id"]), r, digests[str(r["id"])]) for r in recs]
    random.Random(seed).shuffle(out)
    return (out if not n or n < 0 else out[:n]), source(cfg), 0


def meta(cfg) -> dict:
    """meta.json's `teacher_forced` block: the held-out set and how its records are rendered."""
    from data_prep import heldout

    held = heldout.load(cfg.heldout)
    man = held.manifest
    return {"heldout": str(held.dir), "fingerprint": held.fingerprint, "seed": man.get("seed"),
            "records": {d: len(v) for d, v in held.digests.items()}, "render": man.get("render_settings"),
            "template": man.get("template"), "tokenizer": (man.get("tokenizer") or {}).get("name"),
            "span_kinds": list(SPAN_KINDS)}


def check_training_data(cfg) -> str | None:
    """Refuse (data_prep's HeldoutError, as an EvalError) a checkpoint whose run manifest names training
    data that holds a held-out record; returns the training dir checked (None: the checkpoint is not
    in a run dir, or its manifest names no data dir)."""
    from pathlib import Path

    from common import layout
    from common.io import read_json_object
    from data_prep import heldout
    from data_prep.errors import DataPrepError

    ckpt = Path(str(cfg.ckpt))
    man_path = ckpt.parent.parent / layout.MANIFEST
    if ckpt.parent.name != layout.CHECKPOINTS or not man_path.is_file():
        return None
    try:
        data_dir = (read_json_object(man_path).get("data") or {}).get("dir")
    except ValueError as exc:
        raise EvalError(str(exc)) from None
    if not data_dir:
        return None
    try:
        heldout.check_disjoint(heldout.load(cfg.heldout), data_dir)
    except DataPrepError as exc:
        raise EvalError(f"{exc} (the training data of {man_path})") from None
    return str(data_dir)


def summarize(rows: list[dict]) -> dict:
    """Per span kind the mean loss per token over every record's tokens (`loss_<kind>`, only for kinds
    with tokens) and their count (`tokens_<kind>`); `loss`/`tokens` over all kinds; n = records."""
    total = SpanLosses()
    for r in rows:
        total.add(SpanLosses(dict(r["loss"]), dict(r["tokens"])))
    out: dict = {"n": len(rows)}
    means = total.means()
    if total.n:
        out["loss"] = means["all"]
    out["tokens"] = total.n
    for k in SPAN_KINDS:
        if total.tokens[k]:
            out[f"loss_{k}"] = means[k]
        out[f"tokens_{k}"] = total.tokens[k]
    return out


def score(work_items: list[HeldoutItem], model, tokenizer, render: dict):
    """One row per held-out record (in order): per span kind its loss sum and token count, and the totals."""
    from data_prep.render import ChatRenderer

    renderer = ChatRenderer(tokenizer, **render)
    for item in work_items:
        spans = record_losses(model, tokenizer, renderer, item.record)
        yield {"id": item.id, "digest": item.digest, "domain": item.record.get("domain"),
               "loss": spans.loss, "tokens": spans.tokens, "total_loss": spans.total, "total_tokens": spans.n}
