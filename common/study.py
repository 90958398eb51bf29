"""Study files (`recipes/study/<name>.yaml`, format in docs/studies.md): read, validate and resolve one
reference study (`load_study`), and the source marks (`MARK_GRAMMAR`) its lines and the recipes carry."""
from __future__ import annotations

import inspect
import json
import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from common.cli import ConfigError, base60_problem, did_you_mean
from common.fields import TEXT, Number, Test, is_int, list_of
from common.io import sha256_file
from common.keydoc import shown
from common.layout import step_name
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
# The published reference descriptions a `[ref: NAME "quote"]` mark cites: short name -> the stem of the
# file holding its verbatim text (the tests check every quote against those texts; no code path reads them).
REFERENCES = {
    "spa-qwen3": "000_22b5f0c70c8f1d9b",        # Qwen3-4B GRPO on search_plan_act
    "browsecomp": "001_c801f41fe641ead1",       # Qwen3-4B BrowseComp worker RL checkpoint 129 (its export)
    "spa-llama": "002_4ccbda37e769810e",        # Llama-3.1-8B-Instruct GRPO on search_plan_act
    "dual-terminator": "003_cb6b241bff573a7e",  # dual-terminator SFT of Qwen3-4B-Thinking-2507
    "multihop": "004_6d4cea1d81f9c1b7",         # Qwen3-4B multi-hop QA, SFT then GRPO
}
MARK_GRAMMAR = '[ref: <reference> "<verbatim quote>"] or [chosen: <reason>]'
_MARK = re.compile(r'\[ref:[ \t]*(?P<ref>[\w-]+)[ \t]+"(?P<quote>[^"]+)"[ \t]*\]'
                   r"|\[chosen:[ \t]*(?P<reason>[^\]]*[^\]\s])[ \t]*\]")
