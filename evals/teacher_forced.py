"""Teacher-forced loss on gold trajectories, split by what each trained token is part of.

A record (data-prep's canonical record, the `messages` column of a dataset) is rendered and masked
exactly as in training (`data_prep.render.ChatRenderer.rows` + `tokenize_rows`), each token with its
span kind (data_prep.spans: SPAN_KINDS, `SpanTokenizer`); here each trainable token gets the
per-token cross-entropy the trainer sums (fp32 logits; `sft.train.micro_batch_loss` is that sum
divided by the trainable-token count), summed per kind. The kinds (data_prep.spans: `reasoning`,
`assistant_text`, `final_answer`, `tool_name`, `tool_arguments`, `finish_call`, `template`) are defined
from the record's message fields; a token takes the kind of its first non-space character. They
partition the trainable tokens, so the span totals add up to the record's total loss.

The benches `tf_code` / `tf_search` score a held-out set (data_prep.heldout) that evaluate opens once
per call (`open_heldout`, the registry's `opens`): its items, its meta.json block and the rendering
of its records all come from that one verified `Heldout`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from common.labels import IGNORE, shift_per_sequence
from data_prep.spans import SPAN_KINDS
from evals.errors import EvalError
from evals.metrics import MetricSpec


def per_token_losses(model, input_ids: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The cross-entropy of every token whose label is set (NaN elsewhere), as the trainer computes
    it: logits at position t (fp32) predict labels[t + 1]."""
    import torch

    device = next(model.parameters()).device
    ids = torch.as_tensor(np.asarray(input_ids, dtype=np.int64)).unsqueeze(0).to(device)
    target = torch.as_tensor(shift_per_sequence(np.asarray(labels, dtype=np.int64)))
    with torch.no_grad():
        positions = torch.arange(ids.shape[1], device=device).unsqueeze(0)
        logits = model(input_ids=ids, position_ids=positions, use_cache=False).logits[0]
        loss = torch.nn.functional.cross_entropy(logits.float(), target.to(device), ignore_index=IGNORE, reduction="none")
    out = np.full(len(labels), np.nan)
    keep = target.numpy() != IGNORE
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


def record_losses(model, rows) -> SpanLosses:
    """Teacher-forced losses of one canonical record, by span kind, over every row training makes of
    it: `rows`, the record's data_prep.spans.SpanRow list (`SpanTokenizer(tokenizer, ...)(record)`)."""
    out = SpanLosses()
    for row in rows:
        losses = per_token_losses(model, row.input_ids, row.labels)
        for j in np.flatnonzero(row.labels != IGNORE):
            if j == 0:
                continue  # the first token is never a target (nothing predicts it)
            kind = SPAN_KINDS[row.kinds[j]] if row.kinds[j] >= 0 else "template"
            out.loss[kind] += float(losses[j])
            out.tokens[kind] += 1
    return out


# ---------------------------------------------------------------- the teacher-forced benches
# `tf_<domain>`: the loss at a checkpoint on the held-out gold trajectories of one domain
# (data_prep.heldout; evaluate's `heldout=DIR`), by span kind. HF backend only (it needs the logits).
BENCHES = {"tf_code": "code", "tf_search": "search"}
_LOSS, _TOKENS = MetricSpec(0.0, what="a mean token loss >= 0"), MetricSpec(0, integer=True, what="a count of tokens >= 0")
# the summary's metrics (`summarize`): the mean loss per token, overall and per span kind, and the token counts it is over
METRICS = {"loss": _LOSS, "tokens": _TOKENS, **{f"loss_{k}": _LOSS for k in SPAN_KINDS}, **{f"tokens_{k}": _TOKENS for k in SPAN_KINDS}}


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
        golds = self.record.get("answer")   # a str, a list of str (each one a gold: data_prep.schema) or None
        return [] if golds is None else list(golds) if isinstance(golds, list) else [golds]

    @property
    def extra(self) -> dict:
        return {"digest": self.digest}


def _heldout_dir(cfg):
    from pathlib import Path

    if not cfg.get("heldout"):
        raise EvalError("the teacher-forced benches (tf_code, tf_search) need heldout=DIR (a `data-prep heldout` dir)")
    return Path(cfg.heldout)


