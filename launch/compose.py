"""Recipe composition: base.yaml <- arm <- model <- data <- launcher recipes <- key=value overrides.

Group selectors (`arm=`, `model=`, `data=`, `launcher=`) pick a file under `recipes/<group>/`;
everything else is an omegaconf dotlist override checked against the keys the recipes define
(unknown key -> the valid keys and a "did you mean"). `validate` then checks every value the
stages rely on, so a bad value fails here, before any data prep or GPU work.

`recipe=path/to/my.yaml` merges the user's own file on top of the launcher recipe (before the
`key=value` overrides), checked like the shipped recipes. `Composed.origins` records which layer set
each key (what `launch show` prints).

A recipe may carry a `_launch:` section (e.g. `_launch.data_arm` for the r2e_v5 baseline): it is
read by launch and removed, so it never reaches the resolved config the trainer reads.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from common.cli import ConfigError, KeySpace, apply_overrides, did_you_mean, flat_keys, split_dotlist
from data_prep.render import HISTORY_POLICIES, THOUGHT_POLICIES
from common.layout import run_dir_path, variant_name_problem
from launch.slurm import slurm_option_problems

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
GROUPS = ("arm", "model", "data", "launcher")
USER_RECIPE = "recipe"   # recipe=PATH: the user's own file, merged after the groups
DEFAULT_CHOICES = {"arm": "r2e", "model": "qwen3_4b_thinking_2507", "data": "hub", "launcher": "local"}

# Everyday top-level names -> the full key they set.
ALIASES = {
    "steps": "train.steps",
    "epochs": "train.epochs",
    "n": "data.n",
    "save_steps": "train.save_steps",
    "state_every": "train.state_every",
    "lr": "train.lr",
    "nproc": "launcher.nproc",
    "dry_run": "launcher.dry_run",
    "nodes": "launcher.nodes",
    "gpus_per_node": "launcher.gpus_per_node",
    "partition": "launcher.partition",
    "time": "launcher.time",
    "account": "launcher.account",
}
# Values kept verbatim as strings: YAML would read `time=24:00:00` as the base-60 integer 86400,
# which Slurm would take as minutes.
STRING_KEYS = ("launcher.time", "launcher.partition", "launcher.account", "launcher.setup")
# Free-form sub-trees: any key below them is accepted (model config overrides, generator knobs).
OPEN_PREFIXES = ("model.config.", "data.synthetic.")


@dataclass
class Composed:
    cfg: DictConfig                       # the resolved config (without `_launch`)
    choices: dict[str, str]               # group -> recipe name
    meta: dict = field(default_factory=dict)   # merged `_launch` sections
    argv: list[str] = field(default_factory=list)
    origins: dict[str, str] = field(default_factory=dict)   # key set by a layer -> that layer (later wins)

    @property
    def data_arm(self) -> str:
        """The data_prep arm to build (r2e_v5 trains on r2e data without the epilogue)."""
        return str(self.meta.get("data_arm") or self.cfg.arm)


def group_choices(group: str, recipes: Path = RECIPES) -> list[str]:
    return sorted(p.stem for p in (recipes / group).glob("*.yaml"))


def load_recipe(group: str, name: str, recipes: Path = RECIPES) -> DictConfig:
    path = recipes / group / f"{name}.yaml"
    if not path.is_file():
        choices = group_choices(group, recipes)
        raise ConfigError(f"unknown {group} {name!r}; choices: {', '.join(choices) or '(none)'} (recipes in {recipes / group})")
    cfg = OmegaConf.load(path)
    if not isinstance(cfg, DictConfig):
        raise ConfigError(f"{path}: a recipe must be a YAML mapping")
    return cfg


def split_selectors(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """Pull `arm=`, `model=`, `data=`, `launcher=` out of argv; return (choices, the rest)."""
    choices, rest = dict(DEFAULT_CHOICES), []
    for tok, (key, value) in zip(argv, split_dotlist(argv)):
        if key in GROUPS or key == USER_RECIPE:
            choices[key] = value.strip()
        elif ALIASES.get(key, key) in STRING_KEYS and value and value[0] not in "'\"" and value != "null":
            rest.append(f"{key}='{value}'")
        else:
            rest.append(tok)
    return choices, rest


def _check_recipe_keys(recipe: DictConfig, base: DictConfig, where: str) -> None:
    known = KeySpace(base, OPEN_PREFIXES)
    for key in flat_keys(recipe):
        if key in known:
            continue
        raise ConfigError(f"{where}: key {key!r} is not in recipes/base.yaml (recipes may only set keys the base "
                          f"defines).{did_you_mean(key, sorted(known.leaves))}")


def load_user_recipe(path_text: str) -> tuple[Path, DictConfig]:
    """`recipe=PATH`: the user's own recipe file (relative to the current directory)."""
    path = Path(path_text).expanduser()
    if not path.is_file():
        raise ConfigError(f"recipe={path_text}: no such file")
    try:
        cfg = OmegaConf.load(path)
    except Exception as exc:  # YAML syntax errors come in several types
        raise ConfigError(f"recipe={path_text}: not readable YAML ({str(exc).splitlines()[0]})") from exc
    if not isinstance(cfg, DictConfig):
        raise ConfigError(f"recipe={path_text}: a recipe must be a YAML mapping")
    return path.resolve(), cfg


