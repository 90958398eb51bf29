"""File helpers: jsonl, hashing, atomic directory writes, SHA256SUMS."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import stat
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


class JsonLineError(ValueError):
    """One line that is not a JSON value: `reason` is `bad_unicode` or `malformed_json`."""

    def __init__(self, reason: str, detail: str):
        self.reason, self.detail = reason, detail
        super().__init__(detail)


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")   # `\ud800`..`\udfff` in JSON text: maybe a lone surrogate


def lone_surrogate(value: Any) -> str | None:
    """Why `value` (a parsed JSON value) is not text: the first string (or key) holding a lone UTF-16
    surrogate (JSON's `\\ud800` without its pair, which no UTF-8 file or tokenizer takes), or None."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as exc:
                return f"a lone surrogate (U+{ord(v[exc.start]):04X}) at character {exc.start} of the string {v[:40]!r}: not text"
    return None


def parse_json_line(raw: bytes | str) -> Any:
    """The JSON value of one line (bytes are decoded as UTF-8); JsonLineError says why not,
    including invalid UTF-8, a lone surrogate escaped in a string (`"\\ud800"`: not text, reason
    `bad_unicode`) and nesting too deep to parse (never a RecursionError)."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, (bytes, bytearray)) else raw
    except UnicodeDecodeError as exc:
        raise JsonLineError("bad_unicode", f"invalid UTF-8 at byte {exc.start} ({exc.reason})") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise JsonLineError("malformed_json", f"invalid JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise JsonLineError("malformed_json", "JSON nested too deeply to parse") from None
    if _SURROGATE_ESCAPE.search(text) and (why := lone_surrogate(value)) is not None:
        raise JsonLineError("bad_unicode", why)
    return value


TORN_LINE = "torn_line"   # JsonLineError.reason of a torn last line (torn_line_problem)


def torn_line_problem(raw: bytes) -> str | None:
    """The one rule for a torn last line of a jsonl file, shared by every reader: `raw`, the bytes
    after the file's last newline (a writer killed mid-line leaves no newline), is torn when it is
    not one whole JSON value in UTF-8, whether the cut fell between ASCII bytes or inside a multibyte
    character. Returns why (for the reader's one line), or None when it is whole (or blank)."""
    if not raw.strip():
        return None
    try:
        parse_json_line(raw)
    except JsonLineError as exc:
        return f"no newline at the end and {exc.detail}: cut mid-write"
    return None


def read_jsonl(path: str | Path, *, torn: str | None = None) -> Iterator[tuple[int, str]]:
    """Yield (line_number, raw_line) for non-blank lines; parsing is the caller's job
    so that a malformed line can be quarantined with its line number. A line that is not
    UTF-8 raises JsonLineError naming `path:line`.

    `torn` applies the torn-last-line rule (torn_line_problem) to the file's last line when it has no
    newline: "error" raises JsonLineError (reason TORN_LINE) naming `path:line`, the same for an ASCII
    cut and a cut inside a UTF-8 character; "skip" leaves it out (a resuming writer's rule: the caller
    says so); None (the default) yields it like any other line."""
    if torn not in (None, "error", "skip"):
        raise ValueError(f"torn={torn!r}: expected None, 'error' or 'skip'")
    with open(path, "rb") as f:
        for i, raw in enumerate(f, 1):
            if torn is not None and not raw.endswith(b"\n") and (why := torn_line_problem(raw)) is not None:
                if torn == "skip":
                    return
                raise JsonLineError(TORN_LINE, f"{path}:{i}: torn last line ({why})")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise JsonLineError("bad_unicode", f"{path}:{i}: invalid UTF-8 at byte {exc.start} ({exc.reason})") from None
            if line.strip():
                yield i, line


def write_jsonl(path: str | Path, rows: Iterable[dict[str, Any]]) -> int:
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    return n


def read_json_object(path: str | Path) -> dict:
    """The JSON object in `path`; a ValueError naming the file and why when it does not read (or
    holds another JSON value). Callers raise their stage's error with the message."""
    try:
        obj = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:   # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ValueError(f"{path}: unreadable JSON ({exc})") from exc
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected a JSON object, found {type(obj).__name__}")
    return obj


def json_text(obj: Any) -> str:
    """`obj` as the project writes JSON files: indented, UTF-8 as is, keys in order, a final newline."""
    return json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=False) + "\n"


def write_json(path: str | Path, obj: Any) -> None:
    """Write JSON atomically (temp file + rename) so readers never see half a file."""
    write_text_atomic(path, json_text(obj))


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write UTF-8 text atomically (temp file + rename)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


EXISTING = ("refuse", "aside", "replace")


def tmp_name(final: Path) -> Path:
    """`<final>.tmp-<host>-<pid>`: whose temp dir it is, so a cleaner can tell a dead build from a
    live one on another node of a shared filesystem."""
    return final.with_name(f"{final.name}.tmp-{socket.gethostname()}-{os.getpid()}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def clean_dead_tmp(final: Path) -> list[Path]:
    """Remove `<final>.tmp-<this host>-<pid>` dirs (or files: a killed download's) whose pid is dead (a
    killed build's leftovers); other hosts' temp dirs are never touched. Returns what was removed."""
    prefix = f"{final.name}.tmp-{socket.gethostname()}-"
    removed = []
    if not final.parent.is_dir():
        return removed
    for p in final.parent.iterdir():
        # `<final>.tmp-<host>-<pid>`, or a temp dir nested in that name by a writer inside it
        pid = p.name[len(prefix):].split(".", 1)[0]
        if p.name.startswith(prefix) and pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
            removed.append(p)
    return removed


@contextmanager
def atomic_dir(final: str | Path, *, existing: str = "refuse") -> Iterator[Path]:
    """Yield a temporary sibling directory; rename it to `final` only on success.

    A crash mid-write leaves `<final>.tmp-<host>-<pid>` (cleaned by the next writer on this host
    once that pid is dead), never a complete-looking `final`. An empty `final` is replaced; a
    non-empty one by `existing`: "refuse" (FileExistsError), "aside" (`replace_aside`: the
    meaning of overwrite=true) or "replace" (deleted: only for directories this program owns
    outright, e.g. a rewritten step checkpoint or a derived index).
    """
    if existing not in EXISTING:
        raise ValueError(f"existing={existing!r}: expected one of {EXISTING}")
    final = Path(final)
    clean_dead_tmp(final)
    tmp = tmp_name(final)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        fsync_dir(tmp)
        if final.is_dir() and not final.is_symlink() and not any(final.iterdir()):
            final.rmdir()
        elif final.exists() or final.is_symlink():
            if existing == "aside":
                replace_aside(final)
            elif existing == "replace" and final.is_dir() and not final.is_symlink():
                shutil.rmtree(final)
            else:
                raise FileExistsError(f"{final}: exists; refusing to replace it")
        os.replace(tmp, final)
        fsync_dir(final.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def utc_stamp() -> str:
    """A UTC time for file names: `20261130T113814Z` (sortable, no colons)."""
    import datetime as _dt

    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def free_path(parent: Path, stem: str, suffix: str = "") -> Path:
    """`<parent>/<stem><suffix>`, else the first `<stem>.<n><suffix>` (n = 1, 2, ...) that nothing (not even a
    dangling link) holds: a new name that replaces nothing."""
    path, n = parent / f"{stem}{suffix}", 0
    while path.exists() or path.is_symlink():
        n += 1
        path = parent / f"{stem}.{n}{suffix}"
    return path


def replace_aside(path: str | Path) -> Path:
    """The one meaning of `overwrite=true` in this project: rename `path` to
    `<path>.replaced-<UTC time>` (a numbered suffix if that exists) and return the new path.

    Nothing is deleted; the caller then writes a fresh output at `path`.
    """
    path = Path(path)
    aside = free_path(path.parent, f"{path.name}{REPLACED_MARK}{utc_stamp()}")
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


def tree_entries(directory: str | Path) -> tuple[list[str], list[str]]:
    """(regular files under `directory` as relative posix names, problems): anything else found
    (a FIFO, device, socket or symlink) is a problem line, never opened or followed."""
    directory = Path(directory)
    files, problems = [], []
    for root, dirs, names in os.walk(directory, followlinks=False):
        for name in sorted(dirs + names):
            p = Path(root) / name
            try:
                st = os.lstat(p)
            except FileNotFoundError:   # removed while walked (a trainer pruning that state): not there
                continue
            if stat.S_ISDIR(st.st_mode):
                continue
            rel = p.relative_to(directory).as_posix()
            if stat.S_ISREG(st.st_mode):
                files.append(rel)
            else:
                kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else "not a regular file"
                problems.append(f"{p}: expected a regular file, found {kind}")
    return sorted(files), problems


def write_sha256sums(directory: str | Path, *, exclude: Iterable[str] = ()) -> Path:
    """Write `SHA256SUMS` (`sha256sum -c` format) over every file under `directory` but `exclude`."""
    directory = Path(directory)
    skip = {SHA256SUMS, *exclude}
    files, problems = tree_entries(directory)
    if problems:
        raise OSError("; ".join(problems))
    lines = [f"{sha256_file(directory / rel)}  {rel}\n" for rel in files if rel not in skip]
    out = directory / SHA256SUMS
    out.write_text("".join(lines), encoding="utf-8")
    return out


def dir_identity(path: str | Path) -> dict[str, str]:
    """A model dir's content digest, as every evaluation records it: sha256 of its `SHA256SUMS`
    ("sha256sums"), or of the same lines computed over its files when it has none ("files")."""
    path = Path(path)
    sums = path / SHA256SUMS
    if sums.is_file():
        return {"kind": "sha256sums", "digest": sha256_file(sums)}
    lines = [f"{sha256_file(p)}  {p.relative_to(path).as_posix()}\n" for p in sorted(path.rglob("*")) if p.is_file()]
    return {"kind": "files", "digest": sha256_text("".join(lines))}


def read_sha256sums(directory: str | Path) -> tuple[dict[str, str], list[str]]:
    """({relative name: digest}, problems) from `directory/SHA256SUMS`. Entries must name regular
    files inside `directory` (no absolute paths, no `..`, no symlinks on the way): others are
    problems and are never opened."""
    directory = Path(directory)
    sums = directory / SHA256SUMS
    try:
        st = os.lstat(sums)
    except FileNotFoundError:
        return {}, [f"{sums}: missing"]
    if not stat.S_ISREG(st.st_mode):
        return {}, [f"{sums}: expected a regular file, found something else"]
    entries, problems = {}, []
    try:
        text = sums.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        return {}, [f"{sums}: not UTF-8 text ({exc.reason})"]
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        digest, sep, name = line.partition("  ")
        name = name.lstrip("*")
        if not sep or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest) or not name:
            problems.append(f"{sums}:{n}: malformed line {line[:120]!r}")
            continue
        parts = Path(name).parts
        if Path(name).is_absolute() or ".." in parts:
            problems.append(f"{sums}:{n}: entry {name[:120]!r} points outside {directory}; not read")
            continue
        bad = next((directory.joinpath(*parts[:i]) for i in range(1, len(parts) + 1)
                    if directory.joinpath(*parts[:i]).is_symlink()), None)
        if bad is not None:
            problems.append(f"{sums}:{n}: entry {name!r} goes through the symlink {bad}; not read")
            continue
        entries[Path(name).as_posix()] = digest
    return entries, problems


def check_sha256_entry(directory: Path, name: str, digest: str) -> str | None:
    """The problem with one SHA256SUMS entry (read_sha256sums vetted the name), or None."""
    path = Path(directory) / name
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return f"{path}: listed in SHA256SUMS but missing"
    if not stat.S_ISREG(st.st_mode):
        return f"{path}: listed in SHA256SUMS but not a regular file; not read"
    try:
        found = sha256_file(path)
    except OSError as exc:
        return f"{path}: listed in SHA256SUMS but unreadable ({exc.strerror or exc})"
    if found != digest:
        return f"{path}: checksum mismatch (expected {digest[:16]}…, found {found[:16]}…)"
    return None


def check_sha256sums(directory: str | Path, *, unlisted_ok: Iterable[str] = ()) -> list[str]:
    """Problems found checking `SHA256SUMS`; empty when every file matches and none is unlisted.
    Only regular files inside `directory` are ever opened (see read_sha256sums, tree_entries)."""
    directory = Path(directory)
    entries, problems = read_sha256sums(directory)
    if not entries and problems:
        return problems
    for name, digest in entries.items():
        if (p := check_sha256_entry(directory, name, digest)) is not None:
            problems.append(p)
    files, odd = tree_entries(directory)
    problems.extend(odd)
    skip = {SHA256SUMS, *unlisted_ok}
    problems.extend(f"{directory / rel}: present but not listed in SHA256SUMS"
                    for rel in files if rel not in entries and rel not in skip)
    return problems


def check_output_dir(out: str | Path, *, overwrite: bool, marker: str, what: str = "out",
                     sources: Iterable[str | Path] = ()) -> None:
    """The rule for every output directory a command replaces: refuse (ConfigError, naming what is
    in the way) unless `out` is absent, empty, or carries this command's own `marker` file and
    `overwrite` is true (then `atomic_dir(..., existing="aside")` renames it aside). A path that
    equals or contains one of `sources` is never an output."""
    from common.cli import ConfigError

    out = Path(out)
    target = out.resolve()
    for src in sources:
        s = Path(src).resolve()
        if s == target or s.is_relative_to(target):
            raise ConfigError(f"{what}: {out} {'is' if s == target else 'contains'} the input {src}; "
                              "choose an output path outside every input")
    if not (out.exists() or out.is_symlink()):
        return
    if out.is_symlink() or not out.is_dir():
        raise ConfigError(f"{what}: {out} exists and is not a directory; choose another path")
    entries = sorted(p.name for p in out.iterdir())
    if not entries:
        return
    shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
    if not (out / marker).is_file():
        raise ConfigError(f"{what}: {out} exists and is not an output of this command (no {marker}; holds {shown}); "
                          "refusing to replace it: move it away or choose another path")
    if not overwrite:
        raise ConfigError(f"{what}: {out} already exists (overwrite=true renames it aside to "
                          f"{out.name}.replaced-<UTC time> and writes a fresh one)")
