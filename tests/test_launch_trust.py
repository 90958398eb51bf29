"""Issue 23 (Trust III), the launch side: one path rule, input files by content, the GRPO launch
schema (launch refuses what the trainer would, before a run dir exists), a dead retriever, the
start checkpoint never a hard link, user recipes that cannot silently override, GRPO's own help,
and the trainer's teardown (no process group, no helper thread alive when it returns).

Every command runs from a scratch directory outside the repository (`W`), as a user would."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from common.cli import ConfigError

ROOT = Path(__file__).resolve().parents[1]
TINY_BASE = ROOT / "common" / "tiny_base"
QA_ROW = {"id": "q{}", "question": "Who wrote question {}?", "golden_answers": ["author {}"]}


def _qa_file(path: Path, n: int = 3, tag: str = "") -> Path:
    rows = [{k: (v.format(i) if isinstance(v, str) else [a.format(i) + tag for a in v]) for k, v in QA_ROW.items()}
            for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _corpus(path: Path) -> Path:
    path.write_text("".join(json.dumps({"id": str(i), "contents": f"\"Doc {i}\"\nauthor {i} wrote it"}) + "\n"
                            for i in range(3)))
    return path


@pytest.fixture
def W(tmp_path, monkeypatch):
    """A scratch working directory outside the repository, with the user's own files in it."""
    w = tmp_path / "W"
    w.mkdir()
    monkeypatch.chdir(w)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    _qa_file(w / "q.jsonl")
    _corpus(w / "c.jsonl")
    (w / "mymodel").mkdir()
    (w / "st").mkdir()   # a complete state (the resume rule: COMPLETE and meta.json)
    (w / "st" / "COMPLETE").touch()
    (w / "st" / "meta.json").write_text("{}")
    return w


QA = ["task=qa", "model=tiny_base", "steps=1", "runs_root=RQ", "grpo.prompts_file=q.jsonl", "grpo.corpus=c.jsonl"]


# ---------------------------------------------------------------- 1. one path rule
def test_grpo_user_paths_resolve_against_the_callers_directory(W):
    from launch.compose import compose_grpo
    from launch.grpo import GRPO, start_record

    cfg = compose_grpo([*QA, "model.path=mymodel", "resume=st", "name=v"]).cfg
    assert cfg.grpo.prompts_file == str(W / "q.jsonl") and cfg.grpo.corpus == str(W / "c.jsonl")
    assert cfg.model.path == str(W / "mymodel") and cfg.resume == str(W / "st")
    prep = GRPO.resolve([*QA, "model.path=mymodel"])
    assert prep.cfg.runs_root == str(W / "RQ") and start_record(prep.cfg)["start_model"] == str(W / "mymodel")
    # the embedded model and a hub id stay names
    assert compose_grpo(QA).cfg.model.path == "tiny_base"
    assert compose_grpo([*QA, "model.path=Qwen/Qwen3-4B"]).cfg.model.path == "Qwen/Qwen3-4B"


def test_grpo_user_recipe_paths_resolve_against_the_callers_directory(W):
    from launch.compose import compose_grpo

    (W / "sub").mkdir()
    (W / "sub" / "my.yaml").write_text("grpo:\n  prompts_file: q.jsonl\n  temperature: 0.7\n")
    cfg = compose_grpo([*QA[:4], "grpo.corpus=c.jsonl", "recipe=sub/my.yaml"]).cfg   # 13: recipe= with stage=grpo
    assert cfg.grpo.prompts_file == str(W / "q.jsonl") and cfg.grpo.temperature == 0.7


