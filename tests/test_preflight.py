"""A study's preflight (launch/preflight.py, issue #63 item 4): before its first job it checks the data every
stage names and every stage's interpreter (named or implicit), refuses one line per problem with exit 2, and a
refused real run leaves the working directory (runs root, reports, _slurm) exactly as it was. In-process."""
from __future__ import annotations

import dataclasses
import os
import stat

import pytest

from launch.cli import main
from tests.plan_capture import gpu_env_stand_in, stand_ins

SMALL = ["train:seeds=[0]", "train:arms=[r2e]"]   # one training run: the preflight reads every stage all the same


@pytest.fixture
def here(tmp_path, tmp_path_factory, monkeypatch):
    """An empty cache (no download possible), the study's data slots filled by stand-in files in cwd."""
    outside = tmp_path_factory.mktemp("outside")
    monkeypatch.setenv("DTSFT_DATA", str(outside / "data"))
    monkeypatch.setenv("DTSFT_DATA_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.chdir(tmp_path)
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
    assert "== stage 2/2: report" in captured.out   # the dry run still shows its whole plan


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


def test_a_refused_real_run_leaves_every_file_as_it_was(here, tmp_path_factory, monkeypatch, capsys):
    cwd, outside, slots = here
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
    for launcher in (["launcher=slurm"], []):
        assert main(["study=dual_terminator_sft", *slots, *SMALL, *launcher]) == 2
        err = capsys.readouterr().err
        assert "lacks vllm (backend=vllm)" in err and "nothing was started, submitted or written" in err
        assert tree(cwd) == before
    assert not (outside / "sbatch_calls").exists()


def test_no_gpu_visible_is_never_a_preflight_problem(monkeypatch):
    from launch import preflight

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    need = preflight.Needs("job", kind="sft", modules={"torch": "training"}, outputs=("runs/x",))
    assert preflight.problems([need]) == []


def test_a_stage_needs_only_the_data_it_reads():
    from launch.study import parse_study_argv, study_needs

    def report_data(*argv):
        study, extra, _ = parse_study_argv(list(argv))
        return next(n.data for n in study_needs(study, extra) if n.who.startswith("stage report"))

    # the profile's sets count only for the benches evaluated; an encoder and an index only for retriever=e5
    assert "2wikimultihopqa:hub_dev" in report_data("study=qwen3_4b_spa_grpo")
    assert report_data("study=qwen3_4b_spa_grpo", "report:benches=[search_plan_ood]") == ()
    dense = report_data("study=dual_terminator_sft", "corpus=c.jsonl")
    assert {"encoder:e5-base-v2", "index:wiki18_e5_flat", "nq:seed42_1000", "bamboogle:test"} <= set(dense)
    assert report_data("study=dual_terminator_sft", "corpus=c.jsonl", "report:eval.retriever=bm25",
                       "report:benches=[bamboogle]") == ("bamboogle:test",)
