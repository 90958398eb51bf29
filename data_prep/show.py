"""`data-prep show DIR [row=K | id=ID] [tokenizer=NAME] [color=auto|true|false]`: one built row, as trained.

Prints the row's text with its trainable tokens marked — ANSI green on a terminal, `[[...]]`
otherwise (a literal `[[` / `]]` in the text is shown as `[\\[` / `]\\]`) — then the row's turns (the
roles of its messages; per trainable span, the context tokens before it and the span's tokens)
and its checks: the arrays agree with each other, every trainable span ends with the template's
end-of-turn token, and a fresh render + tokenization of the row's `messages` gives exactly the
stored input_ids and labels (with the renderer's per-turn verdicts). Exit 0 when every check
holds, 1 otherwise, 2 for a usage mistake. The tokenizer defaults to the manifest's.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from common.cli import apply_overrides
from common.io import read_json_object
from data_prep.errors import DataPrepError

GREEN, RESET = "\x1b[32m", "\x1b[0m"
OPEN, CLOSE = "[[", "]]"
# What datasets.save_to_disk writes beside the data files, and the columns a built row has.
DATASET_FILES = ("dataset_info.json", "state.json")
COLUMNS = ("id", "source", "domain", "input_ids", "labels", "num_tokens", "num_trainable", "messages")
KEYS = {"row": None, "id": None, "tokenizer": None, "color": "auto"}


@dataclass
class Run:
    """A maximal run of tokens with the same trainable flag: ids[start:end]."""

    start: int
    end: int
    trainable: bool


def runs(labels: list[int]) -> list[Run]:
    out: list[Run] = []
    for i, lab in enumerate(labels):
        flag = lab != -100
        if out and out[-1].trainable == flag:
            out[-1].end = i + 1
        else:
            out.append(Run(i, i + 1, flag))
    return out


def _escape(text: str) -> str:
    return text.replace(OPEN, "[\\[").replace(CLOSE, "]\\]")


def marked_text(tok, ids: list[int], labels: list[int], color: bool) -> str:
    """The row's text, trainable runs wrapped in ANSI green (color) or [[...]]."""
    parts = []
    for r in runs(labels):
        text = tok.decode(ids[r.start:r.end], skip_special_tokens=False)
        if color:
            parts.append(f"{GREEN}{text}{RESET}" if r.trainable else text)
        else:
            parts.append(f"{OPEN}{_escape(text)}{CLOSE}" if r.trainable else _escape(text))
    return "".join(parts)


def turn_lines(rec: dict, labels: list[int]) -> list[str]:
    roles = [m.get("role", "?") for m in rec.get("messages", [])]
    lines = [f"  messages ({len(roles)}): {', '.join(roles)}"]
    context = 0
    k = 0
    for r in runs(labels):
        if not r.trainable:
            context = r.end - r.start
            continue
        k += 1
        lines.append(f"  span {k}: {context} context tokens before it, {r.end - r.start} trainable "
                     f"(tokens {r.start}-{r.end - 1})")
        context = 0
    if context:
        lines.append(f"  after the last span: {context} context tokens")
    return lines


def row_checks(tok, row: dict, rec: dict, manifest: dict) -> list[tuple[bool, str]]:
    """(ok, what) per check of one stored row."""
    from data_prep.build import renderer_kwargs
    from data_prep.config import DATA_DEFAULTS
    from data_prep.render import ChatRenderer, tokenize_rows
    from data_prep.schema import RecordError

    ids, labels = list(row["input_ids"]), list(row["labels"])
    checks = [
        (len(ids) == len(labels) == row["num_tokens"],
         f"input_ids, labels and num_tokens agree in length ({len(ids)}, {len(labels)}, {row['num_tokens']})"),
        (all(lab in (-100, t) for t, lab in zip(ids, labels)), "every label is -100 or its own token (the model shifts)"),
        (sum(lab != -100 for lab in labels) == row["num_trainable"],
         f"num_trainable = the unmasked labels ({row['num_trainable']})"),
    ]
    eot = tok.convert_tokens_to_ids(tok.eos_token) if tok.eos_token else None
    ends = [ids[r.end - 1] for r in runs(labels) if r.trainable]
    truncated = manifest.get("config", {}).get("length_policy") == "truncate" and \
        len(ids) == manifest.get("config", {}).get("max_seq_len")
    if eot is not None:
        ok = all(e == eot for e in (ends[:-1] if truncated else ends))
        checks.append((ok, f"every trainable span ends with the end-of-turn token {tok.eos_token!r}"))
    cfg = manifest.get("config", {})
    renderer = ChatRenderer(tok, **renderer_kwargs({**DATA_DEFAULTS, **cfg}))
    try:
        fresh = [r for r in renderer.rows(rec) if r.id == row["id"]]
    except RecordError as exc:  # a record the renderer now refuses: report it, don't crash the viewer
        return checks + [(False, f"a fresh render of the messages fails: {exc}")]
    if len(fresh) != 1:
        return checks + [(False, f"a fresh render of the messages gives no row with id {row['id']!r}")]
    f_ids, f_labels, retok, *_ = tokenize_rows(tok, fresh)[0]
    n = len(ids)
    same = list(f_ids[:n]) == ids and list(f_labels[:n]) == labels and (truncated or len(f_ids) == n)
    verdicts = ", ".join(f"{k}={v}" for k, v in sorted(fresh[0].checks.items()))
    retok_note = "; retokenized at a span boundary" if retok else ""
    what = (f"a fresh render + tokenization of the row's messages gives the stored input_ids and labels "
            f"(per assistant turn: {verdicts}{retok_note})")
    checks.append((same, what))
    return checks


