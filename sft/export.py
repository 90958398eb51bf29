"""export-checkpoint: a training checkpoint -> a serving copy transformers and vLLM load as is.

    export-checkpoint ckpt=PATH out=PATH [key=value ...]   (every key and its default below)

The input is a step checkpoint (HF model dir) or a run / state dir (its latest
COMPLETE resumable state). The output:
- consolidated safetensors in `dtype`, sharded with `model.safetensors.index.json`
  when larger than `max_shard_size`;
- a tied `lm_head.weight` dropped (only after checking it equals the embedding);
- tensors transformers itself ignores when it loads the architecture (e.g. an older checkpoint's
  per-layer `rotary_emb.inv_freq` buffers) dropped and listed (a note, and `ignored_on_load` in
  `export_info.json`); any other tensor the architecture lacks is refused (exit 2);
- padded vocabulary rows (beyond `vocab_size=N`, else `config.vocab_size`)
  trimmed from every vocab-sized tensor, `config.vocab_size` set to match, and
  checked to cover the tokenizer;
- tokenizer, chat template and generation_config copied, `SHA256SUMS` over every file.
  `tokenizer=DIR|HUB_ID@REV` takes the tokenizer files and chat template from that directory
  or pinned hub revision instead of the source's (e.g. a serving stack pinned to the base
  model's tokenizer); it must fit the trimmed embedding (its length <= the exported
  vocab_size, else exit 2), and its origin and file digests go into `export_info.json`.
The output is written to a temporary sibling dir and renamed when complete, then
checked with verify-checkpoint (`verify=false` skips that); a source removed or changed
while it is read (a trainer pruning its older states) stops the export (exit 2), nothing written. An existing `out` is replaced
only when it is an earlier export (it has `export_info.json`) and `overwrite=true`: it is
renamed aside to `<out>.replaced-<UTC time>`, never deleted; anything else in the way, an `out`
that is or contains the checkpoint, or one inside a run dir's `checkpoints/` or `state/` (it would be
read as a step of that run), is refused (exit 2).
"""
from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf

from common import fields
from common.fields import Test, choice, count, field, flag, text
from common.layout import CHECKPOINTS, CONFIG, STATES
from common.cli import apply_overrides, load_mapping, run_cli, wants_help
from common.io import (SHA256SUMS, atomic_dir, check_output_dir, read_sha256sums, sha256_file, write_json,
                       write_sha256sums)
from sft.ckpt_layout import EXPORT_DTYPES, expected_layout
from sft.export_source import (
    ExportError,
    Source,
    check_source_sums,
    load_source_weights,
    resolve_source,
    source_held,
)
from sft.hfconfig import save_config
from sft.errors import SftError

# Written into every export: what makes a directory this command's output (overwrite=true only
# ever renames such a directory aside).
EXPORT_MARKER = "export_info.json"
KEYS = {  # `export-checkpoint --help` and docs/keys/export-checkpoint.md; each value checked by its rule first (a dry run's too)
    "ckpt": text("a step checkpoint (HF model dir), or a run / state dir (its latest COMPLETE resumable state)"),
    "out": text("the serving copy's directory (written to a temporary sibling, renamed when complete)"),
    "dtype": choice("bf16 | fp16 | fp32: the dtype of the exported weights", "bf16", EXPORT_DTYPES),
    "max_shard_size": field("shard the safetensors above this size (B, KB, MB, GB, TB; KiB, MiB, GiB)", "5GB",
                            rule=Test(lambda v: size_bytes(v) is not None, "a size like 5GB, 500MiB or 1000000")),
    "vocab_size": count("trim padded vocabulary rows beyond this; null -> config.vocab_size", None, (), null=True),
    "tokenizer": text("DIR | HUB_ID@REV: take the tokenizer files and chat template from there (null: the checkpoint's)"),
    "report": text("analyze's out dir: the card shows its results of this checkpoint (null: the card says not evaluated)"),
    "study": text("a study file (name or path): the card lists its notes (what is not reproduced)"),
    "repo_id": field("the hub repo the export is published as: the card's snippets load it (null: from this directory)", None,
                     rule=Test(lambda v: v is None or hub_repo_id(v), "a hub repo id, NAMESPACE/NAME (huggingface_hub's rules)")),
    "overwrite": flag("true: an earlier export at out is renamed aside to <out>.replaced-<UTC time>", False),
    "verify": flag("run verify-checkpoint on the result", True),
    "dry_run": flag("true: print the config and the resolved source, write nothing", False),
}
DEFAULTS = fields.defaults(KEYS)

