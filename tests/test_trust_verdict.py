"""Issue 62 (Trust V): a command never ends green with a wrong, stale or missing result. An interpreter is
one only if it answers a Python probe; analyze's exit status is the analysis' verdict; the readers of an
eval dir's rows report a torn or mistyped row in one line."""
from __future__ import annotations

import re
import sys

import pytest

from common import interpreter
from launch.analyze import main as analyze_main
from launch.cli import main as launch_main


# ------------------------------------------------------------------ interpreters answer a probe
@pytest.mark.parametrize("program", ["/bin/true", "/bin/echo"])
def test_a_program_that_is_not_python_is_refused_as_an_interpreter_in_one_line(capfd, tmp_path, program):
    """`/bin/true` exits 0 printing nothing, `/bin/echo` prints its arguments back: neither is a Python (both
    passed before: /bin/true as an interpreter holding everything, /bin/echo as `KeyError: '-c'`)."""
    interpreter.missing_modules.cache_clear()
    why = interpreter.check("sft", program, {"torch": "training"})
    assert why is not None and why.startswith(f"python.sft={program} is not a Python interpreter: it exited 0")
    assert analyze_main([f"runs_root={tmp_path / 'runs'}", "launcher=slurm", f"python.eval={program}",
                         "dry_run=true"]) == 2
    err = capfd.readouterr().err
    assert err.startswith(f"error: python.eval={program} is not a Python interpreter") and err.count("\n") == 1
    assert "Traceback" not in err
    assert launch_main(["arm=r2e", "launcher=slurm", "data=synthetic", f"runs_root={tmp_path / 'runs'}",
                        f"python.sft={program}", "dry_run=true"]) == 2
    err = capfd.readouterr().err
    assert err.startswith(f"error: python.sft={program} is not a Python interpreter") and err.count("\n") == 1
    assert not (tmp_path / "runs").exists()


def test_a_python_interpreter_answers_the_probe_with_its_missing_modules():
    interpreter.missing_modules.cache_clear()
    assert interpreter.missing_modules(sys.executable, ("json", "no_such_module_62")) == ("no_such_module_62",)
    assert interpreter.check("eval", sys.executable, {"json": "x"}) is None


# ------------------------------------------------------------------ analyze's exit status is its verdict
FACTS = [("Lomira", "capital", "Velsk"), ("Tandor", "river", "Ossa")]


def _tiny_study(root):
    from common.io import write_jsonl
    from sft.tiny import save_tiny_model

    (root / "benches" / "synthqa").mkdir(parents=True)
    write_jsonl(root / "corpus.jsonl", ({"id": str(i), "contents": f'"{n}"\nThe {a} of {n} is {v}.'}
                                        for i, (n, a, v) in enumerate(FACTS)))
    write_jsonl(root / "benches" / "synthqa" / "test.jsonl", ({"id": f"q{i}", "question": f"What is the {a} of {n}?",
                                                               "golden_answers": [v]} for i, (n, a, v) in enumerate(FACTS)))
    run = root / "runs" / "r2e" / "seed0"
    save_tiny_model(run / "checkpoints" / "step-000001", seed=1)
    (run / "DONE").write_text("")
    return [f"runs_root={root / 'runs'}", f"out={root / 'rep'}", "benches=[synthqa]", "n=2",
            f"eval.corpus={root / 'corpus.jsonl'}", f"eval.bench_root={root / 'benches'}", "eval.max_turns=1",
            "eval.max_model_len=512", "eval.max_new_tokens=4", "eval.progress=false", f"eval.index_dir={root / 'idx'}"]


