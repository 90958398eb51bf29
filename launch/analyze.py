"""`analyze` (HELP below; docs/stages/analyze.md): what is left to evaluate by identity (launch.evaluation), run here
or as Slurm jobs (launch.eval_slurm), then analysis.sweep.write_analysis's report; `run_analysis` is its Python API."""
from __future__ import annotations

import sys
from contextlib import nullcontext, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from analysis.axes import check_axis
from analysis.discover import SEED_DIR, anchor_eval_dir, discover_runs, read_json_object
from analysis.errors import AnalysisError
from analysis.sweep import DEFAULT_BENCHES, AnalysisResult, compare_pairs, write_analysis
from common import datafetch, fields, interpreter, schema
from common.cards import write_report_cards
from common.cli import ConfigError, KeySpace, apply_overrides, did_you_mean, flat_keys, merge, run_cli, wants_help
from common.fields import NONEMPTY, Default, Number, Test, choice, field, flag, list_of, number, text
from common.tiny import resolve_model_path
from evals.config import DIRECTORY, KEYS as EVALUATE, bench_keys, load_config
from evals.profiles import load_profile
from evals.registry import metric_specs
from launch import preflight
from launch.jobs import CLUSTER_KEYS, backend
from launch.slurm import slurm_option_problems
from launch.eval_slurm import read_task, submit, tasks_report
from launch.evaluation import Evaluator, EvalReport, Harness, candidates, check_settings, harness, plan, run_job


