"""File helpers: jsonl, hashing, atomic directory writes, SHA256SUMS."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

SHA256SUMS = "SHA256SUMS"
REPLACED_MARK = ".replaced-"   # `<path>.replaced-<UTC time>`: an output renamed aside by overwrite=true


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def read_jsonl(path: str | Path) -> Iterator[tuple[int, str]]:
    """Yield (line_number, raw_line) for non-blank lines; parsing is the caller's job
    so that a malformed line can be quarantined with its line number."""
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if line.strip():
                yield i, line


def write_jsonl(path: str | Path, rows: Iterable[dict[str, Any]]) -> int:
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    return n


def write_json(path: str | Path, obj: Any) -> None:
    """Write JSON atomically (temp file + rename) so readers never see half a file."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


@contextmanager
def atomic_dir(final: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling directory; rename it to `final` only on success.

    A crash mid-write leaves `<final>.tmp-<pid>`, never a complete-looking `final`.
    """
    final = Path(final)
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        fsync_dir(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        fsync_dir(final.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def utc_stamp() -> str:
    """A UTC time for file names: `20261130T113814Z` (sortable, no colons)."""
    import datetime as _dt

    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def replace_aside(path: str | Path) -> Path:
    """The one meaning of `overwrite=true` in this project: rename `path` to
    `<path>.replaced-<UTC time>` (a numbered suffix if that exists) and return the new path.

    Nothing is deleted; the caller then writes a fresh output at `path`.
    """
    path = Path(path)
    base = path.with_name(f"{path.name}{REPLACED_MARK}{utc_stamp()}")
    aside, k = base, 1
    while aside.exists() or aside.is_symlink():
        aside = base.with_name(f"{base.name}.{k}")
        k += 1
    os.replace(path, aside)
    return aside


def fsync_dir(path: Path) -> None:
    for p in [*path.iterdir(), path] if path.is_dir() else [path]:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)


def write_sha256sums(directory: str | Path) -> Path:
    """Write `SHA256SUMS` (`sha256sum -c` format) over every file under `directory`."""
    directory = Path(directory)
    lines = []
    for p in sorted(directory.rglob("*")):
        if p.is_file() and p.name != SHA256SUMS:
            lines.append(f"{sha256_file(p)}  {p.relative_to(directory).as_posix()}\n")
    out = directory / SHA256SUMS
    out.write_text("".join(lines), encoding="utf-8")
    return out


def check_sha256sums(directory: str | Path) -> list[str]:
    """Problems found checking `SHA256SUMS`; empty when every file matches and none is unlisted."""
    directory = Path(directory)
    sums = directory / SHA256SUMS
    if not sums.exists():
        return [f"{sums}: missing"]
    problems, listed = [], set()
    for n, line in enumerate(sums.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            digest, name = line.split("  ", 1)
        except ValueError:
            problems.append(f"{sums}:{n}: malformed line {line!r}")
            continue
        name = name.lstrip("*")
        listed.add(name)
        path = directory / name
        if not path.is_file():
            problems.append(f"{path}: listed in SHA256SUMS but missing")
        elif sha256_file(path) != digest:
            problems.append(f"{path}: checksum mismatch (expected {digest[:16]}…, found {sha256_file(path)[:16]}…)")
    for p in sorted(directory.rglob("*")):
        rel = p.relative_to(directory).as_posix()
        if p.is_file() and p.name != SHA256SUMS and rel not in listed:
            problems.append(f"{p}: present but not listed in SHA256SUMS")
    return problems
