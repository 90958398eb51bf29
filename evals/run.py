"""`evaluate(cfg) -> summary`: score one checkpoint on a list of benches.

For each bench: sample the items (ids saved to `<out>/sampled_ids/<bench>.json`), check that the
out dir holds that bench under this request's identity (evals.identity; another one is refused
unless `overwrite=true`, which renames the old outputs aside), skip the ids already in
`<out>/<bench>.jsonl`, run the rest (`BenchWork.todo`) through a driver — lockstep: `batch_size`
episodes at a time, appending each finished batch; async (evals.scheduler): every bench pooled
through one engine, each row appended as its episode finishes —, every row carrying the identity
digest, then summarize the rows (in item order, whatever order they finished in)
into `<out>/summary.json` (`{bench: {em, f1, cover_em, strict_em, format_failure_rate, n, mean_turns,
mean_tool_calls, ...}}`, metrics in [0, 1]; search_plan_ood carries `reward` and `reward_<component>`).
summary.json is recomputed from the rows of every complete bench in the out dir, never carried over.
Run details (checkpoint path, each bench's identity, prompt, backend, n, seed, sampled-id files, the
7-bench mean) go to `<out>/meta.json`, with `bench_items`: per bench the n asked for (`bench_n`, else
`n`), the n evaluated, the source, its digest (and the file's item count) and a digest of the sampled
items. Bench `babyai` (evals.babyai) plays text games under BALROG's protocol instead of the agent
loop; its summary carries `return` (with `return_ci95`), `success`, `progression`,
`invalid_action_rate`, `mean_steps` and `per_task`.

`<bench>` is the bench's name with its context mode where that is not the default
(`musique@given.jsonl`, summary key `musique@given`; evals.benches); a QA bench's summary and
`bench_items` entry carry `unanswerable_excluded` (items with `answerable: false` left out).
"""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import platform
import time
from pathlib import Path

from omegaconf import OmegaConf
from tqdm import tqdm

from common import thinking
from common.io import check_sha256sums, read_json_object, replace_aside, sha256_text, write_json
from evals import babyai, tasks
from evals.agent import AgentSteps, run_lockstep
from evals.benches import (BABYAI_BENCH, ENV_BENCHES, OOD_BENCH, SEARCH7, bench_set, bench_source, load_bench_counted,
                           read_bench_file)
from common.benchmarks import parse_bench_key
from evals.config import bench_size, resolve, resolve_request, shard_items, uses_retriever
from evals.errors import EvalError
from evals.identity import (BENCH_KEY_PREFIXES, IdentityError, bench_identity, check_same, checkpoint_identity,
                            source_digest)
from evals.metrics import NULL_REASON, unweighted_mean
from evals.results import QA_KEYS, ResultsError, append_rows, load_done, summarize
from evals.toolcalls import detect_style


def _check_sample(path: Path, bench: str, ids: list[str]) -> None:
    """A resumed run must be evaluating the very same ids as the sample `path` holds (if any)."""
    if path.exists():
        old = json.loads(path.read_text(encoding="utf-8"))
        if old["ids"] != ids:
            raise ResultsError(
                f"{path}: this out dir was started with a different sample of {bench} "
                f"(n={old['n']}, seed={old['seed']}, source={old['source']}); use a fresh out="
            )


def _write_sample(path: Path, bench: str, source: str, cfg, ids: list[str], unanswerable: int = 0) -> None:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, {"bench": bench, "source": source, "seed": int(cfg.seed), "n": len(ids), "ids": ids,
                          "unanswerable_excluded": unanswerable})


def _bench_source(bench: str, cfg) -> str:
    """Where a bench's items come from (a file, a hub dataset at its commit, an environment), without loading them."""
    if bench == OOD_BENCH:
        return f"envs.search_plan_act/{cfg.ood_split}"
    if bench == BABYAI_BENCH:
        return "envs.babyai_text"
    return bench_source(bench, cfg.bench_root, sets=cfg.get("sets"), fetch=False)   # its identity needs no download


def _bench_items(bench: str, cfg) -> tuple[list, str, int]:
    """(sampled items, where they came from, unanswerable items left out) for one bench, with its
    own n (`bench_n`)."""
    n, seed = bench_size(cfg, bench), int(cfg.seed)
    if bench == OOD_BENCH:
        return tasks.ood_items(n, seed, cfg.ood_split), _bench_source(bench, cfg), 0
    if bench == BABYAI_BENCH:
        return babyai.items(n, seed, int(cfg.babyai_samples)), _bench_source(bench, cfg), 0
    return load_bench_counted(bench, cfg.bench_root, n, seed, cfg.get("sets"))


