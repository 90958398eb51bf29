"""Study files (recipes/study/*.yaml, common.study) and `launch study=NAME`: each reference study's plan
checked from its dry run's resolved configs and sbatch lines, the published numbers recorded as the
references state them, and two studies run end to end on CPU with the tiny model."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from common.study import StudyError, load_study, study_names
from tests.conftest import ROOT, shared_path

STUDIES = ("browsecomp_worker_export", "dual_terminator_sft", "llama3_1_8b_spa_grpo", "qwen3_4b_multihop_sft_grpo",
           "qwen3_4b_spa_grpo")


def _launch(cwd: Path, *argv: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), WANDB_MODE="disabled")
    return subprocess.run([sys.executable, "-m", "launch.cli", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _stage_outputs(out: str) -> dict[str, str]:
    """The dry run's text per stage (`== stage i/N: NAME (run)` headers)."""
    parts = re.split(r"^== stage \d+/\d+: (\S+) \(\w+\)$", out, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def _resolved(text: str) -> dict:
    """The `# resolved config.yaml` block a GRPO dry run prints, parsed."""
    import yaml

    m = re.search(r"^# resolved config.yaml\n(.*?)^# local command", text, flags=re.M | re.S)
    assert m, f"no resolved config in:\n{text[:2000]}"
    return yaml.safe_load(m.group(1))


def test_the_five_reference_studies_are_shipped_and_load():
    assert tuple(study_names()) == STUDIES
    for name in STUDIES:
        study = load_study(name)
        assert study.reference_results and study.stages and study.hardware["gpus"] >= 0


def test_an_unmarked_argument_and_a_bad_stage_are_refused(tmp_path):
    src = (ROOT / "recipes" / "study" / "qwen3_4b_spa_grpo.yaml").read_text()
    bad = tmp_path / "qwen3_4b_spa_grpo.yaml"
    bad.write_text(src.replace("      task: spa                        # [ref] search_plan_act", "      task: spa"))
    with pytest.raises(StudyError, match=r"unmarked: line \d+: task: spa"):
        load_study(str(bad))
    bad.write_text(src.replace("run: grpo", "run: grop"))
    with pytest.raises(StudyError, match="Did you mean: grpo"):
        load_study(str(bad))
    bad.write_text(src.replace("metric: em, n: 2417", "metrik: em, n: 2417"))
    with pytest.raises(StudyError, match="unknown key 'metrik'"):
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
    """`launch study=NAME launcher=slurm dry_run=true` for every study, from a scratch directory."""
    from sft.tiny import save_tiny_model

    cwd = tmp_path_factory.mktemp("studies")
    slots = {"dual_terminator_sft": ["corpus=corpus.jsonl", f"nq_rollouts={ROOT / 'docs' / 'examples' / 'nq_rollouts_example.jsonl'}"]}
    for name in ("traj.jsonl", "questions.jsonl"):
        (cwd / name).write_text("")
    (cwd / "corpus.jsonl").write_text('{"id": "0", "contents": "x"}\n')
    slots["qwen3_4b_multihop_sft_grpo"] = ["hotpotqa_trajectories=canonical:traj.jsonl", "hotpotqa_questions=questions.jsonl",
                                          "corpus=corpus.jsonl"]
    save_tiny_model(cwd / "ckpt", seed=0, vocab_size=4160)
    slots["browsecomp_worker_export"] = ["checkpoint=ckpt", f"tokenizer={ROOT / 'common' / 'tiny_tokenizer'}"]
    out = {}
    for name in STUDIES:
        proc = _launch(cwd, f"study={name}", "launcher=slurm", "dry_run=true", *slots.get(name, []))
        assert proc.returncode == 0, f"{name}: {proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        out[name] = _stage_outputs(proc.stdout)
    return out


@pytest.mark.parametrize("name,model_path,gpus", [("qwen3_4b_spa_grpo", "Qwen/Qwen3-4B", 4),
                                                   ("llama3_1_8b_spa_grpo", "meta-llama/Llama-3.1-8B-Instruct", 4)])
def test_grpo_study_plan(dry_runs, name, model_path, gpus):
    train = dry_runs[name]["train"]
    cfg = _resolved(train)
    assert cfg["model"]["path"] == model_path and cfg["launcher"]["gpus_per_node"] == gpus
    assert f"#SBATCH --gpus-per-node={gpus}" in train and f"--nproc_per_node={gpus}" in train
    assert cfg["train"]["steps"] == 250 and cfg["train"]["save_steps"] == [50, 100, 150, 200]
    assert cfg["grpo"]["completions_per_step"] == 32 and cfg["grpo"]["use_vllm"] in ("auto", True)
    assert (cfg["lora"]["r"], cfg["lora"]["alpha"]) == (32, 64)
    assert "profile=rl_ood" in dry_runs[name]["report"]
    # The hybrid Qwen3-4B's thinking switch is explicit ([chosen]) in training and in its evaluation;
    # Llama's template does not read it (auto: nothing passed).
    hybrid = model_path == "Qwen/Qwen3-4B"
    assert cfg["grpo"]["enable_thinking"] == (True if hybrid else "auto")
    assert ("eval.enable_thinking=true" in dry_runs[name]["report"]) == hybrid


def test_dual_terminator_study_plan(dry_runs):
    train, report = dry_runs["dual_terminator_sft"]["train"], dry_runs["dual_terminator_sft"]["report"]
    assert train.count("'model': 'qwen3_4b_thinking_2507'") == 9
    # 218 = floor(3500 / 16): n=3500 at batch 16; r2e one epoch, search and mixed two (436)
    assert train.count("218 optimizer steps (for n=3500), checkpoints at [50, 100, 150, 200, 218]\n") == 3
    assert train.count("436 optimizer steps (for n=3500), checkpoints at [50, 100, 150, 200, 218, 436]\n") == 6
    assert "#SBATCH --gpus-per-node=8" in train and "#SBATCH --array=0-8" in train  # 3 arms x 3 seeds
    for arm in ("r2e", "search", "mixed"):
        for seed in (0, 1, 2):
            assert f"{arm}/seed{seed}" in train
    assert "profile=search_r1_7bench" in report and "anchor=Qwen/Qwen3-4B-Thinking-2507" in report
    # The search arm: OpenSeeker + the NQ-style slot, half of the arm's rows each ([chosen], data-prep's ~SHARE).
    nq = ROOT / "docs" / "examples" / "nq_rollouts_example.jsonl"
    assert f"'data.sources.search=[openseeker:PolarSeeker/OpenSeeker-v1-Data~0.5,search-r1:{nq}~0.5]'" in train


def test_multihop_and_export_study_plans(dry_runs):
    mh = dry_runs["qwen3_4b_multihop_sft_grpo"]
    assert "Qwen/Qwen3-4B" in mh["sft"] and "lr: 0.0001" in mh["sft"] and "global_batch_size: 128" in mh["sft"]
    assert "checkpoints/step-000100" in mh["grpo"] and "profile=multihop_qa" in mh["report"]
    assert _resolved(mh["grpo"])["grpo"]["enable_thinking"] is True and "eval.enable_thinking=true" in mh["report"]
    export = dry_runs["browsecomp_worker_export"]["export"]
    assert "vocab_size: 151936" in export and "tokenizer from " in export and "tiny_tokenizer" in export


def test_a_missing_data_slot_is_named(tmp_path):
    proc = _launch(tmp_path, "study=qwen3_4b_multihop_sft_grpo")
    assert proc.returncode == 2 and "hotpotqa_trajectories=..." in proc.stderr and "data slots" in proc.stderr
    proc = _launch(tmp_path, "study=qwen3_4b_spa_grpo", "reprot:eval.n=2", "dry_run=true")
    assert proc.returncode == 2 and "Did you mean: report" in proc.stderr


def _tables(reports: Path) -> dict[str, bytes]:
    return {p.relative_to(reports).as_posix(): p.read_bytes() for p in sorted(reports.rglob("*"))
            if p.is_file() and p.suffix in (".md", ".tex", ".csv") and p.name != "report.md"}


@pytest.mark.slow
def test_grpo_study_runs_on_cpu_and_reports_the_reference_beside_ours(tmp_path):
    study = load_study("qwen3_4b_spa_grpo")
    proc = _launch(tmp_path, "study=qwen3_4b_spa_grpo", "runs_root=runs", "reports=rep", *study.cpu_smoke, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    manifest = json.loads((tmp_path / "runs" / "grpo_spa" / "seed0" / "manifest.json").read_text())
    assert manifest["study"]["sha256"] == study.sha256
    ref = (tmp_path / "rep" / "tables" / "reference.md").read_text()
    assert "0.000 → 0.019" in ref and "Reported by the reference" in ref
    row = next(line for line in ref.splitlines() if "| search_plan_ood |" in line)
    assert re.search(r"\d\.\d{3} → \d\.\d{3} @2", row), row  # the measured pre -> post beside the reported one
    assert f"sha256 {study.sha256[:12]}" in (tmp_path / "rep" / "report.md").read_text()
    before = _tables(tmp_path / "rep")
    edited = tmp_path / "qwen3_4b_spa_grpo.yaml"
    edited.write_text(study.path.read_text().replace("pre: 0.000, post: 0.019", "pre: 0.500, post: 0.900"))
    env = dict(os.environ, PYTHONPATH=str(ROOT), WANDB_MODE="disabled")
    subprocess.run([sys.executable, "-m", "analysis.cli", "runs_root=runs", "out=rep", "profile=rl_ood", "evaluate=false",
                    "benches=[search_plan_ood]", f"study={edited}"], cwd=tmp_path, env=env, check=True, capture_output=True)
    after = _tables(tmp_path / "rep")
    changed = sorted(k for k in before if before[k] != after.get(k))
    assert changed == ["tables/reference.md", "tables/reference.tex"]
    assert "0.500 → 0.900" in after["tables/reference.md"].decode()


@pytest.mark.slow
def test_dual_terminator_study_runs_on_cpu(tmp_path, monkeypatch):
    """cpu_smoke end to end from a data cache pre-filled by `fetch-data from=DIR` (its keys name no ../shared,
    it runs where no ../shared is, and no download can happen: the endpoint is a closed loopback port): the
    report has no failed evaluation, and each checkpoint's evaluated ids are the first n of the cached file's
    seeded sample (what bench_root= gives on the same file)."""
    from common import datafetch
    from evals.benches import is_presampled, read_bench_file, sample

    study = load_study("dual_terminator_sft")
    assert not [t for t in study.cpu_smoke if "../shared" in t]
    cache = tmp_path / "data"
    monkeypatch.setenv("DTSFT_DATA", str(cache))
    monkeypatch.setenv("DTSFT_DATA_ENDPOINT", "http://127.0.0.1:9")
    fill = subprocess.run([sys.executable, "-m", "common.datafetch", f"from={shared_path('benchmarks')}"],
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=120)
    assert fill.returncode == 0, fill.stderr
    work = tmp_path / "clone" / "work"   # no ../shared beside it
    work.mkdir(parents=True)
    smoke = [t.replace("=docs/", f"={ROOT / 'docs'}/") for t in study.cpu_smoke]  # written for the repo root
    # the anchor as a directory: evaluate resolving the embedded name `tiny-base` is issue 34's (a later token wins)
    smoke.append(f"report:anchor={ROOT / 'common' / 'tiny_base'}")
    proc = _launch(work, "study=dual_terminator_sft", "runs_root=runs", "reports=rep", *smoke, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    ref = (work / "rep" / "tables" / "reference.md").read_text()
    assert "0.344" in ref and "0.302" in ref
    report = (work / "rep" / "report.md").read_text()
    assert "`failed=0`" in report and "evaluation failed" not in report, report
    path = datafetch.cached("bamboogle:test")
    want = [it.id for it in sample(read_bench_file(path, "bamboogle"), 2, 42, is_presampled(path, 42))]
    rows = sorted(work.rglob("eval/search_r1_7bench/step-*/bamboogle.jsonl"))
    assert len(rows) == 2, rows   # the anchor's step 0 and the r2e arm's last checkpoint
    for f in rows:
        assert [json.loads(line)["id"] for line in f.read_text().splitlines()] == want, f
        meta = json.loads((f.parent / "meta.json").read_text())
        assert json.dumps(meta).count("bamboogle:test") >= 1 and datafetch.TABLE["bamboogle:test"].source() in json.dumps(meta)


def _opts(script: str) -> dict[str, str]:
    return dict(line[len("#SBATCH --"):].split("=", 1) for line in script.splitlines()
                if line.startswith("#SBATCH --") and "=" in line)


def test_slurm_study_dry_run_chains_every_stage(dry_runs):
    """launch study=NAME launcher=slurm dry_run=true: each stage's scripts wait for the previous stage's jobs."""
    mh = dry_runs["qwen3_4b_multihop_sft_grpo"]
    assert "dependency" not in _opts(mh["sft"]) and "[study] waits for: nothing" in mh["sft"]
    assert _opts(mh["grpo"])["dependency"] == "afterok:<job ids of stage sft>"
    report = mh["report"][mh["report"].index("report.sbatch (not written"):]
    opts = _opts(report)
    assert opts["dependency"] == "afterok:<job ids of stage grpo>" and "gpus-per-node" not in opts
    assert re.search(r"^exec \S+ -m analysis\.cli .*profile=multihop_qa .*launcher=slurm$", report, flags=re.M)
    assert "DTSFT_STUDY=" in report and "dry_run" not in report.split("exec ", 1)[1]
    # The dual-terminator report: what is to evaluate now (the anchor) as a one-task array, then the aggregation.
    dual = dry_runs["dual_terminator_sft"]
    assert _opts(dual["train"])["array"] == "0-8" and "dependency" not in _opts(dual["train"])
    eval_part = dual["report"][dual["report"].index("eval.sbatch (not written"):dual["report"].index("aggregate.sbatch")]
    assert _opts(eval_part)["array"] == "0-0" and _opts(eval_part)["gpus-per-node"] == "1"
    assert "# task 0: anchor/seed0/step-000000" in eval_part


def test_slurm_study_submits_stage_after_stage(tmp_path, monkeypatch):
    """With a stand-in sbatch: the train stage's job, then the report job waiting for it (afterok); the report
    job, run here as Slurm would, submits the evaluation array (one task per checkpoint) and the aggregation."""
    from sft.tiny import save_tiny_model

    bin_dir, record = tmp_path / "bin", tmp_path / "submitted.txt"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\nfor last; do :; done\necho "$last" >> {record}\n'
                                    f'echo $((5000 + $(wc -l < {record})))\n')
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    proc = _launch(tmp_path, "study=qwen3_4b_spa_grpo", "launcher=slurm", "model=tiny_base", "gpus_per_node=1",
                   "runs_root=runs", "reports=rep", "report:benches=[search_plan_ood]",
                   "report:eval.bench_n={search_plan_ood:2}",
                   "report:eval.enable_thinking=auto")   # the tiny base's template ignores the switch (refused)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    train, report = (Path(p) for p in record.read_text().split())
    assert train.name == "launch.sbatch" and "dependency" not in _opts(train.read_text())
    assert _opts(report.read_text())["dependency"] == "afterok:5001"
    assert "watch: squeue -j 5001,5002" in proc.stdout
    for step in (0, 2):   # the training "ran": two checkpoints to evaluate
        save_tiny_model(tmp_path / "runs" / "grpo_spa" / "seed0" / "checkpoints" / f"step-{step:06d}", seed=step)
    env = dict(os.environ, SLURM_JOB_ID="5002", DTSFT_SLURM_AFTER="afterok:5001", WANDB_MODE="disabled")
    job = subprocess.run(["bash", str(report)], env=env, capture_output=True, text=True, timeout=300)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    evaluation, aggregation = (Path(p) for p in record.read_text().split()[2:])
    assert _opts(evaluation.read_text())["array"] == "0-1" and "dependency" not in _opts(evaluation.read_text())
    assert _opts(aggregation.read_text())["dependency"] == "afterany:5003"
    assert (report.parent / "report.jobs").read_text().split() == ["5002", "5003", "5004"]


_BLOCK_TRAIN = """  - name: train
    run: grpo
    args:
      task: spa                        # [ref] search_plan_act
      model: qwen3_4b                  # [ref] Qwen/Qwen3-4B, the hybrid model
      grpo.enable_thinking: true       # [chosen] not stated by the reference: the hybrid's thinking mode (its default), explicit
      runs_root: ${vars.runs_root}     # [chosen] one directory per study
"""


def test_flow_style_args_are_held_to_the_source_marks_like_block_style(tmp_path):
    """`- {name: ..., run: ..., args: {...}}` (the docstring's own form): each argument needs its own
    [ref]/[chosen] mark on its line, as in block style; one mark cannot speak for two arguments."""
    src = (ROOT / "recipes" / "study" / "qwen3_4b_spa_grpo.yaml").read_text()
    assert _BLOCK_TRAIN in src
    path = tmp_path / "qwen3_4b_spa_grpo.yaml"
    one_line = ('  - {name: train, run: grpo, args: {task: spa, model: qwen3_4b, grpo.enable_thinking: true, '
                'runs_root: "${vars.runs_root}"}}\n')
    path.write_text(src.replace(_BLOCK_TRAIN, one_line))
    with pytest.raises(StudyError, match=r"unmarked: line 15: .*task: spa"):
        load_study(str(path))
    path.write_text(src.replace(_BLOCK_TRAIN, one_line.rstrip("\n") + "  # [ref] all of them\n"))
    with pytest.raises(StudyError, match=r"line 15: 4 arguments \(task, model, grpo.enable_thinking, runs_root\) share"):
        load_study(str(path))
    marked = ("  - {name: train, run: grpo, args: {\n"
              "      task: spa,                        # [ref] search_plan_act\n"
              "      model: qwen3_4b,                  # [ref] Qwen/Qwen3-4B, the hybrid model\n"
              "      grpo.enable_thinking: true,       # [chosen] the hybrid's thinking mode, explicit\n"
              '      runs_root: "${vars.runs_root}"}}  # [chosen] one directory per study\n')
    path.write_text(src.replace(_BLOCK_TRAIN, marked))
    assert load_study(str(path)).stages[0].args == load_study("qwen3_4b_spa_grpo").stages[0].args
    path.write_text(src.replace(_BLOCK_TRAIN, marked.replace("  # [ref] Qwen/Qwen3-4B, the hybrid model", "")))
    with pytest.raises(StudyError, match=r"unmarked: line 17: model: qwen3_4b,$"):
        load_study(str(path))
