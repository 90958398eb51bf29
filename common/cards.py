"""Model cards: one Hugging Face README.md per checkpoint, written from the run's own records.

`checkpoint_card(ckpt, report=..., study=..., export=..., repo_id=...)` returns the card's text and is a
pure function of files on disk (the same files give byte-identical cards). It reads:

- the checkpoint dir (`<run_dir>/checkpoints/step-NNNNNN`, a state `<run_dir>/state/step-NNNNNN`, or any
  model dir): its content digest, computed as the evaluations record it (common.io.dir_identity);
- the run dir above it: `config.yaml` (recipe), `manifest.json` (commit, command, hardware, packages),
  `DONE` (a GRPO run's TRL version), the dataset manifest `<data.dir>/manifest.json` (sources, counts) when it is
  the data the run trained on (its fingerprint the run manifest's `data.fingerprint`; else a copy renamed aside);
  the runs root (every arm / seed / step: the sister checkpoints);
- the licence: config.yaml model.license, else (a GRPO run records none) its starting model's (`licence`);
- the report dir (`analyze`'s out): `results.csv` (every column past arm..n is an interval column the
  report printed, shown as it is), and each result's evaluation record `<run_dir>/eval/[<profile>/]
  step-NNNNNN/{summary,meta}.json`: a result is shown only when an evaluation of this very checkpoint
  (its recorded checkpoint digest equals the checkpoint's; of the profile `report.md` names) holds that value;
  any other is left out and named; the value it is compared with (the anchor's, a GRPO run's own step 0) is stated
  with its evaluation's model and the settings in which that differs, from the record holding it (the anchor's:
  under the anchor dir `report.md` names, else `<runs_root>/_anchor`), or said to have none found;
- an export dir (export-checkpoint's out): `export_info.json` and `SHA256SUMS`;
- a study file: its `notes` (what is not reproduced).

Missing inputs are stated in the card ("not evaluated", "no dataset manifest"), never filled in.
Every value from a record is escaped: in the YAML front matter by the YAML dumper (double-quoted
scalars), in the Markdown body as text (HTML entities, Markdown punctuation backslash-escaped,
one line, long values cut with their length stated).
"""
from __future__ import annotations

import csv
import glob
import html
import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from common import layout
from common.cli import ConfigError
from common.io import REPLACED_MARK, dir_identity, read_sha256sums
from common.recipes import RECIPES

CARD = "README.md"
CARDS_DIR = "cards"
RESULT_COLUMNS = ("arm", "seed", "step", "bench", "metric", "value", "n")
ANCHOR_ARM = "anchor"
PRE_RL = "pre-RL (step 0)"   # a GRPO run's own step 0, the value its results are compared with when the report has it
EXPORT_INFO = "export_info.json"
MAX_TEXT = 200  # characters of one record value shown in the body (the full length is stated)
# Evaluation settings that change a result, as meta.json's config names them.
RESULT_SETTINGS = ("backend", "retriever", "topk", "max_model_len", "max_turns", "max_new_tokens", "prompt",
                   "enable_thinking", "tool_style", "seed")
_MD_SPECIAL = re.compile(r"([\\`*_\[\]|~])")   # emphasis, code, links / images, table cells, strike
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_TAG_BAD = re.compile(r"[^A-Za-z0-9._-]+")


class CardError(ConfigError):
    """A record the card needs is unreadable (the message names the file and why)."""


# ---------------------------------------------------------------- escaping
def text(value: Any, limit: int = MAX_TEXT) -> str:
    """A record value as Markdown text: one line, HTML-escaped, Markdown punctuation escaped, cut at `limit`."""
    s = " ".join(str(value).split())
    cut = f"… ({len(s)} characters)" if len(s) > limit else ""
    s = html.escape(s[:limit], quote=False)
    return _MD_SPECIAL.sub(r"\\\1", s) + cut


def fenced(body: str, lang: str = "") -> str:
    """A fenced code block no backtick run inside `body` can close."""
    runs = [len(m) for m in re.findall(r"`+", body)]
    fence = "`" * max(3, max(runs, default=0) + 1)
    return f"{fence}{lang}\n{body}\n{fence}"


def py_str(value: str) -> str:
    """A Python string literal (JSON's escaping is valid Python) with no backtick or angle bracket in it."""
    return json.dumps(str(value)).replace("`", "\\u0060").replace("<", "\\u003c").replace(">", "\\u003e")


def tag(value: Any) -> str:
    return _TAG_BAD.sub("-", str(value)).strip("-")[:64] or "unnamed"


def number(v: float) -> str:
    """4 decimals, trailing zeros dropped; 4 significant digits below 0.001 (never a non-zero value shown as 0)."""
    if not (v == v and abs(v) < 1e6 and v != int(v)):
        return f"{v:g}"
    return f"{v:.4f}".rstrip("0").rstrip(".") if abs(v) >= 1e-3 else f"{v:.4g}"


# ---------------------------------------------------------------- reading records
def _json(path: Path, missing: list[str], what: str) -> dict | None:
    if not path.is_file():
        missing.append(f"no {what} ({path})")
        return None
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CardError(f"{path}: unreadable {what} ({exc})") from None
    if not isinstance(obj, dict):
        raise CardError(f"{path}: {what} is not a JSON object")
    return obj


def _yaml(path: Path, missing: list[str], what: str) -> dict | None:
    if not path.is_file():
        missing.append(f"no {what} ({path})")
        return None
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        obj = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except (OSError, UnicodeDecodeError, OmegaConfBaseException, ValueError) as exc:
        raise CardError(f"{path}: unreadable {what} ({exc})") from None
    if not isinstance(obj, dict):
        raise CardError(f"{path}: {what} is not a mapping")
    return obj


def _get(d: dict | None, dotted: str, default=None):
    node: Any = d
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


@dataclass
class Row:
    bench: str
    metric: str
    value: float
    n: int
    extra: dict[str, str]


def read_results(report: Path) -> tuple[list[str], dict[tuple[str, int, int], list[Row]]]:
    """(interval column names, rows by (arm, seed, step)) of `<report>/results.csv`."""
    path = report / "results.csv"
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            header = list(reader.fieldnames or [])
            lacking = [c for c in RESULT_COLUMNS if c not in header]
            if lacking:
                raise CardError(f"{path}: no column {', '.join(lacking)} (expected {', '.join(RESULT_COLUMNS)}, ...)")
            extra = [c for c in header if c not in RESULT_COLUMNS]
            out: dict[tuple[str, int, int], list[Row]] = {}
            for i, r in enumerate(reader, 2):
                try:
                    key = (r["arm"], int(r["seed"]), int(r["step"]))
                    row = Row(r["bench"], r["metric"], float(r["value"]), int(float(r["n"])),
                              {c: r.get(c) or "" for c in extra})
                except (TypeError, ValueError) as exc:
                    raise CardError(f"{path}:{i}: unreadable row ({exc})") from None
                out.setdefault(key, []).append(row)
    except OSError as exc:
        raise CardError(f"{path}: unreadable ({exc.strerror or exc})") from None
    return extra, out


INTERVALS = "intervals.csv"   # analyze's every interval: kind, arm, vs, step, bench, metric, estimate, lo, hi, conf, covers, ...
INTERVAL_NEEDS = ("kind", "arm", "step", "bench", "metric", "lo", "hi")


