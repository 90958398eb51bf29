"""evaluate: bench babyai (action parser, the tiny model end to end, resume), per-bench n, profiles."""
from __future__ import annotations

import hashlib
import json

import pytest

from evals.backends import Generation
from evals.babyai import parse_action
from evals.cli import main as cli_main
from evals.config import default_out, resolve
from evals.run import evaluate
from tests.test_evals_loop import ScriptedBackend, make_world

ACTIONS = ("turn left", "turn right", "go forward", "pick up", "drop", "toggle")

PARSER_TABLE = [
    ("go forward", "go forward", "last_line"),
    ("The ball is ahead.\nturn left", "turn left", "last_line"),
    ("I will pick up the key.\n\n**Action:** Pick up.", "pick up", "last_line"),
    ("Final answer: toggle", "toggle", "last_line"),
    ("`drop`", "drop", "last_line"),
    ('"turn right"', "turn right", "last_line"),
    ("  TURN   LEFT  \n", "turn left", "last_line"),
    ("I should go forward, then turn right. Let me turn right now.", "turn right", "last_mention"),
    ("Turning would waste time; I go forward and then I'll see.", "go forward", "last_mention"),
    ("pick up\nThat is my move.", "pick up", "last_mention"),
    ("I'll move ahead.", None, "none"),
    ("", None, "none"),
    ("dropped it already", None, "none"),  # 'drop' only as part of another word
    ("turn leftwards", None, "none"),
]


@pytest.mark.parametrize("reply,action,rule", PARSER_TABLE)
def test_action_parser_table(reply, action, rule):
    assert parse_action(reply, ACTIONS) == (action, rule)


class Replies:
    """A backend that gives one fixed reply to every prompt and counts what it was asked."""

    name = "scripted"

    def __init__(self, tokenizer, reply: str):
        self.tokenizer, self.reply, self.calls, self.prompts = tokenizer, reply, 0, []

    def encode(self, text):
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def generate(self, prompt_ids, caps):
        self.calls += 1
        self.prompts += [self.tokenizer.decode(p) for p in prompt_ids]
        return [Generation(self.reply, "stop", 3) for _ in prompt_ids]


def test_scripted_replies_score_as_the_rules_say(tmp_path, tiny_tokenizer):
    pytest.importorskip("minigrid")
    spin = Replies(tiny_tokenizer, "<think>\nhm\n</think>\n\nturn left")
    s = evaluate({"ckpt": "m", "benches": ["babyai"], "bench_n": {"babyai": 5}, "babyai_max_steps": 3,
                  "out": str(tmp_path / "a"), "progress": False}, backend=spin)["babyai"]
    assert (s["return"], s["success"], s["invalid_action_rate"], s["mean_steps"], s["n"]) == (0.0, 0.0, 0.0, 3.0, 5)
    assert s["stop_reasons"] == {"step_limit": 5} and set(s["per_task"]) == {
        "goto", "pickup", "open", "putnext", "pick_up_seq_go_to"}
    from evals.metrics import METRICS, NON_METRIC_FIELDS, metric_problem
    assert set(s) <= set(METRICS) | set(NON_METRIC_FIELDS)  # every babyai summary number is registered
    assert all(metric_problem(k, v) is None for k, v in s.items() if k not in NON_METRIC_FIELDS)
    assert spin.calls == 3  # five games in lockstep: one batched generate per step
    first = spin.prompts[0]
    assert "Instruction: go to the" in first and "Current observation:\na wall" in first and "turn left" in first
    assert "Previous steps" in spin.prompts[-1] and "Action: turn left" in spin.prompts[-1]
    junk = Replies(tiny_tokenizer, "I am not sure what to do.")
    s = evaluate({"ckpt": "m", "benches": ["babyai"], "bench_n": {"babyai": 5}, "babyai_max_steps": 2,
                  "out": str(tmp_path / "b"), "progress": False}, backend=junk)["babyai"]
    assert s["invalid_action_rate"] == 1.0 and s["action_rules"] == {"none": 10}
    rows = [json.loads(line) for line in open(tmp_path / "b" / "babyai.jsonl")]
    assert rows[0]["actions"] == ["go forward", "go forward"] and rows[0]["invalid_actions"] == 2
    assert "is not a valid action" in junk.prompts[-1]  # the feedback line reaches the model
    from evals.babyai import items
    assert len(items(0, 0)) == 50 and [it.id for it in items(5, 0)] == [r["id"] for r in rows]


ROW_KEYS = {"id", "task", "seed", "transcript", "actions", "invalid_actions", "steps", "success", "return", "metrics"}


