"""The preflight of a data=hub launch (issue #63 item 4, the training sources): before anything starts, each hub
source the arm's dataset build reads (`data.sources.<domain>`) and each decontamination set (`data.decontam_sets`)
is checked the way the launch will read it, from the local caches alone; a run that has its dataset (`data.dir`,
or the dataset cache's copy under the launch's key) needs none of them. Offline with no copy, one line per
source names it and what to set; online nothing is asked (the launch pins and downloads). The oracle of what a
cached copy is: `datasets.load_dataset` itself, offline. In-process."""
from __future__ import annotations

import pytest

from data_prep import hub
from launch import preflight
from launch.cli import main
from tests.hub_stand_ins import COMMIT, shipped_stand_ins, stand_in

CODE = ("R2E-Gym/R2EGym-SFT-Trajectories", "SWE-Gym/OpenHands-SFT-Trajectories", "SWE-bench/SWE-smith-trajectories")
ROWS = [{"id": "a", "text": "one"}, {"id": "b", "text": "two"}]


@pytest.fixture
def hf(tmp_path, monkeypatch):
    """Empty Hugging Face caches under `<tmp>/hf` (HF_HOME), the hub offline, an empty data cache; cwd `tmp`."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_DATASETS_CACHE", "HF_DATASETS_OFFLINE",
                "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("DTSFT_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("DTSFT_DATA_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.chdir(tmp_path)
    return tmp_path / "hf"


def needs(tmp_path, *argv):
    """The preflight's Needs of `launch arm=r2e model=tiny data=hub ... ARGV` (SFT), resolved as launch resolves it."""
    from launch.run import SFT

    return preflight.run_needs(SFT, SFT.resolve(["arm=r2e", "model=tiny", "data=hub", f"runs_root={tmp_path / 'runs'}",
                                                 *argv]))


