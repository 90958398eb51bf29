"""Typed config fields (common.fields): each key defined once, with its default, rule, help and roles;
evaluate's keys are the first table on them, and analyze's `eval.*` keys are the same field objects."""
from __future__ import annotations

from omegaconf import OmegaConf

from common import fields
from evals.config import DEFAULTS, KEYS as EVALUATE


def test_every_evaluate_and_analyze_key_is_one_field_with_help():
    from launch.analyze import KEYS as ANALYZE

    assert all(isinstance(f, fields.Field) and f.help.strip() for f in EVALUATE.values())
    passed = {k: f for k, f in ANALYZE.items() if k.startswith("eval.")}
    assert passed and all(isinstance(f, fields.Default) and f.owner == "evaluate" for f in passed.values())
    # the same objects, not copies: a rule or help changed in evals/config.py is analyze's too
    assert all(f.field is EVALUATE[k.removeprefix("eval.")] for k, f in passed.items())
    # unset by default (evaluate's default or the profile's applies), except the runs' prompt
    assert {k: f.default for k, f in passed.items()} == {**{k: None for k in passed}, "eval.prompt": "tool_agent"}
    # analyze's slurm.KEY are launch's launcher.KEY fields (common.schema), under analyze's own names
    from common.schema import LAUNCHER

    assert all(ANALYZE[f"slurm.{k}"] is LAUNCHER[f"launcher.{k}"] for k in ("partition", "time", "account", "qos", "sbatch", "setup"))
    # no key is described twice: analyze's eval.n line is evaluate's n line
    assert EVALUATE["n"].help in ANALYZE["eval.n"].help


def test_the_rules_refuse_what_a_key_cannot_be():
    cfg = OmegaConf.create({**DEFAULTS, "topk": 2.5, "backend": "vlm", "retriever": "e55", "enforce_eager": 1,
                            "prefix_caching": "yes", "gpu_memory_utilization": 1.5, "babyai_max_steps": None,
                            "enable_thinking": "maybe", "corpus": 3})
    assert sorted(fields.problems(EVALUATE, cfg)) == sorted([
        "retriever='e55': expected bm25, e5 or http. Did you mean: e5?", "corpus=3: expected a string (or null)",
        "topk=2.5: expected a positive integer", "backend='vlm': expected hf or vllm",
        "enable_thinking='maybe': expected auto, true or false", "gpu_memory_utilization=1.5: expected in (0, 1] (or auto)",
        "enforce_eager=1: expected auto, true or false", "prefix_caching='yes': expected true or false"])
    assert fields.problems(EVALUATE, OmegaConf.create(DEFAULTS)) == []


def test_the_roles_decide_what_enters_an_evaluation_identity():
    """A key without the identity roles (batch_size, driver) leaves a bench's identity as it is; one with
    IDENTITY (max_turns) changes it; an ENGINE key enters as the engine setting it resolves to."""
    from evals.identity import bench_identity

    def digest(**over):
        conf = {**DEFAULTS, "ckpt": "m", "out": "o", **over}
        return bench_identity("nq", conf, {"kind": "hub", "repo": "m", "revision": None}, n=5, seed=42,
                              source="nq:hub")["fingerprint"]

    base = digest()
    assert digest(batch_size=3, driver="lockstep", progress=False, out="elsewhere") == base
    assert digest(max_turns=3) != base and digest(prompt="anchor_nudge") != base
    operational = [k for k, f in EVALUATE.items() if not f.roles & {fields.IDENTITY, fields.CONTENT, fields.ENGINE}]
    assert "batch_size" in operational and "max_turns" not in operational


# Key names that mean a different key in each command that has one (not a copy of one definition).
OTHER_KEYS = {
    "seed": "what is seeded differs: a run's training, a build's record order, evaluate's item shuffle",
    "train.steps": "GRPO's steps are a positive count; SFT's may be null (epochs x steps per epoch)",
    "runs_root": "launch writes the runs there; analyze discovers them there (its default and help say so)",
    "tokenizer": "the tokenizer data-prep renders with, evaluate's override of the checkpoint's, export's source",
    "out": "each command's own output", "overwrite": "each command's own output, renamed aside",
    "dry_run": "what each command prints instead of working", "n": "records per arm, held out per domain, items per bench",
    "heldout": "a held-out dir left out of an arm, checked against training sets, or scored by evaluate",
    "ckpt": "evaluate takes a model dir; export also a run or state dir", "benches": "evaluate's list; analyze's (null: the profile's)",
    "profile": "evaluate runs one; analyze reads and writes the profile's eval dirs",
    "retriever": "serve-retriever serves bm25 or e5; evaluate also calls one over http",
    "dtype": "evaluate's compute dtype; export's weights dtype", "wandb": "evaluate's eval run; analyze's results table",
    "study": "analyze shows its reference results; export lists its notes",
}