def read_intervals(report: Path) -> tuple[dict[tuple[str, str, str, str, str], dict], str | None]:
    """The rows of `<report>/intervals.csv` by (kind, arm, step, bench, metric), and why none are read (absent,
    or lacking a column) or None."""
    path = report / INTERVALS
    if not path.is_file():
        return {}, None
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            lacking = [c for c in INTERVAL_NEEDS if c not in (reader.fieldnames or [])]
            if lacking:
                return {}, f"{path} has no column {', '.join(lacking)}: its intervals are not shown"
            return {(r["kind"], r["arm"], r["step"], r["bench"], r["metric"]): r for r in reader}, None
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise CardError(f"{path}: unreadable ({exc})") from None


def report_profile(report: Path) -> str | None:
    """The evaluation profile `<report>/report.md`'s settings name ("" for eval/ itself), None when it names none."""
    try:
        head = (report / "report.md").read_text(encoding="utf-8", errors="replace")[:20_000]
    except OSError:
        return None
    m = re.search(r"(?m)^Settings: .*?`profile=([^`]*)`", head)
    return None if m is None else "" if m.group(1).startswith("none (") else m.group(1)


def report_anchor_dir(report: Path) -> Path | None:
    """The anchor dir `<report>/report.md` names (analyze's `anchor_dir`), None when it names none."""
    try:
        head = (report / "report.md").read_text(encoding="utf-8", errors="replace")[:50_000]
    except OSError:
        return None
    m = re.search(r"(?m)^(?:Base model `[^`\n]*` evaluated with `prompt=[^`\n]*` into|No `anchor=` given; re-used "
                  r"whatever) `([^`\n]+)`", head)
    return None if m is None else Path(m.group(1))


@dataclass
class EvalRecord:
    dir: Path
    summary: dict
    meta: dict

    def digest(self, bench: str) -> str | None:
        ident = _get(self.meta, "identities", {}).get(bench) if isinstance(self.meta.get("identities"), dict) else None
        got = _get(ident, "keys", {}).get("checkpoint.digest") if isinstance(_get(ident, "keys"), dict) else None
        return got or _get(self.meta, "checkpoint_identity.digest")

    def settings(self, bench: str) -> dict:
        """RESULT_SETTINGS as `bench`'s evaluation had them: meta.json's `settings` of it (evaluate records each
        bench's, kept when a later call evaluates other benches into the same out dir); a meta.json from before
        that: its identity's keys (`evaluate.<key>`, the seed `bench.seed`) where recorded, else meta.json's config,
        only where its last evaluate call (`benches`; a record without that list: one call) evaluated `bench` (the
        config is that call's, not a kept bench's)."""
        held = self.meta.get("settings")
        if isinstance(held, dict) and isinstance(held.get(bench), dict):
            return {k: held[bench][k] for k in RESULT_SETTINGS if k in held[bench]}
        ident = _get(self.meta, "identities", {}).get(bench) if isinstance(self.meta.get("identities"), dict) else None
        keys = _get(ident, "keys") if isinstance(_get(ident, "keys"), dict) else {}
        cfg = self.meta.get("config") if isinstance(self.meta.get("config"), dict) else {}
        last = self.meta.get("benches")
        ran = not isinstance(last, list) or bench in last
        out = {}
        for k in RESULT_SETTINGS:
            name = "bench.seed" if k == "seed" else f"evaluate.{k}"
            if name in keys:
                out[k] = keys[name]
            elif ran and k in cfg:
                out[k] = cfg[k]
        return out

    def holds(self, row: Row) -> bool:
        got = self.summary.get(row.bench)
        if not isinstance(got, dict):
            return False
        v = got.get(row.metric)
        return (isinstance(v, (int, float)) and not isinstance(v, bool) and float(v) == row.value
                and got.get("n") == row.n)


def eval_records(run_dir: Path, step: int) -> list[EvalRecord]:
    out = []
    for d in layout.step_eval_dirs(run_dir, step):
        try:
            summary = json.loads((d / "summary.json").read_text(encoding="utf-8"))
            meta = json.loads((d / "meta.json").read_text(encoding="utf-8")) if (d / "meta.json").is_file() else {}
        except (OSError, UnicodeDecodeError, ValueError):
            continue   # a torn evaluation holds no result the card can vouch for
        if isinstance(summary, dict) and isinstance(meta, dict):
            out.append(EvalRecord(d, summary, meta))
    return out


# ---------------------------------------------------------------- what the card is about
@dataclass
class Subject:
    ckpt: Path
    step: int | None
    run_dir: Path | None
    runs_root: Path | None
    label: str | None            # the arm as the report names it (arm or arm/name)
    seed: int | None
    config: dict | None
    manifest: dict | None
    done: dict | None
    dataset: dict | None
    digest: dict
    missing: list[str] = field(default_factory=list)
    data_note: str | None = None  # where the dataset manifest was read from when not data.dir, or why none is the run's

    @property
    def grpo(self) -> bool:
        return _get(self.config, "stage") == "grpo"

    @property
    def name(self) -> str:
        if self.label is None:
            return self.ckpt.name
        return f"{self.label.replace('/', '-')}{'' if self.seed is None else f'-s{self.seed}'}-step{self.step}"


def subject(ckpt: Path) -> Subject:
    ckpt = Path(ckpt)
    missing: list[str] = []
    step = layout.parse_step(ckpt.name)
    run_dir = ckpt.parent.parent if ckpt.parent.name in (layout.CHECKPOINTS, layout.STATES) and step is not None else None
    if run_dir is not None and not (run_dir / layout.CONFIG).is_file():
        run_dir = None
    if run_dir is None:
        missing.append(f"no run records: {ckpt} is not a checkpoint of a run dir (<run_dir>/checkpoints/step-NNNNNN)")
        return Subject(ckpt, step, None, None, None, None, None, None, None, None, dir_identity(ckpt), missing)
    config = _yaml(run_dir / layout.CONFIG, missing, "run config")
    manifest = _json(run_dir / layout.MANIFEST, missing, "run manifest")
    done = None
    if (run_dir / layout.DONE).is_file():
        try:
            done = json.loads((run_dir / layout.DONE).read_text(encoding="utf-8") or "{}")
        except (OSError, UnicodeDecodeError, ValueError):
            done = None
        done = done if isinstance(done, dict) else {}
    data_dir = _get(config, "data.dir") or _get(manifest, "data.dir")
    dataset = data_note = None
    if _get(config, "stage") != "grpo":
        if data_dir:
            dataset, data_note = _trained_dataset(Path(str(data_dir)), _get(manifest, "data.fingerprint"), missing)
        else:
            missing.append("no dataset manifest (the run config names no data.dir)")
    runs_root = Path(str(_get(config, "runs_root"))) if _get(config, "runs_root") else None
    seed_m = layout.SEED_DIR.match(run_dir.name)
    seed = int(seed_m.group(1)) if seed_m else _get(config, "seed")
    seed = seed if isinstance(seed, int) and not isinstance(seed, bool) else None
    label = None
    if runs_root is not None:
        try:
            label = "/".join(run_dir.resolve().relative_to(runs_root.resolve()).parts[:-1]) or None
        except ValueError:
            label = None
    if label is None:
        label = layout.variant_label(str(_get(config, "arm", run_dir.parent.name)), _get(config, "name"))
        runs_root = run_dir.parent.parent if not _get(config, "name") else run_dir.parent.parent.parent
    return Subject(ckpt, step, run_dir, runs_root, label, seed, config, manifest, done, dataset, dir_identity(ckpt), missing,
                   data_note)