# Tokenizer / chat template / generation files carried over verbatim. Allowlists, so
# optimizer states or training leftovers in a checkpoint dir never reach the serving copy;
# `tokenizer=` replaces the TOKENIZER_CARRY files, the generation config stays the source's.
TOKENIZER_CARRY = re.compile(
    r"^(tokenizer.*|special_tokens_map\.json|added_tokens\.json|vocab\.(json|txt)|merges\.txt"
    r"|chat_template\.(jinja|json)|.*\.model)$"
)
CARRY_FILES = re.compile(rf"^(generation_config\.json|{TOKENIZER_CARRY.pattern[1:-1]})$")
TOKENIZER_FILES = re.compile(r"^(tokenizer\.json|tokenizer\.model|vocab\.(json|txt)|.*\.model)$")

_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
               "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def hub_repo_id(value) -> bool:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(value)
    except HFValidationError:
        return False
    return isinstance(value, str)


def size_bytes(value) -> int | None:
    """`5GB` (10^9), `500MiB` (2^20), or a plain byte count -> bytes; None when it is none of those."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(value))
    unit = m.group(2).upper() if m else None
    if not m or unit not in _SIZE_UNITS or float(m.group(1)) * _SIZE_UNITS[unit] < 1:
        return None
    return int(float(m.group(1)) * _SIZE_UNITS[unit])


def _load_tokenizer(d: Path):
    from transformers import AutoTokenizer

    if not any(TOKENIZER_FILES.match(p.name) for p in d.iterdir()):
        raise ExportError(f"{d}: no tokenizer files (tokenizer.json / vocab.json / *.model); a serving copy must carry its tokenizer")
    try:
        return AutoTokenizer.from_pretrained(str(d), trust_remote_code=False)
    except Exception as exc:  # tokenizers raise many types for broken files
        raise ExportError(f"{d}: tokenizer does not load ({exc})") from exc


def ignored_on_load(config, keys: list[str], where: str) -> list[str]:
    """Those of `keys` (tensors the architecture of `config` lacks) that transformers' own loading of it ignores (its
    ignore patterns, legacy buffers such as per-layer `rotary_emb.inv_freq`), by its public loading report:
    `from_pretrained(output_loading_info=True)` of `config` with a file of these keys alone (1-element placeholders),
    on the meta device (no weight allocated). A key it loads into the model under another name is not ignored: then
    none is, and the caller refuses each as an unexpected tensor."""
    if not keys:
        return []
    import tempfile

    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    verbosity, bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()   # its report lists every weight of the model as missing: not the user's news
    hf_logging.disable_progress_bar()
    try:
        with tempfile.TemporaryDirectory(prefix="dtsft-export-keys-") as tmp:
            config.save_pretrained(tmp)
            save_file({k: torch.zeros(1) for k in keys}, str(Path(tmp) / "model.safetensors"), metadata={"format": "pt"})
            model, info = AutoModelForCausalLM.from_pretrained(tmp, output_loading_info=True, device_map="meta", use_kernels=False,
                                                               ignore_mismatched_sizes=True, local_files_only=True)
    except Exception as exc:  # any failure of the report is the user's one-line error
        why = (str(exc).strip().splitlines() or [""])[0]
        raise ExportError(f"{where}: transformers' loading report for the {len(keys)} tensor(s) the architecture lacks "
                          f"(e.g. {keys[0]}) failed ({type(exc).__name__}: {why})") from exc
    finally:
        hf_logging.set_verbosity(verbosity)
        if bar:
            hf_logging.enable_progress_bar()
    if info["mismatched_keys"] or not {n for n, _ in model.named_parameters()} <= set(info["missing_keys"]):
        return []
    return sorted(set(keys) - set(info["unexpected_keys"]))


def prepare_state_dict(sd: dict[str, torch.Tensor], config, *, vocab_size: int, tokenizer_len: int,
                       where: str) -> tuple[dict[str, torch.Tensor], list[str], list[str]]:
    """Trim padded vocab rows, drop a verified tied lm_head and the tensors transformers ignores on load, and check
    the key set and shapes.

    `config.vocab_size` is set to `vocab_size` first so the expected shapes are the serving ones.
    Returns the state dict in the architecture's order, notes on what changed and the tensors ignored on load.
    """
    notes = []
    if tokenizer_len > vocab_size:
        raise ExportError(f"{where}: vocab_size {vocab_size} is smaller than the tokenizer ({tokenizer_len} tokens); "
                          f"trimming would drop real tokens")
    config.vocab_size = vocab_size
    layout = expected_layout(config)
    sd = dict(sd)
    for key in layout.vocab_keys:
        if key not in sd:
            continue
        rows = sd[key].shape[0]
        if rows < vocab_size:
            raise ExportError(f"{where}: tensor {key}: expected at least {vocab_size} rows (vocab_size), found {rows}")
        if rows > vocab_size:
            sd[key] = sd[key][:vocab_size]
            notes.append(f"trimmed {rows - vocab_size} padded vocab rows from {key} ({rows} -> {vocab_size})")
    out_key = layout.output_embedding
    if layout.tied and out_key in sd:
        emb, head = sd[layout.input_embedding], sd[out_key]
        if head.shape != emb.shape or not torch.equal(head, emb):
            diff = (head.float() - emb.float()).abs().max().item() if head.shape == emb.shape else "shape"
            raise ExportError(f"{where}: tie_word_embeddings is true but {out_key} differs from "
                              f"{layout.input_embedding} (max abs diff {diff}); refusing to drop it")
        del sd[out_key]
        notes.append(f"dropped {out_key}: tied to {layout.input_embedding} and equal to it")
    if ignored := ignored_on_load(config, [k for k in sd if k not in layout.shapes], where):
        sd = {k: v for k, v in sd.items() if k not in ignored}
        notes.append(f"dropped {len(ignored)} tensor(s) {layout.architecture} ignores on load: {', '.join(ignored)}")
    missing = [k for k in layout.shapes if k not in sd]
    extra = sorted(k for k in sd if k not in layout.shapes)
    bad_shape = [f"{k} expected {list(s)} found {list(sd[k].shape)}"
                 for k, s in layout.shapes.items() if k in sd and tuple(sd[k].shape) != s]
    if missing or extra or bad_shape:
        lines = [f"missing tensor {k}" for k in missing] + [f"unexpected tensor {k}" for k in extra]
        lines += [f"tensor {b}" for b in bad_shape]
        raise ExportError(f"{where}: weights do not match {layout.architecture} for this config:\n  " + "\n  ".join(lines))
    if ints := [k for k in layout.shapes if not sd[k].is_floating_point()]:   # these architectures' weights are all float
        raise ExportError(f"{where}: tensor {ints[0]}: stored as {sd[ints[0]].dtype}, not floating point "
                          f"({len(ints)} such tensor(s)); a quantized or mislabelled checkpoint is not exported")
    if getattr(config, "architectures", None) != [layout.architecture]:  # vLLM picks its class from this
        notes.append(f"config architectures {getattr(config, 'architectures', None)} -> [{layout.architecture!r}]")
        config.architectures = [layout.architecture]
    return {k: sd[k] for k in layout.shapes}, notes, ignored


def plan_shards(sizes: dict[str, int], max_bytes: int) -> list[list[str]]:
    """Greedy, in order: start a new shard when the next tensor would overflow this one.
    A tensor larger than `max_bytes` gets a shard of its own."""
    shards, cur, cur_bytes = [], [], 0
    for k, n in sizes.items():
        if cur and cur_bytes + n > max_bytes:
            shards.append(cur)
            cur, cur_bytes = [], 0
        cur.append(k)
        cur_bytes += n
    if cur:
        shards.append(cur)
    return shards


def write_weights(sd: dict[str, torch.Tensor], out: Path, dtype: torch.dtype, max_bytes: int) -> list[str]:
    """Write the shards (cast one shard at a time, so peak memory is one shard) and the index."""
    from safetensors.torch import save_file
    from tqdm import tqdm

    sizes = {k: t.numel() * dtype.itemsize for k, t in sd.items()}   # prepare_state_dict let only floating-point ones through
    shards = plan_shards(sizes, max_bytes)
    n = len(shards)
    names = ["model.safetensors"] if n == 1 else [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    for name, keys in tqdm(list(zip(names, shards)), desc="writing shards", disable=n < 2):
        # clone: a trimmed row slice still shares storage with the padded original.
        save_file({k: sd[k].to(dtype).contiguous().clone() for k in keys}, str(out / name), metadata={"format": "pt"})
        # The library writes 0600; give shards the umask-derived mode the config file got.
        if (out / "config.json").is_file():
            shutil.copymode(out / "config.json", out / name)
    if n > 1:
        weight_map = {k: name for name, keys in zip(names, shards) for k in keys}
        write_json(out / "model.safetensors.index.json",
                   {"metadata": {"total_size": sum(sizes.values())}, "weight_map": dict(sorted(weight_map.items()))})
    return names


@dataclass(frozen=True)
class TokenizerOverride:
    """`tokenizer=`: where its files come from (`dir`) and what the export records of it."""
    spec: str
    dir: Path
    revision: str | None

    def files(self) -> list[Path]:
        return [p for p in sorted(self.dir.iterdir()) if p.is_file() and TOKENIZER_CARRY.match(p.name)]


def _checked(t: TokenizerOverride) -> TokenizerOverride:
    if not any(TOKENIZER_FILES.match(p.name) for p in t.files()):
        raise SftError(f"tokenizer: {t.spec} ({t.dir}) has no tokenizer files (tokenizer.json / vocab.json / *.model)")
    return t


def resolve_tokenizer(spec: str) -> TokenizerOverride:
    """A local tokenizer dir, or `HUB_ID@REV` fetched (tokenizer files only) from the hub at that revision."""
    spec = str(spec)
    if Path(spec).is_dir():
        return _checked(TokenizerOverride(spec, Path(spec).resolve(), None))
    repo, sep, rev = spec.partition("@")
    if not sep or not repo or not rev:
        what = "a file" if Path(spec).exists() else "no such directory"
        raise SftError(f"tokenizer: {spec!r} is {what}; expected a tokenizer directory or a pinned hub id HUB_ID@REV")
    from huggingface_hub import snapshot_download

    try:
        local = snapshot_download(repo_id=repo, revision=rev, allow_patterns=[
            "tokenizer*", "special_tokens_map.json", "added_tokens.json", "vocab.*", "merges.txt", "chat_template.*", "*.model"])
    except Exception as exc:  # offline, unknown repo or revision: the hub library raises many types
        raise SftError(f"tokenizer: cannot fetch {repo} at revision {rev} from the hub ({type(exc).__name__}: {exc})") from exc
    return _checked(TokenizerOverride(spec, Path(local), rev))


def _copy_carry_files(src: Path, out: Path, config, tokenizer: TokenizerOverride | None = None) -> list[str]:
    notes = []
    for p in sorted(src.iterdir()):
        if p.is_file() and CARRY_FILES.match(p.name) and not (tokenizer and TOKENIZER_CARRY.match(p.name)):
            shutil.copy2(p, out / p.name)
    if tokenizer is not None:
        for p in tokenizer.files():
            shutil.copy2(p, out / p.name)
        notes.append(f"tokenizer files from {tokenizer.spec} ({', '.join(p.name for p in tokenizer.files())}), not from {src}")
    if not (out / "generation_config.json").exists():
        from transformers import GenerationConfig

        GenerationConfig.from_model_config(config).save_pretrained(str(out))
        notes.append(f"{src} has no generation_config.json; wrote one derived from config.json")
    return notes


def write_card(source: Path, out: Path, *, report=None, study=None, repo_id: str | None = None) -> None:
    """The export's README.md (common.cards), then its line added to SHA256SUMS (the other files were
    hashed once, before the card that lists their digests)."""
    from common.cards import CARD, CardError, checkpoint_card

    try:
        card = checkpoint_card(source, report=report, study=study, export=out, repo_id=repo_id)
    except CardError as exc:
        raise SftError(f"report: {exc}") from None
    (out / CARD).write_text(card, encoding="utf-8")
    entries, _ = read_sha256sums(out)
    entries[CARD] = sha256_file(out / CARD)
    (out / SHA256SUMS).write_text("".join(f"{d}  {n}\n" for n, d in sorted(entries.items())), encoding="utf-8")


def export_checkpoint(ckpt, out, *, dtype: str = "bf16", max_shard_size="5GB", vocab_size: int | None = None,
                      tokenizer: str | None = None, overwrite: bool = False, report=None, study=None,
                      repo_id: str | None = None) -> dict:
    """Export `ckpt` to `out` (the values as KEYS' rules allow them); returns a summary (source, step, files, notes)."""
    from transformers import AutoConfig

    out = Path(out)
    src: Source = resolve_source(ckpt)
    if out.resolve().is_relative_to(src.path.resolve()):
        raise SftError(f"out: {out} is inside the checkpoint being exported ({src.path})")
    for d in out.resolve().parents:   # a run's step dirs: an export there would be read as one of its checkpoints or states
        if d.name in (CHECKPOINTS, STATES) and (d.parent / CONFIG).is_file():
            raise SftError(f"out: {out} is inside the run dir {d.parent}'s {d.name}/, where its steps are read from; "
                           "choose a dir outside it (e.g. exports/)")
    check_output_dir(out, overwrite=overwrite, marker=EXPORT_MARKER, sources=[ckpt, src.path])
    check_source_sums(src)
    from common.cards import check_inputs

    check_inputs(report, study)
    with source_held(src, out) as unchanged:   # a state the trainer prunes meanwhile: one line, nothing written
        config = AutoConfig.from_pretrained(str(src.hf_dir), trust_remote_code=False)
        override = resolve_tokenizer(tokenizer) if tokenizer is not None else None
        tok = _load_tokenizer(override.dir if override else src.hf_dir)
        target_vocab = int(vocab_size) if vocab_size is not None else int(config.vocab_size)
        if override is not None and len(tok) > target_vocab:
            raise SftError(f"tokenizer: {override.spec} has {len(tok)} tokens, more than the exported embedding's "
                           f"{target_vocab} rows (vocab_size); its ids beyond {target_vocab - 1} would have no embedding")
        sd = load_source_weights(src)
        sd, notes, ignored = prepare_state_dict(sd, config, vocab_size=target_vocab, tokenizer_len=len(tok), where=str(src.path))
        torch_dtype = EXPORT_DTYPES[dtype]
        config.dtype = torch_dtype
        with atomic_dir(out, existing="aside") as tmp:
            save_config(config, tmp)  # first: write_weights copies its file mode
            files = write_weights(sd, tmp, torch_dtype, size_bytes(max_shard_size))
            notes += _copy_carry_files(src.hf_dir, tmp, config, override)
            if getattr(tok, "chat_template", None) is None:
                notes.append(f"{override.dir if override else src.hf_dir}: the tokenizer has no chat template; the serving copy has none either")
            info = {"source": os.path.abspath(src.path), "kind": src.kind, "step": src.step, "dtype": dtype, "vocab_size": target_vocab,
                    "tensors": len(sd), "trimmed": [n for n in notes if n.startswith("trimmed ")], "ignored_on_load": ignored}
            if override is not None:
                info["tokenizer"] = {"spec": override.spec, "path": str(override.dir), "revision": override.revision,
                                     "tokens": len(tok), "files": {p.name: sha256_file(p) for p in override.files()}}
            write_json(tmp / EXPORT_MARKER, info)
            write_sha256sums(tmp)
            write_card(src.path, tmp, report=report, study=study, repo_id=repo_id)
            unchanged()   # the card's digest and every file copied are of the source as it was throughout
    return dict(source=os.path.abspath(src.path), kind=src.kind, step=src.step, out=str(out), dtype=str(torch_dtype),
                vocab_size=target_vocab, tensors=len(sd), weight_files=files, notes=src.notes + notes)


def export_main(argv: list[str] | None = None) -> int:
    return run_cli(_main, argv)


def checked(cfg, required: str = "ckpt=PATH and out=PATH are required (see --help)"):
    """`cfg` (KEYS) with every value checked by its key's rule, then ckpt and out given (else SftError `required`)."""
    if bad := fields.problems(KEYS, cfg):
        raise SftError("; ".join(bad))
    if not cfg.ckpt or not cfg.out:
        raise SftError(required)
    return cfg


def _main(argv: list[str]) -> int:
    if wants_help(argv):
        print(__doc__ + "\nKeys (key=default  description):\n" + fields.help_table(KEYS))
        return 0
    if len(argv) == 1 and "=" not in argv[0] and Path(argv[0]).is_file():   # a resolved config (a study's export job)
        held = load_mapping(argv[0], SftError, "not YAML", "not a mapping of export-checkpoint's keys")
        if unknown := sorted(map(str, set(held) - set(KEYS))):
            raise SftError(f"{argv[0]}: unknown key(s): {', '.join(unknown)} (export-checkpoint --help lists its keys)")
        cfg = OmegaConf.merge(OmegaConf.create(DEFAULTS), held)
    else:
        cfg = apply_overrides(OmegaConf.create(DEFAULTS), argv)
    checked(cfg)
    if cfg.dry_run:
        src = resolve_source(cfg.ckpt)
        print(OmegaConf.to_yaml(cfg), end="")
        tok_from = resolve_tokenizer(cfg.tokenizer).dir if cfg.tokenizer is not None else src.hf_dir
        print(f"source: {src.kind} {src.path} (step {src.step}); config from {src.hf_dir}, tokenizer from {tok_from}")
        return 0
    summary = export_checkpoint(cfg.ckpt, cfg.out, dtype=cfg.dtype, max_shard_size=cfg.max_shard_size,
                                vocab_size=cfg.vocab_size, tokenizer=cfg.tokenizer, overwrite=cfg.overwrite,
                                report=cfg.report, study=cfg.study, repo_id=cfg.repo_id)
    for note in summary["notes"]:
        print(f"note: {note}")
    print(f"exported {summary['tensors']} tensors ({summary['dtype']}, vocab {summary['vocab_size']}) "
          f"from {summary['kind']} {summary['source']} to {summary['out']}: {', '.join(summary['weight_files'])}")
    if cfg.verify:
        from sft.verify import report

        return report(cfg.out)
    return 0


if __name__ == "__main__":
    sys.exit(export_main())