def test_sft_paths_user_against_cwd_shipped_against_the_repo(W):
    from launch.compose import compose

    cfg = compose(["arm=r2e", "model=tiny", "data=hub", "model.path=mymodel", "resume=st",
                   "data.sources.code=[r2e-gym:c.jsonl]"]).cfg
    assert cfg.model.path == str(W / "mymodel") and cfg.resume == str(W / "st")
    assert list(cfg.data.sources.code) == [f"r2e-gym:{W / 'c.jsonl'}"]
    # data=hub names its decontamination sets (no path); a path a shipped recipe sets is the repository's
    assert cfg.data.decontam_bench_root is None and "nq:seed42_1000" in cfg.data.decontam_sets
    from omegaconf import OmegaConf

    from sft.config import SFT
    from launch.paths import make_absolute

    shipped = OmegaConf.create({"data": {"decontam_bench_root": "../elsewhere/benchmarks"}})
    make_absolute(shipped, {"data.decontam_bench_root": SFT["data.decontam_bench_root"]},
                  {"data.decontam_bench_root": "recipes/data/some.yaml"})
    assert shipped.data.decontam_bench_root == os.path.normpath(ROOT / ".." / "elsewhere" / "benchmarks")
    assert cfg.model.tokenizer == "tiny"
    assert compose(["arm=r2e", "model=tiny", "data=hub", "data.decontam_bench_root=bench"]).cfg.data.decontam_bench_root \
        == str(W / "bench")


# ---------------------------------------------------------------- 2. input files by content
def test_grpo_qa_relaunch_on_a_changed_prompts_file_or_corpus_is_refused(W, monkeypatch):
    from common import io as cio
    from launch import grpo as rlaunch
    from rl.config import run_identity

    prep = rlaunch.GRPO.resolve(QA)
    assert set(prep.identity["inputs"]) == {"grpo.prompts_file", "grpo.corpus"}
    assert run_identity(prep.cfg) == prep.identity   # the trainer computes the same identity
    prep.run_dir.mkdir(parents=True)
    (prep.run_dir / "manifest.json").write_text(json.dumps({"identity": prep.identity}))
    calls = []
    real = cio.sha256_file
    monkeypatch.setattr(cio, "sha256_file", lambda p, *a: calls.append(p) or real(p, *a))
    rlaunch.GRPO.resolve(QA)   # same content: same run
    assert calls == []    # digests cached by (path, size, mtime): nothing hashed again
    _qa_file(W / "q.jsonl", tag=" (NQ)")
    with pytest.raises(ConfigError, match="different configuration.*\n.*inputs"):
        rlaunch.GRPO.resolve(QA)
    _qa_file(W / "q.jsonl")
    rlaunch.GRPO.resolve(QA)
    _corpus(W / "c.jsonl").write_text((W / "c.jsonl").read_text() + json.dumps({"id": "9", "contents": "x"}) + "\n")
    with pytest.raises(ConfigError, match="different configuration"):
        rlaunch.GRPO.resolve(QA)
    # a run dir trained under other reward rules (rl.envs.REWARD_SEMANTICS; none recorded: older still) is refused
    from launch.compose import compose
    from rl.envs import REWARD_SEMANTICS

    now = rlaunch.GRPO.resolve([*QA, "resume=never"]).identity
    for old, shown in ((REWARD_SEMANTICS - 1, REWARD_SEMANTICS - 1), (None, "'<absent>'")):
        rec = {k: v for k, v in now.items() if k != "reward_semantics"} | ({"reward_semantics": old} if old else {})
        (prep.run_dir / "manifest.json").write_text(json.dumps({"identity": rec}))
        with pytest.raises(ConfigError, match=rf"different configuration; the code changed what this config means \(rl.envs.REWARD_SEMANTICS\)"
                                              rf".*\n  reward_semantics: {shown} -> {REWARD_SEMANTICS}\n"):
            rlaunch.GRPO.resolve(QA)
    assert rlaunch.GRPO.resolve([*QA, "resume=never"]).identity == now   # starting over (renamed aside) is allowed
    assert "reward_semantics" not in rlaunch.run.requested_identity(compose(["arm=r2e", "model=tiny"]).cfg)   # SFT's: unchanged


def test_user_recipe_digest_in_the_manifest(W):
    from launch.manifest import write_manifest

    (W / "my.yaml").write_text("train:\n  lr: 3.0e-4\n")
    man = write_manifest(W / "rd", argv=[], choices={"arm": "r2e", "recipe": str(W / "my.yaml")}, launcher={}, data={})
    from common.fingerprint import file_digest

    assert man["recipes"]["recipe_sha256"] == file_digest(W / "my.yaml")
    assert man["launches"][0]["recipe_sha256"] == file_digest(W / "my.yaml")