def bench_items_record(bench: str, cfg, items: list, source: str, unanswerable: int = 0) -> dict:
    """What was evaluated: n asked and evaluated, the source (its digest; a file's item count), the
    items' digest (paragraphs included), the unanswerable items left out."""
    content = [[it.id, it.question, it.golden_answers, it.extra] for it in items]
    if any(getattr(it, "paragraphs", None) for it in items):
        content = [[*c, [[p.title, p.text] for p in it.paragraphs or []]] for c, it in zip(content, items)]
    record = {"n_requested": bench_size(cfg, bench), "n": len(items), "source": source,
              "unanswerable_excluded": unanswerable,
              "source_digest": source_digest(source),
              "items_sha256": sha256_text(json.dumps(content, sort_keys=True, default=str))}
    if Path(source).is_file():
        record["file_items"] = len(read_bench_file(Path(source), bench))
    return record


class BenchRunner:
    """How one bench's items are played: its step functions (evals.agent's interface), how an item
    becomes a unit of play and a finished unit its row, and its cap on new tokens per turn."""

    def __init__(self, steps, start, row, max_new_tokens: int):
        self.steps, self.start, self.row, self.max_new_tokens = steps, start, row, int(max_new_tokens)


def bench_runner(bench: str, cfg, tokenizer, retriever, style: str) -> BenchRunner:
    """The runner of `bench`: BabyAI games, or tool-calling episodes (QA benches, search_plan_ood)."""
    kwargs = thinking.template_kwargs(cfg.enable_thinking)
    if bench == BABYAI_BENCH:
        cap = None if cfg.babyai_max_steps is None else int(cfg.babyai_max_steps)
        steps = babyai.GameSteps(tokenizer, max_steps=cap, max_new_tokens=int(cfg.babyai_max_new_tokens),
                                 temperature=float(cfg.babyai_temperature), template_kwargs=kwargs)
        return BenchRunner(steps, steps.start, lambda g, it: steps.row(g), int(cfg.babyai_max_new_tokens))
    if bench == OOD_BENCH:
        make_episode, execute, is_done, make_row = tasks.ood_episode, tasks.env_tools, tasks.env_done, tasks.ood_row
    else:
        mode = parse_bench_key(bench)[1]
        make_episode = functools.partial(tasks.qa_episode, mode=mode)
        execute = tasks.SearchTools(retriever if mode == "open" else None, int(cfg.topk))
        is_done = lambda ep: False  # noqa: E731
        make_row = functools.partial(tasks.qa_row, skip_empty_golds=bool(cfg.skip_empty_golds))
    steps = AgentSteps(tokenizer, execute, style=style, max_new_tokens=int(cfg.max_new_tokens), is_done=is_done,
                       max_turns=int(cfg.ood_max_turns if bench == OOD_BENCH else cfg.max_turns), template_kwargs=kwargs)
    return BenchRunner(steps, lambda it: make_episode(it, cfg.prompt), make_row, int(cfg.max_new_tokens))


def run_chunk(runner: BenchRunner, chunk: list, backend, max_model_len: int) -> list[dict]:
    """Play `chunk`'s items in lockstep (evals.agent.run_lockstep); their rows in item order."""
    units = run_lockstep([runner.start(it) for it in chunk], backend, runner.steps, max_model_len=max_model_len,
                         max_new_tokens=runner.max_new_tokens)
    return [runner.row(u, it) for u, it in zip(units, chunk)]


def summarize_bench(bench: str, rows: list[dict]) -> dict:
    """The summary.json entry of one bench from its rows (babyai has its own metrics)."""
    if bench == BABYAI_BENCH:
        return babyai.summarize(rows)
    return summarize(rows, QA_KEYS if bench != OOD_BENCH else None)


def _row_digests(path: Path) -> set:
    """The identity digests carried by the rows of `path` (None for rows without one)."""
    digests = set()
    if path.exists():
        for line in path.read_bytes().split(b"\n"):
            if line.strip():
                try:
                    digests.add(json.loads(line).get("identity"))
                except json.JSONDecodeError:
                    pass  # a torn last line: load_done deals with it
    return digests