AFTER = "one sbatch dependency (e.g. afterok:5001_0) or null per run of slurm.runs"
KEYS: dict[str, Any] = {  # common.fields: `analyze --help` and docs/keys/analyze.md
    "runs_root": field("the study: runs discovered as <runs_root>/<arm>/[<name>/]seed<seed>/", "runs", rule=NONEMPTY),
    "out": field("where results, figures, tables and report.md go", "reports", rule=NONEMPTY),
    "benches": field("null -> the profile's benches, or the Search-R1 seven + search_plan_ood", None,
                     rule=list_of(NONEMPTY.ok, "null or a list of bench names, e.g. [nq,musique@given]", size=bool, null=True)),
    "profile": text("evaluation profile (recipes/eval/<profile>.yaml): reads/writes eval/<profile>/ dirs"),
    "evaluate": flag("false: only aggregate the evaluations already on disk", True),
    "anchor": text("base model dir or hub id, evaluated once with prompt=anchor_nudge as step 0"),
    "anchor_dir": field("null -> <runs_root>/_anchor", None, rule=DIRECTORY),
    "metrics": field("QA metrics tabulated and plotted (a report with no QA bench: one `*_env` set, each column its "
                     "bench's own metric)", ["em", "f1"], rule=list_of(NONEMPTY.ok, "a non-empty list of metric names, e.g. [em,f1]", size=bool)),
    "conf": number("confidence level of the intervals", 0.95, lo=0, hi=1, lo_open=True, hi_open=True),
    "power.pilot": text("a pilot's per-item results (an eval dir, or a runs root with an anchor): print the seeds × "
                        "items needed for power.power at power.effect and the design's minimum detectable effect, "
                        "then exit (analysis/power.py states the variance model)"),
    "power.effect": field("the target effect (difference to the anchor in the metric's units; not 0)", 0.042,
                          rule=Test(lambda v: Number().ok(v) and v != 0, "a number other than 0 (the effect to detect)")),
    "power.power": number("the target power", 0.8, lo=0, hi=1, lo_open=True, hi_open=True),
    "power.alpha": number("the two-sided test level", 0.05, lo=0, hi=1, lo_open=True, hi_open=True),
    "power.metric": field("the per-item metric the power is for", "em", rule=NONEMPTY),
    "power.seed_sd": number("the seed SD assumed when the pilot has one seed (it cannot be estimated from it)", 0.0, lo=0),
    "power.max_seeds": number("the items needed are listed for 1..max_seeds seeds; the recommendation stays within it, "
                              "else the report names the fewest seeds that reach the target", 10, lo=1, integer=True),
    "power.design_items": number("the current design's items per bench (null: the pilot's)", None, lo=1, integer=True, null=True),
    "power.design_seeds": number("the current design's seeds (null: the pilot's)", None, lo=1, integer=True, null=True),
    "axis": field("x of every curve: step | examples | tokens | trainable_tokens (seen by each checkpoint, "
                  "read exactly from the runs' metrics.jsonl; analysis/axes.py)", "step"),
    "allow_failed": flag("true: an analysis some of whose expected points failed to evaluate exits 0 (its report, "
                         "marked PARTIAL in its first line, lists them); false: it exits 4", False),
    "dry_run": field("true: print the plan (runs, checkpoints, evaluations to run) and exit", False),
    "compare": field("pairs of arms compared step by step, e.g. [[r2e, r2e_v5]]: per step both were evaluated at, "
                     "A − B over the items both evaluated, its interval covering items and each arm's seeds ('items' "
                     "only where an arm has one seed) (tables/compare_<A>_vs_<B>_<metric>.*, a variant's / as -)", [],
                     rule=list_of(lambda pair: True, "a list of pairs of arm names, e.g. [[r2e,r2e_v5]]")),
    "compare_allow_settings": flag("true: compare arms evaluated under different result-changing settings "
                                   "(refused otherwise, naming the setting)", False),
    "study": text("a study file (name or path): its reference_results shown beside ours (tables/reference.*)"),
    "launcher": field("local: evaluate here | slurm: a job array (one task per checkpoint to evaluate) + an aggregation job", "local",
                      rule=NONEMPTY),
    "slurm.gpus_per_task": number("launcher=slurm: GPUs per array task; null -> data_parallel (x tensor_parallel_size "
                                  "with backend=vllm; eval.* or the profile's), 1 by default", None, lo=0, integer=True, null=True),
    "slurm.concurrency": number("launcher=slurm: array tasks running at once (--array=0-N%K); null: no cap", None, lo=1,
                                integer=True, null=True),
    **{f"slurm.{k}": schema.LAUNCHER[f"launcher.{k}"] for k in CLUSTER_KEYS},
    "python.eval": schema.PYTHON["python.eval"],
    "slurm.after": field("launcher=slurm: a dependency the array waits for, e.g. afterok:4242 (a training job)", None,
                         rule=Test(lambda v: v is None or NONEMPTY.ok(v), "null or one sbatch dependency, e.g. afterok:4242")),
    "slurm.runs": field("launcher=slurm: one evaluation job per run dir listed (launch sweep eval_profile= passes its "
                        "runs), each planning its run's checkpoints when it starts, then the aggregation (afterany)", None,
                        rule=list_of(NONEMPTY.ok, "a list of run dirs, e.g. [runs/r2e/seed0,runs/r2e/seed1]", size=bool, null=True)),
    "slurm.jobs_file": text("set by a study (launcher=slurm): its jobs.json, to which the ids of the jobs this analysis "
                             "submits are added, named after its own (report.eval, report.aggregate)"),
    "slurm.runs_after": field("with slurm.runs: each run's job's dependency, in order (e.g. afterok:5001_0, task 0 of "
                              "training array 5001; null: none); one that can never be met cancels the job", None,
                              rule=list_of(lambda a: a is None or (NONEMPTY.ok(a) and a.strip() == a), AFTER, null=True)),
    "eval_tasks": field("set by the aggregation job: the evaluation jobs' config files (launcher=slurm); evaluate "
                        "nothing, report the failed ones as gaps", None, rule=list_of(NONEMPTY.ok, "null or a list of config files", size=bool, null=True)),
    "cards": flag("true: a model card per evaluated final checkpoint, <out>/cards/<arm>-s<seed>-step<N>.md (common.cards)", False),
    "wandb": choice("the results table to the study's wandb group (analysis.wandb_log); auto: when online", "auto",
                    ("auto", True, False)),
}
# evaluate's own fields (evals.config.KEYS, the same objects), passed to each evaluation when set (also as
# plain n=, seed=, ...); unset: evaluate's default, or the profile's value. Any other evaluate key: eval.KEY=V.
PASSED_EVAL = ("n", "seed", "backend", "retriever", "corpus", "encoder", "index", "retriever_url", "topk", "bench_root",
               "sets", "heldout", "max_turns", "max_model_len")
