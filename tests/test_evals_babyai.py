"""evaluate: bench babyai (BALROG's reply rule and messages, per-request sampling, the tiny model end to end,
resume), per-bench n, profiles."""
from __future__ import annotations

import hashlib
import json

import pytest

from common.cli import ConfigError
from evals.backends import Generation
from evals.cli import main as cli_main
from evals.config import resolve
from evals.run import evaluate, format_table
from tests.test_evals_loop import ScriptedBackend, make_world

ACTIONS = ("turn left", "turn right", "go forward", "pick up", "drop", "toggle")

# (model output, the action executed): BALROG's rule on the content after the reasoning block.
REPLY_TABLE = [
    ("go forward", "go forward"),
    ("<think>\nThe key is ahead.\n</think>\n\nturn left", "turn left"),
    ("  turn right\n", "turn right"),
    ("go forward.", "go forward"),       # punctuation is filtered out
    ("**pick up**", "pick up"),
    ("Go forward", None),                # case-sensitive
    ("go forward:", None),               # colons are kept
    ("Action: toggle", None),
    ("I will turn left", None),
    ("jump", None),
    ("", None),
    ("<think>\nturn left</think>", None),  # an empty content: the reasoning is not read
]


@pytest.mark.parametrize("reply,action", REPLY_TABLE)
def test_reply_rule_table(reply, action):
    pytest.importorskip("minigrid")
    from envs.babyai_text import filter_reply
    from evals.extract import split_reasoning

    filtered = filter_reply(split_reasoning(reply)[1])
    assert (filtered if filtered in ACTIONS else None) == action


class Replies:
    """A backend that gives one fixed reply to every prompt and keeps what it was asked."""

    name = "scripted"

    def __init__(self, tokenizer, reply: str, fail_after: int | None = None):
        self.tokenizer, self.reply, self.calls, self.prompts, self.seeds = tokenizer, reply, 0, [], []
        self.fail_after = fail_after

    def encode(self, text):
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def generate(self, prompt_ids, caps, *, temperature=0.0, seeds=None):
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise RuntimeError("interrupted")
        self.calls += 1
        self.prompts += [self.tokenizer.decode(p) for p in prompt_ids]
        self.seeds.append((temperature, seeds))
        return [Generation(self.reply, "stop", 3) for _ in prompt_ids]


def _rows(path):
    return [json.loads(line) for line in open(path)]


