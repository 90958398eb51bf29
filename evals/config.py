"""The `evaluate` configuration: defaults, validation and the default output directory."""
from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from omegaconf import DictConfig, ListConfig, OmegaConf

from common import fields, layout, schema
from common.benchmarks import BenchError, canonical_bench_key, parse_bench_key
from common.cli import apply_overrides, did_you_mean, load_mapping
from common.fields import CONTENT, ENGINE, IDENTITY, NONEMPTY, PATH, Number, Test, choice, count, field, flag, number, problems, text
from common.tiny import resolve_model_path
from evals.benches import OOD_BENCH, SEARCH7, bench_source
from evals.retrievers import retriever_problem
from evals.profiles import load_profile
from common.prompts import PROMPTS
from evals.errors import EvalError
from evals.registry import bench_name_problem, env_benches, kind_of, uses_retriever

# Every evaluate key, defined once (common.fields; evals.identity derives the evaluation identity from the roles).
_ID, _CONTENT, _ENGINE = (IDENTITY,), (CONTENT,), (ENGINE,)
_PATH_ID, _PATH_CONTENT = (IDENTITY, PATH), (CONTENT, PATH)
# an output directory (evaluate's out, analyze's anchor_dir): null, or a path that is not a file
DIRECTORY = Test(lambda v: v is None or (NONEMPTY.ok(v) and (Path(v).is_dir() or not Path(v).exists())), "null or a directory")

