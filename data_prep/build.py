"""Build one arm: sources -> canonical records -> selected, rendered, tokenized, loss-masked rows.

Python API (launch calls it): `build_arm(data_cfg, arm=, seed=, tokenizer=, out=) -> manifest` and
`cache_key(data_cfg, arm=, seed=, tokenizer=) -> hex`. Output dir: a `datasets.save_to_disk`
dataset plus `manifest.json` and `rejected.jsonl` (one line per dropped record), written through
an atomic temp dir. Every record read is accounted for: kept + rejected + not_selected == read.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from common import datafetch
from common.fingerprint import rows_fingerprint
from common.io import atomic_dir, check_output_dir, sha256_file, sha256_text, write_json, write_jsonl, write_sha256sums
from common.tiny import checked_tokenizer
from data_prep import arms, config, heldout, synthetic, worker
from data_prep.decontam import Decontaminator, bench_files, bench_of, load_questions
from data_prep.errors import DataPrepError
from data_prep.readers import parse_source, read_source
from data_prep.render import ChatRenderer
from data_prep.schema import ROW_SEP, RecordError, quarantine_detail, trajectory_id
from data_prep.stats import RunStats

FORMAT_VERSION = 1
# Bytes of record JSON per token of max_seq_len allowed before rendering (data.max_record_bytes=null):
# a token is ~4 bytes of text on average, so 16 leaves room for JSON escapes and the template;
# under length_policy=truncate a record is meant to be longer than max_seq_len, so 4x that.
RECORD_BYTES_PER_TOKEN = {"drop": 16, "truncate": 64}


class StrictError(DataPrepError):
    """`strict=true` and some records were rejected."""


def load_tokenizer(tokenizer: Any):
    """(tokenizer object, name) from a path, hub id, `tiny`, or an already-loaded tokenizer. A name no tokenizer can
    have is refused before anything loads; a hub id is asked of the hub once, and while it cannot answer (offline,
    unreachable) only its cached copy loads, or one line says so at once."""
    if not isinstance(tokenizer, str):
        return tokenizer, getattr(tokenizer, "name_or_path", type(tokenizer).__name__)
    from common.hub import tokenizer_source

    # a model's name, a malformed id: refused here, offline; a hub id while the hub cannot answer: its cached copy
    # or one line now (huggingface_hub would retry ~25 s per file)
    where, offline = tokenizer_source(tokenizer, "model.tokenizer", DataPrepError)
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(where, trust_remote_code=False, local_files_only=offline), tokenizer
    except Exception as exc:  # OSError, ValueError, tokenizers' own errors: all mean "not a tokenizer"
        raise DataPrepError(f"model.tokenizer={tokenizer}: cannot load a tokenizer from it "
                         f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from exc


def tokenizer_identity(tok, name: str) -> dict:
    ident = {"name": name, "vocab_size": len(tok), "chat_template_sha256": sha256_text(tok.chat_template or "")}
    d = Path(getattr(tok, "name_or_path", "") or "")
    if d.is_dir():
        ident["files"] = tokenizer_files(d)
    return ident


def tokenizer_files(d: Path) -> dict[str, str]:
    """{relative path: sha256} of what transformers reads from a tokenizer dir: its .json (tokenizer, tokenizer_config,
    special tokens, config), .txt (vocab, merges), .jinja (chat templates, additional_chat_templates/ too), .model files."""
    files = sorted(p for p in [*d.iterdir(), *d.glob("additional_chat_templates/*")] if p.is_file())
    return {p.relative_to(d).as_posix(): sha256_file(p) for p in files if p.suffix in (".json", ".txt", ".jinja", ".model")}


def tokenizer_key(tokenizer: Any, loaded: tuple | None = None) -> dict:
    """The tokenizer's part of the cache key. A local dir (`tiny` too) is read, not loaded (no transformers, no torch: a
    dry run's key costs milliseconds): its files (tokenizer_files) and the versions of the libraries that read and render
    them, so a change of anything the tokenizer does changes the key. A hub id or a loaded tokenizer: loaded (`loaded`:
    load_tokenizer's answer, already there), its vocabulary size and chat template (tokenizer_identity)."""
    where = Path(checked_tokenizer(tokenizer, "model.tokenizer", DataPrepError)).expanduser() if isinstance(tokenizer, str) else None
    if where is None or not where.is_dir():
        return tokenizer_identity(*(loaded or load_tokenizer(tokenizer)))
    if not {"tokenizer.json", "tokenizer_config.json"} & {p.name for p in where.iterdir()}:
        raise DataPrepError(f"model.tokenizer={tokenizer}: cannot load a tokenizer from it (no tokenizer.json or tokenizer_config.json in it)")
    from importlib.metadata import version

    return {"name": tokenizer, "files": tokenizer_files(where), "versions": {lib: version(lib) for lib in ("transformers", "tokenizers", "jinja2")}}


def _code_hash() -> str:
    """Hash of data_prep's own sources: a code change invalidates cached datasets."""
    h = hashlib.sha256()
    root = Path(__file__).parent
    for p in sorted(root.rglob("*.py")):
        h.update(p.relative_to(root).as_posix().encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def cache_key(data_cfg: Any, *, arm: str, seed: int, tokenizer: Any) -> str:
    """Hex digest over everything that changes the output: sources (local files by sha256),
    tokenizer identity + chat template hash, arm, seed, every output-relevant data key and
    data_prep's own code."""
    return _cache_key(config.resolve(data_cfg), arm, seed, tokenizer)


def _cache_key(cfg: dict, arm: str, seed: int, tokenizer: Any, loaded: tuple | None = None) -> str:
    wanted = arms.quotas(arm, cfg["n"])
    srcs: Any = {d: [parse_source(s).identity() for s in cfg["sources"][d]] for d in wanted}
    if cfg["kind"] == "synthetic":
        srcs["synthetic"] = cfg["synthetic"]
    payload = {
        "format": FORMAT_VERSION, "code": _code_hash(), "arm": arm, "seed": seed,
        "tokenizer": tokenizer_key(tokenizer, loaded),
        "data": {k: v for k, v in cfg.items() if k not in config.NON_OUTPUT_KEYS and k not in ("sources", "heldout")},
        # the held-out set by its content (a moved dir is the same set)
        "heldout": heldout.load(cfg["heldout"], "data.heldout").fingerprint if cfg["heldout"] else None,
        "sources": srcs,
        # named sets by their pinned digest: planning (a dry run's fingerprint) never downloads
        "decontam": [{"path": p, "sha256": sha256_file(p)} for p in decontam_paths(cfg, sets=False)]
        + [{"name": n, "sha256": datafetch.digest(n)} for n in cfg["decontam_sets"]],
    }
    return sha256_text(json.dumps(payload, sort_keys=True, default=str))


def _synthetic_sources(cfg: dict, arm: str, seed: int, raw_dir: Path) -> dict[str, list[str]]:
    scfg = synthetic.config_from(cfg["synthetic"])
    wanted = arms.quotas(arm, cfg["n"])
    # A margin over the quota so a few length rejections don't starve the arm.
    code_n = cfg["synthetic"].get("code_n", wanted.get("code", 0) + (wanted.get("code", 0) // 10 + 2 if "code" in wanted else 0))
    search_n = cfg["synthetic"].get("search_n", wanted.get("search", 0) + (wanted.get("search", 0) // 10 + 2 if "search" in wanted else 0))
    return synthetic.write_sources(raw_dir, seed=seed, code_n=code_n if "code" in wanted else 0,
                                   search_n=search_n if "search" in wanted else 0, cfg=scfg)


def build_arm(data_cfg: Any, *, arm: str, seed: int, tokenizer: Any, out: str | Path, progress: bool = True,
              num_proc: int | None = None, overwrite: bool = False, final: str | Path | None = None) -> dict:
    """Build the arm's dataset directory at `out`; return the manifest.

    `num_proc`: render/tokenize worker processes (default: the CPU count, at most 8; small builds
    run in-process). The output does not depend on it. An existing `out` is replaced only when it
    is a data-prep output (has manifest.json) and `overwrite` is true: it is renamed aside
    (`common.io.replace_aside`), never deleted; a path holding any input is refused. `final`: where
    the caller then renames `out` to (launch's cache builds in a temp dir of its own), so the
    manifest names the generated source files where they will lie."""
    cfg = config.resolve(data_cfg)
    wanted = arms.quotas(arm, cfg["n"])
    tok, tok_name = load_tokenizer(tokenizer)
    renderer = ChatRenderer(tok, **renderer_kwargs(cfg))
    key = _cache_key(cfg, arm, seed, tokenizer, (tok, tok_name))
    out = Path(out)
    check_output_dir(out, overwrite=overwrite, marker="manifest.json", sources=_inputs(cfg, tok))
    stats = RunStats()
    with atomic_dir(out, existing="aside") as tmp:
        specs = {d: list(cfg["sources"][d]) for d in wanted}
        if cfg["kind"] == "synthetic":  # generated sources, plus any listed ones (e.g. envs exports)
            for d, generated in _synthetic_sources(cfg, arm, seed, tmp / "raw").items():
                specs.setdefault(d, [])[:0] = generated
        missing = [d for d in wanted if not specs.get(d)]
        if missing:
            raise arms.ArmError(f"arm {arm!r} needs data.sources.{'/'.join(missing)} (or data=synthetic)")
        for dom, quota in wanted.items():   # the ~SHAREs checked before any record is read
            srcs = [parse_source(sp) for sp in specs[dom]]
            if cfg["kind"] == "synthetic" and any(s.share is not None for s in srcs):
                raise arms.ArmError(f"data.sources.{dom}: ~SHAREs cannot be combined with data=synthetic, whose generated sources have none")
            arms.source_quotas(dom, quota, [s.share for s in srcs], specs[dom], [s.reads() for s in srcs])
        pools = _read_pools(cfg, specs, wanted, stats, tmp, Path(final) if final else out, progress)
        decon = _decontaminate(cfg, pools, stats)
        held = heldout.load(cfg["heldout"], "data.heldout") if cfg["heldout"] else None
        held_out = heldout.excluded(pools, held, stats) if held else 0
        kept_rows: dict[str, list[dict]] = {}
        kept = {}
        n_candidates = sum(len(p) for p in pools.values())
        procs = (num_proc or min(os.cpu_count() or 1, 8)) if n_candidates > 4 * worker.CHUNK else 1
        processor = worker.Processor(tok, renderer_kwargs(cfg), procs)
        try:
            for dom, quota in wanted.items():
                parts = arms.source_quotas(dom, quota, [parse_source(sp).share for sp in specs[dom]], specs[dom])
                if parts is None:  # pooled: one seeded order over every source's records
                    kept_rows[dom], kept[dom] = _select(pools[dom], quota, dom, seed, cfg, processor, stats, progress)
                    continue
                rows_d, kept[dom] = [], 0
                for i, (sp, part) in enumerate(zip(specs[dom], parts)):  # each ~SHARE source: its own part
                    sub = [it for it in pools[dom] if it["spec"] == sp]
                    r, k = _select(sub, part, f"{dom}:{i}", seed, cfg, processor, stats, progress)
                    arms.check_counts(arm, {f"{dom} from {sp}": part}, {f"{dom} from {sp}": k}, cfg["allow_fewer"])
                    rows_d += r
                    kept[dom] += k
                kept_rows[dom] = arms.shuffle_records(rows_d, f"{seed}-{dom}-shares")
        finally:
            processor.close()
        arms.check_counts(arm, wanted, kept, cfg["allow_fewer"])
        rows = arms.interleave(arm, kept_rows, seed)
        stats.check_totals()
        check_strict(cfg, stats)
        fingerprint = _fingerprint(rows)
        summary = stats.summary(rows)
        ds = _to_dataset(rows)
        del rows
        ds.save_to_disk(str(tmp))
        write_jsonl(tmp / "rejected.jsonl", stats.rejections)
        manifest = {
            "arm": arm, "seed": seed, "n": cfg["n"], "config": cfg,
            "tokenizer": tokenizer_identity(tok, tok_name),
            "template": {"generation_prompt": renderer.info.gen_prompt, "assistant_header": renderer.info.header,
                         "end_of_turn": renderer.info.end_marker, "chat_template_sha256": renderer.info.template_hash},
            **summary,
            "decontam": decon,
            "heldout": None if held is None else {"dir": os.path.abspath(held.dir), "fingerprint": held.fingerprint, "excluded": held_out},
            "fingerprint": fingerprint,
            "cache_key": key,
        }
        write_json(tmp / "manifest.json", manifest)
    return manifest


def _read_pools(cfg: dict, specs: dict, wanted, stats: RunStats, tmp: Path, out: Path, progress: bool) -> dict[str, list[dict]]:
    """Each wanted domain's candidate records, screened (`_screen`), in read order."""
    from tqdm import tqdm

    pools: dict[str, list[dict]] = {}
    first_seen: dict[str, str] = {}  # record id -> where it was first read, across every source
    first_content: dict[str, str | None] = {}  # record id -> the content digest of the source it was first read from
    max_bytes = cfg["max_record_bytes"] or RECORD_BYTES_PER_TOKEN[cfg["length_policy"]] * cfg["max_seq_len"]
    listing: dict[tuple, list[str]] = {}  # what a source reads -> the wanted domains listing it, in order
    for dom in wanted:
        for spec in specs[dom]:
            listing.setdefault(parse_source(spec).reads(), []).append(dom)
    for dom in wanted:
        pools[dom] = []
        for spec in specs[dom]:
            src = parse_source(spec)
            key = (dom, spec)
            stats.add_source(key, src, out_dir=tmp, final_dir=out)
            doms = listing[src.reads()]
            content = _files_digest(stats.sources[key].identity)
            for o in tqdm(read_source(src, reasoning=cfg["reasoning"]), desc=f"read {src.format}", disable=not progress, leave=False):
                # a source listed under several domains: each record is counted in its own domain's pass, an unreadable
                # row or a record of none of them in the first listing's
                if (o.record["domain"] if o.record is not None and o.record["domain"] in doms else doms[0]) != dom:
                    continue
                if o.record is not None and o.positional and first_content.get(o.id, content) != content:
                    # named by its position, as a row of another source's same-named file is: told apart by content
                    o.id = o.record["id"] = f"{o.id}@{content[:12]}"
                problem = o.record and _screen(o.record, dom, max_bytes, first_seen)
                if o.record is None:
                    stats.reject(key, o.rejection())
                elif problem:
                    stats.reject(key, {**o.rejection(), "reason": problem[0], "detail": problem[1]})
                else:
                    first_seen[o.record["id"]] = o.where
                    first_content[o.record["id"]] = content
                    stats.read_ok(key)
                    pools[dom].append({"spec": spec, "key": key, "rec": o.record, "where": o.where})
    return pools


def _files_digest(identity: dict) -> str | None:
    """A local source's content (its files' sha256s, wherever they lie), None for a hub source (whose positions
    name its hub id)."""
    files = identity.get("files")
    return sha256_text(json.dumps([f["sha256"] for f in files])) if files is not None else None


def build_heldout(data_cfg: Any, *, n: int, domains, seed: int, tokenizer: Any, out: str | Path, progress: bool = True,
                  num_proc: int | None = None, overwrite: bool = False) -> dict:
    """Write the held-out split at `out` (data_prep.heldout): per domain the first `n` records of a
    seeded order (`seed`; data=synthetic generates its sources with it) that render as training
    would; return its manifest."""
    cfg = config.resolve(data_cfg)
    if cfg["heldout"]:
        raise DataPrepError("heldout=DIR names a held-out set to exclude from an arm; a held-out split is built without it")
    wanted = {d: int(n) for d in heldout.check_domains(domains)}
    tok, tok_name = load_tokenizer(tokenizer)
    renderer = ChatRenderer(tok, **renderer_kwargs(cfg))
    out = Path(out)
    check_output_dir(out, overwrite=overwrite, marker="manifest.json", sources=_inputs(cfg, tok))
    stats = RunStats()
    with atomic_dir(out, existing="aside") as tmp:
        specs = {d: list(cfg["sources"][d]) for d in wanted}
        if cfg["kind"] == "synthetic":
            scfg = synthetic.config_from(cfg["synthetic"])
            margin = {d: q + q // 10 + 2 for d, q in wanted.items()}
            generated = synthetic.write_sources(tmp / "raw", seed=seed, code_n=margin.get("code", 0),
                                                search_n=margin.get("search", 0), cfg=scfg)
            for d in wanted:
                specs[d][:0] = generated[d]
        missing = [d for d in wanted if not specs.get(d)]
        if missing:
            raise arms.ArmError(f"the held-out split needs data.sources.{'/'.join(missing)} (or data=synthetic)")
        pools = _read_pools(cfg, specs, wanted, stats, tmp, out, progress)
        decon = _decontaminate(cfg, pools, stats)
        processor = worker.Processor(tok, renderer_kwargs(cfg), num_proc or 1)
        by_dom, kept = {}, {}
        try:
            for dom, quota in wanted.items():
                by_dom[dom], kept[dom] = _select(pools[dom], quota, f"heldout-{dom}", seed, cfg, processor, stats, progress)
        finally:
            processor.close()
        arms.check_counts("heldout", wanted, kept, cfg["allow_fewer"])
        rows = [r for dom in wanted for r in by_dom[dom]]
        stats.check_totals()
        check_strict(cfg, stats)
        digests = heldout.record_digests(rows)
        summary = stats.summary(rows)
        fingerprint = _fingerprint(rows)
        _to_dataset(rows).save_to_disk(str(tmp))
        write_jsonl(tmp / "rejected.jsonl", stats.rejections)
        manifest = {
            "kind": heldout.KIND, "n": int(n), "domains": list(wanted), "seed": int(seed), "config": cfg,
            "tokenizer": tokenizer_identity(tok, tok_name),
            "template": {"generation_prompt": renderer.info.gen_prompt, "assistant_header": renderer.info.header,
                         "end_of_turn": renderer.info.end_marker, "chat_template_sha256": renderer.info.template_hash},
            **summary, "render_settings": renderer_kwargs(cfg), "decontam": decon,
            "digests": digests, "fingerprint": heldout.digests_fingerprint(digests), "rows_fingerprint": fingerprint,
        }
        write_json(tmp / "manifest.json", manifest)
        write_sha256sums(tmp)
        (tmp / heldout.COMPLETE).write_text("", encoding="utf-8")
    return manifest


def check_strict(cfg: dict, stats: RunStats) -> None:
    """StrictError (exit 1, nothing written) when `strict=true` and any record was rejected, naming the reasons."""
    if cfg["strict"] and stats.rejections:
        reasons = Counter(r["reason"] for r in stats.rejections)
        examples = "; ".join(f"{r['id']}: {r['reason']} {r['detail'][:80]}" for r in stats.rejections[:5])
        raise StrictError(f"strict=true and {len(stats.rejections)} record(s) were rejected: {dict(reasons)}. e.g. {examples}")


def renderer_kwargs(cfg: dict) -> dict:
    """The ChatRenderer settings of a resolved data config."""
    return {"history_reasoning": cfg["history_reasoning"], "epilogue": cfg["epilogue"], "thoughts": cfg["thoughts"]}


def decontam_paths(cfg: dict, *, sets: bool = True) -> list[str]:
    """The evaluation files to decontaminate against: `decontam` (each a file), every bench file under
    `decontam_bench_root` (missing benches: ConfigError naming the key) and, with `sets`, the cached
    files of `decontam_sets` (fetched first when not cached)."""
    paths = list(cfg["decontam"])
    for p in (Path(p) for p in paths if not Path(p).is_file()):
        raise DataPrepError(f"data.decontam: {p}: {'a directory, not a file' if p.is_dir() else 'no such file'}")
    if cfg["decontam_bench_root"]:
        paths += [p for p in bench_files(cfg["decontam_bench_root"]) if p not in paths]
    if sets:
        paths += [p for p in (str(datafetch.path(n)) for n in cfg["decontam_sets"]) if p not in paths]
    return paths


def _screen(rec: dict, dom: str, max_bytes: int, first_seen: dict[str, str]) -> tuple[str, str] | None:
    """(reason, detail) when a parsed record must not reach rendering, else None: listed under
    the wrong domain, an id that reads as a row id (`<x>#row<k>`: its rows would be taken for
    record x's), an id already read from any source, not encodable as UTF-8 (a lone surrogate),
    or larger than `max_bytes` as JSON."""
    if rec["domain"] != dom:
        return "wrong_domain", f"a {rec['domain']} record listed under sources.{dom}"
    if trajectory_id(rec["id"]) != rec["id"]:
        return "row_id", (f"id {rec['id']!r} ends in {ROW_SEP}<digits>, which names row k of record {trajectory_id(rec['id'])!r} "
                          "in a built dataset (the trainer and the held-out digests would merge it with its neighbours)")
    if rec["id"] in first_seen:
        return "duplicate_id", f"id {rec['id']!r} already read at {first_seen[rec['id']]} (the first is kept)"
    try:
        size = len(worker.record_json(rec).encode("utf-8"))
    except UnicodeEncodeError as exc:
        return "bad_unicode", f"{exc.reason} at character {exc.start} of the record's JSON"
    except (RecursionError, ValueError) as exc:
        return "bad_row", quarantine_detail(exc)
    if size > max_bytes:
        return "too_large", f"{size} bytes of JSON > max_record_bytes {max_bytes}"
    return None


def _inputs(cfg: dict, tok) -> list[Path]:
    """Every local path the build reads: an output path must not be or contain one of them."""
    paths = [Path(parse_source(spec).location) for specs in cfg["sources"].values() for spec in specs]
    paths += [Path(p) for p in decontam_paths(cfg)] + ([Path(cfg["heldout"])] if cfg["heldout"] else [])
    tok_dir = Path(getattr(tok, "name_or_path", "") or "")
    return [p for p in paths + [tok_dir] if str(p) not in ("", ".") and p.exists()]


def _decontaminate(cfg: dict, pools: dict[str, list[dict]], stats: "RunStats") -> dict:
    paths = decontam_paths(cfg)
    if not paths:
        return {"bench_root": None, "sets": [], "files": [], "ngram": cfg["decontam_ngram"], "overlapping": {}, "dropped": 0, "by_bench": {}}
    questions, files = load_questions(paths)
    dec = Decontaminator(questions, n=cfg["decontam_ngram"])
    by_bench: dict[str, dict] = {}
    for qid, _ in questions:
        by_bench.setdefault(bench_of(qid), {"questions": 0, "records": 0, "dropped": 0})["questions"] += 1
    overlapping, dropped = {}, 0
    for dom, pool in pools.items():
        keep = []
        for item in pool:
            hits = dec.matches(item["rec"]["task"] or "")
            if hits:
                overlapping[item["rec"]["id"]] = hits
                for b in sorted({bench_of(h) for h in hits}):
                    by_bench[b]["records"] += 1
                    by_bench[b]["dropped"] += int(cfg["decontam_drop"])
                if cfg["decontam_drop"]:
                    stats.reject(item["key"], {"id": item["rec"]["id"], "source": item["rec"]["source"], "reason": "decontaminated",
                                                "detail": f"overlaps {', '.join(hits[:5])}", "where": item["where"]}, was_ok=True)
                    dropped += 1
                    continue
            keep.append(item)
        pools[dom] = keep
    return {"bench_root": cfg["decontam_bench_root"], "sets": cfg["decontam_sets"], "files": files, "ngram": cfg["decontam_ngram"], "questions": len(questions),
            "overlapping": overlapping, "dropped": dropped, "by_bench": by_bench}


def _select(pool, quota, dom, seed, cfg, processor, stats, progress):
    """Take candidates in seeded order until `quota` records are kept; rows of kept records."""
    from tqdm import tqdm

    order = arms.candidate_order(len(pool), seed, dom)
    chunks = [order[i:i + worker.CHUNK] for i in range(0, len(order), worker.CHUNK)]
    rows: list[dict] = []
    n_kept, done = 0, 0
    bar = tqdm(total=min(quota, len(pool)), desc=f"render+tokenize {dom}", disable=not progress, leave=False)
    if quota > 0:
        for ci, results in enumerate(processor.map([pool[j]["rec"] for j in ch] for ch in chunks)):
            done = ci + 1
            for j, res in zip(chunks[ci], results):
                item = pool[j]
                if n_kept >= quota:
                    stats.not_selected(item["key"])
                elif res[0] == "err":
                    stats.reject(item["key"], _rej(item, res[1], res[2]), was_ok=True)
                else:
                    try:
                        messages = worker.record_json(res[1])  # once per record, however many rows it makes
                        out_rows = [_finish_row(res[1], enc, cfg, messages) for enc in res[2]]
                    except RecordError as exc:
                        stats.reject(item["key"], _rej(item, exc.reason, exc.detail), was_ok=True)
                        continue
                    stats.kept(item["key"])
                    rows.extend(out_rows)
                    n_kept += 1
                    bar.update(1)
            if n_kept >= quota:
                break
    for ch in chunks[done:]:
        for j in ch:
            stats.not_selected(pool[j]["key"])
    bar.close()
    return rows, n_kept


def _rej(item: dict, reason: str, detail: str) -> dict:
    rec = item["rec"]
    return {"id": rec["id"], "source": rec["source"], "reason": reason, "detail": detail, "where": item["where"]}


def _finish_row(rec: dict, enc: "worker.Encoded", cfg: dict, messages: str) -> dict:
    ids, labels = enc.input_ids, enc.labels
    truncated = len(ids) > cfg["max_seq_len"]
    # the epilogue (in the record's last row): trained whole, cut, or not at all; the row's JSON carries what it trains
    epi = rec.get("epilogue", "")
    kept = max((c for k, c in enc.epilogue_chars if k < cfg["max_seq_len"]), default=0)
    if kept < len(epi):
        messages = worker.record_json({**{k: v for k, v in rec.items() if k != "epilogue"}, **({"epilogue": epi[:kept]} if kept else {})})
    if cfg["length_policy"] == "drop" and len(ids) + enc.withheld > cfg["max_seq_len"]:
        extra = f" (+{enc.withheld} of the epilogue that epilogue=false leaves out)" if enc.withheld else ""
        raise RecordError("too_long", f"{len(ids)} tokens{extra} > max_seq_len {cfg['max_seq_len']}")
    if truncated:
        ids, labels = ids[: cfg["max_seq_len"]], labels[: cfg["max_seq_len"]]
    trainable = labels != -100
    n_train = int(trainable.sum())
    if n_train == 0:
        raise RecordError("no_trainable_tokens", "no assistant token left in the row")
    n_inexact = int((trainable & enc.inexact[: len(labels)]).sum()) if enc.inexact is not None else 0
    checks = _trained_checks(enc, cfg["max_seq_len"]) if truncated else enc.checks
    return {"id": enc.id, "source": rec["source"], "domain": rec["domain"], "input_ids": ids, "labels": labels,
            "num_tokens": len(ids), "num_trainable": n_train, "messages": messages,
            "_checks": checks, "_inexact_tokens": n_inexact, "_truncated": truncated, "_retokenized": enc.retokenized,
            "_extra_row": enc.id != rec["id"], "_epilogue": bool(epi) and kept == len(epi)}


def _trained_checks(enc: "worker.Encoded", cut: int) -> dict:
    """The row's turn checks counting only the turns a cut at `cut` tokens leaves trained (each turn
    is one run of trainable tokens; when the runs are not the turns, the checks as they were)."""
    t = enc.labels != -100
    starts = np.flatnonzero(t & ~np.concatenate([[False], t[:-1]]))
    if len(starts) != sum(enc.checks.values()):
        return enc.checks
    kept = starts[starts < cut]
    n_as = int(enc.inexact[kept].sum()) if enc.inexact is not None else 0
    return {k: v for k, v in (("exact", len(kept) - n_as), ("as_rendered", n_as)) if v}


def _features():
    import datasets

    return datasets.Features({
        "id": datasets.Value("string"), "source": datasets.Value("string"), "domain": datasets.Value("string"),
        "input_ids": datasets.Sequence(datasets.Value("int32")), "labels": datasets.Sequence(datasets.Value("int32")),
        "num_tokens": datasets.Value("int32"), "num_trainable": datasets.Value("int32"), "messages": datasets.Value("string"),
    })


def _to_dataset(rows: list[dict]):
    """Arrow table built from the int32 arrays directly (no per-token Python objects). Each
    row's arrays and JSON are released as soon as they are copied into the table."""
    import datasets
    import pyarrow as pa
    from datasets.table import InMemoryTable

    def lists(key):
        lens = np.asarray([len(r[key]) for r in rows], dtype=np.int64)
        if lens.sum() >= 2**31:
            raise ValueError(f"{int(lens.sum())} tokens in one arm exceed Arrow's 32-bit list offsets")
        offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        values = np.concatenate([r[key] for r in rows]).astype(np.int32, copy=False) if rows else np.zeros(0, np.int32)
        for r in rows:
            r[key] = None
        return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values, pa.int32()))

    scalars = {
        "id": pa.array([r["id"] for r in rows], pa.string()),
        "source": pa.array([r["source"] for r in rows], pa.string()),
        "domain": pa.array([r["domain"] for r in rows], pa.string()),
        "num_tokens": pa.array([r["num_tokens"] for r in rows], pa.int32()),
        "num_trainable": pa.array([r["num_trainable"] for r in rows], pa.int32()),
    }
    input_ids, labels = lists("input_ids"), lists("labels")
    messages = pa.array([r["messages"] for r in rows], pa.string())
    for r in rows:
        r["messages"] = None
    features = _features()
    table = pa.table({"id": scalars["id"], "source": scalars["source"], "domain": scalars["domain"],
                      "input_ids": input_ids, "labels": labels, "num_tokens": scalars["num_tokens"],
                      "num_trainable": scalars["num_trainable"], "messages": messages}, schema=features.arrow_schema)
    return datasets.Dataset(InMemoryTable(table), info=datasets.DatasetInfo(features=features))


def _fingerprint(rows: list[dict]) -> str:
    """The dataset's content fingerprint (common.fingerprint.rows_fingerprint: a dir without a manifest is known by it too)."""
    return rows_fingerprint((r["id"], r["input_ids"], r["labels"], r["messages"]) for r in rows)
