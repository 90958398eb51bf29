"""search_plan_act: tool robustness, TRL-style tool extraction, exporter, eval items, pilot, CLI."""
from __future__ import annotations

import inspect
import json

import pytest

from data_prep.schema import validate_record
from envs.search_plan_act import (
    TOOL_NAMES, SearchPlanActEnv, episode_record, export_trajectories, make_eval_items, run_pilot, tool_schemas,
)
from envs.search_plan_act.__main__ import main as cli_main
from envs.search_plan_act.pilot import check
from envs.search_plan_act.policies import POLICIES
from envs.search_plan_act.reward import HACK_CEILINGS
from common.cli import run_cli


@pytest.fixture
def env():
    e = SearchPlanActEnv()
    e.reset(seed=21, split="train")
    return e


BAD_CALLS = [
    ("search", {"query": 42}),
    ("search", {"query": None}),
    ("search", {"query": ["a"]}),
    ("search", {"q": "x"}),
    ("search", {}),
    ("search", {"query": "   "}),
    ("read_record", {"record_id": "P-0000"}),
    ("read_record", {"record_id": {"id": 1}}),
    ("read_record", {"record_id": "x", "extra": 1}),
    ("update_record", {"record_id": "P-0000", "field": "contact", "value": "v"}),
    ("update_record", {"record_id": "START", "field": "salary", "value": "v"}),
    ("update_record", {"record_id": "START", "field": "badge", "value": "v"}),
    ("update_record", {"record_id": "START", "field": "contact", "value": 5}),
    ("update_record", {"record_id": "START", "field": "contact", "value": ""}),
    ("update_record", {"record_id": "START", "field": "contact"}),
    ("link_records", {"source_id": "START", "target_id": "START", "relation": "backs_up"}),
    ("link_records", {"source_id": "START", "target_id": "P-0000", "relation": "backs_up"}),
    ("link_records", {"source_id": "START", "target_id": "OTHER", "relation": "member_of"}),
    ("link_records", {"source_id": "START", "target_id": "OTHER", "relation": "reports_to"}),
    ("finish", {"answer": ""}),
    ("finish", {"answer": 3.5}),
    ("teleport", {"x": 1}),
    (None, {}),
]


@pytest.mark.parametrize("name,args", BAD_CALLS)
def test_bad_calls_return_errors_never_raise(env, name, args):
    ids = {"START": env.task.chain[0], "OTHER": env.task.chain[1]}
    args = {k: ids.get(v, v) if isinstance(v, str) else v for k, v in args.items()}
    state = {r: (dict(rec.slots), list(rec.links)) for r, rec in env.task.world.records.items()}
    out = env.call_tool(name, args)
    assert isinstance(out, str) and out.startswith("Error"), out
    if name in TOOL_NAMES:  # the direct method call (what TRL does) behaves the same
        assert getattr(env, name)(**args) == out
    assert {r: (dict(rec.slots), list(rec.links)) for r, rec in env.task.world.records.items()} == state
    assert not env.done and env.transcript()[-1]["response"] == out


def test_call_tool_argument_forms(env):
    assert env.call_tool("search", "not json").startswith("Error: arguments are not valid JSON")
    assert env.call_tool("search", [1, 2]).startswith("Error: arguments must be a JSON object")
    assert env.call_tool("search", json.dumps({"query": env.task.plan.start_name})).startswith("Doc 1(Title: ")
    assert env.search("positional works too").startswith(("Doc", "No results"))
    fresh = SearchPlanActEnv()
    assert fresh.read_record(record_id="P-1").startswith("Error: the environment has not been reset")
    assert fresh.get_reward() == 0.0 and not fresh.done