KEYS = {
    "ckpt": text("HF model dir (a run's checkpoints/step-NNNNNN, or any model dir / hub id)", roles=_PATH_CONTENT),
    "tokenizer": text("null -> the checkpoint's own tokenizer; `tiny` -> the embedded one", roles=_PATH_ID),
    "benches": field("NAME[@MODE], MODE open (default) | item | given, e.g. musique@given", [*SEARCH7, OOD_BENCH], _CONTENT,
                     Test(lambda v: isinstance(v, (list, ListConfig)) and len(v) > 0, "a non-empty list such as [nq,babyai]")),
    "n": number("items per bench (seeded shuffle, first n); <=0 -> all", 500, _CONTENT, integer=True),
    "bench_n": field("per-bench n, e.g. {musique: 0, babyai: 50}; a bench not named takes n", {}, _CONTENT,
                     Test(lambda v: v is None or isinstance(v, Mapping), "a mapping such as {musique: 0, babyai: 50}")),
    "profile": text("recipes/eval/<profile>.yaml: its keys under the command line's; out -> eval/<profile>/"),
    "seed": count("seed of the item shuffle (which n items) and of sampling", 42, _CONTENT, lo=0),
    "backend": choice("hf | vllm", "hf", ("hf", "vllm")),
    "retriever": choice("bm25 | e5 (dense, as Search-R1: evals.dense) | http", "bm25", ("bm25", "e5", "http"), _ID, hint=True),
    "corpus": text("wiki-18 style jsonl for retriever=bm25 or e5, or a fetched corpus by name (corpus:wiki18_example_10)", roles=_PATH_CONTENT),
    "encoder": text("retriever=e5: the E5 encoder: a fetched name (encoder:e5-base-v2, from the data cache: fetch-data), an "
                    "HF model dir or hub id", "encoder:e5-base-v2", _PATH_CONTENT),
    "index": text("retriever=e5: a faiss IndexFlatIP whose row i is corpus line i: a fetched name (index:wiki18_e5_flat, "
                  "Search-R1's e5_Flat.index of corpus:wiki18) or a file, memory-mapped; null -> built from the corpus "
                  "(small corpora) under index_dir", roles=_PATH_CONTENT),
    "encoder_device": text("retriever=e5: where the encoder runs: cpu | auto | cuda | cuda:N (fp16 on CUDA, as Search-R1)",
                           "cpu"),   # enters the identity as the encoder's dtype (evals.identity)
    "index_dir": text("retriever index cache root; null -> ~/.cache/dtsft/bm25 (bm25) or ~/.cache/dtsft/e5 (e5)", roles=(PATH,)),
    "retriever_url": text("http://HOST:PORT/retrieve for retriever=http", roles=_ID),
    "retriever_timeout": number("seconds per retriever=http request", 30.0, lo=0, lo_open=True),
    "retriever_retries": count("retries of a failed retriever=http request", 3, (), lo=0),
    "topk": count("documents returned per search call", 3),
    "max_turns": count("assistant turns per episode", 8),
    "max_model_len": count("prompt + generation tokens; beyond -> stop reason context_limit", 16384),
    "max_new_tokens": count("per assistant turn", 4096),
    "prompt": choice("tool_agent | anchor_nudge", "tool_agent", PROMPTS, _ID),
    "tool_style": choice("auto (from the chat template) | qwen3 | llama3", "auto", ("auto", "qwen3", "llama3"), _ID),
    "enable_thinking": schema.ENABLE_THINKING,   # GRPO's grpo.enable_thinking too
    "sets": field("per-bench named item set, e.g. {nq: 'nq:seed42_1000', musique@given: 'musique:hub_ans_dev'}; a bench not "
                  "named reads evals.benches.DEFAULT_SETS (fetched into $DTSFT_DATA on first use; `fetch-data --help`)", {},
                  _CONTENT, Test(lambda v: v is None or isinstance(v, Mapping), "a mapping such as {nq: 'nq:seed42_1000'}")),
    "bench_root": text("your own files: dir with <bench>/*.jsonl (every bench must be there); null -> the named sets", roles=_PATH_CONTENT),
    "heldout": text("benches tf_code / tf_search (teacher-forced loss by span, backend=hf): a `data-prep heldout` dir", roles=_PATH_CONTENT),
    "out": field("null -> <run_dir>/eval/step-NNNNNN for a checkpoint inside a run", None, (PATH,), DIRECTORY),
    "batch_size": count("episodes advanced in lockstep (and written) together", 64, ()),
    "micro_batch": count("hf backend: sequences per generate call", 16, ()),
    "driver": choice("auto (async for backend=vllm, lockstep for hf) | lockstep (batch_size episodes per batched generate) | "
                     "async (one coroutine per episode over vLLM's AsyncLLM, every bench pooled)", "auto",
                     ("auto", "lockstep", "async")),
    "max_in_flight": number("driver=async: episodes in play at once; auto = min(2 x the engine's max_num_seqs, 4 x KV-cache "
                            "tokens / max_model_len), at least 1", "auto", lo=1, integer=True, words=("auto",)),
    "tool_batch_window_ms": number("driver=async: tool calls arriving within this many ms go to one retriever call", 5.0, lo=0),
    "tool_batch_size": count("driver=async: a tool batch goes out at once when this many calls wait", 64, ()),
    "device": field("auto (cuda when available, else cpu) | a torch device: cuda, cuda:1, cpu", "auto", rule=NONEMPTY),
    "dtype": choice("auto (hf: bf16 on CUDA, fp32 on CPU; vllm: see evals.backends) | float32 | bfloat16 | float16", "auto",
                    ("auto", "float32", "bfloat16", "float16"), _ENGINE),
    "tensor_parallel_size": count("vllm: GPUs one model is split over", 1, ()),
    "data_parallel": count("engine processes, one per GPU (x tensor_parallel_size), each a shard of the items; rows merged in "
                           "item order (evals.parallel)", 1, ()),
    "shard": field("internal, set by data_parallel=N for its processes: I/N evaluates items I, I+N, ...", None, rule=Test(
        lambda v: v is None or bool((m := re.fullmatch(r" *(\d+) */ *(\d+) *", str(v))) and int(m[1]) < int(m[2])),
        "I/N with 0 <= I < N (set by data_parallel=N for its processes, evals.parallel)")),
    "gpu_memory_utilization": number("vllm: fraction of GPU memory vLLM may take; auto = 0.9 on CUDA, on CPU the KV cache is "
                                     "sized instead (evals.backends)", "auto", lo=0, hi=1, lo_open=True, words=("auto",)),
    "enforce_eager": choice("vllm: auto = true on CPU, false on CUDA (CUDA graphs)", "auto", ("auto", True, False), _ENGINE),
    "prefix_caching": flag("vllm: reuse the KV cache of shared prompt prefixes", True, _ENGINE),
    "ood_max_turns": count("search_plan_ood needs ~10 tool calls even when done perfectly", 24),
    "ood_split": choice("search_plan_ood environment split (envs: train | ood)", "ood", ("train", "ood"), _ID),
    "skip_empty_golds": flag("true: gold aliases that normalize to nothing (NQ's `*`, `---`) are not scored against; false "
                             "(default) = Search-R1's scoring; counted either way", False, _ID),
    "babyai_max_steps": count("BALROG's max_steps_per_episode: ends an episode early (the reward scale stays the level's)",
                              None, null=True),   # null: the level's own
    "babyai_max_new_tokens": count("one babyai reply (BALROG's max_tokens; thinking models reason at length)", 8192),
    "babyai_temperature": number("BALROG's default sampling temperature; 0 -> greedy", 1.0, _ID, lo=0),
    "babyai_samples": count("plays of each babyai episode, each with its own random streams", 1),
    "progress": flag("a progress bar on stderr", True),
    "overwrite": flag("a bench held in out under another identity: rename its results aside, re-evaluate", False),
    "wandb": choice("auto: to the run's wandb run when it would upload | true | false (evals.wandb_log)", "auto", ("auto", True, False)),
    "wandb_group": text("group of the eval run of a model outside a run dir; null -> $WANDB_RUN_GROUP"),
    "dry_run": flag("true: print the resolved config and exit; evaluate nothing", False),
}
DEFAULTS = fields.defaults(KEYS)


