"""Pinning hub sources: `FORMAT:ID[#split]` -> `FORMAT:ID@<commit sha>[#split]`.

`launch` pins every hub source once, at a run's first launch, and writes the pinned specs into
the run's config.yaml — so the dataset cache key, the data manifest and every later launch or
Slurm requeue name the same commit and need no hub access. A spec already carrying `@REV` is
kept as given; a later launch of the same run dir reuses the revisions its config.yaml holds.
"""
from __future__ import annotations

import os
from pathlib import Path

from data_prep.readers import Source, parse_source


def cached_revision(hub_id: str) -> str | None:
    """The commit the local Hugging Face cache holds for the dataset's main branch, if any."""
    from huggingface_hub import constants

    ref = Path(constants.HF_HUB_CACHE) / f"datasets--{hub_id.replace('/', '--')}" / "refs" / "main"
    return ref.read_text().strip() if ref.is_file() else None


def resolve_revision(hub_id: str) -> str:
    """The current commit sha of a hub dataset: asked from the hub, else (offline, unreachable)
    the commit the local HF cache holds; OSError naming the dataset when neither is available."""
    why = "HF_HUB_OFFLINE is set"
    if os.environ.get("HF_HUB_OFFLINE", "").lower() not in ("1", "true", "yes"):
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