# ---------------------------------------------------------------- 6. step-000000 is a copy
def test_start_checkpoint_never_writes_through_to_the_users_model(tmp_path):
    from rl.checkpoint import write_start_checkpoint

    src = tmp_path / "srcmodel"
    shutil.copytree(TINY_BASE, src)
    before = (src / "model.safetensors").read_bytes()
    out = tmp_path / "run" / "checkpoints" / "step-000000"
    write_start_checkpoint(str(src), out)
    with open(out / "model.safetensors", "r+b") as f:   # what `cp other.safetensors <run>/...` does: write in place
        f.write(b"\0" * 64)
    assert (src / "model.safetensors").read_bytes() == before
    assert not (out / "model.safetensors").samefile(src / "model.safetensors")


# ---------------------------------------------------------------- 7. one schema for launch and trainer
@pytest.mark.parametrize("bad,needle", [
    ("train.betas=[0.9]", "train.betas"), ("train.eps=abc", "train.eps"), ("train.weight_decay=abc", "train.weight_decay"),
    ("train.grad_clip=abc", "train.grad_clip"), ("grpo.loss_type=foo", "grpo.loss_type"),
    ("grpo.vllm_gpu_memory_utilization=abc", "grpo.vllm_gpu_memory_utilization"), ("resume=/nonexistent", "resume"),
    ("seed=true", "seed"), ("grpo.prompts_file=nope.jsonl", "nope.jsonl"), ("grpo.grad_accum=3", "grpo.grad_accum"),
    # tiny_base's context is 8192 tokens (its config.json): no room left for a prompt
    ("grpo.max_completion_length=8192", "grpo.max_completion_length=8192 leaves no room for a prompt in model.path=tiny_base's context"),
    # room for a completion, but not for the prompt too (its tokens: tests/test_rl_units.py checks the count)
    ("grpo.max_completion_length=8000", "grpo.max_completion_length=8000 + the longest prompt's "),
    ("grpo.enable_thinking=false", "grpo.enable_thinking=false: the chat template of tiny_base does not read enable_thinking"),
])
def test_launch_refuses_what_the_trainer_would_before_a_run_dir(W, capsys, bad, needle):
    from launch.grpo import main

    argv = [*QA, bad] + (["nproc=3"] if "grad_accum" in bad else [])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and needle in err and "Traceback" not in err, err
    assert not (W / "RQ").exists()
    if bad.startswith(("grpo.max_completion_length", "grpo.enable_thinking")):   # the model's checks: a dry run's too
        assert main([*argv, "dry_run=true"]) == 2 and needle in capsys.readouterr().err