def test_scripted_replies_score_as_the_rules_say(tmp_path, tiny_tokenizer):
    pytest.importorskip("minigrid")
    from envs.babyai_text import PROTOCOL

    spin = Replies(tiny_tokenizer, "<think>\nhm\n</think>\n\nturn left")
    s = evaluate({"ckpt": "m", "benches": ["babyai"], "bench_n": {"babyai": 5}, "babyai_max_steps": 3,
                  "out": str(tmp_path / "a"), "progress": False}, backend=spin)["babyai"]
    assert (s["return"], s["success"], s["invalid_action_rate"], s["mean_steps"], s["n"]) == (0.0, 0.0, 0.0, 3.0, 5)
    assert s["return_ci95"] == [0.0, 0.0] and s["samples"] == 1 and s["progression"] == 0.0
    assert s["stop_reasons"] == {"step_limit": 5} and set(s["per_task"]) == {
        "goto", "pickup", "open", "putnext", "pick_up_seq_go_to"}
    from evals.metrics import NON_METRIC_FIELDS
    from evals.registry import metric_problem
    # every babyai summary number is registered (shared, or the babyai kind's own) and valid
    assert all(metric_problem(k, v) is None for k, v in s.items() if k not in NON_METRIC_FIELDS)
    assert spin.calls == 3  # five games in lockstep: one batched generate per step
    assert all(t == 1.0 and len(seeds) == 5 for t, seeds in spin.seeds)  # BALROG's temperature, a seed per request
    rows = _rows(tmp_path / "a" / "babyai.jsonl")
    steps = rows[0]["transcript"]
    roles = [[m["role"] for m in t["messages"]] for t in steps]
    assert roles == [["user", "user"], ["user", "user", "assistant", "user"],
                     ["user", "user", "assistant", "user", "assistant", "user"]]
    first = steps[0]["messages"]
    assert first[0]["content"].startswith(PROTOCOL["instruction_before_mission"] + rows[0]["instruction"])
    assert first[1]["content"].startswith("Current Observation:\na wall") and first[1]["content"].endswith(
        PROTOCOL["closing_instruction"])
    assert steps[2]["messages"][2] == {"role": "assistant", "content": "turn left"}  # the filtered reply only
    assert [(t["filtered"], t["action"], t["valid"]) for t in steps] == [("turn left", "turn left", True)] * 3
    assert PROTOCOL["closing_instruction"] in spin.prompts[0] and "PLAY!" in spin.prompts[0]
    junk = Replies(tiny_tokenizer, "hm</think>I am not sure what to do.")   # the tiny template opens <think>
    s = evaluate({"ckpt": "m", "benches": ["babyai"], "bench_n": {"babyai": 5}, "babyai_max_steps": 2,
                  "babyai_temperature": 0, "out": str(tmp_path / "b"), "progress": False}, backend=junk)["babyai"]
    assert s["invalid_action_rate"] == 1.0 and all(seeds is None for _, seeds in junk.seeds)  # greedy
    rows = _rows(tmp_path / "b" / "babyai.jsonl")
    assert rows[0]["actions"] == ["go forward", "go forward"] and rows[0]["invalid_actions"] == 2
    assert rows[0]["transcript"][0]["filtered"] == "I am not sure what to do"
    assert "Defaulted to action: go forward" in junk.prompts[-1]  # BALROG's notice reaches the model
    # a reply that never closes the <think> its template opened (Thinking-2507's, the tiny one's) is all reasoning, as
    # evaluate's QA and GRPO read it (evals.toolcalls.split_turn): no action text (seen: "turn left" executed from it)
    cut = Replies(tiny_tokenizer, "turn left")
    evaluate({"ckpt": "m", "benches": ["babyai"], "bench_n": {"babyai": 1}, "babyai_max_steps": 2, "out": str(tmp_path / "c"),
              "progress": False}, backend=cut)
    assert [(t["content"], t["filtered"], t["action"], t["valid"]) for t in _rows(tmp_path / "c" / "babyai.jsonl")[0]["transcript"]] \
        == [("", "", "go forward", False)] * 2
    from evals.babyai import items
    assert len(items(0, 0)) == 50 and [it.id for it in items(5, 0)] == [r["id"] for r in rows]


def test_games_whose_first_prompt_does_not_fit_are_not_measured(tmp_path, tiny_tokenizer):
    """max_model_len below every game's first prompt: no game took a step. Its means (its tasks' too) are null with
    the reason, not a return of 0 (before: return 0.0, success 0.0, read downstream as the checkpoint's)."""
    pytest.importorskip("minigrid")
    backend = Replies(tiny_tokenizer, "turn left")
    out = tmp_path / "a"
    s = evaluate({"ckpt": "m", "benches": ["babyai"], "bench_n": {"babyai": 2}, "max_model_len": 64, "out": str(out),
                  "progress": False}, backend=backend)["babyai"]
    assert backend.calls == 0 and s["n"] == 2 and s["stop_reasons"] == {"context_limit": 2}
    assert s["return"] is None and s["success"] is None and s["return_ci95"] is None
    assert all(t["return"] is None and t["success"] is None for t in s["per_task"].values())
    assert s["prompt_too_long"]["items"] == 2 and s["prompt_too_long"]["max_model_len"] == 64
    assert s["null_reason"].startswith("not measured: 2 of 2 items never generated a token")
    assert all(r["refused_prompt"]["max_model_len"] == 64 for r in _rows(out / "babyai.jsonl"))
    assert "no score: not measured" in format_table({"babyai": s})