def claim_bench(bench: str, out: Path, want: dict, recorded: dict | None, overwrite: bool) -> None:
    """Make sure `out` holds `bench` under identity `want` only: refuse another one (IdentityError
    with the diff) or, with overwrite=true, rename its rows and sample aside."""
    outputs = [out / f"{bench}.jsonl", out / "sampled_ids" / f"{bench}.json"]
    if not any(p.exists() for p in outputs):
        return   # out does not hold this bench (whatever meta.json last meant to write)
    diff = check_same(bench, out, recorded, _row_digests(outputs[0]), want)
    if not diff:
        return
    if not overwrite:
        raise IdentityError(
            f"{out} holds {bench} results of another evaluation identity (out dir -> this request):\n  "
            + "\n  ".join(diff) + f"\nUse another out=, or overwrite=true to rename the old {bench} results aside "
            f"({bench}.jsonl.replaced-<UTC time>; nothing is deleted) and evaluate again.")
    for p in outputs:
        if p.exists():
            print(f"[evaluate] overwrite=true: {p} renamed to {replace_aside(p).name}")


def bench_request(bench: str, cfg, ckpt_id: dict) -> dict:
    """The identity a bench of this request will have (no model, retriever or item needed)."""
    return bench_identity(bench, cfg, ckpt_id, n=bench_size(cfg, bench), seed=int(cfg.seed),
                          source=_bench_source(bench, cfg),
                          item_set=None if bench in ENV_BENCHES else bench_set(bench, cfg.bench_root, cfg.get("sets")))


def _read_meta(out: Path) -> dict:
    path = out / "meta.json"
    if not path.exists():
        return {}
    try:
        return read_json_object(path)
    except ValueError as exc:
        raise EvalError(f"{exc}; move it aside to evaluate into {out}") from exc


def to_evaluate(cfg) -> dict[str, list[str]]:
    """What `evaluate(cfg)` has left to do, decided by evaluation identity (no model is loaded): each
    requested bench that `out` does not hold complete (every sampled row, a summary entry) under this
    request's identity -> the differences from the identity it holds (then only overwrite=true
    re-evaluates it; empty when out holds none of it, or an unfinished part under this identity)."""
    cfg = resolve(cfg)
    out = Path(cfg.out)
    identities = _read_meta(out).get("identities") or {}
    summary = _read_summary(out)
    ckpt_id = checkpoint_identity(str(cfg.ckpt))
    pending = {}
    for bench in cfg.benches:
        want = bench_request(bench, cfg, ckpt_id)
        recorded = identities.get(bench)
        if (isinstance(summary.get(bench), dict) and isinstance(recorded, dict)
                and recorded.get("fingerprint") == want["fingerprint"]
                and _bench_summary_from_rows(out, bench, want) is not None):
            continue
        path = out / f"{bench}.jsonl"
        pending[bench] = check_same(bench, out, recorded, _row_digests(path), want) if path.exists() else []
    return pending


def _read_summary(out: Path) -> dict:
    path = out / "summary.json"
    try:
        summary = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}   # rewritten from the rows by the next evaluate
    return summary if isinstance(summary, dict) else {}


@dataclasses.dataclass
class BenchWork:
    """One bench of a request, claimed and sampled: its items, the rows already done (id -> row),
    the items still to play (`todo`, in item order: a selection of it, e.g. a shard, is a filter)."""
    bench: str
    ident: dict
    items: list
    source: str
    unanswerable: int
    record: dict
    ids_file: Path
    path: Path
    done: dict
    todo: list


def prepare_bench(bench: str, cfg, out: Path, ident: dict) -> BenchWork:
    """Sample one bench (already claimed under `ident`) and find what is left of it; reads only
    (a request that fails before `start_bench`, e.g. on loading its model, leaves out as it was)."""
    items, source, unanswerable = _bench_items(bench, cfg)
    items = shard_items(items, cfg.shard)   # data_parallel=N: this process's share (evals.parallel)
    record = bench_items_record(bench, cfg, items, source, unanswerable)
    ids_file = out / "sampled_ids" / f"{bench}.json"
    _check_sample(ids_file, bench, [it.id for it in items])
    path = out / f"{bench}.jsonl"
    done = load_done(path, {it.id for it in items})
    todo = [it for it in items if it.id not in done]
    return BenchWork(bench, ident, items, source, unanswerable, record, ids_file, path, done, todo)


