"""Study files (recipes/study/*.yaml, common.study) and `launch study=NAME`: each reference study's plan
checked from its dry run's resolved configs and sbatch lines, the published numbers recorded as the
references state them, (their end-to-end CPU runs: test_study_cpu.py)."""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from common.study import StudyError, load_study, study_names
from tests.conftest import ROOT, installed_or_skip
from tests.study_helpers import launch as launch_process, prefilled_data_cache

STUDIES = ("browsecomp_worker_export", "dual_terminator_sft", "llama3_1_8b_spa_grpo", "qwen3_4b_multihop_sft_grpo",
           "qwen3_4b_spa_grpo")


def launch(cwd: Path, *argv: str) -> subprocess.CompletedProcess:
    """`launch ARGV` in `cwd` (wandb off) in this process: launch.cli.main, what the console script runs, its exit
    status and output captured. A new interpreter's imports (torch, transformers) were most of each call's time;
    a test about the process itself (all of stderr, a job script run as Slurm runs it) starts one."""
    from launch.cli import main

    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        mp.chdir(cwd)
        mp.setenv("WANDB_MODE", "disabled")
        rc = main(list(argv))
    return subprocess.CompletedProcess(["launch", *argv], rc, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def _stand_ins(tmp_path_factory):
    """What the studies' preflight asks of a GPU host, made once: the unpinned sets a user pre-fills (in a cache
    of their own) and the stand-in site holding vllm and the pinned trl (tests/plan_capture.py)."""
    from tests.plan_capture import unpinned_stand_ins

    outside = tmp_path_factory.mktemp("stand_ins")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DTSFT_DATA", str(outside / "data"))
        unpinned_stand_ins(outside)
    return outside


@pytest.fixture(autouse=True)
def _gpu_host(_stand_ins, monkeypatch):
    """Every study command here runs as on a GPU host that has what its stages need (a test that names an
    interpreter lacking vllm still sees it refused; one that fills its own cache replaces this one)."""
    from tests.plan_capture import gpu_env_stand_in

    monkeypatch.setenv("DTSFT_DATA", str(_stand_ins / "data"))
    gpu_env_stand_in(_stand_ins, monkeypatch)


def _dry_dir(out: str) -> Path:
    """Where a study's dry run wrote its jobs' configs and scripts (it names it: launch.jobs.Runner.run)."""
    return Path(re.findall(r"config and script is written under (\S+) \(nothing started", out)[-1])


def _yaml(path: Path) -> dict:
    import yaml

    return yaml.safe_load(path.read_text())


def _evaluate_config(run: dict) -> dict:
    """The evaluate config every evaluation of a dry run's analyze job resolves to, as the analysis resolves it
    (in the directory the study was launched from)."""
    import contextlib

    from omegaconf import OmegaConf

    from launch.analyze import request

    with contextlib.chdir(run["cwd"]):
        return OmegaConf.to_container(request(OmegaConf.load(run["dir"] / "report.yaml")).h.settings)


def test_the_five_reference_studies_are_shipped_and_load():
    assert tuple(study_names()) == STUDIES
    for name in STUDIES:
        study = load_study(name)
        assert study.reference_results and study.stages and study.hardware["gpus"] >= 0


_TOP = r"(\n[ -].*)*"   # a top-level key's value lines (block or flow style) after its own line


@pytest.mark.parametrize("pattern, replacement, match", [
    (r"^(      task: spa) +# .*$", r"\1", r"unmarked: line \d+: task: spa"),
    ("run: grpo", "run: grop", "Did you mean: grpo"),
    ("run: grpo", "run: [grpo]", r"run=\['grpo'\] is not one of sft, "),   # seen failing: a TypeError traceback
    ("metric: em, n: 2417", "metrik: em, n: 2417", "unknown key 'metrik'"),
    # odd top-level entries: one line naming the key (seen failing: `reference_results: 5` a TypeError traceback,
    # `vars: [1, 2]` omegaconf's interpolation error, `gpus: true`, `title: [1]` and a `note: 5` accepted)
    (r"^stages:.*" + _TOP, "stages: 5", r"`stages:` must be a non-empty list"),
    (r"^reference_results:.*" + _TOP, "reference_results: 5", r"`reference_results:` must be a list of "),
    (r"^reference_results:.*" + _TOP, "reference_results: {a: 1}", r"`reference_results:` must be a list of "),
    (r"^reference_results:.*" + _TOP, "reference_results: [{system: a, bench: b, metric: c, note: 5}]",
     r"reference_results\[0\]\.note: expected a string \(or null\), found 5"),
    (r"^vars:.*" + _TOP, "vars: [1, 2]", r"`vars:` must be a mapping of name: value"),
    (r"^hardware:.*", "hardware: {gpus: true}", r"`hardware:` must give `gpus:` \(an integer"),
    (r"^title:.*", "title: [1]", r"`title:` must be a string"),
    (r"^cpu_smoke:.*" + _TOP, "cpu_smoke: 5", r"`cpu_smoke:` must be a list of key=value overrides"),
    # seen failing: a YAML syntax error and a stage name `tr:ain` (no job name) tracebacks; a variable named dry_run
    # (it took the command line's dry_run=true: the study ran), a stage's `dry_run:`, gpus -1 and n -5 accepted
    (r"^title:", "title: [\ntitle:", r"not a readable study file \(ParserError: while parsing a flow sequence\)"),
    (r"^  - name: train", "  - name: 'tr:ain'", r"stages\[0\]: stage name 'tr:ain': letters, digits, '_' and '-'"),
    (r"^  runs_root: (.*)", r"  runs_root: \1\n  dry_run: null", r"`vars:` must be a mapping of name: value \(names"),
    (r"^(      task: spa .*)", r"\1\n      dry_run: true                    # [chosen: x]", r"\(train\): args set dry_run"),
    (r"^hardware:.*", "hardware: {gpus: -1}", r"`hardware:` must give `gpus:` \(an integer >= 0\)"),
    # YAML reads an unquoted 24:00:00 as 86400 (seen failing: accepted, #SBATCH --time=86400, 60 days of minutes)
    (r"^(      task: spa .*)", r"\1\n      launcher.time: 24:00:00          # [chosen: x]", r":\d+: YAML reads 24:00:00 as a base-60 number: quote it"),
    (r"n: 2417, pre: 0.316", "n: -5, pre: 0.316", r"reference_results\[0\]\.n: expected a positive integer \(or null\), found -5"),
])
def test_a_bad_study_entry_is_refused_naming_it(tmp_path, pattern, replacement, match):
    src = (ROOT / "recipes" / "study" / "qwen3_4b_spa_grpo.yaml").read_text()
    bad = tmp_path / "qwen3_4b_spa_grpo.yaml"
    bad.write_text(edited := re.sub(pattern, replacement, src, count=1, flags=re.M))
    assert edited != src
    with pytest.raises(StudyError, match=match):
        load_study(str(bad))


def test_reference_results_are_the_published_numbers():
    def table(name):
        return {(r.bench, r.metric): (r.n, r.pre, r.post, r.value) for r in load_study(name).reference_results}

    spa = table("qwen3_4b_spa_grpo")
    assert spa[("musique@given", "em")] == (2417, 0.316, 0.316, None)
    assert spa[("musique@given", "f1")] == (2417, 0.429, 0.431, None)
    assert spa[("2wikimultihopqa@given", "em")] == (12576, 0.552, 0.550, None)
    assert spa[("2wikimultihopqa@given", "f1")] == (12576, 0.656, 0.655, None)
    assert spa[("search_plan_ood", "reward")] == (100, 0.0, 0.0, None)
    assert spa[("babyai", "return")] == (50, 0.0, 0.019, None)
    sft = {(r.arm, r.step, r.metric): r.value for r in load_study("dual_terminator_sft").reference_results}
    assert sft == {("r2e", 100, "em"): 0.344, ("r2e", 100, "f1"): 0.430, ("anchor", 0, "em"): 0.302, ("anchor", 0, "f1"): 0.389}
    export = {r.metric: r.value for r in load_study("browsecomp_worker_export").reference_results if r.bench == "export"}
    assert export == {"tensor_keys": 398, "embedding_rows_removed": 128}
    llama = load_study("llama3_1_8b_spa_grpo").reference_results
    assert llama and all(r.value is None and r.pre is None and r.note for r in llama)  # no numbers were published


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory):
    """`launch study=NAME launcher=slurm dry_run=true` for every study, from a scratch directory holding a stand-in
    for each data slot (tests/plan_capture.py; the export's checkpoint: the two files a dry run reads)."""
    from tests.plan_capture import gpu_env_stand_in, stand_ins, unpinned_stand_ins

    cwd = tmp_path_factory.mktemp("studies")
    outside = tmp_path_factory.mktemp("stand_ins")   # what the preflight asks for: the GPU env's modules, the unpinned sets
    mp = pytest.MonkeyPatch()
    try:   # undone whatever happens (a failed dry run must not leave its DTSFT_DATA to the tests after it)
        mp.setenv("DTSFT_DATA", str(outside / "data"))
        gpu_env_stand_in(outside, mp)
        unpinned_stand_ins(outside)
        slots = {**stand_ins(cwd), "dual_terminator_sft": [   # the example file itself (test_dual_terminator_study_plan)
            "corpus=corpus.jsonl", f"nq_rollouts={ROOT / 'docs' / 'examples' / 'nq_rollouts_example.jsonl'}", "report:eval.index=e5_Flat.index"]}
        out = {}
        for name in STUDIES:
            proc = launch(cwd, f"study={name}", "launcher=slurm", "dry_run=true", *slots.get(name, []))
            assert proc.returncode == 0, f"{name}: {proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
            out[name] = {"out": proc.stdout, "err": proc.stderr, "dir": _dry_dir(proc.stdout), "cwd": cwd}
        return out
    finally:
        mp.undo()


