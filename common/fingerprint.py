"""Run identity: one digest of every config key that changes a run's result.

A run directory belongs to one fingerprint. `launch`, the SFT trainer and the RL stage compare the
requested config with the run directory's record and refuse (with `fingerprint_diff`) instead of
silently resuming or reporting a run made under another configuration.

What the fingerprint covers: every leaf key of the resolved config (the recipe-named keys of
`config.yaml`) except the excluded ones, the keys whose field has no IDENTITY role (the trainer's
`EXCLUDED_KEYS`, sft.config / rl.config, common.fields.excluded; each key added since run dirs were first
written is left out at its value "as before", below):
- where things live (the PATH keys). The data enters through the dataset manifest's *content*
  fingerprint and a GRPO run's prompts file and corpus through their sha256 (`file_digest`; passed
  as extras), so moving a runs tree or an input file, or a data_prep code edit that leaves the
  dataset identical, does not make a run "different", and a changed file does;
- keys that may legitimately change between segments of one run (logging, the
  state cadence, launcher / Slurm settings, `nproc`: the data order and the loss normalization do
  not depend on the number of ranks), and what a run is described as (the model card's licence).
Extras the caller knows (the data content fingerprint, the trainer's semantics version) are part
of the digest too. The API is config-agnostic: each stage passes its own `exclude`.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

# Run dirs written before identity was recorded were trained under this trainer semantics version.
LEGACY_TRAINER_SEMANTICS = 1


# `exclude` maps a key, or a section, to the value at which the identity leaves it out: ALWAYS (any value) for
# what changes no result; a key added after run dirs were first written, at its value meaning "as before" (so a
# run dir written before the key existed keeps its fingerprint and resumes; any other value is a real change).
ALWAYS = object()


def _left_out(key: str, value: Any, exclude: Mapping[str, Any]) -> bool:
    parts = key.split(".")
    if any(exclude.get(".".join(parts[:i])) is ALWAYS for i in range(1, len(parts) + 1)):
        return True
    return key in exclude and _same(value, exclude[key])


def _flatten(obj: Mapping, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in obj.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and len(v) > 0:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = dict(v) if isinstance(v, Mapping) else (list(v) if isinstance(v, (list, tuple)) else v)
    return out


def _plain(cfg) -> Mapping:
    """A plain dict from a dict or an omegaconf config (resolved)."""
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(cfg, DictConfig):
            return OmegaConf.to_container(cfg, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf is a core dependency
        pass
    return cfg


def identity_keys(cfg, exclude: Mapping[str, Any]) -> dict[str, Any]:
    """`{dotted.key: value}` of every leaf of `cfg` that `exclude` does not leave out, sorted by key."""
    flat = _flatten(_plain(cfg))
    return {k: flat[k] for k in sorted(flat) if not _left_out(k, flat[k], exclude)}


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def identity(cfg, exclude: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    """The record a run dir keeps: `{"fingerprint", "keys", **extra}` (keys: what `fingerprint_diff`
    compares, so a refusal can name every key that differs)."""
    keys = identity_keys(cfg, exclude)
    body = {"keys": keys, **{k: extra[k] for k in sorted(extra)}}
    digest = hashlib.sha256(canonical_json(body).encode("utf-8")).hexdigest()
    return {"fingerprint": digest, **body}


def _by_value(v: Any) -> Any:
    """`v` with every int (not bool) as a float: `lr=1` and `lr: 1.0` are one setting."""
    if isinstance(v, bool) or not isinstance(v, (int, float, list, tuple, Mapping)):
        return v
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, Mapping):
        return {k: _by_value(x) for k, x in v.items()}
    return [_by_value(x) for x in v]


def _same(a: Any, b: Any) -> bool:
    """Equal by value (`_by_value`)."""
    return canonical_json(_by_value(a)) == canonical_json(_by_value(b))


def fingerprint_diff(old: Mapping, new: Mapping) -> list[str]:
    """`key: old -> new` for every difference between two identity records (or two `keys` maps).

    Values compare by value, so an int and the equal float (`lr=1` on the command line, `1.0` in a
    recipe) are no difference. Extras compare only where both records have them (a record made
    before the data was known has no data fingerprint yet), except a semantics version (`*_semantics`):
    a record without one was made before that version was recorded, and differs.
    """
    def split(rec: Mapping) -> tuple[dict, dict]:
        if "keys" in rec and isinstance(rec["keys"], Mapping):
            return dict(rec["keys"]), {k: v for k, v in rec.items() if k not in ("keys", "fingerprint")}
        return dict(rec), {}

    (ok, ox), (nk, nx) = split(old), split(new)
    absent = "<absent>"
    lines = [f"{k}: {ok.get(k, absent)!r} -> {nk.get(k, absent)!r}"
             for k in sorted(set(ok) | set(nk)) if not _same(ok.get(k, absent), nk.get(k, absent))]
    lines += [f"{k}: {ox.get(k, absent)!r} -> {nx.get(k, absent)!r}" for k in sorted(set(ox) | set(nx))
              if (k in ox and k in nx or k.endswith("_semantics")) and ox.get(k, absent) != nx.get(k, absent)]
    return lines


def identity_error(what: str, diff: list[str], error: type[Exception]) -> Exception:
    """A trainer's refusal of a state or finished run of another identity (sft.train, rl.train): `what`,
    the differences (run -> this config, `fingerprint_diff`) and the ways out, as the trainer's own error type."""
    return error(f"{what} (run -> this config):\n  " + "\n  ".join(diff) +
                 "\nRestore the config, or start over with resume=never (the old outputs are renamed aside), "
                 "or train it in another run_dir.")