def _trained_dataset(data_dir: Path, trained: Any, missing: list[str]) -> tuple[dict | None, str | None]:
    """(the dataset manifest of the data the run trained on, a note when it is not `<data_dir>`'s): `<data_dir>/manifest.json`
    when its fingerprint is the one the run's manifest.json records (a run that records none: as is), else that of the
    copy of `data_dir` renamed aside (`<data_dir>.replaced-<UTC time>`, a rebuild's `overwrite=true`) that has it, else None."""
    dataset = _json(data_dir / layout.MANIFEST, missing, "dataset manifest")
    if not isinstance(trained, str) or dataset is None or dataset.get("fingerprint") == trained:
        return dataset, None
    for aside in sorted(data_dir.parent.glob(f"{glob.escape(data_dir.name)}{REPLACED_MARK}*")):
        found = _record(aside / layout.MANIFEST)
        if found is not None and found.get("fingerprint") == trained:
            return found, (f"read from {aside}: the dataset at {data_dir} was rebuilt after this run trained, and this "
                           f"copy renamed aside holds the run's (fingerprint {trained[:16]}…)")
    return None, (f"the dataset at {data_dir} is not the one this run trained on (its fingerprint "
                  f"{str(dataset.get('fingerprint'))[:16]}…, the run's manifest.json data.fingerprint {trained[:16]}…) "
                  "and no copy renamed aside beside it holds that one: the data's sources and counts are not stated")


def sisters(runs_root: Path) -> list[tuple[str, int, list[int]]]:
    """(arm label, seed, checkpoint steps) of every run under `runs_root`."""
    out = []
    if not runs_root.is_dir():
        return out
    for seed_dir in sorted([*runs_root.glob("*/seed*"), *runs_root.glob("*/*/seed*")]):
        m = layout.SEED_DIR.match(seed_dir.name)
        rel = seed_dir.relative_to(runs_root).parts
        if not m or not seed_dir.is_dir() or any(p.startswith(("_", ".")) or layout.is_replaced(p) for p in rel):
            continue
        steps = [s for s, d in layout.step_dirs(layout.checkpoints_dir(seed_dir)) if not layout.is_replaced(d)]
        out.append(("/".join(rel[:-1]), int(m.group(1)), steps))
    return sorted(out)


# ---------------------------------------------------------------- the evaluation section's facts
@dataclass
class Shown:
    row: Row
    record: EvalRecord
    ref: Row | None
    curve: dict | None = None      # intervals.csv: this arm at this step (over its seeds and items)
    vs_anchor: dict | str | None = None  # intervals.csv: this arm's final checkpoints minus the anchor, or why none
    other_n: Row | None = None     # the reference's value over another number of items: shown, not compared
    ref_record: EvalRecord | None = None   # the evaluation that holds the reference's value (None: not found)
    other_settings: Row | None = None   # the reference's value under other settings (unpaired): shown, not compared

    def ref_differs(self) -> list[str]:
        """The result-changing settings in which the reference's evaluation differs from this checkpoint's."""
        if self.ref_record is None:
            return []
        mine, theirs = self.record.settings(self.row.bench), self.ref_record.settings(self.row.bench)
        return [k for k in RESULT_SETTINGS if (k in mine or k in theirs) and mine.get(k) != theirs.get(k)]

    def unpaired(self, anchor: bool) -> list[str]:
        """The settings, recorded by both evaluations, that keep the reference's value from being compared, as the
        report's paired tables rule (analysis.aggregate.anchor_differences): any, but the anchor's prompt (by design)."""
        if self.ref_record is None:
            return []
        mine, theirs = self.record.settings(self.row.bench), self.ref_record.settings(self.row.bench)
        return [k for k in self.ref_differs() if k in mine and k in theirs and not (anchor and k == "prompt")]


@dataclass
class Evaluation:
    extra: list[str] = field(default_factory=list)
    shown: list[Shown] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)
    ref_name: str = ""
    note: str | None = None     # why nothing is shown (not evaluated, no report)
    intervals: bool = False     # the report has an intervals.csv
    interval_note: str | None = None
    ref_model: str | None = None   # what the reference values are of: the anchor's model, or this run's step 0
    ref_where: list[Path] = field(default_factory=list)   # where the reference's evaluation records were looked for


def evaluation(s: Subject, report: Path | None) -> Evaluation:
    ev = Evaluation()
    if report is None:
        ev.note = "not evaluated: no report given (analyze's out dir: results.csv)"
        return ev
    if not (report / "results.csv").is_file():
        ev.note = f"not evaluated: no results.csv in {report}"
        return ev
    ev.extra, table = read_results(report)
    intervals, ev.interval_note = read_intervals(report)
    ev.intervals = bool(intervals)
    if s.label is None or s.step is None:
        ev.note = "not evaluated: the checkpoint is not a run's, so no report row can name it"
        return ev
    if s.seed is None:
        ev.note = "not evaluated: the run records no seed (a seedN run dir, or config.yaml seed), so no report row can name it"
        return ev
    rows = table.get((s.label, int(s.seed), int(s.step)), [])
    if not rows:
        ev.note = f"not evaluated: results.csv has no row for {s.label} seed {s.seed} step {s.step}"
        return ev
    pre = table.get((s.label, int(s.seed), 0)) if s.grpo and s.step != 0 else None
    refs, ev.ref_name = (pre, PRE_RL) if pre else (table.get((ANCHOR_ARM, 0, 0), []), ANCHOR_ARM)
    by_key = {(r.bench, r.metric): r for r in refs or []}
    records = eval_records(s.run_dir, s.step) if s.run_dir else []
    if (profile := report_profile(report)) is not None:   # only the evaluations the report read
        records = [r for r in records if r.dir.parent == s.run_dir / layout.EVAL / profile]
    ref_records = _reference_records(s, report, profile, ev, pre=bool(pre))
    mine = s.digest.get("digest")
    final = max(step for arm, seed, step in table if (arm, seed) == (s.label, s.seed))   # this seed's, as the tables take it
    for row in rows:
        holding = [rec for rec in records if rec.holds(row)]
        match = next((rec for rec in holding if rec.digest(row.bench) == mine), None)
        if match is not None:
            at = (s.label, str(s.step), row.bench, row.metric)
            ref = by_key.get((row.bench, row.metric))   # compared only over as many items
            x = Shown(row, match, ref if ref is None or ref.n == row.n else None, intervals.get(("curve", *at)),
                      _vs_anchor(intervals, s, row, final), ref if ref is not None and ref.n != row.n else None,
                      next((rec for rec in ref_records if ref is not None and rec.holds(ref)), None))
            if x.ref is not None and x.unpaired(anchor=not pre):   # its difference would mix the settings' effect in
                x.ref, x.other_settings = None, x.ref
            ev.shown.append(x)
        elif holding:
            rec = holding[0]
            ev.left_out.append(f"{row.bench} {row.metric} = {number(row.value)}: its evaluation "
                               f"({rec.dir}) recorded checkpoint digest {str(rec.digest(row.bench))[:16]}…, "
                               f"not this checkpoint's {str(mine)[:16]}…")
        else:
            ev.left_out.append(f"{row.bench} {row.metric} = {number(row.value)}: no evaluation record of step "
                               f"{s.step} under {s.run_dir} holds this value")
    return ev


