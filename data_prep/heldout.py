"""The held-out split: gold trajectories of each domain that no arm trains on (the teacher-forced benches).

    data-prep heldout n=N domains=[code,search] seed=S tokenizer=T out=DIR [data keys]

reads the sources an arm would read (data=synthetic: generated with the held-out `seed`, which should
differ from every arm's seed), and keeps per domain the first `n` records, in a seeded order, that
render and tokenize as training would. DIR is a dataset dir with an arm's columns, written through the
same atomic dir, plus `manifest.json` (the held-out records' content digests per domain, the render
settings, `fingerprint` = the digest of those digests), `SHA256SUMS` over every file and `COMPLETE`
last. A held-out dir is read only when it is COMPLETE and every file matches SHA256SUMS.

A record's *content digest* is the sha256 of its canonical JSON (sorted keys) without `id` and
`source`: two records with the same messages, tools, task and answer are the same trajectory
whatever they are called. Held-out content is looked for by `comparable_digest` (each assistant turn's
thought and content as one text, so data.reasoning=content and =reasoning_content read the same trajectory as
one): an arm built with `data.heldout=DIR` drops every candidate whose content is held out before selecting its
quota (rejected, reason `heldout`, so read = kept + rejected + not_selected still holds), and `check_disjoint`
refuses a training dataset that holds one (a DataPrepError: exit 2, naming the record ids and both files). `evaluate` opens the set it scores once
per call (`open_verified`: loaded, verified and, at a checkpoint whose run manifest names its training
data, checked disjoint from that data), then reads its records, digests and manifest from the one
`Heldout`, and renders each record as training did (`Heldout.span_tokenizer`, data_prep.spans).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from common.io import SHA256SUMS, check_sha256sums, read_json_object, sha256_text
from common.layout import COMPLETE  # written last, as into a state dir
from data_prep.errors import DataPrepError
from data_prep.schema import DOMAINS, FIELDS, trajectory_id

KIND = "heldout"
# not part of a record's content: what it is called and where it was read
NOT_CONTENT = ("id", "source")


class HeldoutError(DataPrepError):
    """A held-out dir that is not one (torn, changed, not data-prep's), or held-out content in training data."""


class TrainingDataError(HeldoutError):
    """Training data checked against a held-out set (`check_disjoint`) that is no dataset dir, or holds
    the content of a held-out record."""


def content_digest(rec: dict) -> str:
    """sha256 of the record's canonical fields but `id` and `source`, as sorted-key JSON."""
    body = {k: rec.get(k) for k in FIELDS if k not in NOT_CONTENT}
    return sha256_text(json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":")))


def comparable_digest(rec: dict) -> str:
    """`content_digest` of the record with each assistant turn's thought and content as one text (`reasoning_content`,
    then `content`, whitespace collapsed): the same trajectory read with data.reasoning=reasoning_content or =content
    (which put the thoughts in different fields) has one comparable digest. What `excluded` and `check_disjoint`
    compare (the manifest's digests, of the records as built, stay as they were)."""
    def merged(m):
        if not isinstance(m, dict) or m.get("role") != "assistant":
            return m
        text = " ".join(" ".join(str(m.get(k) or "") for k in ("reasoning_content", "content")).split())
        return {**{k: v for k, v in m.items() if k != "reasoning_content"}, "content": text}

    msgs = rec.get("messages")
    return content_digest({**rec, "messages": [merged(m) for m in msgs] if isinstance(msgs, list) else msgs})


def digests_fingerprint(digests: dict[str, dict[str, str]]) -> str:
    """One digest of a held-out set: its domains' sorted content digests."""
    return sha256_text(json.dumps({d: sorted(v.values()) for d, v in sorted(digests.items())}))


@dataclass(frozen=True)
class Heldout:
    """A verified held-out dir: `digests` {domain: {record id: content digest}}, its manifest."""
    dir: Path
    manifest: dict

    @property
    def manifest_path(self) -> Path:
        return self.dir / "manifest.json"

    @property
    def digests(self) -> dict[str, dict[str, str]]:
        return self.manifest["digests"]

    @property
    def fingerprint(self) -> str:
        return self.manifest["fingerprint"]

    @property
    def render_settings(self) -> dict:
        """How its records were rendered (data_prep.render.ChatRenderer's keyword arguments)."""
        return dict(self.manifest.get("render_settings") or {})

    def span_tokenizer(self, tokenizer):
        """Renders and tokenizes this set's records as training did (its render settings), each token
        with its span kind: a data_prep.spans.SpanTokenizer (called with a record)."""
        from data_prep.spans import SpanTokenizer

        return SpanTokenizer(tokenizer, **self.render_settings)

    def by_digest(self) -> dict[str, str]:
        """content digest -> held-out record id."""
        return {dg: rid for per in self.digests.values() for rid, dg in per.items()}

    def by_comparable_digest(self) -> dict[str, str]:
        """`comparable_digest` -> held-out record id, from the records the dir holds (one per record)."""
        import datasets

        ds = datasets.load_from_disk(str(self.dir))
        out: dict[str, str] = {}
        seen = set()
        for rid, msg in zip(ds["id"], ds["messages"]):
            tid = trajectory_id(rid)
            if tid not in seen:
                seen.add(tid)
                out.setdefault(comparable_digest(json.loads(msg)), tid)
        return out

    def records(self, domain: str) -> list[dict]:
        """The canonical records of `domain`, in the dir's order (one per record, however many rows)."""
        import datasets

        if domain not in self.digests:
            raise HeldoutError(f"{self.manifest_path}: holds no {domain} records (it holds {', '.join(self.digests) or 'none'})")
        ds = datasets.load_from_disk(str(self.dir))
        out, seen = [], set()
        for rid, dom, msg in zip(ds["id"], ds["domain"], ds["messages"]):
            tid = trajectory_id(rid)
            if dom == domain and tid not in seen:
                seen.add(tid)
                out.append(json.loads(msg))
        return out


