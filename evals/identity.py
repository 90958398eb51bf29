"""Evaluation identity, per bench: what produced a bench's rows in an out dir. Its parts, where it is recorded and when
another one is refused: docs/concepts.md, "Run identity" (the roles of evals.config.KEYS decide the keys)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from common import datafetch, fingerprint
from common.fields import IDENTITY, plain
from common.io import dir_identity, sha256_file, sha256_text

# What evaluate makes of a generation (answer rules, turn rules, retrieval): bumped when a change alters a config's rows, so an
# out dir scored under old rules is refused (2: answer markup, no answer in reasoning, BM25 matches only); a kind's own: its `semantics`
EVAL_SEMANTICS = 2


def checkpoint_identity(ckpt: str) -> dict[str, Any]:
    """Content digest of a model: sha256 of its `SHA256SUMS` text (computed the same way for a
    local dir without one), or a hub id with the commit it is loaded at (the hub's main, else the cached copy's)."""
    path = Path(ckpt)
    if path.is_dir():
        return dir_identity(path)
    if path.is_absolute() or str(ckpt).startswith((".", "~")):   # a local path with no model behind it
        return {"kind": "missing", "path": str(ckpt)}
    from common.hub import hub_revision   # the commit the loads of this process read (None: unknown)

    return {"kind": "hub", "repo": str(ckpt), "revision": hub_revision(str(ckpt))}


def retrieval_identity(conf: dict) -> dict[str, Any]:
    """What a retrieval bench's identity adds: `corpus`, by file name and size (hashing 14 GB of wiki-18 on every call is
    too slow; not a content digest), a fetched one by its name and pinned digest; with retriever=e5, `retrieval`: the
    encoder's and the index's content identity (or that the index is built from the corpus) and the encoding settings
    (evals.dense). The other retrievers add nothing more (their identity is the corpus, or a URL)."""
    corpus = conf.get("corpus")
    parts = {"corpus": None if not corpus else {"name": corpus, "sha256": datafetch.digest(corpus)} if datafetch.is_name(corpus)
             else {"name": Path(corpus).name, "size": Path(corpus).stat().st_size if Path(corpus).is_file() else None}}
    if conf.get("retriever") != "e5":
        return parts
    from evals.dense import MAX_LENGTH, PASSAGE_PREFIX, QUERY_PREFIX, encoder_dtype

    index, encoder = conf.get("index"), str(conf.get("encoder"))
    # a fetched model dir: its SHA256SUMS digest, as checkpoint_identity of that dir
    enc = {"kind": "sha256sums", "digest": datafetch.digest(encoder)} if datafetch.is_name(encoder) else checkpoint_identity(encoder)
    if index is None:
        idx = {"built_from": "corpus"}
    elif datafetch.is_name(index):   # pinned, or measured when pre-filled; never read here (planning fetches nothing)
        idx = {"name": Path(datafetch.entry(index).rel).name, "sha256": datafetch.digest(index)}
    else:
        idx = {"name": Path(index).name, "sha256": fingerprint.file_digest(index) if Path(index).is_file() else None}
    return {**parts, "retrieval": {"encoder": enc, "index": idx, "encoder_dtype": encoder_dtype(str(conf.get("encoder_device") or "cpu")),
                                   "max_length": MAX_LENGTH, "prefixes": [QUERY_PREFIX, PASSAGE_PREFIX]}}


def source_digest(source: str) -> str:
    """sha256 of a local bench file; the source string itself for a hub dataset or an environment."""
    p = Path(source)
    return sha256_file(p) if p.is_file() else sha256_text(source)


def bench_identity(bench: str, cfg, ckpt_id: dict, *, n, seed: int, source: str,
                   item_set: str | None = None) -> dict[str, Any]:
    """`{"fingerprint", "keys", "ckpt_path"}` for one bench (common.fingerprint's record shape, so
    `fingerprint_diff` names every differing key); a named item set adds its name and pinned source."""
    from evals.backends import engine_settings
    from evals.config import KEYS
    from evals.registry import key_prefixes, kind_of, uses_retriever   # QA benches in context mode open (item/given search no corpus)

    not_as_is = {k for k, f in KEYS.items() if IDENTITY not in f.roles}
    conf = dict(plain(cfg))
    body = {
        "checkpoint": ckpt_id, "eval_semantics": f"{EVAL_SEMANTICS}.{kind_of(bench).semantics}" if kind_of(bench).semantics else EVAL_SEMANTICS,
        # the engine settings as this host resolves them (dtype=auto is fp32 or bf16 by host and backend)
        "evaluate": {**{k: v for k, v in conf.items() if k not in not_as_is
                        and not any(k.startswith(p) for b, p in key_prefixes().items() if b != bench)},
                     **engine_settings(conf)},
        **(retrieval_identity(conf) if uses_retriever(bench) else {"corpus": None}),
        # a named set's file digest is its pinned one (the file is checked against it when fetched), or
        # for an unpinned hub set the one measured when the user pre-filled it
        "bench": {"name": bench, "n": n, "seed": int(seed), "source_digest": datafetch.digest(item_set)
                  if datafetch.is_name(item_set) else source_digest(source)},
    }
    if item_set is not None:
        body["bench"]["set"] = {"name": item_set, "source": datafetch.entry(item_set).source() if datafetch.is_name(item_set) else source}
    if (sampled := kind_of(bench).sampled) is not None and sampled(conf):
        body["sampler"] = conf.get("backend")  # the backends' samplers differ: sampled rows are the backend's
    return {**fingerprint.identity(body, exclude={}), "ckpt_path": str(conf.get("ckpt"))}


def of_another_checkpoint(ident: dict | None, ckpt_id: dict) -> bool:
    """Whether bench identity `ident` (as meta.json records it) was evaluated on another checkpoint than `ckpt_id`
    (checkpoint_identity's); False when it records none (an out dir from before evaluation identity: unknown)."""
    keys = ident.get("keys") if isinstance(ident, dict) else None
    if not isinstance(keys, dict):
        return False
    held = {k.removeprefix("checkpoint."): v for k, v in keys.items() if k.startswith("checkpoint.")}
    return held != fingerprint.identity_keys(ckpt_id, exclude={})
