"""`report.html`: the report a researcher opens in a browser, from disk (`file://`), with no network.

One self-contained page (figures embedded as PNG data, the tables, every missing point with its reason,
the problems, provenance; the page's CSS and JS from `analysis/html_assets/`, inlined) and, next to it,
`report_data/`: every trajectory of every eval dir, as `<script>` shard files the page loads on demand
(Chromium refuses `fetch()` from `file://`; a `<script src>` it loads). Per (run, step, bench) one
*list shard* `e<K>.js` (per item: id, question head, metrics, turns, tool calls, extraction rule, stop
reason: what the item list and the paired counts need) and *transcript chunks* `e<K>_t<C>.js` of
`CHUNK` full transcripts each, loaded when an item is opened. A full study (~160k episodes) is never
loaded at once: the page holds the index, and at most a few dozen shards (least recently used dropped).

Every string from a row is data: the shards are JSON (`<` written as `\\u003c`), the page builds its DOM
with `textContent` only (never `innerHTML`), and the static part is escaped with `html.escape`.
"""
from __future__ import annotations

import base64
import html
import json
import re
from pathlib import Path
from typing import Any

from analysis.aggregate import where
from analysis.collect import json_rows, row_problem
from analysis.discover import ANCHOR_ARM, Run, provenance
from analysis.report import DATA_DIR, SHARD, ignored_head, missing_count, set_aside
from common.io import atomic_dir
from evals.registry import kind_of

ASSETS = Path(__file__).with_name("html_assets")
MARKER = re.compile(r"@@(CSS|REPORT|INDEX|JS)@@")
CHUNK = 50  # full transcripts per transcript shard
QUESTION_HEAD = 200  # characters of the question kept in the item list


def js_json(obj: Any) -> str:
    """JSON safe inside a `<script>` element or file: no `<`, `>` or `&` can close or open a tag."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), default=str)
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def correct_metric(bench: str) -> str:
    """"Right" in the paired view: the bench kind's `correct` metric (EM for QA; evals.registry)."""
    return kind_of(bench).correct


def score_metrics(bench: str) -> list[str]:
    """The per-item scores the item list shows: the bench kind's `shown` (evals.registry)."""
    return list(kind_of(bench).shown)


def _text(v: Any) -> str:
    if v is None:
        return ""
    return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, indent=1, default=str)


def _calls(msg: dict) -> list[dict]:
    out = []
    for call in msg.get("tool_calls") or []:
        fn = call.get("function", call) if isinstance(call, dict) else {}
        out.append({"name": _text(fn.get("name")), "args": _text(fn.get("arguments"))})
    return out


def _message(msg: Any) -> dict:
    if not isinstance(msg, dict):
        return {"role": "?", "content": _text(msg)}
    m = {"role": _text(msg.get("role")), "content": _text(msg.get("content"))}
    if msg.get("reasoning_content"):
        m["reasoning"] = _text(msg["reasoning_content"])
    if msg.get("name"):
        m["name"] = _text(msg["name"])
    if calls := _calls(msg):
        m["calls"] = calls
    return m


def _game_messages(bench: str, row: dict) -> list[dict]:
    """A game as one conversation: the first step's prompt, then per step the new observation,
    the reply (the raw text folded when it differs from the parsed content) and what the game did."""
    out: list[dict] = []
    for k, step in enumerate(row.get("transcript") or []):
        if not isinstance(step, dict):
            continue
        sent = [_message(m) for m in step.get("messages") or []]
        out += sent if k == 0 else [m for m in sent[-1:] if m["role"] != "assistant"]
        reply, content = _text(step.get("reply")), _text(step.get("content"))
        msg = {"role": "assistant", "content": content}
        if reply and reply != content:
            msg["reasoning"] = reply
        msg["calls"] = [{"name": "action", "args": _text(step.get("action"))}]
        out.append(msg)
        valid = "valid" if step.get("valid") else kind_of(bench).invalid_step
        out.append({"role": "env", "name": "game",
                    "content": f"action {_text(step.get('action'))} ({valid}); reward {step.get('reward')}; "
                               f"done {step.get('done')}"})
    return out