def test_a_failed_re_evaluation_is_a_gap_and_fails_analyze(tmp_path, capfd, monkeypatch):
    """Issue 62, item 1: re-evaluated under other settings that fail (backend=vllm where vLLM is missing), the
    old summary stayed while its rows were renamed aside, the report plotted it, "0 missing point(s)", exit 0.
    Now the summary goes aside with its rows, the point is a gap whose reason is on the console, the report's
    first line says PARTIAL and analyze exits 4 (0 with allow_failed=true)."""
    import json

    from tests.plan_capture import gpu_env_stand_in

    pytest.importorskip("evals.run")
    if interpreter.missing_modules(sys.executable, ("vllm",)) == ():
        pytest.skip("vLLM is installed here: backend=vllm would not fail")
    argv = _tiny_study(tmp_path)
    eval_dir = tmp_path / "runs" / "r2e" / "seed0" / "eval" / "step-000001"
    assert analyze_main(argv) == 0
    assert "synthqa" in json.loads((eval_dir / "summary.json").read_text())
    capfd.readouterr()
    # the preflight asks this interpreter for vllm in a subprocess: a stand-in package it finds there (never in this
    # process, which is the one that evaluates), so the evaluation itself is what fails
    gpu_env_stand_in(tmp_path, monkeypatch)
    assert analyze_main([*argv, "eval.backend=vllm"]) == 4
    out, err = capfd.readouterr()
    [line] = [x for x in err.splitlines() if x.startswith("evaluation failed for")]
    assert line.startswith("evaluation failed for 1 point(s) (r2e/seed0/step 1 × synthqa): ") and "vllm" in line.lower()
    assert "error: 1 expected point(s) failed to evaluate" in err
    assert "synthqa" not in json.loads((eval_dir / "summary.json").read_text())   # no summary outlives its rows
    assert list(eval_dir.glob("summary.json.replaced-*")) and list(eval_dir.glob("synthqa.jsonl.replaced-*"))
    report = (tmp_path / "rep" / "report.md").read_text()
    assert report.splitlines()[0] == "# Transfer-curve report: PARTIAL: 1 expected point(s) failed to evaluate " \
                                     "(listed under Missing points)"
    assert "r2e/seed0/step-000001 × synthqa: evaluation failed: " in report
    assert 'id="partial"' in (tmp_path / "rep" / "report.html").read_text()
    results = (tmp_path / "rep" / "results.csv").read_text().splitlines()
    assert results == ["arm,seed,step,bench,metric,value,n"]
    assert analyze_main([*argv, "eval.backend=vllm", "allow_failed=true"]) == 0
    assert "evaluation failed for 1 point(s)" in capfd.readouterr().err


def test_analyze_with_nothing_to_analyze_exits_2(tmp_path, capfd):
    """Issue 62, item 9: a runs_root that does not exist wrote an empty report, exit 0."""
    missing = tmp_path / "nope"
    assert analyze_main([f"runs_root={missing}", "evaluate=false", f"out={tmp_path / 'rep'}"]) == 2
    assert capfd.readouterr().err == f"error: runs_root={missing}: no such directory and no anchor=: nothing to analyze\n"
    (tmp_path / "empty").mkdir()
    assert analyze_main([f"runs_root={tmp_path / 'empty'}", "evaluate=false", f"out={tmp_path / 'rep'}"]) == 2
    assert "no runs in it" in capfd.readouterr().err
    assert not (tmp_path / "rep").exists()
    assert analyze_main([f"runs_root={missing}", "evaluate=false", "dry_run=true"]) == 0


def test_a_point_whose_evaluation_failed_is_a_gap_whatever_its_eval_dir_holds(tmp_path, capsys):
    """The analysis half of item 1, without a model: an evaluation that fails leaves an old summary on disk;
    the point is not reported (a gap naming the failure), the command's verdict is 4, the reasons grouped."""
    from test_analysis_helpers import make_run

    from launch.analyze import print_result, run_analysis

    root = tmp_path / "runs"
    make_run(root, "r2e", 0, [10, 20], evaluated={10: {"nq": 0.8}, 20: {"nq": 0.6}})

    from launch.evaluation import Harness

    class Failing(Harness):
        def evaluate(self, cfg):
            raise RuntimeError("No module named 'vllm'")

        def pending(self, cfg):
            return {"nq": ["backend: hf -> vllm"]}   # held under another evaluation identity

        def check(self, cfg):
            return cfg

    failing = Failing()
    cfg = {"runs_root": str(root), "out": str(tmp_path / "rep"), "benches": ["nq"]}
    res = run_analysis(cfg, evaluator=failing)
    assert res.table.empty, res.table                     # 0.8 and 0.6 are another identity's numbers
    assert [m.line() for m in res.missing if m.arm == "r2e"] == [
        f"r2e/seed0/step-{s:06d} × nq: evaluation failed: RuntimeError: No module named 'vllm'" for s in (10, 20)]
    assert (tmp_path / "rep" / "report.md").read_text().startswith(
        "# Transfer-curve report: PARTIAL: 2 expected point(s) failed to evaluate")
    capsys.readouterr()
    assert print_result(res) == 4
    err = capsys.readouterr().err.splitlines()
    assert err == ["evaluation failed for 2 point(s) (r2e/seed0/step 10 × nq, r2e/seed0/step 20 × nq): "
                   "RuntimeError: No module named 'vllm'",
                   "error: 2 expected point(s) failed to evaluate; the report is marked PARTIAL "
                   "(allow_failed=true accepts it: exit 0)"]
    assert print_result(run_analysis({**cfg, "allow_failed": True}, evaluator=failing)) == 0
    # evaluate=false reports what is on disk, as it is
    assert len(run_analysis({**cfg, "evaluate": False}).table) > 0


