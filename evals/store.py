"""The eval store: everything `evaluate` keeps in an out dir goes through `EvalStore`, as a checkpoint
manager owns a checkpoint folder.

    <out>/<bench>.jsonl               the rows, one per item, each carrying its identity digest
    <out>/sampled_ids/<bench>.json    the sampled ids of the bench (with its source, seed, n)
    <out>/summary.json                per bench, recomputed from the rows of every complete bench
    <out>/meta.json                   the run's details and each bench's evaluation identity
    <out>/.evaluate.lock              held (flock) by the one evaluation writing the out dir

An out dir holds one identity per bench (evals.identity): `claim` refuses another one, or with
overwrite renames the old outputs aside (nothing is deleted). A bench's entries of meta.json
(`bench_items`, `sampled_ids`, `empty_gold_items`, `prompt_too_long_items`, `settings`, its kind's block, its own config keys) are
written by the call that evaluated it and kept by later calls that evaluate other benches.
"""
from __future__ import annotations

import json
from pathlib import Path

from common import fingerprint, lock
from common.io import JsonLineError, parse_json_line, read_json_object, replace_aside, write_json
from evals.errors import EvalError, IdentityError
from evals.registry import KINDS, key_prefixes, kind_of
from evals.results import ResultsError, append_rows, load_done

EVAL_LOCK = ".evaluate.lock"   # held by the one evaluation writing the out dir (EvalStore.lock)
# meta.json entries keyed by bench, kept for the benches a later call does not evaluate; `settings`: the result-changing
# settings (common.cards.RESULT_SETTINGS) of the call that evaluated the bench, as the top-level `config` is the last call's
PER_BENCH_META = ("bench_items", "sampled_ids", "empty_gold_items", "prompt_too_long_items", "settings")