def compose(argv: list[str], recipes: Path = RECIPES) -> Composed:
    """Resolve the recipe groups and overrides in `argv` into one validated config."""
    choices, rest = split_selectors(argv)
    base = OmegaConf.load(recipes / "base.yaml")
    cfg, meta = base, {}
    origins = dict.fromkeys(flat_keys(base), "recipes/base.yaml")
    layers = [(f"recipes/{group}/{choices[group]}.yaml", load_recipe(group, choices[group], recipes)) for group in GROUPS]
    if choices.get(USER_RECIPE):
        path, user = load_user_recipe(choices[USER_RECIPE])
        choices[USER_RECIPE] = str(path)
        layers.append((f"recipe={path}", user))
    for where, recipe in layers:
        if "_launch" in recipe:
            meta.update(OmegaConf.to_container(recipe.pop("_launch"), resolve=True))
        _check_recipe_keys(recipe, base, where)
        cfg = OmegaConf.merge(cfg, recipe)
        origins.update(dict.fromkeys(flat_keys(recipe), where))
    cfg = apply_overrides(cfg, rest, aliases=ALIASES, open_prefixes=OPEN_PREFIXES)
    origins.update({ALIASES.get(k, k): f"command line ({tok})" for tok, (k, _) in zip(rest, split_dotlist(rest))})
    validate(cfg)
    return Composed(cfg=cfg, choices=choices, meta=meta, argv=list(argv), origins=origins)


# ---------------------------------------------------------------- validation
def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


CHOICES = {
    "resume_kind": ("auto", "never"),
    "model.init": ("pretrained", "random"),
    "model.attn_implementation": ("auto", "sdpa", "eager", "flash_attention_2"),
    "data.kind": ("hub", "synthetic"),
    "data.reasoning": ("reasoning_content", "content"),
    "data.history_reasoning": HISTORY_POLICIES,
    "data.thoughts": THOUGHT_POLICIES,
    "data.length_policy": ("drop", "truncate"),
    "train.precision": ("auto", "bf16", "fp32"),
    "train.lr_schedule": ("cosine", "linear", "constant"),
    "logging.mode": ("auto", "online", "offline", "disabled"),
    "launcher.kind": ("local", "slurm"),
}
POSITIVE_INTS = (
    "data.n", "data.max_seq_len", "data.decontam_ngram", "train.global_batch_size",
    "train.max_tokens_per_micro_batch", "train.epochs", "train.state_every",
    "train.max_consecutive_nonfinite", "train.log_every", "launcher.nodes", "launcher.gpus_per_node",
)
BOOLS = (
    "model.gpu_only", "data.epilogue", "data.allow_fewer", "data.strict", "data.decontam_drop",
    "train.save_epoch_ends", "train.activation_checkpointing", "logging.wandb", "launcher.dry_run",
)
SOURCE_FORMATS = ("r2e-gym", "swe-gym", "swe-smith", "openseeker", "search-r1", "canonical")


