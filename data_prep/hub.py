"""Pinning hub sources: `FORMAT:ID[#split]` -> `FORMAT:ID@<commit sha>[#split]`, and what the local caches hold.

`launch` pins every hub source once, at a run's first launch, and writes the pinned specs into
the run's config.yaml — so the dataset cache key, the data manifest and every later launch or
Slurm requeue name the same commit and need no hub access. A spec already carrying `@REV` is
kept as given; a later launch of the same run dir reuses the revisions its config.yaml holds.

Offline (`hub_offline`: HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE), an unpinned source is pinned to the commit
the local hub cache holds for its main branch (`cached_revision`); `datasets.load_dataset` (the reader,
data_prep.readers) offline (`datasets_offline`: HF_DATASETS_OFFLINE, else the hub's) never asks the hub and
loads the newest copy its own cache holds, whatever the revision asked: `offline_problem` says, from the files
alone, whether it would find one (the launch preflight asks it before anything starts). Both caches are where
huggingface_hub and datasets derive them from the environment (HF_HUB_CACHE, HF_DATASETS_CACHE, HF_HOME,
XDG_CACHE_HOME).
"""
from __future__ import annotations

import glob
import json
import os
import re
from pathlib import Path

from common.hub import TRUE, hf_home, hub_cache, offline_var
from data_prep.readers import Source, parse_source


def _true(var: str) -> bool:
    return os.environ.get(var, "").upper() in TRUE


def hub_offline() -> bool:
    """Whether huggingface_hub is offline: pinning answers from the local hub cache only."""
    return offline_var() is not None


def datasets_offline() -> str | None:
    """The variable that keeps `datasets.load_dataset` from downloading (HF_DATASETS_OFFLINE, else the hub's
    own: with the hub offline nothing downloads whatever datasets is told), or None. Offline, it loads from its
    own cache only."""
    return "HF_DATASETS_OFFLINE" if _true("HF_DATASETS_OFFLINE") else offline_var()


def datasets_cache() -> Path:
    """datasets' cache of loaded datasets (HF_DATASETS_CACHE, else $HF_HOME/datasets)."""
    return Path(os.environ.get("HF_DATASETS_CACHE", os.path.join(os.path.expanduser(hf_home()), "datasets")))


def cached_revision(hub_id: str) -> str | None:
    """The commit the local Hugging Face cache holds for the dataset's main branch, if any."""
    ref = hub_cache() / f"datasets--{hub_id.replace('/', '--')}" / "refs" / "main"
    return ref.read_text().strip() if ref.is_file() else None


def snake(name: str) -> str:
    """A dataset name as datasets names its cache dir and files (its camelcase_to_snakecase)."""
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    return re.sub(r"([a-z\d])([A-Z])", r"\1_\2", name).lower()


def split_names(split: str) -> list[str]:
    """The split names a `split=` argument reads (`a+b`, `train[:10%]`: a, b, train)."""
    return [re.sub(r"\[.*\]$", "", s.strip()) for s in split.split("+") if s.strip()]


def offline_problem(hub_id: str, split: str = "train") -> str | None:
    """Why `datasets.load_dataset(hub_id, split=split)` would find no copy offline (None: it would load one).
    Offline, datasets takes the newest `<cache>/<namespace>___<name>/<config>/<version>/<hash>/` whose
    dataset_info.json names that config (refusing when several configs are cached at that version and hash)
    and reads the split's arrow files there; the revision asked for plays no part."""
    parts = hub_id.split("/")
    parts[-1] = snake(parts[-1])
    root = datasets_cache() / "___".join(parts)
    found = [Path(d) for d in glob.glob(os.path.join(str(root), "*", "*", "*")) if os.path.isdir(d)]
    if not found:
        return f"not in the local datasets cache ($HF_DATASETS_CACHE={datasets_cache()})"
    infos = {}
    for d in found:
        try:
            infos[d] = json.loads((d / "dataset_info.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            return f"its copy in the local datasets cache is unreadable ({d / 'dataset_info.json'}: " \
                   f"{getattr(exc, 'strerror', None) or exc})"
    own = [d for d in found if isinstance(infos[d], dict) and infos[d].get("config_name") == d.parts[-3]]
    if not own:
        return f"the local datasets cache ({root}) holds no copy of its default configuration"
    latest = sorted(own, key=lambda d: d.stat().st_mtime)[-1]   # (datasets: the last of the newest)
    configs = [d.parts[-3] for d in own if d.parts[-2:] == latest.parts[-2:]]
    if len(configs) > 1:
        return f"the local datasets cache ({root}) holds several configurations ({', '.join(sorted(configs))}) " \
               "and the source names none"
    splits = infos[latest].get("splits") or {}
    for name in split_names(split):
        if name not in splits:
            return f"its copy in the local datasets cache ({latest}) has no split {name!r} " \
                   f"(it has {', '.join(sorted(splits)) or 'none'})"
        shards = (splits[name] or {}).get("shard_lengths") or []
        prefix = latest / f"{parts[-1]}-{name}"
        files = [Path(f"{prefix}-{i:05d}-of-{len(shards):05d}.arrow") for i in range(len(shards))] \
            if len(shards) > 1 else [Path(f"{prefix}.arrow")]
        if missing := [f.name for f in files if not f.is_file()]:
            return f"its copy in the local datasets cache ({latest}) lacks {', '.join(missing)}"
    return None


def resolve_revision(hub_id: str) -> str:
    """The current commit sha of a hub dataset: asked from the hub, else (offline, unreachable)
    the commit the local HF cache holds; OSError naming the dataset when neither is available."""
    why = f"{offline_var()} is set"
    if not hub_offline():
        from huggingface_hub import HfApi

        try:
            return HfApi().dataset_info(hub_id).sha
        except Exception as exc:  # noqa: BLE001 - network, auth, missing repo: fall back to the cache
            why = f"the hub did not answer ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
    rev = cached_revision(hub_id)
    if rev:
        return rev
    raise OSError(f"cannot pin hub dataset {hub_id}: {why} and the local HF cache has no copy; "
                  f"pin it yourself as {hub_id}@<commit>")


def spec_of(src: Source) -> str:
    rev = f"@{src.revision}" if src.revision else ""
    split = f"#{src.split}" if src.split != "train" else ""
    share = f"~{src.share!r}" if src.share is not None else ""
    return f"{src.format}:{src.location}{rev}{split}{share}"


def pin_specs(specs: list[str], previous: list[str] = (), resolve=None) -> tuple[list[str], dict]:
    """(the specs with every hub source pinned, {spec: how}) — `previous` (pinned specs from an
    earlier launch) are reused for the same format, id and split before asking the hub."""
    resolve = resolve or resolve_revision
    known = {}
    for spec in previous:
        src = parse_source(spec)
        if not src.is_local and src.revision:
            known[(src.format, src.location, src.split)] = src.revision
    out, how = [], {}
    for spec in specs:
        src = parse_source(spec)
        if src.is_local or src.revision:
            out.append(str(spec))
            continue
        rev = known.get((src.format, src.location, src.split))
        origin = "from the run's config.yaml" if rev else "resolved on the hub"
        if rev is None:
            rev = resolve(src.location)
        pinned = spec_of(Source(src.format, src.location, src.split, rev, src.share))
        out.append(pinned)
        how[spec] = f"{pinned} ({origin})"
    return out, how