def test_an_evaluation_renaming_a_bench_aside_takes_it_out_of_summary_and_meta(tmp_path, capsys):
    """evals.store.EvalStore.claim(overwrite=true) renamed the rows aside but left the bench in summary.json and
    meta.json: an evaluation failing after it left a summary whose rows were gone (issue 62, item 1)."""
    import json

    from common.io import write_json
    from evals.store import EvalStore

    out = tmp_path / "eval"
    store = EvalStore(out)
    (out / "sampled_ids").mkdir(parents=True)
    write_json(store.sample_path("nq"), {"ids": ["a"]})
    store.rows_path("nq").write_text('{"id": "a", "identity": "old"}\n')
    write_json(out / "summary.json", {"nq": {"em": 1.0, "n": 1}, "hotpotqa": {"em": 0.5, "n": 1}})
    write_json(out / "meta.json", {"identities": {"nq": {"fingerprint": "old"}, "hotpotqa": {"fingerprint": "h"}}})
    store.claim("nq", {"fingerprint": "new"}, {"fingerprint": "old"}, overwrite=True)
    assert json.loads((out / "summary.json").read_text()) == {"hotpotqa": {"em": 0.5, "n": 1}}
    assert json.loads((out / "meta.json").read_text()) == {"identities": {"hotpotqa": {"fingerprint": "h"}}}
    [summary_aside] = out.glob("summary.json.replaced-*")
    assert json.loads(summary_aside.read_text())["nq"] == {"em": 1.0, "n": 1}    # nothing is deleted
    assert list(out.glob("meta.json.replaced-*")) and list(out.glob("nq.jsonl.replaced-*"))
    assert not store.rows_path("nq").exists()


# ------------------------------------------------------------------ readers of eval rows: one line per bad row
GOOD_ROW = (b'{"id": "a", "metrics": {"em": 1.0}, "extract_rule": "final_answer", "stop_reason": "answer", '
            b'"num_tool_errors": 0, "num_tool_calls": 1}\n')


@pytest.mark.parametrize("case, tail, said", [
    ("torn mid-UTF-8", '{"id": "x", "question": "caf\u00e9'.encode()[:-1], "a torn last line (no newline at its end"),
    ("torn ASCII", b'{"id": "x", "metr', "a torn last line (no newline at its end"),
    ("non-numeric metric", b'{"id": "x", "metrics": {"em": "high"}}\n', "metric em = 'high': not a number"),
    ("non-dict function", b'{"id": "x", "metrics": {"em": 1}, "extract_rule": "none", "stop_reason": "answer", '
                          b'"num_tool_errors": 0, "messages": [{"role": "assistant", "tool_calls": '
                          b'[{"function": "search"}]}]}\n', "a tool call's `function` is str, not an object"),
    ("non-numeric count", b'{"id": "x", "metrics": {"em": 1}, "num_tool_calls": "two"}\n',
     "num_tool_calls = 'two': not a number"),
])
def test_a_bad_eval_row_is_one_line_naming_file_and_line(tmp_path, case, tail, said):
    """Issue 62, items 5 and 8: a torn last line (a JsonLineError traceback when cut inside a character), a
    non-numeric metric or a non-dict `function` (html.list_item / html._calls tracebacks) in an eval jsonl:
    each reader of the rows names the file and line in one line (report.html's and behaviour's: the bad row;
    the bootstraps': a bad line of the per-item metrics), none raises anything else."""
    from analysis.behaviour import read_episodes
    from analysis.collect import example_metric
    from analysis.errors import AnalysisError
    from analysis.html import read_rows

    rows = tmp_path / "nq.jsonl"
    rows.write_bytes(GOOD_ROW + tail)
    problems = []
    assert [r["id"] for r in read_rows(rows, problems)] == ["a"]
    assert len(problems) == 1 and problems[0].startswith(f"{rows}:2: not shown in report.html ({said}"), problems
    with pytest.raises(AnalysisError, match=f"^{re.escape(str(rows))}:2: .*{re.escape(said)}"):
        read_episodes(rows)
    problems = []
    example_metric(tmp_path, "nq", "em", problems)
    assert all(p.startswith(f"{rows}:2: ") for p in problems)


