"""The `evaluate` configuration: defaults, validation and the default output directory."""
from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf

from common import datafetch, keydoc, layout, thinking
from common.benchmarks import BenchError, canonical_bench_key, parse_bench_key
from common.cli import did_you_mean
from common.schema import Number
from common.tiny import resolve_model_path
from evals.benches import ENV_BENCHES, HUB_CONTEXT, HUB_SPLITS, OOD_BENCH, SEARCH7, TF_BENCHES, bench_source
from evals.profiles import load_profile
from common.prompts import PROMPTS
from evals.errors import EvalError

KEYS = {  # key: (default, description): `evaluate --help` and docs/keys/evaluate.md are rendered from it
    "ckpt": (None, "HF model dir (a run's checkpoints/step-NNNNNN, or any model dir / hub id)"),
    "tokenizer": (None, "null -> the checkpoint's own tokenizer; `tiny` -> the embedded one"),
    "benches": ([*SEARCH7, OOD_BENCH], "NAME[@MODE], MODE open (default) | item | given, e.g. musique@given"),
    "n": (500, "items per bench (seeded shuffle, first n); <=0 -> all"),
    "bench_n": ({}, "per-bench n, e.g. {musique: 0, babyai: 50}; a bench not named takes n"),
    "profile": (None, "recipes/eval/<profile>.yaml: its keys under the command line's; out -> eval/<profile>/"),
    "seed": (42, "seed of the item shuffle (which n items) and of sampling"),
    "backend": ("hf", "hf | vllm"),
    "retriever": ("bm25", "bm25 | e5 (dense, as Search-R1: evals.dense) | http"),
    "corpus": (None, "wiki-18 style jsonl for retriever=bm25 or e5, or a fetched corpus by name (corpus:wiki18_example_10)"),
    "encoder": ("encoder:e5-base-v2", "retriever=e5: the E5 encoder: a fetched name (encoder:e5-base-v2, "
                                         "from the data cache: fetch-data), an HF model dir or hub id"),
    "index": (None, "retriever=e5: a faiss IndexFlatIP whose row i is corpus line i: a fetched name (index:wiki18_e5_flat, "
                    "Search-R1's e5_Flat.index of corpus:wiki18) or a file, memory-mapped; null -> built from the corpus "
                    "(small corpora) under index_dir"),
    "encoder_device": ("cpu", "retriever=e5: where the encoder runs: cpu | auto | cuda | cuda:N (fp16 on CUDA, as Search-R1)"),
    "index_dir": (None, "retriever index cache root; null -> ~/.cache/dtsft/bm25 (bm25) or ~/.cache/dtsft/e5 (e5)"),
    "retriever_url": (None, "http://HOST:PORT/retrieve for retriever=http"),
    "retriever_timeout": (30.0, "seconds per retriever=http request"),
    "retriever_retries": (3, "retries of a failed retriever=http request"),
    "topk": (3, "documents returned per search call"),
    "max_turns": (8, "assistant turns per episode"),
    "max_model_len": (16384, "prompt + generation tokens; beyond -> stop reason context_limit"),
    "max_new_tokens": (4096, "per assistant turn"),
    "prompt": ("tool_agent", "tool_agent | anchor_nudge"),
    "tool_style": ("auto", "auto (from the chat template) | qwen3 | llama3"),
    "enable_thinking": ("auto", "hybrid Qwen3 thinking switch: auto (not passed to the chat template) | true | false"),
    "sets": ({}, "per-bench named item set, e.g. {nq: 'nq:seed42_1000', musique@given: 'musique:hub_ans_dev'}; a bench "
                 "not named reads evals.benches.DEFAULT_SETS (fetched into $DTSFT_DATA on first use; `fetch-data --help`)"),
    "bench_root": (None, "your own files: dir with <bench>/*.jsonl (every bench must be there); null -> the named sets"),
    "heldout": (None, "benches tf_code / tf_search (teacher-forced loss by span, backend=hf): a `data-prep heldout` dir"),
    "out": (None, "null -> <run_dir>/eval/step-NNNNNN for a checkpoint inside a run"),
    "batch_size": (64, "episodes advanced in lockstep (and written) together"),
    "micro_batch": (16, "hf backend: sequences per generate call"),
    "driver": ("auto", "auto (async for backend=vllm, lockstep for hf) | lockstep (batch_size episodes per batched "
                       "generate) | async (one coroutine per episode over vLLM's AsyncLLM, every bench pooled)"),
    "max_in_flight": ("auto", "driver=async: episodes in play at once; auto = min(2 x the engine's max_num_seqs, "
                              "4 x KV-cache tokens / max_model_len), at least 1"),
    "tool_batch_window_ms": (5.0, "driver=async: tool calls arriving within this many ms go to one retriever call"),
    "tool_batch_size": (64, "driver=async: a tool batch goes out at once when this many calls wait"),
    "device": ("auto", "auto (cuda when available, else cpu) | a torch device: cuda, cuda:1, cpu"),
    "dtype": ("auto", "auto (hf: bf16 on CUDA, fp32 on CPU; vllm: see evals.backends) | float32 | bfloat16 | float16"),
    "tensor_parallel_size": (1, "vllm: GPUs one model is split over"),
    "data_parallel": (1, "engine processes, one per GPU (x tensor_parallel_size), each a shard of the items; rows merged in item order (evals.parallel)"),
    "shard": (None, "internal, set by data_parallel=N for its processes: I/N evaluates items I, I+N, ..."),
    "gpu_memory_utilization": ("auto", "vllm: fraction of GPU memory vLLM may take; auto = 0.9 on CUDA, on CPU the KV cache is sized instead (evals.backends)"),
    "enforce_eager": ("auto", "vllm: auto = true on CPU, false on CUDA (CUDA graphs)"),
    "prefix_caching": (True, "vllm: reuse the KV cache of shared prompt prefixes"),
    "ood_max_turns": (24, "search_plan_ood needs ~10 tool calls even when done perfectly"),
    "ood_split": ("ood", "search_plan_ood environment split (envs: train | ood)"),
    "skip_empty_golds": (False, ("true: gold aliases that normalize to nothing (NQ's `*`, `---`) are not scored against; "
                                  "false (default) = Search-R1's scoring; counted either way")),
    "babyai_max_steps": (None, "BALROG's max_steps_per_episode: ends an episode early (the reward scale stays the level's)"),
    "babyai_max_new_tokens": (8192, "one babyai reply (BALROG's max_tokens; thinking models reason at length)"),
    "babyai_temperature": (1.0, "BALROG's default sampling temperature; 0 -> greedy"),
    "babyai_samples": (1, "plays of each babyai episode, each with its own random streams"),
    "progress": (True, "a progress bar on stderr"),
    "overwrite": (False, "a bench held in out under another identity: rename its results aside, re-evaluate"),
    "wandb": ("auto", "auto: to the run's wandb run when it would upload | true | false (evals.wandb_log)"),
    "wandb_group": (None, "group of the eval run of a model outside a run dir; null -> $WANDB_RUN_GROUP"),
    "dry_run": (False, "true: print the resolved config and exit; evaluate nothing"),
}
DEFAULTS = keydoc.defaults(KEYS)


