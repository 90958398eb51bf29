"""report.html at study scale: generated eval dirs (no training) -> analysis.html.write_html, then the page's size,
the writer's time, and (with chromium + chromium-driver installed) the load times in headless chromium.

    python bench/bench_report_html.py [checkpoints=52] [benches=7] [rows=500] [out=/tmp/report_html_bench]

Rows have a realistic length: a QA episode of two searches (three ~120-word passages each), reasoning per turn and an
answer (~6 kB of JSON), as the evals harness writes them. Not a test: it prints what it measured."""
from __future__ import annotations

import json
import os
import random
import shutil
import sys
import time
from pathlib import Path

from analysis.discover import discover_runs
from analysis.html import DATA_DIR, write_html
from common.io import write_json
from common import layout

WORDS = ("the of and a to in is was for on with as by at from his her that which an be this were are it "
         "river city born album film party war king team league county school company village island").split()


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def row(rng: random.Random, bench: str, i: int, step: int) -> dict:
    ok = rng.random() < 0.2 + step / 2000
    msgs = [{"role": "system", "content": _text(rng, 120)}, {"role": "user", "content": f"Question: {_text(rng, 15)}?"}]
    for turn in (1, 2):
        msgs.append({"role": "assistant", "reasoning_content": _text(rng, 60), "content": "",
                     "tool_calls": [{"type": "function", "id": f"call_{turn}_0",
                                     "function": {"name": "search", "arguments": {"query": _text(rng, 6)}}}]})
        msgs.append({"role": "tool", "name": "search", "content": "\n".join(f"Doc {k}: {_text(rng, 120)}" for k in range(3))})
    msgs.append({"role": "assistant", "reasoning_content": _text(rng, 40), "content": f"<answer>{_text(rng, 3)}</answer>"})
    return {"id": f"{bench}-{i}", "question": msgs[1]["content"], "golden_answers": [_text(rng, 3)], "prediction": _text(rng, 3),
            "extract_rule": "answer_tag", "stop_reason": "answer", "num_turns": 3, "num_tool_calls": 2, "num_tool_errors": 0,
            "generated_tokens": 300, "metrics": {"em": float(ok), "f1": 1.0 if ok else rng.random() / 2}, "messages": msgs}


def generate(root: Path, checkpoints: int, benches: list[str], rows: int) -> None:
    rng = random.Random(0)
    arms = ["r2e", "search", "mixed", "single"]
    for k in range(checkpoints):
        arm, step = arms[k % len(arms)], 100 * (k // len(arms) + 1)
        d = layout.run_dir_path(root, arm, 0) / layout.EVAL / layout.step_name(step)
        d.mkdir(parents=True, exist_ok=True)
        for bench in benches:
            (d / f"{bench}.jsonl").write_text("".join(json.dumps(row(rng, bench, i, step)) + "\n" for i in range(rows)))
        write_json(d / "summary.json", {b: {"em": 0.3, "f1": 0.4, "n": rows} for b in benches})


def load_times(page: Path) -> dict[str, float]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    os.environ["SE_OFFLINE"] = "true"
    opts = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--host-resolver-rules=MAP * ~NOTFOUND"):
        opts.add_argument(arg)
    d = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
    try:
        t0 = time.perf_counter()
        d.get(page.as_uri())
        WebDriverWait(d, 120).until(lambda d: d.find_element("tag name", "body").get_attribute("data-ready") == "1")
        WebDriverWait(d, 120).until(lambda d: d.find_element("id", "browse-status").get_attribute("data-n"))
        out = {"page + first item list (s)": time.perf_counter() - t0}
        WebDriverWait(d, 120).until(lambda d: d.find_element("id", "pair-summary").get_attribute("data-n"))
        out["+ paired counts (s)"] = time.perf_counter() - t0
        d.find_element("id", "tab-browse").click()
        t1 = time.perf_counter()
        d.find_element("css selector", "#item-list tbody tr").click()
        WebDriverWait(d, 120).until(lambda d: d.find_elements("css selector", "#transcript .msg"))
        out["open one transcript (s)"] = time.perf_counter() - t1
        out["JS heap (MB)"] = d.execute_script("return performance.memory ? performance.memory.usedJSHeapSize / 1e6 : -1")
        return out
    finally:
        d.quit()


def main(argv: list[str]) -> int:
    opts = {"checkpoints": "52", "benches": "7", "rows": "500", "out": "/tmp/report_html_bench"} | dict(a.split("=", 1) for a in argv)
    root = Path(opts["out"])
    shutil.rmtree(root, ignore_errors=True)
    benches = ["nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle"][:int(opts["benches"])]
    t = time.perf_counter()
    generate(root / "runs", int(opts["checkpoints"]), benches, int(opts["rows"]))
    jsonl = sum(p.stat().st_size for p in (root / "runs").rglob("*.jsonl"))
    print(f"generated {opts['checkpoints']} checkpoints x {len(benches)} benches x {opts['rows']} rows: "
          f"{jsonl / 1e6:.0f} MB of jsonl in {time.perf_counter() - t:.0f}s")
    runs = discover_runs(root / "runs")
    t = time.perf_counter()
    page = write_html(root / "reports", runs=runs, figures=[], tables={}, missing=[], problems=[], settings={},
                      benches=benches, anchor_eval=None)
    took = time.perf_counter() - t
    shards = list((root / "reports" / DATA_DIR).iterdir())
    lists = [p for p in shards if "_t" not in p.name]
    print(f"write_html: {took:.0f}s; report.html {page.stat().st_size / 1e3:.0f} kB; {len(shards)} shards, "
          f"{sum(p.stat().st_size for p in shards) / 1e6:.0f} MB (list shards {len(lists)}, "
          f"largest {max(p.stat().st_size for p in lists) / 1e3:.0f} kB; largest transcript chunk "
          f"{max(p.stat().st_size for p in shards if '_t' in p.name) / 1e3:.0f} kB)")
    if Path("/usr/bin/chromedriver").exists():
        for k, v in load_times(page).items():
            print(f"  {k}: {v:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