def load(path: str | Path, key: str = "heldout") -> Heldout:
    """The held-out dir at `path` (the key `key` names it), refused (HeldoutError naming the file) unless it is COMPLETE, every
    file matches SHA256SUMS and its manifest is a held-out manifest whose fingerprint matches its digests."""
    d = Path(path)
    if not d.is_dir():
        raise HeldoutError(f"{key}={d}: no such directory (write one with `data-prep heldout out={d}`)")
    if not (d / COMPLETE).is_file():
        raise HeldoutError(f"{d}: no {COMPLETE} marker: not a finished `data-prep heldout` output")
    problems = check_sha256sums(d, unlisted_ok=(COMPLETE,))
    if problems:
        raise HeldoutError(f"{d}: its files do not match its {SHA256SUMS}: {problems[0]}")
    try:
        man = read_json_object(d / "manifest.json")
    except ValueError as exc:
        raise HeldoutError(str(exc)) from None
    digests = man.get("digests")
    if man.get("kind") != KIND or not isinstance(digests, dict):
        raise HeldoutError(f"{d / 'manifest.json'}: not a held-out manifest (kind {man.get('kind')!r}, expected {KIND!r})")
    if man.get("fingerprint") != digests_fingerprint(digests):
        raise HeldoutError(f"{d / 'manifest.json'}: its fingerprint does not match its digests")
    return Heldout(d, man)


def excluded(pools: dict[str, list[dict]], held: Heldout, stats) -> int:
    """Drop from each domain's candidate pool every record whose content is held out (rejected, reason
    `heldout`), compared by `comparable_digest` (whatever data.reasoning each was read with); returns how many."""
    hit = held.by_comparable_digest()
    dropped = 0
    for dom, pool in pools.items():
        keep = []
        for item in pool:
            dg = comparable_digest(item["rec"])
            if dg in hit:
                stats.reject(item["key"], {"id": item["rec"]["id"], "source": item["rec"]["source"], "reason": "heldout",
                                            "detail": f"the content of held-out record {hit[dg]!r} ({held.manifest_path})",
                                            "where": item["where"]}, was_ok=True)
                dropped += 1
                continue
            keep.append(item)
        pools[dom] = keep
    return dropped


def open_verified(path: str | Path, train_dir: str | Path | None = None) -> Heldout:
    """The held-out dir at `path`, loaded and verified (`load`) and, given the training dataset
    `train_dir` of what is to be scored on it, checked disjoint from it (`check_disjoint`: a
    TrainingDataError); what `evaluate` opens once per call."""
    held = load(path)
    if train_dir is not None:
        check_disjoint(held, train_dir)
    return held


def check_disjoint(held: Heldout, train_dir: str | Path) -> int:
    """Refuse (TrainingDataError, a HeldoutError: exit 2) when training dataset `train_dir` holds the
    content of a held-out record, naming both ids and both files; returns the number of training
    records checked."""
    import datasets

    train_dir = Path(train_dir)
    try:
        ds = datasets.load_from_disk(str(train_dir))
    except (FileNotFoundError, ValueError) as exc:
        raise TrainingDataError(f"{train_dir}: not a dataset dir ({exc})") from None
    where = ds.cache_files[0]["filename"] if ds.cache_files else str(train_dir)
    hit, seen = held.by_comparable_digest(), set()
    for rid, msg in zip(ds["id"], ds["messages"]):
        tid = trajectory_id(rid)
        if tid in seen:
            continue
        seen.add(tid)
        dg = comparable_digest(json.loads(msg))
        if dg in hit:
            raise TrainingDataError(f"held-out record {hit[dg]!r} ({held.manifest_path}) is training record {tid!r} "
                                    f"({where}): the same content (comparable digest {dg[:12]}), so its loss is not held out")
    return len(seen)


def record_digests(rows: list[dict]) -> dict[str, dict[str, str]]:
    """{domain: {record id: content digest}} of built rows (a record's rows share its messages)."""
    out: dict[str, dict[str, str]] = {}
    for r in rows:
        per = out.setdefault(r["domain"], {})
        tid = trajectory_id(r["id"])
        if tid not in per:
            per[tid] = content_digest(json.loads(r["messages"]))
    return out


def check_domains(domains) -> list[str]:
    doms = [domains] if isinstance(domains, str) else list(domains or [])
    bad = [d for d in doms if d not in DOMAINS]
    if not doms or bad or len(set(doms)) != len(doms):
        raise HeldoutError(f"domains={doms!r}: expected a list of distinct domains from {', '.join(DOMAINS)}")
    return doms
