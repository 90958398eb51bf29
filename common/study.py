"""Study files (`recipes/study/<name>.yaml`): one reference study, end to end.

A study file names its stages in order and, for each, the command it runs and that command's own
`key=value` arguments; it names recipes (model=, arm=, profile=) and never restates their values.
Every argument line carries its source in a comment: `[ref]` (stated by the reference system) or
`[chosen]` (this project's, with a one-line reason). Beside the stages: the hardware the reference
assumed, `reference_results` (the published numbers, shown beside ours by `analyze study=NAME`,
never mixed into a measured cell or a CI) and `cpu_smoke` (the overrides that run the whole study on
one CPU with the tiny model: what the tests run).

    study: NAME                      # = the file's stem
    title: ...
    reference: ...                   # the reference system(s), as published
    hardware: {gpus: 4, gpu: GH200, nodes: 1}
    vars: {runs_root: runs/NAME, reports: reports/NAME}   # ${vars.X} in any argument
    stages:
      - {name: train, run: grpo, args: {task: spa, model: qwen3_4b, ...}}
      - {name: report, run: analyze, args: {runs_root: "${vars.runs_root}", profile: rl_ood, ...}}
    reference_results:
      - {system: ..., bench: musique, metric: em, n: 2417, pre: 0.316, post: 0.316}
    cpu_smoke: [model=tiny_base, "train:steps=2", ...]

This module owns the format (read, validate, resolve); `launch study=NAME` runs it and `analyze
study=NAME` shows its reference results. Both read it through `load_study`.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from common.cli import ConfigError, did_you_mean
from common.io import sha256_file
from common.layout import step_name

# `${step:N}` in a study file: the step directory name of step N (step-000100), spelled by common.layout.
def _register_step_resolver() -> None:
    import inspect

    register = OmegaConf.register_resolver
    if "replace" not in inspect.signature(register).parameters:  # omegaconf < 2.4: the old call is deprecated
        register = OmegaConf.register_new_resolver
    if not OmegaConf.has_resolver("step"):
        register("step", lambda n: step_name(int(n)))


_register_step_resolver()

STUDY_DIR = Path(__file__).resolve().parents[1] / "recipes" / "study"

# run kind -> (python module, leading arguments): every stage runs as `python -m MODULE ...` in a
# child process (the console entry points' modules), so launch imports no later stage.
RUNNERS = {
    "sft": ("launch.cli", ()),
    "sweep": ("launch.cli", ("sweep",)),
    "grpo": ("launch.cli", ("stage=grpo",)),
    "evaluate": ("evals.cli", ()),
    "analyze": ("analysis.cli", ()),
    "export": ("sft.export", ()),
}
TRAINING_RUNS = ("sft", "sweep", "grpo")
TOP_KEYS = ("study", "title", "reference", "hardware", "vars", "stages", "reference_results", "cpu_smoke", "notes")
RESULT_KEYS = ("system", "bench", "metric", "n", "value", "pre", "post", "note", "arm", "step")
SOURCE_MARKS = ("[ref]", "[chosen]")
STUDY_ENV = "DTSFT_STUDY"  # set by `launch study=` for its stages: JSON {name, path, sha256}, recorded in run manifests
_VAR_REF = re.compile(r"\$\{vars\.([A-Za-z_][A-Za-z0-9_]*)\}")


class StudyError(ConfigError):
    """A study file that cannot be run as written; the message names the file and the entry."""


@dataclass(frozen=True)
class Stage:
    name: str
    run: str
    args: dict
    uses: tuple[str, ...] = ()   # the study variables its arguments refer to

    def argv(self, extra: list[str] = ()) -> list[str]:
        """The stage's command-line tokens (after the runner's leading ones), `extra` last so it wins."""
        return [f"{k}={format_value(v)}" for k, v in self.args.items()] + list(extra)


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


@dataclass(frozen=True)
class Study:
    name: str
    path: Path
    sha256: str
    title: str
    reference: str
    hardware: dict
    stages: list[Stage]
    reference_results: list[ReferenceResult]
    vars: dict = field(default_factory=dict)
    cpu_smoke: list[str] = field(default_factory=list)

    def unset(self, stage: Stage | None = None) -> list[str]:
        """Variables still null that `stage` (or any stage) needs: the data slots a user must fill."""
        used = stage.uses if stage else sorted({v for s in self.stages for v in s.uses})
        return [v for v in used if self.vars.get(v) is None]

    def identity(self) -> dict:
        """What a run manifest and a report record of the study that made them."""
        return {"name": self.name, "path": str(self.path), "sha256": self.sha256}

    def substitute(self, text: str, where: str) -> str:
        """`text` (a command-line token) with each `${vars.X}` replaced by the study's value of X."""
        def value(m: re.Match) -> str:
            if m.group(1) not in self.vars:
                raise StudyError(f"{where}: no study variable {m.group(1)!r}; variables: {', '.join(self.vars) or 'none'}."
                                 f"{did_you_mean(m.group(1), self.vars)}")
            return format_value(self.vars[m.group(1)])
        return _VAR_REF.sub(value, text)