def base_config(profile: str | None = None) -> DictConfig:
    """DEFAULTS with the profile's `evaluate` keys on top (what command-line keys then override)."""
    base = OmegaConf.create(DEFAULTS)
    return OmegaConf.merge(base, load_profile(profile)["evaluate"], {"profile": profile}) if profile else base


def load_config(path: Path, command: str, what: str) -> DictConfig:
    """The mapping config file `path` holds (`COMMAND CONFIG` runs the `what` in it), else a one-line EvalError."""
    return load_mapping(path, EvalError, "not YAML", f"not a mapping of {command}'s keys",
                        hint=f" ({command} CONFIG runs the {what} a config file holds; else give key=value settings)")


def bench_keys(benches, what: str = "benches") -> list[str]:
    """`benches` (the names key `what` lists) as their canonical keys (`musique@open` is `musique`: one name per bench
    and context mode, as evaluate writes it), each once; an EvalError naming a malformed one, or one named twice."""
    keys = []
    for raw in benches:
        try:
            keys.append(key := canonical_bench_key(str(raw)))
        except BenchError as exc:
            raise EvalError(f"{what}: {exc}") from None
        if key in keys[:-1]:
            first = benches[keys.index(key)]
            raise EvalError(f"{what}: {raw!r} is listed twice" if first == raw else
                            f"{what}: {first} and {raw} name the same bench ({key}); give it once")
    return keys


def _per_bench(key: str, profile, user, benches: list[str], bench_root) -> dict:
    """`key` (bench_n, sets) of the benches being run: the profile's entries for those, the caller's on top (a config
    built on the profile's keys carries them all: those are the profile's); a caller's entry for a bench not being run
    is refused (it would do nothing), as is one source naming a bench twice (`nq` and `nq@open`)."""
    def read(value) -> dict:   # {bench key: n or set name}, each checked
        entries = []
        for bench, v in (value or {}).items():
            if v is None and ":" in str(bench):   # YAML reads the unspaced `{babyai:5}` as `babyai:5`
                bench, v = str(bench).split(":", 1)
                v = int(v) if key == "bench_n" and v.strip().lstrip("-").isdigit() else v
            bench = str(bench).strip()
            if key == "bench_n" and not Number(lo=0, integer=True).ok(v):
                raise EvalError(f"bench_n.{bench}={v!r}: expected an integer >= 0 (0 = every item)")
            if key == "sets" and not (isinstance(v, str) and v.strip()):
                raise EvalError(f"sets.{bench}={v!r}: expected the name of one of its item sets")
            entries.append((bench, v))
        keys = bench_keys([bench for bench, _ in entries], key)
        for k, (bench, _) in zip(keys, entries):
            if key == "bench_n" and (why := bench_name_problem(k, bench_root)):
                raise EvalError(f"bench_n.{bench}: {why}")
        return {k: v for k, (_, v) in zip(keys, entries)}

    own = {b: v for b, v in (user or {}).items() if (b, v) not in (profile or {}).items()}   # the caller's own
    profile, own = read(profile), read(own)
    for k in own:
        if key == "sets" and k in env_benches():
            raise EvalError(f"sets.{k}: {k} brings its own environment (no item set), so this entry would select nothing")
        if k not in benches:
            modes = [b for b in benches if parse_bench_key(b)[0] == parse_bench_key(k)[0]]
            hint = f" (a {key} key names the bench with its context mode: {', '.join(modes)})" if modes else ""
            raise EvalError(f"{key}.{k}: {k} is not being run (benches: {', '.join(benches)}), so this entry would "
                            f"{'size' if key == 'bench_n' else 'select'} nothing{hint}")
    return {**{k: v for k, v in profile.items() if k in benches}, **own}


class Resolved(NamedTuple):
    """An evaluate config resolved once (resolve with engine=True, then for_checkpoint) and its checkpoint's identity
    (None: not computed yet), which evals.run's `evaluate` and `to_evaluate` take as they are, resolving nothing again."""

    cfg: DictConfig
    ckpt_id: dict | None = None