def test_analyze_names_a_row_torn_inside_a_character_and_still_reports(tmp_path, capfd):
    """The probe's case: the last row of an eval jsonl cut inside a multibyte character made analyze end in a
    JsonLineError traceback, no report."""
    import html

    from test_analysis_helpers import make_run

    root = tmp_path / "runs"
    make_run(root, "r2e", 0, [10], evaluated={10: {"nq": 0.5}})
    rows = root / "r2e" / "seed0" / "eval" / "step-000010" / "nq.jsonl"
    rows.write_bytes(rows.read_bytes() + '{"id": "x", "question": "caf\u00e9'.encode()[:-1])
    assert analyze_main([f"runs_root={root}", "evaluate=false", "benches=[nq]", f"out={tmp_path / 'rep'}"]) == 0
    out, err = capfd.readouterr()
    assert "Traceback" not in err + out
    page = html.unescape((tmp_path / "rep" / "report.html").read_text())
    assert f"<li>{rows}:11: not shown in report.html (a torn last line (no newline at its end" in page


# ------------------------------------------------------------------ report.html over http
def test_report_html_policy_allows_its_own_shards_over_http_and_nothing_else():
    """Issue 62, item 12: `script-src 'unsafe-inline' file:` blocked report_data/*.js when the page was served
    over http; the page's own origin ('self') now loads them, no other host can (the browser tier opens it
    from a loopback http server: tests/test_browser_report.py)."""
    from analysis.html import ASSETS

    page = (ASSETS / "report.html").read_text()
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page).group(1)
    policy = {d.split()[0]: d.split()[1:] for d in csp.split("; ")}
    assert policy["default-src"] == ["'none'"]
    assert set(policy["script-src"]) == {"'unsafe-inline'", "'self'", "file:"}


# ------------------------------------------------------------------ a job that exits 0 without its completion record
def _resumable_state(rd):
    state = rd / "state" / "step-000001"
    state.mkdir(parents=True)
    (state / "meta.json").write_text("{}")
    (state / "COMPLETE").write_text("")


def test_a_trainer_exiting_0_without_done_or_state_failed_and_one_stopped_by_sigterm_is_stopped(tmp_path, capfd):
    """Issue 62, items 2 and 9: a trainer that exits 0 having written nothing ("stopped (exit 0) before any
    resumable state was written", exit 0, no FAILED) failed: FAILED, exit 1; one stopped by SIGTERM with its
    state saved gets a STOPPED record, which analyze reports as such (it said "run still training")."""
    from test_analysis_helpers import make_run

    from analysis.discover import load_run
    from common import layout
    from launch.run import report_end

    rd = tmp_path / "rd"
    rd.mkdir()
    assert report_end(rd, 0, rd / "x.log", "L1") == 1
    err = capfd.readouterr().err
    assert err.startswith("error: the trainer exited 0 without writing DONE or a resumable state") and err.count("\n") == 1
    assert layout.end_record(rd)["state"] == "failed"
    run = make_run(tmp_path / "runs", "r2e", 0, [1], horizon=2, save_steps=[1, 2], done=False)
    _resumable_state(run)
    assert report_end(run, 0, run / "x.log", "L2", stopped_by="SIGTERM") == 0
    assert "re-run the same command to resume" in capfd.readouterr().out
    rec = layout.end_record(run)
    assert rec["state"] == "stopped" and rec["reason"].startswith("stopped by SIGTERM with its state saved")
    loaded = load_run(run, "r2e", 0)
    assert loaded.status() == "stopped"
    assert loaded.not_checkpointed().startswith("stopped: stopped by SIGTERM") and "still training" not in loaded.not_checkpointed()