def _reference_records(s: Subject, report: Path, profile: str | None, ev: Evaluation, *, pre: bool) -> list[EvalRecord]:
    """The evaluation records the reference values may come from (`ev.ref_where`: where they were looked for,
    `ev.ref_model`: whose they are): a GRPO run's own step 0 (`pre`), else the anchor's step 0 in the anchor dir
    `report.md` names (when absolute) or the runs root's `_anchor` (analyze's default), of the report's profile."""
    if pre:
        ev.ref_model = f"this run's step 0 ({layout.step_name(0)}, the checkpoint it started from)"
        found = eval_records(s.run_dir, 0) if s.run_dir else []
        ev.ref_where = [s.run_dir / layout.EVAL] if s.run_dir else []
        return [r for r in found if profile is None or r.dir.parent == s.run_dir / layout.EVAL / profile]
    named = report_anchor_dir(report)
    dirs = list(dict.fromkeys([*([named] if named is not None and named.is_absolute() else []),
                               *([s.runs_root / "_anchor"] if s.runs_root is not None else [])]))
    out = []
    for d in dirs:
        ev.ref_where.append(layout.eval_dir(d, 0, profile) if profile is not None else d / layout.EVAL)
        out += [r for r in eval_records(d, 0) if profile is None or r.dir.parent == d / layout.EVAL / profile]
    return out


def _reference_model(record: EvalRecord) -> str:
    """The anchor's model, from `anchor.json` in its anchor dir (analyze's record of which model it evaluated)."""
    for d in record.dir.parents:
        if (d / "anchor.json").is_file():
            model = (_record(d / "anchor.json") or {}).get("model")
            return str(model) if model else f"not recorded ({d / 'anchor.json'} names none)"
    return "not recorded (no anchor.json)"


def _vs_anchor(intervals: dict, s: Subject, row: Row, final: int) -> dict | str | None:
    """intervals.csv's row of this arm's final checkpoints minus the anchor for `row` when this checkpoint is
    one of them (its seed's final step in results.csv, and among the row's steps: `200/436` when the seeds'
    final steps differ); else why not. A gap of the paired table is such a row, its reason as the note."""
    if not intervals:
        return None
    got = next((r for (kind, arm, _, bench, metric), r in intervals.items()
                if (kind, arm, bench, metric) == ("vs_anchor", s.label, row.bench, row.metric)), None)
    if got is None:
        return f"no vs_anchor row in {INTERVALS}"
    if s.step != final:
        return f"the report's is of each seed's final checkpoint (steps {got.get('step')}): this seed's is step {final}"
    if str(s.step) not in str(got.get("step")).split("/"):
        return f"the report's is of the seeds' final steps {got.get('step')}, not of step {s.step}"
    return got


def _interval_pair(extra: list[str]) -> tuple[str, str] | None:
    """Two interval columns naming a lower and an upper bound (…lo/…hi, …low/…high, …lower/…upper)."""
    for lo_s, hi_s in (("lo", "hi"), ("low", "high"), ("lower", "upper")):
        for c in extra:
            if c.endswith(lo_s):
                hi = c[: len(c) - len(lo_s)] + hi_s
                if hi in extra:
                    return c, hi
    return None


def _finite(v) -> bool:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return False
    return f == f and abs(f) != float("inf")


def _interval_cell(r: dict | str | None, step: int | None = None) -> str:
    """An intervals.csv row as the report prints it, `step`: the card's (a row of other steps names them); or why none."""
    if not isinstance(r, dict):
        return f"none ({text(r or f'not in {INTERVALS}', 160)})"
    if not (_finite(r.get("lo")) and _finite(r.get("hi"))):
        return f"none ({text(r.get('note') or r.get('covers') or 'no interval', 160)})"
    est = f"{number(float(r['estimate']))} " if _finite(r.get("estimate")) else ""
    steps = f"; the seeds' final steps {r.get('step')}" if step is not None and str(r.get("step")) != str(step) else ""
    return (f"{est}\\[{number(float(r['lo']))}, {number(float(r['hi']))}\\] {text(r.get('conf', ''), 10)} "
            f"({text(r.get('covers', ''), 80)}{text(steps, 80)})")


def findings(ev: Evaluation) -> str:
    """A paragraph of counts and differences, from the numbers shown only."""
    paired = [x for x in ev.shown if x.ref is not None]
    if not ev.shown:
        return "No finding: no result of this checkpoint is shown."
    if not paired:
        if unpaired := sorted({k for x in ev.shown if x.other_settings is not None for k in x.unpaired(ev.ref_name != PRE_RL)}):
            return (f"{len(ev.shown)} result(s) shown; the {ev.ref_name}'s values were evaluated under other settings "
                    f"({text(', '.join(unpaired))}): not compared.")
        return f"{len(ev.shown)} result(s) shown; no {ev.ref_name} value to compare them with in the report."
    diffs = [(x.row.value - x.ref.value, x) for x in paired]
    up = sum(d > 0 for d, _ in diffs)
    down = sum(d < 0 for d, _ in diffs)
    same = len(diffs) - up - down
    d, x = max(diffs, key=lambda t: (abs(t[0]), t[1].row.bench, t[1].row.metric))
    differ = list(dict.fromkeys(k for _, x in diffs for k in x.ref_differs()))
    unknown = any(x.ref_record is None for _, x in diffs)
    named = text(", ".join(differ))
    caveat = (f" (evaluated under other settings: {named}; see Evaluation)" if differ else
              " (its evaluation's settings not known; see Evaluation)" if unknown else "")
    parts = [f"Against the {ev.ref_name}{caveat}, {len(diffs)} (bench, metric) pairs compared: higher on {up}, "
             f"lower on {down}, equal on {same}; the largest difference is {d:+.4f} "
             f"({text(x.row.bench)} {text(x.row.metric)})."]
    vs = [x.vs_anchor for x in ev.shown if isinstance(x.vs_anchor, dict)]
    bounds = [(float(v["lo"]), float(v["hi"])) for v in vs if _finite(v.get("lo")) and _finite(v.get("hi"))]
    if bounds:
        above = sum(lo > 0 for lo, _ in bounds)
        below = sum(hi < 0 for _, hi in bounds)
        conf = {v.get("conf") for v in vs} - {None, ""}
        parts.append(f"The report's interval of the difference to the anchor ({text(', '.join(sorted(conf)) or 'its level')}) "
                     f"lies above 0 on {above} of {len(bounds)}, below 0 on {below}, and includes 0 on "
                     f"{len(bounds) - above - below}.")
    pair = _interval_pair(ev.extra)
    if pair:
        lo, hi = pair
        inside, counted = 0, 0
        for _, x in diffs:
            try:
                a, b = float(x.row.extra[lo]), float(x.row.extra[hi])
            except (KeyError, ValueError):
                continue
            counted += 1
            inside += a <= x.ref.value <= b
        if counted:
            parts.append(f"The {ev.ref_name}'s value lies within this checkpoint's interval "
                         f"({text(lo)}, {text(hi)}) on {inside} of {counted}.")
    return " ".join(parts)


