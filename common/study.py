"""Study files (`recipes/study/<name>.yaml`, format in docs/studies.md): read, validate and resolve one
reference study (`load_study`); every stage argument carries a source mark (common.marks)."""
from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from common.cli import ConfigError, base60_problem, did_you_mean, shown
from common.fields import NONEMPTY, TEXT, Number, Test, is_int, list_of
from common.io import sha256_file
from common.layout import step_name
from common.marks import MARK_GRAMMAR, file_marks
from common.recipes import RECIPES

# `${step:N}` in a study file: the step directory name of step N (step-000100), spelled by common.layout.
# omegaconf < 2.4 deprecates register_resolver (no `replace`), 2.4 register_new_resolver.
if not OmegaConf.has_resolver("step"):
    (OmegaConf.register_resolver if "replace" in inspect.signature(OmegaConf.register_resolver).parameters
     else OmegaConf.register_new_resolver)("step", lambda n: step_name(int(n)))

STUDY_DIR = RECIPES / "study"
# The shipped variants, `study_names(VARIANT_DIR)`: this project's own comparisons beside a reference study, run by name.
VARIANT_DIR = STUDY_DIR / "variants"

# run kind -> the module its jobs run, `python -m MODULE CONFIG` (launch/study.py plans them; a training
# stage's under torchrun on each run's config.yaml).
RUNNERS = {"sft": "sft.train", "sweep": "sft.train", "grpo": "rl.train", "evaluate": "evals.cli",
           "analyze": "launch.analyze", "export": "sft.export"}
TRAINING_RUNS = ("sft", "sweep", "grpo")

_TEXT = Test(lambda v: v is None or isinstance(v, str), "be a string")
# A study file's top keys and what each must be (`study:` must name the file; a stage and a result are checked below).
TOP = {"study": None, "title": _TEXT, "reference": _TEXT,
       "hardware": Test(lambda v: isinstance(v, dict) and is_int(v.get("gpus")) and v["gpus"] >= 0,
                        "give `gpus:` (an integer >= 0) and the GPU kind"),
       # a name `${vars.NAME}` can refer to, and not one of the study command's own keys (it would take their value)
       "vars": Test(lambda v: v is None or (isinstance(v, dict) and all(isinstance(k, str) and re.fullmatch(r"[A-Za-z_]\w*", k)
                                                                      and k not in ("study", "smoke", "dry_run") for k in v)),
                    "be a mapping of name: value (names of letters, digits and '_', other than study, smoke and dry_run)"),
       "stages": list_of(lambda s: True, "be a non-empty list", size=bool),
       "reference_results": list_of(lambda r: True, "be a list of {system, bench, metric, ...} mappings", null=True),
       "cpu_smoke": list_of(lambda t: isinstance(t, str) and "=" in t, "be a list of key=value overrides", null=True),
       "notes": list_of(lambda t: isinstance(t, str) and t.strip() != "",
                        "be a list of sentences (what the study does not reproduce, and why)", null=True)}
STUDY_ENV = "DTSFT_STUDY"  # set by `launch study=` for its training runs: JSON {name, path, sha256}, in run manifests
_VAR_REF = re.compile(r"\$\{vars\.([A-Za-z_][A-Za-z0-9_]*)\}")


class StudyError(ConfigError):
    """A study file that cannot be run as written; the message names the file and the entry."""


@dataclass(frozen=True)
class Stage:
    name: str
    run: str
    args: dict
    arg_uses: dict = field(default_factory=dict)   # argument -> the study variables its value refers to


@dataclass(frozen=True)
class ReferenceResult:
    system: str
    bench: str
    metric: str
    n: int | None
    value: float | None = None    # a single reported number
    pre: float | None = None      # or a pre -> post pair
    post: float | None = None
    note: str | None = None
    arm: str | None = None        # where the measured twin is: the run arm (e.g. r2e, grpo_spa, anchor) ...
    step: int | None = None       # ... and step (value entries); pre/post entries compare step 0 with the final step


RESULT_KEYS = tuple(f.name for f in fields(ReferenceResult))   # a reference_results entry's keys
# What each key of an entry must be (system, bench and metric: required).
_RESULT_RULES = {**dict.fromkeys(("system", "bench", "metric"), NONEMPTY), **dict.fromkeys(("value", "pre", "post"), Number(null=True)),
                 "n": Number(lo=1, integer=True, null=True),
                 "step": Number(integer=True, null=True), "note": TEXT, "arm": Test(lambda v: v is None or isinstance(v, str), "a run arm name")}