def definition_problems(tables: dict[str, dict], other_keys=()) -> list[str]:
    """What is wrong with how `tables` ({command: {key: entry}}) define their keys, one line each: an entry
    without help; two distinct definitions with the same help (a copy); a key name two commands define
    separately (not one field object, held as it is or through `Default`), unless it is in
    `other_keys` (a name that means a different key per command); an entry that is not a field."""
    out, seen_help, by_name = [], {}, {}
    for command, table in tables.items():
        for key, entry in table.items():
            if not isinstance(entry, (fields.Field, fields.Default)):
                out.append(f"{command} {key}: not a field ({type(entry).__name__})")
                continue
            base = getattr(entry, "field", entry)
            if not base.help.strip():
                out.append(f"{command} {key}: no help")
                continue
            first = seen_help.setdefault(base.help, (command, key, base))
            if first[2] is not base:
                out.append(f"{command} {key}: the help of {first[0]} {first[1]} defined again")
            by_name.setdefault(key, {})[id(base)] = command
    out += [f"{key}: defined separately by {', '.join(sorted(set(where.values())))}" for key, where in by_name.items()
            if len(where) > 1 and key not in set(other_keys)]
    return out


def _tables() -> dict[str, dict]:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import docs_keys

    return docs_keys.tables()


def test_every_commands_keys_are_fields_defined_once_with_help():
    """Each key of every command is one typed field with help; a key two commands share is one field
    object (held as it is, or with the command's own default), never a copy."""
    tables = _tables()
    assert {"launch", "launch stage=grpo", "data-prep", "evaluate", "analyze", "export-checkpoint", "verify-checkpoint",
            "serve-retriever", "fetch-data"} <= set(tables)
    assert definition_problems(tables, OTHER_KEYS) == []
    # every rule answers any value with a verdict, never an exception (`logging.tags=5` was a traceback)
    for table in tables.values():
        for key, f in table.items():
            for v in (5, 2.5, True, "x", None, [], {"a": 1}):
                f.problem(key, v), getattr(f, "must", f.problem)(key, v)


def test_a_planted_duplicate_is_found():
    """The check fails on a copy: the same help defined twice, a shared key defined separately, no help."""
    tables = _tables()
    lr = tables["launch"]["train.lr"]
    copied = fields.Field(lr.default, lr.help, lr.rule, lr.roles)
    planted = {**tables, "analyze": {**tables["analyze"], "lr": copied}}
    assert definition_problems(planted, OTHER_KEYS) == ["analyze lr: the help of launch train.lr defined again"]
    grpo = {**tables["launch stage=grpo"], "train.eps": fields.number("AdamW's epsilon", 1e-8, lo=0, lo_open=True)}
    assert definition_problems({**tables, "launch stage=grpo": grpo}, OTHER_KEYS) == [
        "train.eps: defined separately by launch, launch stage=grpo"]
    bare = {**tables, "verify-checkpoint": {**tables["verify-checkpoint"], "x": fields.field(" ", None), "y": (0, "a pair")}}
    assert definition_problems(bare, OTHER_KEYS) == ["verify-checkpoint x: no help", "verify-checkpoint y: not a field (tuple)"]


def test_train_log_every_is_defined_in_one_place():
    """The issue's example: `train.log_every` had a base.yaml line, a rule, a type, a copy step and a
    fingerprint exclusion; now its field lives beside its only reader (the console's cadence, sft/console.py),
    the trainer's tables take it from there and the fingerprint's exclusion derives from its role."""
    from pathlib import Path

    from common import fingerprint
    from sft import config

    root = Path(__file__).resolve().parents[1]
    stages = ("common", "data_prep", "sft", "envs", "evals", "rl", "analysis", "launch", "recipes")
    where = [str(p.relative_to(root)) for d in stages for p in (root / d).rglob("*") if p.suffix in (".py", ".yaml")
             and "log_every" in p.read_text(encoding="utf-8", errors="replace")]
    assert where == ["sft/console.py"], where   # its field and its reader
    assert fields.IDENTITY not in config.SFT["train.log_every"].roles
    assert fingerprint.identity_keys({"train": {"log_every": 3, "lr": 1e-5}}, config.EXCLUDED_KEYS) == {"train.lr": 1e-5}


def test_a_key_added_later_declares_its_as_before_value_on_its_field():
    """A result-changing key added after run dirs were written is one field with `as_before`: the identity
    (through `excluded`, the table's exclusions) leaves it out at that value, so a config.yaml written before the
    key (without it) and one at that value have one fingerprint; any other value is a change. No table elsewhere."""
    from common import fingerprint

    table = {"train.lr": fields.number("peak lr", 1e-5, (fields.IDENTITY,), lo=0),
             "train.knob": fields.field("a knob added later", [], (fields.IDENTITY,), as_before=[]),
             "train.log": fields.text("a name, no result")}
    exclude = fields.excluded(table)
    fp = [fingerprint.identity({"train": train}, exclude)["fingerprint"]
          for train in ({"lr": 1e-5}, {"lr": 1e-5, "knob": [], "log": "x"}, {"lr": 1e-5, "knob": [2]})]
    assert fp[0] == fp[1] != fp[2]
    assert fields.problems(table, {"train": {"lr": 1e-5}}, must=True) == ["train.log: missing from the config"]   # an older
    assert fields.section(table, {"train": {"lr": 1e-5}}, "train").knob == []                              # config.yaml
    assert not hasattr(fingerprint, "LATER_KEYS") and not hasattr(fingerprint, "GRPO_LATER_KEYS")