# A Python dict's repr (`{'gpus': 8, ...}`): what a console line for people never shows (YAML or key=value instead).
DICT_REPR = re.compile(r"\{'[^'\n]*': ")


@pytest.mark.parametrize("name", STUDIES)
def test_no_config_dict_repr_reaches_the_console(dry_runs, name):
    """Issue 65 item 7: a study's dry run prints no raw dict (seen failing: `reference hardware: {'gpus': 8, ...}`)."""
    for part in ("out", "err"):
        text = dry_runs[name][part]
        m = DICT_REPR.search(text)
        assert not m, f"{name} ({part}): a dict repr on the console: {text[text.rfind(chr(10), 0, m.start()) + 1:m.end() + 60]}"
    assert "  reference hardware: gpus=" in dry_runs[name]["out"]


def test_a_study_dry_run_starts_with_its_plan_on_one_screen(dry_runs):
    """Issue 65 item 7 / issue 60: the plan (jobs, order, interpreter, resources, needs) is the dry run's first
    screen, every job of every stage in it (seen failing: 264 lines under Slurm, the plan nowhere in one screen)."""
    for name in STUDIES:
        lines = dry_runs[name]["out"].splitlines()
        head = lines.index(next(x for x in lines if x.startswith("# the plan: ")))
        table = lines[head + 1:lines.index(next(x for x in lines if x.startswith("[dry run] every job's config")))]
        assert head <= 3 and head + len(table) <= 40, "\n".join(lines[:60])
        assert table[0].split() == ["job", "module", "after", "interpreter", "resources", "needs"]
        stages = [s.name for s in load_study(name).stages]
        assert [row.split()[0] for row in table[1:]] == stages, table   # one job per stage, in the study's order
        assert len(lines) <= 60, f"{name}: {len(lines)} lines"


@pytest.mark.parametrize("name,model_path,gpus", [("qwen3_4b_spa_grpo", "Qwen/Qwen3-4B", 4),
                                                   ("llama3_1_8b_spa_grpo", "meta-llama/Llama-3.1-8B-Instruct", 4)])
def test_grpo_study_plan(dry_runs, name, model_path, gpus):
    where = dry_runs[name]["dir"]
    cfg, train = _yaml(where / "train-0.config.yaml"), (where / "train.sbatch").read_text()
    assert cfg["model"]["path"] == model_path and cfg["launcher"]["gpus_per_node"] == gpus
    assert f"#SBATCH --gpus-per-node={gpus}" in train and f"--nproc_per_node={gpus}" in train
    assert cfg["train"]["steps"] == 250 and cfg["train"]["save_steps"] == [50, 100, 150, 200]
    assert cfg["grpo"]["completions_per_step"] == 32 and cfg["grpo"]["use_vllm"] in ("auto", True)
    assert (cfg["lora"]["r"], cfg["lora"]["alpha"]) == (32, 64)
    report = _yaml(where / "report.yaml")
    assert report["profile"] == "rl_ood"
    # The hybrid Qwen3-4B's thinking switch is explicit ([chosen]) in training and in its evaluation;
    # Llama's template does not read it (auto: nothing passed).
    hybrid = model_path == "Qwen/Qwen3-4B"
    assert cfg["grpo"]["enable_thinking"] == (True if hybrid else "auto")
    assert (report["eval"].get("enable_thinking") is True) == hybrid