class EvalStore:
    """The out dir of an evaluation (see the module doc)."""

    def __init__(self, out):
        self.out = Path(out)

    def rows_path(self, bench: str) -> Path:
        return self.out / f"{bench}.jsonl"

    def sample_path(self, bench: str) -> Path:
        return self.out / "sampled_ids" / f"{bench}.json"

    # ---- reading -----------------------------------------------------------------------------

    def meta(self) -> dict:
        path = self.out / "meta.json"
        if not path.exists():
            return {}
        try:
            meta = read_json_object(path)
            if not (isinstance(ids := meta.get("identities") or {}, dict) and all(isinstance(v, dict) for v in ids.values())):
                raise ValueError(f'{path}: "identities" must map each bench to its identity object')
            return meta
        except ValueError as exc:
            raise EvalError(f"{exc}; move it aside to evaluate into {self.out}") from exc

    def identities(self) -> dict:
        return dict(self.meta().get("identities") or {})   # (its shape checked by meta)

    def summary(self) -> dict:
        """summary.json as written (empty when absent or torn: it is rewritten from the rows)."""
        path = self.out / "summary.json"
        try:
            summary = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return {}
        return summary if isinstance(summary, dict) else {}

    def benches(self) -> set[str]:
        """The benches the out dir holds: an identity in meta.json, or a sample."""
        return set(self.identities()) | {p.stem for p in (self.out / "sampled_ids").glob("*.json")}

    def row_digests(self, bench: str) -> set:
        """The identity digests carried by a bench's rows (None for rows without one)."""
        digests, path = set(), self.rows_path(bench)
        if path.exists() and not path.is_file():
            raise ResultsError(f"{path}: expected the bench's rows file, found a directory or special file; "
                               f"move it aside to evaluate {bench} into {self.out}")
        if path.exists():
            for line in path.read_bytes().split(b"\n"):
                if line.strip():
                    try:
                        row = parse_json_line(line)
                    except JsonLineError:
                        continue  # a torn last line (load_done drops it) or a corrupt one (load_done refuses it)
                    if isinstance(row, dict) and isinstance(row.get("identity"), (str, type(None))):
                        digests.add(row.get("identity"))
        return digests

    def differences(self, bench: str, recorded: dict | None, want: dict) -> list[str]:
        """How the identity the out dir holds `bench` under differs from `want` (empty: none, or no rows)."""
        return self._diff(bench, recorded, want) if self.rows_path(bench).exists() else []

    def _diff(self, bench: str, recorded: dict | None, want: dict) -> list[str]:
        """Differences between what the out dir holds for `bench` (`recorded`, its rows' digests) and `want` (empty: the same identity)."""
        digest = want["fingerprint"]
        if recorded is not None and recorded.get("fingerprint") != digest:
            return fingerprint.fingerprint_diff(recorded, want) or [f"fingerprint: {recorded.get('fingerprint')} -> {digest}"]
        if None in (other := self.row_digests(bench) - {digest}):
            return [f"{self.rows_path(bench)}: rows without an identity digest (written before evaluation identity was recorded)"]
        if other:
            return [f"{self.rows_path(bench)}: rows of identity {sorted(map(str, other))[0][:16]}… (this request: {digest[:16]}…)"]
        return []

    def done(self, bench: str, ids) -> dict:
        """The rows held of the items `ids` (id -> row); a torn last line or duplicate rows are dropped
        from the file, saying so (load_done's repair: only the evaluation holding the out dir's lock calls this)."""
        return load_done(self.rows_path(bench), set(ids), repair=True)

    def complete_summary(self, bench: str, ident: dict | None) -> dict | None:
        """A bench's summary entry from its rows when it is complete and all of `ident` (rows without
        a digest when `ident` is None: an out dir from before evaluation identity); None otherwise."""
        ids_path, path = self.sample_path(bench), self.rows_path(bench)
        if not (ids_path.is_file() and path.is_file()):
            return None
        try:
            sample = read_json_object(ids_path)
            done = load_done(path, set(sample["ids"]))
        except (ValueError, KeyError, TypeError):   # a torn sample or rows file (ResultsError too): not held
            return None
        expected = ident.get("fingerprint") if ident else None
        if set(done) != set(sample["ids"]) or {r.get("identity") for r in done.values()} != {expected}:
            return None
        summary = kind_of(bench).summarize([done[i] for i in sample["ids"]])
        return described(summary, sample.get("source"), sample.get("unanswerable_excluded"))

    # ---- writing -----------------------------------------------------------------------------

    def lock(self) -> int:
        """Take the out dir's lock (`<out>/.evaluate.lock`, common.lock: the trainers' kind, released by
        the kernel however the holder ends) for one evaluation; returns the fd to close. Another live
        evaluation holding it: LockHeld (exit 2) naming it, before anything is read or written."""
        return lock.acquire(self.out / EVAL_LOCK, "another evaluate",
                            "two evaluations of one out dir would write every row twice; wait for it to finish or "
                            "stop it (a rerun resumes from its rows), or use another out=")

    def claim(self, bench: str, want: dict, recorded: dict | None, overwrite: bool) -> None:
        """Make sure the out dir holds `bench` under identity `want` only: refuse another one
        (IdentityError with the diff) or, with overwrite=true, rename its rows and sample aside."""
        outputs = [self.rows_path(bench), self.sample_path(bench)]
        if not any(p.exists() for p in outputs):
            return   # the out dir does not hold this bench (whatever meta.json last meant to write)
        diff = self._diff(bench, recorded, want)
        if not diff:
            return
        if not overwrite:
            raise IdentityError(
                f"{self.out} holds {bench} results of another evaluation identity (out dir -> this request):\n  "
                + "\n  ".join(diff) + ("\nSince they were scored, the evaluation code changed what a config's rows are "
                                       "(evals.identity.EVAL_SEMANTICS) or what identifies them (a bench kind's `semantics` "
                                       "in evals.registry: its comment says which)." if any(d.startswith("eval_semantics:") for d in diff) else "")
                + f"\nUse another out=, or overwrite=true to rename the old {bench} results aside "
                f"({bench}.jsonl.replaced-<UTC time>; nothing is deleted) and evaluate again.")
        for p in outputs:
            if p.exists():
                print(f"[evaluate] overwrite=true: {p} renamed to {replace_aside(p).name}")
        self.forget(bench)

    def forget(self, bench: str) -> None:
        """Its rows renamed aside, `bench` leaves summary.json and meta.json's identities too (each file renamed
        aside first, then written without it): an evaluation failing after this leaves no summary of rows gone."""
        for name, held in (("summary.json", self.summary()), ("meta.json", self.meta())):
            entries = held if name == "summary.json" else held.get("identities")
            if isinstance(entries, dict) and bench in entries:
                del entries[bench]
                path = self.out / name
                print(f"[evaluate] overwrite=true: {path} renamed to {replace_aside(path).name}, rewritten without {bench}")
                write_json(path, held)

    def check_sample(self, bench: str, ids: list[str]) -> None:
        """A resumed bench must be evaluating the very same ids as its sample (if any)."""
        path = self.sample_path(bench)
        if path.exists():
            try:
                old = read_json_object(path)
            except ValueError as exc:
                raise ResultsError(f"{exc}; use a fresh out=") from None
            if old.get("ids") != ids:
                raise ResultsError(
                    f"{path}: this out dir was started with a different sample of {bench} "
                    f"(n={old.get('n')}, seed={old.get('seed')}, source={old.get('source')}); use a fresh out=")

    def start(self, bench: str, ident: dict, sample: dict, identities: dict, cfg) -> None:
        """Record a bench's identity (into `identities`, meta.json's) and the settings of `cfg` it is evaluated under
        (meta.json's `settings`, written with the identity: a call stopped after re-evaluating it leaves no other
        evaluation's), and its sample, before its first row."""
        path = self.sample_path(bench)
        identities[bench] = ident
        meta = self.meta()
        settings = meta.get("settings") if isinstance(meta.get("settings"), dict) else {}
        write_json(self.out / "meta.json", {**meta, "identities": identities,
                                            "settings": {**settings, bench: result_settings(cfg)}})
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json(path, sample)

    def append(self, bench: str, ident: dict, rows: list[dict]) -> list[dict]:
        """Append finished rows, each with the identity digest; returns them as written."""
        rows = [{**row, "identity": ident["fingerprint"]} for row in rows]
        append_rows(self.rows_path(bench), rows)
        return rows

    def write_summary(self, summary: dict) -> None:
        write_json(self.out / "summary.json", summary)

    def write_meta(self, meta: dict, cfg, *, kept: list[str], old: dict, opened: dict) -> None:
        """Write meta.json: `meta` as this call (resolved config `cfg`) describes it, its per-bench
        entries for the benches it evaluated, each of their kinds' block (from what the kind opened
        for this call, `opened`: kind name -> evals.run.open_sources'); the entries of the benches it
        `kept` (held, not evaluated) come from `old`, the meta.json it started from: their per-bench
        entries (their `settings` among them: the top-level `config` is this call's), their kind's block, their own
        config keys."""
        from omegaconf import OmegaConf

        meta["settings"] = dict.fromkeys(cfg.benches, result_settings(cfg))
        for key in PER_BENCH_META:
            carried = old.get(key) if isinstance(old.get(key), dict) else {}
            meta[key] = {**{b: v for b, v in carried.items() if b in kept}, **(meta.get(key) or {})}
        blocks = {}   # kind name -> (the key its block follows, None: last; its block: this call's, else the kept one's)
        for kind in {k.name: k for k in KINDS.values() if k.meta is not None}.values():
            mine = [b for b, k in KINDS.items() if k is kind]
            blocks[kind.name] = (kind.meta_after, kind.meta(cfg, opened.get(kind.name)) if any(b in cfg.benches for b in mine)
                                 else old.get(kind.name) if any(b in kept for b in mine) else None)
        config = OmegaConf.to_container(cfg, resolve=True)
        old_config = old.get("config") if isinstance(old.get("config"), dict) else {}
        for bench, prefix in key_prefixes().items():
            if bench in kept:
                config.update({k: v for k, v in old_config.items() if k.startswith(prefix)})
        meta["config"] = config
        meta = {k: v for key, value in meta.items()
                for k, v in [(key, value), *((n, b) for n, (after, b) in blocks.items() if after == key)]}
        write_json(self.out / "meta.json", meta | {n: b for n, (after, b) in blocks.items() if after is None})


def result_settings(cfg) -> dict:
    """The settings of resolved config `cfg` that change a result (common.cards.RESULT_SETTINGS), as meta.json's
    `settings` records them per bench."""
    from omegaconf import OmegaConf

    from common.cards import RESULT_SETTINGS

    config = OmegaConf.to_container(cfg, resolve=True)
    return {k: config[k] for k in RESULT_SETTINGS if k in config}


def described(summary: dict, source, unanswerable: int | None) -> dict:
    """A bench's summary entry with its source and unanswerable items left out (QA benches); an empty
    sample's null metrics say where the items went."""
    from evals.metrics import NULL_REASON

    summary["source"] = source
    if unanswerable is not None:
        summary["unanswerable_excluded"] = unanswerable
    if summary["n"] == 0:
        left = f"; {unanswerable} items with answerable: false left out" if unanswerable else ""
        summary[NULL_REASON] = f"no items to score: the sample of {source} is empty{left}"
    return summary
