"""The evaluation settings a report's numbers were made under, as one short block of report.md and report.html.

Read from the eval dirs' meta.json only (each bench's identity keys, evals.identity; the checkpoint's aside, it
differs by design), never from analyze's command line: a report labels its numbers with their own settings. A
setting every evaluation records with one value is *shared*; one with one value per bench but not the same for all
is listed *by bench*; one whose value differs between the evaluations of one bench (that column mixes them: also
a problem, analysis.aggregate.mixed_settings) is listed with each value and where, never one picked. The anchor's
prompt (`anchor_nudge`) differs by design: the runs' prompt is the one stated, the anchor's beside it.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from analysis.aggregate import Points, by_value, recorded_settings, seen_text, values_seen, where
from analysis.discover import ANCHOR_ARM

PROMPT = "evaluate.prompt"
NOT_SETTINGS = ("bench.name",)   # the bench itself, not a setting of it
DIGEST = re.compile(r"[0-9a-f]{64}")


def value_text(v) -> str:
    """A recorded value as the block shows it: JSON's spelling (`null`, `false`), a sha256 digest shortened."""
    if isinstance(v, str):
        return f"{v[:12]}…" if DIGEST.fullmatch(v) else v
    return json.dumps(v, ensure_ascii=False, separators=(",", ":"))


@dataclass
class EvalSettings:
    benches: int = 0
    evaluations: int = 0                                    # (eval dir × bench) with a recorded identity
    shared: dict[str, object] = field(default_factory=dict)
    by_bench: dict[str, list[tuple[object, list[str]]]] = field(default_factory=dict)   # key -> [(value, benches)]
    differ: list[tuple[str, str, str]] = field(default_factory=list)                 # (bench, key, values and where)
    with_anchor: bool = False                               # the anchor's evaluations among them
    anchor_prompt: object = None
    unrecorded: list[str] = field(default_factory=list)     # `where × bench` of a reported point without one

    def lines(self) -> list[str]:
        """The block as Markdown lines (code spans in backticks)."""
        if not self.evaluations:
            head = "Evaluation settings: no evaluation's meta.json records its identity, so none is stated"
            return [head + (f" ({self._unrecorded()})." if self.unrecorded else ".")]
        count = f"{self.evaluations} evaluation{'s' if self.evaluations != 1 else ''} of {self.benches} " \
                f"bench{'es' if self.benches != 1 else ''}"
        anchor = ", the anchor's included" if self.with_anchor else ""
        lines = [f"Evaluation settings (the identity keys each evaluation's meta.json records, the checkpoint's aside; "
                 f"{count}{anchor}):"]
        if self.shared:
            lines.append("- shared: " + ", ".join(f"`{k}={value_text(v)}`" for k, v in self.shared.items()))
        if self.by_bench:
            lines.append("- by bench: " + "; ".join(
                f"`{k}`: " + ", ".join(f"{value_text(v)} ({', '.join(bs)})" for v, bs in vals)
                for k, vals in self.by_bench.items()))
        if self.differ:
            lines.append("- differ between evaluations of one bench: "
                         + "; ".join(f"{bench} `{key}`: {text}" for bench, key, text in self.differ))
        if self.anchor_prompt is not None and self.shared.get(PROMPT) != self.anchor_prompt:
            lines.append(f"- the anchor's prompt: `{PROMPT}={value_text(self.anchor_prompt)}` (by design)")
        if self.unrecorded:
            lines.append(f"- no identity recorded: {self._unrecorded()}")
        return lines

    def _unrecorded(self) -> str:
        more = len(self.unrecorded) - 3
        return ", ".join(self.unrecorded[:3]) + (f" and {more} more" if more > 0 else "")


def eval_settings(points: Points, benches: list[str]) -> EvalSettings:
    """The settings block of the evaluations of `benches` that `points` reads (its eval dirs, the anchor's included)."""
    out = EvalSettings()
    anchor = where(ANCHOR_ARM, 0, 0)
    held = {b: h for b in benches if (h := recorded_settings(points, b))}
    out.benches, out.evaluations = len(held), sum(map(len, held.values()))
    out.with_anchor = any(at == anchor for h in held.values() for at, _ in h)
    out.anchor_prompt = next((k[PROMPT] for h in held.values() for at, k in h if at == anchor and PROMPT in k), None)
    for key in sorted({k for h in held.values() for _, ks in h for k in ks} - set(NOT_SETTINGS)):
        # each bench's values of `key` among the evaluations that record it (the anchor's prompt aside: by design)
        per = {b: values_seen([(at, k) for at, k in h if not (key == PROMPT and at == anchor)], key)
               for b, h in held.items() if any(key in k for at, k in h if not (key == PROMPT and at == anchor))}
        one = {b: v[0][0] for b, v in per.items() if len(v) == 1}
        if len(per) == len(held) == len(one) and len({by_value(v) for v in one.values()}) == 1:
            out.shared[key] = next(iter(one.values()))
            continue
        groups: dict[str, tuple[object, list[str]]] = {}
        for b, v in one.items():
            groups.setdefault(by_value(v), (v, []))[1].append(b)
        if groups:
            out.by_bench[key] = list(groups.values())
        out.differ += [(b, key, seen_text(v)) for b, v in per.items() if len(v) > 1]
    out.differ.sort(key=lambda d: (benches.index(d[0]), d[1]))
    cells = points.table[points.table.bench.isin(benches)][["arm", "seed", "step", "bench"]].drop_duplicates()
    recorded = {(at, b) for b, h in held.items() for at, _ in h}
    out.unrecorded = [f"{where(a, s, t)} × {b}" for a, s, t, b in cells.itertuples(index=False)
                      if (where(a, s, t), b) not in recorded]
    return out