def test_sampling_seeds_depend_on_episode_and_step_only(tmp_path, tiny_tokenizer):
    """Per-request seeds are the same whatever the batch size, across a resume, and differ per sample."""
    pytest.importorskip("minigrid")
    from evals.babyai import request_seed

    base = {"ckpt": "m", "benches": ["babyai"], "bench_n": {"babyai": 4}, "babyai_max_steps": 3, "progress": False}
    one = Replies(tiny_tokenizer, "turn left")
    evaluate({**base, "out": str(tmp_path / "one"), "batch_size": 1}, backend=one)
    four = Replies(tiny_tokenizer, "turn left")
    evaluate({**base, "out": str(tmp_path / "four"), "batch_size": 4}, backend=four)
    assert _rows(tmp_path / "one" / "babyai.jsonl") == _rows(tmp_path / "four" / "babyai.jsonl")
    assert sorted(s for _, seeds in one.seeds for s in seeds) == sorted(s for _, seeds in four.seeds for s in seeds)
    row = _rows(tmp_path / "one" / "babyai.jsonl")[0]
    assert [t["seed"] for t in row["transcript"]] == [request_seed(row["id"], row["seed"], 0, k) for k in range(3)]
    k2 = Replies(tiny_tokenizer, "turn left")
    s = evaluate({**base, "out": str(tmp_path / "k2"), "babyai_samples": 2}, backend=k2)["babyai"]
    rows = _rows(tmp_path / "k2" / "babyai.jsonl")
    assert s["n"] == 8 and s["samples"] == 2 and [r["id"] for r in rows[:2]] == ["babyai_0000_goto_s00", "babyai_0000_goto_s01"]
    assert rows[0]["transcript"][0]["seed"] != rows[1]["transcript"][0]["seed"]


def test_return_interval_is_a_seeded_bootstrap_over_episodes():
    from evals.babyai import bootstrap_interval, summarize

    vals = [0.0] * 45 + [0.9] * 5
    lo, hi = bootstrap_interval(vals)
    assert lo < 0.09 < hi and bootstrap_interval(vals) == [lo, hi] and 0.0 <= lo and hi <= 0.9
    rows = [{"id": f"e{i}_s{k}", "episode": f"e{i}", "task": "goto", "stop_reason": "success", "steps": 1,
             "generated_tokens": 1, "metrics": {"return": float(i % 2 == k), "success": 0.0, "progression": 0.0,
                                                 "invalid_action_rate": 0.0}} for i in range(10) for k in range(2)]
    assert summarize(rows)["return_ci95"] == [0.5, 0.5]  # each episode averages to 0.5 over its two samples


ROW_KEYS = {"id", "task", "seed", "transcript", "actions", "invalid_actions", "steps", "success", "return", "metrics",
            "progression", "decoding"}