def test_trl_environment_factory_extraction(tiny_tokenizer):
    """Mirror TRL 1.16 GRPOTrainer: tools = public functions on the env class except reset /
    get_reward; schemas rendered by the chat template from the bound methods."""
    pytest.importorskip("trl")
    from transformers.utils import get_json_schema

    env = SearchPlanActEnv()  # zero-arg factory call
    methods, has_reset, has_reward = [], False, False
    for member_name, _ in inspect.getmembers(type(env), predicate=inspect.isfunction):
        if member_name == "reset":
            has_reset = True
        elif member_name == "get_reward":
            has_reward = True
        elif not member_name.startswith("_"):
            methods.append(getattr(env, member_name))
    assert has_reset and has_reward
    assert sorted(m.__name__ for m in methods) == sorted(TOOL_NAMES)
    by_name = {m.__name__: get_json_schema(m) for m in methods}
    assert [get_json_schema(m) for m in methods] == tool_schemas()  # same specs, same order
    assert by_name["search"]["function"]["parameters"]["required"] == ["query"]
    # TRL's tool dict + reset/get_reward flow.
    row = {"prompt": [{"role": "user", "content": ""}], "seed": 3, "split": "ood"}
    observation = env.reset(**row)
    assert isinstance(observation, str) and "Goal:" in observation
    tool_dict = {m.__name__: m for m in methods}
    assert tool_dict["search"](**{"query": env.task.plan.start_name}).startswith("Doc 1")
    assert isinstance(env.get_reward(), float)
    # The chat template renders the same text from the bound methods as from tool_schemas().
    conv = [{"role": "user", "content": observation}]
    from_methods = tiny_tokenizer.apply_chat_template(conv, tools=methods, tokenize=False, add_generation_prompt=True)
    from_specs = tiny_tokenizer.apply_chat_template(conv, tools=tool_schemas(), tokenize=False, add_generation_prompt=True)
    assert from_methods == from_specs and '"name": "link_records"' in from_specs


def test_export_records_are_real_valid_episodes(tmp_path, tiny_tokenizer):
    path = tmp_path / "spa.jsonl"
    assert export_trajectories(path, n=12, seed=1, split="train") == 12
    text = path.read_text()
    assert export_trajectories(tmp_path / "again.jsonl", n=12, seed=1) == 12
    assert (tmp_path / "again.jsonl").read_text() == text  # deterministic
    records = [json.loads(line) for line in text.splitlines()]
    assert len({r["id"] for r in records}) == 12
    lengths = []
    for rec in records:
        validate_record(rec)
        assert (rec["source"], rec["domain"], rec["terminator"]) == ("search-plan-act", "search", "final_answer")
        assert rec["tools"] == tool_schemas()
        msgs = rec["messages"]
        assert msgs[-1]["content"] == f"Final answer: {rec['answer']}" and "tool_calls" not in msgs[-1]
        # Replay the calls in a fresh env: every tool message is the env's real response.
        seed = int(rec["id"].rsplit("-", 1)[1])
        env = SearchPlanActEnv()
        assert env.reset(seed=seed, split="train") == rec["task"] == msgs[0]["content"]
        for call_msg, tool_msg in zip(msgs[1:-1:2], msgs[2:-1:2]):
            (call,) = call_msg["tool_calls"]
            assert tool_msg["tool_call_id"] == call["id"] and tool_msg["name"] == call["function"]["name"]
            assert env.call_tool(call["function"]["name"], call["function"]["arguments"]) == tool_msg["content"]
        assert env.done and env.get_reward() == 1.0
        lengths.append(len(tiny_tokenizer.apply_chat_template(msgs, tools=rec["tools"], tokenize=True, return_dict=False)))
    # Compact enough for the tiny demo model (about 700 of these are the tool-schema block).
    assert sum(lengths) / len(lengths) < 1800, lengths
    ood = episode_record(5, "ood")
    validate_record(ood)
    assert "ood" in ood["id"]
    with pytest.raises(ValueError, match="unknown split"):
        export_trajectories(tmp_path / "x.jsonl", n=1, seed=0, split="dev")


def test_make_eval_items():
    rows = make_eval_items(6, seed=0)
    assert rows == make_eval_items(6, seed=0)
    assert len({r["id"] for r in rows}) == 6
    env = SearchPlanActEnv()
    for r in rows:
        assert set(r) == {"id", "seed", "split", "question"} and r["split"] == "ood"
        assert env.reset(seed=r["seed"], split=r["split"]) == r["question"]
    assert make_eval_items(2, seed=0, split="train")[0]["split"] == "train"


@pytest.mark.parametrize("split,knobs", [("train", {}), ("ood", {}), ("ood", {"hops": 1, "writes": 1, "distractors": 0})])
def test_pilot_ordering_holds(split, knobs):
    result = run_pilot(split, tasks=200, seed=0, progress=False, **knobs)
    assert result.ok, result.table()
    assert result.means["genuine"]["total"] == 1.0
    assert "never_finisher" in result.table() and "PASS" in result.table()


def test_pilot_check_flags_a_winning_hack():
    means = {p: {"total": 0.0} for p in POLICIES}
    means.update(genuine={"total": 0.9}, reckless_guesser={"total": 0.7})
    failures = check(means)
    assert any("does not beat reckless_guesser" in f for f in failures)
    assert any("reckless_guesser mean total 0.700 exceeds" in f for f in failures)


