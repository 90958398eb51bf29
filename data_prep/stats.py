"""Bookkeeping for one build: per-source counts, rejections and the manifest's statistics.

Every record read ends in exactly one bucket — kept, rejected (with a reason) or not_selected
(a valid record beyond the arm's quota) — and `check_totals` enforces read == the sum.
"""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from data_prep.schema import trajectory_id


@dataclass
class SourceCounts:
    spec: str
    domain: str
    identity: dict
    read: int = 0
    kept: int = 0
    rejected: int = 0
    not_selected: int = 0


def manifest_path(path: str, dataset_dir=None) -> str:
    """How a manifest names a source file: one the build wrote into its dataset dir (`dataset_dir`, the temp dir it is
    built in: data=synthetic's `raw/`) relative to that dir, so the name follows the dir wherever it is moved or renamed
    aside; any other file by its absolute path. A reader resolves it against the dataset dir (`dir / path`)."""
    where = Path(os.path.abspath(path))
    base = os.path.abspath(dataset_dir) if dataset_dir is not None else None
    return where.relative_to(base).as_posix() if base is not None and where.is_relative_to(base) else str(where)


@dataclass
class RunStats:
    sources: dict[tuple[str, str], SourceCounts] = field(default_factory=dict)  # (domain, spec) ->
    rejections: list[dict] = field(default_factory=list)

    def add_source(self, key: tuple[str, str], src, out_dir=None, final_dir=None) -> None:
        """Count the records read from source spec `key[1]` for domain `key[0]` (a spec listed under two domains
        has an entry for each; the other methods take this key)."""
        if key in self.sources:  # listed twice: one bookkeeping entry (its records are duplicate_id)
            return
        domain, spec = key
        ident = src.identity()
        for f in ident.get("files", []):
            f["path"] = manifest_path(f["path"], out_dir)
        # a generated source's spec names its file where the dataset lands, absolute (a spec as given is kept as written)
        shown = spec.replace(str(out_dir), os.path.abspath(final_dir)) if out_dir is not None else spec
        self.sources[key] = SourceCounts(shown, domain, ident)

    def read_ok(self, key: tuple[str, str]) -> None:
        self.sources[key].read += 1

    def reject(self, key: tuple[str, str], rejection: dict, was_ok: bool = False) -> None:
        """`was_ok`: the record was already counted as read (rejected after parsing)."""
        s = self.sources[key]
        if not was_ok:
            s.read += 1
        s.rejected += 1
        self.rejections.append(rejection)

    def kept(self, key: tuple[str, str]) -> None:
        self.sources[key].kept += 1

    def not_selected(self, key: tuple[str, str]) -> None:
        self.sources[key].not_selected += 1

    def check_totals(self) -> None:
        for s in self.sources.values():
            if s.read != s.kept + s.rejected + s.not_selected:
                raise RuntimeError(f"bookkeeping bug for {s.spec}: read {s.read} != kept {s.kept} + rejected {s.rejected} + not_selected {s.not_selected}")

    def summary(self, rows: list[dict]) -> dict:
        srcs = list(self.sources.values())
        n_tok = np.asarray([r["num_tokens"] for r in rows] or [0])
        n_train = np.asarray([r["num_trainable"] for r in rows] or [0])
        multi = {trajectory_id(r["id"]) for r in rows if r.get("_extra_row")}
        inexact = sum(int(r.get("_inexact_tokens", 0)) for r in rows)
        checks: Counter = Counter()
        for r in rows:
            checks.update(r.get("_checks", {}))
        by_source: dict[str, Counter] = {}
        for r in rows:
            by_source.setdefault(r["source"], Counter())["rows"] += 1
        return {
            "sources": [{"spec": s.spec, "domain": s.domain, **s.identity, "read": s.read, "kept": s.kept,
                         "rejected": s.rejected, "not_selected": s.not_selected} for s in srcs],
            "counts": {
                "read": sum(s.read for s in srcs), "kept": sum(s.kept for s in srcs),
                "rejected": sum(s.rejected for s in srcs), "not_selected": sum(s.not_selected for s in srcs),
                "rows": len(rows),
                "kept_by_source": dict(_kept_by(srcs)),
                "rows_by_domain": dict(Counter(r["domain"] for r in rows)),
            },
            "rejected_by_reason": dict(sorted(Counter(r["reason"] for r in self.rejections).items())),
            "tokens": {
                "p50": float(np.percentile(n_tok, 50)), "p90": float(np.percentile(n_tok, 90)), "max": int(n_tok.max()),
                "mean": float(n_tok.mean()), "total": int(n_tok.sum()), "trainable_total": int(n_train.sum()),
                "trainable_fraction": float(n_train.sum() / max(1, n_tok.sum())),
            },
            "render": {
                # exact: trained in the context the model saw, on what it generated; as_rendered:
                # what keep_as_rendered / thoughts=drop train instead (0 under the defaults)
                "assistant_turns_exact": checks.get("exact", 0),
                "assistant_turns_as_rendered": checks.get("as_rendered", 0),
                "trainable_tokens_exact": int(n_train.sum()) - inexact,
                "trainable_tokens_as_rendered": inexact,
                # records the template rewrites need several rows to stay exact
                "records_multi_row": len(multi),
                "extra_rows": sum(1 for r in rows if r.get("_extra_row")) - len(multi),
                "boundary_retokenized_rows": sum(1 for r in rows if r.get("_retokenized")),
                "truncated_rows": sum(1 for r in rows if r.get("_truncated")),
                "epilogue_rows": sum(1 for r in rows if r.get("_epilogue")),
            },
        }


def _kept_by(srcs: list[SourceCounts]) -> Counter:
    c: Counter = Counter()
    for s in srcs:
        c[s.identity.get("format", s.spec)] += s.kept
    return c
