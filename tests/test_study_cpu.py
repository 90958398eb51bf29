"""The two reference studies run end to end on CPU with the tiny model (`launch study=NAME` with the study's
cpu_smoke): apart from test_study.py's plans so the two long runs can go to different test workers."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.study import load_study
from tests.conftest import ROOT
from tests.study_helpers import launch, prefilled_data_cache


def _tables(reports: Path) -> dict[str, bytes]:
    return {p.relative_to(reports).as_posix(): p.read_bytes() for p in sorted(reports.rglob("*"))
            if p.is_file() and p.suffix in (".md", ".tex", ".csv") and p.name != "report.md"}


@pytest.mark.slow
def test_grpo_study_runs_on_cpu_and_reports_the_reference_beside_ours(tmp_path, monkeypatch):
    study = load_study("qwen3_4b_spa_grpo")
    smoke = [t.replace("=.venv", f"={ROOT}/.venv") for t in study.cpu_smoke]  # written for the repo root (make venv-trl)
    proc = launch(tmp_path, "study=qwen3_4b_spa_grpo", "runs_root=runs", "reports=rep", *smoke, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    manifest = json.loads((tmp_path / "runs" / "grpo_spa" / "seed0" / "manifest.json").read_text())
    assert manifest["study"]["sha256"] == study.sha256
    ref = (tmp_path / "rep" / "tables" / "reference.md").read_text()
    assert "0.000 → 0.019" in ref and "Reported by the reference" in ref
    row = next(line for line in ref.splitlines() if "| search_plan_ood |" in line)
    # tiny_base after 2 steps on 2 items is not what the reference measured: said, not paired (issue 34)
    assert row.rstrip().endswith("| not comparable: tiny_base, n=2 |"), row
    assert f"sha256 {study.sha256[:12]}" in (tmp_path / "rep" / "report.md").read_text()
    before = _tables(tmp_path / "rep")
    edited = tmp_path / "qwen3_4b_spa_grpo.yaml"
    edited.write_text(study.path.read_text().replace("pre: 0.000, post: 0.019", "pre: 0.500, post: 0.900"))
    from launch.analyze import main as analyze_main   # the re-analysis in this process: its figures drawn, not rendered
    from tests.conftest import unrendered_figures

    unrendered_figures(monkeypatch)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.chdir(tmp_path)
    assert analyze_main(["runs_root=runs", "out=rep", "profile=rl_ood", "evaluate=false", "benches=[search_plan_ood]",
                         f"study={edited}"]) == 0
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
    prefilled_data_cache(tmp_path / "data", monkeypatch)
    work = tmp_path / "clone" / "work"   # no ../shared beside it
    work.mkdir(parents=True)
    smoke = [t.replace("=docs/", f"={ROOT / 'docs'}/") for t in study.cpu_smoke]  # written for the repo root
    proc = launch(work, "study=dual_terminator_sft", "runs_root=runs", "reports=rep", *smoke, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    ref = (work / "rep" / "tables" / "reference.md").read_text()
    assert "0.344" in ref and "0.302" in ref
    report = (work / "rep" / "report.md").read_text()
    assert "`failed=0`" in report and "evaluation failed" not in report, report
    # the smoke's anchor (tiny-base) loads and is evaluated; beside the published anchor it is said not comparable
    anchor = next(line for line in ref.splitlines() if "(anchor) | avg | em |" in line)
    assert anchor.rstrip().endswith("| not comparable: tiny-base, 1 of 7 benches, n=2 |"), anchor
    path = datafetch.cached("bamboogle:test")
    want = [it.id for it in sample(read_bench_file(path, "bamboogle"), 2, 42, is_presampled(path, 42))]
    rows = sorted(work.rglob("eval/search_r1_7bench/step-*/bamboogle.jsonl"))
    assert len(rows) == 2, rows   # the anchor's step 0 and the r2e arm's last checkpoint
    for f in rows:
        assert [json.loads(line)["id"] for line in f.read_text().splitlines()] == want, f
        meta = json.loads((f.parent / "meta.json").read_text())
        assert json.dumps(meta).count("bamboogle:test") >= 1 and datafetch.TABLE["bamboogle:test"].source() in json.dumps(meta)