def test_dual_terminator_study_plan(dry_runs):
    from omegaconf import OmegaConf

    from common.plan import planned

    where = dry_runs["dual_terminator_sft"]["dir"]
    runs = [OmegaConf.create(_yaml(where / f"train-{i}.config.yaml")) for i in range(9)]   # one per sweep run
    assert not (where / "train-9.config.yaml").exists()
    assert {cfg.model.path for cfg in runs} == {"Qwen/Qwen3-4B-Thinking-2507"}
    # 218 = floor(3500 / 16): n=3500 at batch 16; r2e one epoch, search and mixed two (436)
    plans = [(cfg.arm, planned(cfg)[0], tuple(planned(cfg)[1])) for cfg in runs]
    assert sorted({p for p in plans if p[1] == 218}) == [("r2e", 218, (50, 100, 150, 200, 218))]
    assert [p[1] for p in plans].count(218) == 3 and [p[1] for p in plans].count(436) == 6
    assert all(p[2] == (50, 100, 150, 200, 218, 436) for p in plans if p[1] == 436)
    train = (where / "train.sbatch").read_text()
    assert "#SBATCH --gpus-per-node=8" in train and "#SBATCH --array=0-8" in train  # 3 arms x 3 seeds
    for arm in ("r2e", "search", "mixed"):
        for seed in (0, 1, 2):
            assert f"{arm}/seed{seed}" in train
    report = _yaml(where / "report.yaml")
    assert report["profile"] == "search_r1_7bench" and report["anchor"] == "Qwen/Qwen3-4B-Thinking-2507"
    # Search-R1's dense retrieval ([ref]: the reference's SR1 pipeline serves e5) over the index slot's file,
    # as the analysis resolves every evaluation's config
    assert (report["eval"]["retriever"], report["eval"]["index"]) == ("e5", "e5_Flat.index")
    resolved = _evaluate_config(dry_runs["dual_terminator_sft"])
    # the encoder by its data name (intfloat/e5-base-v2 through the data cache, common.datafetch)
    assert (resolved["retriever"], resolved["encoder"], resolved["index"]) == ("e5", "encoder:e5-base-v2", "e5_Flat.index")
    # The search arm: OpenSeeker + the NQ-style slot, half of the arm's rows each ([chosen], data-prep's ~SHARE).
    nq = ROOT / "docs" / "examples" / "nq_rollouts_example.jsonl"
    search = next(cfg for cfg in runs if cfg.arm == "search")
    assert list(search.data.sources.search) == ["openseeker:PolarSeeker/OpenSeeker-v1-Data~0.5", f"search-r1:{nq}~0.5"]


def test_multihop_and_export_study_plans(dry_runs):
    mh = dry_runs["qwen3_4b_multihop_sft_grpo"]["dir"]
    sft, grpo, report = (_yaml(mh / n) for n in ("sft-0.config.yaml", "grpo-0.config.yaml", "report.yaml"))
    assert sft["model"]["path"] == "Qwen/Qwen3-4B" and sft["train"]["lr"] == 0.0001
    assert sft["train"]["global_batch_size"] == 128
    assert "checkpoints/step-000100" in grpo["model"]["path"] and report["profile"] == "multihop_qa"
    assert grpo["grpo"]["enable_thinking"] is True and report["eval"]["enable_thinking"] is True
    # Trained in the setting it is judged in (profile multihop_qa: @given), on the GPUs its `hardware` says.
    assert grpo["grpo"]["qa_mode"] == "given"
    gpus = load_study("qwen3_4b_multihop_sft_grpo").hardware["gpus"]
    assert gpus == 4 and all(f"#SBATCH --gpus-per-node={gpus}" in (mh / f"{n}.sbatch").read_text() for n in ("sft", "grpo"))
    export = _yaml(dry_runs["browsecomp_worker_export"]["dir"] / "export.yaml")
    assert export["vocab_size"] == 151936 and export["tokenizer"].endswith("tiny_tokenizer")


def test_every_dry_run_prints_what_differs_from_the_reference(dry_runs):
    """Each `[chosen: ...]` setting with its reason and each note, before the stages run."""
    for name in STUDIES:
        head, study = dry_runs[name]["out"], load_study(name)
        assert f"differs from the reference ({len(study.differences())}:" in head, name
        assert study.notes and all(f"    - {line}\n" in head for line in study.differences()), name


def test_a_missing_data_slot_is_named(tmp_path):
    proc = launch(tmp_path, "study=qwen3_4b_multihop_sft_grpo")
    assert proc.returncode == 2 and "hotpotqa_trajectories=..." in proc.stderr and "data slots" in proc.stderr
    proc = launch(tmp_path, "study=qwen3_4b_spa_grpo", "reprot:eval.n=2", "dry_run=true")
    assert proc.returncode == 2 and "Did you mean: report" in proc.stderr


def _opts(script: str) -> dict[str, str]:
    return dict(line[len("#SBATCH --"):].split("=", 1) for line in script.splitlines()
                if line.startswith("#SBATCH --") and "=" in line)


def test_slurm_study_dry_run_chains_every_stage(dry_runs):
    """launch study=NAME launcher=slurm dry_run=true: each stage's job waits for the previous stage's; the analyze
    job runs `python -m launch.analyze <its config>`, which fans its evaluations out when it runs."""
    mh = dry_runs["qwen3_4b_multihop_sft_grpo"]["dir"]
    sft, grpo, report = ((mh / f"{n}.sbatch").read_text() for n in ("sft", "grpo", "report"))
    assert "dependency" not in _opts(sft)
    assert _opts(grpo)["dependency"] == "afterok:<job id of sft>" and _opts(grpo)["kill-on-invalid-dep"] == "yes"
    opts = _opts(report)
    assert opts["dependency"] == "afterany:<job id of grpo>" and "gpus-per-node" not in opts
    assert re.search(rf"^exec \S+ -m launch\.analyze {re.escape(str(mh / 'report.yaml'))}$", report, flags=re.M)
    cfg = _yaml(mh / "report.yaml")
    assert (cfg["profile"], cfg["launcher"], cfg["dry_run"]) == ("multihop_qa", "slurm", False)
    assert cfg["study"] == str(ROOT / "recipes" / "study" / "qwen3_4b_multihop_sft_grpo.yaml")
    dual = (dry_runs["dual_terminator_sft"]["dir"] / "train.sbatch").read_text()
    assert _opts(dual)["array"] == "0-8" and "dependency" not in _opts(dual)


def _stand_in_sbatch(tmp_path: Path, monkeypatch) -> Path:
    """An `sbatch` first on PATH that records each script it is given (one per line) and answers 5001, 5002, ..."""
    bin_dir, record = tmp_path / "bin", tmp_path / "submitted.txt"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\nfor last; do :; done\necho "$last" >> {record}\n'
                                    f'echo $((5000 + $(wc -l < {record})))\n')
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return record