RETRIEVERS = ("bm25", "e5", "http")


def default_out(ckpt: str, profile: str | None = None) -> Path | None:
    """`<run_dir>/eval/[<profile>/]step-NNNNNN` for `<run_dir>/checkpoints/step-NNNNNN`, else None."""
    p = Path(ckpt)
    step = layout.parse_step(p.name)
    if step is not None and p.parent.name == layout.CHECKPOINTS:
        return layout.eval_dir(p.parent.parent, step, profile)
    return None


def base_config(profile: str | None = None) -> DictConfig:
    """DEFAULTS with the profile's `evaluate` keys on top (what command-line keys then override)."""
    base = OmegaConf.create(DEFAULTS)
    if profile:
        base = OmegaConf.merge(base, load_profile(profile)["evaluate"], {"profile": profile})
    return base


def bench_size(cfg: DictConfig, bench: str) -> int:
    """The n asked for `bench`: `bench_n[bench]` when given, else `n` (<= 0 means every item)."""
    return int(cfg.bench_n[bench]) if bench in cfg.bench_n else int(cfg.n)


def uses_retriever(bench: str) -> bool:
    """Whether bench `bench` (a canonical key) searches a corpus: QA benches in context mode open."""
    return bench not in ENV_BENCHES and parse_bench_key(bench)[1] == "open"


