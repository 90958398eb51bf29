"""Read and check safetensors files without the safetensors library.

verify-checkpoint must not trust the library whose output it is checking, so the
format is parsed here from its specification: an 8-byte little-endian header
length N, N bytes of JSON mapping tensor name -> {dtype, shape, data_offsets}
(plus an optional `__metadata__` of str -> str), then the payload. Offsets are
relative to the payload start; a well-formed file has them start at 0, be
contiguous and non-overlapping, each span = prod(shape) * itemsize, and the file
ends exactly at the last span.

Every problem is one line naming the file, the tensor, what was expected and
what was found.
"""
from __future__ import annotations

import json
import math
import os
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

# Bytes per element for the dtype names the format defines (sub-byte types are
# left out on purpose: a checkpoint here never holds them, and an unknown dtype
# is reported rather than guessed at).
DTYPE_SIZES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
    "U32": 4, "I32": 4, "F32": 4,
    "U64": 8, "I64": 8, "F64": 8, "C64": 8,
}

# A header larger than this is not a checkpoint header but a corrupt length field;
# refusing it avoids reading gigabytes of payload as JSON.
MAX_HEADER_BYTES = 100 * 1024 * 1024


@dataclass(frozen=True)
class TensorEntry:
    """One tensor as described by a file's header."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # offset of the first byte, relative to the payload start
    end: int  # one past the last byte

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass
class SafetensorsFile:
    """A parsed file: its entries (in header order), header size and problems found."""

    path: Path
    header_len: int = 0
    entries: dict[str, TensorEntry] | None = None
    metadata: dict | None = None
    problems: list[str] | None = None

    @property
    def payload_start(self) -> int:
        return 8 + self.header_len


def _entry(path: Path, name: str, raw, problems: list[str]) -> TensorEntry | None:
    """Validate one header entry's fields; None (with a problem line) if unusable."""
    where = f"{path}: tensor {name}"
    if not isinstance(raw, dict):
        problems.append(f"{where}: header entry expected an object, found {type(raw).__name__}")
        return None
    dtype, shape, offsets = raw.get("dtype"), raw.get("shape"), raw.get("data_offsets")
    if dtype not in DTYPE_SIZES:
        problems.append(f"{where}: dtype expected one of {sorted(DTYPE_SIZES)}, found {dtype!r}")
        return None
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        problems.append(f"{where}: shape expected a list of non-negative ints, found {shape!r}")
        return None
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        problems.append(f"{where}: data_offsets expected [begin, end] with 0 <= begin <= end, found {offsets!r}")
        return None
    entry = TensorEntry(name, dtype, tuple(shape), offsets[0], offsets[1])
    want = math.prod(shape) * DTYPE_SIZES[dtype]
    if entry.nbytes != want:
        problems.append(
            f"{where}: payload length expected {want} bytes (shape {list(shape)} x {dtype}), "
            f"found {entry.nbytes} (data_offsets {offsets})"
        )
    return entry


def _check_layout(path: Path, entries: list[TensorEntry], problems: list[str]) -> int:
    """Offsets must start at 0 and tile the payload; returns the payload end."""
    end = 0
    prev: TensorEntry | None = None
    for e in sorted(entries, key=lambda e: (e.begin, e.end, e.name)):
        if e.begin < end:
            problems.append(
                f"{path}: tensor {e.name}: data_offsets [{e.begin}, {e.end}] overlap tensor "
                f"{prev.name if prev else '?'} (expected begin {end}, found {e.begin})"
            )
        elif e.begin > end:
            what = "start at 0" if prev is None else f"follow tensor {prev.name} contiguously"
            problems.append(
                f"{path}: tensor {e.name}: data_offsets expected to {what} (begin {end}), "
                f"found begin {e.begin} ({e.begin - end} unaccounted bytes)"
            )
        end = max(end, e.end)
        prev = e
    return end


def read_safetensors(path: str | Path) -> SafetensorsFile:
    """Parse and check one file's header and layout against its size on disk."""
    path = Path(path)
    out = SafetensorsFile(path=path, problems=[])
    problems = out.problems
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                problems.append(f"{path}: file size expected at least 8 bytes (header length), found {size}")
                return out
            (n,) = struct.unpack("<Q", head)
            if n > min(size - 8, MAX_HEADER_BYTES):
                problems.append(f"{path}: header length field expected <= {min(size - 8, MAX_HEADER_BYTES)}, found {n}")
                return out
            raw_header = f.read(n)
    except OSError as exc:
        problems.append(f"{path}: cannot read ({exc.strerror or exc})")
        return out
    out.header_len = n
    repeated: list[str] = []

    def no_repeats(pairs):  # plain json.loads would silently keep the last of two same-named tensors
        seen = Counter(k for k, _ in pairs)
        repeated.extend(f"{k} ({n} times)" for k, n in seen.items() if n > 1)
        return dict(pairs)

    try:
        header = json.loads(raw_header.decode("utf-8"), object_pairs_hook=no_repeats)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        problems.append(f"{path}: header expected UTF-8 JSON, found invalid data ({exc})")
        return out
    except RecursionError:
        problems.append(f"{path}: header expected a flat JSON object of tensors, found nesting too deep to parse")
        return out
    for name in repeated:
        problems.append(f"{path}: header key expected once, found repeated: {name}")
    if not isinstance(header, dict):
        problems.append(f"{path}: header expected a JSON object, found {type(header).__name__}")
        return out
    meta = header.pop("__metadata__", None)
    if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        problems.append(f"{path}: __metadata__ expected an object of strings, found {meta!r}")
    out.metadata = meta if isinstance(meta, dict) else None
    entries = [e for name, raw in header.items() if (e := _entry(path, name, raw, problems))]
    out.entries = {e.name: e for e in entries}
    payload_end = _check_layout(path, entries, problems)
    want_size = 8 + n + payload_end
    if size != want_size:
        kind = "truncated payload" if size < want_size else "trailing bytes after the last tensor"
        problems.append(f"{path}: file size expected {want_size} bytes (8 + header {n} + payload {payload_end}), found {size} ({kind})")
    return out


def read_tensor_bytes(parsed: SafetensorsFile, name: str) -> bytes:
    """The raw payload bytes of one tensor (caller checked the file is well-formed)."""
    e = parsed.entries[name]
    with open(parsed.path, "rb") as f:
        f.seek(parsed.payload_start + e.begin)
        data = f.read(e.nbytes)
    if len(data) != e.nbytes:
        raise OSError(f"{parsed.path}: tensor {name}: expected {e.nbytes} bytes, read {len(data)}")
    return data
