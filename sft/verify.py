"""verify-checkpoint: prove a Hugging Face checkpoint dir is intact and loads as what it claims.

    verify-checkpoint PATH [key=value ...]   (the keys below)

Checks, printing one line per problem (file, tensor, expected, found):
1. every safetensors file's header and layout, parsed here without the safetensors
   library (sft/safetensors_check.py);
2. `model.safetensors.index.json` (when sharded): every mapped file exists, the
   weight_map agrees with the files' contents, `total_size` = sum of payloads;
3. the stored tensors are exactly the ones the config's architecture expects
   (derived on the meta device: 398 for Qwen3-4B), with the expected shapes and dtype,
   and config.json names that architecture (vLLM reads `architectures`);
4. `SHA256SUMS` matches every file and lists them all;
5. the tokenizer loads and fits in `config.vocab_size`;
6. transformers loads the model with no missing, unexpected or mismatched keys, and
   the values it loaded are the bytes in the files (skipped when 1-3 found problems).
Exit status 0 when all hold (the OK line gives the tensor-key count: 398 for a Qwen3-4B export),
1 otherwise (2 for a bad command line, or a PATH that does not exist or is a file). SHA256SUMS (4.) covers the tokenizer and chat-template files too.
"""
from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from omegaconf import OmegaConf

from common import fields
from common.fields import flag, text
from common.cli import apply_overrides, run_cli, wants_help
from common.io import check_sha256sums, tree_entries
from sft.ckpt_layout import ST_TO_TORCH, TORCH_TO_ST, config_dtype, expected_layout
from sft.hfconfig import serving_field_problems
from sft.safetensors_check import SafetensorsFile, read_safetensors, read_tensor_bytes
from sft.errors import SftError

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def _weight_files(path: Path, problems: list[str], regular: set[str]) -> tuple[list[str], dict | None, dict | None]:
    """(file names to parse, weight_map or None, index metadata or None). Only names in `regular`
    (the dir's regular files, from common.io.tree_entries) are ever opened."""
    index_path = path / INDEX
    on_disk = sorted(n for n in regular if "/" not in n and n.endswith(".safetensors"))
    if INDEX not in regular:
        if SINGLE not in on_disk:
            problems.append(f"{path}: expected {SINGLE} or {INDEX}, found neither")
            return [], None, None
        for name in on_disk:
            if name != SINGLE:
                problems.append(f"{path / name}: expected no other weight file beside {SINGLE} without an index, found one")
        return [SINGLE], None, None
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
        weight_map, meta = index["weight_map"], index.get("metadata")
        meta = meta if isinstance(meta, dict) else {}  # a missing total_size is reported by _check_index
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ValueError("weight_map is not an object of file names")
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        problems.append(f"{index_path}: expected JSON with a weight_map object, found unreadable index "
                        f"({type(exc).__name__}: {str(exc)[:200]})")
        return [], None, None
    counts = Counter(weight_map.values())
    files = []
    for name in sorted(counts):
        if name in regular:
            files.append(name)
        else:
            first = next(k for k, v in weight_map.items() if v == name)
            problems.append(f"{index_path}: maps {counts[name]} tensors (e.g. {first}) to {name}: expected the file, found it missing")
    for name in on_disk:
        if name not in counts:
            problems.append(f"{path / name}: expected every weight file to be in {INDEX}, found it unreferenced")
    return files, weight_map, meta


def _check_index(path: Path, parsed: dict[str, SafetensorsFile], weight_map: dict, meta: dict, problems: list[str]) -> None:
    index_path = path / INDEX
    for name, pf in parsed.items():
        for key in pf.entries or {}:
            mapped = weight_map.get(key)
            if mapped is None:
                problems.append(f"{pf.path}: tensor {key}: expected in the index weight_map, found absent")
            elif mapped != name:
                problems.append(f"{index_path}: tensor {key}: expected to map to {name} (where it is stored), found {mapped}")
    for key, name in weight_map.items():
        pf = parsed.get(name)
        if pf is not None and pf.entries is not None and key not in pf.entries:
            problems.append(f"{index_path}: tensor {key}: expected in {name} as mapped, found no such tensor there")
    payload = sum(e.nbytes for pf in parsed.values() for e in (pf.entries or {}).values())
    total = meta.get("total_size")
    if total != payload:
        problems.append(f"{index_path}: total_size expected {payload} (sum of tensor payloads), found {total}")


def _expected_float_dtype(path: Path, config_json: dict, layout, where: dict, problems: list[str]):
    """The dtype every float tensor must have: config.json's, else the majority's.

    When all float tensors agree with each other but not with config.json, that is one
    problem (the config's), not one per tensor."""
    declared = config_dtype(config_json)
    found = Counter(pf.entries[k].dtype for k, pfs in where.items() for pf in pfs if layout.floating.get(k))
    want = TORCH_TO_ST.get(declared) if declared else None
    if want and len(found) == 1 and want not in found:
        (actual, n), = found.items()
        problems.append(f"{path / 'config.json'}: dtype expected {ST_TO_TORCH[actual]} (all {n} stored float tensors "
                        f"are {actual}), found {declared}".replace("torch.", ""))
        return actual, "the dtype of every float tensor"
    if want:
        return want, f"config dtype {declared}".replace("torch.", "")
    return (found.most_common(1)[0][0] if found else None), "the dtype of most tensors"


