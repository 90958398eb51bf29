"""wandb the way its users expect: mode precedence, project/entity/group/tags, system metrics.

Nothing here talks to the network: the mode table reads env vars and netrc files (wandb's own
netrc reader is the oracle for "logged in"), and the init test runs a real offline wandb run.
"""
from __future__ import annotations

import itertools

import pytest

from common.cli import ConfigError
from common.tracking import credentials_source, resolve_mode, run_spec, run_tags

KEY = "a" * 40   # wandb API keys are 40 characters (86 for newer ones)


def _env(tmp_path, *, wandb_mode, api_key, netrc):
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    if netrc:
        (home / ".netrc").write_text(f"machine api.wandb.ai\n  login user\n  password {KEY}\n")
        (home / ".netrc").chmod(0o600)
    env = {"HOME": str(home)}
    if wandb_mode:
        env["WANDB_MODE"] = wandb_mode
    if api_key:
        env["WANDB_API_KEY"] = KEY
    return env


def expected(explicit, wandb_mode, api_key, netrc):
    if explicit != "auto":
        return explicit
    if wandb_mode:
        return {"dryrun": "offline", "run": "online"}.get(wandb_mode, wandb_mode)
    return "online" if (api_key or netrc) else "offline"


TABLE = list(itertools.product(("auto", "online", "offline", "disabled"),
                               (None, "online", "offline", "disabled", "dryrun"), (False, True), (False, True)))


@pytest.mark.parametrize("explicit,wandb_mode,api_key,netrc", TABLE)
def test_mode_precedence_table(tmp_path, explicit, wandb_mode, api_key, netrc):
    env = _env(tmp_path, wandb_mode=wandb_mode, api_key=api_key, netrc=netrc)
    mode, why = resolve_mode(explicit, env)
    assert mode == expected(explicit, wandb_mode, api_key, netrc), why


def test_netrc_login_agrees_with_wandb(tmp_path, monkeypatch):
    """'Logged in' means what wandb itself finds in the netrc file, host by host."""
    read_netrc_auth = pytest.importorskip("wandb.sdk.lib.wbauth").read_netrc_auth

    path = tmp_path / "netrc"
    cases = [f"machine api.wandb.ai login user password {KEY}\n",
             f"machine other.example.com login user password {KEY}\n",
             "", f"machine wandb.mycorp.com login user password {KEY}\n"]
    for text, base in itertools.product(cases, (None, "https://wandb.mycorp.com")):
        path.write_text(text)
        path.chmod(0o600)
        env = {"NETRC": str(path), "HOME": str(tmp_path)}
        monkeypatch.setenv("NETRC", str(path))
        if base:
            env["WANDB_BASE_URL"] = base
        theirs = read_netrc_auth(host=base or "https://api.wandb.ai")
        assert (credentials_source(env) is not None) == (theirs is not None), (text, base)


def test_bad_wandb_mode_names_the_variable():
    with pytest.raises(ConfigError, match="WANDB_MODE"):
        resolve_mode("auto", {"WANDB_MODE": "sometimes"})


def test_project_entity_group_tags(tmp_path):
    runs_root = tmp_path / "transfer_v2"
    tags = run_tags(arm="r2e", seed=1, model="tiny", stage="sft")
    spec = run_spec({"mode": "auto", "tags": ["lr-sweep"]}, name="r2e-s1", runs_root=str(runs_root), tags=tags,
                    env={"WANDB_PROJECT": "p-env", "WANDB_ENTITY": "lab", "HOME": str(tmp_path)})
    assert (spec.project, spec.entity, spec.group, spec.mode) == ("p-env", "lab", "transfer_v2", "offline")
    assert spec.tags == ["arm:r2e", "seed:1", "model:tiny", "stage:sft", "lr-sweep"]
    explicit = run_spec({"project": "mine", "entity": "me", "group": "g"}, name="x", runs_root=None, tags=[],
                        env={"WANDB_PROJECT": "p-env", "WANDB_ENTITY": "lab", "WANDB_RUN_GROUP": "eg"})
    assert (explicit.project, explicit.entity, explicit.group) == ("mine", "me", "g")
    by_env = run_spec({}, name="x", runs_root=str(runs_root), tags=[], env={"WANDB_RUN_GROUP": "eg", "HOME": "/x"})
    assert (by_env.project, by_env.entity, by_env.group) == ("dtsft", None, "eg")


def test_offline_init_records_group_tags_and_system_metrics(tmp_path, monkeypatch):
    """A real (offline) wandb run: what we ask for is what wandb holds; the id file resumes it."""
    from common.tracking import ID_FILE, init_run

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    spec = run_spec({"mode": "offline", "group": "study"}, name="r2e-s0", runs_root=None,
                    tags=run_tags(arm="r2e", seed=0, model="tiny", stage="sft"))
    run = init_run(spec, run_dir=tmp_path, config={"a": 1})
    try:
        assert (run.group, run.name, run.project) == ("study", "r2e-s0", "dtsft")
        assert list(run.tags) == spec.tags
        assert run.settings.x_disable_stats is False and run.settings.console != "off"
        assert (tmp_path / ID_FILE).read_text().strip() == run.id
    finally:
        run.finish()
    assert init_run(run_spec({"mode": "disabled"}, name="x", runs_root=None, tags=[]), run_dir=tmp_path) is None