_MARK_START = re.compile(r"\[(?:ref|chosen)\b")
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
# What an entry's optional keys must be (system, bench and metric: required strings).
_RESULT_RULES = {**dict.fromkeys(("value", "pre", "post"), Number(null=True)), "n": Number(lo=1, integer=True, null=True),
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


def study_path(spec: str) -> Path:
    """A shipped study's name (a variant's too), or a path to a study file."""
    p = Path(spec)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.is_file():
            raise StudyError(f"study={spec}: no such study file")
        return p.resolve()
    for shipped in (STUDY_DIR / f"{spec}.yaml", VARIANT_DIR / f"{spec}.yaml"):
        if shipped.is_file():
            return shipped
    names = study_names() + study_names(VARIANT_DIR)
    raise StudyError(f"study={spec}: no such study; shipped studies: {', '.join(names)}.{did_you_mean(spec, names)}")


def _last_line(node) -> int:
    """The last line (0-based) holding part of a YAML node: a flow collection ends at its bracket, a
    block one with its last child, a block scalar (`|`) on the line before its end mark."""
    if isinstance(node, yaml.ScalarNode):
        end = node.end_mark
        return end.line - 1 if end.column == 0 and end.line > node.start_mark.line else end.line
    if node.flow_style or not node.value:
        return node.end_mark.line
    children = node.value if isinstance(node, yaml.SequenceNode) else [n for kv in node.value for n in kv]
    return max(_last_line(c) for c in children)


@dataclass(frozen=True)
class Mark:
    """One source mark (`MARK_GRAMMAR`) on line `line` (1-based) of a file."""
    line: int
    kind: str                    # "ref" | "chosen"
    text: str                    # the verbatim quote (ref) or the reason (chosen)
    reference: str | None = None  # ref: a key of REFERENCES


@dataclass(frozen=True)
class MarkedSetting:
    """A setting of a YAML file and the marks on the lines it spans (its key's line to its value's end)."""
    key: str       # dotted (train.save_steps); a study's stage argument is STAGE:key (train:task)
    value: object  # as YAML reads it, unresolved (${vars.X} kept)
    marks: tuple[Mark, ...]


def line_marks(text: str, where: str, line: int) -> list[Mark]:
    """The marks on one line of file `where`; anything opening like a mark (`[ref`, `[chosen`) that is not
    one of the grammar, or a `[ref: NAME ...]` naming no reference, is refused with the file and line."""
    marks, end = [], 0
    for start in _MARK_START.finditer(text):
        if start.start() < end:
            continue   # inside the quote or reason of a mark already read
        m = _MARK.match(text, start.start())
        if m is None:
            close = text.find("]", start.start())
            found = text[start.start():close + 1 if close >= 0 else None].strip()
            raise StudyError(f"{where}:{line}: {found!r} is not a source mark: write {MARK_GRAMMAR} (a bare "
                             "[ref] or [chosen] says neither which reference states the value nor why it was chosen)")
        if m.group("ref") is not None and m.group("ref") not in REFERENCES:
            raise StudyError(f"{where}:{line}: [ref: {m.group('ref')} ...] names no reference; references: "
                             f"{', '.join(REFERENCES)}.{did_you_mean(m.group('ref'), REFERENCES)}")
        marks.append(Mark(line, "ref" if m.group("ref") else "chosen", m.group("quote") or m.group("reason"), m.group("ref")))
        end = m.end()
    return marks


def _settings(node, prefix: str = ""):
    """(key, first line, last line, value node) of every setting: each entry of a block mapping whose value
    is not itself a block mapping, and each argument of a study's stages (block or flow style)."""
    for k, v in node.value if isinstance(node, yaml.MappingNode) else []:
        key = f"{prefix}{k.value}"
        if key == "stages" and isinstance(v, yaml.SequenceNode):
            for stage in v.value:
                entries = stage.value if isinstance(stage, yaml.MappingNode) else []
                parts = {kn.value: vn for kn, vn in entries if isinstance(kn, yaml.ScalarNode)}
                args = parts.get("args")
                for ak, av in args.value if isinstance(args, yaml.MappingNode) else []:
                    yield f"{getattr(parts.get('name'), 'value', '?')}:{ak.value}", ak.start_mark.line, _last_line(av), av
        elif isinstance(v, yaml.MappingNode) and not v.flow_style and v.value:
            yield from _settings(v, f"{key}.")
        else:
            yield key, k.start_mark.line, _last_line(v), v


def file_marks(path: Path) -> tuple[list[MarkedSetting], list[str]]:
    """Every marked setting of a YAML file (a study or a recipe), in file order, and its stage argument lines (key to value's
    end) that hold more than a comment and no mark. A mark goes with the setting whose key is on its line, else with the
    one whose value spans it; one on a line holding no setting is refused (in prose it says nothing checkable)."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    try:
        settings = list(_settings(yaml.compose(text, Loader=yaml.SafeLoader)))
    except yaml.YAMLError:   # not readable YAML: no settings (load_study names the error)
        settings = []
    found: dict[int, list[Mark]] = {}
    for i, line in enumerate(lines):
        if marks := line_marks(line, str(path), i + 1):
            owner = next((s for s in settings if s[1] == i), None) or next((s for s in settings if s[1] <= i <= s[2]), None)
            if owner is None:
                raise StudyError(f"{path}:{i + 1}: a source mark on a line that holds no setting; marks go on the "
                                 f"setting's own line ({MARK_GRAMMAR})")
            found.setdefault(settings.index(owner), []).extend(marks)
    marked = [MarkedSetting(settings[n][0], yaml.SafeLoader("").construct_document(settings[n][3]), tuple(found[n]))
              for n in sorted(found)]
    bad: dict[int, str] = {}
    keys_on: dict[int, list[str]] = {}
    for key, first, last, _ in (s for s in settings if ":" in s[0]):
        keys_on.setdefault(first, []).append(key.partition(":")[2])
        for i in range(first, max(first, last) + 1):
            stripped = lines[i].strip()
            if stripped and not stripped.startswith("#") and not _MARK.search(lines[i]):
                bad.setdefault(i, f"line {i + 1}: {stripped}")
    for i, keys in keys_on.items():
        if len(keys) > 1 and i not in bad:
            bad[i] = (f"line {i + 1}: {len(keys)} arguments ({', '.join(keys)}) share one line, and one mark "
                      "cannot say where each comes from: put each on its own line")
    return marked, [bad[i] for i in sorted(bad)]


def _reference_results(raw, where: str) -> list[ReferenceResult]:
    out = []
    for i, entry in enumerate(raw or []):
        w = f"{where}: reference_results[{i}]"
        if not isinstance(entry, dict):
            raise StudyError(f"{w}: expected a mapping, found {entry!r}")
        for key in sorted(set(entry) - set(RESULT_KEYS)):
            raise StudyError(f"{w}: unknown key {key!r}; keys: {', '.join(RESULT_KEYS)}.{did_you_mean(key, RESULT_KEYS)}")
        for key in ("system", "bench", "metric"):
            if not isinstance(entry.get(key), str) or not entry[key]:
                raise StudyError(f"{w}: `{key}` is required (a string)")
        for key, why in ((k, rule.why(entry.get(k))) for k, rule in _RESULT_RULES.items()):
            if why:
                raise StudyError(f"{w}.{key}: expected {why}, found {entry[key]!r}")
        if entry.get("value") is None and None in (entry.get("pre"), entry.get("post")) and entry.get("note") is None:
            raise StudyError(f"{w}: give `value`, or `pre` and `post`, or a `note` saying why no number was published")
        out.append(ReferenceResult(**{k: entry.get(k) for k in RESULT_KEYS}))
    return out


def study_from_env() -> dict | None:
    """The study a `launch study=` stage runs under (None outside one)."""
    raw = os.environ.get(STUDY_ENV)
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return {"unreadable": raw}


def load_study(spec: str, *, variables: dict | None = None) -> Study:
    """Read and validate a study file; `${vars.X}` resolved, with `variables` (some of its `vars:`) winning."""
    path = study_path(spec)
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
    return Study(name=path.stem, path=path, sha256=sha256_file(path), title=plain.get("title") or path.stem,
                 hardware=plain["hardware"], stages=stages, reference_results=_reference_results(plain.get("reference_results"), where),
                 vars=plain.get("vars") or {}, cpu_smoke=plain.get("cpu_smoke") or [],
                 notes=[" ".join(t.split()) for t in plain.get("notes") or []],
                 chosen=[(m.key, m.value, k.text) for m in marked for k in m.marks if k.kind == "chosen"])