# ---------------------------------------------------------------- the card
def _front_matter(s: Subject, ev: Evaluation, name: str) -> str:
    import yaml

    meta: dict[str, Any] = {}
    if base := _base_model(s.config):
        meta["base_model"] = base
    meta["library_name"] = "transformers"
    meta["pipeline_tag"] = "text-generation"
    tags = ["dtsft", "grpo" if s.grpo else "sft"]
    if s.label:
        tags.append(tag(s.label))
    meta["tags"] = tags
    datasets = sorted({spec for src in (_get(s.dataset, "sources") or []) if isinstance(src, dict)
                       for spec in [_hub_dataset(str(src.get("spec", "")))] if spec})
    if datasets:
        meta["datasets"] = datasets
    if lic := licence(s)[0]:
        meta["license"] = lic
    if ev.shown:
        # one result per (bench, n), its metrics listed: the grouping huggingface_hub writes, which it reads
        # back as one evaluation result per (bench, metric)
        results: list[dict] = []
        for x in ev.shown:
            if not results or results[-1]["dataset"]["name"] != x.row.bench or results[-1]["dataset"]["args"]["n"] != x.row.n:
                results.append({"task": {"type": "text-generation"},
                                "dataset": {"name": x.row.bench, "type": x.row.bench, "args": {"n": x.row.n}},
                                "metrics": []})
            results[-1]["metrics"].append({"type": x.row.metric, "value": x.row.value, "name": x.row.metric})
        meta["model-index"] = [{"name": name, "results": results}]
    dumped = yaml.dump(meta, Dumper=_dumper(), sort_keys=False, allow_unicode=False, width=1 << 30)
    return f"---\n{dumped}---\n"


def _earlier_run(config: dict | None) -> tuple[Path, dict] | None:
    """(run dir, config) of the run whose checkpoint model.path is (GRPO from an SFT checkpoint), else None (a
    torn earlier run config too)."""
    ckpt = Path(str(_get(config, "model.path") or ""))
    try:
        if ckpt.parent.name == layout.CHECKPOINTS and (ckpt.parent.parent / layout.CONFIG).is_file():
            return ckpt.parent.parent, _yaml(ckpt.parent.parent / layout.CONFIG, [], "run config") or {}
    except (CardError, OSError):
        return None
    return None


def _base_model(config: dict | None) -> str | None:
    """model.path when it is a hub id (not a local dir); a checkpoint of an earlier run (GRPO from an SFT
    checkpoint): that run's model.path when it is one."""
    base = str(_get(config, "model.path") or "")
    if _HUB_ID.match(base) and not Path(base).exists():
        return base
    earlier = str(_get(e[1], "model.path") or "") if (e := _earlier_run(config)) else ""
    return earlier if _HUB_ID.match(earlier) and not Path(earlier).exists() else None


def _base_revision(s: Subject) -> tuple[str | None, str]:
    """(the commit the Hub-id base was loaded at, where the card read it): the trainer's record of it in the run dir's
    manifest.json `base` (else DONE's); a run started from an earlier run's checkpoint: that run's record."""
    base = _base_model(s.config)
    if base is None:
        return None, "the base is no Hub id (a local model: no commit)"
    run_dir, records = s.run_dir, (s.manifest, s.done)
    if str(_get(s.config, "model.path") or "") != base and (earlier := _earlier_run(s.config)):
        run_dir, records = earlier[0], tuple(_record(earlier[0] / name) for name in (layout.MANIFEST, layout.DONE))
    for name, record in zip((layout.MANIFEST, layout.DONE), records):
        entry = _get(record, "base")
        entry = entry.get("model.path") if isinstance(entry, dict) else None
        if isinstance(entry, dict) and entry.get("repo") == base and isinstance(entry.get("revision"), str):
            return entry["revision"], f"{name} base" if run_dir == s.run_dir else f"{run_dir}/{name} base (the run it started from)"
    return None, "the run records none (trained before the trainers recorded the commit they load)"


def _record(path: Path) -> dict | None:
    """A run record (manifest.json, DONE) of another run, None where it does not read as a JSON object."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def licence(s: Subject) -> tuple[str | None, str]:
    """(the model's licence, where the card read it). config.yaml model.license; a config without that key (a
    GRPO run's) has its starting model's: the config of the run whose checkpoint it started from, that model
    dir's own README.md (or the run's copy of it, checkpoints/step-000000), or the model recipe config.yaml
    model.name names when that recipe's model.path is the one the run started from. None: none of them states one."""
    config, where = s.config, "config.yaml model.license"
    for _ in range(4):   # GRPO from an SFT checkpoint (from a GRPO checkpoint ...)
        model = _get(config, "model")
        if isinstance(model, dict) and "license" in model:
            lic = model["license"]
            return (lic, where) if isinstance(lic, str) and lic.strip() else (None, f"{where} (null: none stated)")
        if (earlier := _earlier_run(config)) is None:
            break
        config, where = earlier[1], f"{text(earlier[0])}/config.yaml model.license (the run it started from)"
    start = str(_get(config, "model.path") or "")
    copy = [layout.checkpoints_dir(s.run_dir) / layout.step_name(0)] if config is s.config and s.grpo and s.run_dir else []
    for d in [Path(start), *copy]:
        if start and (lic := _card_licence(d / CARD)):
            return lic, f"{text(d)}/{CARD} license (the starting model's card)"
    name = str(_get(config, "model.name") or "")
    recipe = RECIPES / "model" / f"{name}.yaml"
    if start and re.fullmatch(r"[A-Za-z0-9_.-]+", name) and recipe.is_file():
        try:
            rec = _yaml(recipe, [], "model recipe")
        except CardError:
            rec = None
        lic = _get(rec, "model.license")
        if _get(rec, "model.path") == start and isinstance(lic, str) and lic.strip():
            return lic, f"recipes/model/{text(name)}.yaml model.license (the recipe config.yaml model.name names, for {text(start)})"
    return None, ("config.yaml model.license; the run records none, nor does its starting model's run config, card or "
                  "model recipe")


def _card_licence(path: Path) -> str | None:
    """The `license` of a model card's front matter, None when it has none (or no readable card)."""
    import yaml

    try:   # (a hub id names no such file; a name too long for one is an OSError too)
        m = re.match(r"---\r?\n(.*?)\r?\n---\r?\n", path.read_text(encoding="utf-8"), re.S) if path.is_file() else None
        meta = yaml.safe_load(m.group(1)) if m else None
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    lic = meta.get("license") if isinstance(meta, dict) else None
    return lic if isinstance(lic, str) and lic.strip() else None


def _dumper():
    import yaml

    class Dumper(yaml.SafeDumper):
        """Strings on one line: any string with a character outside printable ASCII, or a YAML indicator at
        its start, is double-quoted (escapes for line breaks and control characters), so no record value
        can end the front matter (`---`) or start a key of its own."""

    def str_style(dumper, value: str):
        plain = (re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9 ._/@+-]*", value) is not None and not value.endswith(" ")
                 and dumper.resolve(yaml.ScalarNode, value, (True, False)) == "tag:yaml.org,2002:str")
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=None if plain else '"')

    Dumper.add_representer(str, str_style)
    return Dumper


def _hub_dataset(spec: str) -> str | None:
    """A dataset source's hub id (`FORMAT:HUB_ID[@REV][#split]`), None for a local file."""
    _, _, rest = spec.partition(":")
    rest = rest.split("#")[0].split("@")[0]
    return rest if _HUB_ID.match(rest) and not Path(rest).exists() else None


def _kv_table(rows: list[tuple[str, Any, str]]) -> list[str]:
    out = ["| setting | value | from |", "|---|---|---|"]
    out += [f"| {k} | {text(v) if v is not None else 'not recorded'} | {src} |" for k, v, src in rows]
    return out