def format_value(v) -> str:
    """A Python value as an omegaconf dotlist value (`[a,b]`, `{k:v}`, `null`, `true`)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(format_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{format_value(x)}" for k, x in v.items()) + "}"
    return str(v)


def study_names() -> list[str]:
    return sorted(p.stem for p in STUDY_DIR.glob("*.yaml"))


def study_path(spec: str) -> Path:
    """A shipped study's name, or a path to a study file."""
    p = Path(spec)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.is_file():
            raise StudyError(f"study={spec}: no such study file")
        return p.resolve()
    shipped = STUDY_DIR / f"{spec}.yaml"
    if not shipped.is_file():
        raise StudyError(f"study={spec}: no such study; shipped studies: {', '.join(study_names())}."
                         f"{did_you_mean(spec, study_names())}")
    return shipped


def _last_line(node) -> int:
    """The last line (0-based) holding part of a YAML node: a flow collection ends at its bracket, a
    block one with its last child, a block scalar (`|`) on the line before its end mark."""
    import yaml

    if isinstance(node, yaml.ScalarNode):
        end = node.end_mark
        return end.line - 1 if end.column == 0 and end.line > node.start_mark.line else end.line
    if node.flow_style or not node.value:
        return node.end_mark.line
    children = node.value if isinstance(node, yaml.SequenceNode) else [n for kv in node.value for n in kv]
    return max(_last_line(c) for c in children)


def _unmarked_arg_lines(path: Path) -> list[str]:
    """The stage argument lines without a source mark. Each argument of a stage's `args:` mapping,
    block or flow style (`- {name: ..., run: ..., args: {task: spa, ...}}`), spans the lines from its
    key to the end of its value; each of them holding more than a comment needs a mark, and two
    arguments on one line are refused (one mark cannot say where each comes from)."""
    import yaml

    text = path.read_text(encoding="utf-8")
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return []   # not readable YAML: load_study names the error
    lines = text.splitlines()

    def value_of(node, key: str):
        if isinstance(node, yaml.MappingNode):
            return next((v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == key), None)
        return None

    stages = value_of(root, "stages")
    bad: dict[int, str] = {}
    for stage in stages.value if isinstance(stages, yaml.SequenceNode) else []:
        args = value_of(stage, "args")
        if not isinstance(args, yaml.MappingNode):
            continue   # not a mapping: load_study names it
        keys_on: dict[int, list[str]] = {}
        for key, value in args.value:
            first = key.start_mark.line
            keys_on.setdefault(first, []).append(str(key.value))
            for i in range(first, max(first, _last_line(value)) + 1):
                stripped = lines[i].strip()
                if stripped and not stripped.startswith("#") and not any(m in lines[i] for m in SOURCE_MARKS):
                    bad.setdefault(i, f"line {i + 1}: {stripped}")
        for i, keys in keys_on.items():
            if len(keys) > 1 and i not in bad:
                bad[i] = (f"line {i + 1}: {len(keys)} arguments ({', '.join(keys)}) share one line, and one mark "
                          "cannot say where each comes from: put each on its own line")
    return [bad[i] for i in sorted(bad)]


def _number(v, where: str, *, integer: bool = False):
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int)):
        raise StudyError(f"{where}: expected {'an integer' if integer else 'a number'}, found {v!r}")
    if not integer and not math.isfinite(v):
        raise StudyError(f"{where}: expected a finite number, found {v!r}")
    return v


def _reference_results(raw, where: str) -> list[ReferenceResult]:
    out = []
    for i, entry in enumerate(raw or []):
        w = f"{where}: reference_results[{i}]"
        if not isinstance(entry, dict):
            raise StudyError(f"{w}: expected a mapping, found {entry!r}")
        unknown = sorted(set(entry) - set(RESULT_KEYS))
        if unknown:
            raise StudyError(f"{w}: unknown key {unknown[0]!r}; keys: {', '.join(RESULT_KEYS)}."
                             f"{did_you_mean(unknown[0], RESULT_KEYS)}")
        for key in ("system", "bench", "metric"):
            if not isinstance(entry.get(key), str) or not entry[key]:
                raise StudyError(f"{w}: `{key}` is required (a string)")
        vals = {k: _number(entry.get(k), f"{w}.{k}") for k in ("value", "pre", "post")}
        if vals["value"] is None and None in (vals["pre"], vals["post"]) and entry.get("note") is None:
            raise StudyError(f"{w}: give `value`, or `pre` and `post`, or a `note` saying why no number was published")
        if entry.get("arm") is not None and not isinstance(entry["arm"], str):
            raise StudyError(f"{w}.arm: expected a run arm name, found {entry['arm']!r}")
        out.append(ReferenceResult(system=entry["system"], bench=entry["bench"], metric=entry["metric"],
                                   n=_number(entry.get("n"), f"{w}.n", integer=True), note=entry.get("note"),
                                   arm=entry.get("arm"), step=_number(entry.get("step"), f"{w}.step", integer=True), **vals))
    return out