KEYS.update({f"eval.{k}": Default(EVALUATE[k], owner="evaluate") for k in PASSED_EVAL})
KEYS["eval.prompt"] = Default(EVALUATE["prompt"], EVALUATE["prompt"].default, owner="evaluate",
                              note="the runs' checkpoints' (the anchor takes anchor_nudge)")
DEFAULTS: dict[str, Any] = fields.defaults(KEYS)
SET_HERE = {"ckpt": "each checkpoint", "out": "its eval dir", "benches": "benches=", "profile": "profile=", "dry_run": "dry_run="}
ALIASES = {k: f"eval.{k}" for k in DEFAULTS["eval"]}
EVERY_EVAL = [f"eval.{k}" for k in EVALUATE]   # what a misspelt eval.KEY is matched against


HELP = """\
analyze: transfer curves, tables and a report from a sweep of runs.

  analyze runs_root=runs [benches=[nq,...,search_plan_ood]] [evaluate=true] [anchor=PATH_OR_HUB_ID]
          [key=value ...]   (every key and its default below; eval.KEY=V: any other evaluate key)
  analyze CONFIG.yaml   (a resolved config file of these keys: what the Slurm aggregation job runs)

Evaluates every checkpoint x bench (and the anchor once, as step 0) not yet evaluated under the evaluation
identity asked for, here or as Slurm jobs (launcher=slurm), then writes results.parquet/.csv, figures/,
tables/, report.md and report.html to `out`. A failed evaluation is a listed gap: the report says PARTIAL
and analyze exits 4 (allow_failed=true: 0). docs/stages/analyze.md says the rest.

Keys (key=default  description):
"""


def check_keys(cfg: DictConfig, interpreters: bool = True, where: str = "") -> None:
    """Refuse, before any work (the preflight's included): an unknown key or a section given a value (eval=5; `where`:
    the file naming it), an eval.KEY not passed on to evaluate, a value that breaks its field's rule (eval.*: evaluate's;
    check_settings checks the rest) and (`interpreters`) a named `python.eval=` lacking what its jobs need."""
    known = KeySpace(OmegaConf.create(DEFAULTS), ("eval.",))
    if unknown := [k for k in flat_keys(cfg) if k not in known]:
        raise AnalysisError(f"{where}unknown key {unknown[0]!r}.{did_you_mean(unknown[0], known.leaves)}")
    if bad := [k for k, v in DEFAULTS.items() if isinstance(v, dict) and not isinstance(cfg.get(k), DictConfig)]:
        raise AnalysisError(f"{where}{bad[0]}={cfg.get(bad[0])!r}: expected its keys ({bad[0]}.KEY=VALUE)")
    for key in cfg.eval:
        if key not in EVALUATE:
            raise AnalysisError(f"{where}eval.{key}: unknown evaluate key {key!r}.{did_you_mean(str(key), EVERY_EVAL)}")
        if key in SET_HERE:
            raise AnalysisError(f"{where}eval.{key}: set by analyze for each evaluation ({SET_HERE[key]})")
    if not cfg.evaluate and not cfg.eval_tasks and (given := [f"eval.{k}={v}" for k, v in cfg.eval.items() if v is not None
                                                             and (k != "prompt" or v != EVALUATE["prompt"].default)]):
        raise AnalysisError(f"{given[0]}: evaluate=false evaluates nothing, so no evaluation setting applies (the report reads "
                            "the evaluations on disk, each made under the settings its meta.json records): drop it, or "
                            "evaluate=true evaluates under it")
    if bad := [why for k, f in KEYS.items() if not k.startswith("eval.") and (why := f.problem(k, OmegaConf.select(cfg, k)))]:
        raise AnalysisError("; ".join(bad))
    if bad := [why for k, v in cfg.eval.items() if v is not None and k in EVALUATE and (why := EVALUATE[k].problem(k, v))]:
        raise AnalysisError(f"evaluation settings (eval.KEY=...): {'; '.join(bad)}")   # as check_settings words them
    if unknown := [m for m in cfg.metrics if m not in metric_specs()]:
        raise AnalysisError(f"metrics: {unknown[0]!r} is not a registered metric (evals.metrics.METRICS, or a bench kind's "
                            f"`metrics` in evals.registry).{did_you_mean(unknown[0], metric_specs())}")
    python = interpreter.named(cfg.python, "eval") if interpreters else None
    if python is not None and not cfg.power.pilot and (why := interpreter.check("eval", python, interpreter.eval_needs(
            cfg.eval.backend or (load_profile(cfg.profile)["evaluate"].get("backend") if cfg.profile else None)))):   # or the profile's
        raise AnalysisError(why)


