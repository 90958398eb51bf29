"""A small study for the report.html tests (helpers only, no tests): runs with QA (nq), search_plan_ood and
BabyAI eval dirs whose rows have the harness's shape (messages / transcript, metrics), one row carrying HTML
and script payloads, and the anchor."""
from __future__ import annotations

import json
from pathlib import Path

from test_analysis_helpers import make_run

from common.io import write_json

PAYLOAD = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=1">'
XSS_ID = "nq-3"
BENCHES = ["nq", "search_plan_ood", "babyai"]
N = 8


def right(arm: str, step: int, i: int) -> bool:
    """Which items a checkpoint gets right: differs by arm and step, so A-only and B-only are both non-empty."""
    return (i * 7 + step // 10 * 3 + len(arm)) % 5 < 2 + (step // 10) % 3


def qa_row(arm: str, step: int, i: int) -> dict:
    ok = right(arm, step, i)
    gold = f"answer {i}"
    extra = PAYLOAD if f"nq-{i}" == XSS_ID else ""
    pred = gold if ok else f"wrong {i} {arm}"
    messages = [{"role": "system", "content": "You answer with the search tool."},
                {"role": "user", "content": f"Question {i}: who wrote book {i}? {extra}"},
                {"role": "assistant", "reasoning_content": f"I should search for book {i}.", "content": "",
                 "tool_calls": [{"type": "function", "id": "call_1_0",
                                 "function": {"name": "search", "arguments": {"query": f"book {i} author"}}}]},
                {"role": "tool", "name": "search", "tool_call_id": "call_1_0", "content": f"Doc: book {i} was written by {gold}. {extra}"},
                {"role": "assistant", "reasoning_content": "Found it." + extra, "content": f"<answer>{pred}</answer> {extra}"}]
    return {"id": f"nq-{i}", "question": messages[1]["content"], "golden_answers": [gold], "prediction": pred,
            "extract_rule": "answer_tag", "stop_reason": "answer", "num_turns": 2, "num_tool_calls": 1, "num_tool_errors": 0,
            "generated_tokens": 40, "metrics": {"em": float(ok), "f1": 1.0 if ok else 0.25, "cover_em": float(ok)},
            "messages": messages}


def ood_row(arm: str, step: int, i: int) -> dict:
    ok = right(arm, step + 10, i)
    ans = f"plan {i}" if ok else "no plan"
    messages = [{"role": "system", "content": "Plan with the tools."}, {"role": "user", "content": f"Task {i}: find the plan."},
                {"role": "assistant", "reasoning_content": "", "content": "",
                 "tool_calls": [{"type": "function", "id": "call_1_0", "function": {"name": "lookup", "arguments": {"key": str(i)}}}]},
                {"role": "tool", "name": "lookup", "content": f"value {i}"},
                {"role": "assistant", "reasoning_content": "", "content": "",
                 "tool_calls": [{"type": "function", "id": "call_2_0", "function": {"name": "finish", "arguments": {"answer": ans}}}]},
                {"role": "tool", "name": "finish", "content": "done"}]
    metrics = {"reward": float(ok), "reward_outcome": float(ok), "reward_grounding": 1.0, "reward_stop": 1.0}
    return {"id": f"ood-{i}", "question": messages[1]["content"], "golden_answers": [f"plan {i}"], "prediction": None,
            "finish_answer": ans, "extract_rule": "none", "stop_reason": "env_done", "num_turns": 2, "num_tool_calls": 2,
            "num_tool_errors": 0, "generated_tokens": 30, "metrics": metrics, "messages": messages}


def babyai_row(arm: str, step: int, i: int) -> dict:
    ok = right(arm, step + 20, i)
    prompt = [{"role": "user", "content": f"You are in a grid. Goal: go to the red ball ({i})."}]
    transcript = []
    for k, action in enumerate(["turn left", "go forward"]):
        msgs = prompt + [{"role": "user", "content": f"Current Observation: step {k}, a wall ahead."}]
        transcript.append({"messages": msgs, "reply": f"<think>step {k}</think>{action}", "content": action, "filtered": action,
                           "valid": True, "action": action, "observation": f"obs {k + 1}", "reward": 0.0,
                           "done": k == 1, "finish_reason": "stop", "seed": None})
    return {"id": f"babyai-{i}", "episode": i, "sample": 0, "task": "goto", "seed": i, "instruction": f"go to the red ball ({i})",
            "transcript": transcript, "actions": [t["action"] for t in transcript], "invalid_actions": 0, "steps": 2, "limit": 64,
            "level_limit": 64, "success": ok, "return": 0.9 if ok else 0.0, "progression": 1.0 if ok else 0.0,
            "stop_reason": "success" if ok else "step_limit", "generated_tokens": 12,
            "metrics": {"return": 0.9 if ok else 0.0, "success": float(ok), "progression": 1.0 if ok else 0.0,
                        "invalid_action_rate": 0.0}}


ROWS = {"nq": qa_row, "search_plan_ood": ood_row, "babyai": babyai_row}


def write_eval_dir(d: Path, arm: str, step: int, n: int = N) -> None:
    d.mkdir(parents=True, exist_ok=True)
    summary = {}
    for bench, fn in ROWS.items():
        rows = [fn(arm, step, i) for i in range(n)]
        (d / f"{bench}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        names = rows[0]["metrics"]
        summary[bench] = {m: sum(r["metrics"][m] for r in rows) / n for m in names} | {"n": n}
    write_json(d / "summary.json", summary)


def write_study(root: Path) -> Path:
    """r2e/seed0 (steps 10, 20), search/seed0 (step 10), the anchor: every eval dir holds the three benches."""
    for arm, steps in (("r2e", [10, 20]), ("search", [10])):
        run = make_run(root, arm, 0, steps)
        for s in steps:
            write_eval_dir(run / "eval" / f"step-{s:06d}", arm, s)
    write_eval_dir(root / "_anchor" / "eval" / "step-000000", "anchor", 0)
    return root


def rows_of(d: Path, bench: str) -> list[dict]:
    return [json.loads(line) for line in (d / f"{bench}.jsonl").read_text().splitlines()]