def study_from_env() -> dict | None:
    """The study a `launch study=` stage runs under (None outside one)."""
    import json
    import os

    raw = os.environ.get(STUDY_ENV)
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return {"unreadable": raw}


def study_variables(spec: str) -> list[str]:
    """The names under `vars:` (before anything is resolved): what `NAME=value` on the command line sets."""
    try:
        cfg = OmegaConf.load(study_path(spec))
    except (OmegaConfBaseException, OSError, ValueError):
        return []
    return list(cfg.get("vars") or {}) if isinstance(cfg, DictConfig) else []


def load_study(spec: str, *, variables: dict | None = None) -> Study:
    """Read and validate a study file; `${vars.X}` in stage arguments resolved (with `variables` winning)."""
    path = study_path(spec)
    where = str(path)
    try:
        cfg = OmegaConf.load(path)
    except (OmegaConfBaseException, OSError, ValueError) as exc:  # YAML errors are ValueErrors here
        raise StudyError(f"{where}: not a readable study file ({type(exc).__name__}: {str(exc).splitlines()[0]})") from exc
    if not isinstance(cfg, DictConfig):
        raise StudyError(f"{where}: expected a mapping at the top level")
    unknown = sorted(set(cfg.keys()) - set(TOP_KEYS))
    if unknown:
        raise StudyError(f"{where}: unknown key {unknown[0]!r}; keys: {', '.join(TOP_KEYS)}.{did_you_mean(unknown[0], TOP_KEYS)}")
    if cfg.get("study") != path.stem:
        raise StudyError(f"{where}: `study:` must name the file ({path.stem!r}), found {cfg.get('study')!r}")
    unmarked = _unmarked_arg_lines(path)
    if unmarked:
        raise StudyError(f"{where}: every stage argument says where its value comes from ({' or '.join(SOURCE_MARKS)} "
                         f"in a comment); unmarked: {'; '.join(unmarked[:3])}")
    for key, value in (variables or {}).items():
        if key not in (cfg.get("vars") or {}):
            raise StudyError(f"{where}: {key}= is not a variable of this study; variables: "
                             f"{', '.join(cfg.get('vars') or {}) or 'none'}.{did_you_mean(key, list(cfg.get('vars') or {}))}")
        cfg.vars[key] = value
    raw_stages = OmegaConf.to_container(cfg, resolve=False).get("stages") or []
    try:
        plain = OmegaConf.to_container(cfg, resolve=True)
    except (OmegaConfBaseException, RecursionError) as exc:   # RecursionError: a variable that names itself
        raise StudyError(f"{where}: {type(exc).__name__}: {str(exc).splitlines()[0]}") from exc
    stages_raw = plain.get("stages")
    if not isinstance(stages_raw, list) or not stages_raw:
        raise StudyError(f"{where}: `stages:` must be a non-empty list")
    stages, seen = [], set()
    for i, s in enumerate(stages_raw):
        w = f"{where}: stages[{i}]"
        if not isinstance(s, dict) or set(s) - {"name", "run", "args"} or not isinstance(s.get("name"), str):
            raise StudyError(f"{w}: expected {{name: ..., run: ..., args: {{...}}}}, found {s!r}")
        if s["name"] in seen:
            raise StudyError(f"{w}: stage name {s['name']!r} is used twice")
        seen.add(s["name"])
        if s.get("run") not in RUNNERS:
            raise StudyError(f"{w} ({s['name']}): run={s.get('run')!r} is not one of {', '.join(RUNNERS)}."
                             f"{did_you_mean(str(s.get('run')), RUNNERS)}")
        args = s.get("args") or {}
        if not isinstance(args, dict):
            raise StudyError(f"{w} ({s['name']}): args must be a mapping of key: value")
        raw = raw_stages[i] if i < len(raw_stages) else {}
        uses = tuple(dict.fromkeys(_VAR_REF.findall(str(raw.get("args") if isinstance(raw, dict) else ""))))
        stages.append(Stage(name=s["name"], run=s["run"], args=args, uses=uses))
    hardware = plain.get("hardware") or {}
    if not isinstance(hardware, dict) or not isinstance(hardware.get("gpus"), int):
        raise StudyError(f"{where}: `hardware:` must give `gpus:` (an integer) and the GPU kind")
    smoke = plain.get("cpu_smoke") or []
    if not isinstance(smoke, (list, ListConfig)) or not all(isinstance(t, str) and "=" in t for t in smoke):
        raise StudyError(f"{where}: `cpu_smoke:` must be a list of key=value overrides")
    return Study(name=path.stem, path=path, sha256=sha256_file(path), title=str(plain.get("title") or path.stem),
                 reference=str(plain.get("reference") or ""), hardware=hardware, stages=stages,
                 reference_results=_reference_results(plain.get("reference_results"), where),
                 vars=dict(plain.get("vars") or {}), cpu_smoke=list(smoke))