def transcript(bench: str, row: dict) -> dict:
    """One row as the page shows it: messages (role, content, reasoning, calls), answer, golds, scores."""
    if kind_of(bench).game:
        messages = _game_messages(bench, row)
        answer = " ".join(_text(a) for a in row.get("actions") or [])
        golds = [f"goal: {_text(row.get('instruction'))}"] if row.get("instruction") else []
    else:
        messages = [_message(m) for m in row.get("messages") or []]
        answer = _text(row.get("finish_answer") if row.get("finish_answer") is not None else row.get("prediction"))
        golds = [_text(g) for g in row.get("golden_answers") or []]
    info = {k: row.get(k) for k in ("stop_reason", "extract_rule", "num_turns", "num_tool_calls", "num_tool_errors",
                                    "generated_tokens", "steps", "invalid_actions", "task", "seed") if k in row}
    return {"id": _text(row.get("id")), "question": _text(row.get("question") or row.get("instruction")),
            "messages": messages, "answer": answer, "golds": golds, "metrics": row.get("metrics") or {},
            "info": info}


def list_item(bench: str, row: dict, chunk: int) -> dict:
    metrics = row.get("metrics") if isinstance(row.get("metrics"), dict) else {}
    ok = None if row.get("skipped_empty_gold") is True else metrics.get(correct_metric(bench))   # out of the bench's means
    turns = row.get("num_turns", row.get("steps"))
    return {"id": _text(row.get("id")), "q": _text(row.get("question") or row.get("instruction"))[:QUESTION_HEAD],
            "m": metrics, "turns": turns, "calls": row.get("num_tool_calls", 0 if kind_of(bench).game else None),
            "rule": row.get("extract_rule"), "stop": row.get("stop_reason"),
            "ok": None if ok is None else int(float(ok) >= 1.0), "c": chunk}


def read_rows(path: Path, problems: list[str]) -> list[dict]:
    rows = []
    for lineno, obj, why in json_rows(path):
        why = why or row_problem(obj) or (None if "id" in obj else "a row needs an `id`")
        if why:
            problems.append(f"{path}:{lineno}: not shown in report.html ({why})")
        else:
            rows.append(obj)
    return rows



def _write_shard(path: Path, key: str, data: Any) -> int:
    text = f"window.dtsftShard({js_json(key)},{js_json(data)});\n"
    path.write_text(text, encoding="utf-8")
    return len(text.encode("utf-8"))


def eval_dirs(runs: list[Run], anchor_eval: Path | None) -> list[tuple[str, int, int, Path]]:
    """(arm, seed, step, eval dir) of every evaluation, the anchor's first."""
    out = [(ANCHOR_ARM, 0, 0, Path(anchor_eval))] if anchor_eval is not None and Path(anchor_eval).is_dir() else []
    return out + [(r.arm, r.seed, s, d) for r in runs for s, d in sorted(r.evals.items())]


