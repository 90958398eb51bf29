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
summary.json is recomputed from the rows of every complete bench in the out dir, never carried over; a bench
there of another checkpoint (its identity in meta.json says which) stays in it, but is not returned, printed,
logged to wandb or averaged as this checkpoint's result.
Run details (checkpoint path, each bench's identity, prompt, backend, n, seed, sampled-id files, the
7-bench mean) go to `<out>/meta.json`, with `bench_items`: per bench the n asked for (`bench_n`, else
`n`), the n evaluated, the source, its digest (and the file's item count) and a digest of the sampled
items, and `settings`: per bench, the settings that change a result (common.cards.RESULT_SETTINGS) of the call
that evaluated it (the top-level `config` is the last call's, which may have evaluated other benches).
Bench `babyai` (evals.babyai) plays text games under BALROG's protocol instead of the agent loop; its summary
carries `return` (with `return_ci95`), `success`, `progression`, `invalid_action_rate`, `mean_steps` and `per_task`.

What each kind of bench does (items, episode, row, summary, meta fields) comes from the bench
registry (evals.registry); everything read from or written to the out dir goes through the eval
store (evals.store.EvalStore); the config is resolved once per call and the checkpoint's weights
hashed once (data_parallel=N included: the shards are handed the parent's checkpoint identity).

`<bench>` is the bench's name with its context mode where that is not the default
(`musique@given.jsonl`, summary key `musique@given`; evals.benches); a QA bench's summary and
`bench_items` entry carry `unanswerable_excluded` (items with `answerable: false` left out).
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os
import platform
import time
from pathlib import Path

from omegaconf import OmegaConf
from tqdm import tqdm

from common import hub, thinking
from common.io import check_sha256sums, dir_identity, sha256_text
from evals import scheduler, teacher_forced
from evals.benches import SEARCH7, bench_size, read_bench_file
from evals.config import Resolved, resolve
from evals.engine import Engine, Lockstep
from evals.errors import EvalError
from evals.identity import bench_identity, checkpoint_identity, of_another_checkpoint, source_digest
from evals.metrics import NULL_REASON, PROMPT_TOO_LONG, unweighted_mean
from evals.parallel import shard_items
from evals.registry import kind_of, uses_retriever
from evals.scheduler import Episodes
from evals.results import QA_KEYS, too_long_text
from evals.store import EvalStore, described
from evals.toolcalls import detect_style


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
    if Path(source).is_file() and not kind_of(bench).scores:
        record["file_items"] = len(read_bench_file(Path(source), bench))
    return record


def bench_request(bench: str, cfg, ckpt_id: dict) -> dict:
    """The identity a bench of this request will have (no model, retriever or item needed)."""
    kind = kind_of(bench)
    return bench_identity(bench, cfg, ckpt_id, n=bench_size(cfg, bench), seed=int(cfg.seed),
                          source=kind.source(bench, cfg), item_set=kind.item_set(bench, cfg))


def to_evaluate(cfg) -> dict[str, list[str]]:
    """What `evaluate(cfg)` has left to do, decided by evaluation identity (no model is loaded): each
    requested bench that `out` does not hold complete (every sampled row, a summary entry) under this
    request's identity -> the differences from the identity it holds (then only overwrite=true
    re-evaluates it; empty when out holds none of it, or an unfinished part under this identity).
    A `Resolved` request is taken as it is (its identity computed once, kept in it for `evaluate`)."""
    if isinstance(cfg, Resolved):
        cfg, ckpt_id = cfg.cfg, cfg.ckpt_id or checkpoint_identity(str(cfg.cfg.ckpt))
    else:
        cfg = resolve(cfg)
        ckpt_id = checkpoint_identity(str(cfg.ckpt))
    return _left_to_evaluate(cfg, EvalStore(cfg.out), {b: bench_request(b, cfg, ckpt_id) for b in cfg.benches})


def _left_to_evaluate(cfg, store: EvalStore, wanted: dict) -> dict[str, list[str]]:
    identities, summary = store.identities(), store.summary()
    pending = {}
    for bench in cfg.benches:
        want, recorded = wanted[bench], identities.get(bench)
        if (isinstance(summary.get(bench), dict) and isinstance(recorded, dict)
                and recorded.get("fingerprint") == want["fingerprint"]
                and store.complete_summary(bench, want) is not None):
            continue
        pending[bench] = store.differences(bench, recorded, want)
    return pending


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
    done: dict
    todo: list


def open_sources(cfg) -> dict:
    """What each kind of the requested benches reads its items from, opened once per call (the
    registry's `opens`: the held-out set, verified and checked against the checkpoint's training
    data): kind name -> what it opened (kinds without one left out)."""
    kinds = {kind_of(b).name: kind_of(b) for b in cfg.benches}
    return {name: kind.opens(cfg) for name, kind in kinds.items() if kind.opens is not None}


def prepare_bench(bench: str, cfg, store: EvalStore, ident: dict, opened: dict) -> BenchWork:
    """Sample one bench (already claimed under `ident`; `opened`: open_sources') and find what is left
    of it; reads only (a request that fails before `store.start`, e.g. on loading its model, leaves
    out as it was)."""
    kind = kind_of(bench)
    items, source, unanswerable = kind.items(bench, cfg, opened.get(kind.name))
    items = shard_items(items, cfg.shard)   # data_parallel=N: this process's share (evals.parallel)
    record = bench_items_record(bench, cfg, items, source, unanswerable)
    store.check_sample(bench, [it.id for it in items])
    done = store.done(bench, [it.id for it in items])
    todo = [it for it in items if it.id not in done]
    return BenchWork(bench, ident, items, source, unanswerable, record, done, todo)


def bench_summary(work: BenchWork) -> dict:
    """The summary entry of a bench whose every item has a row (rows in item order, whatever order they finished in)."""
    kind = kind_of(work.bench)
    summary = kind.summarize([work.done[it.id] for it in work.items])
    return described(summary, work.source, work.unanswerable if kind.counts_unanswerable else None)


def play_lockstep(work: BenchWork, cfg, engine: Lockstep, episodes: Episodes, store: EvalStore) -> None:
    """The lockstep driver: `batch_size` episodes at a time, each turn of them one batch (evals.engine.Lockstep);
    each finished batch appended in item order."""
    bar = tqdm(total=len(work.items), initial=len(work.done), desc=work.bench, unit="ex", disable=not cfg.progress,
               dynamic_ncols=True)
    tools = _tool_batcher(engine, episodes, cfg)
    bs = int(cfg.batch_size)
    for start in range(0, len(work.todo), bs):
        chunk = work.todo[start:start + bs]
        _record(work, store, scheduler.play_items(chunk, episodes, engine, max_model_len=int(cfg.max_model_len),
                                                  tools=tools))
        bar.update(len(chunk))
    bar.close()


def play_pooled(works: list[BenchWork], episodes: dict[str, Episodes], cfg, engine: Engine, store: EvalStore,
                on_complete) -> None:
    """The asynchronous driver (evals.scheduler): every bench's remaining items through one engine,
    one coroutine per episode, at most `max_in_flight` in play; each row appended as its episode
    finishes; `on_complete(work)` once a bench has all its rows."""
    cap = resolve_in_flight(cfg, engine)
    left = {w.bench: len(w.todo) for w in works}
    bar = tqdm(total=sum(len(w.items) for w in works), initial=sum(len(w.done) for w in works), desc="evaluate",
               unit="ex", disable=not cfg.progress, dynamic_ncols=True)

    def finisher(work: BenchWork):
        def finish(unit, item) -> None:
            _record(work, store, [episodes[work.bench].row(unit, item)])
            bar.update(1)
            left[work.bench] -= 1
            if left[work.bench] == 0:
                on_complete(work)
        return finish

    jobs = [job for w in works
            for job in scheduler.episode_jobs(w.todo, episodes[w.bench], _tool_batcher(engine, episodes[w.bench], cfg), finisher(w))]
    try:
        engine.run(scheduler.run_async(jobs, engine, max_in_flight=cap, max_model_len=int(cfg.max_model_len)))
    finally:
        bar.close()


def score_teacher_forced(work: BenchWork, held, cfg, backend, store: EvalStore) -> None:
    """A teacher-forced bench: each remaining record of the opened held-out set `held` scored at the
    checkpoint (evals.teacher_forced.score: span losses, rendered with the set's own render settings),
    appended in order."""
    if not work.todo:
        return
    bar = tqdm(total=len(work.items), initial=len(work.done), desc=work.bench, unit="rec", disable=not cfg.progress,
               dynamic_ncols=True)
    for row in teacher_forced.score(work.todo, backend.model, backend.tokenizer, held):
        _record(work, store, [row])
        bar.update(1)
    bar.close()


def _tool_batcher(engine: Engine, episodes: Episodes, cfg):
    if episodes.execute is None:
        return None
    return engine.tool_batcher(episodes.execute, window_ms=float(cfg.tool_batch_window_ms),
                               max_queries=int(cfg.tool_batch_size))


def _record(work: BenchWork, store: EvalStore, rows: list[dict]) -> None:
    work.done.update((r["id"], r) for r in store.append(work.bench, work.ident, rows))


def resolve_in_flight(cfg, engine: Engine) -> int:
    """`max_in_flight`: N as given, or auto (evals.scheduler.auto_in_flight of the engine's KV
    capacity and max_model_len; `batch_size` for an engine that reports no capacity)."""
    if cfg.max_in_flight != "auto":
        return int(cfg.max_in_flight)
    capacity = engine.kv_capacity()
    if capacity is None:
        return int(cfg.batch_size)
    kv_tokens, max_seqs = capacity
    return scheduler.auto_in_flight(kv_tokens, int(cfg.max_model_len), max_seqs)


def resolve_driver(cfg, backend) -> str:
    """`driver`: auto -> async for backend=vllm (or a passed-in evals.engine.Engine), lockstep
    otherwise. Any engine plays lockstep (evals.engine.Lockstep); async needs an Engine."""
    is_async = isinstance(backend, Engine) if backend is not None else cfg.backend == "vllm"
    if cfg.driver == "auto":
        return "async" if is_async else "lockstep"
    if cfg.driver == "async" and not is_async:
        raise EvalError("driver=async needs an asynchronous engine: backend=vllm (vLLM's AsyncLLM); "
                        "backend=hf runs driver=lockstep")
    return str(cfg.driver)


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

        tokenizer = load_tokenizer(cfg.tokenizer, str(cfg.ckpt))
    return thinking.template_problem(cfg.enable_thinking, tokenizer.chat_template, "enable_thinking", str(cfg.ckpt))


def check_checkpoint_files(ckpt: str, ckpt_id: dict) -> None:
    """A checkpoint that carries `SHA256SUMS` (every one the trainers write) is evaluated only when
    each file matches it and none is unlisted: its identity is the digest of that list, so a file
    changed or added after the fact would be scored under the identity of the model it no longer is. For the
    same reason an identity taken earlier (analyze's plan, data_parallel's parent) must still be the digest of that
    list: a checkpoint redone meanwhile at the same path is refused, not scored under the model it replaced."""
    if ckpt_id.get("kind") != "sha256sums":
        return
    if (now := dir_identity(ckpt)) != ckpt_id:
        raise EvalError(f"{ckpt}: its SHA256SUMS is no longer the one its identity was taken from (digest "
                        f"{str(ckpt_id.get('digest'))[:16]}… then, {str(now.get('digest'))[:16]}… now): the checkpoint "
                        "changed since; evaluate it again, which takes its identity anew")
    problems = check_sha256sums(ckpt)
    if problems:
        more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
        raise EvalError(f"{ckpt}: refusing to evaluate: its files do not match its SHA256SUMS: {'; '.join(problems[:3])}{more}")


def evaluate(cfg, *, backend=None, retriever=None, ckpt_id: dict | None = None) -> dict:
    """Evaluate `cfg.ckpt` on `cfg.benches`; returns the summary dict also written to summary.json, less the
    benches out holds of another checkpoint (kept there, labelled by their identities in meta.json).
    `backend` / `retriever` may be passed in (tests, a caller that keeps a model loaded): an
    evals.engine.Engine, or a batched backend played in lockstep; a backend built here is closed
    here, on any exit (vLLM: its engine process shut down, not left to die). `ckpt_id`: the
    checkpoint's identity when the caller has it (a data_parallel shard), so the weights are hashed
    once per evaluation and a hub id is loaded at the commit it names (common.hub.hold). The config is
    resolved once, here, unless it comes resolved (a `Resolved`: resolve's with engine=True, with the
    checkpoint's identity when known).

    One evaluation writes an out dir at a time: its lock (EvalStore.lock) is taken here, once, for the
    whole call (data_parallel's shards each hold their own shard dir's; the final merge runs in this
    call) and released on any exit, so the next segment of a stopped Slurm task, in this process or a
    requeued one, takes it; a second evaluation of the out dir is refused at once, naming the holder."""
    # refused before any shard, model or row: an engine it cannot build (a Resolved was, when resolved), a switch
    # its template ignores
    if isinstance(cfg, Resolved):
        cfg, ckpt_id = cfg.cfg, ckpt_id or cfg.ckpt_id
    else:
        cfg = resolve(cfg, engine=backend is None)
    if (ckpt_id or {}).get("kind") == "hub":   # taken earlier (a plan, a shard's parent): loaded at the commit it names
        hub.hold(str(ckpt_id["repo"]), ckpt_id.get("revision"))
    if backend is None and (problem := thinking_problem(cfg)):
        raise EvalError(problem)
    held = EvalStore(cfg.out).lock()
    try:
        if backend is None and int(cfg.data_parallel) > 1:   # N engine processes (evals.parallel)
            return _evaluate_sharded(cfg, ckpt_id)
        owned: list = []
        try:
            return _evaluate(cfg, backend, retriever, owned, ckpt_id)
        finally:
            for b in owned:
                b.close()
    finally:
        os.close(held)


def _evaluate_sharded(cfg, ckpt_id: dict | None = None) -> dict:
    """data_parallel=N: identities claimed in out first, the shards run and merged in item order, then
    the ordinary evaluate on out with every row present (evals.parallel)."""
    from evals import parallel

    groups = parallel.device_groups(cfg)
    store = EvalStore(cfg.out)
    store.out.mkdir(parents=True, exist_ok=True)
    identities = store.identities()
    ckpt_id = ckpt_id or checkpoint_identity(str(cfg.ckpt))
    check_checkpoint_files(str(cfg.ckpt), ckpt_id)
    wanted = {bench: bench_request(bench, cfg, ckpt_id) for bench in cfg.benches}
    for bench in cfg.benches:
        store.claim(bench, wanted[bench], identities.get(bench), bool(cfg.overwrite))
    single = OmegaConf.merge(cfg, {"data_parallel": 1})
    if _left_to_evaluate(single, store, wanted):
        parallel.run_shards(cfg, groups, ckpt_id)
        parallel.merge(cfg, len(groups))
    summary = _evaluate(single, parallel.RowsOnly(cfg), parallel.Unused(), [], ckpt_id)
    parallel.remove_shards(store.out)
    return summary


def _evaluate(cfg, backend, retriever, owned: list, ckpt_id: dict | None) -> dict:
    store = EvalStore(cfg.out)
    store.out.mkdir(parents=True, exist_ok=True)
    old_meta, identities = store.meta(), store.identities()
    # Identities first: a bench held under another identity is refused before any model is loaded.
    ckpt_id = ckpt_id or checkpoint_identity(str(cfg.ckpt))
    check_checkpoint_files(str(cfg.ckpt), ckpt_id)
    wanted = {bench: bench_request(bench, cfg, ckpt_id) for bench in cfg.benches}
    for bench, ident in wanted.items():
        store.claim(bench, ident, identities.get(bench), bool(cfg.overwrite))
    searches = any(uses_retriever(b) for b in cfg.benches)
    driver = resolve_driver(cfg, backend)
    if backend is not None and (problem := thinking_problem(cfg, backend.tokenizer)):   # evaluate() checked its own
        raise EvalError(problem)
    # Sampled and matched with the rows out holds before anything is loaded: with nothing left to
    # play (a rerun, a requeued Slurm task, a data_parallel shard with no items) no model is loaded
    # and no retriever built: the summary is rewritten from the rows, only the tokenizer is read.
    # Each kind's item source opened once (the held-out set: verified, and refused when the
    # checkpoint trained on one of its records), then every bench sampled from it.
    opened = open_sources(cfg)
    works = [prepare_bench(bench, cfg, store, wanted[bench], opened) for bench in cfg.benches]
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
    for bench in sorted(store.benches() - set(cfg.benches)):
        if (s := store.complete_summary(bench, identities.get(bench))) is not None:
            summary[bench] = s
    # those of another checkpoint (out= given to two models) stay in summary.json, each labelled by its identity in
    # meta.json, but are not this checkpoint's: not returned, shown, logged or averaged as its results
    others = [b for b in summary if of_another_checkpoint(identities.get(b), ckpt_id)]
    for work in works:
        store.start(work.bench, work.ident, {"bench": work.bench, "source": work.source, "seed": int(cfg.seed),
                                             "n": len(work.items), "ids": [it.id for it in work.items],
                                             "unanswerable_excluded": work.unanswerable}, identities, cfg)
    records: dict = {}
    started = time.time()
    episodes = {bench: kind_of(bench).episodes(bench, cfg, backend.tokenizer, retriever, style) for bench in cfg.benches
                if not kind_of(bench).scores}
    scored = [w for w in works if kind_of(w.bench).scores]
    tf_names = {w.bench for w in scored}
    if any(w.todo for w in scored) and not backend.logits:
        raise EvalError(f"benches {', '.join(w.bench for w in scored)} are teacher-forced losses: they need the model's "
                        "logits, backend=hf (evaluate them in a call of their own)")

    def complete(work: BenchWork) -> None:
        summary[work.bench], records[work.bench] = bench_summary(work), work.record
        store.write_summary(summary)  # after every bench, so a crash keeps finished ones

    for work in scored:   # no episodes: the model's own losses on held-out records
        score_teacher_forced(work, opened[kind_of(work.bench).name], cfg, backend, store)
        complete(work)
    if driver == "lockstep":
        engine = Lockstep(backend)
        for work in works:
            if work.bench not in tf_names:
                play_lockstep(work, cfg, engine, episodes[work.bench], store)
                complete(work)
    else:   # every bench of the checkpoint pooled through one engine
        for work in works:
            if not work.todo and work.bench not in tf_names:
                complete(work)
        if playing := [w for w in playing if w.bench not in tf_names]:
            play_pooled(playing, episodes, cfg, backend, store, complete)
        summary = {**{b: summary[b] for b in summary if b not in cfg.benches}, **{b: summary[b] for b in cfg.benches}}
        store.write_summary(summary)
    kept = [b for b in summary if b not in cfg.benches]
    own = {b: s for b, s in summary.items() if b not in others}
    meta = {
        "ckpt": str(cfg.ckpt), "checkpoint_identity": ckpt_id, "identities": identities,
        "tokenizer": cfg.tokenizer, "prompt": cfg.prompt, "backend": cfg.backend, "driver": driver,
        "n": cfg.n, "seed": int(cfg.seed), "benches": list(cfg.benches), "tool_style": style,
        "profile": cfg.profile, "bench_items": records,
        "retriever": cfg.retriever if searches else None, "corpus": cfg.corpus, "retriever_url": cfg.retriever_url,
        "sampled_ids": {b: str(store.sample_path(b)) for b in records},
        "search7_mean": {k: unweighted_mean(own, SEARCH7, k) for k in QA_KEYS},
        # items whose gold answers include one that normalizes to nothing (cover-EM 1 for anything)
        "empty_gold_items": {b: summary[b]["empty_gold_items"] for b in cfg.benches
                             if "empty_gold_items" in summary.get(b, {})},
        "skip_empty_golds": bool(cfg.skip_empty_golds),
        # items that stopped at context_limit before their first generated token (their first prompt did not fit)
        "prompt_too_long_items": {b: (summary[b].get(PROMPT_TOO_LONG) or {}).get("items", 0) for b in cfg.benches
                                  if b not in tf_names and b in summary},
        "config": None, "versions": _versions(),
        "seconds": round(time.time() - started, 3),
    }
    store.write_meta(meta, cfg, kept=kept, old=old_meta, opened=opened)
    from evals.wandb_log import log_summary

    if others:
        held = ", ".join(f"{b} ({identities[b].get('ckpt_path')})" for b in others)
        print(f"[evaluate] {cfg.out} also holds benches of another checkpoint: {held}; kept in summary.json under their "
              f"own identities (meta.json), not reported as {cfg.ckpt}'s", flush=True)
    logged = log_summary(cfg, own)
    if logged:
        print(f"[evaluate] summary logged to {logged}", flush=True)
    return own


def format_table(summary: dict) -> str:
    """Bench averages x100 (a QA bench) or the bench kind's own line, the unweighted 7-bench mean, and a legend
    of the columns and names shown, for the terminal."""
    w = max([18, *(len(b) + 2 for b in summary)])
    kinds = [kind_of(b) for b in summary]
    qa = any(not k.console for k in kinds)
    lines = [f"{'bench':<{w}}{'n':>6}" + (f"{'EM':>8}{'F1':>8}{'coverEM':>9}{'strictEM':>10}{'fmtfail':>9}" * qa)]
    for bench, s in summary.items():
        console = kind_of(bench).console
        if s.get(NULL_REASON):
            lines.append(f"{bench:<{w}}{s['n']:>6}  no score: {s[NULL_REASON]}")
        elif console:   # the kind's own line (evals.registry)
            lines.append(f"{bench:<{w}}{s['n']:>6}  " + console.format_map(collections.defaultdict(lambda: float("nan"), s)))
        else:
            lines.append(f"{bench:<{w}}{s['n']:>6}{100 * s['em']:>8.1f}{100 * s['f1']:>8.1f}{100 * s['cover_em']:>9.1f}"
                         f"{100 * s['strict_em']:>10.1f}{100 * s['format_failure_rate']:>9.1f}")
    means = {k: unweighted_mean(summary, SEARCH7, k) for k in QA_KEYS}
    if means["em"] is not None:
        lines.append(f"{'7-bench mean':<{w}}{'':>6}{100 * means['em']:>8.1f}{100 * means['f1']:>8.1f}"
                     f"{100 * means['cover_em']:>9.1f}{100 * means['strict_em']:>10.1f}")
    # a scored bench some of whose items never generated (each scored 0): said under the table, not hidden in it
    lines += [f"{bench}: {too_long_text(s[PROMPT_TOO_LONG], s['n'])} (each scored 0)" for bench, s in summary.items()
              if isinstance(s.get(PROMPT_TOO_LONG), dict) and not s.get(NULL_REASON)]
    legends = [QA_LEGEND] * qa + list(dict.fromkeys(k.legend for k in kinds if k.console))
    return "\n".join([*lines, f"({'; '.join(legends)}; docs/glossary.md)"])


# The legend of a QA bench's columns, in the one line under the table that says what its short names mean
# (docs/glossary.md, "Columns"); each other bench kind's names: its `legend` (evals.registry).
QA_LEGEND = ("per cent of items: EM exact match, F1 token overlap, coverEM a gold answer inside the prediction, "
             "strictEM exact match of a `Final answer:` line only, fmtfail no answer extracted")