def _benches(value) -> list[str]:
    """`benches` as canonical keys (`musique@open` -> `musique`), each once; env benches take no mode."""
    keys = []
    for raw in [value] if isinstance(value, str) else list(value):
        try:
            key = canonical_bench_key(str(raw))
        except BenchError as exc:
            raise EvalError(str(exc)) from None
        if parse_bench_key(key)[0] in ENV_BENCHES and key not in ENV_BENCHES:
            raise EvalError(f"bench {raw!r}: {parse_bench_key(key)[0]} brings its own environment and has no "
                            "context mode")
        if key in keys:
            raise EvalError(f"benches: {raw!r} is listed twice (as {key})")
        keys.append(key)
    return keys


# What each evaluate key may be (common.schema's rules): counts are integers (2.5, `true` or text are
# refused, never truncated), caps are >= 1, flags are true/false.
_COUNT = Number(lo=1, integer=True)
NUMBERS = {
    "n": Number(integer=True),                  # <= 0: every item
    "seed": Number(lo=0, integer=True),
    "retriever_timeout": Number(lo=0, lo_open=True),
    "retriever_retries": Number(lo=0, integer=True),
    "topk": _COUNT, "max_turns": _COUNT, "ood_max_turns": _COUNT, "max_model_len": _COUNT,
    "max_new_tokens": _COUNT, "batch_size": _COUNT, "micro_batch": _COUNT, "tensor_parallel_size": _COUNT,
    "data_parallel": _COUNT,
    "gpu_memory_utilization": Number(lo=0, hi=1, lo_open=True, words=("auto",)),
    "babyai_max_steps": Number(lo=1, integer=True, null=True),   # null: the level's own limit
    "babyai_max_new_tokens": _COUNT,
    "babyai_temperature": Number(lo=0),          # 0: greedy
    "babyai_samples": _COUNT,
    "max_in_flight": Number(lo=1, integer=True, words=("auto",)),
    "tool_batch_window_ms": Number(lo=0),
    "tool_batch_size": _COUNT,
}
BOOLS = ("skip_empty_golds", "progress", "overwrite", "dry_run", "prefix_caching")
OPTIONAL_PATHS = ("tokenizer", "corpus", "index", "encoder", "index_dir", "retriever_url", "bench_root", "out", "wandb_group", "profile")
BENCH_N = Number(lo=0, integer=True)         # 0 = every item of the bench


def known_benches(bench_root) -> list[str]:
    """Every bench name evaluate can load: the environments, the hub's and each dir under `bench_root`."""
    names = {*ENV_BENCHES, *HUB_SPLITS, *HUB_CONTEXT}
    if bench_root and Path(bench_root).is_dir():
        names |= {d.name for d in Path(bench_root).iterdir() if d.is_dir()}
    return sorted(names)


def bench_name_problem(name, bench_root) -> str | None:
    """Why `name` (`NAME[@MODE]`) names no bench (with the nearest names), or None."""
    if not isinstance(name, str) or not name:
        return f"{name!r} is not a bench name"
    known = known_benches(bench_root)
    if parse_bench_key(name)[0] in known:
        return None
    where = f" (no {Path(bench_root) / name}/)" if bench_root else " (and no bench_root=DIR holds it)"
    return f"unknown bench {name!r}{where}.{did_you_mean(name, known)}"