def test_cli(capsys, monkeypatch, tmp_path):
    assert run_cli(cli_main, ["pilot", "split=ood", "tasks=200"]) == 0
    out = capsys.readouterr().out
    assert "split=ood tasks=200" in out and "PASS" in out
    assert run_cli(cli_main, ["pilot", "taks=3"]) == 2
    assert "Did you mean: tasks" in capsys.readouterr().err
    # each value checked by its key's rule, one `error:` line (seen: hops=0 and out=<a directory> were tracebacks)
    for argv, line in ((["pilot", "split=dev"], "split='dev': expected train or ood"), (["pilot", "hops=0"], "hops=0: expected a positive"),
                       # beyond what a task can hold (seen: writes=9 never returned, hops=50 and distractors=100000 tracebacks)
                       (["pilot", "writes=9"], "writes=9: a train task with 1 hop(s) holds at most 8 distinct writes"),
                       (["pilot", "hops=8"], "hops=8: must be at least 1 and at most 7"),
                       (["pilot", "distractors=100000"], "distractors=100000: must be >= 0 and at most 20"),
                       (["export", f"out={tmp_path}"], f"out='{tmp_path}': expected a file path"), (["fly"], "unknown command 'fly'")):
        assert run_cli(cli_main, argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {line}") and err.count("\n") == 1, (argv, err)
    assert run_cli(cli_main, ["--help"]) == 0   # every key of each command, its default and its description
    out = capsys.readouterr().out
    assert all(k in out for k in ("distractors=null", "n=100 ", "policy x component means over this many tasks"))
    assert run_cli(cli_main, ["show", "--help"]) == 0 and "pilot keys" not in capsys.readouterr().out
    out_path = tmp_path / "cli.jsonl"
    assert run_cli(cli_main, ["export", f"out={out_path}", "n=3", "split=ood"]) == 0
    assert len(out_path.read_text().splitlines()) == 3
    assert run_cli(cli_main, ["export", "n=3"]) == 2  # out= is required
    # an existing out is never silently replaced: refused, or renamed aside with overwrite=true; a directory is refused
    assert run_cli(cli_main, ["export", f"out={out_path}", "n=2"]) == 2 and "exists" in capsys.readouterr().err
    assert run_cli(cli_main, ["export", f"out={out_path}", "n=2", "overwrite=true"]) == 0
    assert [len(p.read_text().splitlines()) for p in sorted(tmp_path.glob("cli.jsonl*"))] == [2, 3]
    assert run_cli(cli_main, ["export", f"out={tmp_path}", "n=2", "overwrite=true"]) == 2
    assert "(not a directory)" in capsys.readouterr().err and not list(tmp_path.parent.glob("*.tmp"))
    capsys.readouterr()
    assert run_cli(cli_main, ["show", "seed=2"]) == 0
    assert json.loads(capsys.readouterr().out)[-1]["content"].startswith("Final answer: ")
    # When the ordering fails the pilot exits non-zero and says why.
    monkeypatch.setitem(HACK_CEILINGS, "never_finisher", 0.05)
    assert run_cli(cli_main, ["pilot", "tasks=20"]) == 1
    assert "never_finisher mean total" in capsys.readouterr().out


def test_fuzzed_calls_never_raise():
    import random

    rng = random.Random(0)
    junk = [None, 0, -1, 3.5, True, [], ["P-1000"], {}, {"a": 1}, "", " ", "P-", "ÿ\u2603", "x" * 5000,
            "{\"query\": 1}", "\n", "P-1000", "contact", "backs_up"]
    names = list(TOOL_NAMES) + ["", "reset", "get_reward", "_log", "call_tool", "__init__"]
    for seed in range(20):
        env = SearchPlanActEnv()
        env.reset(seed=seed, split=rng.choice(["train", "ood"]))
        ids = list(env.task.world.records)
        for _ in range(40):
            name = rng.choice(names)
            keys = rng.sample(["query", "record_id", "field", "value", "source_id", "target_id", "relation",
                               "answer", "self", "extra"], rng.randint(0, 4))
            args = {k: rng.choice(junk + ids) for k in keys}
            out = env.call_tool(name, rng.choice([args, json.dumps(args, default=str), None, 7]))
            assert isinstance(out, str)
        c = env.reward_components()
        assert all(0.0 <= c[k] <= 1.0 for k in c)