def for_checkpoint(settings: DictConfig, ckpt: str, out: str, benches: list[str], prompt: str,
                   overwrite: bool | None = None) -> DictConfig:
    """One checkpoint's resolved config, made from `settings` (what resolve gave for every evaluation of an analysis,
    its ckpt and out stand-ins) without resolving again: `benches` (among the settings') are checked (`prompt`: analyze's)."""
    if unknown := [b for b in benches if b not in settings.benches]:
        raise EvalError(f"benches {unknown}: not among the resolved settings' ({', '.join(settings.benches)})")
    cfg = settings.copy()
    cfg.ckpt, cfg.out, cfg.prompt, cfg.benches = resolve_model_path(str(ckpt)), str(out), prompt, list(benches)
    cfg.overwrite = bool(settings.overwrite if overwrite is None else overwrite)
    for key in ("bench_n", "sets"):   # the benches' own entries
        cfg[key] = {b: v for b, v in settings[key].items() if b in benches}
    return cfg


def from_argv(argv: list[str], suggest: tuple[str, ...] = ()) -> DictConfig:
    """evaluate's `key=value` tokens over its defaults and those of the `profile=` they name, resolved;
    `bench_n.BENCH=` and `sets.BENCH=` may name any bench (`suggest`: further keys a typo may have meant)."""
    profile = next((a.split("=", 1)[1] for a in reversed(argv) if a.startswith("profile=")), None)
    return resolve(apply_overrides(base_config(profile or None), argv, open_prefixes=("bench_n.", "sets."), suggest=suggest), engine=True)


def resolve(cfg: DictConfig | dict, engine: bool = False) -> DictConfig:
    """Defaults (+ the profile's keys) + `cfg`, checked; unknown keys and bad values are ConfigErrors. `engine`: a request
    that builds its own engine (the command line, analyze) is also refused, before any work, for one it cannot build
    (a caller passing its own engine is checked against that engine: evals.run.resolve_driver)."""
    user = OmegaConf.create(cfg) if isinstance(cfg, dict) else cfg
    base = base_config(user.get("profile"))
    if unknown := [key for key in user if key not in base]:
        raise EvalError(f"unknown evaluate key {unknown[0]!r}.{did_you_mean(str(unknown[0]), list(base))}")
    try:
        merged = OmegaConf.merge(base, user)
    except Exception as exc:   # a mapping for a list or a list for a mapping: its rule names the key
        raise EvalError("; ".join(problems(KEYS, user)) or f"bad evaluate config: {exc}") from exc
    if isinstance(merged.benches, str):
        merged.benches = [merged.benches]
    if bad := problems(KEYS, merged):
        raise EvalError("; ".join(bad))
    if not merged.ckpt:
        raise EvalError("ckpt=PATH is required (a Hugging Face model directory)")
    merged.ckpt = resolve_model_path(str(merged.ckpt))   # `tiny-base`: the embedded model, as launch names it
    merged.benches = benches = bench_keys(merged.benches)
    for key in benches:   # an env bench takes no mode
        if (name := parse_bench_key(key)[0]) in env_benches() and key not in env_benches():
            raise EvalError(f"bench {key!r}: {name} brings its own environment and has no context mode")
        if why := bench_name_problem(key, merged.bench_root):
            raise EvalError(f"benches: {why}")
    merged.sets = _per_bench("sets", base.sets, user.get("sets"), benches, merged.bench_root)
    for bench in benches:   # a missing or ambiguous bench file, an unknown set: up front (no network)
        if bench not in env_benches():
            bench_source(bench, merged.bench_root, resolve=False, sets=merged.sets)
    if tf := [b for b in merged.benches if kind_of(b).scores]:
        if merged.backend != "hf":
            raise EvalError(f"benches {tf} are teacher-forced losses (the model's logits): backend=hf only, not "
                            f"backend={merged.backend}; evaluate them in a call of their own")
        if not merged.heldout:
            raise EvalError(f"benches {tf} need heldout=DIR (a `data-prep heldout` dir)")
        if not Path(merged.heldout).is_dir():
            raise EvalError(f"heldout={merged.heldout}: no such directory")
    merged.bench_n = _per_bench("bench_n", base.bench_n, user.get("bench_n"), merged.benches, merged.bench_root)
    if qa := [b for b in merged.benches if uses_retriever(b)]:
        if why := retriever_problem(merged.retriever, merged.corpus, merged.index, merged.encoder, merged.retriever_url):
            raise EvalError(f"benches {qa}: {why}")
    if merged.out is None:
        if (where := layout.checkpoint_of(merged.ckpt)) is None:
            raise EvalError(f"ckpt={merged.ckpt} is not <run_dir>/checkpoints/step-NNNNNN; pass out=DIR")
        merged.out = str(layout.eval_dir(*where, merged.profile))
    if engine and merged.driver == "async" and merged.backend != "vllm":   # AsyncLLM is vLLM's
        raise EvalError("driver=async needs an asynchronous engine: backend=vllm (vLLM's AsyncLLM); "
                        f"backend={merged.backend} runs driver=lockstep (or driver=auto)")
    return merged
