"""`python -m demo` (`make demo`): the whole study on the embedded default, on CPU.

1. `launch arm=A seed=S model=tiny_base data=synthetic steps=... save_steps=[...]` for every arm x seed:
   synthetic data per arm, the tiny Qwen3 trained with several step checkpoints per arm. The runs go
   `parallel` at a time (default: all of them), each a single-threaded process (OMP_NUM_THREADS=1):
   on a 2-core machine three 1-thread runs side by side finish well before three 2-thread runs in a
   row (a 1.3M-parameter model does not keep two threads busy). Each run's output goes to
   `<runs_root>/_logs/<arm>-seed<S>.log`; `parallel=1` is the plain `launch sweep` in this process.
0. `data_prep.build.build_heldout`: the held-out split (`heldout_n` gold trajectories per domain, generated
   with `heldout_seed` from the same world), written once to `<runs_root>/_heldout`; every arm is built with
   `data.heldout=` it, so no arm trains on a held-out trajectory, and every checkpoint is scored on it
   by the teacher-forced benches `tf_code` / `tf_search` (the loss per span kind; analysis.tf_curves).
2. `data_prep.synthetic.write_synthetic_bench`: a QA bench (`synthqa`, held-out questions with golden
   answers) over a corpus generated from the same world as the training data, retrieved with BM25.
3. The anchor, evaluated with `prompt=anchor_nudge`: the base every arm starts from. For
   `model=tiny_base` (default) that is the committed pretrained tiny base (`common/tiny_base/`); for
   `model=tiny` the step-0 random init (the trainer seeds it with the run seed, so
   `save_tiny_model(seed=seeds[0])` is the very same weights).
4. `analyze benches=[synthqa,search_plan_ood,tf_code,tf_search] ...`: every checkpoint evaluated, transfer
   curves, the format-vs-capability decomposition, the teacher-forced curves, tables and report.md into
   `out` (default reports/).

Every phase is incremental (finished runs are skipped, evaluated checkpoints are not re-evaluated),
so re-running after an interruption continues. `dry_run=true` prints the plan and runs nothing.
"""
from __future__ import annotations

import shlex
import shutil
import sys
import time
from pathlib import Path

from omegaconf import OmegaConf

from common.cli import ConfigError, apply_overrides, run_cli, wants_help
from common.fields import FLAG, NONEMPTY, Choices, Number, Test, is_int, list_of, plain

DEFAULTS = {
    "runs_root": "runs/demo",
    "out": "reports",
    "arms": ["r2e", "search", "mixed"],
    # tiny_base: the committed pretrained tiny model (it can read; the study's base is pretrained too).
    # tiny: the same architecture from a random init (the anchor is then that init).
    "model": "tiny_base",
    "seeds": [0],
    # model=tiny_base trains 4 trajectories per step: the search arm calls search and answers from
    # step ~150 (synthqa EM 0.85 at 150 and 200; measured, README).
    "steps": 200,
    "save_steps": [50, 100, 150],  # the final step is always saved too
    "n": 1000,  # trajectories built per arm (steps x 4 are used)
    # data.synthetic.search_extra: vague searches before the right one. [0,0]: none, so 200 tiny-model
    # steps go to "search the entity, copy the fact" instead of recovering from a miss.
    "search_extra": [0, 0],
    "launch_args": [],  # extra `launch` overrides, e.g. ["lr=1e-3"]
    # training runs at a time, each a 1-thread process; null = every arm x seed at once; 1 = `launch sweep` here
    "parallel": None,
    "train": True,  # false: skip launch (analyze what runs_root already holds)
    "world_seed": 0,  # the synthetic world shared by training data and the QA bench
    # search_plan_act train-split episodes (envs exporter) added to the search pool, so the search and
    # mixed arms see the tool-plan-finish loop that `search_plan_ood` scores (its OOD split never
    # shares templates with train). 0 (default) disables: measured with 300 on the tiny base, the
    # search_plan_ood reward stays 0 at step 200 and the search arm's synthqa EM drops (0.775 -> 0.675,
    # measured on an earlier version; README).
    "envs_episodes": 0,
    "heldout_n": 4,  # held-out gold trajectories per domain (the teacher-forced benches tf_code, tf_search)
    "heldout_seed": 1000,  # their generator seed: apart from the arms' seeds
    "bench_n": 60,  # held-out synthqa questions written
    "eval_n": 40,  # examples per bench per checkpoint
    "max_turns": 4,
    "max_new_tokens": 96,
    "max_model_len": 2048,
    "copy_figures_to": None,  # also copy the PNG figures into this dir (the README's figures)
    "dry_run": False,
}
BENCHES = ["synthqa", "search_plan_ood"]
TF_BENCHES = ["tf_code", "tf_search"]   # teacher-forced losses on the held-out split (every checkpoint)