def _pick(ds, row, rid) -> int:
    if (row is None) == (rid is None):
        raise DataPrepError("data-prep show needs exactly one of row=K or id=ID")
    if rid is not None:
        ids = ds["id"]
        if str(rid) not in ids:
            raise DataPrepError(f"id={rid}: no such row in the dataset")
        return ids.index(str(rid))
    if not isinstance(row, int) or isinstance(row, bool) or not 0 <= row < len(ds):
        raise DataPrepError(f"row={row!r}: expected an index in 0..{len(ds) - 1}")
    return row


def read_dataset_manifest(ds_dir: Path) -> dict:
    """The manifest of a built dataset dir, or a DataPrepError naming the dir and why it is not one
    (no manifest; a run dir, whose manifest.json is the run's; a manifest that does not read)."""
    path = ds_dir / "manifest.json"
    if not path.is_file():
        raise DataPrepError(f"{ds_dir}: not a data-prep output (no manifest.json)")
    try:
        manifest = read_json_object(path)
    except ValueError as exc:
        raise DataPrepError(str(exc)) from exc
    if not all((ds_dir / name).is_file() for name in DATASET_FILES):
        data = manifest.get("data")
        where = f"; its dataset is {data['dir']}" if isinstance(data, dict) and isinstance(data.get("dir"), str) else ""
        raise DataPrepError(f"{ds_dir}: not a built dataset (no {' or '.join(DATASET_FILES)} of datasets.save_to_disk; "
                            f"a run dir?{where})")
    tok = manifest.get("tokenizer")
    if not (isinstance(tok, dict) and isinstance(tok.get("name"), str) and tok["name"]):
        raise DataPrepError(f"{path}: `tokenizer` must be an object with a `name` (got {tok!r})")
    if not isinstance(manifest.get("config", {}), dict):
        raise DataPrepError(f"{path}: `config` must be an object (got {manifest['config']!r})")
    return manifest


def show_main(argv: list[str], stream=None) -> int:
    stream = sys.stdout if stream is None else stream
    if not argv or "=" in argv[0]:
        raise DataPrepError("usage: data-prep show DIR [row=K | id=ID] [tokenizer=NAME] [color=auto|true|false]")
    ds_dir = Path(argv[0])
    c = OmegaConf.to_container(apply_overrides(OmegaConf.create(KEYS), argv[1:]), resolve=True)
    if c["color"] not in ("auto", True, False):
        raise DataPrepError(f"color must be auto, true or false, got {c['color']!r}")
    manifest = read_dataset_manifest(ds_dir)
    import datasets

    from data_prep.build import load_tokenizer

    try:
        ds = datasets.load_from_disk(str(ds_dir))
    except Exception as exc:  # a torn or foreign save_to_disk dir: one line naming it
        raise DataPrepError(f"{ds_dir}: the dataset does not load ({type(exc).__name__}: {exc})") from exc
    missing = [col for col in COLUMNS if col not in ds.column_names]
    if missing:
        raise DataPrepError(f"{ds_dir}: not a data-prep dataset (no column {', '.join(missing)})")
    k = _pick(ds, c["row"], c["id"])
    row = ds[k]
    tok, _ = load_tokenizer(str(c["tokenizer"] or manifest["tokenizer"]["name"]))
    rec = json.loads(row["messages"])
    color = stream.isatty() if c["color"] == "auto" else bool(c["color"])
    ids, labels = list(row["input_ids"]), list(row["labels"])
    print(f"row {k} of {len(ds)}: id={row['id']} source={row['source']} domain={row['domain']} "
          f"tokens={row['num_tokens']} trainable={row['num_trainable']}", file=stream)
    legend = "trainable tokens in green" if color else f"trainable tokens inside {OPEN}...{CLOSE}"
    print(f"--- text ({legend}) ---", file=stream)
    print(marked_text(tok, ids, labels, color), file=stream)
    print("--- turns ---", file=stream)
    print("\n".join(turn_lines(rec, labels)), file=stream)
    print("--- checks ---", file=stream)
    checks = row_checks(tok, row, rec, manifest)
    for ok, what in checks:
        print(f"  {'ok  ' if ok else 'FAIL'} {what}", file=stream)
    return 0 if all(ok for ok, _ in checks) else 1