def validate(cfg: DictConfig) -> None:
    """Check every value the stages rely on; raise one ConfigError listing all problems."""
    get = lambda key: OmegaConf.select(cfg, key)  # noqa: E731
    bad: list[str] = []

    def need(ok: bool, key: str, what: str) -> None:
        if not ok:
            bad.append(f"{key} must be {what}, got {get(key)!r}")

    for key, allowed in CHOICES.items():
        if key != "resume_kind":
            need(get(key) in allowed, key, f"one of {', '.join(allowed)}")
    for key in POSITIVE_INTS:
        need(_is_int(get(key)) and get(key) > 0, key, "a positive integer")
    for key in BOOLS:
        need(isinstance(get(key), bool), key, "true or false")
    need(_is_int(cfg.seed) and cfg.seed >= 0, "seed", "a non-negative integer")
    need(get("data.max_record_bytes") is None or (_is_int(get("data.max_record_bytes")) and get("data.max_record_bytes") > 0),
         "data.max_record_bytes", "null (auto) or a positive integer")
    need(isinstance(cfg.runs_root, str) and cfg.runs_root != "", "runs_root", "a directory path")
    need(cfg.run_dir is None or isinstance(cfg.run_dir, str), "run_dir", "null or a directory path")
    need(variant_name_problem(cfg.name) is None, "name", variant_name_problem(cfg.name) or "")
    need(isinstance(cfg.resume, str) and (cfg.resume in ("auto", "never") or Path(cfg.resume).is_dir()),
         "resume", "auto, never or an existing state directory")
    for key in ("model.path", "model.tokenizer", "model.name"):
        need(isinstance(get(key), str) and get(key) != "", key, "a non-empty string")
    need(get("model.liger") in ("auto", True, False), "model.liger", "auto, true or false")
    need(get("train.steps") is None or (_is_int(get("train.steps")) and get("train.steps") > 0),
         "train.steps", "a positive integer (optimizer steps) or null (-> epochs)")
    need(_is_num(cfg.train.lr) and cfg.train.lr > 0, "train.lr", "a positive number")
    need(_is_num(cfg.train.eps) and cfg.train.eps > 0, "train.eps", "a positive number")
    need(_is_num(cfg.train.weight_decay) and cfg.train.weight_decay >= 0, "train.weight_decay", "a number >= 0")
    need(_is_num(cfg.train.warmup_ratio) and 0 <= cfg.train.warmup_ratio < 1, "train.warmup_ratio", "in [0, 1)")
    need(_is_num(cfg.train.min_lr_ratio) and 0 <= cfg.train.min_lr_ratio <= 1, "train.min_lr_ratio", "in [0, 1]")
    need(cfg.train.grad_clip is None or (_is_num(cfg.train.grad_clip) and cfg.train.grad_clip > 0),
         "train.grad_clip", "a positive number or null")
    betas = get("train.betas")
    need(betas is not None and len(betas) == 2 and all(_is_num(b) and 0 <= b < 1 for b in betas),
         "train.betas", "two numbers in [0, 1)")
    saves = get("train.save_steps")
    need(saves is not None and not isinstance(saves, (str, int)) and all(_is_int(s) and s > 0 for s in saves),
         "train.save_steps", "a list of positive integers, e.g. [50,100]")
    peak = get("train.peak_tflops")
    need(peak == "auto" or peak is None or (_is_num(peak) and peak > 0), "train.peak_tflops", "auto or a positive number")
    nproc = get("launcher.nproc")
    need(nproc == "auto" or (_is_int(nproc) and nproc > 0), "launcher.nproc", "auto or a positive integer")
    for key in ("launcher.partition", "launcher.time", "launcher.account"):
        need(get(key) is None or isinstance(get(key), (str, int)), key, "null or a string")
    need(get("launcher.setup") is None or isinstance(get("launcher.setup"), str), "launcher.setup",
         "null or a shell snippet")
    bad.extend(slurm_option_problems(get("launcher.sbatch")))
    for key in ("logging.project", "logging.entity", "logging.group", "logging.name"):
        need(get(key) is None or isinstance(get(key), str), key, "null or a string")
    tags = get("logging.tags")
    need(tags is not None and not isinstance(tags, str) and all(isinstance(t, (str, int)) for t in tags),
         "logging.tags", "a list of strings, e.g. [ablation,lr-sweep]")
    for key in ("data.sources.code", "data.sources.search"):
        srcs = get(key)
        ok = srcs is not None and not isinstance(srcs, str) and all(
            isinstance(s, str) and s.split(":", 1)[0] in SOURCE_FORMATS and ":" in s for s in srcs)
        need(ok, key, f"a list of FORMAT:PATH_OR_HUB_ID with FORMAT in {', '.join(SOURCE_FORMATS)}")
    if not bad:
        _check_consistency(cfg, bad)
    if bad:
        raise ConfigError("invalid config:\n  " + "\n  ".join(bad))