def start_bench(work: BenchWork, cfg, out: Path, identities: dict) -> None:
    """Record the bench's identity (`identities`, bench -> identity: meta.json's) and its sample in
    out, before its first row."""
    identities[work.bench] = work.ident
    write_json(out / "meta.json", {**_read_meta(out), "identities": identities})
    _write_sample(work.ids_file, work.bench, work.source, cfg, [it.id for it in work.items], work.unanswerable)


def record_rows(work: BenchWork, rows: list[dict]) -> None:
    """Append finished rows (each with the identity digest) to the bench's jsonl, as they finish."""
    rows = [{**row, "identity": work.ident["fingerprint"]} for row in rows]
    append_rows(work.path, rows)
    work.done.update((r["id"], r) for r in rows)


def bench_summary(work: BenchWork) -> dict:
    """The summary entry of a bench whose every item has a row (rows in item order, whatever order they finished in)."""
    summary = summarize_bench(work.bench, [work.done[it.id] for it in work.items])
    return described(summary, work.source, None if work.bench in ENV_BENCHES else work.unanswerable)


def described(summary: dict, source, unanswerable: int | None) -> dict:
    """A bench's summary entry with its source and unanswerable items left out (QA benches); an empty
    sample's null metrics say where the items went."""
    summary["source"] = source
    if unanswerable is not None:
        summary["unanswerable_excluded"] = unanswerable
    if summary["n"] == 0:
        left = f"; {unanswerable} items with answerable: false left out" if unanswerable else ""
        summary[NULL_REASON] = f"no items to score: the sample of {source} is empty{left}"
    return summary


def run_bench(work: BenchWork, cfg, backend, runner: BenchRunner) -> None:
    """The lockstep driver: `batch_size` items at a time, each finished batch appended."""
    bar = tqdm(total=len(work.items), initial=len(work.done), desc=work.bench, unit="ex", disable=not cfg.progress,
               dynamic_ncols=True)
    bs = int(cfg.batch_size)
    for start in range(0, len(work.todo), bs):
        rows = run_chunk(runner, work.todo[start:start + bs], backend, int(cfg.max_model_len))
        record_rows(work, rows)
        bar.update(len(rows))
    bar.close()


def run_pooled(works: list[BenchWork], runners: dict, cfg, engine, on_complete) -> None:
    """The asynchronous driver (evals.scheduler): every bench's remaining items through one engine,
    one coroutine per episode, at most `max_in_flight` in play; each row appended as its episode
    finishes; `on_complete(work)` once a bench has all its rows."""
    from evals import scheduler

    cap = resolve_in_flight(cfg, engine)
    left = {w.bench: len(w.todo) for w in works}
    bar = tqdm(total=sum(len(w.items) for w in works), initial=sum(len(w.done) for w in works), desc="evaluate",
               unit="ex", disable=not cfg.progress, dynamic_ncols=True)
    tool_batchers = {}

    def job(work: BenchWork, item):
        runner = runners[work.bench]

        def finish(unit) -> None:
            record_rows(work, [runner.row(unit, item)])
            bar.update(1)
            left[work.bench] -= 1
            if left[work.bench] == 0:
                on_complete(work)
        return scheduler.Job(runner.steps, lambda: runner.start(item), finish, tool_batchers[work.bench])

    for w in works:
        tool_batchers[w.bench] = scheduler.ToolBatcher(runners[w.bench].steps.execute,
                                                       window_ms=float(cfg.tool_batch_window_ms),
                                                       max_queries=int(cfg.tool_batch_size))
    jobs = [job(w, it) for w in works for it in w.todo]
    cap_of = {id(r.steps): r.max_new_tokens for r in runners.values()}
    coro = scheduler.run_async(jobs, engine, max_in_flight=cap, max_model_len=int(cfg.max_model_len),
                               max_new_tokens=lambda j: cap_of[id(j.steps)])
    try:
        (engine.run if hasattr(engine, "run") else asyncio.run)(coro)   # an engine with its own loop runs it there
    finally:
        bar.close()