def _bench_n(value, bench_root) -> dict:
    """`bench_n` checked; YAML reads the unspaced `{babyai:5}` as the key `babyai:5`, taken here as babyai=5."""
    if not isinstance(value, DictConfig):
        raise EvalError(f"bench_n={value!r}: expected a mapping such as {{musique: 0, babyai: 50}}")
    out = {}
    for bench, n in value.items():
        if n is None and ":" in str(bench):
            bench, n = str(bench).rsplit(":", 1)
            n = int(n) if n.strip().lstrip("-").isdigit() else n
        bench = str(bench).strip()
        if not BENCH_N.ok(n):
            raise EvalError(f"bench_n.{bench}={n!r}: expected an integer >= 0 (0 = every item)")
        try:
            key = canonical_bench_key(bench)
        except BenchError as exc:
            raise EvalError(f"bench_n: {exc}") from None
        if why := bench_name_problem(key, bench_root):
            raise EvalError(f"bench_n.{bench}: {why}")
        out[key] = n
    return out


def _run_bench_n(profile_n, user_n, benches: list[str], bench_root) -> dict:
    """The `bench_n` of the benches being run: the profile's entries for those (its others go with the
    benches the command line left out), the caller's on top; a caller's entry for a bench not being
    run is refused (it would size nothing). An entry equal to the profile's is the profile's (a config
    built on the profile's keys carries them all)."""
    profile_n = _bench_n(profile_n, bench_root)
    own = {k: v for k, v in (_bench_n(user_n, bench_root) if user_n is not None else {}).items()
           if profile_n.get(k) != v}
    for key in own:
        if key not in benches:
            name = parse_bench_key(key)[0]
            modes = [b for b in benches if parse_bench_key(b)[0] == name]
            hint = f" (a bench_n key names the bench with its context mode: {', '.join(modes)})" if modes else ""
            raise EvalError(f"bench_n.{key}: {key} is not being run (benches: {', '.join(benches)}), so this entry "
                            f"would size nothing{hint}")
    return {**{k: v for k, v in profile_n.items() if k in benches}, **own}


def _run_sets(profile_sets, user_sets, benches: list[str]) -> dict:
    """The `sets` of the benches being run: the profile's for those, the caller's on top (a caller's
    entry for a bench not being run is refused: it would select nothing)."""
    out = {}
    for origin, value in (("profile", profile_sets), ("caller", user_sets)):
        if value is None:
            continue
        if not isinstance(value, DictConfig):
            raise EvalError(f"sets={value!r}: expected a mapping such as {{nq: 'nq:seed42_1000'}}")
        for bench, name in value.items():
            try:
                key = canonical_bench_key(str(bench).strip())
            except BenchError as exc:
                raise EvalError(f"sets: {exc}") from None
            if key not in benches:
                if origin == "caller" and (profile_sets is None or profile_sets.get(bench) != name):
                    raise EvalError(f"sets.{bench}: {key} is not being run (benches: {', '.join(benches)}), so this "
                                    "entry would select nothing")
                continue
            out[key] = str(name)
    return out


def parse_shard(value) -> tuple[int, int] | None:
    """`shard=I/N` as (I, N), None when unset; a malformed value is an EvalError."""
    if value is None:
        return None
    i, sep, n = str(value).partition("/")
    if not (sep and i.strip().isdigit() and n.strip().isdigit() and 0 <= int(i) < int(n)):
        raise EvalError(f"shard={value!r}: expected I/N with 0 <= I < N (set by data_parallel=N for its processes, evals.parallel)")
    return int(i), int(n)


def shard_items(items: list, shard) -> list:
    """The items of shard `shard` (`I/N`): positions I, I+N, ... (all items when shard is unset)."""
    parsed = parse_shard(shard)
    return items if parsed is None else items[parsed[0]::parsed[1]]