def _check_layout(path: Path, config, config_json: dict, parsed: dict[str, SafetensorsFile], problems: list[str]) -> None:
    """Exactly the architecture's tensors, once each, with its shapes and one float dtype."""
    try:
        layout = expected_layout(config)
    except Exception as exc:  # e.g. a model_type with no causal-LM class in this transformers
        problems.append(f"{path / 'config.json'}: expected a config transformers can build as a causal LM, "
                        f"found {type(exc).__name__}: {exc}")
        return
    archs = config_json.get("architectures")
    if archs != [layout.architecture]:  # vLLM picks its model class from this field, not model_type
        problems.append(f"{path / 'config.json'}: architectures expected [{layout.architecture!r}], found {archs!r}")
    where: dict[str, list[SafetensorsFile]] = {}
    for pf in parsed.values():
        for key in pf.entries or {}:
            where.setdefault(key, []).append(pf)
    for key, pfs in where.items():
        if len(pfs) > 1:
            problems.append(f"{path}: tensor {key}: expected in one file, found in {', '.join(p.path.name for p in pfs)}")
    want_float, why = _expected_float_dtype(path, config_json, layout, where, problems)
    for key, shape in layout.shapes.items():
        if key not in where:
            problems.append(f"{path}: missing tensor {key}: expected shape {list(shape)} ({layout.architecture}), found in no readable weight file")
            continue
        for pf in where[key]:
            e = pf.entries[key]
            if e.shape != shape:
                problems.append(f"{pf.path}: tensor {key}: shape expected {list(shape)}, found {list(e.shape)}")
            if layout.floating[key] and want_float and e.dtype != want_float:
                problems.append(f"{pf.path}: tensor {key}: dtype expected {want_float} ({why}), found {e.dtype}")
    for key in sorted(set(where) - set(layout.shapes)):
        reason = ("tie_word_embeddings is true, so it must not be stored" if key == layout.output_embedding
                  else f"not a tensor of {layout.architecture} for this config")
        for pf in where[key]:
            problems.append(f"{pf.path}: unexpected tensor {key}: expected absent ({reason}), found {list(pf.entries[key].shape)} {pf.entries[key].dtype}")


def _check_tokenizer(path: Path, vocab_size: int, problems: list[str]) -> None:
    from transformers import AutoTokenizer

    if not any((path / n).is_file() for n in ("tokenizer.json", "vocab.json", "tokenizer.model")):
        problems.append(f"{path}: expected tokenizer files (tokenizer.json / vocab.json / tokenizer.model), found none")
        return
    try:
        n = len(AutoTokenizer.from_pretrained(str(path), trust_remote_code=False))
    except Exception as exc:  # tokenizers raise many types for broken files
        problems.append(f"{path}: expected the tokenizer to load, found an error ({exc})")
        return
    if n > vocab_size:
        problems.append(f"{path / 'config.json'}: vocab_size expected >= {n} (tokenizer size), found {vocab_size}")


