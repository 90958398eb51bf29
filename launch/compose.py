"""Recipe composition for both trainers, `compose` (SFT) and `compose_grpo` (docs/stages/launch.md, "Your own
recipe"): the fields' defaults <- the shipped recipes <- the user's `recipe=FILE` <- key=value, then validated."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from common.cli import KeySpace, apply_overrides, base60_problem, did_you_mean, flat_keys, load_mapping, merge, split_dotlist
from common import fields, plan
from common.fields import plain, problems
from common.recipes import ALIASES, DEFAULT_CHOICES, GROUPS, RECIPES, RL_ALIASES, STRING_KEYS, load_recipe
from data_prep import config as data_config
from launch.slurm import slurm_option_problems
from launch.errors import LaunchError
from launch.jobs import BACKENDS, backend, with_backend_keys
from launch.paths import make_absolute
from rl import config as rl_config
from rl.errors import RlError
from sft import config as sft_config

USER_RECIPE = "recipe"   # recipe=PATH: the user's own file, merged after the groups
DEFAULT = "default (its field)"   # the origin of a key no recipe or command-line token set

# Free-form sub-trees: any key below them is accepted (model config overrides, generator knobs).
OPEN_PREFIXES = ("model.config.", "data.synthetic.")
# What a shipped recipe's `_launch:` section may say (anything else is an error naming the key).
LAUNCH_META_KEYS = ("data_arm",)
GRPO_SELECTORS = {"task": "spa", "model": "qwen3_4b", "launcher": "local"}  # the references' Qwen3-4B (hybrid)


@dataclass
class Composed:
    cfg: DictConfig                       # the resolved config (without `_launch`)
    choices: dict[str, str]               # group -> recipe name
    origins: dict[str, str]               # key set by a layer -> that layer (later wins)
    data_arm: str                         # the data_prep arm to build (`_launch.data_arm`: r2e_v5 trains on r2e data without the epilogue)


def split_selectors(argv: list[str], defaults: dict[str, str] = DEFAULT_CHOICES,
                    config_keys: tuple[str, ...] = ()) -> tuple[dict[str, str], list[str]]:
    """(choices, the rest) of argv: the selectors (the keys of `defaults`) and `recipe=` pulled out; one in `config_keys`
    is a config key too (GRPO's task=) and stays in the rest as well."""
    choices, rest = dict(defaults), []
    for tok, (key, value) in zip(argv, split_dotlist(argv)):
        if selector := key in defaults or key == USER_RECIPE:
            choices[key] = value.strip()
        if not selector or key in config_keys:
            rest.append(f"{key}={verbatim(value)}" if ALIASES.get(key, key) in STRING_KEYS else tok)
    return choices, rest


def verbatim(value: str) -> str:
    """A command-line value of a key kept as text (STRING_KEYS, a stage job's cluster settings) as the token YAML reads
    back as that text: JSON-quoted, unless empty, quoted already, null or a list (`[a,b]`; `[ -f env ] && ...` is text)."""
    try:
        kept = not value or value[0] in "'\"" or value == "null" or OmegaConf.is_list(OmegaConf.from_dotlist([f"x={value}"]).x)
    except Exception:   # omegaconf's parse errors: shell text
        kept = False
    return value if kept else json.dumps(value)


def resolved_container(cfg, where: str = "the composed config (recipes and key=value overrides)",
                       error: type[Exception] = LaunchError):
    """`cfg` as plain containers with every `${...}` interpolation resolved; a bad one is one line."""
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except Exception as exc:  # omegaconf's InterpolationKeyError, InterpolationResolutionError, ...
        raise error(f"{where}: bad interpolation ({str(exc).splitlines()[0]})") from None


@dataclass(frozen=True)
class Keys:
    """How one trainer's config composes; `decided`: the keys its command line decides (a user recipe setting one would
    silently beat them)."""
    table: dict
    decided: tuple[str, ...]
    aliases: dict[str, str]
    open_prefixes: tuple[str, ...]
    error: type[Exception]
    what: str = "a launch key (recipes may only set the keys `launch --help` lists)"   # what an unknown recipe key is not
    launch_note: str = ("recipes (it picks e.g. the data arm of arm=r2e_v5); a user recipe cannot set it: choose the arm "
                        "with arm=... on the command line")


SFT_KEYS = Keys(sft_config.SFT, ("arm",), ALIASES, OPEN_PREFIXES, LaunchError)
GRPO_KEYS = Keys(rl_config.GRPO, ("task", "arm", "stage"), RL_ALIASES, (), RlError, "a GRPO key (stage=grpo reads only "
                 "the keys `launch stage=grpo --help` lists)", "SFT recipes; nothing of it applies to GRPO")


def _layered(keys: Keys, defaults: dict, layers: list[tuple[str, DictConfig]], choices: dict[str, str],
             rest: list[str], strict: bool = True) -> tuple[DictConfig, dict[str, str], dict]:
    """`defaults` <- the shipped `layers` [(where, recipe)] <- the user's `recipe=PATH` <- the key=value tokens `rest`:
    (the config, every key's origin, the shipped `_launch` sections). A shipped key outside `defaults` is an error
    (`strict`) or left out (GRPO reads the SFT model recipes: their SFT-only knobs stay out of config.yaml and its fingerprint)."""
    cfg = OmegaConf.create(defaults)
    known, meta, origins = KeySpace(cfg, keys.open_prefixes), {}, dict.fromkeys(flat_keys(cfg), DEFAULT)
    user = [_user_recipe(path_text, choices, keys)] if (path_text := choices.get(USER_RECIPE)) else []
    for i, (where, layer) in enumerate([*layers, *user]):   # the user's recipe last
        if "_launch" in layer:   # a shipped recipe's section for launch (r2e_v5's data_arm): the trainer's config never holds it
            section = layer.pop("_launch")
            launch = resolved_container(section, where) if isinstance(section, DictConfig) else None
            if not isinstance(launch, dict):
                raise LaunchError(f"{where}: `_launch` must be a mapping with keys {', '.join(LAUNCH_META_KEYS)}")
            for key in (k for k in launch if k not in LAUNCH_META_KEYS):
                raise LaunchError(f"{where}: unknown key '_launch.{key}' (known: "
                                  f"{', '.join('_launch.' + k for k in LAUNCH_META_KEYS)}).{did_you_mean(key, LAUNCH_META_KEYS)}")
            meta.update(launch)
        if strict or i == len(layers):   # (the user's recipe: every key one of `known`)
            for key in (k for k in flat_keys(layer) if k not in known):
                raise keys.error(f"{where}: key {key!r} is not {keys.what}.{did_you_mean(key, sorted(known.leaves))}")
        else:   # GRPO: only the keys it reads
            kept = OmegaConf.create()
            for key in (k for k in flat_keys(layer) if k in known):
                OmegaConf.update(kept, key, OmegaConf.select(layer, key), merge=False)
            layer = kept
        sections = KeySpace(cfg)   # a section (`train`, `data.sources`) given a value: refused naming the layer
        for key in (k for k in flat_keys(layer) if k in sections.subtrees and k not in sections.leaves):
            if not isinstance(value := OmegaConf.select(layer, key, throw_on_resolution_failure=False), DictConfig):
                raise keys.error(f"{where}: {key} must be a section of keys ({key}.KEY: value), got {plain(value)!r}")
        origins.update(dict.fromkeys(flat_keys(layer), where))
        cfg = merge(cfg, layer, f"{where}: ")
    cfg = apply_overrides(cfg, rest, aliases=keys.aliases, open_prefixes=keys.open_prefixes, in_place=True)
    origins.update({keys.aliases.get(k, k): f"command line ({tok})" for tok, (k, _) in zip(rest, split_dotlist(rest))})
    cfg = cfg if (resolved := resolved_container(cfg, error=keys.error)) == OmegaConf.to_container(cfg) else OmegaConf.create(resolved)
    make_absolute(cfg, with_backend_keys(keys.table), origins)
    return cfg, origins, meta


def _user_recipe(path_text: str, choices: dict[str, str], keys: Keys) -> tuple[str, DictConfig]:
    """(origin label, file) of the user's recipe (relative to the current directory; `choices` gets it absolute); it may
    set neither what the command line decides nor `_launch` (`_layered` checks its keys)."""
    path = Path(path_text).expanduser()   # (read as every command reads a YAML mapping; its errors say `recipe=PATH: ...`)
    recipe = load_mapping(path, lambda why: LaunchError(f"recipe={why}"), "not readable YAML", "a recipe must be a YAML mapping")
    choices[USER_RECIPE] = str(path.resolve())
    where = f"recipe={choices[USER_RECIPE]}"
    if "_launch" in recipe:
        raise keys.error(f"{where}: `_launch` is internal to the shipped {keys.launch_note}")
    for key in (k for k in keys.decided if k in recipe):
        raise LaunchError(f"{where}: sets {key}: {OmegaConf.to_container(recipe)[key]!r}, which the command line "
                          f"decides; remove it from the file and pass {key}=... on the command line")
    if why := base60_problem(path):
        raise LaunchError(why)
    return where, recipe


def compose(argv: list[str]) -> Composed:
    choices, rest = split_selectors(argv)
    layers = [_recipe(group, choices[group]) for group in GROUPS]
    cfg, origins, meta = _layered(SFT_KEYS, fields.defaults(with_backend_keys(sft_config.SFT)), layers, choices, rest)
    validate(cfg)
    return Composed(cfg, choices, origins, str(meta.get("data_arm") or cfg.arm))


def compose_grpo(argv: list[str]) -> Composed:
    """The GRPO config of `argv` (selectors task= model= launcher= recipe=, then key=value), validated."""
    for key, value in split_dotlist(argv):
        if key == "stage" and value.strip() != "grpo":
            raise RlError(f"stage={value.strip()}: this is the GRPO launcher (stage=grpo); SFT is `launch arm=...`")
        if key == "arm":
            raise RlError("arm= is not a GRPO key: the arm of a GRPO run is grpo_<task> (use task=spa|qa)")
    choices, rest = split_selectors([tok for tok, (key, _) in zip(argv, split_dotlist(argv)) if key != "stage"],
                                    GRPO_SELECTORS, config_keys=("task",))
    task, model = choices["task"], choices["model"]
    layers = [_recipe("grpo/task", task), _recipe("model", model), _recipe("launcher", choices["launcher"])]
    # After the launcher: a model's GRPO recipe states the hardware its reference trained on (4 GPUs),
    # which a launcher's generic default (slurm: 8 GPUs per node) must not override silently.
    if (RECIPES / "grpo" / "model" / f"{model}.yaml").is_file():
        layers.append(_recipe("grpo/model", model))
    if (init := OmegaConf.select(layers[1][1], "model.init", default="pretrained")) != "pretrained":
        raise RlError(f"model={model} is a random init (model.init={init}); GRPO starts "
                      "from a pretrained model or an SFT checkpoint (e.g. model=tiny_base on CPU)")
    cfg, origins, _ = _layered(GRPO_KEYS, {"arm": None, **fields.defaults(with_backend_keys(rl_config.GRPO))}, layers, choices, rest, strict=False)
    cfg.arm = f"grpo_{cfg.task}"   # arm: grpo_<task>, set last
    rl_config.validate(cfg)
    if bad := launcher_problems(cfg, resume=False) + slurm_option_problems(plain(cfg.launcher.sbatch)) + plan.late_saves(cfg.train, None, rl_config.GRPO):
        raise RlError("invalid config:\n  " + "\n  ".join(bad))
    return Composed(cfg, choices, origins, cfg.arm)


# Validation: every key's rule is its field's (sft.config.SFT); the trainer's keys are checked by the trainer's own
# `problems` and the data keys by data_prep's. Below: what only launch reads.
_LAUNCH_RULES = {k: f for k, f in sft_config.SFT.items() if k not in sft_config.TRAINER and not k.startswith("data.")}


def validate(cfg: DictConfig) -> None:
    """Check every value the stages rely on; raise one ConfigError listing all problems."""
    bad = sft_config.problems(cfg) + data_config.problems(cfg.data) + problems(_LAUNCH_RULES, cfg, must=True)
    bad += slurm_option_problems(OmegaConf.select(cfg, "launcher.sbatch"))
    if not bad:   # each value valid: how they combine (a save step past data.n's plan too; an explicit data.dir's size: the trainer's)
        bad += plan.late_saves(cfg.train, None if cfg.data.dir else cfg.data.n, sft_config.SFT)
        if cfg.data.max_seq_len > cfg.train.max_tokens_per_micro_batch:
            bad.append(f"data.max_seq_len={cfg.data.max_seq_len} exceeds train.max_tokens_per_micro_batch="
                       f"{cfg.train.max_tokens_per_micro_batch}: the trainer never splits a trajectory across "
                       "micro-batches, so the longest ones could not be trained; raise the budget or lower max_seq_len")
        bad += launcher_problems(cfg)
        for domain, needed in (("code", cfg.arm != "search"), ("search", cfg.arm in ("search", "mixed"))):
            if needed and cfg.data.kind == "hub" and cfg.data.dir is None and not cfg.data.sources[domain]:
                bad.append(f"arm={cfg.arm} with data.kind=hub needs data.sources.{domain} (e.g. data=hub)")
    if bad:
        raise LaunchError("invalid config:\n  " + "\n  ".join(bad))


def launcher_problems(cfg: DictConfig, resume: bool = True) -> list[str]:
    """What the launcher backend (`launcher.kind`, launch.jobs.BACKENDS) refuses: an unknown one, a backend's own key's
    value (Runner.keys), several nodes for one whose jobs run here and (`resume`: SFT) resume=never for one that requeues."""
    kind = cfg.launcher.kind
    try:
        runner = backend(kind, "launcher.kind")
    except LaunchError as exc:
        return [str(exc)]
    bad = problems(with_backend_keys({}), cfg, must=True)
    if runner.where == "here" and cfg.launcher.nodes != 1:
        multi = "|".join(k for k in BACKENDS if backend(k).where != "here")
        bad.append(f"launcher.nodes={cfg.launcher.nodes} needs launcher={multi} (launcher={kind} runs on this machine only)")
    if resume and runner.requeues and cfg.resume == "never":
        bad.append(f"resume=never cannot be used with launcher={kind}: requeued segments resume from the latest state "
                   "(use a fresh run_dir instead)")
    return bad


def _recipe(group: str, name: str) -> tuple[str, DictConfig]:
    """A layer (where, recipe): recipes/GROUP/NAME.yaml; `launcher=NAME` of a backend without a recipe: `launcher.kind: NAME`."""
    if group == "launcher" and name in BACKENDS and not (RECIPES / "launcher" / f"{name}.yaml").is_file():
        return f"recipes/{group}/{name}.yaml", OmegaConf.create({"launcher": {"kind": name}})
    return f"recipes/{group}/{name}.yaml", load_recipe(group, name, RECIPES, BACKENDS if group == "launcher" else ())
