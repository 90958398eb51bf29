"""Where export-checkpoint reads from: an HF model dir, a resumable state dir, or a run dir.

- HF model dir (a trainer step checkpoint, or any `save_pretrained` output):
  `config.json` + `model.safetensors` or `model.safetensors.index.json`.
- Resumable state dir `<run_dir>/state/step-NNNNNN/`: torch.distributed.checkpoint
  shards of {"model": <HF-named state_dict>, "optim": ...}, `meta.json`, `hf/`
  (config.json + tokenizer files) and a `COMPLETE` marker written last. Only the
  "model" entries are read, without a process group.
- Run dir (or its `state/`): the newest step whose state is COMPLETE and verifies
  (`sft.checkpoint.verify_state`); torn states (no marker: the run was killed while writing),
  failing ones and ones removed while they were picked (a trainer pruning them) are skipped and reported. A state dir is verified the same way before
  anything in it is read, and its DCP metadata is read through the allow-list.
"""
from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from common import layout
from common.io import SHA256SUMS, check_sha256sums, read_sha256sums, sha256_file
from sft.ckpt_layout import strip_wrapper_prefixes
from sft.errors import SftError


class ExportError(SftError):
    """The checkpoint cannot be exported as asked (a user mistake: exit 2); the message says which file and why."""


GONE = "removed while the export was picking it (a trainer pruning its old states)"


@dataclass
class Source:
    kind: str  # "hf" | "state"
    path: Path  # the HF dir, or the state step dir
    hf_dir: Path  # where config.json and the tokenizer files are
    dcp_dir: Path | None = None  # the dir holding the DCP `.metadata` (state only)
    step: int | None = None
    notes: list[str] = field(default_factory=list)


def _has_weights(d: Path) -> bool:
    return (d / "model.safetensors").is_file() or (d / "model.safetensors.index.json").is_file()


def _dcp_dir(step_dir: Path) -> Path:
    """The DCP shards sit in the step dir itself, or in one sub-folder of it."""
    if (step_dir / ".metadata").is_file():
        return step_dir
    found = [p.parent for p in step_dir.glob("*/.metadata")]
    if len(found) != 1:
        raise ExportError(
            f"{step_dir}: expected torch.distributed.checkpoint shards (a .metadata file) in it "
            f"or in exactly one sub-folder, found {len(found)}"
        )
    return found[0]


def _state_source(step_dir: Path, notes: list[str], verified: bool = False) -> Source:
    """A state that passes `sft.checkpoint.verify_state` (COMPLETE, SHA256SUMS, meta.json);
    `verified`: latest_complete_state just checked it. A state removed meanwhile is one ExportError saying so."""
    from sft.checkpoint import verify_state

    try:
        problems = [] if verified else verify_state(step_dir)
        if problems:
            raise ExportError(f"{step_dir}: refusing to export a state that fails its checks:\n  " + "\n  ".join(problems))
        hf_dir = step_dir / "hf"
        if not (hf_dir / "config.json").is_file():
            raise ExportError(f"{hf_dir / 'config.json'}: missing; a state dir must carry hf/ (config + tokenizer) to be exported")
        meta = step_dir / "meta.json"
        try:
            step = int(json.loads(meta.read_text(encoding="utf-8")).get("step", layout.parse_step(step_dir.name)))
        except (ValueError, TypeError, AttributeError) as exc:
            raise ExportError(f"{meta}: unreadable ({exc})") from exc
        return Source("state", step_dir, hf_dir, _dcp_dir(step_dir), step, notes)
    except (ExportError, OSError):
        if step_dir.is_dir():
            raise
        raise ExportError(f"{step_dir}: {GONE}; nothing was exported: export again") from None


def latest_complete_state(state_root: Path, gone: tuple[Path, ...] = ()) -> tuple[Path, list[str]]:
    """The newest step-NNNNNN under `state_root` that is COMPLETE and verifies, plus notes on
    each newer one skipped (torn, failing its SHA256SUMS, or removed meanwhile: `gone`) and why."""
    from sft.checkpoint import newest_verified_state

    listed = sorted({*gone, *(p for _, p in layout.step_dirs(state_root))}, key=lambda p: p.name, reverse=True)
    found, skipped = newest_verified_state(state_root)

    def note(p: Path) -> str | None:
        if not p.is_dir():
            return f"skipped state {p}: {GONE}"
        if not layout.is_complete_state(p):
            return f"skipped torn state {p} (no {layout.COMPLETE} marker)"
        return next((n for n in skipped if n.startswith(f"skipped state {p}:")), None)

    notes = [n for p in listed if (found is None or p.name > found.name) and (n := note(p))]
    if found is None:
        raise ExportError(f"{state_root}: no complete resumable state that verifies (found {len(listed)} step dirs"
                          + (f": {'; '.join(notes)}" if notes else "") + ")")
    return found, notes


def _newest_state_source(state_root: Path) -> Source:
    """The newest state that verifies; one removed between its check and its reading (a trainer pruning its
    old states) is skipped, with a note, for the next."""
    gone: tuple[Path, ...] = ()
    while True:
        step_dir, notes = latest_complete_state(state_root, gone)
        try:
            return _state_source(step_dir, notes, verified=True)
        except ExportError:
            if step_dir.is_dir():
                raise
            gone += (step_dir,)