def source(bench: str, cfg) -> str:
    """What identifies a teacher-forced bench's items (evals.identity digests it): its domain's held-out
    records (ids and content digests, in the dir's order, which the seeded sample draws from) and the set's
    render settings, as the held-out manifest records them; not that file's bytes, which name the paths
    the set was built from (a set built or moved elsewhere is the same bench). The manifest's path when
    it cannot be read (evaluate then refuses the dir, naming why)."""
    import json

    from common.io import read_json_object, sha256_text

    path = _heldout_dir(cfg) / "manifest.json"
    try:
        man = read_json_object(path)
        records = list(man["digests"][BENCHES[bench]].items())
    except (ValueError, KeyError, TypeError, AttributeError):
        return str(path)
    content = {"records": records, "render_settings": man.get("render_settings")}
    return f"heldout-{BENCHES[bench]}:{sha256_text(json.dumps(content, sort_keys=True))}"


def training_data(cfg) -> tuple[str, str] | None:
    """(training data dir, the run manifest naming it) of the checkpoint evaluated; None when the
    checkpoint is not in a run dir, or its manifest names no data dir."""
    from pathlib import Path

    from common import layout
    from common.io import read_json_object

    ckpt = Path(str(cfg.ckpt))
    man_path = ckpt.parent.parent / layout.MANIFEST
    if ckpt.parent.name != layout.CHECKPOINTS or not man_path.is_file():
        return None
    try:
        data_dir = (read_json_object(man_path).get("data") or {}).get("dir")
    except ValueError as exc:
        raise EvalError(str(exc)) from None
    return (str(data_dir), str(man_path)) if data_dir else None


def open_heldout(cfg):
    """The held-out set of this evaluation (`heldout=DIR`), opened once per evaluate call
    (data_prep.heldout.open_verified): loaded and verified, and refused when the checkpoint's run
    manifest names training data that holds one of its records (data_prep's error, as an EvalError
    naming that manifest)."""
    from data_prep import heldout
    from data_prep.errors import DataPrepError

    path, trained_on = _heldout_dir(cfg), training_data(cfg)
    try:
        return heldout.open_verified(path, trained_on[0] if trained_on else None)
    except heldout.TrainingDataError as exc:
        raise EvalError(f"{exc} (the training data of {trained_on[1]})") from None
    except DataPrepError as exc:
        raise EvalError(str(exc)) from None


def items(bench: str, held, n: int | None, seed: int) -> tuple[list[HeldoutItem], str, int]:
    """The records of the bench's domain in the opened held-out set `held`: a seeded shuffle, first n."""
    import random

    from data_prep.errors import DataPrepError

    try:
        recs = held.records(BENCHES[bench])
    except DataPrepError as exc:
        raise EvalError(str(exc)) from None
    digests = held.digests[BENCHES[bench]]
    out = [HeldoutItem(str(r["id"]), r, digests[str(r["id"])]) for r in recs]
    random.Random(seed).shuffle(out)
    return (out if not n or n < 0 else out[:n]), str(held.manifest_path), 0


def meta(held) -> dict:
    """meta.json's `teacher_forced` block: the opened held-out set and how its records are rendered."""
    man = held.manifest
    return {"heldout": str(held.dir), "fingerprint": held.fingerprint, "seed": man.get("seed"),
            "records": {d: len(v) for d, v in held.digests.items()}, "render": man.get("render_settings"),
            "template": man.get("template"), "tokenizer": (man.get("tokenizer") or {}).get("name"),
            "span_kinds": list(SPAN_KINDS)}


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


def score(work_items: list[HeldoutItem], model, tokenizer, held):
    """One row per held-out record (in order): per span kind its loss sum and token count, and the
    totals; each record rendered and tokenized with the opened set's own render settings."""
    from data_prep.errors import DataPrepError

    try:
        span_rows = held.span_tokenizer(tokenizer)
    except DataPrepError as exc:
        raise EvalError(str(exc)) from None
    for item in work_items:
        try:
            rows = span_rows(item.record)
        except DataPrepError as exc:   # a message field not found in its rendered turn (data_prep.spans.SpanError)
            raise EvalError(str(exc)) from None
        spans = record_losses(model, rows)
        yield {"id": item.id, "digest": item.digest, "domain": item.record.get("domain"),
               "loss": spans.loss, "tokens": spans.tokens, "total_loss": spans.total, "total_tokens": spans.n}