@dataclass(frozen=True)
class Study:
    name: str
    path: Path
    sha256: str
    title: str
    hardware: dict
    stages: list[Stage]
    reference_results: list[ReferenceResult]
    vars: dict = field(default_factory=dict)
    cpu_smoke: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)     # what the study does not reproduce, and why
    chosen: list[tuple] = field(default_factory=list)  # (setting, value, reason) of each [chosen: ...] mark

    def differences(self) -> list[str]:
        """The study's "differs from the reference" lines: each `[chosen: ...]` setting with its reason, then each note."""
        return [f"{key} = {shown(value, dotlist=True)}: {reason}" for key, value, reason in self.chosen] + list(self.notes)

    def unset(self, stage: Stage | None = None) -> list[str]:
        """Variables still null that `stage` (or any stage) needs: the data slots a user must fill."""
        uses = [v for s in ([stage] if stage else self.stages) for names in s.arg_uses.values() for v in names]
        return [v for v in (dict.fromkeys(uses) if stage else sorted(set(uses))) if self.vars.get(v) is None]

    def substitute(self, text: str, where: str) -> str:
        """`text` (a command-line token) with each `${vars.X}` replaced by the study's value of X."""
        def value(m: re.Match) -> str:
            if m.group(1) not in self.vars:
                raise StudyError(f"{where}: no study variable {m.group(1)!r}; variables: {', '.join(self.vars) or 'none'}."
                                 f"{did_you_mean(m.group(1), self.vars)}")
            return shown(self.vars[m.group(1)], dotlist=True)
        return _VAR_REF.sub(value, text)


def study_names(folder: Path = STUDY_DIR) -> list[str]:
    """The shipped reference studies (recipes/study/NAME.yaml), one per reference system (`folder`: its studies)."""
    return sorted(p.stem for p in folder.glob("*.yaml"))


def _reference_result(entry, w: str) -> ReferenceResult:
    if not isinstance(entry, dict):
        raise StudyError(f"{w}: expected a mapping, found {entry!r}")
    for key in sorted(set(entry) - set(RESULT_KEYS)):
        raise StudyError(f"{w}: unknown key {key!r}; keys: {', '.join(RESULT_KEYS)}.{did_you_mean(key, RESULT_KEYS)}")
    for key, why in ((k, rule.why(entry.get(k))) for k, rule in _RESULT_RULES.items()):
        if why:
            raise StudyError(f"{w}.{key}: expected {why}, found {entry.get(key)!r}")
    if entry.get("value") is None and None in (entry.get("pre"), entry.get("post")) and entry.get("note") is None:
        raise StudyError(f"{w}: give `value`, or `pre` and `post`, or a `note` saying why no number was published")
    return ReferenceResult(**{k: entry.get(k) for k in RESULT_KEYS})