def _check_consistency(cfg: DictConfig, bad: list[str]) -> None:
    # save_steps beyond the horizon are not an error: `steps=4` with the default saves at 50..200
    # just saves the final step (planned_saves shows which remain).
    if cfg.data.max_seq_len > cfg.train.max_tokens_per_micro_batch:
        bad.append(f"data.max_seq_len={cfg.data.max_seq_len} exceeds train.max_tokens_per_micro_batch="
                   f"{cfg.train.max_tokens_per_micro_batch}: the trainer never splits a trajectory across "
                   "micro-batches, so the longest ones could not be trained; raise the budget or lower max_seq_len")
    if cfg.launcher.kind == "local" and cfg.launcher.nodes != 1:
        bad.append(f"launcher.nodes={cfg.launcher.nodes} needs launcher=slurm (the local launcher runs on this machine only)")
    if cfg.launcher.kind == "slurm" and cfg.resume == "never":
        bad.append("resume=never cannot be used with launcher=slurm: requeued segments resume from the latest state "
                   "(use a fresh run_dir instead)")
    if cfg.data.kind == "hub" and cfg.data.dir is None:
        need_code = cfg.arm != "search"
        need_search = cfg.arm in ("search", "mixed")
        if need_code and not cfg.data.sources.code:
            bad.append(f"arm={cfg.arm} with data.kind=hub needs data.sources.code (e.g. data=hub)")
        if need_search and not cfg.data.sources.search:
            bad.append(f"arm={cfg.arm} with data.kind=hub needs data.sources.search (e.g. data=hub)")


# ---------------------------------------------------------------- derived values
def run_dir(cfg: DictConfig) -> Path:
    """`<runs_root>/<arm>/[<name>/]seed<seed>` (common.layout) unless `run_dir` is set; absolute."""
    if cfg.run_dir:
        return Path(cfg.run_dir).expanduser().resolve()
    return run_dir_path(cfg.runs_root, cfg.arm, cfg.seed, cfg.name).resolve()


def planned_steps(cfg: DictConfig, n_rows: int | None = None) -> int:
    """Optimizer steps: `train.steps`, else epochs * floor(trajectories / global_batch_size) (a record
    split into several rows is one trajectory)."""
    if cfg.train.steps is not None:
        return int(cfg.train.steps)
    rows = cfg.data.n if n_rows is None else n_rows
    return int(cfg.train.epochs) * (int(rows) // int(cfg.train.global_batch_size))


def planned_saves(cfg: DictConfig, n_rows: int | None = None) -> list[int]:
    """Checkpoint steps: save_steps, every epoch end (save_epoch_ends) and the final step."""
    total = planned_steps(cfg, n_rows)
    per_epoch = (cfg.data.n if n_rows is None else n_rows) // cfg.train.global_batch_size
    saves = {s for s in cfg.train.save_steps if s <= total} | {total}
    if cfg.train.save_epoch_ends and per_epoch > 0:
        saves |= set(range(per_epoch, total + 1, per_epoch))
    return sorted(saves)