def test_a_signal_forwarded_to_the_trainer_is_recorded(tmp_path):
    """launch.local.run_logged names the signals it forwarded (report_end's `stopped_by`); the child is told it
    is ready by a file it writes once its handler is installed: the signal never arrives before."""
    import os
    import signal
    import threading
    import time

    from launch.local import run_logged

    ready = tmp_path / "ready"
    child = ("import pathlib, signal, sys, time\n"
             "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
             f"pathlib.Path({str(ready)!r}).write_text('1')\n"
             "time.sleep(60)\nsys.exit(5)\n")

    default = signal.getsignal(signal.SIGTERM)

    def stop_when_ready():   # the child's handler and launch's forwarding both in place: then the signal
        while not ready.exists() or signal.getsignal(signal.SIGTERM) is default:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)

    stops: list[str] = []
    t = threading.Thread(target=stop_when_ready, daemon=True)
    t.start()
    rc, _ = run_logged([sys.executable, "-c", child], tmp_path / "logs", cwd=tmp_path, stops=stops)
    t.join(timeout=5)
    assert (rc, stops) == (0, ["SIGTERM"])


def test_a_study_stage_that_exits_0_without_its_completion_record_fails(tmp_path, capfd, monkeypatch):
    """Issue 62, item 2: an export stage whose interpreter exits 0 having written nothing ("all stages done",
    exit 0): the stage failed, its missing export_info.json named, the study exits 1."""
    from pathlib import Path

    python = tmp_path / "env" / "python"   # a Python, except that its `-m sft.export` does nothing
    python.parent.mkdir()
    python.write_text(f'#!/bin/sh\n[ "$2" = "sft.export" ] && exit 0\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    tokenizer = Path(__file__).resolve().parents[1] / "common" / "tiny_tokenizer"
    assert launch_main(["study=browsecomp_worker_export", "checkpoint=ckpt", f"tokenizer={tokenizer}",
                        f"python.sft={python}"]) == 1
    err = capfd.readouterr().err
    # the export job is checked by its completion record here as on a Slurm node (python -m launch.completion)
    assert (f"error: sft.export exited 0 but wrote no {Path('exports/browsecomp_worker/export_info.json')} "
            "(its completion record)") in err
    assert "study browsecomp_worker_export: stage export failed (exit 1)" in err and "all stages done" not in err
    record = tmp_path / "exports" / "browsecomp_worker" / "export_info.json"   # an earlier export's: not this run's
    record.parent.mkdir(parents=True)
    record.write_text("{}")
    assert launch_main(["study=browsecomp_worker_export", "checkpoint=ckpt", f"tokenizer={tokenizer}",
                        f"python.sft={python}"]) == 1
    assert "sft.export exited 0 but did not write" in capfd.readouterr().err


def test_a_slurm_export_job_that_exits_0_without_writing_its_completion_record_fails(tmp_path, capfd, monkeypatch):
    """Issue 62, "a Slurm submission is not a job's completion": the export stage's job, run as Slurm would run
    it, whose interpreter's `-m sft.export` exits 0 having written nothing (it ended COMPLETED), or leaves only
    an earlier export's export_info.json (not this job's), exits 1 naming the record, and its FAILED record in
    the study's ledger says why."""
    import json
    import os
    import subprocess
    from pathlib import Path

    python = tmp_path / "env" / "python"   # a Python, except that its `-m sft.export` does nothing
    python.parent.mkdir()
    python.write_text(f'#!/bin/sh\n[ "$2" = "sft.export" ] && exit 0\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    bin_dir, submitted = tmp_path / "bin", tmp_path / "submitted.txt"   # sbatch: records the script, answers 5001
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\nfor last; do :; done\necho "$last" >> {submitted}\necho 5001\n')
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    tokenizer = Path(__file__).resolve().parents[1] / "common" / "tiny_tokenizer"
    assert launch_main(["study=browsecomp_worker_export", "checkpoint=ckpt", f"tokenizer={tokenizer}",
                        f"python.sft={python}", "launcher=slurm"]) == 0   # submitted: not yet done
    capfd.readouterr()
    script = Path(submitted.read_text().split()[0])
    record, failed = Path("exports/browsecomp_worker/export_info.json"), script.parent / "export.FAILED"

    def job():
        return subprocess.run(["bash", str(script)], env=dict(os.environ, SLURM_JOB_ID="5001"), capture_output=True,
                              text=True, timeout=120)

    proc = job()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"exited 0 but wrote no {record} (its completion record)" in proc.stderr
    rec = json.loads(failed.read_text())
    assert rec["state"] == "failed" and rec["job"] == "5001" and str(record) in rec["reason"]
    record.parent.mkdir(parents=True)   # an earlier export's record, there before the job: not this job's
    record.write_text("{}")
    proc = job()
    assert proc.returncode == 1 and f"exited 0 but did not write {record}" in proc.stderr, proc.stderr


def test_a_study_whose_report_stage_finds_a_failed_evaluation_exits_with_analyzes_4(tmp_path, capfd, monkeypatch):
    """Issue 62, "a study's report stage carries the code to the study's exit": a study whose one stage is an
    analysis in which the evaluation fails (backend=vllm where vLLM is missing) ends with analyze's 4, the stage
    named, never "all stages done"."""
    if interpreter.missing_modules(sys.executable, ("vllm",)) == ():
        pytest.skip("vLLM is installed here: backend=vllm would not fail")
    study = tmp_path / "verdict.yaml"
    study.write_text("study: verdict\ntitle: a report stage alone\nhardware: {gpus: 0, gpu: none}\n"
                     "vars: {runs_root: null}\nstages:\n  - name: report\n    run: analyze\n    args:\n"
                     "      runs_root: ${vars.runs_root}   # [chosen: the runs under test]\n"
                     "notes: [Nothing of a reference is reproduced; this study checks the exit status.]\n")
    argv = _tiny_study(tmp_path)
    monkeypatch.chdir(tmp_path)
    # the study's preflight asks this interpreter for vllm in a subprocess: a stand-in package it finds there (never
    # in this process, which evaluates), so the evaluation itself is what fails
    from tests.plan_capture import gpu_env_stand_in

    gpu_env_stand_in(tmp_path, monkeypatch)
    assert launch_main([f"study={study}", argv[0], *[f"report:{t}" for t in argv[1:]], "report:eval.backend=vllm"]) == 4
    err = capfd.readouterr().err
    assert "study verdict: stage report failed (exit 4)" in err and "all stages done" not in err
    assert (tmp_path / "rep" / "report.md").read_text().startswith("# Transfer-curve report: PARTIAL: ")


def test_a_checked_job_passes_its_commands_failure_on_and_a_requeued_one_starts_without_the_old_record(tmp_path):
    """launch.completion on its own: a command that fails keeps its code, with a FAILED record saying so; one that
    writes its record exits 0, the FAILED an earlier run of the job left removed (a requeued job is not failed)."""
    import json

    import signal

    from launch.completion import FORWARDED
    from launch.completion import main

    record, failed = tmp_path / "out" / "export_info.json", tmp_path / "export.FAILED"

    def checked(argv: list[str]) -> int:   # RECORD FAILED -- COMMAND...: its CHECK.json, run as a job runs it
        if argv[2:3] != ["--"]:
            return main(argv)
        (tmp_path / "check.json").write_text(json.dumps({"record": argv[0], "failed": argv[1], "command": argv[3:]}))
        return main([str(tmp_path / "check.json")])

    before = {sig: signal.getsignal(sig) for sig in FORWARDED}
    assert checked([str(record), str(failed), "--", sys.executable, "-c", "import sys; sys.exit(3)"]) == 3
    # its signal forwarding ends with its command: a caller (a process that forks workers later) keeps its own
    assert {sig: signal.getsignal(sig) for sig in FORWARDED} == before
    assert json.loads(failed.read_text())["reason"].endswith("exited with code 3")
    write = f"import pathlib; p = pathlib.Path({str(record)!r}); p.parent.mkdir(); p.write_text('{{}}')"
    assert checked([str(record), str(failed), "--", sys.executable, "-c", write]) == 0 and not failed.exists()
    assert checked([str(record), str(failed), sys.executable]) == 2   # no `--`: a usage error, nothing run
    (tmp_path / "torn.json").write_text('{"record": "x"}')   # a config that is not one, or none: one line, exit 2
    assert main([str(tmp_path / "torn.json")]) == 2 and main([str(tmp_path / "none.json")]) == 2
    for command, failed_at in (([], failed), ([5], failed), ("true", failed), (["true"], tmp_path)):   # nothing run
        (tmp_path / "torn.json").write_text(json.dumps({"record": str(record), "failed": str(failed_at), "command": command}))
        assert main([str(tmp_path / "torn.json")]) == 2
