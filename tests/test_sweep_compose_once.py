"""A sweep composes each of its runs once: the configuration it checked up front is the one each run
trains with (launch.sweep hands launch.run.launch_one the resolved run, not its argv again). Counted
with a spy on the compose function, for a local sweep of 3 runs, trained by a stand-in trainer."""
from __future__ import annotations

from pathlib import Path

from test_launch_cache import FakeDataPrep


def test_a_sweep_of_three_runs_composes_each_run_once(tmp_path, monkeypatch):
    from launch import compose as compose_mod
    from launch import local, run, sweep

    composed: list[tuple[str, ...]] = []
    real = compose_mod.compose

    def spy(argv, *args, **kwargs):
        composed.append(tuple(argv))
        return real(argv, *args, **kwargs)

    monkeypatch.setattr(compose_mod, "compose", spy)
    monkeypatch.setattr(run, "compose", spy)
    trained = []

    def fake_run(cmd, log_dir, cwd, env=None, pass_fds=(), stops=None):
        rd = Path(cmd[-1]).parent
        trained.append(rd.relative_to(tmp_path).as_posix())
        (rd / "DONE").write_text("")
        return 0, log_dir / "train.log"

    monkeypatch.setattr(local, "run_logged", fake_run)
    monkeypatch.setattr("launch.jobs.cuda_device_count", lambda: 0)   # a CPU box (and no torch import here)
    FakeDataPrep().install(monkeypatch)
    argv = ["arms=[r2e,search,mixed]", "seeds=[0]", "model=tiny", "data=synthetic", "steps=4", f"runs_root={tmp_path}"]
    assert sweep.run_sweep(argv) == 0
    assert trained == ["r2e/seed0", "search/seed0", "mixed/seed0"]
    assert len(composed) == 3 and len(set(composed)) == 3, composed
    # each run's recorded config is its own arm's
    for arm in ("r2e", "search", "mixed"):
        assert f"arm: {arm}" in (tmp_path / arm / "seed0" / "config.yaml").read_text()


def test_composing_a_run_deep_copies_no_config(monkeypatch):
    """The defaults, each recipe layer and each key=value merge into the run's one config in place (omegaconf's merge
    deep-copied the whole config per layer and per token: about 1 s per run of a study on the shared 2-core box)."""
    from omegaconf import DictConfig

    from launch.compose import compose

    copies, real = [], DictConfig.__deepcopy__
    monkeypatch.setattr(DictConfig, "__deepcopy__", lambda self, memo: copies.append(1) or real(self, memo))
    compose(["arm=mixed", "model=tiny", "data=synthetic", "steps=4", "seed=2", "name=${arm}-x"])
    assert copies == []