def test_a_cached_copy_is_what_datasets_loads_offline(hf, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", hf / "datasets")   # (read from the env at its import)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)

    def loads(hub_id, split):
        try:
            return [dict(r) for r in datasets.load_dataset(hub_id, split=split, revision="1" * 40)]
        except Exception:  # noqa: BLE001 - any refusal: no copy it can load
            return None

    some = "SomeOrg/CamelCase-Set"
    assert "not in the local datasets cache" in hub.offline_problem(some, "train.success") and not loads(some, "train")
    stand_in(hf, some, {"train.success": ROWS})   # (another commit than the one asked: offline, datasets ignores it)
    assert hub.offline_problem(some, "train.success") is None and loads(some, "train.success") == ROWS
    assert "no split 'train'" in hub.offline_problem(some, "train") and loads(some, "train") is None
    stand_in(hf, some, {"train.success": ROWS}, config="other")   # a second configuration: datasets will not choose
    assert "several configurations" in hub.offline_problem(some, "train.success")
    assert loads(some, "train.success") is None
    torn = "SomeOrg/torn"
    (stand_in(hf, torn, {"train": ROWS}) / "torn-train.arrow").unlink()
    assert "lacks torn-train.arrow" in hub.offline_problem(torn, "train") and loads(torn, "train") is None


def test_offline_with_no_copy_a_launch_and_a_sweep_are_refused_naming_each_source_they_read(hf, tmp_path, capsys):
    argv = ["arm=r2e", "model=tiny", "data=hub", "steps=2", f"runs_root={tmp_path / 'runs'}"]
    assert main(argv) == 2 and not (tmp_path / "runs").exists()   # refused before anything is written
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error: preflight:")]
    assert len(lines) == 3, lines   # the arm's three code sources; not the search one it does not read
    for hub_id, line in zip(CODE, lines):
        assert f"data.sources.code: hub dataset {hub_id} cannot be pinned: HF_HUB_OFFLINE is set" in line
    # a sweep: each source once, whichever runs read it (the search one: the mixed arm's); nothing written
    assert main(["sweep", "arms=[r2e,mixed]", "seeds=[0]", *argv[1:]]) == 2 and not (tmp_path / "runs").exists()
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error: preflight:")]
    assert len(lines) == 4 and "hub dataset PolarSeeker/OpenSeeker-v1-Data cannot be pinned" in lines[3], lines


def test_a_warm_cache_passes_and_a_copy_without_the_split_is_named(hf, tmp_path, capsys):
    shipped_stand_ins(hf)   # each shipped source loaded once: its main branch's commit and a copy datasets loads
    need = needs(tmp_path)
    assert [spec for _, spec in need.hub] == [f"r2e-gym:{CODE[0]}@{COMMIT}", f"swe-gym:{CODE[1]}@{COMMIT}#train.success.oss",
                                             f"swe-smith:{CODE[2]}@{COMMIT}#xml"]   # pinned as the launch pins them
    assert preflight.problems([need]) == []   # (test_docs_commands' launch dry runs pass on these stand-ins)
    stand_in(hf, CODE[1], {"train": ROWS})   # its copy rewritten, holding another split only
    (line,) = preflight.problems([needs(tmp_path)])
    assert f"data.sources.code: hub dataset {CODE[1]}#train.success.oss: its copy in the local datasets cache" in line
    assert "has no split 'train.success.oss' (it has train)" in line and "unset HF_HUB_OFFLINE" in line


def test_a_run_with_its_dataset_needs_no_source_and_no_decontamination_set(hf, tmp_path):
    from launch import cache
    from launch.run import SFT

    own = tmp_path / "mine.jsonl"
    own.write_text('{"id": "1"}\n')
    unpinned = "data.decontam_sets=[2wikimultihopqa:hub_dev]"   # no public commit, not pre-filled
    need = needs(tmp_path, f"data.sources.code=[r2e-gym:{own}]", unpinned)
    assert "2wikimultihopqa:hub_dev" in need.data and need.hub == ()
    (line,) = preflight.problems([need])
    assert "`fetch-data 2wikimultihopqa:hub_dev from=DIR`" in line
    (tmp_path / "dir").mkdir()
    (line,) = preflight.problems([needs(tmp_path, f"data.sources.code=[r2e-gym:{tmp_path / 'dir'}]")])   # seen failing: accepted
    assert f"data.sources.code: source 'r2e-gym:{tmp_path / 'dir'}': {tmp_path / 'dir'} is a directory holding no .jsonl" in line
    built = tmp_path / "built"
    built.mkdir()
    (built / "manifest.json").write_text("{}")
    need = needs(tmp_path, unpinned, f"data.dir={built}")   # a dataset given: none of its inputs is read
    assert need.hub == () and "2wikimultihopqa:hub_dev" not in need.data and preflight.problems([need]) == []
    # the dataset cache holds the arm's dataset under the key the launch asks for (the sources pinned as it pins
    # them: the hub cache's main branch; no copy of the sources themselves): nothing else is needed
    shipped_stand_ins(hf)
    pinned = [f"r2e-gym:{CODE[0]}@{COMMIT}", f"swe-gym:{CODE[1]}@{COMMIT}#train.success.oss",
              f"swe-smith:{CODE[2]}@{COMMIT}#xml"]
    for d in (hf / "datasets").iterdir():
        for f in d.rglob("*.arrow"):
            f.unlink()
    assert len(preflight.problems([needs(tmp_path, unpinned)])) == 4
    prep = SFT.resolve(["arm=r2e", "model=tiny", "data=hub", f"runs_root={tmp_path / 'runs'}", unpinned,
                        f"data.sources.code=[{','.join(pinned)}]"])
    (cache.cache_root(prep.cfg) / cache.dataset_key(prep.cfg, "r2e")).mkdir(parents=True)
    need = needs(tmp_path, unpinned)
    assert need.hub == () and "2wikimultihopqa:hub_dev" not in need.data and preflight.problems([need]) == []


def test_pins_come_from_the_run_dir_and_online_nothing_is_asked(hf, tmp_path, monkeypatch):
    import json

    from omegaconf import OmegaConf

    from launch.compose import compose
    from launch.run import requested_identity

    shipped_stand_ins(hf)
    for ref in (hf / "hub").rglob("refs/main"):
        ref.unlink()   # copies, but no record of a commit: an unpinned source cannot be pinned offline
    lines = preflight.problems([needs(tmp_path)])
    assert len(lines) == 3 and all("cannot be pinned: HF_HUB_OFFLINE is set" in x for x in lines), lines
    cfg = compose(["arm=r2e", "model=tiny", "data=hub", f"runs_root={tmp_path / 'runs'}"]).cfg
    pins = [f"r2e-gym:{CODE[0]}@{'a' * 40}", f"swe-gym:{CODE[1]}@{'b' * 40}#train.success.oss",
            f"swe-smith:{CODE[2]}@{'c' * 40}#xml"]
    cfg.data.sources.code = pins
    rd = tmp_path / "runs" / "r2e" / "seed0"   # the run's first launch pinned them into its config.yaml
    rd.mkdir(parents=True)
    OmegaConf.save(cfg, rd / "config.yaml")
    (rd / "manifest.json").write_text(json.dumps({"identity": requested_identity(cfg)}))
    need = needs(tmp_path)
    assert need.who == f"run {rd.resolve()}"
    assert [spec for _, spec in need.hub] == pins and preflight.problems([need]) == []
    monkeypatch.delenv("HF_HUB_OFFLINE")   # online, empty caches: the launch pins and downloads; nothing asked here
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty"))
    assert preflight.problems([needs(tmp_path, f"runs_root={tmp_path / 'other'}")]) == []
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")   # the hub pins, but datasets loads from its cache only
    lines = preflight.problems([needs(tmp_path, f"runs_root={tmp_path / 'other'}")])
    assert len(lines) == 3 and all("not in the local datasets cache" in x and "HF_DATASETS_OFFLINE is set" in x
                                   for x in lines), lines
