"""TRL 1.9.2, the search_plan_act references' release (`grpo.trl`, docs/stages/grpo.md): the environment
`make venv-trl` builds holds it beside the project; the GRPO tests pass under it; a run pinned to a release
is refused by the trainer and by launch wherever the interpreter holds another; the pin is in the two
search_plan_act studies and their dry runs."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

TRL_REF = "1.9.2"
TRL_PY = ROOT / f".venv-trl{TRL_REF}" / "bin" / "python"


def _trl_python():
    if not TRL_PY.exists():
        pytest.skip(f"needs {TRL_PY.parent.parent.name} (`make venv-trl`; `make test` builds it)")
    return TRL_PY


def _env():
    return dict(os.environ, PYTHONPATH=str(ROOT), WANDB_MODE="disabled", TRL_EXPERIMENTAL_SILENCE="1")


def test_the_reference_environment_holds_trl_1_9_2_and_the_project():
    ask = ("import importlib.metadata as m, importlib.util as u\n"
           "print(m.version('trl'), u.find_spec('trl').origin, *(bool(u.find_spec(x)) for x in ('peft', 'rl.train')))")
    proc = subprocess.run([str(_trl_python()), "-c", ask], cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    version, path, *found = proc.stdout.split()
    assert version == TRL_REF and str(TRL_PY.parent.parent) in path   # its own copy, not .venv's 1.16
    assert found == ["True", "True"]   # and .venv's packages and the project beside it


@pytest.mark.slow
def test_the_grpo_loop_tests_pass_under_trl_1_9_2():
    """tests/test_rl_train.py's scripted-policy run (TRL's real tool loop, reward, loss and LoRA update, SIGTERM
    during step 1, resume; not the two-rank launch) and the tools / reward / template tests of
    tests/test_rl_units.py, all in the 1.9.2 environment (HF generation). The parser's own test calls TRL 1.16's
    `parse_response(..., tools=)`, which 1.9.2 does not have; 1.9.2's call goes through the loop above."""
    tests = ["tests/test_rl_train.py", "-k", "not two_cpu_ranks",
             "tests/test_rl_units.py::test_trainer_exposes_the_five_tools_and_env_reward",
             "tests/test_rl_units.py::test_trl_refuses_the_own_template_and_accepts_the_training_one"]
    proc = subprocess.run([str(_trl_python()), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *tests],
                          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900)
    tail = proc.stdout[-4000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    assert " passed" in tail and " failed" not in tail and "skipped" not in tail, tail


def _cfg(tmp_path, *over):
    from launch.compose import compose_grpo
    from common.schema import run_dir

    cfg = compose_grpo(["task=spa", "model=tiny_base", "steps=1", f"runs_root={tmp_path}", *over]).cfg
    cfg.run_dir = str(run_dir(cfg))
    return cfg


def test_the_trl_key_is_a_release_and_enters_the_identity_only_when_set(tmp_path):
    from common import fingerprint
    from rl.config import EXCLUDED_KEYS, problems
    from rl.errors import RlError

    assert not problems(_cfg(tmp_path, "grpo.trl=1.9.2"))
    with pytest.raises(RlError, match=r"grpo.trl must be null or a trl release such as 1.9.2 .*, got 1.16$"):
        _cfg(tmp_path, "grpo.trl=1.16")
    unset, pinned = _cfg(tmp_path), _cfg(tmp_path, "grpo.trl=1.9.2")
    old = fingerprint._plain(unset)
    old["grpo"].pop("trl")   # a config.yaml written before the key
    fp = {name: fingerprint.identity(c, EXCLUDED_KEYS)["fingerprint"] for name, c in (("old", old), ("unset", unset), ("pinned", pinned))}
    assert fp["old"] == fp["unset"] != fp["pinned"]


def test_a_run_pinned_to_another_trl_is_refused_before_it_writes_anything(tmp_path):
    from rl import train as rt
    from common.interpreter import installed_trl
    from rl.errors import RlError

    cfg = _cfg(tmp_path / "runs", "grpo.trl=0.0.1")
    with pytest.raises(RlError) as err:
        rt.run(cfg)
    msg = str(err.value)
    assert msg.startswith(f"grpo.trl=0.0.1: {sys.executable} has trl {installed_trl()};") and "make venv-trl" in msg
    assert "\n" not in msg and not (tmp_path / "runs").exists()


def test_vllm_on_cpu_is_refused_with_a_trl_that_lacks_the_weight_iterator(monkeypatch):
    from trl.generation.vllm_generation import VLLMGeneration

    from rl import vllm_cpu
    from rl.errors import RlError

    vllm_cpu.check_trl()   # the pinned 1.16 has it
    monkeypatch.delattr(VLLMGeneration, "_iter_named_params")
    with pytest.raises(RlError, match=r"lacks \(rl/vllm_cpu.py is written against trl 1.16\): grpo.use_vllm=false"):
        vllm_cpu.check_trl()


def _dry_run(tmp_path, python):
    return subprocess.run([sys.executable, "-m", "launch.cli", "stage=grpo", "task=spa", "model=tiny_base", "steps=1",
                           "grpo.trl=1.9.2", f"python.grpo={python}", "runs_root=runs", "dry_run=true"],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600)


def test_launch_asks_the_named_interpreter_for_the_pinned_trl(tmp_path):
    from common.interpreter import installed_trl

    refused = _dry_run(tmp_path, sys.executable)
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-2000:]
    assert f"python.grpo: grpo.trl=1.9.2: {sys.executable} has trl {installed_trl()};" in refused.stderr
    accepted = _dry_run(tmp_path, _trl_python())
    assert accepted.returncode == 0, accepted.stdout[-2000:] + accepted.stderr[-2000:]
    assert "  trl: 1.9.2\n" in accepted.stdout and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("name,ref", [("qwen3_4b_spa_grpo", "spa-qwen3"), ("llama3_1_8b_spa_grpo", "spa-llama")])
def test_both_search_plan_act_studies_pin_the_references_trl(name, ref, tmp_path, monkeypatch):
    from common.marks import file_marks
    from common.study import load_study

    study = load_study(name)
    assert study.stages[0].args["grpo.trl"] == TRL_REF
    marks = {s.key: s.marks for s in file_marks(study.path)[0]}
    mark = next(m for k, ms in marks.items() if k.endswith("grpo.trl") for m in ms)
    assert (mark.kind, mark.reference, mark.text) == ("ref", ref, "GRPO via TRL 1.9.2 + vLLM colocate generation")
    assert f"train:python.grpo=.venv-trl{TRL_REF}/bin/python" in study.cpu_smoke
    if name != "qwen3_4b_spa_grpo":   # one dry run shows it (the same stage and recipe)
        return
    from tests.plan_capture import gpu_env_stand_in, unpinned_stand_ins

    host = tmp_path / "host"   # the study's preflight asks for a GPU host: vllm, trl 1.9.2, the unpinned sets pre-filled
    monkeypatch.setenv("DTSFT_DATA", str(host / "data"))
    gpu_env_stand_in(host, monkeypatch)
    unpinned_stand_ins(host)
    proc = subprocess.run([sys.executable, "-m", "launch.cli", f"study={name}", "launcher=slurm", "dry_run=true"],
                          cwd=tmp_path, env=dict(_env(), PYTHONPATH=os.environ["PYTHONPATH"]), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    import re

    import yaml

    where = Path(re.findall(r"config and script is written under (\S+) \(nothing started", proc.stdout)[-1])
    train = yaml.safe_load((where / "train-0.config.yaml").read_text())   # the train stage's run, as resolved once
    assert str(train["grpo"]["trl"]) == TRL_REF