@pytest.mark.parametrize("key,value,needle", [
    ("train.eps", "abc", "train.eps"), ("train.betas", [0.9], "train.betas"), ("grpo.loss_type", "foo", "grpo.loss_type"),
    ("seed", True, "seed"),
])
def test_trainer_refuses_a_hand_edited_config_in_one_line_and_records_it(W, capsys, key, value, needle):
    from launch.run import report_end
    from rl import train as rt
    from launch.grpo import GRPO

    cfg = GRPO.resolve(QA).cfg
    OmegaConf.update(cfg, key, value, merge=False)
    rd = Path(cfg.run_dir)
    rd.mkdir(parents=True)
    OmegaConf.save(cfg, rd / "config.yaml")
    assert rt.main([str(rd / "config.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and needle in err
    # launch reports the trainer's refusal as one line with the trainer's exit code (torchrun says 1)
    assert report_end(rd, 1, rd / "logs" / "x.log") == 2
    out = capsys.readouterr()
    assert needle in out.err and "re-run" not in out.out


def test_a_refusal_is_reported_only_by_the_launch_whose_trainer_recorded_it(tmp_path, capsys, monkeypatch):
    # A second trainer refused on the run dir (e.g. "in use by another trainer") records its refusal
    # there too; the launch that holds the run (another id, or a trainer that stopped cleanly) must not take it.
    from common import layout
    from launch.run import report_end

    rd = tmp_path / "rd"
    (rd / "config.yaml").parent.mkdir(parents=True)
    (rd / "config.yaml").write_text(f"run_dir: {rd}\n")
    monkeypatch.setenv(layout.LAUNCH_ID_ENV, "other")
    layout.record_refusal(rd / "config.yaml", 2, "in use by another trainer")
    assert report_end(rd, 1, rd / "x.log", "mine") == 1
    assert report_end(rd, 0, rd / "x.log", "other") == 0
    assert "in use" not in capsys.readouterr().err
    assert report_end(rd, 1, rd / "x.log", "other") == 2
    assert "in use by another trainer" in capsys.readouterr().err


def test_re_run_to_resume_only_when_a_state_exists(tmp_path, capsys):
    from launch.run import report_end

    rd = tmp_path / "rd"
    rd.mkdir()
    assert report_end(rd, 1, rd / "x.log") == 1
    assert "re-run" not in capsys.readouterr().out
    (rd / "state" / "step-000001").mkdir(parents=True)
    (rd / "state" / "step-000001" / "COMPLETE").write_text("")
    (rd / "state" / "step-000001" / "meta.json").write_text("{}")
    report_end(rd, 0, rd / "x.log")
    assert "re-run the same command to resume" in capsys.readouterr().out


@pytest.mark.parametrize("what", ["rollouts_file", "start_without_sums"])
def test_run_dir_oddities_are_one_line_errors(W, capsys, what):
    from rl import train as rt
    from launch.grpo import GRPO

    cfg = GRPO.resolve([*QA[1:4], "task=spa", "grpo.pilot_tasks=3"]).cfg
    rd = Path(cfg.run_dir)
    (rd / "checkpoints").mkdir(parents=True)
    if what == "rollouts_file":
        (rd / "rollouts").write_text("not a dir")
    else:
        (rd / "checkpoints" / "step-000000").mkdir()
        (rd / "checkpoints" / "step-000000" / "model.safetensors").write_text("x")
    OmegaConf.save(cfg, rd / "config.yaml")
    assert rt.main([str(rd / "config.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and ("rollouts" in err if what == "rollouts_file" else "SHA256SUMS" in err), err


# ---------------------------------------------------------------- 5. retriever
def test_dead_retriever_is_a_start_up_error(W, capsys):
    from launch.grpo import main

    argv = [*QA[:5], "grpo.retriever=http", "grpo.retriever_url=http://127.0.0.1:9/retrieve",
            "grpo.retriever_retries=0", "grpo.retriever_timeout=2"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "does not answer at start" in err and "Traceback" not in err
    assert not (W / "RQ").exists()


def test_failed_searches_are_counted_and_stop_the_run_above_the_rate():
    from evals.retrievers import RetrieverError
    from rl.train import CountingRetriever, SearchFailureError, check_search_failures

    class Flaky:
        n = 0

        def search(self, queries, topk):
            self.n += 1
            if self.n % 4 == 0:
                raise RetrieverError("retriever http://x unreachable after 4 attempts")
            return [[{"id": "1", "contents": "t\nx", "score": 1.0}]]

    r = CountingRetriever(Flaky())
    for _ in range(8):
        try:
            r.search(["q"], 1)
        except RetrieverError:
            pass
    searches, failures, last = r.take()
    assert (searches, failures) == (8, 2) and "unreachable" in last and r.take()[:2] == (0, 0)
    check_search_failures(3, searches, failures, 0.25, last)   # 25% is not above 25%
    with pytest.raises(SearchFailureError, match=r"step 3: 2 of 8 searches failed .*max_search_failure_rate=0.1"):
        check_search_failures(3, searches, failures, 0.1, last)


# ---------------------------------------------------------------- 8. user recipes
@pytest.mark.parametrize("text,needle", [
    ("arm: search\n", "sets arm"),
    ("_launch:\n  data_arm: search\n", "`_launch` is internal"),
    ("train:\n  lr: ${nope.x}\n", "bad interpolation"),
])
def test_user_recipe_cannot_override_silently(W, capsys, text, needle):
    from launch.cli import main

    (W / "arm.yaml").write_text(text)
    assert main(["arm=r2e", "model=tiny", "data=synthetic", "recipe=arm.yaml", "dry_run=true", "runs_root=R"]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_unknown_internal_launch_key_is_an_error(tmp_path, monkeypatch):
    from launch.compose import compose

    recipes = tmp_path / "recipes"
    shutil.copytree(ROOT / "recipes", recipes)
    (recipes / "arm" / "r2e_v5.yaml").write_text((recipes / "arm" / "r2e_v5.yaml").read_text()
                                                 .replace("data_arm:", "data_armm:"))
    monkeypatch.setattr("launch.compose.RECIPES", recipes)   # the recipes every layer is read from
    with pytest.raises(ConfigError, match=r"_launch.data_armm.*Did you mean: data_arm"):
        compose(["arm=r2e_v5", "model=tiny", "data=synthetic"])


def test_grpo_user_recipe_cannot_set_task(W):
    from launch.compose import compose_grpo

    (W / "t.yaml").write_text("task: qa\n")
    with pytest.raises(ConfigError, match="sets task"):
        compose_grpo(["task=spa", "model=tiny_base", "recipe=t.yaml"])


# ---------------------------------------------------------------- 13. help
def test_grpo_help_shows_grpo_keys(capfd):
    from launch.cli import main

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-m", "launch.grpo", "--help"], cwd="/", env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "grpo.loss_type=dapo " in out.stdout and "train.steps=250 " in out.stdout
    assert "lora.r=32 " in out.stdout and "train.epochs" not in out.stdout and "data.n" not in out.stdout
    capfd.readouterr()
    assert main(["stage=grpo", "--help"]) == 0   # launch hands --help to launch.grpo
    shown = capfd.readouterr().out
    assert "grpo.max_search_failure_rate=0.1 " in shown and "state_every 25" not in shown


# ---------------------------------------------------------------- + the clean exit
TEARDOWN = r"""
import json, os, sys, threading
import torch.distributed as dist
from omegaconf import OmegaConf
from rl import train as rt
from launch.compose import compose_grpo
from common.schema import run_dir

cfg = compose_grpo(["task=spa", "model=tiny_base", "steps=1", f"runs_root={sys.argv[1]}", "grpo.max_completion_length=16",
                    "grpo.pilot_tasks=3"]).cfg
cfg.run_dir = str(run_dir(cfg))
os.makedirs(cfg.run_dir, exist_ok=True)
OmegaConf.save(cfg, os.path.join(cfg.run_dir, "config.yaml"))
seen = {}
step_end = rt.Run.step_end
def spy(self, local_step):
    seen["group_during"] = dist.is_initialized()
    return step_end(self, local_step)
rt.Run.step_end = spy
rc = rt.main([os.path.join(cfg.run_dir, "config.yaml")])
alive = [t.name for t in threading.enumerate() if t is not threading.main_thread() and t.is_alive()]
print("RESULT " + json.dumps({"rc": rc, "during": seen.get("group_during"), "after": dist.is_initialized(), "threads": alive}))
"""


def test_trainer_returns_with_no_process_group_and_no_helper_thread(tmp_path):
    """The cause of rank 0's "terminate called without an active exception" at exit: the gloo process
    group (and its C++ threads) still alive at interpreter exit. The trainer destroys it before it returns."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", WANDB_MODE="offline", HF_HUB_OFFLINE="1",
               TRL_EXPERIMENTAL_SILENCE="1", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29000 + os.getpid() % 1000), XDG_CACHE_HOME=str(tmp_path / "c"))
    out = subprocess.run([sys.executable, "-c", TEARDOWN, str(tmp_path / "R")], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.split("RESULT ", 1)[1])
    assert res["rc"] == 0 and res["during"] is True   # the trainer did run under a process group
    assert res["after"] is False, res
    assert res["threads"] == [], res