@dataclass
class Request:
    """An analysis request resolved once, every setting checked (before any work, also for a dry run)."""
    cfg: DictConfig               # merged on the defaults
    profile: str | None
    benches: list[str]
    reference_sizes: dict
    anchor: str | None
    anchor_dir: Path
    eval_opts: dict               # what each evaluation is given (eval.*, the profile)
    study: Any = None
    h: Any = None                 # the harness, its settings checked (None: nothing is evaluated here)
    tasks: tuple = ()             # the aggregation's evaluation jobs' configs (eval_tasks), read


def request(cfg: DictConfig | dict, evaluator: Harness | Evaluator | None = None, planned: list | None = ()) -> Request:
    """`cfg` (analyze's keys) merged on the defaults and resolved: what run_analysis and a sweep's evaluation
    plan read (AnalysisError / ConfigError: one line naming the setting). `planned` (and slurm.runs): run dirs
    still to train, whose arms compare= may name beside those under runs_root (None: not known yet)."""
    cfg = OmegaConf.merge(DEFAULTS, cfg)
    check_keys(cfg)
    profile = cfg.profile or None
    loaded = load_profile(profile) if profile else {"evaluate": {}, "reference_sizes": {}}   # (EvalError when unknown)
    benches = bench_keys(cfg.benches or loaded["evaluate"].get("benches") or DEFAULT_BENCHES)   # as evaluate names them
    anchor = None if cfg.anchor in (None, "") else resolve_model_path(str(cfg.anchor))   # tiny-base: the embedded dir
    if anchor is not None and Path(anchor).exists():  # a local dir: one spelling, so re-use is recognized
        anchor = str(Path(anchor).resolve())
    elif anchor is not None and (Path(anchor).is_absolute() or anchor.startswith((".", "~"))):   # (not a hub id)
        raise AnalysisError(f"anchor={cfg.anchor}: no such directory (a local model dir, or a hub id)")
    anchor_dir = Path(cfg.anchor_dir) if cfg.anchor_dir else Path(cfg.runs_root) / "_anchor"
    if anchor is not None and (meta := anchor_dir / "anchor.json").exists():   # re-used for the same base model only
        torn: list[str] = []   # its reason, not "records anchor None"
        recorded = (read_json_object(meta, torn) or {}).get("model")   # (`tiny-base` recorded before it was resolved: its dir)
        if recorded != anchor and not (isinstance(recorded, str) and resolve_model_path(recorded) == anchor):
            raise AnalysisError(f"{torn[0] if torn else f'{meta} records anchor {recorded!r} but anchor={anchor!r} was given'}; "
                                f"pass anchor_dir=<another dir> or remove {anchor_dir} to re-evaluate")
    if anchor and not cfg.evaluate and not (anchor_eval_dir(anchor_dir, profile) / "summary.json").is_file():
        raise AnalysisError(f"anchor={cfg.anchor}: {anchor_dir} holds no evaluation of it and evaluate=false evaluates nothing")
    eval_opts = {k: v for k, v in {**OmegaConf.to_container(cfg.eval), "profile": profile}.items() if v is not None and k != "prompt"}
    req = Request(cfg, profile, benches, loaded["reference_sizes"], anchor, anchor_dir, eval_opts)
    if cfg.study:
        from analysis.reference import expected
        from common.study import load_study  # a bad study file is a one-line error before any evaluation

        req.study = load_study(str(cfg.study))
        expected(req.study)   # its stages' model recipes and profile (what its numbers are compared by), read up front
    backend(cfg.launcher)   # the cross-key checks of slurm.*; their values were checked by their fields' rules
    runs, after = cfg.slurm.runs, cfg.slurm.runs_after
    if after is not None and len(after) != len(runs or []):   # (without slurm.runs: 0)
        raise AnalysisError(f"slurm.runs_after={after!r}: expected {AFTER} ({len(runs or [])})")
    if runs is not None and not cfg.evaluate:
        raise AnalysisError("slurm.runs evaluates each run in its own job: not with evaluate=false")
    root = Path(cfg.runs_root).resolve()   # each run's job finds its checkpoints among runs_root's runs
    if lost := [r for r in runs or [] if not (Path(r).resolve().is_relative_to(root) and SEED_DIR.match(Path(r).name)
                                            and len(Path(r).resolve().relative_to(root).parts) in (2, 3))]:
        raise AnalysisError(f"slurm.runs: {lost[0]} is not a run dir under runs_root={cfg.runs_root} (<arm>/[<name>/]"
                            "seed<N>/): its evaluation job would find no checkpoints")
    if twice := [r for i, r in enumerate(runs or []) if Path(r).resolve() in {Path(x).resolve() for x in runs[:i]}]:
        raise AnalysisError(f"slurm.runs: {twice[0]} is listed twice (its two evaluation jobs would evaluate it twice)")
    if cfg.slurm.jobs_file and not (where := Path(cfg.slurm.jobs_file).parent).is_dir():   # (read after submitting)
        raise AnalysisError(f"slurm.jobs_file={cfg.slurm.jobs_file}: no such directory {where}")
    if problems := slurm_option_problems(cfg.slurm.sbatch, "slurm.sbatch"):
        raise AnalysisError("; ".join(problems))
    check_axis(str(cfg.axis))
    req.tasks = tuple(read_task(Path(t)) for t in cfg.eval_tasks or [])   # before any work
    if cfg.power.pilot:
        return req
    if (pairs := compare_pairs(cfg.compare)) and planned is not None:   # a malformed pair, an arm no run has nor one to train
        planned = [Path(p).resolve() for p in [*planned, *(runs or [])]]
        arms = sorted({r.arm for r in discover_runs(root)} | {"/".join(p.relative_to(root).parts[:-1]) for p in planned if p.is_relative_to(root)})
        if lost := [arm for pair in pairs for arm in pair if arm not in arms]:
            raise AnalysisError(f"compare: no run of arm {lost[0]!r} under {Path(cfg.runs_root)} (arms: {', '.join(arms) or 'none'})"
                                f".{did_you_mean(lost[0], arms)}")
    req.h = harness(evaluator) if cfg.evaluate and not cfg.eval_tasks else None
    if req.h is not None:  # every evaluate call would refuse these: refused before any work, also under dry_run
        check_settings(req.h, {**eval_opts, "prompt": cfg.eval.prompt}, benches)
    return req