def _list(xs) -> str:
    return "[" + ",".join(str(x) for x in xs) + "]"


def envs_export_path(cfg) -> Path:
    return Path(cfg.runs_root) / "_envs" / f"search_plan_act_train_{int(cfg.envs_episodes)}.jsonl"


def heldout_path(cfg) -> Path:
    return Path(cfg.runs_root) / "_heldout"


def synthetic_knobs(cfg) -> dict:
    """The data.synthetic knobs of every arm (and of the held-out split: the same world)."""
    return {"world_seed": int(cfg.world_seed), "search_extra": list(cfg.search_extra)}


def write_heldout(cfg) -> Path:
    """The held-out split, written once (data_prep.heldout); an existing one is kept as it is."""
    from data_prep import heldout
    from data_prep.build import build_heldout

    path = heldout_path(cfg)
    if not (path / heldout.COMPLETE).is_file():
        build_heldout({"kind": "synthetic", "synthetic": synthetic_knobs(cfg)}, n=int(cfg.heldout_n),
                      domains=["code", "search"], seed=int(cfg.heldout_seed), tokenizer="tiny", out=path,
                      progress=False, num_proc=1)
    return path


def launch_argv(cfg) -> list[str]:
    extra = [f"data.sources.search=[canonical:{envs_export_path(cfg)}]"] if cfg.envs_episodes else []
    extra.append(f"data.heldout={heldout_path(cfg)}")
    return ["sweep", f"arms={_list(cfg.arms)}", f"seeds={_list(cfg.seeds)}", f"model={cfg.model}", "data=synthetic",
            f"steps={cfg.steps}", f"save_steps={_list(cfg.save_steps)}", f"n={cfg.n}", f"runs_root={cfg.runs_root}",
            f"data.synthetic.world_seed={cfg.world_seed}", f"data.synthetic.search_extra={_list(cfg.search_extra)}", *extra, *[str(a) for a in cfg.launch_args]]


def run_argvs(cfg) -> list[list[str]]:
    """One `launch` command line per arm x seed: what `launch sweep` would run one after another."""
    from launch.sweep import parse_sweep

    return parse_sweep(launch_argv(cfg)[1:])[0]


