"""launch: recipe composition, shortcuts, validation errors, --help, and the recipes themselves."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from common.cli import ConfigError
from launch.cli import help_text, main
from common.recipes import group_choices
from common.plan import planned
from common.schema import run_dir
from launch.compose import RECIPES, compose


def test_default_composition_is_the_study():
    c = compose([])
    cfg = c.cfg
    assert c.choices == {"arm": "r2e", "model": "qwen3_4b_thinking_2507", "data": "hub", "launcher": "local"}
    assert cfg.model.path == "Qwen/Qwen3-4B-Thinking-2507" and cfg.model.gpu_only is True
    assert [planned(cfg)[0], *planned(cfg)[1]] == [218, 50, 100, 150, 200, 218]   # 1 epoch of 3500 at 16 per step


@pytest.mark.parametrize("arm", ["search", "mixed"])
def test_search_and_mixed_train_two_epochs(arm):
    cfg = compose([f"arm={arm}"]).cfg
    assert cfg.arm == arm and [planned(cfg)[0], *planned(cfg)[1]] == [436, 50, 100, 150, 200, 218, 436]


def test_r2e_v5_is_r2e_data_without_epilogue():
    c = compose(["arm=r2e_v5"])
    assert c.cfg.arm == "r2e_v5" and c.data_arm == "r2e"
    assert c.cfg.data.epilogue is False and "_launch" not in c.cfg
    assert run_dir(c.cfg).parts[-2:] == ("r2e_v5", "seed0")
    assert compose(["arm=r2e"]).cfg.data.epilogue is True


def test_shortcuts_and_dotted_overrides(tmp_path):
    cfg = compose(["steps=7", "epochs=3", "seed=2", "n=64", "save_steps=[2,4]", "state_every=5", "lr=3e-4",
                   "nproc=2", f"runs_root={tmp_path}", "resume=never", "train.grad_clip=0.5",
                   "model.config.num_hidden_layers=2"]).cfg
    assert (cfg.train.steps, cfg.train.epochs, cfg.seed, cfg.data.n) == (7, 3, 2, 64)
    assert list(cfg.train.save_steps) == [2, 4] and cfg.train.state_every == 5 and cfg.train.lr == 3e-4
    assert cfg.launcher.nproc == 2 and cfg.resume == "never" and cfg.train.grad_clip == 0.5
    assert cfg.model.config.num_hidden_layers == 2
    assert run_dir(cfg) == (tmp_path / "r2e" / "seed2").resolve()


def test_tiny_recipe_matches_the_tiny_model():
    from common.tiny import TINY_CONFIG

    cfg = compose(["model=tiny", "data=synthetic"]).cfg
    assert cfg.model.path == "tiny" and cfg.model.tokenizer == "tiny" and cfg.model.init == "random"
    assert cfg.model.gpu_only is False and cfg.train.activation_checkpointing is False
    assert OmegaConf.to_container(cfg.model.config) == TINY_CONFIG
    assert cfg.data.kind == "synthetic" and cfg.data.max_seq_len <= cfg.train.max_tokens_per_micro_batch
    # The embedded default: 218 steps, exactly 5 checkpoints (no epoch boundary inside 218 steps).
    demo = compose(["arm=r2e", "steps=218", "model=tiny", "data=synthetic"]).cfg
    assert list(planned(demo)[1]) == [50, 100, 150, 200, 218]
    assert list(planned(compose(["steps=4"]).cfg)[1]) == [4]


def test_hub_recipe_names_the_real_datasets():
    src = compose(["data=hub", "arm=mixed"]).cfg.data.sources
    code, search = " ".join(src.code), " ".join(src.search)
    for ds in ("r2e-gym:R2E-Gym/R2EGym-SFT-Trajectories", "swe-gym:SWE-Gym/OpenHands-SFT-Trajectories",
               "swe-smith:SWE-bench/SWE-smith-trajectories#xml"):
        assert ds in code
    assert "openseeker:PolarSeeker/OpenSeeker-v1-Data" in search


def test_every_recipe_composes():
    for group in ("arm", "model", "data", "launcher"):
        for choice in group_choices(group):
            composed = compose([f"{group}={choice}"])
            assert composed.choices[group] == choice
            if group == "model":
                assert composed.cfg.model.name == choice


@pytest.mark.parametrize("argv, message", [
    (["stpes=3"], "unknown key 'stpes'. Did you mean: steps"),
    (["train.lrr=1"], "Did you mean: train.lr"),
    (["arm=foo"], "unknown arm 'foo'; choices: mixed, r2e, r2e_v5, search"),
    (["arm=../model/tiny"], "unknown arm '../model/tiny'"),   # seen failing: the model recipe composed as the arm's
    (["model=gpt5"], "unknown model 'gpt5'; choices: llama3_1_8b_instruct, qwen3_4b, qwen3_4b_thinking_2507, tiny, tiny_base"),
    (["steps=-1"], "train.steps must be a positive integer"),
    (["steps=abc"], "train.steps must be a positive integer"),
    (["seed=-2"], "seed must be a non-negative integer"),
    (["resume=''"], "resume must be auto, never or a complete state directory (<run>/state/step-NNNNNN), got ''"),   # was the state dir `.`
    (["resume=" + str(RECIPES)], "resume must be auto, never or a complete state"),   # seen failing: any dir passed, the trainer refused it
    (["nproc=0"], "launcher.nproc must be auto or a positive integer"),
    (["save_steps=[a]"], "train.save_steps must be a list of positive integers"),
    (["save_steps=[0]"], "train.save_steps must be a list of positive integers"), (["save_steps=[-5]"], "train.save_steps must be a list of"),
    # a save step the run never reaches (was dropped without a word): refused, by the horizon of train.steps or of the epochs over data.n
    (["steps=218", "save_steps=[50,500]"], "train.save_steps: 500 is past the run's last step 218 (train.steps=218): no checkpoint"),
    (["n=3500", "save_steps=[50,300,400]"], "train.save_steps: 300, 400 are past the run's last step 218 (train.epochs=1 x floor(data.n=3500 / "
                                            "train.global_batch_size=16) steps): no checkpoint would be written there"),
    (["lr=0"], "train.lr must be a positive number"),
    (["data.kind=web"], "data.kind must be one of hub, synthetic"), (["data=hb"], "(recipes in " + str(RECIPES / "data") + "). Did you mean: hub?"),
    (["train.lr_schedule=cosin"], "train.lr_schedule must be one of cosine, linear, constant"),
    (["launcher=local", "nodes=2"], "needs launcher=slurm"),
    (["train.max_tokens_per_micro_batch=16384"], "data.max_seq_len=32768 exceeds train.max_tokens_per_micro_batch=16384"),
    (["launcher=slurm", "resume=never"], "resume=never cannot be used with launcher=slurm"),
    (["data.sources.code=[r2e.jsonl]", "data.sources.search=5"], "data.sources.code must be a list of FORMAT:PATH_OR_HUB_ID"),
    (["steps"], "expected key=value"),
    (["python=5"], "python=5: python is a section: give python.KEY=VALUE (python.eval, python.grpo, python.sft)"),   # was a traceback
])
def test_bad_keys_and_values_fail_clearly(argv, message):
    with pytest.raises(ConfigError) as err:
        compose(argv)
    assert message in str(err.value)


def test_bad_values_are_all_listed_at_once():
    with pytest.raises(ConfigError) as err:
        compose(["steps=0", "lr=-1", "n=0"])
    text = str(err.value)
    assert "train.steps" in text and "train.lr" in text and "data.n" in text


@pytest.mark.parametrize("setup, lines", [("[]", ""), ("[module load cuda,source env/bin/activate]", "module load cuda\nsource env/bin/activate"),
                                          ("[ -f env ] && source env", "[ -f env ] && source env"),
                                          ("echo 'a' \\x", "echo 'a' \\x")])   # seen failing: a quote refused, \ doubled
def test_slurm_time_is_kept_verbatim(setup, lines):
    """launcher.setup as a list is its lines ([]: none); shell text stays verbatim, also handed on to analyze (a sweep's,
    a study's report) as its slurm.*. Seen failing before: `[]` was the line `[]`; two lines reached analyze as one."""
    from launch.analyze import parse_argv
    from launch.jobs import Cluster
    from sft.config import SFT

    cfg = compose(["launcher=slurm", "time=24:00:00", "partition=gpu", f"launcher.setup={setup}"]).cfg
    assert cfg.launcher.time == "24:00:00" and cfg.launcher.partition == "gpu"
    # launcher.time: what `sbatch --time` takes (man sbatch; checked by hand against sbatch 22.05), the rest refused
    assert [t for t in (None, "", 0, 90, "90", "5:30", "24:00:00", "2-12", "2-12:30", "2-12:30:05", "UNLIMITED", "infinite",
                        "x", "-1", -1, "1-2-3", "1:2:3:4", "5m", " 5", "2-", ":5", "1.5", True, [])
            if SFT["launcher.time"].must("launcher.time", t) is None] == [None, "", 0, 90, "90", "5:30", "24:00:00", "2-12",
                                                                          "2-12:30", "2-12:30:05", "UNLIMITED", "infinite"]
    assert (Cluster.of(cfg.launcher).setup or "") == lines
    assert Cluster.of(parse_argv(Cluster.of(cfg.launcher).tokens("slurm.")).slurm) == Cluster.of(cfg.launcher)
    # as analyze checks its slurm.setup (the omegaconf node itself; a ListConfig was refused)
    assert SFT["launcher.setup"].problem("slurm.setup", cfg.launcher.setup) is None


def test_recipe_with_unknown_key_names_the_file(tmp_path, monkeypatch):
    import shutil

    shutil.copytree(RECIPES, tmp_path / "recipes")
    (tmp_path / "recipes" / "arm" / "broken.yaml").write_text("train:\n  stepz: 3\n")
    monkeypatch.setattr("launch.compose.RECIPES", tmp_path / "recipes")   # the recipes every layer is read from
    with pytest.raises(ConfigError, match=r"recipes/arm/broken.yaml: key 'train.stepz'"):
        compose(["arm=broken"])


def test_cli_help_and_exit_codes(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for needle in ("arm=  mixed | r2e | r2e_v5 | search", "model=", "tiny", "data=  hub | synthetic",
                   "launcher=  local | slurm", "steps          -> train.steps", "train.lr=1e-05", "sweep"):
        assert needle in out
    assert help_text() in out
    assert main(["study=dual_terminator_sft", "--help"]) == 0   # a study's usage (seen failing: "found '--help'", exit 2)
    assert "launch study=NAME [VAR=value ...] [STAGE:key=value ...]" in capsys.readouterr().out
    assert main(["arm=r2e", "stpes=3"]) == 2
    assert "Did you mean: steps" in capsys.readouterr().err


def test_gpu_only_model_fails_before_data_prep_on_cpu(tmp_path, monkeypatch):
    from launch import run

    monkeypatch.setattr("launch.jobs.cuda_device_count", lambda: 0)
    called = []
    monkeypatch.setattr("data_prep.build.build_arm", lambda *a, **k: called.append(1))
    with pytest.raises(ConfigError, match="use model=tiny"):
        run.launch_one(run.SFT, ["arm=r2e", f"runs_root={tmp_path}"])
    assert not called and not (tmp_path / "r2e").exists()