def _recipe(s: Subject) -> list[str]:
    c, m = s.config, s.manifest
    if c is None:
        return ["Not stated: no run config (config.yaml) for this checkpoint."]
    rows: list[tuple[str, Any, str]] = [
        ("base model", _get(c, "model.path"), "config.yaml model.path"),
        ("base model revision", *_base_revision(s)),
        ("model recipe", _get(m, "recipes.model"), "manifest.json recipes.model"),
        ("license", *licence(s)),
        ("optimizer", "AdamW (betas {}, eps {})".format(_get(c, "train.betas"), _get(c, "train.eps")), "config.yaml train"),
        ("learning rate", _get(c, "train.lr"), "config.yaml train.lr"),
        ("schedule", _get(c, "train.lr_schedule"), "config.yaml train.lr_schedule"),
        ("warmup ratio", _get(c, "train.warmup_ratio"), "config.yaml train.warmup_ratio"),
        ("weight decay", _get(c, "train.weight_decay"), "config.yaml train.weight_decay"),
        ("grad clip", _get(c, "train.grad_clip"), "config.yaml train.grad_clip"),
    ]
    if s.grpo:
        rows += [("completions per step", _get(c, "grpo.completions_per_step"), "config.yaml grpo.completions_per_step"),
                 ("group size", _get(c, "grpo.num_generations"), "config.yaml grpo.num_generations"),
                 ("LoRA r / alpha", f"{_get(c, 'lora.r')} / {_get(c, 'lora.alpha')}", "config.yaml lora"),
                 ("LoRA targets", ", ".join(map(str, t)) if isinstance(t := _get(c, "lora.target_modules"), list) else t,
                  "config.yaml lora.target_modules"),
                 ("KL coefficient", _get(c, "grpo.beta"), "config.yaml grpo.beta"),
                 ("loss type", _get(c, "grpo.loss_type"), "config.yaml grpo.loss_type"),
                 ("TRL", (s.done or {}).get("trl") or _get(m, "packages.trl") or _get(c, "grpo.trl"),
                  "DONE trl (else manifest.json packages.trl, else config.yaml grpo.trl)")]
    else:
        rows.append(("global batch", _get(c, "train.global_batch_size"), "config.yaml train.global_batch_size"))
    rows += [
        ("steps", *total_steps(s)),
        ("saves", _get(c, "train.save_steps"), "config.yaml train.save_steps (the final step is always saved)"),
        ("precision", _get(c, "train.precision"), "config.yaml train.precision"),
        ("attention", _get(c, "model.attn_implementation"), "config.yaml model.attn_implementation"),
        ("Liger kernels", _get(c, "model.liger"), "config.yaml model.liger"),
        ("world size", _world(c, m), "manifest.json launcher.nproc (processes per node) x config.yaml launcher.nodes; "
         "each of its launches where they differ"),
        ("hardware", _each_launch(m, _hardware, "a resume on other hardware"),
         "manifest.json hardware (a Slurm launch's: its launcher.nodes x gpus_per_node); each of its launches' where they differ"),
        ("torch / transformers", _each_launch(m, _torch_transformers, "a resume in another environment"),
         "manifest.json packages; each of its launches' where they differ"),
    ]
    return _kv_table(rows)


def total_steps(s: Subject) -> tuple[Any, str]:
    """(the run's optimizer steps, where read): DONE's step (the total it trained), else config.yaml train.steps,
    else (null: an arm trained by epochs, still running) its epochs."""
    done, steps = (s.done or {}).get("step"), _get(s.config, "train.steps")
    if isinstance(done, int) and not isinstance(done, bool):
        return done, "DONE step"
    if steps is not None or _get(s.config, "train.epochs") is None:
        return steps, "config.yaml train.steps"
    return f"{_get(s.config, 'train.epochs')} epochs (the run has no DONE yet)", "config.yaml train.epochs (train.steps null)"


def _world(c: dict | None, m: dict | None) -> int | str | None:
    """Processes per node x nodes: the first launch's (manifest.json launcher); each launch's (`launches`) where a
    resume ran on another world size (launcher.* is outside the run identity)."""
    def size(launcher) -> int | None:
        nproc, nodes = _get(launcher, "nproc"), _get(launcher, "nodes", _get(c, "launcher.nodes", 1))
        ok = all(isinstance(v, int) and not isinstance(v, bool) for v in (nproc, nodes))
        return nproc * nodes if ok else None

    each = [size(launch.get("launcher")) for launch in _get(m, "launches") or [] if isinstance(launch, dict)]
    if len(set(each)) < 2:
        return size(_get(m, "launcher"))
    return "; ".join(f"launch {i}: {'not recorded' if v is None else v}" for i, v in enumerate(each, 1)) + \
        " (a resume on another world size)"


def _each_launch(m: dict | None, of: Callable[[dict | None], str | None], why: str) -> str | None:
    """`of` the manifest (its first launch's record); each launch's (`launches`) where one differs from it, `why`
    said. A launch recording none (an entry written before launches recorded it) is not compared; the first is the
    manifest's own where its entry records none."""
    first = of(m)
    each = [of(launch) for launch in _get(m, "launches") or [] if isinstance(launch, dict)]
    if each and each[0] is None:
        each[0] = first
    if all(v is None or v == first for v in each):
        return first
    return "; ".join(f"launch {i}: {'not recorded' if v is None else v}" for i, v in enumerate(each, 1)) + f" ({why})"


def _torch_transformers(record: dict | None) -> str | None:
    packages = _get(record, "packages")
    if not isinstance(packages, dict) or (packages.get("torch") is None and packages.get("transformers") is None):
        return None   # (an interpreter that could not be asked: `unreadable` says why)
    return f"{packages.get('torch')} / {packages.get('transformers')}"


def _hardware(record: dict | None) -> str | None:
    """A manifest's (or one launch's) `hardware` in a few words: its GPUs, else its cores. A Slurm launch's is the
    job's request: launch records `hardware` where it runs, the host that ran sbatch, not the nodes that trained."""
    launcher = _get(record, "launcher")
    if _get(launcher, "kind") == "slurm":
        return (f"Slurm job of {_get(launcher, 'nodes')} node(s) x {_get(launcher, 'gpus_per_node')} GPU(s) "
                "(the nodes' GPU model is not recorded)")
    hw = _get(record, "hardware")
    if not isinstance(hw, dict):
        return None
    gpus = hw.get("gpus") or []
    names = sorted({str(g.get("name", g)) if isinstance(g, dict) else str(g) for g in gpus})
    return f"{len(gpus)} GPU(s) {', '.join(names)}" if gpus else f"CPU only ({hw.get('cpu_count')} cores)"


def _data(s: Subject) -> list[str]:
    if s.grpo and _get(s.config, "task") == "qa":
        return [f"GRPO task: qa (questions from {text(_get(s.config, 'grpo.prompts_file'))}, context mode "
                f"{text(_get(s.config, 'grpo.qa_mode'))}, retriever {text(_get(s.config, 'grpo.retriever'))})."]
    if s.grpo:
        return [f"GRPO task: {text(_get(s.config, 'task'))} (the environment is the data: search\\_plan\\_act, "
                f"split {text(_get(s.config, 'grpo.split'))})."]
    d = s.dataset
    if d is None:
        return [f"No dataset manifest: {text(s.data_note, 600)}." if s.data_note else
                "No dataset manifest: the data's sources and counts are not stated."]
    epi = _get(s.config, "data.epilogue", _get(d, "config.epilogue"))
    lines = [f"- arm {text(d.get('arm'))}, {text(_get(d, 'counts.rows'))} rows built of n = {text(d.get('n'))} asked "
             f"(kind {text(_get(d, 'config.kind'))}); by domain: {text(_get(d, 'counts.rows_by_domain'))}",
             f"- terminator: data.epilogue = {text(epi)} (true: a `Final answer:` epilogue after the finish call, "
             "the dual terminator; false: the single terminator)",
             f"- tokens: {text(_get(d, 'tokens.total'))} in all, {text(_get(d, 'tokens.trainable_total'))} trainable",
             "", "| source | domain | read | kept | rejected |", "|---|---|---|---|---|"]
    for src in _get(d, "sources") or []:
        if isinstance(src, dict):
            lines.append(f"| {text(src.get('spec'), 120)} | {text(src.get('domain'))} | {text(src.get('read'))} | "
                         f"{text(src.get('kept'))} | {text(src.get('rejected'))} |")
    return lines + (["", f"Dataset manifest {text(s.data_note, 600)}."] if s.data_note else [])


