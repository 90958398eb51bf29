"""Typed config fields (common.fields): each key defined once, with its default, rule, help and roles;
evaluate's keys are the first table on them, and analyze's `eval.*` keys are the same field objects."""
from __future__ import annotations

from omegaconf import OmegaConf

from common import fields, keydoc
from evals.config import DEFAULTS, KEYS as EVALUATE, value_problems


def test_every_evaluate_and_analyze_key_is_one_field_with_help():
    from launch.analyze import KEYS as ANALYZE

    assert all(isinstance(f, fields.Field) and f.help.strip() for f in EVALUATE.values())
    passed = {k: f for k, f in ANALYZE.items() if k.startswith("eval.")}
    assert passed and all(isinstance(f, fields.Passed) for f in passed.values())
    # the same objects, not copies: a rule or help changed in evals/config.py is analyze's too
    assert all(f.field is EVALUATE[k.removeprefix("eval.")] for k, f in passed.items())
    # unset by default (evaluate's default or the profile's applies), except the runs' prompt
    assert {k: f.default for k, f in passed.items()} == {**{k: None for k in passed}, "eval.prompt": "tool_agent"}
    # no key is described twice: analyze's eval.n line is evaluate's n line
    assert EVALUATE["n"].help in dict((k.name, k.doc) for k in keydoc.from_table(ANALYZE))["eval.n"]


def test_the_rules_refuse_what_a_key_cannot_be():
    cfg = OmegaConf.create({**DEFAULTS, "topk": 2.5, "backend": "vlm", "retriever": "e55", "enforce_eager": 1,
                            "prefix_caching": "yes", "gpu_memory_utilization": 1.5, "babyai_max_steps": None,
                            "enable_thinking": "maybe", "corpus": 3})
    assert sorted(value_problems(cfg)) == sorted([
        "retriever='e55': expected bm25, e5 or http. Did you mean: e5?", "corpus=3: expected a string (or null)",
        "topk=2.5: expected a positive integer", "backend='vlm': expected hf or vllm",
        "enable_thinking='maybe': expected auto, true or false", "gpu_memory_utilization=1.5: expected in (0, 1] (or auto)",
        "enforce_eager=1: expected auto, true or false", "prefix_caching='yes': expected true or false"])
    assert value_problems(OmegaConf.create(DEFAULTS)) == []


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
