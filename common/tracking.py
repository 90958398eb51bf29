"""Weights & Biases, the way its users expect it to behave (shared by sft, rl, evals and analysis), and
the trainers' metrics log (`MetricsLog`: `<run_dir>/metrics.jsonl`) and wandb run (`Wandb`), one for SFT and GRPO.

Mode precedence (`resolve_mode`):
1. `logging.mode` set to anything but `auto` (online | offline | disabled) — the recipe or
   the command line said so explicitly;
2. else the standard `WANDB_MODE` environment variable (`WANDB_DISABLED=true` counts as
   `disabled`, as in wandb itself);
3. else online when this machine is logged in — `WANDB_API_KEY`, `WANDB_IDENTITY_TOKEN_FILE`
   or the API key `wandb login` stored in the netrc file (`$NETRC`, else `~/.netrc` /
   `~/_netrc`) for the host of `WANDB_BASE_URL` (default api.wandb.ai);
4. else offline (the run is kept under the run dir; `wandb sync` uploads it later).

Project: `logging.project`, else `WANDB_PROJECT`, else `dtsft`. Entity: `logging.entity`, else
`WANDB_ENTITY` (else the account's default). Group: `logging.group`, else `WANDB_RUN_GROUP`,
else the study's name (the last component of `runs_root`), so every arm x seed of one sweep
lands in one group. Tags: arm, seed, model, stage, plus `logging.tags`.
"""
from __future__ import annotations

import json
import logging
import netrc
import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from common.cli import ConfigError

log = logging.getLogger("common.tracking")

MODES = ("online", "offline", "disabled")
# WANDB_MODE spellings wandb itself accepts, mapped to the three modes.
_ENV_MODES = {"online": "online", "run": "online", "offline": "offline", "dryrun": "offline",
              "disabled": "disabled"}
DEFAULT_HOST = "https://api.wandb.ai"
DEFAULT_PROJECT = "dtsft"
ID_FILE = "wandb_id"   # <run_dir>/wandb_id: the run's wandb id, reused on resume and by evaluate


def netrc_path(env: dict) -> Path:
    """The netrc file wandb reads: $NETRC, else ~/.netrc, else ~/_netrc (the first that exists)."""
    if env.get("NETRC"):
        return Path(env["NETRC"]).expanduser()
    home = Path(env.get("HOME") or Path.home())
    for name in (".netrc", "_netrc"):
        if (home / name).exists():
            return home / name
    return home / ".netrc"


def credentials_source(env: dict | None = None) -> str | None:
    """Where this machine's wandb credentials come from (an env var name or the netrc path),
    or None when it is not logged in. Reads files only; never touches the network."""
    env = dict(os.environ) if env is None else env
    for var in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE"):
        if env.get(var):
            return var
    path = netrc_path(env)
    host = urlsplit(env.get("WANDB_BASE_URL") or DEFAULT_HOST).netloc
    try:
        creds = netrc.netrc(str(path)).authenticators(host) if host else None
    except (OSError, netrc.NetrcParseError):
        return None
    return str(path) if creds and creds[2] else None


def resolve_mode(configured: str, env: dict | None = None) -> tuple[str, str]:
    """(mode, why) by the precedence in this module's docstring."""
    env = dict(os.environ) if env is None else env
    if configured != "auto":
        if configured not in MODES:
            raise ConfigError(f"logging.mode must be auto, online, offline or disabled, got {configured!r}")
        return configured, "logging.mode"
    if str(env.get("WANDB_DISABLED", "")).lower() in ("1", "true", "yes"):
        return "disabled", "WANDB_DISABLED"
    if env.get("WANDB_MODE"):
        value = env["WANDB_MODE"].strip().lower()
        if value not in _ENV_MODES:
            raise ConfigError(f"WANDB_MODE={env['WANDB_MODE']!r} is not one of {', '.join(_ENV_MODES)}")
        return _ENV_MODES[value], "WANDB_MODE"
    source = credentials_source(env)
    if source:
        return "online", f"logged in ({source})"
    return "offline", "not logged in (no WANDB_API_KEY, no netrc entry)"