def train_parallel(cfg) -> int:
    """Every arm x seed as its own single-threaded `launch` process, `parallel` at a time; 0 when all
    finished. Each is a normal `launch` (finished runs are skipped, interrupted ones resume)."""
    import os
    import signal
    import subprocess

    runs = run_argvs(cfg)
    width = len(runs) if cfg.parallel is None else int(cfg.parallel)
    logs = Path(cfg.runs_root) / "_logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    pending, active, failed = list(runs), [], []

    def stop(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        while pending or active:
            while pending and len(active) < width:
                argv = pending.pop(0)
                log = logs / f"{argv[0].split('=', 1)[1]}-seed{argv[1].split('=', 1)[1]}.log"
                print(f"[demo] launch {' '.join(argv[:2])} (1 thread) -> {log}", flush=True)
                with open(log, "ab") as fh:
                    proc = subprocess.Popen([sys.executable, "-m", "launch.cli", *argv], stdout=fh, stderr=subprocess.STDOUT, env=env)
                active.append((argv, log, proc))
            argv, log, proc = active.pop(0)
            rc = proc.wait()
            print(f"[demo] {' '.join(argv[:2])}: exit {rc}", flush=True)
            if rc != 0:
                failed.append(argv[:2])
                tail = log.read_text(errors="replace").splitlines()[-15:]
                print("\n".join(f"    {line}" for line in tail), file=sys.stderr)
    finally:  # interrupted: each launch forwards the stop to its trainer, which saves a state to resume from
        signal.signal(signal.SIGTERM, previous)
        for _, _, proc in active:
            if proc.poll() is None:
                proc.terminate()
        for _, _, proc in active:
            proc.wait()
    return 1 if failed else 0


def export_envs_episodes(cfg) -> Path:
    """Genuine-policy search_plan_act episodes (train split) as canonical jsonl, written once."""
    from envs.search_plan_act import export_trajectories

    path = envs_export_path(cfg)
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        export_trajectories(tmp, n=int(cfg.envs_episodes), seed=int(cfg.world_seed), split="train")
        tmp.replace(path)
    return path


MODELS = ("tiny_base", "tiny")
_COUNT, _SEED = Number(lo=1, integer=True), Number(lo=0, integer=True)
RULES = {  # what each value of DEFAULTS may be, checked before anything runs (a dry run's too)
    "runs_root": NONEMPTY, "out": NONEMPTY, "model": Choices(MODELS),
    "arms": list_of(lambda a: isinstance(a, str), "a non-empty list of arms", size=lambda n: n > 0),
    "seeds": list_of(is_int, "a non-empty list of integer seeds", size=lambda n: n > 0),
    "save_steps": list_of(is_int, "a list of integer steps"), "search_extra": list_of(is_int, "a list of integers"),
    "launch_args": list_of(lambda a: isinstance(a, str), "a list of launch overrides (key=value strings)"),
    "parallel": Number(lo=1, integer=True, null=True), "train": FLAG, "dry_run": FLAG,
    "copy_figures_to": Test(lambda v: v is None or (NONEMPTY.ok(v) and not Path(v).is_file()), "null or a directory"),
    **dict.fromkeys(("world_seed", "envs_episodes", "heldout_seed"), _SEED),
    **dict.fromkeys(("steps", "n", "heldout_n", "bench_n", "eval_n", "max_turns", "max_new_tokens", "max_model_len"), _COUNT),
}


def anchor_path(cfg) -> Path:
    """The base the arms start from: the committed tiny base, or a saved copy of the random init."""
    from common.tiny import TINY_BASE_DIR

    return TINY_BASE_DIR if cfg.model == "tiny_base" else Path(cfg.runs_root) / "_anchor_model"


def analyze_config(cfg) -> dict:
    root = Path(cfg.runs_root)
    bench = root / "_bench"
    return {
        "runs_root": str(root), "out": str(cfg.out), "benches": BENCHES + TF_BENCHES, "anchor": str(anchor_path(cfg)),
        "cards": True,   # reports/cards/: a model card per final checkpoint
        "eval": {"n": int(cfg.eval_n), "corpus": str(bench / "corpus.jsonl"), "bench_root": str(bench),
                 "max_turns": int(cfg.max_turns), "max_model_len": int(cfg.max_model_len),
                 "max_new_tokens": int(cfg.max_new_tokens), "index_dir": str(bench / "bm25_index"),
                 "heldout": str(heldout_path(cfg))},
    }


def describe(cfg) -> str:
    a = analyze_config(cfg)
    ev = " ".join(f"eval.{k}={shlex.quote(str(v))}" for k, v in a["eval"].items())   # as analyze reads them
    return "\n".join([
        "demo plan:",
        *([f"  0. envs export: {int(cfg.envs_episodes)} search_plan_act train episodes -> {envs_export_path(cfg)}"]
          if cfg.envs_episodes and cfg.train else []),
        f"  0. held-out split: build_heldout(n={int(cfg.heldout_n)} per domain, seed={int(cfg.heldout_seed)}) -> "
        f"{heldout_path(cfg)}",
        f"  1. launch {' '.join(launch_argv(cfg))}" + ("" if cfg.train else "   (skipped: train=false)")
        + ("" if cfg.parallel == 1 or not cfg.train else
           f"\n     as {len(run_argvs(cfg))} single-threaded `launch arm=A seed=S ...` processes, "
           f"{'all' if cfg.parallel is None else int(cfg.parallel)} at a time"),
        f"  2. write_synthetic_bench({cfg.runs_root}/_bench, seed={cfg.world_seed}, n={cfg.bench_n})"
        " -> corpus.jsonl + synthqa/test.jsonl",
        (f"  3. anchor: {a['anchor']} (the committed pretrained tiny base)" if cfg.model == "tiny_base" else
         f"  3. anchor: save_tiny_model({a['anchor']}, seed={cfg.seeds[0]}) (the random init of step 0)"),
        f"  4. analyze runs_root={shlex.quote(a['runs_root'])} benches={_list(a['benches'])} "
        f"anchor={shlex.quote(a['anchor'])} out={shlex.quote(a['out'])} "
        f"cards={str(a['cards']).lower()} {ev}",
        f"     (the teacher-forced benches {_list(TF_BENCHES)} on the held-out split: eval.heldout)",
    ])


def _phase(name: str, timings: dict, fn):
    t0 = time.time()
    print(f"[demo] {name} ...", flush=True)
    out = fn()
    timings[name] = time.time() - t0
    print(f"[demo] {name}: {timings[name]:.0f}s", flush=True)
    return out


def run_demo(cfg) -> int:
    root = Path(cfg.runs_root)
    timings: dict[str, float] = {}
    _phase("held-out split", timings, lambda: write_heldout(cfg))   # before training: the arms leave it out
    if cfg.train:
        from launch.cli import main as launch_main

        if cfg.envs_episodes:
            _phase("search_plan_act episodes (envs export)", timings, lambda: export_envs_episodes(cfg))

        if cfg.parallel == 1:
            rc = _phase("train (launch sweep)", timings, lambda: launch_main(launch_argv(cfg)))
        else:
            rc = _phase("train (parallel launches)", timings, lambda: train_parallel(cfg))
        if rc != 0:
            print(f"[demo] launch sweep failed (exit {rc}); analyzing whatever checkpoints exist", file=sys.stderr)

    def bench():
        from data_prep.synthetic import write_synthetic_bench

        return write_synthetic_bench(root / "_bench", seed=int(cfg.world_seed), n=int(cfg.bench_n))

    _phase("synthetic QA bench", timings, bench)

    def save_random_init_anchor():
        from sft.tiny import save_tiny_model

        path = anchor_path(cfg)
        if not (path / "config.json").is_file():
            save_tiny_model(path, seed=int(cfg.seeds[0]))
        return path

    if cfg.model == "tiny":  # tiny_base's anchor is the committed base itself
        _phase("anchor model", timings, save_random_init_anchor)
    from launch.analyze import run_analysis

    result = _phase("evaluate + analyze", timings, lambda: run_analysis(analyze_config(cfg)))
    curves = Path(cfg.out) / "figures" / "curves_em.png"
    if cfg.copy_figures_to:
        dest = Path(cfg.copy_figures_to)
        dest.mkdir(parents=True, exist_ok=True)
        for png in sorted((Path(cfg.out) / "figures").glob("*.png")):
            shutil.copyfile(png, dest / f"demo_{png.name}")
    print(f"[demo] done in {sum(timings.values()):.0f}s: " + ", ".join(f"{k} {v:.0f}s" for k, v in timings.items()))
    print(f"[demo] report: {result.report}; figure: {curves}; table: {Path(cfg.out) / 'tables' / 'main_em.md'}")
    if result.missing:
        print(f"[demo] {len(result.missing)} missing point(s), listed in the report")
    if result.html is not None:   # last: the page to open (figures, tables, every trajectory)
        print(f"[demo] open in a browser: {result.html.resolve()}")
    return 0 if rc_ok(result) else 1


def rc_ok(result) -> bool:
    return result is not None and not result.table.empty


def _main(argv: list[str]) -> int:
    base = OmegaConf.create(DEFAULTS)
    if wants_help(argv):
        print(__doc__ + "\nOptions (key=value):\n" + OmegaConf.to_yaml(base))
        return 0
    cfg = apply_overrides(base, argv)
    if bad := [p for key, rule in RULES.items() if (p := rule.problem(key, plain(cfg[key])))]:
        raise ConfigError(bad[0])
    if not any(a.startswith("save_steps=") for a in argv):   # the default cadence, cut at a shorter run's end as launch cuts its own
        cfg.save_steps = [s for s in cfg.save_steps if s < cfg.steps]
    elif late := [s for s in cfg.save_steps if s > cfg.steps]:
        raise ConfigError(f"save_steps={plain(cfg.save_steps)}: {late} past the run's last step (steps={cfg.steps}); "
                          "drop them or train longer")
    print(describe(cfg))
    if cfg.dry_run:
        return 0
    return run_demo(cfg)


def main(argv: list[str] | None = None) -> int:
    return run_cli(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