def resolve_source(ckpt: str | Path) -> Source:
    p = Path(ckpt)
    if not p.exists():
        raise ExportError(f"{p}: does not exist")
    if (p / "config.json").is_file() and _has_weights(p):
        return Source("hf", p, p)
    if (p / layout.COMPLETE).exists() or (p / ".metadata").is_file() or (p / "hf").is_dir():
        return _state_source(p, [])
    for root in (layout.states_dir(p), p):
        if layout.step_dirs(root):
            return _newest_state_source(root)
    raise ExportError(
        f"{p}: not a checkpoint: expected an HF model dir (config.json + model.safetensors[.index.json]), "
        f"a state dir (COMPLETE, meta.json, hf/, DCP shards) or a run dir with state/step-NNNNNN/"
    )


def check_source_sums(src: Source) -> None:
    """Refuse to export a source whose own SHA256SUMS no longer matches: it is corrupt."""
    if src.kind == "hf" and (src.path / SHA256SUMS).is_file():  # a state was verified by _state_source
        problems = check_sha256sums(src.path)
        if problems:
            raise ExportError(f"{src.path}: source checkpoint fails its SHA256SUMS:\n  " + "\n  ".join(problems))


def snapshot(src: Source) -> tuple[bool, str | None]:
    """(every file the source's SHA256SUMS lists is there, or without one the dir is; that file's sha256): what
    a trainer pruning its old states (rmtree) or rewriting a step changes."""
    try:
        if not (src.path / SHA256SUMS).is_file():
            return src.path.is_dir(), None
        entries, problems = read_sha256sums(src.path)
        return not problems and all((src.path / n).is_file() for n in entries), sha256_file(src.path / SHA256SUMS)
    except OSError:
        return False, None


@contextmanager
def source_held(src: Source, out: Path) -> Iterator[Callable[[], None]]:
    """Around an export of `src`: a failure while the source is no longer what it was at the start (a file
    vanished between its listing and its copy), or the check it yields (call it before the output is renamed
    into place) finding it changed, is one ExportError naming it; any other failure is raised as it is."""
    before = snapshot(src)

    def check() -> None:
        if not before[0] or snapshot(src) != before:
            raise ExportError(f"{src.path}: removed or changed while it was exported (a trainer pruning its old states, "
                              f"or a rewrite of that step); nothing was written to {out}: export again")

    check()
    try:
        yield check
    except Exception:
        check()
        raise


def load_hf_weights(d: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    index = d / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            files = sorted(set(weight_map.values()))
            if not all(isinstance(v, str) for v in files):
                raise TypeError("a weight_map value is not a file name")
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            raise ExportError(f"{index}: unreadable ({type(exc).__name__}: {str(exc)[:200]}); expected JSON with a weight_map "
                              "object of tensor names to file names") from None
    else:
        files = ["model.safetensors"]
    sd: dict[str, torch.Tensor] = {}
    for name in files:
        f = d / name
        if Path(name).name != name or not f.is_file():   # a weight file is one of this dir's own files
            raise ExportError(f"{index}: maps tensors to {name!r}: not a file in {d}")
        try:
            part = load_file(str(f))
        except Exception as exc:  # the library raises its own error types for corrupt files
            raise ExportError(f"{f}: unreadable safetensors file ({exc})") from exc
        for k in part:
            if k in sd:
                raise ExportError(f"{f}: tensor {k} also stored in another shard")
        sd.update(part)
    return sd


def load_state_model(dcp_dir: Path) -> dict[str, torch.Tensor]:
    """The "model" part of a DCP checkpoint, loaded in one process (no process group)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from sft.checkpoint import safe_planner, safe_reader

    reader = safe_reader(dcp_dir)  # .metadata through the DCP allow-list, never a plain unpickle
    md = reader.read_metadata()
    # planner_data maps each flattened key to its path in the nested dict saved.
    paths = md.planner_data if isinstance(md.planner_data, dict) else {}
    sd: dict[str, torch.Tensor] = {}
    for flat, meta in md.state_dict_metadata.items():
        path = paths.get(flat) or tuple(flat.split(".", 1))
        if path[0] != "model":
            continue
        if not isinstance(meta, TensorStorageMetadata):
            raise ExportError(f"{dcp_dir}: model entry {flat} is not a tensor")
        sd[".".join(map(str, path[1:]))] = torch.empty(meta.size, dtype=meta.properties.dtype)
    if not sd:
        raise ExportError(f"{dcp_dir}: the checkpoint has no 'model' entries (keys: {sorted(md.state_dict_metadata)[:5]}...)")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.distributed.*")
        dcp.load({"model": sd}, storage_reader=reader, planner=safe_planner(), no_dist=True)
    cleaned = {strip_wrapper_prefixes(k): v for k, v in sd.items()}
    if len(cleaned) != len(sd):
        raise ExportError(f"{dcp_dir}: model keys collide after removing FSDP wrapper prefixes")
    return cleaned


def load_source_weights(src: Source) -> dict[str, torch.Tensor]:
    return load_hf_weights(src.path) if src.kind == "hf" else load_state_model(src.dcp_dir)
