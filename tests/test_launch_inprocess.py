"""Stages called in-process by sweeps and studies (launch/local.py run_main / run_child): the same exit status and messages,
nothing left behind for the next stage; a stage whose interpreter is another stays a child process."""
from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from common.cli import ConfigError, run_cli
from launch import local, run, sweep


def _messy_stage(tmp_path: Path, code):
    """A stage's main that leaves state behind: an env var, another cwd, a root logging handler and level."""
    made = {}

    def main(argv: list[str]) -> int:
        made["argv"] = argv
        os.environ["DTSFT_TEST_LEAK"] = "1"
        os.environ.pop("DTSFT_TEST_KEEP", None)
        os.chdir(tmp_path)
        made["handler"] = logging.FileHandler(tmp_path / "stage.log")
        logging.getLogger().addHandler(made["handler"])
        logging.getLogger().setLevel(logging.DEBUG)
        logging.getLogger("dtsft.test.stage").addHandler(logging.NullHandler())
        print("stage output")
        if isinstance(code, BaseException):
            raise code
        return code

    return main, made


@pytest.mark.parametrize("code, status", [(0, 0), (3, 3), (SystemExit(2), 2), (SystemExit(None), 0),
                                          (SystemExit("bad thing"), 1), (RuntimeError("boom"), 1)])
def test_a_stage_in_process_leaves_nothing_behind_and_keeps_its_status(tmp_path, monkeypatch, capsys, code, status):
    monkeypatch.setenv("DTSFT_TEST_KEEP", "kept")
    cwd, root = os.getcwd(), logging.getLogger()
    handlers, level = list(root.handlers), root.level
    main, made = _messy_stage(tmp_path, code)
    assert local.run_main(main, ["a=1"], env=dict(os.environ, DTSFT_STUDY_TEST="x")) == status
    assert made["argv"] == ["a=1"]
    assert "DTSFT_TEST_LEAK" not in os.environ and os.environ["DTSFT_TEST_KEEP"] == "kept"
    assert "DTSFT_STUDY_TEST" not in os.environ
    assert os.getcwd() == cwd
    assert root.handlers == handlers and root.level == level and made["handler"].stream is None   # closed
    assert logging.getLogger("dtsft.test.stage").handlers == []
    out, err = capsys.readouterr()
    assert "stage output" in out
    assert ("bad thing" in err) == (status == 1 and isinstance(code, SystemExit))
    assert ("RuntimeError: boom" in err) == isinstance(code, RuntimeError)


def test_a_refusal_in_process_is_the_same_one_line_and_exit_2(capsys):
    def refuses(argv):
        raise ConfigError("eval.nn: not a key of evaluate (did you mean eval.n?)")

    assert local.run_main(lambda argv: run_cli(refuses, argv), []) == 2
    assert capsys.readouterr().err == "error: eval.nn: not a key of evaluate (did you mean eval.n?)\n"


def test_a_study_job_in_another_interpreter_stays_a_child_process(tmp_path, monkeypatch):
    """A study's local runner (launch/study.py, launch.run.start_training): a training stage's job runs its runs as launch does, any other job
    in this process when its interpreter is this one, else as a child; the first failure stops the plan."""
    from launch.jobs import Job, JobFailed

    calls = []
    monkeypatch.setattr(local, "run_child", lambda cmd, env=None: calls.append(("child", cmd)) or 0)
    monkeypatch.setattr(local, "run_main", lambda main, argv, env=None: calls.append(("here", argv)) or 0)
    monkeypatch.setattr(run, "train_runs", lambda trainer, runs: runs())   # a training stage's runs: a stand-in
    other = str(tmp_path / "eval-env" / "bin" / "python")
    plan = [Job("train", "sft.train", config="c.yaml"),
            Job("report", "launch.analyze", config="r.yaml", python=other, after=("train",)),
            Job("export", "launch.completion", config="e.json", after=("report",))]
    runner = local.LocalRunner(env=dict(os.environ))
    start = run.start_training(runner, {"train": (None, lambda: calls.append(("train",)) or 0)})
    assert list(runner.run(plan, tmp_path / "a", start=start)) == ["train", "report", "export"]
    assert calls == [("train",), ("child", [other, "-m", "launch.analyze", "r.yaml"]), ("here", ["e.json"])]
    calls.clear()
    with pytest.raises(JobFailed) as failed:
        runner.run(plan, tmp_path / "b", start=run.start_training(runner, {"train": (None, lambda: 3)}))
    assert (failed.value.job, failed.value.status) == ("train", 3) and calls == []


def test_the_sweeps_analysis_runs_in_process_unless_its_interpreter_is_another(tmp_path, monkeypatch):
    """The sweep's analysis is one Job, `python -m launch.analyze <dir>/analyze.yaml` (its config resolved once and
    written): LocalRunner runs it in this process, or as a child in python.eval=, and returns its exit status."""
    from omegaconf import OmegaConf

    from launch.analyze import parse_argv

    calls = []
    monkeypatch.setattr(local, "run_child", lambda cmd, env=None: calls.append(("child", cmd)) or 5)
    monkeypatch.setattr(local, "run_main", lambda main, argv, env=None: calls.append(("here", argv)) or 0)
    other = str(tmp_path / "python")
    status = []
    for name, extra in (("a", []), ("b", [f"python.eval={other}"])):
        cfg = parse_argv(["runs_root=runs", "profile=rl_ood", *extra])
        status.append(sweep._analyze_here(cfg, tmp_path / name))
        assert OmegaConf.load(tmp_path / name / "analyze.yaml") == cfg   # the config as resolved, once
    assert status == [0, 5]
    assert calls == [("here", [str(tmp_path / "a" / "analyze.yaml")]),
                     ("child", [other, "-m", "launch.analyze", str(tmp_path / "b" / "analyze.yaml")])]
