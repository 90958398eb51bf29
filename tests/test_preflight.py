"""A study's preflight (launch/preflight.py, issue #63 item 4): before its first job it checks the data every
stage names and every stage's interpreter (named or implicit), refuses one line per problem with exit 2, and a
refused real run leaves the working directory (runs root, reports, _slurm) exactly as it was. In-process."""
from __future__ import annotations

import dataclasses
import os
import re
import stat

import pytest

from launch.cli import main
from tests.plan_capture import gpu_env_stand_in, stand_ins

SMALL = ["train:seeds=[0]", "train:arms=[r2e]"]   # one training run: the preflight reads every stage all the same


@pytest.fixture
def bare(tmp_path, tmp_path_factory, monkeypatch):
    """cwd an empty dir; an empty data cache outside it (no download possible: the endpoint refuses); wandb off."""
    outside = tmp_path_factory.mktemp("outside")
    monkeypatch.setenv("DTSFT_DATA", str(outside / "data"))
    monkeypatch.setenv("DTSFT_DATA_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.chdir(tmp_path)
    return outside


@pytest.fixture
def here(tmp_path, bare):
    """An empty cache (no download possible), the study's data slots filled by stand-in files in cwd."""
    outside = bare
    slots = [s for s in stand_ins(tmp_path)["dual_terminator_sft"] if not s.startswith("report:eval.index")]
    return tmp_path, outside, slots


def tree(root) -> dict[str, bytes | None]:
    """Every file (its bytes) and directory (None) under `root`."""
    out = {}
    for d, dirs, files in os.walk(root):
        for name in dirs:
            out[os.path.relpath(os.path.join(d, name), root)] = None
        for name in files:
            with open(os.path.join(d, name), "rb") as fh:
                out[os.path.relpath(os.path.join(d, name), root)] = fh.read()
    return out


def test_a_data_artefact_neither_cached_nor_pinned_stops_the_dry_run(here, monkeypatch, capsys):
    from common import datafetch

    cwd, outside, slots = here
    gpu_env_stand_in(outside, monkeypatch)   # the interpreter passes: only the data is missing
    for name in ("encoder:e5-base-v2", "index:wiki18_e5_flat"):   # as if no public commit pinned them
        monkeypatch.setitem(datafetch.LARGE, name, dataclasses.replace(datafetch.LARGE[name], commit=None))
    assert main(["study=dual_terminator_sft", "dry_run=true", *slots, *SMALL]) == 2
    captured = capsys.readouterr()
    lines = [x for x in captured.err.splitlines() if x.startswith("error: preflight:")]
    assert len(lines) == 2, captured.err
    assert "encoder:e5-base-v2" in lines[0] and "`fetch-data encoder:e5-base-v2 from=DIR`" in lines[0]
    assert "index:wiki18_e5_flat" in lines[1] and "`fetch-data index:wiki18_e5_flat from=DIR`" in lines[1]
    assert re.search(r"^report +launch\.analyze +any:train ", captured.out, flags=re.M)   # the whole plan, all the same


@pytest.mark.parametrize("launcher", ["local", "slurm"])
def test_the_implicit_interpreter_without_vllm_is_refused(here, launcher, capsys):
    # the test venv has no vllm: the launching interpreter, which every job runs without python.eval=, lacks it
    cwd, _, slots = here
    before = tree(cwd)
    argv = ["study=dual_terminator_sft", *slots, *SMALL, *([] if launcher == "local" else ["launcher=slurm"])]
    assert main([*argv, "dry_run=true"]) == 2
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error: preflight:")]
    assert len(lines) == 1 and "stage report (analyze)" in lines[0] and "lacks vllm (backend=vllm)" in lines[0]
    assert "python.eval not given" in lines[0]
    assert tree(cwd) == before


@pytest.mark.parametrize("launcher", ["local", "slurm"])
def test_a_study_says_once_that_cuda_was_not_checked(here, launcher, monkeypatch, capsys):
    """Issue 63 item 4: where no GPU is visible a study's preflight says in one line that CUDA was not checked
    (its GPU-only model's runs, its vLLM evaluation), never a refusal (seen failing: a study said nothing: its
    stages' needs were derived from their settings, without CUDA)."""
    from launch import preflight

    cwd, outside, slots = here
    gpu_env_stand_in(outside, monkeypatch)
    monkeypatch.setattr(preflight, "gpus_visible", lambda: False)
    slurm = ["launcher=slurm"] if launcher == "slurm" else []
    assert main(["study=dual_terminator_sft", *slots, *SMALL, *slurm, "dry_run=true"]) == 0
    out = capsys.readouterr().out
    want = ("CUDA unchecked for the jobs that run on Slurm's nodes" if slurm else
            "CUDA unchecked: no GPU is visible on this machine")
    assert out.count("preflight: CUDA unchecked") == 1 and f"preflight: {want}" in out, out
    assert out.index("# the plan: ") < out.index("preflight: CUDA unchecked")   # the plan first, then the preflight


def test_a_refused_real_run_leaves_every_file_as_it_was(here, tmp_path_factory, monkeypatch, capsys):
    """What the refused study checked is its plan's needs (`preflight.of(plan)`), planned once before anything is
    written, a sweep stage's evaluation jobs included (`eval_profile=` on Slurm: one job per run, then the
    aggregation): no ledger dir (`_slurm/`) appears (seen failing: the gate took needs derived while resolving;
    then: it checked a stand-in analysis job, the evaluation jobs planned again after it)."""
    import launch.study as study
    from launch import preflight

    cwd, outside, slots = here
    planned, checked, real_plan, real_gate = [], [], study.plan_jobs, preflight.gate
    monkeypatch.setattr(study, "plan_jobs", lambda *a, **k: planned.append(real_plan(*a, **k)) or planned[-1])
    monkeypatch.setattr(preflight, "gate", lambda needs, *a, **k: checked.append(needs) or real_gate(needs, *a, **k))
    # a runs root and a reports dir holding earlier work, which the refused run must leave as they are
    (cwd / "runs" / "dual_terminator_sft" / "search" / "seed0").mkdir(parents=True)
    (cwd / "runs" / "dual_terminator_sft" / "search" / "seed0" / "DONE").write_text("earlier\n")
    (cwd / "reports" / "dual_terminator_sft").mkdir(parents=True)
    (cwd / "reports" / "dual_terminator_sft" / "report.md").write_text("# earlier\n")
    bin_dir = outside / "bin"   # an sbatch that records being called, outside the tree compared
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f"#!/bin/sh\necho called >> {outside / 'sbatch_calls'}\necho 'Submitted batch job 1'\n")
    (bin_dir / "sbatch").chmod(stat.S_IRWXU)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    before = tree(cwd)
    for launcher in (["launcher=slurm", "train:eval_profile=rl_ood"], []):
        assert main(["study=dual_terminator_sft", *slots, *SMALL, *launcher]) == 2
        err = capsys.readouterr().err
        if launcher:   # the preflight's line
            assert "lacks vllm (backend=vllm)" in err and "nothing was started, submitted or written" in err
            assert len(planned) == 1 and checked == [preflight.of(planned[0][0])]
            assert [j.name for j in planned[0][0]][:4] == ["train", "train.eval-run-0", "train.aggregate", "report"]
        else:   # here the GPU-only model is refused first, when the run is resolved (a CPU machine): exit 2 all the same
            assert "is GPU-only" in err and len(err.strip().splitlines()) == 1
        assert tree(cwd) == before
    assert not (outside / "sbatch_calls").exists()