def _check_load(path: Path, parsed: dict[str, SafetensorsFile], problems: list[str]) -> None:
    """transformers loads it cleanly, and what it loaded is the bytes on disk."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        model, info = AutoModelForCausalLM.from_pretrained(str(path), dtype="auto", output_loading_info=True,
                                                           trust_remote_code=False, use_safetensors=True)
    except Exception as exc:  # any failure to load is the finding itself
        problems.append(f"{path}: expected transformers to load the model, found {type(exc).__name__}: {exc}")
        return
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        for key in sorted(map(str, info.get(kind) or ())):
            problems.append(f"{path}: transformers load: {kind[:-1].replace('_', ' ')} {key}: expected none, found one")
    for msg in info.get("error_msgs") or ():
        problems.append(f"{path}: transformers load: expected no errors, found {msg}")
    loaded = model.state_dict()
    for pf in parsed.values():
        for key, e in pf.entries.items():
            if key not in loaded:
                continue
            raw = read_tensor_bytes(pf, key)
            want = (torch.frombuffer(bytearray(raw), dtype=ST_TO_TORCH[e.dtype]) if raw
                    else torch.empty(0, dtype=ST_TO_TORCH[e.dtype])).reshape(e.shape)
            got = loaded[key]
            # Compared in the dtype transformers chose: a load-time cast is not corruption.
            if not torch.equal(got, want.to(got.dtype)):
                problems.append(f"{pf.path}: tensor {key}: expected transformers to load the stored values, "
                                f"found different ones")


# Weight formats that unpickle (run code) when loaded: never loaded here, always a finding.
PICKLE_WEIGHTS = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


def _hostile_entries(path: Path, files: list[str]) -> list[str]:
    """Findings about what a checkpoint dir must not hold: pickle weight files anywhere in the tree,
    and a config that asks for remote code (`auto_map`)."""
    problems = [f"{path / rel}: expected safetensors weights only, found a pickle weight file "
                f"(loading it can run code); not loaded" for rel in files if rel.lower().endswith(PICKLE_WEIGHTS)]
    if "config.json" in files:
        try:
            conf = json.loads((path / "config.json").read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError, RecursionError):
            conf = None  # reported by the config check
        if isinstance(conf, dict) and conf.get("auto_map"):
            problems.append(f"{path / 'config.json'}: expected no auto_map, found one naming remote code "
                            f"({', '.join(map(str, conf['auto_map']))[:120]}); remote code is never run here")
    return problems


def verify_checkpoint(path: str | Path, *, load: bool = True) -> list[str]:
    """All problems found in the checkpoint dir `path`; empty means it is intact.

    Only regular files inside `path` are opened (FIFOs, devices and symlinks are findings, never
    read or followed); every safetensors file in the tree (e.g. an RL checkpoint's `adapter/`) is
    parsed; the tokenizer and transformers load run only on a directory with nothing hostile in
    it, with trust_remote_code=False."""
    from transformers import AutoConfig

    path = Path(path)
    if not path.is_dir() or path.is_symlink():
        what = "a symlink" if path.is_symlink() else "a file" if path.exists() else "nothing"
        return [f"{path}: expected a checkpoint directory, found {what}"]
    files, problems = tree_entries(path)
    hostile = bool(problems)
    problems += _hostile_entries(path, files)
    hostile = hostile or bool(problems)
    regular = set(files)
    weight_names, weight_map, meta = _weight_files(path, problems, regular)
    parsed = {name: read_safetensors(path / name) for name in weight_names}
    for pf in parsed.values():
        problems.extend(pf.problems)
    for rel in files:  # safetensors files in sub-folders (adapter/ ...): header and layout
        if "/" in rel and rel.endswith(".safetensors"):
            problems.extend(read_safetensors(path / rel).problems)
    if weight_map is not None:
        _check_index(path, parsed, weight_map, meta, problems)
    config = config_json = None
    if "config.json" not in regular:
        problems.append(f"{path / 'config.json'}: expected a regular file, found none")
    elif not hostile:
        try:
            config_json = json.loads((path / "config.json").read_text(encoding="utf-8"))
            config = AutoConfig.from_pretrained(str(path), trust_remote_code=False)
        except Exception as exc:  # bad JSON, unknown model_type, deep nesting
            problems.append(f"{path / 'config.json'}: expected a loadable model config, found {type(exc).__name__}: "
                            f"{str(exc).splitlines()[0][:200] if str(exc) else ''}")
    if config is not None:
        _check_layout(path, config, config_json, parsed, problems)
        problems.extend(serving_field_problems(path, config, config_json))
    structural = bool(problems)
    problems.extend(p for p in check_sha256sums(path) if p not in problems)
    if config is not None:
        _check_tokenizer(path, int(config.vocab_size), problems)
    if load and config is not None and not structural:
        _check_load(path, parsed, problems)
    return problems


def report(path: str | Path, *, load: bool = True) -> int:
    """Run the checks and print the verdict: one line per problem; 0 iff none."""
    problems = verify_checkpoint(path, load=load)
    for line in problems:
        print(f"FAIL {line}")
    if problems:
        print(f"verify-checkpoint: {path}: {len(problems)} problem(s)")
        return 1
    files, _ = tree_entries(Path(path))
    names, _, _ = _weight_files(Path(path), [], set(files))
    tensors = sum(len(read_safetensors(Path(path) / n).entries) for n in names)
    print(f"verify-checkpoint: {path}: OK, {tensors} tensors in {len(names)} weight file(s)"
          f"{'' if load else ' (transformers load skipped)'}")
    return 0


def verify_main(argv: list[str] | None = None) -> int:
    return run_cli(_main, argv)


KEYS = {  # `verify-checkpoint --help` and docs/keys/verify-checkpoint.md
    "path": text("the checkpoint directory (also as the one positional argument)"),
    "load": flag("false: skip check 6 (loading the model with transformers)", True),
}


def _main(argv: list[str]) -> int:
    if wants_help(argv):
        print(__doc__ + "\nKeys (key=default  description):\n" + fields.help_table(KEYS))
        return 0
    cfg = apply_overrides(OmegaConf.create(fields.defaults(KEYS)), [a for a in argv if "=" in a])
    if bad := fields.problems(KEYS, cfg):
        raise SftError(bad[0])
    paths = [a for a in argv if "=" not in a] + ([cfg.path] if cfg.path else [])
    if len(paths) > 1:
        raise SftError(f"expected one checkpoint PATH, found {len(paths)}: {paths}")
    if not paths:
        raise SftError("expected a checkpoint PATH (verify-checkpoint PATH, or path=PATH)")
    path = Path(paths[0])
    if not path.is_symlink() and not path.is_dir():   # a user mistake, as export-checkpoint's ckpt; a symlink is a finding
        raise SftError(f"{path}: {'is a file, not a checkpoint directory' if path.exists() else 'does not exist'}")
    return report(path, load=cfg.load)


if __name__ == "__main__":
    sys.exit(verify_main())