def test_slurm_study_submits_stage_after_stage(tmp_path, monkeypatch):
    """With a stand-in sbatch: the train stage's job, then the report job waiting for it (afterany: it reports a failed run as a gap); the report
    job, run here as Slurm would, submits the evaluation array (one task per checkpoint) and the aggregation, and
    adds their ids to the study's jobs.json."""
    from sft.tiny import save_tiny_model

    record = _stand_in_sbatch(tmp_path, monkeypatch)
    proc = launch(tmp_path, "study=qwen3_4b_spa_grpo", "launcher=slurm", "model=tiny_base", "gpus_per_node=1",
                   "runs_root=runs", "reports=rep", "report:benches=[search_plan_ood]",
                   "report:eval.bench_n={search_plan_ood:2}",
                   "report:eval.enable_thinking=auto",   # the tiny base's template ignores the switch (refused)
                   "train:grpo.enable_thinking=auto")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    train, report = (Path(p) for p in record.read_text().split())
    assert train.name == "train.sbatch" and "dependency" not in _opts(train.read_text())
    assert _opts(report.read_text())["dependency"] == "afterany:5001"
    assert "watch: squeue -j 5001,5002" in proc.stdout
    assert json.loads((report.parent / "jobs.json").read_text()) == {"train": "5001", "report": "5002"}
    manifest = json.loads((tmp_path / "runs" / "grpo_spa" / "seed0" / "manifest.json").read_text())
    assert manifest["launches"][-1]["launcher"]["job_id"] == "5001"   # the training job's submission, recorded
    for step in (0, 2):   # the training "ran": two checkpoints to evaluate
        save_tiny_model(tmp_path / "runs" / "grpo_spa" / "seed0" / "checkpoints" / f"step-{step:06d}", seed=step)
    env = dict(os.environ, SLURM_JOB_ID="5002", WANDB_MODE="disabled")
    job = subprocess.run(["bash", str(report)], env=env, capture_output=True, text=True, timeout=300)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    evaluation, aggregation = (Path(p) for p in record.read_text().split()[2:])
    assert _opts(evaluation.read_text())["array"] == "0-1" and "dependency" not in _opts(evaluation.read_text())
    assert _opts(aggregation.read_text())["dependency"] == "afterany:5003"
    # the report job's own submissions join the study's job ids, named after it
    assert json.loads((report.parent / "jobs.json").read_text()) == {"train": "5001", "report": "5002",
                                                                    "report.eval": "5003", "report.aggregate": "5004"}


_BLOCK_TRAIN = """  - name: train
    run: grpo
    args:
      task: spa                        # [ref: spa-qwen3 "on search_plan_act"]
      model: qwen3_4b                  # [ref: spa-qwen3 "Full-weight checkpoint (LoRA merged) of Qwen/Qwen3-4B"] the hybrid model
      grpo.enable_thinking: true       # [chosen: not stated by the reference: the hybrid's thinking mode (its default), explicit]
      runs_root: ${vars.runs_root}     # [chosen: one directory per study]
      grpo.trl: 1.9.2                  # [ref: spa-qwen3 "GRPO via TRL 1.9.2 + vLLM colocate generation"] python.grpo=.venv-trl1.9.2/bin/python (make venv-trl)
"""


def test_flow_style_args_are_held_to_the_source_marks_like_block_style(tmp_path):
    """`- {name: ..., run: ..., args: {...}}` (the docstring's own form): each argument needs its own
    source mark on its line, as in block style; one mark cannot speak for two arguments."""
    src = (ROOT / "recipes" / "study" / "qwen3_4b_spa_grpo.yaml").read_text()
    assert _BLOCK_TRAIN in src
    path = tmp_path / "qwen3_4b_spa_grpo.yaml"
    one_line = ('  - {name: train, run: grpo, args: {task: spa, model: qwen3_4b, grpo.enable_thinking: true, '
                'runs_root: "${vars.runs_root}"}}\n')
    path.write_text(src.replace(_BLOCK_TRAIN, one_line))
    with pytest.raises(StudyError, match=r"unmarked: line 15: .*task: spa"):
        load_study(str(path))
    path.write_text(src.replace(_BLOCK_TRAIN, one_line.rstrip("\n") + "  # [chosen: all of them]\n"))
    with pytest.raises(StudyError, match=r"line 15: 4 arguments \(task, model, grpo.enable_thinking, runs_root\) share"):
        load_study(str(path))
    marked = ("  - {name: train, run: grpo, args: {\n"
              "      task: spa,                        # [ref: spa-qwen3 \"on search_plan_act\"]\n"
              "      model: qwen3_4b,                  # [ref: spa-qwen3 \"of Qwen/Qwen3-4B\"] the hybrid model\n"
              "      grpo.enable_thinking: true,       # [chosen: the hybrid's thinking mode, explicit]\n"
              "      grpo.trl: 1.9.2,                  # [ref: spa-qwen3 \"GRPO via TRL 1.9.2 + vLLM colocate generation\"]\n"
              '      runs_root: "${vars.runs_root}"}}  # [chosen: one directory per study]\n')
    path.write_text(src.replace(_BLOCK_TRAIN, marked))
    assert load_study(str(path)).stages[0].args == load_study("qwen3_4b_spa_grpo").stages[0].args
    path.write_text(src.replace(_BLOCK_TRAIN, marked.replace("  # [ref: spa-qwen3 \"of Qwen/Qwen3-4B\"] the hybrid model", "")))
    with pytest.raises(StudyError, match=r"unmarked: line 17: model: qwen3_4b,$"):
        load_study(str(path))


# ---- issue 34 (Trust IV): the study surfaces never act on, or show, something the user did not ask for

SEVEN_SIZES = {"nq": 500, "triviaqa": 500, "popqa": 500, "hotpotqa": 500, "2wikimultihopqa": 500, "musique": 500,
               "bamboogle": 125}


def _eval_at(eval_dir: Path, sizes: dict[str, int], value: float) -> None:
    """summary.json + per-example files, each bench with its own n."""
    from test_analysis_helpers import write_eval

    summary = {}
    for bench, n in sizes.items():
        write_eval(eval_dir, {bench: value}, n=n)
        summary.update(json.loads((eval_dir / "summary.json").read_text()))
    (eval_dir / "summary.json").write_text(json.dumps(summary))


def _measured_cells(root: Path, study: str, profile: str, anchor: str | None) -> dict[tuple[str, str], str]:
    """(bench, metric) -> the reference table's "Measured here" cell, from `analyze evaluate=false study=...`."""
    from launch.analyze import run_analysis

    run_analysis({"runs_root": str(root), "out": str(root / "rep"), "profile": profile, "evaluate": False,
                  "anchor": anchor, "study": study})
    cells = {}
    for line in (root / "rep" / "tables" / "reference.md").read_text().splitlines()[2:]:
        parts = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(parts) == 6:
            cells[(parts[0], parts[1], parts[2])] = parts[5]
    return cells


def _reference_cells(root: Path, study: str, profile: str, anchor: str | None) -> dict[tuple[str, str, str], str]:
    """The same cells from analysis.reference directly (no figures: the quick way for further cases)."""
    from analysis.collect import add_mean_rows, collect, qa_benches
    from analysis.discover import discover_runs
    from analysis.discover import anchor_eval_dir
    from analysis.reference import reference_table

    runs = discover_runs(root, profile)
    table = collect(runs, anchor_eval_dir(root / "_anchor", profile)).table
    t = reference_table(load_study(study), add_mean_rows(table, qa_benches(table)), runs, anchor)
    return {(system, bench, metric): measured for system, (bench, metric, _, _, measured) in t.rows}