@pytest.mark.slow
def test_tiny_model_plays_babyai_and_a_rerun_evaluates_nothing(tmp_path, tiny_model_dir, tiny_tokenizer):
    pytest.importorskip("minigrid")
    out = tmp_path / "out"
    argv = [f"ckpt={tiny_model_dir}", f"out={out}", "benches=[babyai]", "bench_n={babyai:5}", "babyai_max_steps=4",
            "babyai_max_new_tokens=32", "progress=false", "micro_batch=8", "batch_size=8"]
    assert cli_main(argv) == 0
    rows = _rows(out / "babyai.jsonl")
    assert len(rows) == 5 and all(ROW_KEYS <= set(r) for r in rows)
    assert all(1 <= r["steps"] <= 4 and len(r["transcript"]) == r["steps"] == len(r["actions"]) for r in rows)
    assert all(t["messages"][0]["role"] == "user" and t["messages"][-1]["content"].startswith("Current Observation:")
               for r in rows for t in r["transcript"])
    s = json.loads((out / "summary.json").read_text())["babyai"]
    assert s["n"] == 5 and all(0.0 <= s[k] <= 1.0 for k in ("return", "success", "invalid_action_rate"))
    assert 1.0 <= s["mean_steps"] <= 4.0 and sum(t["n"] for t in s["per_task"].values()) == 5
    meta = json.loads((out / "meta.json").read_text())
    assert meta["babyai"] == {"max_steps": 4, "max_new_tokens": 32, "temperature": 1.0, "samples": 1, "history": 16}
    assert meta["bench_items"]["babyai"]["n"] == 5 and meta["bench_items"]["babyai"]["n_requested"] == 5
    before = (out / "babyai.jsonl").read_bytes()
    never = Replies(tiny_tokenizer, "x")
    evaluate({"ckpt": str(tiny_model_dir), "out": str(out), "benches": ["babyai"], "bench_n": {"babyai": 5},
              "babyai_max_steps": 4, "babyai_max_new_tokens": 32, "progress": False}, backend=never)
    assert never.calls == 0 and (out / "babyai.jsonl").read_bytes() == before
    # Sampling (temperature 1.0) does not depend on the batch: a run in batches of 2, interrupted
    # after its first batch and resumed in batches of 1 (one sequence per generate), writes the rows
    # of a run in one batch of 3 (smaller games here: the tiny model is slow on a shared CPU).
    from evals.backends import HFBackend

    cfg = {"ckpt": str(tiny_model_dir), "benches": ["babyai"], "bench_n": {"babyai": 3}, "babyai_max_steps": 2,
           "babyai_max_new_tokens": 8, "progress": False}
    evaluate({**cfg, "out": str(tmp_path / "three"), "batch_size": 3}, backend=HFBackend(str(tiny_model_dir), micro_batch=3))
    rows = _rows(tmp_path / "three" / "babyai.jsonl")
    hf = HFBackend(str(tiny_model_dir), micro_batch=1)

    class Interrupted:
        def __init__(self, inner, calls):
            self.inner, self.calls, self.tokenizer, self.name = inner, calls, inner.tokenizer, inner.name

        def encode(self, text):
            return self.inner.encode(text)

        def generate(self, *a, **kw):
            if self.calls == 0:
                raise KeyboardInterrupt
            self.calls -= 1
            return self.inner.generate(*a, **kw)

    with pytest.raises(KeyboardInterrupt):
        evaluate({**cfg, "out": str(tmp_path / "resumed"), "batch_size": 2}, backend=Interrupted(hf, 3))
    assert len(_rows(tmp_path / "resumed" / "babyai.jsonl")) == 2  # the first batch of two was written
    evaluate({**cfg, "out": str(tmp_path / "resumed"), "batch_size": 1}, backend=hf)
    assert _rows(tmp_path / "resumed" / "babyai.jsonl") == rows


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
    # The global n still applies to benches without their own entry; an entry for a bench not being
    # run sizes nothing and is refused.
    out2 = tmp_path / "out2"
    cfg = {"ckpt": "m", "benches": ["synthqa"], "n": 3, "bench_root": str(bench_root),
           "corpus": str(corpus), "index_dir": str(tmp_path / "idx"), "out": str(out2), "progress": False}
    with pytest.raises(ConfigError, match="bench_n.nq: nq is not being run"):
        evaluate({**cfg, "bench_n": {"nq": 0}}, backend=ScriptedBackend(tiny_tokenizer))
    evaluate(cfg, backend=ScriptedBackend(tiny_tokenizer))
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
    # Sampled rows are the backend's (its sampler); greedy rows are not, and the QA benches never are.
    assert ident("babyai") != ident("babyai", backend="vllm")
    # (vLLM's own engine settings -- enforce_eager, prefix caching -- enter every bench's identity under it)
    def keys(bench, **kw):
        return set(bench_request(bench, resolve({**base, **kw}), ckpt_id)["keys"])

    assert "sampler" in keys("babyai", backend="vllm")
    assert "sampler" not in keys("babyai", babyai_temperature=0, backend="vllm")
    assert "sampler" not in keys("synthqa", backend="vllm")