@dataclass
class RunSpec:
    """What one wandb run is called and where it belongs."""

    project: str
    name: str
    mode: str
    why: str
    entity: str | None = None
    group: str | None = None
    tags: list[str] = field(default_factory=list)
    job_type: str = "train"


def run_spec(logging_cfg, *, name: str, runs_root: str | None, tags: list[str], job_type: str = "train",
             env: dict | None = None) -> RunSpec:
    """A RunSpec from a config's `logging:` section (a mapping with mode/project/entity/group/tags)."""
    env = dict(os.environ) if env is None else env
    get = (lambda k: logging_cfg.get(k)) if hasattr(logging_cfg, "get") else (lambda k: getattr(logging_cfg, k, None))
    mode, why = resolve_mode(str(get("mode") or "auto"), env)
    study = Path(str(runs_root)).expanduser().resolve().name if runs_root else None
    extra = [str(t) for t in (get("tags") or [])]
    return RunSpec(
        project=str(get("project") or env.get("WANDB_PROJECT") or DEFAULT_PROJECT),
        entity=get("entity") or env.get("WANDB_ENTITY") or None,
        group=str(get("group") or env.get("WANDB_RUN_GROUP") or study or "") or None,
        name=name, mode=mode, why=why, job_type=job_type,
        tags=list(dict.fromkeys([str(t) for t in tags] + extra)),   # ordered, no repeats
    )


def run_tags(*, arm: str, seed: int, model: str, stage: str) -> list[str]:
    return [f"arm:{arm}", f"seed:{seed}", f"model:{model}", f"stage:{stage}"]


def init_run(spec: RunSpec, *, run_dir: Path, config: dict | None = None, run_id: str | None = None):
    """wandb.init for `spec` with system metrics and console capture on; the id is kept in
    `<run_dir>/wandb_id` so a resumed segment (and evaluate later) continues the same run.
    Returns the run, or None when the mode is disabled."""
    if spec.mode == "disabled":
        return None
    import secrets

    import wandb

    run_dir.mkdir(parents=True, exist_ok=True)
    id_file = run_dir / ID_FILE
    if run_id is None:
        run_id = id_file.read_text().strip() if id_file.is_file() else secrets.token_hex(4)
        id_file.write_text(run_id + "\n")
    return wandb.init(
        project=spec.project, entity=spec.entity, group=spec.group, tags=spec.tags, job_type=spec.job_type,
        name=spec.name, id=run_id, resume="allow", dir=str(run_dir), mode=spec.mode, config=config,
        settings=wandb.Settings(console="auto", x_disable_stats=False),
    )


class MetricsLog:
    """Append-only metrics.jsonl on rank 0; on resume, rows past the resumed step are dropped
    so the file reads as one uninterrupted run."""

    def __init__(self, path: Path, resume_step: int, rank: int):
        self.path, self.rank = path, rank
        if rank != 0:
            return
        kept = []
        if resume_step > 0 and path.is_file():
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    if json.loads(line).get("step", 0) <= resume_step:
                        kept.append(line)
                except json.JSONDecodeError:
                    log.warning("%s: dropping unreadable line %r", path, line[:80])
        tmp = path.with_name(path.name + ".tmp")  # atomic: a kill here must not lose the kept rows
        tmp.write_text("".join(k + "\n" for k in kept), encoding="utf-8")
        os.replace(tmp, path)

    def write(self, row: dict) -> None:
        if self.rank == 0:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
                f.flush()


class Wandb:
    """Rank 0 only; mode, project, group and tags by `common.tracking` (the wandb user's
    precedence: explicit logging.mode > WANDB_MODE > logged in -> online, else offline);
    resumes the same run id from `<run_dir>/wandb_id`."""

    def __init__(self, *, enabled: bool, rank: int, run_dir: Path, spec, config: dict):
        self.run = None
        if not enabled or rank != 0:
            return
        self.run = init_run(spec, run_dir=run_dir, config=config)
        log.info("wandb: %s (%s), project %s, group %s, run %s%s", spec.mode, spec.why, spec.project, spec.group,
                 spec.name, f" ({self.run.id})" if self.run is not None else "")

    def log(self, row: dict, step: int) -> None:
        if self.run is not None:
            self.run.log({k: v for k, v in row.items() if v is not None and k != "step"}, step=step)

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None