def value_problems(cfg: DictConfig) -> list[str]:
    """One line per evaluate key whose value it cannot be (type, range, integer caps)."""
    out = []
    for key, rule in NUMBERS.items():
        if not rule.ok(cfg[key]):
            out.append(f"{key}={cfg[key]!r}: expected {rule.describe()}")
    for key in BOOLS:
        if not isinstance(cfg[key], bool):
            out.append(f"{key}={cfg[key]!r}: expected true or false")
    for key in OPTIONAL_PATHS:
        if cfg[key] is not None and not isinstance(cfg[key], (str, os.PathLike)):
            out.append(f"{key}={cfg[key]!r}: expected a string (or null)")
    return out


def engine_problem(cfg: DictConfig) -> str | None:
    """Why a resolved request cannot build its own engine (None when it can): driver=async needs vLLM's
    AsyncLLM. (A caller passing its own engine is checked against that engine: evals.run.resolve_driver.)"""
    if cfg.driver == "async" and cfg.backend != "vllm":
        return (f"driver=async needs an asynchronous engine: backend=vllm (vLLM's AsyncLLM); backend={cfg.backend} "
                "runs driver=lockstep (or driver=auto)")
    return None


def resolve_request(cfg: DictConfig | dict) -> DictConfig:
    """`resolve`, plus what a request that builds its own engine (the command line, analyze) is refused
    for before any work: `engine_problem`."""
    merged = resolve(cfg)
    if why := engine_problem(merged):
        raise EvalError(why)
    return merged