def run_analysis(cfg: DictConfig | dict, evaluator: Harness | Evaluator | None = None) -> AnalysisResult | None:
    """Plan and run (or submit) the evaluations, then write the report; None for a dry run or a Slurm submission.
    `evaluator`: a stand-in harness, or a callable in place of the evals harness's evaluate (launch.evaluation.harness)."""
    req = request(cfg, evaluator)
    cfg, h, root = req.cfg, req.h, Path(req.cfg.runs_root)
    if (p := cfg.power).pilot:   # the design-power answer (analysis.power); its keys checked by their fields' rules
        from analysis import power

        pilots = power.read_pilots(Path(p.pilot), req.benches if cfg.benches else None, str(p.metric), req.profile,
                                   Path(cfg.anchor_dir) if cfg.anchor_dir else None)
        print(power.report(pilots, effect=float(p.effect), target=float(p.power), alpha=float(p.alpha),
                           seed_sd=float(p.seed_sd), max_seeds=int(p.max_seeds), items=p.design_items, seeds=p.design_seeds))
        return None
    submits = backend(cfg.launcher).submits
    if submits and cfg.slurm.runs is not None and not cfg.eval_tasks:
        return submit(req, [])   # each run's job plans its own checkpoints
    runs = discover_runs(root, req.profile)
    if not runs and req.anchor is None and not cfg.dry_run and not anchor_eval_dir(req.anchor_dir, req.profile).is_dir():
        raise AnalysisError(f"runs_root={root}: " + ("no such directory" if not root.exists() else "a file, not a directory,"
                            if not root.is_dir() else "no runs in it (<arm>/[<name>/]seed<N>/)") + " and no anchor=: nothing to analyze")
    jobs = []
    if h is not None:
        with datafetch.no_network() if cfg.dry_run else nullcontext():   # a plan never waits on the hub
            jobs = plan(h, candidates(runs, req.benches, cfg.eval.prompt, req.anchor, req.anchor_dir, req.profile))
        problems = []   # a setting a planned checkpoint's chat template cannot take: every evaluate of it would fail after loading
        for job in jobs:
            with suppress(ConfigError, OSError, ValueError, RuntimeError):   # its tokenizer does not load: its evaluation says so
                problems += [why] if (why := h.template(h.request(job))) else []
        if problems:
            more = f" (and {len(problems) - 1} more checkpoint(s))" if len(problems) > 1 else ""
            raise AnalysisError(f"evaluation settings (eval.KEY=...): {problems[0]}{more}")
    if cfg.dry_run:   # the plan: runs, evaluations to run, outputs
        lines = [f"runs under {cfg.runs_root}: {len(runs)}"]
        lines += [f"  {r.arm}/seed{r.seed}: checkpoints {sorted(r.checkpoints)}, evaluated {sorted(r.evals)}"
                  f"{'' if r.done else f' ({r.status()})'}" for r in runs]
        lines.append(f"evaluations to run: {len(jobs)}")
        for j in jobs:
            lines.append(f"  {j.label}: {j.benches} (prompt={j.prompt}) -> {j.out}")
            lines += [f"    {b}: held under another evaluation identity ({'; '.join(d)}): re-evaluated, the old "
                      "results renamed aside" for b, d in j.stale.items()]
        lines.append(f"outputs -> {cfg.out}/{{results.parquet, results.csv, figures/, tables/, report.md, report.html, report_data/}}")
        print("\n".join(lines))
        if h is not None and isinstance(h.settings, DictConfig):   # what each evaluation runs with (ckpt, out, prompt: its own)
            print("# resolved evaluate config of every evaluation (ckpt, out and prompt: each one's own)\n"
                  + OmegaConf.to_yaml(h.settings).rstrip())
    if submits and jobs:   # the evaluations go to a job array; its aggregation job writes the report
        return submit(req, jobs)
    if cfg.dry_run:
        return None
    # the aggregation after a Slurm array: its outcomes are this analysis's evaluations
    ev = tasks_report(req.tasks) if cfg.eval_tasks else EvalReport(list(jobs), [
        f for job in tqdm(jobs, desc="evaluate", unit="ckpt", disable=not jobs) for f in run_job(job, h, req.anchor_dir)])
    result = write_analysis(cfg, runs=runs, jobs=ev.jobs, ev=ev, benches=req.benches, anchor=req.anchor,
                            anchor_dir=req.anchor_dir, profile=req.profile, reference_sizes=req.reference_sizes,
                            study=req.study)
    finals = [(r.arm, r.seed, r.checkpoints[max(r.checkpoints)]) for r in (discover_runs(root, req.profile) if cfg.cards else [])
              if r.checkpoints and max(r.checkpoints) in r.evals]   # the runs found again: evaluated now
    if written := write_report_cards(cfg.out, finals, study=cfg.study or None):   # (cards=false: removes earlier ones)
        print(f"[analyze] {len(written)} model card(s) -> {Path(cfg.out) / 'cards'}", flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    return run_cli(_main, argv)


def _main(argv: list[str]) -> int:
    if wants_help(argv):
        print(HELP + fields.help_table(KEYS))
        return 0
    cfg = parse_argv(argv, interpreters=True)   # python.eval's one line, before the preflight's
    if len(argv) == 1 and "=" not in argv[0]:   # a job's resolved config file (the aggregation job's analyze.yaml)
        return print_result(run_analysis(cfg))
    found = preflight.gate([preflight.analyze_needs(cfg)], bool(cfg.dry_run))   # before any work: exit 2 on a problem
    return print_result(run_analysis(cfg)) or preflight.after_plan(found) or 0


def parse_argv(argv: list[str], interpreters: bool = False) -> DictConfig:
    """analyze's `key=value` command line, or the one config file of its keys `analyze CONFIG` runs, every key and value
    checked (ConfigError: one line, naming the file, with a did-you-mean); `interpreters`: python.eval's interpreter too."""
    if len(argv) == 1 and "=" not in argv[0]:   # (a list for a section, or the reverse: named)
        where = f"{argv[0]}: "
        cfg = merge(OmegaConf.create(DEFAULTS), load_config(Path(argv[0]), "analyze", "analysis"), where=where)
    else:
        where, cfg = "", apply_overrides(OmegaConf.create(DEFAULTS), argv, aliases=ALIASES, open_prefixes=("eval.",), suggest=EVERY_EVAL)
    check_keys(cfg, interpreters, where=where)   # (study and sweep: the interpreter checked by the preflight)
    return cfg


def print_result(result) -> int:
    """The closing line of an analysis (None: a dry run or a Slurm submission printed their own) and its exit status:
    4 when an expected point failed to evaluate (one stderr line per reason), unless `allow_failed=true`."""
    if result is None:
        return 0
    print(f"wrote {result.report} ({len(result.table)} result rows, {len(result.figures)} figures, "
          f"{len(result.tables)} tables; evaluated {len(result.evaluated.jobs)} checkpoint(s), "
          f"{len(result.evaluated.failures)} failed; {result.n_missing} missing point(s))")
    groups = result.failed_groups()
    for reason, points in groups.items():
        shown = ", ".join(f"{m.arm}/seed{m.seed}/step {m.step} × {m.bench}" for m in points[:3])
        more = f" and {len(points) - 3} more" if len(points) > 3 else ""
        print(f"evaluation failed for {len(points)} point(s) ({shown}{more}): {' '.join(reason.split())}",
              file=sys.stderr)
    if groups and not result.allow_failed:
        print(f"error: {sum(map(len, groups.values()))} expected point(s) failed to evaluate; the report is marked "
              "PARTIAL (allow_failed=true accepts it: exit 0)", file=sys.stderr)
        return 4   # (docs/troubleshooting.md's exit codes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