def load_study(spec: str, *, variables: dict | None = None) -> Study:
    """Read and validate a study file (`spec`: a shipped study's name, a variant's too, or a path); `${vars.X}` resolved,
    with `variables` (some of its `vars:`) winning."""
    if (given := Path(spec)).suffix in (".yaml", ".yml") or given.exists():
        if not given.is_file():
            raise StudyError(f"study={spec}: no such study file")
        path = given.resolve()
    elif (path := next((p for p in (STUDY_DIR / f"{spec}.yaml", VARIANT_DIR / f"{spec}.yaml") if p.is_file()), None)) is None:
        names = study_names() + study_names(VARIANT_DIR)
        raise StudyError(f"study={spec}: no such study; shipped studies: {', '.join(names)}.{did_you_mean(spec, names)}")
    where = str(path)
    try:
        cfg = OmegaConf.load(path)
    except (OmegaConfBaseException, OSError, ValueError, yaml.YAMLError) as exc:
        raise StudyError(f"{where}: not a readable study file ({type(exc).__name__}: {str(exc).splitlines()[0]})") from exc
    if not isinstance(cfg, DictConfig):
        raise StudyError(f"{where}: expected a mapping at the top level")
    for key in sorted(set(cfg.keys()) - set(TOP)):
        raise StudyError(f"{where}: unknown key {key!r}; keys: {', '.join(TOP)}.{did_you_mean(key, TOP)}")
    if cfg.get("study") != path.stem:
        raise StudyError(f"{where}: `study:` must name the file ({path.stem!r}), found {cfg.get('study')!r}")
    if why := base60_problem(path):
        raise StudyError(why)
    marked, unmarked = file_marks(path)   # a malformed mark: refused here, naming its line
    if unmarked:
        raise StudyError(f"{where}: every stage argument says where its value comes from ({MARK_GRAMMAR} "
                         f"in a comment); unmarked: {'; '.join(unmarked[:3])}")
    raw = OmegaConf.to_container(cfg, resolve=False)
    if not TOP["vars"].ok(raw.get("vars")):   # before `${vars.X}` is resolved through it
        raise StudyError(f"{where}: `vars:` must {TOP['vars'].what}")
    for key, value in (variables or {}).items():
        cfg.vars[key] = value
    try:
        plain = OmegaConf.to_container(cfg, resolve=True)
    except (OmegaConfBaseException, RecursionError) as exc:   # RecursionError: a variable that names itself
        if at := re.fullmatch(r"stages\[(\d+)\]\.args\.(.+)", getattr(exc, "full_key", None) or ""):   # the stage, key and variables
            stage, key = raw["stages"][int(at[1])], at[2]
            uses = ", ".join(f"{v}={shown(cfg.vars.get(v), dotlist=True)}" for v in _VAR_REF.findall(str(stage["args"][key])))
            where += f": stage {stage.get('name')}, {key}" + (f" (with {uses})" if uses else "")
        raise StudyError(f"{where}: {type(exc).__name__}: {str(exc).splitlines()[0]}") from exc
    for key, rule in TOP.items():
        if rule is not None and not rule.ok(plain.get(key)):
            raise StudyError(f"{where}: `{key}:` must {rule.what}")
    stages = []
    for i, s in enumerate(plain["stages"]):
        w = f"{where}: stages[{i}]"
        if not isinstance(s, dict) or set(s) - {"name", "run", "args"} or not isinstance(s.get("name"), str):
            raise StudyError(f"{w}: expected {{name: ..., run: ..., args: {{...}}}}, found {s!r}")
        if not re.fullmatch(r"[A-Za-z0-9][\w-]*", s["name"]):
            raise StudyError(f"{w}: stage name {s['name']!r}: letters, digits, '_' and '-' (a command line targets it as "
                             "NAME:key=value)")
        if s["name"] in (st.name for st in stages):
            raise StudyError(f"{w}: stage name {s['name']!r} is used twice")
        if str(s.get("run")) not in RUNNERS:   # (str: a list is no run either)
            raise StudyError(f"{w} ({s['name']}): run={s.get('run')!r} is not one of {', '.join(RUNNERS)}."
                             f"{did_you_mean(str(s.get('run')), RUNNERS)}")
        if not isinstance(s.get("args") or {}, dict):
            raise StudyError(f"{w} ({s['name']}): args must be a mapping of key: value")
        if "dry_run" in (s.get("args") or {}):
            raise StudyError(f"{w} ({s['name']}): args set dry_run, which the command line gives every stage (dry_run=true)")
        unresolved = raw["stages"][i] if isinstance(raw["stages"], list) and isinstance(raw["stages"][i], dict) else {}
        raw_args = unresolved["args"] if isinstance(unresolved.get("args"), dict) else {}   # `${vars.X}` kept: what each uses
        stages.append(Stage(s["name"], s["run"], s.get("args") or {}, {k: tuple(_VAR_REF.findall(str(v))) for k, v in raw_args.items()}))
    return Study(name=path.stem, path=path, sha256=sha256_file(path), title=plain.get("title") or path.stem, hardware=plain["hardware"],
                 stages=stages, reference_results=[_reference_result(e, f"{where}: reference_results[{i}]")
                                                   for i, e in enumerate(plain.get("reference_results") or [])],
                 vars=plain.get("vars") or {}, cpu_smoke=plain.get("cpu_smoke") or [],
                 notes=[" ".join(t.split()) for t in plain.get("notes") or []],
                 chosen=[(m.key, m.value, k.text) for m in marked for k in m.marks if k.kind == "chosen"])