def _study_run(root: Path, arm: str, model: tuple[str, str], evals: dict[int, dict[str, int]], profile: str,
               value: float = 0.4, seed: int = 0) -> None:
    from common import layout
    from test_analysis_helpers import make_run

    run = make_run(root, arm, seed, sorted(evals))
    with open(run / "config.yaml", "a", encoding="utf-8") as fh:
        fh.write(f"model:\n  name: {model[0]}\n  path: {model[1]}\n")
    for step, sizes in evals.items():
        _eval_at(layout.eval_dir(run, step, profile), sizes, value)


def test_the_reference_table_shows_a_measured_value_only_beside_a_comparable_one(tmp_path):
    """Issue 34 item 1: model, bench set, n per bench and metric must all be the published value's."""
    from analysis.discover import anchor_eval_dir
    from analysis.tables import DASH

    sft, ref = "dual-terminator SFT (r2e arm, step 100)", "base + Final answer: nudge (anchor)"
    small = tmp_path / "small"   # the cpu smoke: tiny_base, 2 of the 7 benches, n=2
    _study_run(small, "r2e", ("tiny_base", "tiny-base"), {100: {"bamboogle": 2, "nq": 2}}, "search_r1_7bench")
    _eval_at(anchor_eval_dir(small / "_anchor", "search_r1_7bench"), {"bamboogle": 2, "nq": 2}, 0.5)
    cells = _measured_cells(small, "dual_terminator_sft", "search_r1_7bench", "tiny-base")
    assert cells[(sft, "avg", "em")] == "not comparable: tiny_base, 2 of 7 benches, n=2"
    assert cells[(ref, "avg", "f1")] == "not comparable: tiny-base, 2 of 7 benches, n=2"
    full = tmp_path / "full"     # the reference's model, the seven benches at their reference sizes
    _study_run(full, "r2e", ("qwen3_4b_thinking_2507", "Qwen/Qwen3-4B-Thinking-2507"), {100: SEVEN_SIZES},
               "search_r1_7bench")
    _eval_at(anchor_eval_dir(full / "_anchor", "search_r1_7bench"), SEVEN_SIZES, 0.2)
    cells = _reference_cells(full, "dual_terminator_sft", "search_r1_7bench", "Qwen/Qwen3-4B-Thinking-2507")
    assert cells[(sft, "avg", "em")] == "0.400 (each bench at its reference n, 1 seed(s))"
    assert cells[(ref, "avg", "f1")] == "0.200 (each bench at its reference n, 1 seed(s))"
    _study_run(full, "search", ("qwen3_4b_thinking_2507", "Qwen/Qwen3-4B-Thinking-2507"), {100: SEVEN_SIZES},
               "search_r1_7bench")   # (another arm changes nothing) and the anchor given as another model:
    cells = _reference_cells(full, "dual_terminator_sft", "search_r1_7bench", "Qwen/Qwen3-4B")
    assert cells[(ref, "avg", "em")] == "not comparable: Qwen/Qwen3-4B" and cells[(sft, "avg", "em")].startswith("0.400")
    _study_run(full, "r2e", ("qwen3_4b_thinking_2507", "Qwen/Qwen3-4B-Thinking-2507"),
               {100: {b: n for b, n in SEVEN_SIZES.items() if b != "popqa"}}, "search_r1_7bench", seed=1)
    cells = _reference_cells(full, "dual_terminator_sft", "search_r1_7bench", "Qwen/Qwen3-4B-Thinking-2507")
    assert cells[(sft, "avg", "em")] == "not comparable: 6 of 7 benches"   # seed 1 lacks popqa
    grpo = tmp_path / "grpo"     # pre -> post: the same rules at both ends
    _study_run(grpo, "grpo_spa", ("tiny_base", "tiny-base"), {0: {"musique@given": 2}, 2: {"musique@given": 2}}, "rl_ood")
    cells = _reference_cells(grpo, "qwen3_4b_spa_grpo", "rl_ood", None)   # (analyze's own: test_study_cpu.py's GRPO run)
    assert cells[("Qwen3-4B GRPO search_plan_act", "musique@given", "em")] == "not comparable: tiny_base, n=2"
    assert cells[("Qwen3-4B GRPO search_plan_act", "babyai", "return")] == DASH   # no such point


def test_a_training_stage_sent_to_slurm_submits_the_whole_study(tmp_path, monkeypatch):
    """Issue 34 item 2: `train:launcher=slurm` makes the study a Slurm one; the report waits for training."""
    record = _stand_in_sbatch(tmp_path, monkeypatch)
    proc = launch(tmp_path, "study=qwen3_4b_spa_grpo", "model=tiny_base", "train:launcher=slurm",
                   "train:gpus_per_node=1", "runs_root=runs", "reports=rep", "report:benches=[search_plan_ood]",
                   "train:grpo.enable_thinking=auto")   # the tiny base's template ignores the switch (refused)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "all stages done" not in proc.stdout and not (tmp_path / "rep").exists()
    train, report = (Path(p) for p in record.read_text().split())
    assert train.name == "train.sbatch" and _opts(report.read_text())["dependency"] == "afterany:5001"
    proc = launch(tmp_path, "study=qwen3_4b_multihop_sft_grpo", "sft:launcher=slurm", "dry_run=true")
    assert proc.returncode == 2 and "training stages sft go to Slurm but grpo would run here" in proc.stderr


@pytest.mark.parametrize("spelling,value", [("true", True), ("False", False), ("1", True), ("0", False), ("YES", True),
                                            ("no", False), ("On", True), ("off", False)])
def test_dry_run_is_read_by_one_rule(spelling, value):
    """Issue 34 item 3: one parser for every command's dry_run (and launch's launcher.dry_run)."""
    from omegaconf import OmegaConf

    from common.cli import ConfigError, apply_overrides, parse_switch

    assert parse_switch(spelling, "dry_run") is value
    cfg = apply_overrides(OmegaConf.create({"dry_run": False, "launcher": {"dry_run": False}}),
                          [f"dry_run={spelling}", f"launcher.dry_run={spelling}"])
    assert cfg.dry_run is value and cfg.launcher.dry_run is value
    with pytest.raises(ConfigError, match=r"dry_run=maybe: expected true or false \(also 1/0, yes/no, on/off\)"):
        apply_overrides(OmegaConf.create({"dry_run": False}), ["dry_run=maybe"])


def test_a_study_dry_run_in_any_spelling_submits_and_writes_nothing(tmp_path, monkeypatch):
    """Issue 34 item 3: `dry_run=on` on Slurm prints the plan; sbatch is never called, no ledger written."""
    record = _stand_in_sbatch(tmp_path, monkeypatch)
    proc = launch(tmp_path, "study=qwen3_4b_spa_grpo", "launcher=slurm", "dry_run=on", "runs_root=runs")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "dry run done" in proc.stdout and "Slurm job(s) 50" not in proc.stdout
    assert not record.exists() and not (tmp_path / "runs").exists()
    proc = launch(tmp_path, "study=qwen3_4b_spa_grpo", "launcher=slurm", "dry_run=maybe", "runs_root=runs")
    assert proc.returncode == 2 and "dry_run=maybe: expected true or false" in proc.stderr and "== stage" not in proc.stdout
    proc = launch(tmp_path, "study=qwen3_4b_spa_grpo", "train:dry_run=true", "runs_root=runs")
    assert proc.returncode == 2 and "goes to every stage" in proc.stderr and not (tmp_path / "runs").exists()


