"""The arm's dataset, built once per data_prep cache key under an exclusive file lock and reused by every later
launch (docs/stages/launch.md, "What a launch does")."""
from __future__ import annotations

import fcntl
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from common import fingerprint, layout
from common.io import JsonLineError, atomic_dir, read_json_object
from data_prep import hub
from data_prep.errors import DataPrepError
from launch.errors import LaunchError


def cache_root(cfg: DictConfig) -> Path:
    return Path(cfg.data.cache_root or Path(cfg.runs_root) / "_data").expanduser().resolve()


def data_section(cfg: DictConfig) -> DictConfig:
    """The `data:` section data_prep sees; `dir`/`cache_root` (where it lives) nulled so they never change its key."""
    return OmegaConf.create({**OmegaConf.to_container(cfg.data, resolve=True), "dir": None, "cache_root": None})


def dataset_key(cfg: DictConfig, data_arm: str) -> str:
    from data_prep.build import cache_key

    return cache_key(data_section(cfg), arm=data_arm, seed=int(cfg.seed), tokenizer=str(cfg.model.tokenizer))


def read_manifest(data_dir: Path) -> dict:
    if not (path := data_dir / layout.MANIFEST).exists():   # (a file given as the directory: no manifest either)
        raise LaunchError(f"{data_dir}: not a data_prep dataset directory ({layout.MANIFEST} missing)")
    try:
        return read_json_object(path)
    except ValueError as exc:   # unreadable, not UTF-8 or not JSON (the cause says why), or not an object
        raise LaunchError(f"{path}: unreadable manifest ({exc.__cause__ or str(exc).removeprefix(f'{path}: ')})") from exc


def with_run_pins(cfg: DictConfig, rd: Path) -> DictConfig:
    """`cfg` with its hub sources pinned as the run dir's config.yaml pinned them: the form the request is compared
    in before the data step. No hub access; a source the run never pinned stays as asked."""
    if cfg.data.dir or not (rd / layout.CONFIG).is_file():
        return cfg
    out = cfg.copy()
    pin_sources(out, list(out.data.sources), rd, False, resolve=lambda _: None)
    return out


def pin_sources(cfg: DictConfig, domains, rd: Path, log: bool, **resolve) -> None:
    """Pin `cfg`'s sources of `domains` in place as config.yaml has them, else by `resolve` (default: the hub; `log`: print each)."""
    old = OmegaConf.load(rd / layout.CONFIG) if (rd / layout.CONFIG).is_file() else None
    for domain in domains:
        previous = list(OmegaConf.select(old, f"data.sources.{domain}", default=None) or []) if old is not None else []
        try:
            cfg.data.sources[domain], how = hub.pin_specs(list(cfg.data.sources[domain]), previous, **resolve)
        except OSError as exc:
            raise LaunchError(str(exc)) from exc
        for spec, note in how.items() if log else ():
            print(f"[launch] data.sources.{domain}: {spec} -> {note}")


def ensure_dataset(cfg: DictConfig, data_arm: str) -> dict:
    """The arm's dataset directory, built (data_prep.build's `build_arm`) only when no complete copy is cached
    (`dataset_key`); an explicit `data.dir` is used as is (it must be a data_prep output directory, its cache_key None).
    Returned as the run manifest's `data` record: dir, cache_key, fingerprint (the dataset manifest's), reused."""
    if cfg.data.dir:
        return _record(Path(cfg.data.dir).expanduser().resolve(), None, reused=True)
    from data_prep.build import build_arm

    key = dataset_key(cfg, data_arm)
    final = cache_root(cfg) / key
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.with_name(f".{key}.lock"), "a") as lock:   # released when closed
        fcntl.flock(lock, fcntl.LOCK_EX)
        if final.is_dir():
            print(f"[launch] reusing cached dataset {final}")
            return _record(final, key, reused=True)
        print(f"[launch] building the {data_arm} dataset (key {key[:16]}) -> {final}")
        with atomic_dir(final) as tmp:
            try:
                build_arm(data_section(cfg), arm=data_arm, seed=int(cfg.seed), tokenizer=str(cfg.model.tokenizer), out=tmp, final=final)
            # data_prep's bad-input errors (unknown source, too few records, strict=true rejections) and OSError
            # (hub unreachable, missing file, disk full) become one clear message; anything else is a bug: kept.
            except (DataPrepError, JsonLineError, OSError) as exc:
                hint = (" (data.kind=hub needs the Hugging Face Hub or a warm HF cache; data=synthetic runs offline)"
                        if isinstance(exc, OSError) and cfg.data.kind == "hub" else "")
                raise LaunchError(f"data prep for arm {data_arm!r} failed: {exc}{hint}") from exc
            if not (tmp / layout.MANIFEST).is_file():
                raise LaunchError(f"data_prep wrote no {layout.MANIFEST} into {tmp}; refusing to cache it")
    return _record(final, key, reused=False)


def _record(data_dir: Path, key: str | None, reused: bool) -> dict:
    if (fp := read_manifest(data_dir).get("fingerprint")) is None:   # known by its rows, as the trainer knows it (sft.data)
        fp = fingerprint.dataset_dir_fingerprint(data_dir, LaunchError)
    return {"dir": str(data_dir), "cache_key": key, "fingerprint": fp, "reused": reused}