# ---------------------------------------------------------------- input files by content
def digest_cache_dir() -> Path:
    """Where file digests are cached: `$XDG_CACHE_HOME/dtsft/digests` (default ~/.cache/dtsft/digests)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dtsft" / "digests"


def file_digest(path: str | Path) -> str:
    """sha256 of a file's content, computed once per (real path, size, mtime, inode, ctime) and cached on
    disk (`digest_cache_dir`): a 14 GB wiki-18 corpus is hashed once, and any edit is hashed again — one
    that keeps the size and resets the mtime (`touch -d`) still moves the ctime, and a file replaced by
    another has another inode. An unwritable cache only costs the hashing."""
    from common.io import sha256_file

    real = Path(path).expanduser().resolve()
    st = real.stat()
    key = canonical_json({"path": str(real), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino,
                          "ctime_ns": st.st_ctime_ns})
    entry = digest_cache_dir() / f"{hashlib.sha256(key.encode('utf-8')).hexdigest()[:32]}.json"
    try:
        cached = json.loads(entry.read_text(encoding="utf-8"))
        if cached.get("key") == key and isinstance(cached.get("sha256"), str):
            return cached["sha256"]
    except (OSError, ValueError):
        pass
    digest = sha256_file(real)
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = entry.with_name(f"{entry.name}.tmp-{os.getpid()}")
        tmp.write_text(canonical_json({"key": key, "sha256": digest}), encoding="utf-8")
        tmp.replace(entry)
    except OSError:
        pass
    return digest


# ---------------------------------------------------------------- a dataset dir by its rows
def rows_fingerprint(rows: Iterable[tuple[str, Any, Any, Any]]) -> str:
    """The content fingerprint of a training dataset: sha256 over its rows in order, each row's
    (id, input_ids, labels, messages) with the token ids as int32 and messages by their sha256. What
    data_prep records as a dataset manifest's `fingerprint`, and what a dataset dir without one is
    known by (`table_fingerprint`): the same rows give the same digest either way."""
    import numpy as np

    h = hashlib.sha256()
    for rid, input_ids, labels, messages in rows:
        h.update(str(rid).encode() + b"\0")
        h.update(np.asarray(input_ids, dtype=np.int32).tobytes())
        h.update(np.asarray(labels, dtype=np.int32).tobytes())
        text = messages if isinstance(messages, str) else json.dumps(messages, sort_keys=True, ensure_ascii=False, default=str)
        h.update(hashlib.sha256(text.encode()).digest())
    return h.hexdigest()


def table_fingerprint(table) -> str:
    """`rows_fingerprint` of a dataset's Arrow table (a `datasets` table or a pyarrow one with the columns id,
    input_ids, labels, messages), read batch by batch without a Python object per token."""
    import pyarrow.compute as pc

    table = getattr(table, "table", table).select(["id", "input_ids", "labels", "messages"])

    def rows():
        for batch in table.to_batches():
            lists = []
            for col in (batch.column(1), batch.column(2)):
                offsets = col.offsets.to_numpy()
                lists.append((pc.list_flatten(col).to_numpy(zero_copy_only=False), offsets - offsets[0]))
            (ids_v, ids_o), (lab_v, lab_o) = lists
            for k, (rid, messages) in enumerate(zip(batch.column(0).to_pylist(), batch.column(3).to_pylist())):
                yield rid, ids_v[ids_o[k]:ids_o[k + 1]], lab_v[lab_o[k]:lab_o[k + 1]], messages

    return rows_fingerprint(rows())


def dataset_dir_fingerprint(path: str | Path, error: type[Exception]) -> str:
    """`table_fingerprint` of the `datasets.save_to_disk` dir at `path` (for a dataset whose manifest names no
    fingerprint); a dir whose rows cannot be read so is refused as the caller's `error`, naming it."""
    import datasets

    why = "its manifest.json names no fingerprint and its rows cannot be read"
    try:
        ds = datasets.load_from_disk(str(path))
    except (OSError, ValueError) as exc:
        raise error(f"{path}: {why} ({type(exc).__name__}: {exc})") from None
    if not isinstance(ds, datasets.Dataset):
        raise error(f"{path}: {why} (a {type(ds).__name__}, not a single Dataset)")
    missing = [c for c in ("id", "input_ids", "labels", "messages") if c not in ds.column_names]
    if missing:
        raise error(f"{path}: {why} (no column {', '.join(missing)})")
    return table_fingerprint(ds.data)