def resolve_in_flight(cfg, engine) -> int:
    """`max_in_flight`: N as given, or auto (evals.scheduler.auto_in_flight of the engine's KV
    capacity and max_model_len; `batch_size` for an engine that reports no capacity)."""
    from evals import scheduler

    if cfg.max_in_flight != "auto":
        return int(cfg.max_in_flight)
    if not hasattr(engine, "kv_capacity"):
        return int(cfg.batch_size)
    kv_tokens, max_seqs = engine.kv_capacity()
    return scheduler.auto_in_flight(kv_tokens, int(cfg.max_model_len), max_seqs)


def resolve_driver(cfg, backend) -> str:
    """`driver`: auto -> async for backend=vllm (or a passed-in async engine), lockstep otherwise."""
    is_async = hasattr(backend, "generate_one") if backend is not None else cfg.backend == "vllm"
    if cfg.driver == "auto":
        return "async" if is_async else "lockstep"
    if cfg.driver == "async" and not is_async:
        raise EvalError("driver=async needs an asynchronous engine: backend=vllm (vLLM's AsyncLLM); "
                        "backend=hf runs driver=lockstep")
    if cfg.driver == "lockstep" and backend is not None and not hasattr(backend, "generate"):
        raise EvalError("driver=lockstep needs a batched generate; this engine only generates asynchronously")
    return str(cfg.driver)


def _bench_summary_from_rows(out: Path, bench: str, ident: dict | None) -> dict | None:
    """A bench evaluated by an earlier call, re-summarized from its rows when complete and all of
    `ident` (rows without a digest when meta.json records none: an out dir from before evaluation
    identity); None otherwise (then it is not reported)."""
    ids_path, path = out / "sampled_ids" / f"{bench}.json", out / f"{bench}.jsonl"
    if not (ids_path.is_file() and path.is_file()):
        return None
    try:
        sample = read_json_object(ids_path)
        done = load_done(path, set(sample["ids"]))
    except (ValueError, KeyError, TypeError):   # a torn sample or rows file (ResultsError too): not held
        return None
    expected = ident.get("fingerprint") if ident else None
    if set(done) != set(sample["ids"]) or {r.get("identity") for r in done.values()} != {expected}:
        return None
    summary = summarize_bench(bench, [done[i] for i in sample["ids"]])
    return described(summary, sample.get("source"), sample.get("unanswerable_excluded"))


def _versions() -> dict:
    import torch
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}


def thinking_problem(cfg, tokenizer=None) -> str | None:
    """Why `enable_thinking` (true/false) cannot apply to the checkpoint's chat template (common.thinking:
    one that never reads it), or None; reads the tokenizer only (`tokenizer`, else cfg's), never a model."""
    if cfg.enable_thinking == "auto":
        return None
    if tokenizer is None:
        from evals.backends import load_tokenizer

        tokenizer = load_tokenizer(str(cfg.tokenizer or cfg.ckpt))
    return thinking.template_problem(cfg.enable_thinking, tokenizer.chat_template, "enable_thinking", str(cfg.ckpt))


def check_checkpoint_files(ckpt: str, ckpt_id: dict) -> None:
    """A checkpoint that carries `SHA256SUMS` (every one the trainers write) is evaluated only when
    each file matches it and none is unlisted: its identity is the digest of that list, so a file
    changed or added after the fact would be scored under the identity of the model it no longer is."""
    if ckpt_id.get("kind") != "sha256sums":
        return
    problems = check_sha256sums(ckpt)
    if problems:
        more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
        raise EvalError(f"{ckpt}: refusing to evaluate: its files do not match its SHA256SUMS: {'; '.join(problems[:3])}{more}")


def evaluate(cfg, *, backend=None, retriever=None) -> dict:
    """Evaluate `cfg.ckpt` on `cfg.benches`; returns the summary dict also written to summary.json.
    `backend` / `retriever` may be passed in (tests, a caller that keeps a model loaded); a backend
    built here is closed here, on any exit (vLLM: its engine process shut down, not left to die)."""
    if backend is None:   # refused before any shard, model or row: an engine it cannot build, a switch its template ignores
        cfg = resolve_request(cfg)
        if problem := thinking_problem(cfg):
            raise EvalError(problem)
        if int(cfg.data_parallel) > 1:   # N engine processes (evals.parallel)
            return _evaluate_sharded(cfg)
    owned: list = []
    try:
        return _evaluate(cfg, backend, retriever, owned)
    finally:
        for b in owned:
            if hasattr(b, "close"):
                b.close()