def write_shards(data: Path, dirs: list[tuple[str, int, int, Path]], benches: list[str],
                 problems: list[str]) -> list[dict]:
    """Every (eval dir × bench) with a jsonl as one list shard + its transcript chunks; the index entries.
    `data` is replaced whole (a shard left from a previous analysis must not be shown), or renamed aside
    when it holds anything but shards."""
    if (data.exists() or data.is_symlink()) and (data.is_symlink() or not data.is_dir()
                                                 or not all(SHARD.fullmatch(p.name) for p in data.iterdir())):
        set_aside(data)
    entries = []
    with atomic_dir(data, existing="replace") as tmp:
        for arm, seed, step, d in dirs:
            for bench in benches:
                path = d / f"{bench}.jsonl"
                if not path.is_file():
                    continue
                rows = read_rows(path, problems)
                key = f"e{len(entries)}"
                chunks = [rows[i:i + CHUNK] for i in range(0, len(rows), CHUNK)]
                size = _write_shard(tmp / f"{key}.js", key,
                                    [list_item(bench, r, i // CHUNK) for i, r in enumerate(rows)])
                for c, chunk in enumerate(chunks):
                    size += _write_shard(tmp / f"{key}_t{c}.js", f"{key}_t{c}", [transcript(bench, r) for r in chunk])
                entries.append({"key": key, "arm": arm, "seed": seed, "step": step, "bench": bench, "n": len(rows),
                                "chunks": len(chunks), "bytes": size,
                                "run": ANCHOR_ARM if arm == ANCHOR_ARM else f"{arm}/seed{seed}"})
    return entries


def seed_means(entries: list[dict], finals: dict[str, list[tuple[int, int]]], unscored) -> dict:
    """bench -> arm -> the paired view's seed mean of each arm with two or more seeds: its seeds and, at "final",
    the list shards of each seed's final checkpoint as the paired table takes it (`finals[arm]`:
    analysis.aggregate.final_steps, one checkpoint per seed for the whole row), or the reason the table gives for
    its gap (`unscored`: Points.unscored; a seed without the rows: no per-item file)."""
    key = {(e["arm"], e["seed"], e["step"], e["bench"]): e["key"] for e in entries}
    out: dict[str, dict] = {}
    for bench in dict.fromkeys(e["bench"] for e in entries):
        metric = kind_of(bench).headline or "em"
        for arm, last in finals.items():
            if len(last) < 2:
                continue
            why = unscored(arm, last, bench, metric) or next((f"no per-item {metric}: {where(arm, s, t)} {bench}.jsonl"
                                                              for s, t in last if (arm, s, t, bench) not in key), None)
            got = {"why": why} if why else {"keys": [key[(arm, s, t, bench)] for s, t in last]}
            out.setdefault(bench, {})[arm] = {"seeds": [s for s, _ in last], **got}
    return out


# ---- the static part ---------------------------------------------------------------------------------

def _e(v: Any) -> str:
    return html.escape(str(v), quote=True)


def _table_html(name: str, table) -> str:
    head = "".join(f"<th>{_e(c.label)}</th>" for c in table.columns)
    body = "".join("<tr><th>" + _e(label) + "</th>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>"
                   for label, cells in table.rows)
    return (f'<section class="table" id="table-{_e(name)}"><h3>{_e(name)}</h3><p class="caption">{_e(table.caption)}</p>'
            f"<table><thead><tr><th>{_e(table.row_header)}</th>{head}</tr></thead><tbody>{body}</tbody></table></section>")


def _figure_html(fig) -> str:
    png = next((p for p in fig.paths if p.suffix == ".png"), None)
    if png is None or not png.is_file():
        return ""
    data = base64.b64encode(png.read_bytes()).decode("ascii")
    notes = "".join(f"<li>{_e(n)}</li>" for n in fig.notes.values())
    return (f'<figure id="fig-{_e(png.stem)}"><img alt="{_e(png.stem)}" src="data:image/png;base64,{data}">'
            f"<figcaption><b>{_e(png.stem)}</b> ({_e(', '.join(fig.panels))}). {_e(fig.caption or '')}"
            f"{'<ul>' + notes + '</ul>' if notes else ''}</figcaption></figure>")


def _runs_html(runs: list[Run]) -> str:
    rows = []
    for r in runs:
        prov = provenance(r.manifest)
        prov_text = "<br>".join(f"<code>{_e(k)}</code>: <code>{_e(v)}</code>" for k, v in prov.items()) or "no manifest.json"
        rows.append(f"<tr><td>{_e(r.arm)}</td><td>{r.seed}</td><td>{_e(r.status())}</td>"
                    f"<td>{_e(', '.join(str(s) for s in sorted(r.checkpoints)) or 'none')}</td>"
                    f"<td>{_e(', '.join(str(s) for s in sorted(r.evals)) or 'none')}</td><td>{prov_text}</td></tr>")
    return ("<table><thead><tr><th>arm</th><th>seed</th><th>status</th><th>checkpoints</th><th>evaluated</th>"
            f"<th>provenance</th></tr></thead><tbody>{''.join(rows)}</tbody></table>")


def _list_html(items: list[str], empty: str, list_id: str) -> str:
    if not items:
        return f'<p id="{list_id}">{_e(empty)}</p>'
    return f'<ul id="{list_id}">' + "".join(f"<li>{_e(i)}</li>" for i in items) + "</ul>"


def _inline(text: str) -> str:
    """A Markdown line's text as HTML: escaped, each `code span` a <code> element."""
    return re.sub(r"`([^`]*)`", r"<code>\1</code>", _e(text))


def _settings_block_html(lines: list[str]) -> str:
    """The Markdown lines of the evaluations' settings block: its head a paragraph, its `- ` items a list, each
    `code span` a <code> element (the text escaped first)."""
    if not lines:
        return ""
    items = "".join(f"<li>{_inline(x[2:])}</li>" for x in lines[1:])
    return f'<p id="eval-settings">{_inline(lines[0])}</p>' + (f"<ul>{items}</ul>" if items else "")


def _ignored_html(ignored: list[Path]) -> str:
    """The run dirs renamed aside (kept, not analysed), under report.md's head line."""
    if not ignored:
        return ""
    items = "".join(f"<li><code>{_e(p)}</code></li>" for p in ignored)
    return f'<p>{_inline(ignored_head(ignored))}</p><ul id="ignored">{items}</ul>'


def write_html(out: Path, *, runs: list[Run], figures: list, tables: dict, missing: list, problems: list[str],
               settings: dict, benches: list[str], anchor_eval: Path | None, partial: str | None = None,
               finals: dict | None = None, unscored=None, evaluated_under: list[str] = (), anchor_line: str = "",
               ignored: list[Path] = ()) -> Path:
    """`<out>/report.html` + `<out>/report_data/` (the trajectories of every eval dir, sharded); `partial`
    (some expected point failed to evaluate) heads the report; `finals`, `unscored`: the paired table's final
    checkpoints and gaps, which the page's seed means follow (seed_means); `evaluated_under`: the evaluations'
    settings block (analysis.eval_settings), under the page's settings; `anchor_line`: which base model the anchor
    is (analysis.report.anchor_text); `ignored`: the run dirs renamed aside (kept, not analysed), as report.md lists them."""
    out = Path(out)
    problems = list(problems)
    entries = write_shards(out / DATA_DIR, eval_dirs(runs, anchor_eval), benches, problems)
    bench_names = [b for b in benches if any(e["bench"] == b for e in entries)]
    index = {"data": DATA_DIR, "entries": entries, "benches": bench_names,
             "correct": {b: correct_metric(b) for b in bench_names},
             "scores": {b: score_metrics(b) for b in bench_names},
             "headline": {b: kind_of(b).headline or "em" for b in bench_names},
             "means": seed_means(entries, finals or {}, unscored)}
    settings_html = ", ".join(f"<code>{_e(k)}={_e(v)}</code>" for k, v in settings.items())
    parts = [
        '<section id="report" class="tab">', f'<p id="partial"><b>{_e(partial)}</b></p>' if partial else "",
        "<h2>Results</h2>", "".join(_table_html(n, t) for n, t in tables.items() if n.startswith("main")),
        "<h2>Figures</h2>", "".join(_figure_html(f) for f in figures),
        "<h2>Paired, pre/post and reference tables</h2>",
        "".join(_table_html(n, t) for n, t in tables.items() if not n.startswith("main")),
        f"<h2>Missing points ({missing_count(missing)})</h2>",
        _list_html([m.line() for m in missing], "None: every expected (checkpoint × bench) has a result.", "missing"),
        f"<h2>Problems reading inputs ({len(problems)})</h2>", _list_html(problems, "None.", "problems"),
        "<h2>Anchor</h2>", f'<p id="anchor">{_inline(anchor_line)}</p>' if anchor_line else "",
        "<h2>Runs and provenance</h2>", _runs_html(runs), _ignored_html(list(ignored)),
        f"<p>Settings: {settings_html}</p>", _settings_block_html(evaluated_under), "</section>",
    ]
    fill = {"CSS": (ASSETS / "report.css").read_text(encoding="utf-8"), "REPORT": "\n".join(parts),
            "INDEX": js_json(index), "JS": (ASSETS / "report.js").read_text(encoding="utf-8")}
    # one pass over the template: a marker inside the filled-in text is never replaced again
    page = MARKER.sub(lambda m: fill[m.group(1)], (ASSETS / "report.html").read_text(encoding="utf-8"))
    path = out / "report.html"
    path.write_text(page, encoding="utf-8")
    return path