def test_the_export_study_on_slurm_keeps_its_ledger_out_of_the_export(tmp_path, monkeypatch):
    """Issue 34 item 4: the submitted export job finds its `out` free and writes the export."""
    from sft.tiny import save_tiny_model

    record = _stand_in_sbatch(tmp_path, monkeypatch)
    save_tiny_model(tmp_path / "ckpt", seed=0, vocab_size=4160)
    proc = launch(tmp_path, "study=browsecomp_worker_export", "checkpoint=ckpt", "export:vocab_size=4096",
                   f"tokenizer={ROOT / 'common' / 'tiny_tokenizer'}", "launcher=slurm")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    script = Path(record.read_text().split()[0])
    out = tmp_path / "exports" / "browsecomp_worker"
    assert out.resolve() not in script.resolve().parents and not out.exists()
    job = subprocess.run(["bash", str(script)], env=dict(os.environ, SLURM_JOB_ID="5001"), capture_output=True,
                         text=True, timeout=300)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    assert (out / "export_info.json").is_file() and (out / "model.safetensors").is_file()
    card = (out / "README.md").read_text()   # issue 64: its card, with the study's notes, listed in SHA256SUMS
    assert "The RL training is not reproduced" in card and "  README.md" in (out / "SHA256SUMS").read_text()


def test_a_stage_key_typo_is_refused_before_the_first_stage(tmp_path, monkeypatch):
    """Issue 34 item 6: `report:eval.nn=2` stops the study before training starts, locally and on Slurm."""
    (tmp_path / "corpus.jsonl").write_text('{"id": "0", "contents": "x"}\n')
    argv = ["study=dual_terminator_sft", "model=tiny_base", "data=synthetic", "train:seeds=[0]", "train:arms=[r2e]",
            "train:steps=1", "train:data.n=4", "train:logging.wandb=false", "corpus=corpus.jsonl", "runs_root=runs",
            f"nq_rollouts={ROOT / 'docs' / 'examples' / 'nq_rollouts_example.jsonl'}", "report:eval.nn=2"]
    proc = launch(tmp_path, *argv)
    assert proc.returncode == 2 and "unknown evaluate key 'nn'. Did you mean: eval.n?" in proc.stderr, proc.stderr[-3000:]
    assert "== stage 1/2" not in proc.stdout and not (tmp_path / "runs").exists()
    record = _stand_in_sbatch(tmp_path, monkeypatch)
    proc = launch(tmp_path, *argv, "launcher=slurm")
    assert proc.returncode == 2 and "unknown evaluate key 'nn'" in proc.stderr, proc.stderr[-3000:]
    assert not record.exists() and not (tmp_path / "runs").exists()


def test_a_plain_key_no_stage_takes_is_refused():
    """Issue 34 item 6: a study without training stages (the export) has nowhere for `fooo=1` (or python.eval=) to go."""
    from launch.errors import LaunchError
    from launch.study import parse_study_argv

    argv = ["study=browsecomp_worker_export", "checkpoint=ckpt", "tokenizer=tok"]
    for bad in ("fooo=1", "python.eval=x"):   # (python.eval, no stage's interpreter: seen failing, left unread)
        with pytest.raises(LaunchError, match=rf"^{bad}: .*no training stage.*give it to a stage: export:{bad}"):
            parse_study_argv([*argv, bad])
    req = parse_study_argv([*argv, "launcher=slurm", "partition=gpu", "dry_run=on"])
    assert req.dry_run is True and req.launcher == "slurm"
    # a stage without training takes the plan's launcher: its own is refused, not left unread (analyze's was)
    with pytest.raises(LaunchError, match=r"^train:launcher\.kind='\{\}': expected one of"):   # was "launcher='{}'"
        parse_study_argv(["study=qwen3_4b_spa_grpo", "train:launcher.kind={}"])
    for args, plan in (([*argv, "export:launcher=slurm"], "local"), (["study=qwen3_4b_spa_grpo", "launcher=slurm", "report:launcher=local"], "slurm")):
        with pytest.raises(LaunchError, match=rf"^{args[-1]}: every job of the plan goes to launcher={plan}"):
            parse_study_argv(args)