def _sisters(s: Subject) -> list[str]:
    if s.runs_root is None:
        return ["No runs root: no sister checkpoints listed."]
    found = sisters(s.runs_root)
    if not found:
        return [f"No runs under {text(s.runs_root)}."]
    lines = ["| arm | seed | steps |", "|---|---|---|"]
    for label, seed, steps in found:
        mark = " (this checkpoint's run)" if label == s.label and seed == s.seed else ""
        lines.append(f"| {text(label)}{mark} | {seed} | {', '.join(map(str, steps)) or 'none'} |")
    return lines


def _evaluation(s: Subject, ev: Evaluation) -> list[str]:
    if ev.note:
        return [text(ev.note, 400) + "."]
    lines = []
    if ev.intervals:
        lines.append(f"Intervals from the report's {INTERVALS}, as it prints them (estimate \\[lo, hi\\], level, what "
                     "each covers): this arm at this step, and its final checkpoint minus the anchor.")
    if ev.extra:
        lines.append("Interval columns from the report's results.csv: " + ", ".join(text(c) for c in ev.extra) + ".")
    if not ev.intervals and not ev.extra:
        lines.append(f"No interval in the report (no {INTERVALS}, and results.csv has no interval columns).")
    if ev.interval_note:
        lines.append(text(ev.interval_note, 400) + ".")
    icols = ["interval", "minus anchor, interval"] if ev.intervals else []
    cols = ["bench", "metric", "value", "n", ev.ref_name, "difference", *icols, *[text(c) for c in ev.extra]]
    lines += ["", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for x in ev.shown:
        ref = (number(x.ref.value) if x.ref else f"{number(x.other_n.value)} at n={x.other_n.n}: not compared"
               if x.other_n else f"{number(x.other_settings.value)} under other settings "
               f"({text(', '.join(x.unpaired(anchor=ev.ref_name != PRE_RL)))}): not compared"
               if x.other_settings else "not in the report")
        diff = f"{x.row.value - x.ref.value:+.4f}" if x.ref else "-"
        icells = [_interval_cell(x.curve), _interval_cell(x.vs_anchor, s.step)] if ev.intervals else []
        cells = [text(x.row.bench), text(x.row.metric), number(x.row.value), str(x.row.n), ref, diff, *icells,
                 *[text(x.row.extra.get(c, "")) for c in ev.extra]]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Per bench, the evaluation that produced these values (its identity and the settings that change a result):", ""]
    seen = set()
    for x in ev.shown:
        key = (x.row.bench, str(x.record.dir))
        if key in seen:
            continue
        seen.add(key)
        ident = _get(x.record.meta, "identities", {}).get(x.row.bench, {}) if isinstance(x.record.meta.get("identities"), dict) else {}
        settings = ", ".join(f"{k}={v}" for k, v in x.record.settings(x.row.bench).items())
        mode = x.row.bench.partition("@")[2] or "as the bench defines"
        lines.append(f"- {text(x.row.bench)}: identity {text(_get(ident, 'fingerprint'))}, context mode {text(mode)}, "
                     f"{text(settings, 400)}; record {text(x.record.dir.relative_to(s.run_dir), 120)}")
    compared = {}
    for x in (x for x in ev.shown if x.ref is not None or x.other_n is not None or x.other_settings is not None):
        compared.setdefault(x.row.bench, x)
    if compared:
        lines += ["", f"Per bench, the evaluation the {ev.ref_name} value comes from (its model, and the settings in which "
                  "it differs from this checkpoint's):", ""]
    for bench, x in compared.items():
        head = f"- the {text(ev.ref_name)}'s {text(bench)} value"
        if x.ref_record is None:
            where = ", ".join(str(w) for w in ev.ref_where) or "no runs root, no anchor dir"
            lines.append(f"{head}: its evaluation record is not found (looked in {text(where, 400)}): the settings it "
                         "was evaluated under are not known here")
            continue
        mine, theirs = x.record.settings(bench), x.ref_record.settings(bench)
        differs = ", ".join(f"{k}={theirs.get(k, 'not recorded')} (this checkpoint's: {mine.get(k, 'not recorded')})"
                            for k in x.ref_differs())
        model = ev.ref_model or _reference_model(x.ref_record)
        lines.append(f"{head}: model {text(model, 300)}, "
                     f"{'settings differing: ' + text(differs, 600) if differs else 'the same settings'}; "
                     f"record {text(x.ref_record.dir, 300)}")
    if ev.left_out:
        lines += ["", "Left out (not a result of this checkpoint as far as the records show):", ""]
        lines += [f"- {text(w, 400)}" for w in ev.left_out]
    return lines


def _usage(where: str) -> list[str]:
    lit = py_str(where)
    sh = where if re.fullmatch(r"[A-Za-z0-9._/@:-]+", where) else "'" + where.replace("'", "'\\''") + "'"
    head = (["Run these from inside this directory, or put its path or the hub repo id it is published under in "
             "place of `.` (export\\-checkpoint repo\\_id=ID writes the id here).", ""] if where == "." else [])
    return head + ["With transformers:", "",
            fenced("from transformers import AutoModelForCausalLM, AutoTokenizer\n"
                   f"tok = AutoTokenizer.from_pretrained({lit})\n"
                   f"model = AutoModelForCausalLM.from_pretrained({lit}, dtype=\"auto\")", "python"),
            "", "With vLLM (an OpenAI-compatible server):", "",
            fenced(f"vllm serve {sh} --port 8000", "bash")]


def _files(s: Subject, export: Path | None) -> list[str]:
    where = export if export is not None else s.ckpt
    entries, problems = read_sha256sums(where)
    entries.pop(CARD, None)
    if not entries:
        return [f"No SHA256SUMS in {text(where)}: no file digests stated."]
    lines = ["| file | bytes | sha256 |", "|---|---|---|"]
    for name, digest in sorted(entries.items()):
        p = where / name
        size = p.stat().st_size if p.is_file() else "missing"
        lines.append(f"| {text(name)} | {size} | {digest} |")
    if problems:
        lines += [""] + [f"- {text(p, 300)}" for p in problems]
    return lines


def _export_section(export: Path, s: Subject) -> list[str]:
    miss: list[str] = []
    info = _json(export / EXPORT_INFO, miss, "export record") or {}
    entries, _ = read_sha256sums(export)
    entries.pop(CARD, None)
    lines = [f"- source: {text(info.get('kind'))} {text(info.get('source'), 300)} (step {text(info.get('step') if info.get('step') is not None else s.step)}); "
             f"source digest {s.digest.get('digest')} ({s.digest.get('kind')})",
             f"- export digest {export_digest(entries)} (sha256 of the SHA256SUMS lines of every file but {CARD})",
             f"- dtype {text(info.get('dtype'))}, vocab_size {text(info.get('vocab_size'))}, "
             f"tensor keys {text(info.get('tensors', 'not recorded'))}"]
    for note in info.get("trimmed") or []:
        lines.append(f"- rows trimmed: {text(note, 300)}")
    if not info.get("trimmed"):
        lines.append("- rows trimmed: none recorded")
    if dropped := info.get("ignored_on_load"):
        lines.append(f"- tensors dropped because transformers ignores them on load: {text(', '.join(map(str, dropped)), 600)}")
    tok = info.get("tokenizer")
    if isinstance(tok, dict):
        files = tok.get("files") if isinstance(tok.get("files"), dict) else {}
        lines.append(f"- tokenizer restored from {text(tok.get('spec'), 300)} (revision {text(tok.get('revision'))}, "
                     f"{text(tok.get('tokens'))} tokens), its files' sha256:")
        lines += [f"  - {text(k)} {text(v)}" for k, v in sorted(files.items())]
    else:
        lines.append("- tokenizer: the source checkpoint's own")
    lines += [f"- {text(m, 300)}" for m in miss]
    return lines


def export_digest(entries: dict[str, str]) -> str:
    from common.io import sha256_text

    return sha256_text("".join(f"{d}  {n}\n" for n, d in sorted(entries.items()) if n != CARD))


def check_inputs(report: str | Path | None, study: str | Path | None) -> None:
    """Refuse a report dir without results.csv or an unreadable study file before any work."""
    if report is not None and not (Path(report) / "results.csv").is_file():
        raise CardError(f"report: {report} has no results.csv (expected analyze's out dir)")
    if study is not None:
        from common.study import load_study

        load_study(str(study))


def checkpoint_card(ckpt: str | Path, *, report: str | Path | None = None, study: str | Path | None = None,
                    export: str | Path | None = None, repo_id: str | None = None) -> str:
    """The README.md text of `ckpt` (module doc); `export`: the export dir the card goes into."""
    s = subject(Path(ckpt))
    export = Path(export) if export is not None else None
    ev = evaluation(s, Path(report) if report is not None else None)
    name = repo_id or s.name
    # an export's card names no path of this machine: it loads from its own directory, or the hub repo
    where = repo_id or ("." if export is not None else str(s.ckpt))
    stage = "GRPO" if s.grpo else "SFT" if s.config is not None else "unknown stage"
    out = [_front_matter(s, ev, name), f"# {text(name)}", ""]
    out += ["## What it is", ""]
    if s.label is not None:
        out.append(f"{'An' if stage == 'SFT' else 'A'} {stage} checkpoint of dtsft: arm {text(s.label)}, "
                   f"seed {'not recorded' if s.seed is None else s.seed}, step {s.step} of "
                   f"{text(total_steps(s)[0])}, trained from {text(_get(s.config, 'model.path'))}.")
    else:
        out.append(f"A model directory ({text(s.ckpt)}) with no run records.")
    out.append(f"Checkpoint digest: {s.digest.get('digest')} ({s.digest.get('kind')}; the digest an evaluation of the source directory records).")
    if export is not None:
        out += ["", "## Serving export", ""] + _export_section(export, s)
    out += ["", "## Training recipe", ""] + _recipe(s)
    out += ["", "## Data", ""] + _data(s)
    out += ["", "## Sister checkpoints", ""] + _sisters(s)
    out += ["", "## Evaluation", ""] + _evaluation(s, ev)
    out += ["", "## Findings", "", findings(ev)]
    out += ["", "## How to use", ""] + _usage(where)
    out += ["", "## Files", ""] + _files(s, export)
    out += ["", "## Provenance", ""]
    m = s.manifest
    if m is not None:
        code = (_get(m, "git.commit"), _get(m, "git.dirty"))
        later = [(i, launch) for i, launch in enumerate(_get(m, "launches") or [], 1) if i > 1 and isinstance(launch, dict)
                 and isinstance(launch.get("git"), dict) and (_get(launch, "git.commit"), _get(launch, "git.dirty")) != code]
        out += [f"- commit {text(code[0])} (dirty: {text(code[1])}){' at its first launch' if later else ''}",
                f"- command: {text(_get(m, 'command'), 1000)}"]
        if later:
            out.append("- the run resumed from other code (the checkpoints written after a resume were trained by its code "
                       "too): " + "; ".join(f"launch {i} at {text(launch.get('time'))}: commit {text(_get(launch, 'git.commit'))} "
                                            f"(dirty: {text(_get(launch, 'git.dirty'))})" for i, launch in later))
    out += [f"- {text(w, 400)}" for w in s.missing] or []
    if m is None and not s.missing:
        out.append("- no run manifest")
    out += ["", "## Not reproduced", ""]
    if study is not None:
        from common.study import load_study

        st = load_study(str(study))
        out += [f"Study {text(st.name)}:", ""] + ([f"- {text(n, 2000)}" for n in st.notes] or ["- the study file lists no notes"])
    else:
        out.append("No study file given: nothing is stated about what is not reproduced.")
    return "\n".join(out) + "\n"


def file_label(label: str) -> str:
    """An arm's label (`<arm>/<name>` for a variant) as one file-name part: safe characters, no `/`."""
    return tag(label.replace("/", "-"))


def card_name(label: str, seed: int, step: int, *, distinct: bool = False) -> str:
    """`<label>-s<seed>-step<N>.md` (file_label); `distinct`: with a digest of the label after it, for
    labels that share one such name (search/v1 and search-v1)."""
    from common.io import sha256_text

    return f"{file_label(label)}{'-' + sha256_text(label)[:8] if distinct else ''}-s{seed}-step{step}.md"


CARD_FILE = re.compile(r"[A-Za-z0-9._-]+-s\d+-step\d+\.md")   # card_name's


def write_report_cards(report: str | Path, finals: list[tuple[str, int, Path]], *,
                       study: str | Path | None = None) -> list[Path]:
    """`analyze` (cards=true, else `finals` is empty): `<report>/cards/<arm>-s<seed>-step<N>.md` for every (label, seed, final
    checkpoint dir) given; returns the paths written. Labels a file name cannot tell apart (card_name) each
    get a name with a digest of the label, so no card overwrites another. The cards dir is replaced whole (a
    card of an earlier analysis is not left beside these), or renamed aside when it holds anything but cards."""
    from collections import Counter

    from common.io import atomic_dir, replace_aside

    cards = Path(report) / CARDS_DIR
    if (cards.exists() or cards.is_symlink()) and (cards.is_symlink() or not cards.is_dir()
                                                   or not all(CARD_FILE.fullmatch(p.name) for p in cards.iterdir())):
        replace_aside(cards)
    if not finals:   # no card (cards=false, or nothing evaluated): an earlier analysis's cards go, no empty dir is left
        shutil.rmtree(cards, ignore_errors=True)
        return []
    steps = [int(layout.parse_step(Path(ckpt).name)) for _, _, ckpt in finals]
    plain = Counter(card_name(label, seed, step) for (label, seed, _), step in zip(finals, steps))
    names = [card_name(label, seed, step, distinct=plain[card_name(label, seed, step)] > 1)
             for (label, seed, _), step in zip(finals, steps)]
    with atomic_dir(cards, existing="replace") as tmp:
        for (_, _, ckpt), name in zip(finals, names):
            (tmp / name).write_text(checkpoint_card(ckpt, report=report, study=study), encoding="utf-8")
    return [cards / name for name in names]