def resolve(cfg: DictConfig | dict) -> DictConfig:
    """Defaults (+ the profile's keys) + `cfg`, checked; unknown keys and bad values are ConfigErrors."""
    user = OmegaConf.create(cfg) if isinstance(cfg, dict) else cfg
    profile = user.get("profile") if "profile" in user else None
    base = base_config(profile)
    OmegaConf.set_struct(base, True)
    OmegaConf.set_struct(base.bench_n, False)  # free-form: bench name -> n
    OmegaConf.set_struct(base.sets, False)     # free-form: bench name -> item set
    for key in user:
        if key not in base:
            raise EvalError(f"unknown evaluate key {key!r}.{did_you_mean(str(key), list(base))}")
    try:
        merged = OmegaConf.merge(base, user)
    except Exception as exc:
        raise EvalError(f"bad evaluate config: {exc}") from exc
    OmegaConf.set_struct(merged, False)
    if not merged.ckpt:
        raise EvalError("ckpt=PATH is required (a Hugging Face model directory)")
    merged.ckpt = resolve_model_path(str(merged.ckpt))   # `tiny-base`: the embedded model, as launch names it
    if merged.prompt not in PROMPTS:
        raise EvalError(f"prompt={merged.prompt!r}: expected one of {', '.join(PROMPTS)}")
    if merged.backend not in ("hf", "vllm"):
        raise EvalError(f"backend={merged.backend!r}: expected hf or vllm")
    if merged.retriever not in RETRIEVERS:
        raise EvalError(f"retriever={merged.retriever!r}: expected bm25, e5 or http.{did_you_mean(str(merged.retriever), RETRIEVERS)}")
    if merged.wandb not in ("auto", True, False):
        raise EvalError(f"wandb={merged.wandb!r}: expected auto, true or false")
    if merged.dtype not in ("auto", "float32", "bfloat16", "float16"):
        raise EvalError(f"dtype={merged.dtype!r}: expected auto, float32, bfloat16 or float16")
    if merged.enforce_eager not in ("auto", True, False):
        raise EvalError(f"enforce_eager={merged.enforce_eager!r}: expected auto, true or false")
    gmu = merged.gpu_memory_utilization
    if gmu != "auto" and (isinstance(gmu, bool) or not isinstance(gmu, (int, float)) or not 0 < gmu <= 1):
        raise EvalError(f"gpu_memory_utilization={gmu!r}: expected auto or a fraction in (0, 1]")
    if thinking.value_problem(merged.enable_thinking, "enable_thinking"):
        raise EvalError(thinking.value_problem(merged.enable_thinking, "enable_thinking"))
    if merged.driver not in ("auto", "lockstep", "async"):
        raise EvalError(f"driver={merged.driver!r}: expected auto, lockstep or async")
    if merged.tool_style not in ("auto", "qwen3", "llama3"):
        raise EvalError(f"tool_style={merged.tool_style!r}: expected auto, qwen3 or llama3")
    if isinstance(merged.benches, str):
        merged.benches = [merged.benches]
    if not isinstance(merged.benches, ListConfig) or not merged.benches:
        raise EvalError(f"benches={merged.benches!r}: expected a non-empty list such as [nq,babyai]")
    problems = value_problems(merged)
    if problems:
        raise EvalError("; ".join(problems))
    parse_shard(merged.shard)
    merged.benches = _benches(merged.benches)
    merged.sets = _run_sets(base.sets, user.sets if "sets" in user else None, merged.benches)
    for bench in merged.benches:
        if why := bench_name_problem(bench, merged.bench_root):
            raise EvalError(f"benches: {why}")
        if bench not in ENV_BENCHES:  # a missing or ambiguous bench file, an unknown set: up front (no network)
            bench_source(bench, merged.bench_root, resolve=False, sets=merged.sets)
    if tf := [b for b in merged.benches if b in TF_BENCHES]:
        if merged.backend != "hf":
            raise EvalError(f"benches {tf} are teacher-forced losses (the model's logits): backend=hf only, not "
                            f"backend={merged.backend}; evaluate them in a call of their own")
        if not merged.heldout:
            raise EvalError(f"benches {tf} need heldout=DIR (a `data-prep heldout` dir)")
        if not Path(merged.heldout).is_dir():
            raise EvalError(f"heldout={merged.heldout}: no such directory")
    merged.bench_n = _run_bench_n(base.bench_n, user.bench_n if "bench_n" in user else None, merged.benches,
                                  merged.bench_root)
    qa = [b for b in merged.benches if uses_retriever(b)]
    if qa and merged.retriever in ("bm25", "e5") and not merged.corpus:
        raise EvalError(f"benches {qa} need a retriever: pass corpus=PATH (bm25, e5) or retriever=http retriever_url=URL")
    if qa and merged.retriever in ("bm25", "e5") and not datafetch.is_name(merged.corpus) and not Path(merged.corpus).is_file():
        raise EvalError(f"corpus={merged.corpus}: no such file")
    if qa and merged.retriever == "e5":
        if not merged.encoder:
            raise EvalError("retriever=e5 needs encoder=MODEL (encoder:e5-base-v2, an HF model dir or hub id)")
        try:   # a fetched name is checked when used (the cache); a mistyped one: did you mean
            index_named = datafetch.named("index", merged.index, "index")
            datafetch.named("encoder", merged.encoder, "encoder")
        except datafetch.DataError as exc:
            raise EvalError(str(exc)) from None
        if merged.index is not None and not index_named and not Path(merged.index).is_file():
            raise EvalError(f"index={merged.index}: no such file (a faiss index; null builds one from the corpus)")
        from evals.dense import BUILD_MAX_BYTES

        corpus_file = None if datafetch.is_name(merged.corpus) else Path(merged.corpus)
        if merged.index is None and corpus_file is not None and corpus_file.stat().st_size > BUILD_MAX_BYTES:
            raise EvalError(f"retriever=e5 index=null would build an index over corpus={merged.corpus} "
                            f"({corpus_file.stat().st_size / 2**30:.1f} GiB): pass index=FILE (Search-R1's "
                            "e5_Flat.index for wiki-18)")
    if qa and merged.retriever == "http" and not merged.retriever_url:
        raise EvalError("retriever=http needs retriever_url=http://HOST:PORT/retrieve")
    if merged.out is None:
        out = default_out(merged.ckpt, merged.profile)
        if out is None:
            raise EvalError(f"ckpt={merged.ckpt} is not <run_dir>/checkpoints/step-NNNNNN; pass out=DIR")
        merged.out = str(out)
    return merged