def test_no_gpu_visible_is_never_a_preflight_problem(monkeypatch):
    from launch import preflight

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    need = preflight.Needs(who="job", kind="sft", modules={"torch": "training"}, outputs=("runs/x",))
    assert preflight.problems([need]) == []


def test_a_stage_needs_only_the_data_it_reads(tmp_path, monkeypatch):
    from launch.preflight import of
    from launch.study import parse_study_argv, plan_jobs, resolve_stages

    monkeypatch.chdir(tmp_path)   # every stage is resolved: its corpus must exist
    (tmp_path / "c.jsonl").write_text('{"id": "0", "contents": "x"}\n')

    def report_data(*argv):   # what the preflight checks of the plan's report job (planned, nothing written)
        req = parse_study_argv([*argv, "dry_run=true"])
        plan, _ = plan_jobs(req, resolve_stages(req), tmp_path / "plan")
        return next(n.data for n in of(plan) if n.who.startswith("stage report"))

    # the profile's sets count only for the benches evaluated; an encoder and an index only for retriever=e5
    assert "2wikimultihopqa:hub_dev" in report_data("study=qwen3_4b_spa_grpo")
    assert report_data("study=qwen3_4b_spa_grpo", "report:benches=[search_plan_ood]") == ()
    dense = report_data("study=dual_terminator_sft", "corpus=c.jsonl")
    assert {"encoder:e5-base-v2", "index:wiki18_e5_flat", "nq:seed42_1000", "bamboogle:test"} <= set(dense)
    assert report_data("study=dual_terminator_sft", "corpus=c.jsonl", "report:eval.retriever=bm25",
                       "report:benches=[bamboogle]") == ("bamboogle:test",)


# ---- a launch, a GRPO run, a sweep and an analyze check what their jobs need before their first one ----------

def _preflight_lines(err: str) -> list[str]:
    return [x for x in err.splitlines() if x.startswith("error: preflight:")]


@pytest.fixture
def work(tmp_path, bare):
    """cwd with a runs root and a reports dir holding earlier work; an empty data cache, no network."""
    (tmp_path / "runs" / "search" / "seed0").mkdir(parents=True)
    (tmp_path / "runs" / "search" / "seed0" / "DONE").write_text("earlier\n")
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "report.md").write_text("# earlier\n")
    return tmp_path


