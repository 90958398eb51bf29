"""`launch recipe=my.yaml` (the user's own recipe on top of the shipped ones) and `launch show`."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from common.cli import flat_keys
from data_prep.readers import parse_source
from launch.cli import main
from launch.compose import compose

BASE = ["arm=r2e", "model=tiny", "data=synthetic"]


def _recipe(tmp_path, text):
    path = tmp_path / "my.yaml"
    path.write_text(text)
    return path


def test_user_recipe_sets_values_and_command_line_wins(tmp_path):
    path = _recipe(tmp_path, "train:\n  lr: 3.0e-4\n  warmup_ratio: 0.1\nlogging:\n  tags: [mine]\n")
    cfg = compose([*BASE, f"recipe={path}"]).cfg
    assert (cfg.train.lr, cfg.train.warmup_ratio, list(cfg.logging.tags)) == (3.0e-4, 0.1, ["mine"])
    assert compose(BASE).cfg.train.lr != 3.0e-4   # the file, not the default, set it
    assert compose([*BASE, f"recipe={path}", "lr=1e-3"]).cfg.train.lr == 1e-3


def test_user_recipe_dry_run_writes_its_values(tmp_path, capsys):
    path = _recipe(tmp_path, "train:\n  lr: 3.0e-4\n")
    assert main([*BASE, f"recipe={path}", "dry_run=true", f"runs_root={tmp_path / 'runs'}"]) == 0
    printed = capsys.readouterr().out.split("# command")[0]
    cfg = OmegaConf.create(printed[printed.index("arm:"):])
    assert cfg.train.lr == 3.0e-4


@pytest.mark.parametrize("text,needles", [
    ("train:\n  lrr: 3.0e-4\n", ["my.yaml", "'train.lrr'", "Did you mean: train.lr"]),
    ("trian:\n  lr: 3.0e-4\n", ["my.yaml", "'trian.lr'", "Did you mean: train.lr"]),
    ("train:\n  lr: -1\n", ["train.lr must be a positive number"]),
    ("- a\n- b\n", ["must be a YAML mapping"]),
    # a section given a value (seen failing: `data: []` an omegaconf TypeError, `python: 5` an AttributeError,
    # `train: 5` "train.global_batch_size: missing from the config")
    ("data: []\n", ["my.yaml: data must be a section of keys (data.KEY: value), got []"]),
    ("python: 5\n", ["my.yaml: python must be a section of keys (python.KEY: value), got 5"]),
    ("train: 5\n", ["my.yaml: train must be a section of keys (train.KEY: value), got 5"]),
    ("data:\n  sources: null\n", ["my.yaml: data.sources must be a section of keys (data.sources.KEY: value), got None"]),
    ("launcher:\n  sbatch: {}\n", ["my.yaml: launcher.sbatch={}: expected a list, not a mapping"]),   # was a TypeError
    # YAML 1.1's base-60 number (seen failing: accepted as #SBATCH --time=86400, 60 days; `steps: 1:30` ran 90 steps)
    ("launcher:\n  time: 24:00:00\n", ["my.yaml:2: YAML reads 24:00:00 as a base-60 number: quote it ('24:00:00')"]),
])
def test_user_recipe_mistakes(tmp_path, capsys, text, needles):
    path = _recipe(tmp_path, text)
    assert main([*BASE, f"recipe={path}", "dry_run=true", f"runs_root={tmp_path}"]) == 2
    err = capsys.readouterr().err
    for needle in needles:
        assert needle in err, err
    assert "Traceback" not in err


def test_missing_user_recipe(tmp_path, capsys):
    assert main([*BASE, f"recipe={tmp_path / 'nope.yaml'}", "dry_run=true"]) == 2
    assert capsys.readouterr().err.strip() == f"error: recipe={tmp_path / 'nope.yaml'}: no such file"


def test_show_prints_each_value_with_its_origin(tmp_path, capsys):
    path = _recipe(tmp_path, "train:\n  lr: 3.0e-4\n")
    argv = [*BASE, f"recipe={path}", "steps=5", "logging.group=study1"]
    assert main(["show", *argv]) == 0
    out = capsys.readouterr().out
    lines = {line.split(" = ", 1)[0]: line for line in out.splitlines() if " = " in line and not line.startswith("#")}
    expect = {"train.lr": f"recipe={path.resolve()}", "train.steps": "command line (steps=5)",
              "logging.group": "command line (logging.group=study1)", "model.path": "recipes/model/tiny.yaml",
              "arm": "recipes/arm/r2e.yaml", "seed": "default (its field)", "data.kind": "recipes/data/synthetic.yaml",
              "model.config.hidden_size": "recipes/model/tiny.yaml"}
    for key, origin in expect.items():
        assert lines[key].endswith(f"# {origin}"), lines[key]
    cfg = compose(argv).cfg   # every key shown, with the composed value
    assert list(lines) == flat_keys(cfg)
    assert lines["train.lr"].split(" = ", 1)[1].split("#")[0].strip() == repr(cfg.train.lr)


@pytest.mark.parametrize("share", ["", "~1", "~0.5"])
def test_a_source_with_a_share_is_made_absolute_like_one_without(tmp_path, monkeypatch, share):
    """A local source given relative to where launch runs is recorded absolute, its `~SHARE` kept:
    the trainer runs elsewhere and must read the very file meant."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "nq.jsonl").write_text("{}\n")
    monkeypatch.chdir(tmp_path)
    other = "search-r1:data/nq.jsonl~0.5," if share == "~0.5" else ""
    cfg = compose(["arm=search", "model=tiny_base", "data=hub",
                   f"data.sources.search=[{other}search-r1:data/nq.jsonl{share}]"]).cfg
    want = f"search-r1:{tmp_path / 'data' / 'nq.jsonl'}{share}"
    assert list(cfg.data.sources.search)[-1] == want
    # a local dir with a #split (rel/dir#test does not exist as written): the dir made absolute, its split kept, so
    # data-prep reads that dir's test split from wherever it runs (it was taken for a hub id, read against data-prep's cwd)
    (tmp_path / "data" / "nq").mkdir()
    (tmp_path / "data" / "nq" / "test.jsonl").write_text("{}\n")
    cfg = compose(["arm=search", "model=tiny_base", "data=hub", f"data.sources.search=[search-r1:data/nq#test{share}]"]).cfg
    assert list(cfg.data.sources.search) == [f"search-r1:{tmp_path / 'data' / 'nq'}#test{share}"]
    monkeypatch.chdir(tmp_path / "data" / "nq")
    src = parse_source(list(cfg.data.sources.search)[0])
    assert (src.location, src.split, src.files()) == (str(tmp_path / "data" / "nq"), "test", [tmp_path / "data" / "nq" / "test.jsonl"])
    # a hub id keeps its share and is not made a path
    cfg = compose(["arm=search", "model=tiny_base", "data=hub", "data.sources.search=[openseeker:Org/Data~1,openseeker:Org/D@v1#test]"]).cfg
    assert list(cfg.data.sources.search) == ["openseeker:Org/Data~1", "openseeker:Org/D@v1#test"]