def _evaluate_sharded(cfg) -> dict:
    """data_parallel=N: identities claimed in out first, the shards run and merged in item order, then
    the ordinary evaluate on out with every row present (evals.parallel)."""
    from evals import parallel

    groups = parallel.device_groups(cfg)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    identities = _read_meta(out).get("identities") or {}
    ckpt_id = checkpoint_identity(str(cfg.ckpt))
    check_checkpoint_files(str(cfg.ckpt), ckpt_id)
    for bench in cfg.benches:
        claim_bench(bench, out, bench_request(bench, cfg, ckpt_id), identities.get(bench), bool(cfg.overwrite))
    single = OmegaConf.merge(cfg, {"data_parallel": 1})
    if to_evaluate(single):
        parallel.run_shards(cfg, groups)
        parallel.merge(cfg, len(groups))
    summary = evaluate(single, backend=parallel.RowsOnly(cfg), retriever=parallel.Unused())
    parallel.remove_shards(out)
    return summary


def _evaluate(cfg, backend, retriever, owned: list) -> dict:
    cfg = resolve(cfg)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    summary_path, meta_path = out / "summary.json", out / "meta.json"
    old_meta = _read_meta(out)
    identities = dict(old_meta.get("identities") or {})
    # Identities first: a bench held under another identity is refused before any model is loaded.
    ckpt_id = checkpoint_identity(str(cfg.ckpt))
    check_checkpoint_files(str(cfg.ckpt), ckpt_id)
    wanted = {bench: bench_request(bench, cfg, ckpt_id) for bench in cfg.benches}
    for bench, ident in wanted.items():
        claim_bench(bench, out, ident, identities.get(bench), bool(cfg.overwrite))
    searches = any(uses_retriever(b) for b in cfg.benches)
    driver = resolve_driver(cfg, backend)
    if backend is not None and (problem := thinking_problem(cfg, backend.tokenizer)):   # evaluate() checked its own
        raise EvalError(problem)
    # Sampled and matched with the rows out holds before anything is loaded: with nothing left to
    # play (a rerun, a requeued Slurm task, a data_parallel shard with no items) no model is loaded
    # and no retriever built: the summary is rewritten from the rows, only the tokenizer is read.
    works = [prepare_bench(bench, cfg, out, wanted[bench]) for bench in cfg.benches]
    playing = [w for w in works if w.todo]
    if backend is None:
        from evals import parallel
        from evals.backends import make_backend

        backend = make_backend(cfg, asynchronous=driver == "async") if playing else parallel.RowsOnly(cfg)
        owned.append(backend)
    if retriever is None and any(uses_retriever(w.bench) for w in playing):
        from evals.retrievers import make_retriever

        retriever = make_retriever(cfg)
    style = cfg.tool_style if cfg.tool_style != "auto" else detect_style(backend.tokenizer.chat_template)
    # Never trusted from an earlier run: other benches are re-summarized from their own rows.
    summary = {}
    held = set(identities) | {p.stem for p in (out / "sampled_ids").glob("*.json")}
    for bench in sorted(held - set(cfg.benches)):
        if (s := _bench_summary_from_rows(out, bench, identities.get(bench))) is not None:
            summary[bench] = s
    for work in works:
        start_bench(work, cfg, out, identities)
    ids_files, records = {}, dict(old_meta.get("bench_items") or {})
    started = time.time()
    runners = {bench: bench_runner(bench, cfg, backend.tokenizer, retriever, style) for bench in cfg.benches}

    def complete(work: BenchWork) -> None:
        summary[work.bench], ids_files[work.bench], records[work.bench] = bench_summary(work), work.ids_file, work.record
        write_json(summary_path, summary)  # after every bench, so a crash keeps finished ones

    if driver == "lockstep":
        for work in works:
            run_bench(work, cfg, backend, runners[work.bench])
            complete(work)
    else:   # every bench of the checkpoint pooled through one engine
        for work in works:
            if not work.todo:
                complete(work)
        if playing:
            run_pooled(playing, runners, cfg, backend, complete)
        summary = {**{b: summary[b] for b in summary if b not in cfg.benches}, **{b: summary[b] for b in cfg.benches}}
        write_json(summary_path, summary)
    # Per-bench records of the benches this call did not evaluate are kept from the call that did
    # (so a later call with another bench never resets, e.g., babyai's cap), for the benches still held.
    kept = [b for b in summary if b not in cfg.benches]
    config = OmegaConf.to_container(cfg, resolve=True)
    old_config = old_meta.get("config") if isinstance(old_meta.get("config"), dict) else {}
    for bench, prefix in BENCH_KEY_PREFIXES.items():
        if bench in kept:
            config.update({k: v for k, v in old_config.items() if k.startswith(prefix)})
    old_ids = old_meta.get("sampled_ids") if isinstance(old_meta.get("sampled_ids"), dict) else {}
    old_empty = old_meta.get("empty_gold_items") if isinstance(old_meta.get("empty_gold_items"), dict) else {}
    meta = {
        "ckpt": str(cfg.ckpt), "checkpoint_identity": ckpt_id, "identities": identities,
        "tokenizer": cfg.tokenizer, "prompt": cfg.prompt, "backend": cfg.backend, "driver": driver,
        "n": cfg.n, "seed": int(cfg.seed), "benches": list(cfg.benches), "tool_style": style,
        "profile": cfg.profile, "bench_items": {b: r for b, r in records.items() if b in summary},
        "babyai": ({"max_steps": cfg.babyai_max_steps, "max_new_tokens": int(cfg.babyai_max_new_tokens),
                    "temperature": float(cfg.babyai_temperature), "samples": int(cfg.babyai_samples),
                    "history": babyai.HISTORY} if BABYAI_BENCH in cfg.benches
                   else old_meta.get("babyai") if BABYAI_BENCH in kept else None),
        "retriever": cfg.retriever if searches else None, "corpus": cfg.corpus, "retriever_url": cfg.retriever_url,
        "sampled_ids": {**{b: p for b, p in old_ids.items() if b in kept}, **{b: str(p) for b, p in ids_files.items()}},
        "search7_mean": {k: unweighted_mean(summary, SEARCH7, k) for k in QA_KEYS},
        # items whose gold answers include one that normalizes to nothing (cover-EM 1 for anything)
        "empty_gold_items": {**{b: v for b, v in old_empty.items() if b in kept},
                             **{b: summary[b]["empty_gold_items"] for b in cfg.benches
                                if "empty_gold_items" in summary.get(b, {})}},
        "skip_empty_golds": bool(cfg.skip_empty_golds),
        "config": config, "versions": _versions(),
        "seconds": round(time.time() - started, 3),
    }
    write_json(meta_path, meta)
    from evals.wandb_log import log_summary

    logged = log_summary(cfg, summary)
    if logged:
        print(f"[evaluate] summary logged to {logged}", flush=True)
    return summary