@pytest.mark.slow
def test_tiny_model_plays_babyai_and_a_rerun_evaluates_nothing(tmp_path, tiny_model_dir, tiny_tokenizer):
    pytest.importorskip("minigrid")
    out = tmp_path / "out"
    argv = [f"ckpt={tiny_model_dir}", f"out={out}", "benches=[babyai]", "bench_n={babyai:5}", "babyai_max_steps=4",
            "babyai_max_new_tokens=32", "progress=false", "micro_batch=8"]
    assert cli_main(argv) == 0
    rows = [json.loads(line) for line in open(out / "babyai.jsonl")]
    assert len(rows) == 5 and all(ROW_KEYS <= set(r) for r in rows)
    assert all(1 <= r["steps"] <= 4 and len(r["transcript"]) == r["steps"] == len(r["actions"]) for r in rows)
    s = json.loads((out / "summary.json").read_text())["babyai"]
    assert s["n"] == 5 and all(0.0 <= s[k] <= 1.0 for k in ("return", "success", "invalid_action_rate"))
    assert 1.0 <= s["mean_steps"] <= 4.0 and sum(t["n"] for t in s["per_task"].values()) == 5
    meta = json.loads((out / "meta.json").read_text())
    assert meta["babyai"] == {"max_steps": 4, "max_new_tokens": 32, "history": 16}
    assert meta["bench_items"]["babyai"]["n"] == 5 and meta["bench_items"]["babyai"]["n_requested"] == 5
    before = (out / "babyai.jsonl").read_bytes()
    never = Replies(tiny_tokenizer, "x")
    evaluate({"ckpt": str(tiny_model_dir), "out": str(out), "benches": ["babyai"], "bench_n": {"babyai": 5},
              "babyai_max_steps": 4, "babyai_max_new_tokens": 32, "progress": False}, backend=never)
    assert never.calls == 0 and (out / "babyai.jsonl").read_bytes() == before


def test_bench_n_zero_takes_every_item_of_a_custom_bench(tmp_path, tiny_tokenizer):
    corpus, bench_root = make_world(tmp_path, n=7)
    out = tmp_path / "out"
    summary = evaluate({"ckpt": "m", "benches": ["synthqa"], "n": 3, "bench_n": {"synthqa": 0},
                        "bench_root": str(bench_root), "corpus": str(corpus), "index_dir": str(tmp_path / "idx"),
                        "out": str(out), "progress": False}, backend=ScriptedBackend(tiny_tokenizer))
    assert summary["synthqa"]["n"] == 7
    record = json.loads((out / "meta.json").read_text())["bench_items"]["synthqa"]
    path = bench_root / "synthqa" / "test.jsonl"
    assert record["n"] == record["file_items"] == 7 and record["n_requested"] == 0
    assert record["source_digest"] == hashlib.sha256(path.read_bytes()).hexdigest()
    # The global n still applies to benches without their own entry.
    out2 = tmp_path / "out2"
    evaluate({"ckpt": "m", "benches": ["synthqa"], "n": 3, "bench_n": {"other": 0}, "bench_root": str(bench_root),
              "corpus": str(corpus), "index_dir": str(tmp_path / "idx"), "out": str(out2), "progress": False},
             backend=ScriptedBackend(tiny_tokenizer))
    assert json.loads((out2 / "summary.json").read_text())["synthqa"]["n"] == 3


def test_profiles_set_benches_sizes_and_their_own_out_dir(tmp_path, capsys):
    ckpt = tmp_path / "run" / "checkpoints" / "step-000010"
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("{}\n")
    cfg = resolve({"ckpt": str(ckpt), "profile": "rl_ood", "corpus": str(corpus)})
    assert list(cfg.benches) == ["musique@given", "2wikimultihopqa@given", "search_plan_ood", "babyai"]
    assert dict(cfg.bench_n) == {"musique@given": 0, "2wikimultihopqa@given": 0, "search_plan_ood": 100, "babyai": 50}
    assert cfg.out == str(tmp_path / "run" / "eval" / "rl_ood" / "step-000010")
    assert resolve({"ckpt": str(ckpt), "benches": ["babyai"]}).out == str(tmp_path / "run" / "eval" / "step-000010")
    assert default_out(str(ckpt)) == tmp_path / "run" / "eval" / "step-000010"
    # The command line wins over the profile, key by key.
    assert cli_main([f"ckpt={ckpt}", "profile=rl_ood", f"corpus={corpus}", "bench_n.babyai=5", "dry_run=true"]) == 0
    shown = capsys.readouterr().out
    assert "babyai: 5" in shown and "search_plan_ood: 100" in shown and "rl_ood/step-000010" in shown
    assert cli_main([f"ckpt={ckpt}", "profile=nope", "dry_run=true"]) == 2
    assert "known profiles: multihop_qa, rl_ood" in capsys.readouterr().err
    assert cli_main([f"ckpt={ckpt}", "bench_n={babyai:x}", "dry_run=true"]) == 2
    assert "bench_n.babyai" in capsys.readouterr().err


def test_a_bench_identity_holds_its_own_n_and_keys_only(tmp_path):
    pytest.importorskip("minigrid")
    from evals.run import bench_request

    corpus, bench_root = make_world(tmp_path, n=7)
    base = {"ckpt": "m", "out": str(tmp_path / "o"), "benches": ["synthqa", "babyai"], "bench_root": str(bench_root),
            "corpus": str(corpus)}
    ckpt_id = {"kind": "test", "digest": "x"}

    def ident(bench, **kw):
        return bench_request(bench, resolve({**base, **kw}), ckpt_id)["fingerprint"]

    assert ident("synthqa") == ident("synthqa", bench_n={"babyai": 5}, babyai_max_steps=4, profile="rl_ood")
    assert ident("synthqa") != ident("synthqa", bench_n={"synthqa": 0})
    assert ident("babyai") != ident("babyai", babyai_max_steps=4) != ident("babyai", bench_n={"babyai": 5})