@pytest.mark.parametrize("dry", [True, False])
def test_a_grpo_run_whose_implicit_interpreter_lacks_the_pinned_trl_stops_before_anything(work, dry, capsys):
    from common.interpreter import installed_trl

    before = tree(work)
    argv = ["stage=grpo", "task=spa", "model=tiny_base", "steps=1", "grpo.trl=1.9.2", "runs_root=runs"]
    assert main([*argv, *(["dry_run=true"] if dry else [])]) == 2
    out, err = capsys.readouterr()
    [line] = _preflight_lines(err)
    assert f"has trl {installed_trl()}" in line and "python.grpo not given" in line and "grpo_spa/seed0" in line
    assert ("# resolved config.yaml" in out) == dry   # a dry run shows its plan, then exits 2
    assert err.strip().endswith("the dry run showed its plan; exit 2" if dry else "nothing was started, submitted or written")
    assert tree(work) == before


def test_an_analyze_lists_every_data_set_it_lacks_and_writes_nothing(work, capsys):
    from launch.analyze import main as analyze_main

    before = tree(work)
    for dry in ([], ["dry_run=true"]):
        assert analyze_main(["runs_root=runs", "out=reports", "profile=rl_ood", *dry]) == 2
        lines = _preflight_lines(capsys.readouterr().err)
        assert any("2wikimultihopqa:hub_dev" in x and "`fetch-data 2wikimultihopqa:hub_dev from=DIR`" in x
                   for x in lines), lines
        assert all(x.startswith("error: preflight: analyze: ") for x in lines)
        assert tree(work) == before


def test_a_sweep_checks_its_runs_and_its_evaluation_before_the_first_run(work, capsys):
    before = tree(work)
    argv = ["sweep", "arms=[r2e,mixed]", "seeds=[0]", "model=tiny", "data=synthetic", "runs_root=runs",
            "eval_profile=rl_ood", "analyze.out=reports"]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    lines = _preflight_lines(err)
    assert lines and all(x.startswith("error: preflight: analyze: ") for x in lines) and "hub_dev" in lines[0]
    assert "sweep run 1/" not in out   # nothing trained
    assert tree(work) == before
    assert main([*argv, "dry_run=true"]) == 2   # its dry run: the same lines, each once (its evaluation's plan too)
    assert _preflight_lines(capsys.readouterr().err) == lines
    assert tree(work) == before


def _torch_without_cuda(where) -> str:
    """An interpreter whose torch says it has no CUDA (a stand-in torch package ahead of the real one)."""
    site = where / "cpu_torch"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("class cuda:\n    is_available = staticmethod(lambda: False)\n")
    python = where / "bin" / "python"
    python.parent.mkdir()
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{site}" exec {__import__("sys").executable} "$@"\n')
    python.chmod(0o755)
    return str(python)


def test_cuda_is_asked_only_where_a_gpu_is_visible(work, tmp_path_factory, monkeypatch, capsys):
    from launch import preflight

    python = _torch_without_cuda(tmp_path_factory.mktemp("env"))
    argv = ["arm=r2e", "model=qwen3_4b", "data=synthetic", "runs_root=runs", f"python.sft={python}", "dry_run=true"]
    monkeypatch.setattr(preflight, "gpus_visible", lambda: False)
    assert main(argv) == 0   # no GPU here: not a problem, one line says CUDA was not checked
    out, err = capsys.readouterr()
    assert out.count("preflight: CUDA unchecked") == 1 and not _preflight_lines(err)
    assert main([*argv, "launcher=slurm"]) == 0
    assert "preflight: CUDA unchecked for the jobs that run on Slurm's nodes" in capsys.readouterr().out
    monkeypatch.setattr(preflight, "gpus_visible", lambda: True)
    assert main(argv) == 2   # a GPU here, and the run's interpreter's torch does not see it
    [line] = _preflight_lines(capsys.readouterr().err)
    assert line.endswith(f"{python}: torch sees no CUDA GPU although this machine shows one (a CPU-only torch?)")


def test_the_preflight_refuses_a_planned_job_from_its_needs_alone(bare):
    """A training Job carries what each of its runs needs (the preflight reads the plan, no second builder):
    an array whose one run reads an artefact neither cached nor pinned, and another a `data.dir` that holds no
    built dataset, is refused in one line naming each of those runs (the second was found only after the run
    dir was locked, past the preflight)."""
    from launch import preflight
    from launch.run import SFT

    open("afile", "w").close()   # a data.cache_root that is a file (seen failing: a FileExistsError traceback at data prep)
    preps = [SFT.resolve(["arm=r2e", "model=tiny", "data=synthetic", f"seed={seed}", "runs_root=runs", *more])
             for seed, more in ((0, ["data.decontam_sets=[2wikimultihopqa:hub_dev]"]), (1, []), (2, ["data.dir=nodata"]),
                                (3, ["data.cache_root=afile"]))]
    job = SFT.job(preps, array=True)
    assert [n.who for n in job.needs.each] == [f"run {p.run_dir}" for p in preps]
    first, second, third = preflight.problems(preflight.of([job]))
    afile = os.path.join(os.getcwd(), "afile")
    assert third == f"run {preps[3].run_dir}: {afile}: {afile} is a file, not a directory"
    assert first.startswith(f"run {preps[0].run_dir}: 2wikimultihopqa:hub_dev is not in the data cache")
    assert second == f"run {preps[2].run_dir}: data.dir: {os.path.join(os.getcwd(), 'nodata')}: not a data_prep dataset directory" \
                     " (manifest.json missing)"