def format_table(summary: dict) -> str:
    """Bench averages x100 and the unweighted 7-bench mean, for the terminal."""
    w = max([18, *(len(b) + 2 for b in summary)])
    lines = [f"{'bench':<{w}}{'n':>6}{'EM':>8}{'F1':>8}{'coverEM':>9}{'strictEM':>10}{'fmtfail':>9}"]
    for bench, s in summary.items():
        if s.get(NULL_REASON):
            lines.append(f"{bench:<{w}}{s['n']:>6}  no score: {s[NULL_REASON]}")
        elif "return" in s:
            lines.append(f"{bench:<{w}}{s['n']:>6}  return={s['return']:.3f} success={s['success']:.3f} "
                         f"invalid={s['invalid_action_rate']:.3f} steps={s['mean_steps']:.1f}")
        elif "em" in s:
            lines.append(f"{bench:<{w}}{s['n']:>6}{100 * s['em']:>8.1f}{100 * s['f1']:>8.1f}{100 * s['cover_em']:>9.1f}"
                         f"{100 * s['strict_em']:>10.1f}{100 * s['format_failure_rate']:>9.1f}")
        else:
            comps = " ".join(f"{k}={v:.3f}" for k, v in s.items() if k.startswith("reward"))
            lines.append(f"{bench:<{w}}{s['n']:>6}  {comps}")
    means = {k: unweighted_mean(summary, SEARCH7, k) for k in QA_KEYS}
    if means["em"] is not None:
        lines.append(f"{'7-bench mean':<{w}}{'':>6}{100 * means['em']:>8.1f}{100 * means['f1']:>8.1f}"
                     f"{100 * means['cover_em']:>9.1f}{100 * means['strict_em']:>10.1f}")
    return "\n".join(lines)