def test_a_study_variable_may_refer_to_another(tmp_path):
    """Issue 34 item 11: `${vars.X}` on the command line resolves against the study's variables."""
    proc = launch(tmp_path, "study=qwen3_4b_spa_grpo", "runs_root='5'", "reports=${vars.runs_root}/rep",
                   "report:out=${vars.reports}2", "dry_run=true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = _yaml(_dry_dir(proc.stdout) / "report.yaml")   # the study's out=${vars.reports}, then the command line's
    assert report["out"] == "5/rep2" and report["runs_root"] == "5"   # the study's text '5' (seen failing: 5, an int)
    proc = launch(tmp_path, "study=qwen3_4b_spa_grpo", "report:out=${vars.nope}/x", "dry_run=true")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "report:out=${vars.nope}/x: no study variable 'nope'" in proc.stderr and "Did you mean" not in proc.stderr
    # a study value reaches its stage as written (seen failing: '5' became 5, 'x # y' x; a list item 'a, b' two items)
    from omegaconf import OmegaConf

    from common.cli import apply_overrides
    from common.cli import shown
    from launch.study import parse_study_argv

    for value in ("5", "true", "null", "x # y", "", ["a, b", "c: d"], {"k": "1"}):
        assert apply_overrides(OmegaConf.create({"k": None}), [f"k={shown(value, dotlist=True)}"]).k == value
    # a variable's 24:00:00 is its text, as a recipe's (seen failing: 86400); an unset one a stage needs is named
    assert parse_study_argv(["study=browsecomp_worker_export", "tokenizer=24:00:00"]).study.vars["tokenizer"] == "24:00:00"
    with pytest.raises(StudyError, match=r"\.yaml: stage grpo, model\.path \(with runs_root=\S+, sft_steps=null\): .*NoneType"):
        parse_study_argv(["study=qwen3_4b_multihop_sft_grpo", "sft_steps="])


def test_the_smoke_anchor_name_loads_in_evaluate_and_analyze(tmp_path):
    """Issue 34 item 13: `tiny-base` (launch's embedded model name) is a model evaluate and analyze can load."""
    from launch.analyze import run_analysis
    from common.tiny import TINY_BASE_DIR
    from evals.backends import make_backend
    from evals.config import resolve

    cfg = resolve({"ckpt": "tiny-base", "benches": ["search_plan_ood"], "out": str(tmp_path / "e"), "dtype": "float32"})
    assert cfg.ckpt == str(TINY_BASE_DIR)
    assert make_backend(cfg).tokenizer is not None

    from launch.evaluation import Harness

    class Recorder(Harness):   # the anchor's evaluation, recorded instead of run
        ckpts = []

        def evaluate(self, cfg):
            self.ckpts.append(cfg["ckpt"])
            raise RuntimeError("recorded")

        def pending(self, cfg):
            return {b: [] for b in cfg["benches"]}

        def check(self, cfg):
            return cfg

    (tmp_path / "runs" / "_anchor").mkdir(parents=True)   # recorded by an earlier analyze as the name itself
    (tmp_path / "runs" / "_anchor" / "anchor.json").write_text('{"model": "tiny-base", "prompt": "anchor_nudge"}')
    run_analysis({"runs_root": str(tmp_path / "runs"), "out": str(tmp_path / "rep"), "anchor": "tiny-base",
                  "benches": ["search_plan_ood"]}, evaluator=Recorder())
    assert Recorder.ckpts == [str(TINY_BASE_DIR)]


def test_a_slurm_dry_run_with_an_unset_slot_still_chains_the_later_stages(tmp_path):
    """Issue 34 item 14: the stage after an unresolved one waits for it in the plan and in the scripts written."""
    proc = launch(tmp_path, "study=qwen3_4b_multihop_sft_grpo", "launcher=slurm", "dry_run=true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    where = _dry_dir(proc.stdout)
    assert _opts((where / "grpo.sbatch").read_text())["dependency"] == "afterok:<job id of sft>"
    assert _opts((where / "report.sbatch").read_text())["dependency"] == "afterany:<job id of grpo>"
    assert re.search(r"^sft +sft\.train +- ", proc.stdout, flags=re.M) and "(not resolved: set hotpotqa_" in proc.stdout


# One run of the dual-terminator sweep's nine (each resolved in full): what the tests below check is each job's own
# script or config, the same at any sweep size.
ONE_RUN = ("train:arms=[r2e]", "train:seeds=[0]")


def test_a_slurm_study_gives_every_job_the_clusters_settings(tmp_path):
    """Issue 38: one set of cluster settings (partition, account, qos, time, an extra #SBATCH line) reaches
    every job a study submits (the training array, the evaluation array, the aggregation, the report job);
    `report:slurm.time=` overrides the report stage's."""
    (tmp_path / "corpus.jsonl").write_text('{"id": "0", "contents": "x"}\n')
    slots = ["corpus=corpus.jsonl", f"nq_rollouts={ROOT / 'docs' / 'examples' / 'nq_rollouts_example.jsonl'}"]
    cluster = ["account=A", "partition=P", "qos=Q", "time=01:00:00", "launcher.sbatch=[--constraint=h100]"]
    want = ["#SBATCH --account=A", "#SBATCH --partition=P", "#SBATCH --qos=Q", "#SBATCH --constraint=h100"]

    def scripts(*argv):
        proc = launch(tmp_path, "study=dual_terminator_sft", "launcher=slurm", *cluster, *slots, *argv, "dry_run=true")
        assert proc.returncode == 0, proc.stderr[-3000:]
        where = _dry_dir(proc.stdout)
        # the report job's own evaluation array and aggregation take its config's slurm.* (launch/eval_slurm.py)
        return {p.name: re.match(r"#!/bin/bash\n(?:#.*\n)+", p.read_text())[0] for p in where.glob("*.sbatch")}, \
            _yaml(where / "report.yaml")["slurm"]

    seen, report = scripts()
    assert sorted(seen) == ["report.sbatch", "train.sbatch"]
    for name, head in seen.items():
        assert all(line in head.splitlines() for line in (*want, "#SBATCH --time=01:00:00")), f"{name}:\n{head}"
    assert {k: report[k] for k in ("account", "partition", "qos", "time", "sbatch")} == {
        "account": "A", "partition": "P", "qos": "Q", "time": "01:00:00", "sbatch": ["--constraint=h100"]}
    seen, report = scripts("report:slurm.time=03:00:00", *ONE_RUN)
    assert {name: _opts(head)["time"] for name, head in seen.items()} == {"train.sbatch": "01:00:00",
                                                                         "report.sbatch": "03:00:00"}
    assert report["time"] == "03:00:00" and all(_opts(head)["qos"] == "Q" for head in seen.values())


def test_every_evaluation_job_of_a_study_runs_python_eval(tmp_path, monkeypatch):
    """Issue 38: with python.eval=PATH the evaluation array, the aggregation and the report stage's own job
    exec it; python.eval=/usr/bin/python3 (no vllm, not even the project's requirements) is refused before
    anything is submitted: one line, exit 2."""
    from launch_helpers import named_interpreter

    monkeypatch.setenv("PYTHONPATH", str(ROOT))   # not the GPU host's stand-ins (_gpu_host): no vllm anywhere
    ev = named_interpreter(tmp_path / "eval-env" / "bin" / "python")
    (tmp_path / "corpus.jsonl").write_text('{"id": "0", "contents": "x"}\n')
    slots = ["corpus=corpus.jsonl", f"nq_rollouts={ROOT / 'docs' / 'examples' / 'nq_rollouts_example.jsonl'}"]
    # (this environment has no vllm: the study's backend=vllm would be refused in it, as below)
    proc = launch(tmp_path, "study=dual_terminator_sft", "launcher=slurm", f"python.eval={ev}", *slots, *ONE_RUN,
                   "report:eval.backend=hf", "dry_run=true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    where = _dry_dir(proc.stdout)
    report = (where / "report.sbatch").read_text()
    assert re.findall(r"^exec (\S+) -m (\S+)", report, flags=re.M) == [(str(ev), "launch.analyze")]
    # its evaluation array and aggregation (planned when it runs) run the config's python.eval (launch/eval_slurm.py)
    assert _yaml(where / "report.yaml")["python"]["eval"] == str(ev)
    record = _stand_in_sbatch(tmp_path, monkeypatch)
    # all of its stderr, from a process of its own: one line
    proc = launch_process(tmp_path, "study=dual_terminator_sft", "launcher=slurm", "python.eval=/usr/bin/python3", *slots, *ONE_RUN)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("error: ") and "python.eval=/usr/bin/python3 lacks " in proc.stderr
    assert "torch (evaluation)" in proc.stderr
    assert "vllm (backend=vllm)" in proc.stderr
    assert not record.exists() and not (tmp_path / "runs").exists()


def test_every_studys_evaluation_generates_through_vllm_and_its_cpu_smoke_on_hf(dry_runs):
    """Issue 38: each evaluation's resolved config (the analyze dry run's) says backend: vllm, [ref] in the two
    search_plan_act studies, [chosen] in the others; a cpu_smoke list keeps a backend that runs on a CPU."""

    for name in ("qwen3_4b_spa_grpo", "llama3_1_8b_spa_grpo", "dual_terminator_sft", "qwen3_4b_multihop_sft_grpo"):
        assert _evaluate_config(dry_runs[name])["backend"] == "vllm", name
        study = load_study(name)
        chosen = any(d.startswith("report:eval.backend = vllm: ") for d in study.differences())
        assert chosen == (name not in ("qwen3_4b_spa_grpo", "llama3_1_8b_spa_grpo")), name   # else [ref]
        assert not study.cpu_smoke or "report:eval.backend=hf" in study.cpu_smoke, name


def test_a_local_study_runs_its_evaluation_stage_in_python_eval(tmp_path):
    """Issue 38: locally (no Slurm) too, the analyze stage's job runs in python.eval= (the plan's script); a dry
    run runs nothing in it but the preflight's probe."""
    from launch_helpers import named_interpreter

    record = tmp_path / "ran.txt"
    ev = named_interpreter(tmp_path / "eval-env" / "bin" / "python", record)
    (tmp_path / "corpus.jsonl").write_text('{"id": "0", "contents": "x"}\n')
    proc = launch(tmp_path, "study=dual_terminator_sft", f"python.eval={ev}", "report:eval.backend=hf", *ONE_RUN,
                   "corpus=corpus.jsonl", f"nq_rollouts={ROOT / 'docs' / 'examples' / 'nq_rollouts_example.jsonl'}",
                   "dry_run=true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ran = [line for line in record.read_text().splitlines() if not line.startswith("-c ")]   # not the find_spec asks
    assert ran == []
    where = _dry_dir(proc.stdout)
    assert f"{ev} -m launch.analyze {where / 'report.yaml'}" in (where / "report.sh").read_text()
    assert re.search(rf"^report .* {re.escape(str(ev))} ", proc.stdout, flags=re.M)   # the plan's interpreter column
    assert _yaml(where / "report.yaml")["runs_root"] == "runs/dual_terminator_sft"


@pytest.mark.vllm
def test_a_local_study_evaluates_through_vllm_in_python_eval(tmp_path, monkeypatch):
    """Issue 38 (the vLLM tier: this interpreter has vLLM's CPU build): the dual-terminator smoke run here with
    python.eval= naming an interpreter of this vLLM environment and the study's own backend (vllm): the
    analyze stage runs in it and every evaluation it writes was generated by vLLM."""
    installed_or_skip("vllm")
    from launch_helpers import named_interpreter

    study = load_study("dual_terminator_sft")
    prefilled_data_cache(tmp_path / "data", monkeypatch)
    record = tmp_path / "ran.txt"
    ev = named_interpreter(tmp_path / "vllm-env" / "bin" / "python", record)
    smoke = [t.replace("=docs/", f"={ROOT / 'docs'}/") for t in study.cpu_smoke if t != "report:eval.backend=hf"]
    proc = launch_process(tmp_path, "study=dual_terminator_sft", "runs_root=runs", "reports=rep", *smoke, f"python.eval={ev}",
                   timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    ran = [line for line in record.read_text().splitlines() if not line.startswith("-c ")]
    assert [line.split()[:2] for line in ran] == [["-m", "launch.analyze"]], ran   # its job, run once
    metas = sorted(tmp_path.rglob("eval/search_r1_7bench/step-*/meta.json"))
    assert len(metas) == 2   # the anchor's step 0 and the r2e arm's last checkpoint
    for meta in metas:
        assert json.loads(meta.read_text())["backend"] == "vllm", meta
    assert "`failed=0`" in (tmp_path / "rep" / "report.md").read_text()


def test_a_stage_jobs_settings_are_the_clusters_then_the_stages_own():
    """An export (or evaluate) stage's job: the command line's cluster settings, then its `STAGE:slurm.<key>=`
    (taken out of its config, which has no such key); a misspelt one is refused naming the keys."""
    from launch.errors import LaunchError
    from launch.slurm import Cluster
    from launch.study import parse_study_argv, resolve_stages

    argv = ["study=browsecomp_worker_export", "checkpoint=c", "tokenizer=t", "launcher=slurm", "qos=Q", "partition=P",
            "launcher.sbatch=[--mem=0]", "launcher.setup=[module load x,echo 'y']", "export:slurm.time=01:00:00",
            "export:slurm.partition=cpu"]
    export, = resolve_stages(parse_study_argv(argv))   # (setup: a list is its lines; seen failing: the text "[module ...]")
    assert export.cluster == Cluster(partition="cpu", qos="Q", time="01:00:00", sbatch=("--mem=0",), setup="module load x\necho 'y'")
    assert "slurm" not in export.cfg
    bad = [*argv[:-1], "export:slurm.qoss=low"]
    with pytest.raises(LaunchError, match=r"export:slurm\.qoss=low: slurm\.qoss is not a cluster setting.*Did you mean: slurm\.qos"):
        resolve_stages(parse_study_argv(bad))
    # checked as launch checks them (a stage with no training: sbatch=5 was a traceback, [x] and time=[] written)
    for bad, line in (("export:slurm.sbatch=5", "slurm.sbatch must be a list"), ("launcher.sbatch=[x]", "'x' is not one sbatch"),
                      ("export:slurm.time=[]", "slurm.time=[]: expected null or a time sbatch"),
                      ("export:launcher.setup=x", "'launcher.setup'. Did you mean: slurm.setup?"),   # (was: study?)
                      # another stage's interpreter (report:python.sft= was dropped unread)
                      ("export:python.eval=x", "export:python.eval=x: stage export (export) runs in python.sft")):
        with pytest.raises(LaunchError, match=re.escape(line)):
            resolve_stages(parse_study_argv([*argv, bad]))


def test_a_slurm_study_keeps_launchs_rules_for_a_finished_run(tmp_path, monkeypatch):
    """A study on Slurm treats a run that already finished as `launch` does: kept and not submitted again; with
    `resume=never` renamed aside (nothing deleted) and its training submitted anew. Seen failing after the
    study moved onto Jobs: the finished run was skipped whatever `resume` said."""
    record = _stand_in_sbatch(tmp_path, monkeypatch)
    argv = ["study=qwen3_4b_spa_grpo", "launcher=slurm", "model=tiny_base", "gpus_per_node=1", "runs_root=runs",
            "reports=rep", "report:benches=[search_plan_ood]", "report:eval.bench_n={search_plan_ood:2}",
            "report:eval.enable_thinking=auto", "train:grpo.enable_thinking=auto"]   # the tiny base ignores the switch (refused)
    run = tmp_path / "runs" / "grpo_spa" / "seed0"
    assert launch(tmp_path, *argv).returncode == 0
    (run / "DONE").write_text("")   # the training job ran to its end
    assert launch(tmp_path, *argv).returncode == 0   # kept: only the report job is submitted
    assert [Path(p).name for p in record.read_text().split()] == ["train.sbatch", "report.sbatch", "report.sbatch"]
    proc = launch(tmp_path, *argv, "train:resume=never")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [Path(p).name for p in record.read_text().split()][3:] == ["train.sbatch", "report.sbatch"]
    aside = [p for p in run.parent.iterdir() if p.name.startswith("seed0.replaced-")]
    assert len(aside) == 1 and (aside[0] / "DONE").is_file() and not (run / "DONE").exists()
